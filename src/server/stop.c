/* server/stop.c: stop strings on generated text (llama-server's semantics). The text grows
 * token by token; as soon as one of the stop strings appears, the text is cut right before
 * its earliest occurrence and generation should end. While streaming, a tail of the text
 * that could still grow into a stop string is held back, so a client never sees part of a
 * stop string that is later cut.
 *
 * Invariants: sent <= len; once matched, len no longer changes. A match can never start
 * before sent: bytes are only released when no stop string can begin in them. */
#include "server/server_impl.h"

#include <stdlib.h>
#include <string.h>

void em_srv_text_init(em_srv_text *t, char *const *stop, int n_stop) {
    memset(t, 0, sizeof *t);
    t->stop = stop;
    t->n_stop = n_stop;
}

void em_srv_text_free(em_srv_text *t) {
    free(t->buf);
    t->buf = NULL;
    t->len = t->cap = t->sent = 0;
}

static int reserve(em_srv_text *t, size_t n, em_err *err) {
    uint64_t need;
    if (em_add_overflow(t->len, n, &need) || em_add_overflow(need, 1, &need) || need > SIZE_MAX / 2)
        return em_err_set(err, EM_EOVERFLOW, "generated text too long");
    if (need <= t->cap) return EM_OK;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < need) cap *= 2;
    char *b = realloc(t->buf, cap);
    if (!b) return em_err_set(err, EM_ENOMEM, "out of memory for the generated text");
    t->buf = b;
    t->cap = cap;
    return EM_OK;
}

int em_srv_text_push(em_srv_text *t, const char *bytes, size_t n, em_err *err) {
    if (t->matched || n == 0) return EM_OK;
    int rc = reserve(t, n, err);
    if (rc) return rc;
    size_t old = t->len;
    memcpy(t->buf + t->len, bytes, n);
    t->len += n;
    t->buf[t->len] = 0;
    size_t best = SIZE_MAX;
    for (int i = 0; i < t->n_stop; i++) {
        size_t sl = strlen(t->stop[i]);
        if (sl == 0 || sl > t->len) continue;
        /* a new occurrence must end past old: it starts at old - (sl - 1) or later */
        size_t from = old >= sl - 1 ? old - (sl - 1) : 0;
        const char *hit = memmem(t->buf + from, t->len - from, t->stop[i], sl);
        if (hit && (size_t)(hit - t->buf) < best) best = (size_t)(hit - t->buf);
    }
    if (best != SIZE_MAX) {
        t->len = best > t->sent ? best : t->sent;
        t->buf[t->len] = 0;
        t->matched = true;
    }
    return EM_OK;
}

/* Length of the longest tail of buf[0..len) that is a proper prefix of s. */
static size_t prefix_tail(const char *buf, size_t len, const char *s, size_t sl) {
    size_t k = sl - 1 < len ? sl - 1 : len;
    for (; k > 0; k--)
        if (buf[len - k] == s[0] && !memcmp(buf + len - k, s, k)) return k;
    return 0;
}

size_t em_srv_text_ready(const em_srv_text *t, bool final) {
    if (final || t->matched) return t->len;
    size_t hold = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t sl = strlen(t->stop[i]);
        if (sl < 2) continue;
        size_t k = prefix_tail(t->buf, t->len, t->stop[i], sl);
        if (k > hold) hold = k;
    }
    size_t end = t->len - hold;
    return end > t->sent ? end : t->sent;
}
