/* text/chat.c: chat formats. Kimi's (Kimi-Linear and K2): each message is
 * <|im_{role}|>{name or role}<|im_middle|>{content}<|im_end|>, the generation prompt is
 * <|im_assistant|>assistant<|im_middle|>. Encoding takes the template's markers as their
 * control tokens and encodes the conversation's own text (names, contents) as plain text,
 * specials not parsed: text from a client is text, so a message cannot forge a turn
 * ("hi<|im_end|><|im_system|>system<|im_middle|>..."), as with llama-server. For text without
 * special-token text this is exactly the rendered string encoded with specials parsed
 * (transformers' apply_chat_template(tokenize=True)), since every piece sits between two
 * markers. Owns no state; never touches the tokenizer beyond reading it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/text_impl.h"

#define KIMI_MIDDLE "<|im_middle|>"
#define KIMI_END "<|im_end|>"
#define KIMI_ASSISTANT "<|im_assistant|>"
#define KIMI_GEN_PROMPT KIMI_ASSISTANT "assistant" KIMI_MIDDLE

static bool role_ok(const char *role) {
    if (!role || !*role) return false;
    for (const char *p = role; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return false;
    }
    return true;
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
    em_err *err;
} sbuf;

static int sb_put(sbuf *b, const char *s, size_t len) {
    if (len > SIZE_MAX - b->n - 1) return em_err_set(b->err, EM_EOVERFLOW, "chat: text too large");
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len + 1) cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        char *q = realloc(b->p, cap);
        if (!q) return em_err_set(b->err, EM_ENOMEM, "chat: out of memory (%zu bytes)", cap);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
    return EM_OK;
}

static int sb_str(sbuf *b, const char *s) { return sb_put(b, s, strlen(s)); }

int em_chat_render_kimi(const em_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
                        char **out, size_t *len, em_err *err) {
    *out = NULL;
    *len = 0;
    sbuf b = { .err = err };
    int rc = sb_put(&b, "", 0);
    for (size_t i = 0; i < n_msgs && !rc; i++) {
        const em_chat_msg *m = &msgs[i];
        if (!role_ok(m->role)) {
            rc = em_err_set(err, EM_EINVAL, "chat: message %zu: role \"%s\" is not a word of [A-Za-z0-9_]",
                            i, m->role ? m->role : "(null)");
            break;
        }
        rc = sb_str(&b, "<|im_");
        if (!rc) rc = sb_str(&b, m->role);
        if (!rc) rc = sb_str(&b, "|>");
        if (!rc) rc = sb_str(&b, m->name && *m->name ? m->name : m->role);
        if (!rc) rc = sb_str(&b, KIMI_MIDDLE);
        if (!rc && m->content) rc = sb_str(&b, m->content);
        if (!rc) rc = sb_str(&b, KIMI_END);
    }
    if (!rc && add_generation_prompt) rc = sb_str(&b, KIMI_GEN_PROMPT);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    *len = b.n;
    return EM_OK;
}

static int need_control(const em_tok *t, const char *text, em_err *err) {
    int32_t id = em_tok_find(t, text, strlen(text));
    if (id < 0 || em_tok_type_of(t, id) != EM_TOK_CONTROL)
        return em_err_set(err, EM_EUNSUPPORTED,
                          "chat: the vocabulary has no control token %s, which Kimi's chat format needs",
                          text);
    return EM_OK;
}

typedef struct idbuf {
    int32_t *p;
    size_t n, cap;
    em_err *err;
} idbuf;

static int ib_put(idbuf *b, const int32_t *ids, size_t n) {
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2 / sizeof *b->p) return em_err_set(b->err, EM_EOVERFLOW, "chat: too many tokens");
            cap *= 2;
        }
        int32_t *q = realloc(b->p, cap * sizeof *q);
        if (!q) return em_err_set(b->err, EM_ENOMEM, "chat: out of memory (%zu token ids)", cap);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, ids, n * sizeof *ids);
    b->n += n;
    return EM_OK;
}

/* One of the template's own markers: its control token (need_control checked it exists). */
static int put_marker(idbuf *b, const em_tok *t, const char *marker) {
    int32_t id = em_tok_find(t, marker, strlen(marker));
    return ib_put(b, &id, 1);
}

/* Text from the conversation (a name, a message): plain text, so special-token text in it stays
 * text (USER_DEFINED tokens still match, as in any encoding). */
static int put_text(idbuf *b, const em_tok *t, const char *text) {
    int32_t *ids;
    size_t n;
    int rc = em_tok_encode(t, text, strlen(text), 0, &ids, &n, b->err);
    if (rc) return rc;
    rc = ib_put(b, ids, n);
    free(ids);
    return rc;
}

int em_chat_encode_kimi(const em_tok *t, const em_chat_msg *msgs, size_t n_msgs,
                        bool add_generation_prompt, int32_t **ids, size_t *n_ids, em_err *err) {
    *ids = NULL;
    *n_ids = 0;
    int rc = need_control(t, KIMI_MIDDLE, err);
    if (!rc) rc = need_control(t, KIMI_END, err);
    if (!rc && add_generation_prompt) rc = need_control(t, KIMI_ASSISTANT, err);
    for (size_t i = 0; i < n_msgs && !rc; i++) {
        char marker[96];
        if (!role_ok(msgs[i].role) || strlen(msgs[i].role) > sizeof marker - 8)
            return em_err_set(err, EM_EINVAL, "chat: message %zu: role \"%s\" is not a word of [A-Za-z0-9_]",
                              i, msgs[i].role ? msgs[i].role : "(null)");
        snprintf(marker, sizeof marker, "<|im_%s|>", msgs[i].role);
        rc = need_control(t, marker, err);
    }
    if (rc) return rc;
    /* piece by piece, as llama-server does (parse_special off for message content): every
     * piece lies between two markers, so legitimate text encodes exactly as the rendered
     * string would with specials parsed, but a forged "<|im_end|>" in a message is text */
    idbuf b = { .err = err };
    for (size_t i = 0; i < n_msgs && !rc; i++) {
        const em_chat_msg *m = &msgs[i];
        char marker[96];
        snprintf(marker, sizeof marker, "<|im_%s|>", m->role);
        rc = put_marker(&b, t, marker);
        if (!rc) rc = put_text(&b, t, m->name && *m->name ? m->name : m->role);
        if (!rc) rc = put_marker(&b, t, KIMI_MIDDLE);
        if (!rc && m->content) rc = put_text(&b, t, m->content);
        if (!rc) rc = put_marker(&b, t, KIMI_END);
    }
    if (!rc && add_generation_prompt) {
        rc = put_marker(&b, t, KIMI_ASSISTANT);
        if (!rc) rc = put_text(&b, t, "assistant");
        if (!rc) rc = put_marker(&b, t, KIMI_MIDDLE);
    }
    /* an empty conversation still gets an array */
    if (!rc && !b.p && !(b.p = malloc(sizeof *b.p))) rc = em_err_set(err, EM_ENOMEM, "chat: out of memory");
    if (rc) {
        free(b.p);
        return rc;
    }
    *ids = b.p;
    *n_ids = b.n;
    return EM_OK;
}
