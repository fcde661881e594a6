/* convert/hftok_tiktoken.c: Moonshot's tiktoken.model (lines "base64 rank") with
 * tokenizer_config.json -> em_hf_vocab (rules in hftokenizer.h, source 2). Token text is the
 * token's bytes through the GPT-2 byte->unicode map (text/'s, the one the runtime tokenizer
 * reads back with); specials fill Kimi's reserved ids after the ranks; merges are rebuilt
 * from the ranks as llama.cpp's QwenModel.bpe does.
 *
 * Invariants: the file holds every single byte, no token twice, no rank twice or inside the
 * reserved range, no token over TK_MAX_TOKEN_BYTES; every message names the file and line. */
#include "convert/hftok_impl.h"
#include "text/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest tiktoken token accepted: the merge rebuild is quadratic in a token's length, so an
 * absurd token must not stall the converter. Real vocabularies stay far below this. */
#define TK_MAX_TOKEN_BYTES 1024
/* Kimi's TikTokenTokenizer reserves this many ids after the ranks for specials. */
#define KIMI_N_RESERVED 256

/* Writes the mapped text of bytes[0..n) to out (room for 2n+1); returns its length. */
static size_t bytes_to_text(const uint8_t *bytes, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = em_tok_byte_to_unicode(bytes[i]);
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[o] = '\0';
    return o;
}

/* Inverse of bytes_to_text: false when text is not a mapped byte string. out has room for
 * strlen(text) bytes. */
static bool text_to_bytes(const char *text, size_t n, uint8_t *out, size_t *out_n) {
    const uint8_t *s = (const uint8_t *)text;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        if (s[i] < 0x80) {
            cp = s[i++];
        } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
            cp = ((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
            i += 2;
        } else {
            return false;
        }
        int b = em_tok_unicode_to_byte(cp);
        if (b < 0) return false;
        out[o++] = (uint8_t)b;
    }
    *out_n = o;
    return true;
}

/* ---- tiktoken.model ---------------------------------------------------------------- */

typedef struct tk_entry {
    uint32_t off, len; /* bytes in the decoded buffer */
    uint32_t line;
    int64_t rank;
} tk_entry;

typedef struct tk_file {
    uint8_t *bytes; /* all decoded tokens, back to back */
    tk_entry *e;
    uint64_t n;
    int64_t max_rank;
    int64_t *by_rank; /* rank -> entry index, -1 for holes; [max_rank + 1] */
    hft_map map;         /* token bytes -> rank */
} tk_file;

static void tk_free(tk_file *f) {
    free(f->bytes);
    free(f->e);
    free(f->by_rank);
    em_hft_map_free(&f->map);
}

static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict standard base64 with padding; returns the decoded length or -1. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    size_t pad = (s[n - 1] == '=') + (n >= 2 && s[n - 2] == '=');
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t acc = 0;
        for (size_t k = 0; k < 4; k++) {
            bool in_pad = i + 4 == n && k >= 4 - pad;
            int d = in_pad ? (s[i + k] == '=' ? 0 : -1) : b64_value(s[i + k]);
            if (d < 0) return -1;
            acc = acc << 6 | (uint32_t)d;
        }
        size_t keep = i + 4 == n ? 3 - pad : 3;
        for (size_t k = 0; k < keep; k++) out[o++] = (uint8_t)(acc >> (16 - 8 * k));
    }
    return (long)o;
}

static bool is_ws(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* One non-empty line "base64 rank" (Python's line.split() on ASCII whitespace). */
static int tk_parse_line(tk_file *f, const uint8_t *s, size_t n, uint32_t line, size_t *out_off,
                         const char *path, em_err *err) {
    const uint8_t *fld[3];
    size_t len[3];
    int nf = 0;
    for (size_t i = 0; i < n;) {
        while (i < n && is_ws(s[i])) i++;
        if (i == n) break;
        size_t st = i;
        while (i < n && !is_ws(s[i])) i++;
        if (nf == 3) break;
        fld[nf] = s + st;
        len[nf++] = i - st;
    }
    if (nf == 0) return EM_OK;
    if (nf != 2)
        return em_err_set(err, EM_EFORMAT, "%s: line %u: expected \"base64 rank\", found %s",
                          path, line, nf == 3 ? "more than 2 fields" : "1 field");
    long blen = b64_decode(fld[0], len[0], f->bytes + *out_off);
    if (blen <= 0)
        return em_err_set(err, EM_EFORMAT, "%s: line %u: bad base64 '%.*s'", path, line,
                          (int)(len[0] > 64 ? 64 : len[0]), (const char *)fld[0]);
    if (blen > TK_MAX_TOKEN_BYTES)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: line %u: token of %ld bytes (the limit is "
                          "%d)", path, line, blen, TK_MAX_TOKEN_BYTES);
    int64_t rank = 0;
    for (size_t i = 0; i < len[1]; i++) {
        uint8_t c = fld[1][i];
        if (c < '0' || c > '9' || rank >= (int64_t)EM_HF_VOCAB_MAX)
            return em_err_set(err, EM_EFORMAT, "%s: line %u: bad rank '%.*s' (a decimal below %u)",
                              path, line, (int)(len[1] > 32 ? 32 : len[1]), (const char *)fld[1],
                              EM_HF_VOCAB_MAX);
        rank = rank * 10 + (c - '0');
    }
    if (rank >= (int64_t)EM_HF_VOCAB_MAX)
        return em_err_set(err, EM_EFORMAT, "%s: line %u: rank %lld is not below %u", path, line,
                          (long long)rank, EM_HF_VOCAB_MAX);
    tk_entry *e = &f->e[f->n++];
    e->off = (uint32_t)*out_off;
    e->len = (uint32_t)blen;
    e->line = line;
    e->rank = rank;
    *out_off += (size_t)blen;
    if (rank > f->max_rank) f->max_rank = rank;
    return EM_OK;
}

static int tk_index(tk_file *f, const char *path, em_err *err) {
    int rc = em_hft_map_init(&f->map, f->n, "tiktoken map", err);
    if (rc) return rc;
    f->by_rank = em_malloc((size_t)(f->max_rank + 1) * sizeof *f->by_rank, "tiktoken ranks", err);
    if (!f->by_rank) return EM_ENOMEM;
    for (int64_t r = 0; r <= f->max_rank; r++) f->by_rank[r] = -1;
    for (uint64_t i = 0; i < f->n; i++) {
        tk_entry *e = &f->e[i];
        int64_t prev = em_hft_map_put(&f->map, f->bytes + e->off, e->len, (int64_t)i);
        if (prev >= 0)
            return em_err_set(err, EM_EFORMAT, "%s: line %u: token duplicates line %u", path,
                              e->line, f->e[prev].line);
        if (f->by_rank[e->rank] >= 0)
            return em_err_set(err, EM_EFORMAT, "%s: line %u: rank %lld already given at line %u",
                              path, e->line, (long long)e->rank, f->e[f->by_rank[e->rank]].line);
        f->by_rank[e->rank] = (int64_t)i;
    }
    /* the map now answers bytes -> rank */
    for (uint64_t s = 0; s <= f->map.mask; s++)
        if (f->map.slots[s].key) f->map.slots[s].val = f->e[f->map.slots[s].val].rank;
    for (int byte = 0; byte < 256; byte++) {
        uint8_t c = (uint8_t)byte;
        if (em_hft_map_get(&f->map, &c, 1) < 0)
            return em_err_set(err, EM_EFORMAT, "%s: byte 0x%02X has no token (byte-level BPE "
                              "needs all 256)", path, byte);
    }
    return EM_OK;
}

static int tk_read(tk_file *f, const char *path, em_err *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = em_file_read_all(path, &text, &len, err);
    if (rc) return rc;
    if (len >= UINT32_MAX) {
        free(text);
        return em_err_set(err, EM_EUNSUPPORTED, "%s: %zu bytes is too large", path, len);
    }
    const uint8_t *s = (const uint8_t *)text;
    uint64_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += s[i] == '\n' || s[i] == '\r';
    f->max_rank = -1;
    f->bytes = em_malloc(len + 1, "tiktoken bytes", err);
    f->e = em_calloc(lines, sizeof *f->e, "tiktoken entries", err);
    if (!f->bytes || !f->e) {
        free(text);
        return EM_ENOMEM;
    }
    size_t off = 0;
    uint32_t line = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t st = i;
        while (i < len && s[i] != '\n' && s[i] != '\r') i++;
        line++;
        rc = tk_parse_line(f, s + st, i - st, line, &off, path, err);
        if (i < len && s[i] == '\r' && i + 1 < len && s[i + 1] == '\n') i++;
        i++;
    }
    free(text);
    if (rc) return rc;
    if (f->n == 0) return em_err_set(err, EM_EFORMAT, "%s: no tokens", path);
    return tk_index(f, path, err);
}

/* QwenModel.bpe(ranks, token, max_rank=rank): merge the adjacent pair of lowest rank
 * (leftmost on ties) while that rank is below the token's own. Returns the number of parts;
 * *split is where the second part starts when there are two. pr, st: scratch of len. */
static int tk_bpe_split(const tk_file *f, const uint8_t *tok, uint32_t len, int64_t max_rank,
                        int64_t *pr, uint32_t *st, uint32_t *split) {
    uint32_t np = len; /* part k is tok[st[k] .. st[k+1]) (st[np] == len) */
    for (uint32_t k = 0; k < np; k++) st[k] = k;
    st[np] = len;
    for (uint32_t k = 0; k + 1 < np; k++) pr[k] = em_hft_map_get(&f->map, tok + st[k], st[k + 2] - st[k]);
    while (np > 1) {
        int64_t best = -1;
        uint32_t at = 0;
        for (uint32_t k = 0; k + 1 < np; k++)
            if (pr[k] >= 0 && (best < 0 || pr[k] < best)) best = pr[k], at = k;
        if (best < 0 || best >= max_rank) break;
        /* parts at and at+1 become one */
        memmove(&st[at + 1], &st[at + 2], (np - at - 1) * sizeof *st);
        memmove(&pr[at], &pr[at + 1], (np - at - 2) * sizeof *pr);
        np--;
        if (at + 1 < np) pr[at] = em_hft_map_get(&f->map, tok + st[at], st[at + 2] - st[at]);
        if (at > 0) pr[at - 1] = em_hft_map_get(&f->map, tok + st[at - 1], st[at + 1] - st[at - 1]);
    }
    *split = np == 2 ? st[1] : 0;
    return (int)np;
}

static int tk_merges(hft_builder *b, const tk_file *f) {
    em_hf_vocab *v = b->v;
    v->merges = em_calloc(f->n, sizeof *v->merges, "merges", b->err);
    int64_t *pr = em_malloc(TK_MAX_TOKEN_BYTES * sizeof *pr, "bpe scratch", b->err);
    uint32_t *st = em_malloc((TK_MAX_TOKEN_BYTES + 1) * sizeof *st, "bpe scratch", b->err);
    char *text = em_malloc(2 * TK_MAX_TOKEN_BYTES + 2, "merge text", b->err);
    int rc = v->merges && pr && st && text ? EM_OK : EM_ENOMEM;
    uint64_t unmerged = 0;
    for (int64_t r = 0; r <= f->max_rank && !rc; r++) {
        if (f->by_rank[r] < 0) continue;
        const tk_entry *e = &f->e[f->by_rank[r]];
        if (e->len < 2) continue;
        const uint8_t *tok = f->bytes + e->off;
        uint32_t split;
        if (tk_bpe_split(f, tok, e->len, r, pr, st, &split) != 2) {
            unmerged++;
            continue;
        }
        size_t n = bytes_to_text(tok, split, text);
        text[n++] = ' ';
        n += bytes_to_text(tok + split, e->len - split, text + n);
        if (!(v->merges[v->n_merges++] = em_hft_pool_str(b, text, n))) rc = EM_ENOMEM;
    }
    if (unmerged)
        em_log(EM_LOG_WARN, "%s/tiktoken.model: %llu tokens do not split into two lower-ranked "
               "parts and get no merge", b->dir, (unsigned long long)unmerged);
    free(pr);
    free(st);
    free(text);
    return rc;
}

/* added_tokens_decoder: {"id": {"content": ..., "special": ...}, ...} placed at their ids. */
static int tk_place_decoder(hft_builder *b, const tk_file *f, uint64_t n_ranks) {
    em_hf_vocab *v = b->v;
    json_t *dec = em_hft_member(b->tc, "added_tokens_decoder");
    if (!dec) return EM_OK;
    if (!json_is_object(dec))
        return em_err_set(b->err, EM_EFORMAT, "%s: added_tokens_decoder is not an object",
                          b->tc_path);
    const char *key;
    json_t *val;
    json_object_foreach(dec, key, val) {
        size_t kl = strlen(key);
        bool digits = kl > 0 && kl <= 18;
        for (size_t k = 0; k < kl && digits; k++) digits = key[k] >= '0' && key[k] <= '9';
        unsigned long long id = digits ? strtoull(key, NULL, 10) : 0;
        if (!digits)
            return em_err_set(b->err, EM_EFORMAT, "%s: added_tokens_decoder key '%s' is not an "
                              "id", b->tc_path, key);
        const char *content = em_hft_member_str(val, "content");
        if (!content || !*content)
            return em_err_set(b->err, EM_EFORMAT, "%s: added_tokens_decoder['%s'] has no content",
                              b->tc_path, key);
        if (id < n_ranks)
            return em_err_set(b->err, EM_EFORMAT, "%s: added_tokens_decoder id %llu ('%s') is "
                              "out of range: specials start after the %llu tiktoken ranks",
                              b->tc_path, id, content, (unsigned long long)n_ranks);
        if (id <= (unsigned long long)f->max_rank && f->by_rank[id] >= 0)
            return em_err_set(b->err, EM_EFORMAT, "%s: added_tokens_decoder id %llu ('%s') is on "
                              "tiktoken rank %llu (tiktoken.model line %u)", b->tc_path, id,
                              content, id, f->e[f->by_rank[id]].line);
        if (id >= v->n_tokens)
            return em_err_set(b->err, EM_EFORMAT, "%s: added_tokens_decoder id %llu ('%s') is "
                              ">= vocab_size %llu", b->tc_path, id, content,
                              (unsigned long long)v->n_tokens);
        if (!(v->tokens[id] = em_hft_pool_str(b, content, strlen(content)))) return EM_ENOMEM;
        v->types[id] = EM_HF_TOKEN_CONTROL;
    }
    return EM_OK;
}

/* Kimi's reserved range [n_ranks, n_ranks + 256): ids the decoder does not name. */
static int tk_place_reserved(hft_builder *b, const tk_file *f, uint64_t n_ranks) {
    em_hf_vocab *v = b->v;
    char buf[48];
    for (uint64_t id = n_ranks; id < n_ranks + KIMI_N_RESERVED && id < v->n_tokens; id++) {
        if ((int64_t)id <= f->max_rank && f->by_rank[id] >= 0)
            return em_err_set(b->err, EM_EFORMAT, "%s/tiktoken.model: line %u: rank %llu lies in "
                              "the special range [%llu, %llu) (the ranks have holes)", b->dir,
                              f->e[f->by_rank[id]].line, (unsigned long long)id,
                              (unsigned long long)n_ranks,
                              (unsigned long long)(n_ranks + KIMI_N_RESERVED));
        if (v->tokens[id]) continue; /* named by added_tokens_decoder */
        int n = snprintf(buf, sizeof buf, "<|reserved_token_%llu|>", (unsigned long long)id);
        if (!(v->tokens[id] = em_hft_pool_str(b, buf, (size_t)n))) return EM_ENOMEM;
        v->types[id] = EM_HF_TOKEN_CONTROL;
    }
    return EM_OK;
}

/* Specials must not repeat each other or a tiktoken token's text (Kimi's tokenizer keys
 * them by text: one would silently vanish). */
static int tk_check_specials(hft_builder *b, const tk_file *f) {
    em_hf_vocab *v = b->v;
    uint64_t n_sp = 0;
    for (uint64_t i = 0; i < v->n_tokens; i++) n_sp += v->types[i] == EM_HF_TOKEN_CONTROL;
    hft_map seen;
    int rc = em_hft_map_init(&seen, n_sp, "special map", b->err);
    if (rc) return rc;
    uint8_t *bytes = NULL;
    for (uint64_t i = 0; i < v->n_tokens && !rc; i++) {
        if (v->types[i] != EM_HF_TOKEN_CONTROL) continue;
        const char *s = v->tokens[i];
        size_t n = strlen(s), nb = 0;
        int64_t prev = em_hft_map_put(&seen, s, n, (int64_t)i);
        if (prev >= 0) {
            rc = em_err_set(b->err, EM_EFORMAT, "%s: special '%s' is given to both id %lld and "
                            "id %llu", b->tc_path, s, (long long)prev, (unsigned long long)i);
            break;
        }
        free(bytes);
        if (!(bytes = em_malloc(n + 1, "special bytes", b->err))) {
            rc = EM_ENOMEM;
            break;
        }
        if (text_to_bytes(s, n, bytes, &nb) && nb && em_hft_map_get(&f->map, bytes, nb) >= 0)
            rc = em_err_set(b->err, EM_EFORMAT, "%s: special '%s' (id %llu) has the text of "
                            "tiktoken token %lld", b->tc_path, s, (unsigned long long)i,
                            (long long)em_hft_map_get(&f->map, bytes, nb));
    }
    free(bytes);
    em_hft_map_free(&seen);
    return rc;
}

int em_hft_tiktoken_build(hft_builder *b, const char *tk_path, int64_t vocab_size, const char *arch) {
    em_hf_vocab *v = b->v;
    tk_file f = { 0 };
    int rc = tk_read(&f, tk_path, b->err);
    if (rc) goto out;
    const char *cls = em_hft_member_str(b->tc, "tokenizer_class");
    if (cls && strcmp(cls, "TikTokenTokenizer") != 0) {
        rc = em_err_set(b->err, EM_EUNSUPPORTED, "%s: tokenizer_class '%s' with tiktoken.model "
                        "(Ember reads Kimi's TikTokenTokenizer)", b->tc_path, cls);
        goto out;
    }
    uint64_t n_ranks = f.n, n = (uint64_t)vocab_size;
    if (vocab_size <= 0) {
        /* the tokenizer's own size: ranks, the reserved range, and any decoder id past it */
        n = (uint64_t)f.max_rank + 1;
        if (n < n_ranks + KIMI_N_RESERVED) n = n_ranks + KIMI_N_RESERVED;
        const char *key;
        json_t *val;
        json_t *dec = em_hft_member(b->tc, "added_tokens_decoder");
        if (json_is_object(dec)) json_object_foreach(dec, key, val) {
            unsigned long long id = strtoull(key, NULL, 10);
            if (id < EM_HF_VOCAB_MAX && id + 1 > n) n = id + 1;
        }
    }
    if (n > EM_HF_VOCAB_MAX) {
        rc = em_err_set(b->err, EM_EUNSUPPORTED, "%s: vocab_size %llu is above %u", tk_path,
                        (unsigned long long)n, EM_HF_VOCAB_MAX);
        goto out;
    }
    if ((uint64_t)f.max_rank >= n) {
        const tk_entry *e = &f.e[f.by_rank[f.max_rank]];
        rc = em_err_set(b->err, EM_EFORMAT, "%s: line %u: token id (rank) %lld >= vocab_size %llu",
                        tk_path, e->line, (long long)e->rank, (unsigned long long)n);
        goto out;
    }
    if ((rc = em_hft_alloc_tokens(b, n))) goto out;
    char text[2 * TK_MAX_TOKEN_BYTES + 1];
    for (uint64_t i = 0; i < f.n; i++) {
        const tk_entry *e = &f.e[i];
        size_t len = bytes_to_text(f.bytes + e->off, e->len, text);
        if (!(v->tokens[e->rank] = em_hft_pool_str(b, text, len))) {
            rc = EM_ENOMEM;
            goto out;
        }
        v->types[e->rank] = EM_HF_TOKEN_NORMAL;
    }
    if ((rc = tk_place_decoder(b, &f, n_ranks)) || (rc = tk_place_reserved(b, &f, n_ranks)) ||
        (rc = tk_check_specials(b, &f)) || (rc = em_hft_fill_pads(b)) || (rc = tk_merges(b, &f)))
        goto out;
    snprintf(v->pre, sizeof v->pre, "kimi-k2");
    snprintf(v->source, sizeof v->source, "tiktoken");
    rc = em_hft_resolve_specials(b, NULL, arch);
out:
    tk_free(&f);
    return rc;
}
