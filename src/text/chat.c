/* text/chat.c: chat formats. Kimi's (Kimi-Linear and K2): each message is
 * <|im_{role}|>{name or role}<|im_middle|>{content}<|im_end|>, the generation prompt is
 * <|im_assistant|>assistant<|im_middle|>. The text is rendered first and then encoded with
 * specials parsed, exactly what transformers' apply_chat_template(tokenize=True) does with
 * Kimi's tokenizer (so special-token text inside a message is a special token there too).
 * Owns no state; never touches the tokenizer beyond reading it. */
#include <stdlib.h>
#include <string.h>

#include "text/text_impl.h"

#define KIMI_MIDDLE "<|im_middle|>"
#define KIMI_END "<|im_end|>"
#define KIMI_GEN_PROMPT "<|im_assistant|>assistant" KIMI_MIDDLE

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

int em_chat_encode_kimi(const em_tok *t, const em_chat_msg *msgs, size_t n_msgs,
                        bool add_generation_prompt, int32_t **ids, size_t *n_ids, em_err *err) {
    *ids = NULL;
    *n_ids = 0;
    int rc = need_control(t, KIMI_MIDDLE, err);
    if (!rc) rc = need_control(t, KIMI_END, err);
    if (!rc && add_generation_prompt) rc = need_control(t, "<|im_assistant|>", err);
    for (size_t i = 0; i < n_msgs && !rc; i++) {
        char marker[96];
        if (!role_ok(msgs[i].role) || strlen(msgs[i].role) > sizeof marker - 8)
            return em_err_set(err, EM_EINVAL, "chat: message %zu: role \"%s\" is not a word of [A-Za-z0-9_]",
                              i, msgs[i].role ? msgs[i].role : "(null)");
        strcpy(marker, "<|im_");
        strcat(marker, msgs[i].role);
        strcat(marker, "|>");
        rc = need_control(t, marker, err);
    }
    if (rc) return rc;
    char *text;
    size_t len;
    rc = em_chat_render_kimi(msgs, n_msgs, add_generation_prompt, &text, &len, err);
    if (rc) return rc;
    rc = em_tok_encode(t, text, len, EM_TOK_PARSE_SPECIAL, ids, n_ids, err);
    free(text);
    return rc;
}
