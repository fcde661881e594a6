/* text/pretok.c: the pre-tokenizers, the regular expressions that cut text into the pieces
 * BPE then merges, run through PCRE2 with UTF and UCP (Unicode properties for \p{..}).
 *
 * The patterns are the references' own, rewritten only where PCRE2 10.42 (Debian 12) would
 * read them differently from the Rust regex engine tiktoken runs:
 *   - \s is written out as the Unicode White_Space set (Rust's \s). PCRE2's UCP \s also
 *     takes U+180E.
 *   - \p{Han} is written \p{sc=Han}: since 10.40 PCRE2 reads a bare script name as
 *     Script_Extensions (which would pull in 、。 and friends); tiktoken's engine reads it as
 *     Script (checked against tiktoken, tests/data/text/tiktoken_ref.json).
 *   - Kimi's class intersections [A&&[^\p{Han}]] (no such syntax in 10.42) become negated
 *     classes of the complement: [^ (not A) \p{sc=Han}], with (not A) spelt as the general
 *     categories outside A. They are single-character classes, so the JIT matches long runs
 *     without a backtracking frame per character (a (?!\p{Han}) lookahead per character
 *     overflowed the JIT stack at ~10,000 letters).
 * Unicode data is PCRE2's (Unicode 14 for 10.42): characters assigned later read as
 * unassigned (\p{Cn}), so such characters may split differently from tiktoken.
 *
 * Invariants: a compiled pattern is immutable; each split allocates its own match data, so
 * one em_pretok serves many threads. Matching never reads outside [text, text+len). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "text/text_impl.h"

/* Unicode White_Space, Rust regex's \s. */
#define WS "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define S_CLASS "[" WS "]"
#define NOT_S_CLASS "[^" WS "]"
/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] and [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
#define KIMI_UPPER "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc=Han}]"
#define KIMI_LOWER "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc=Han}]"
#define CONTRACTIONS_I "(?i:'s|'t|'re|'ve|'m|'ll|'d)"

/* Moonshot's tokenization_kimi.py pat_str, alternative by alternative. */
static const char PAT_KIMI_K2[] =
    "\\p{sc=Han}+"
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UPPER "*" KIMI_LOWER "+" CONTRACTIONS_I "?"
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_UPPER "+" KIMI_LOWER "*" CONTRACTIONS_I "?"
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|" S_CLASS "*[\\r\\n]+"
    "|" S_CLASS "+(?!" NOT_S_CLASS ")"
    "|" S_CLASS "+";

/* GPT-2's pattern (OpenAI's encoder.py; tiktoken r50k_base). */
static const char PAT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?\\p{L}+"
    "| ?\\p{N}+"
    "| ?[^" WS "\\p{L}\\p{N}]+"
    "|" S_CLASS "+(?!" NOT_S_CLASS ")"
    "|" S_CLASS "+";

/* Llama 3 (tokenizer.json's Split regex); Qwen2 is the same with single digits. */
#define LLAMA3_LIKE(DIGITS)                                                                    \
    CONTRACTIONS_I                                                                             \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"                                                           \
    "|" DIGITS                                                                                 \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"                                                       \
    "|" S_CLASS "*[\\r\\n]+"                                                                   \
    "|" S_CLASS "+(?!" NOT_S_CLASS ")"                                                         \
    "|" S_CLASS "+"
static const char PAT_LLAMA3[] = LLAMA3_LIKE("\\p{N}{1,3}");
static const char PAT_QWEN2[] = LLAMA3_LIKE("\\p{N}");

static const struct {
    const char *names[4]; /* tokenizer.ggml.pre values */
    const char *pattern;
} PRE[EM_TOK_PRE_COUNT] = {
    [EM_TOK_PRE_GPT2] = { { "gpt-2", NULL }, PAT_GPT2 },
    [EM_TOK_PRE_KIMI_K2] = { { "kimi-k2", NULL }, PAT_KIMI_K2 },
    [EM_TOK_PRE_LLAMA3] = { { "llama-bpe", "llama3", "llama-v3", NULL }, PAT_LLAMA3 },
    [EM_TOK_PRE_QWEN2] = { { "qwen2", NULL }, PAT_QWEN2 },
};

struct em_pretok {
    int pre;
    pcre2_code *code;
};

int em_pretok_from_name(const char *name) {
    if (!name) return -1;
    for (int p = 0; p < EM_TOK_PRE_COUNT; p++)
        for (int i = 0; PRE[p].names[i]; i++)
            if (!strcmp(name, PRE[p].names[i])) return p;
    return -1;
}

const char *em_pretok_pattern(int pre) {
    return pre >= 0 && pre < EM_TOK_PRE_COUNT ? PRE[pre].pattern : NULL;
}

int em_pretok_create(em_pretok **out, int pre, em_err *err) {
    *out = NULL;
    if (pre < 0 || pre >= EM_TOK_PRE_COUNT)
        return em_err_set(err, EM_EINVAL, "pre-tokenizer %d does not exist", pre);
    em_pretok *p = em_calloc(1, sizeof *p, "pre-tokenizer", err);
    if (!p) return EM_ENOMEM;
    p->pre = pre;
    int code;
    PCRE2_SIZE at;
    p->code = pcre2_compile((PCRE2_SPTR)PRE[pre].pattern, PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!p->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        free(p);
        /* the patterns are ours: this means a PCRE2 too old for \p{sc=..} (< 10.40) */
        return em_err_set(err, EM_EUNSUPPORTED,
                          "pre-tokenizer \"%s\": PCRE2 refused its pattern at offset %zu: %s "
                          "(PCRE2 10.40 or newer is needed)",
                          PRE[pre].names[0], (size_t)at, (const char *)msg);
    }
    /* Without JIT (some platforms, or an SELinux policy denying executable memory) the
     * interpreter runs the same pattern, only slower. */
    (void)pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE);
    *out = p;
    return EM_OK;
}

void em_pretok_free(em_pretok *p) {
    if (!p) return;
    pcre2_code_free(p->code);
    free(p);
}

/* One match at or after start, [*ms, *me). Returns 1 found, 0 none, <0 error.
 * When the JIT runs out of its stack (it should not, see above) the interpreter retries,
 * whose backtracking lives on the heap. */
static int match_once(const em_pretok *p, pcre2_match_data *md, const char *text, size_t len,
                      size_t start, size_t *ms, size_t *me, em_err *err) {
    int rc = pcre2_match(p->code, (PCRE2_SPTR)text, len, start, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(p->code, (PCRE2_SPTR)text, len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return em_err_set(err, rc == PCRE2_ERROR_NOMEMORY ? EM_ENOMEM : EM_EUNSUPPORTED,
                          "pre-tokenizer \"%s\" failed at byte %zu of %zu: %s",
                          PRE[p->pre].names[0], start, len, (const char *)msg);
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* Length of the UTF-8 sequence led by byte b of valid text. */
static size_t seq_len(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

int em_pretok_run(const em_pretok *p, const char *text, size_t len, em_pretok_fn fn, void *ctx,
                  em_err *err) {
    if (len == 0) return EM_OK;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->code, NULL);
    if (!md) return em_err_set(err, EM_ENOMEM, "pre-tokenizer: out of memory for match data");
    int rc = EM_OK;
    size_t pos = 0;
    while (pos < len && rc == EM_OK) {
        size_t ms = len, me = len;
        int found = match_once(p, md, text, len, pos, &ms, &me, err);
        if (found < 0) {
            rc = found;
            break;
        }
        if (found && me == ms) {
            /* an empty match (none of the patterns has one): step over one character and
             * let the gap rule below make it a piece */
            me = ms + seq_len((uint8_t)text[ms]);
            if (me > len) me = len;
            ms = me;
        }
        if (ms > pos) rc = fn(ctx, pos, ms); /* unmatched text before the match */
        if (rc == EM_OK && found && me > ms) rc = fn(ctx, ms, me);
        pos = found ? me : len;
    }
    pcre2_match_data_free(md);
    return rc;
}

/* ---- em_pretok_split: the same, into an offsets array ---------------------------------- */

typedef struct offs_buf {
    size_t *offs;
    size_t n, cap;
    em_err *err;
} offs_buf;

static int offs_push(void *ctx, size_t start, size_t end) {
    offs_buf *b = ctx;
    (void)start;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        size_t *grown = realloc(b->offs, cap * sizeof *grown);
        if (!grown) return em_err_set(b->err, EM_ENOMEM, "pre-tokenizer: out of memory (%zu pieces)", b->n);
        b->offs = grown;
        b->cap = cap;
    }
    b->offs[b->n++] = end;
    return EM_OK;
}

int em_pretok_split(int pre, const char *text, size_t len, size_t **offs, size_t *n_pieces,
                    em_err *err) {
    *offs = NULL;
    *n_pieces = 0;
    size_t bad = em_utf8_valid_prefix(text, len);
    if (bad < len)
        return em_err_set(err, EM_EINVAL, "pre-tokenizer: text is not valid UTF-8 at byte %zu", bad);
    em_pretok *p;
    int rc = em_pretok_create(&p, pre, err);
    if (rc) return rc;
    offs_buf b = { .err = err };
    rc = offs_push(&b, 0, 0); /* offs[0] = 0 */
    if (rc == EM_OK) rc = em_pretok_run(p, text, len, offs_push, &b, err);
    em_pretok_free(p);
    if (rc) {
        free(b.offs);
        return rc;
    }
    *offs = b.offs;
    *n_pieces = b.n - 1;
    return EM_OK;
}
