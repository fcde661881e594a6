/* text/tokenizer.c: the byte-level BPE tokenizer: loading the vocabulary from GGUF keys,
 * encoding (specials, pre-tokenizer, BPE), decoding and streaming decode, UTF-8 checks.
 *
 * Invariants:
 *   - A token's bytes (what it decodes to) live in one pool: NORMAL/BYTE tokens hold their
 *     text through the inverse GPT-2 byte map, every other type its text verbatim.
 *   - byte_id[b] is the NORMAL token of the single byte b (-1 only for bytes that valid UTF-8
 *     never contains), so every piece of valid text can always be encoded.
 *   - BPE symbols are spans of the piece indexed by their first byte; a merge only grows the
 *     left symbol and empties the right one, so a queued pair is still valid exactly when
 *     both spans still have the lengths they had when it was queued.
 *   - Nothing is mutated after em_tok_create: encode/decode keep their scratch per call. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/text_impl.h"

#define KEY_MODEL "tokenizer.ggml.model"
#define KEY_PRE "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_TYPES "tokenizer.ggml.token_type"
#define KEY_MERGES "tokenizer.ggml.merges"
#define KEY_ADD_BOS "tokenizer.ggml.add_bos_token"
#define KEY_ADD_EOS "tokenizer.ggml.add_eos_token"

/* Upper bound on the vocabulary (real ones are < 1M); keeps ids and offsets in 32 bits. */
#define MAX_VOCAB (1 << 24)

typedef struct tok_entry {
    uint32_t text_off, text_len;   /* as in the file */
    uint32_t bytes_off, bytes_len; /* what it decodes to */
    int32_t type;                  /* enum em_tok_type */
} tok_entry;

/* Open-addressing table from a byte string (in the pool) to a token id. */
typedef struct str_table {
    int32_t *slots; /* -1 empty */
    uint64_t mask;
} str_table;

typedef struct merge_slot {
    uint64_t key; /* left << 32 | right; MERGE_EMPTY when free */
    int32_t rank;
    int32_t result;
} merge_slot;
#define MERGE_EMPTY UINT64_MAX

struct em_tok {
    int32_t n_vocab;
    tok_entry *tok;
    char *pool;
    size_t pool_len;
    size_t max_piece;
    int pre;
    char pre_name[64];
    int ranks; /* EM_TOK_RANKS_MERGES or EM_TOK_RANKS_TIKTOKEN */
    bool whole_piece_first; /* tiktoken, and llama.cpp's ignore_merges (llama3) */
    em_pretok *pretok;
    str_table by_bytes; /* NORMAL/BYTE tokens by their bytes */
    str_table by_text;  /* all tokens by their file text */
    merge_slot *merges;
    uint64_t merge_mask;
    int64_t n_merges;
    bool merges_follow_ids; /* each merge makes a token of a higher id than the last one */
    bool auto_ranks;        /* ranks chosen by the file, not by the caller */
    int32_t byte_id[256];
    /* specials matched in text, ordered by first byte, then longest first */
    int32_t *specials;
    uint32_t special_start[257];
    int32_t bos, eos, eot, eom, pad, unk;
    bool add_bos, add_eos;
    uint8_t *eog; /* n_vocab flags */
};

/* ---- UTF-8 ------------------------------------------------------------------------------ */

int em_utf8_check(const uint8_t *p, size_t n, size_t *seq) {
    uint8_t b0 = p[0];
    if (b0 < 0x80) {
        *seq = 1;
        return EM_UTF8_VALID;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* range of the second byte (Unicode table 3-7) */
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    else if (b0 == 0xE0) need = 2, lo = 0xA0;
    else if (b0 == 0xED) need = 2, hi = 0x9F;
    else if (b0 >= 0xE1 && b0 <= 0xEF) need = 2;
    else if (b0 == 0xF0) need = 3, lo = 0x90;
    else if (b0 == 0xF4) need = 3, hi = 0x8F;
    else if (b0 >= 0xF1 && b0 <= 0xF3) need = 3;
    else {
        *seq = 1; /* 80..C1, F5..FF never start a sequence */
        return EM_UTF8_INVALID;
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n) return EM_UTF8_INCOMPLETE;
        uint8_t b = p[k];
        bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!ok) {
            *seq = k; /* the maximal subpart ends before the offending byte */
            return EM_UTF8_INVALID;
        }
    }
    *seq = need + 1;
    return EM_UTF8_VALID;
}

size_t em_utf8_valid_prefix(const char *text, size_t len) {
    const uint8_t *p = (const uint8_t *)text;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) { /* ASCII runs are the common case */
            i++;
            continue;
        }
        size_t seq;
        if (em_utf8_check(p + i, len - i, &seq) != EM_UTF8_VALID) return i;
        i += seq;
    }
    return len;
}

/* Decodes one code point of valid-or-not UTF-8 at p[0..n): returns its length (1 for an
 * invalid byte, with *cp = UINT32_MAX). */
static size_t utf8_next(const uint8_t *p, size_t n, uint32_t *cp) {
    size_t seq;
    if (em_utf8_check(p, n, &seq) != EM_UTF8_VALID) {
        *cp = UINT32_MAX;
        return 1;
    }
    static const uint8_t lead_mask[5] = { 0, 0x7F, 0x1F, 0x0F, 0x07 };
    uint32_t c = p[0] & lead_mask[seq];
    for (size_t k = 1; k < seq; k++) c = c << 6 | (p[k] & 0x3F);
    *cp = c;
    return seq;
}

/* ---- the GPT-2 byte <-> unicode map ---------------------------------------------------- */

/* Bytes that are printable Latin-1 stand for themselves ('!'..'~', U+00A1..U+00AC,
 * U+00AE..U+00FF); the other 68 (0-32, 127-160, 173) take U+0100 onwards in byte order
 * (GPT-2's bytes_to_unicode). */
uint32_t em_tok_byte_to_unicode(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33u + (uint32_t)(b - 127);
    return 256u + 33u + 34u; /* 173 */
}

int em_tok_unicode_to_byte(uint32_t cp) {
    if (cp < 256) return em_tok_byte_to_unicode((uint8_t)cp) == cp ? (int)cp : -1;
    if (cp > 256 + 67) return -1;
    uint32_t n = cp - 256;
    if (n <= 32) return (int)n;
    if (n <= 66) return (int)(127 + n - 33);
    return 173;
}

#define CP_MAP_SIZE (256 + 68)

static void build_cp_to_byte(int16_t map[CP_MAP_SIZE]) {
    for (int i = 0; i < CP_MAP_SIZE; i++) map[i] = -1;
    for (int b = 0; b < 256; b++) map[em_tok_byte_to_unicode((uint8_t)b)] = (int16_t)b;
}

/* Writes the bytes a GPT-2-mapped text stands for into out (at most len bytes); code points
 * outside the map (a malformed vocabulary) are kept as their own UTF-8 bytes. */
static size_t unmap_text(const int16_t cp_to_byte[CP_MAP_SIZE], const uint8_t *text, size_t len,
                         uint8_t *out) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t step = utf8_next(text + i, len - i, &cp);
        if (cp < CP_MAP_SIZE && cp_to_byte[cp] >= 0) {
            out[n++] = (uint8_t)cp_to_byte[cp];
        } else {
            memcpy(out + n, text + i, step);
            n += step;
        }
        i += step;
    }
    return n;
}

/* ---- hash tables ------------------------------------------------------------------------ */

static uint64_t hash_bytes(const void *data, size_t len) {
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int table_init(str_table *t, uint64_t n, em_err *err) {
    uint64_t size = 16;
    while (size < 2 * n) size *= 2;
    t->slots = em_malloc(size * sizeof *t->slots, "tokenizer hash table", err);
    if (!t->slots) return EM_ENOMEM;
    memset(t->slots, 0xFF, size * sizeof *t->slots);
    t->mask = size - 1;
    return EM_OK;
}

static const char *entry_bytes(const em_tok *t, int32_t id, size_t *len) {
    *len = t->tok[id].bytes_len;
    return t->pool + t->tok[id].bytes_off;
}

static const char *entry_text(const em_tok *t, int32_t id, size_t *len) {
    *len = t->tok[id].text_len;
    return t->pool + t->tok[id].text_off;
}

typedef const char *(*key_of_fn)(const em_tok *t, int32_t id, size_t *len);

/* Inserts id; an id already there under the same key is replaced (later ids win, as in
 * llama.cpp's token_to_id map). */
static void table_put(const em_tok *t, str_table *tab, key_of_fn key_of, int32_t id) {
    size_t len;
    const char *key = key_of(t, id, &len);
    for (uint64_t i = hash_bytes(key, len) & tab->mask;; i = (i + 1) & tab->mask) {
        int32_t at = tab->slots[i];
        if (at < 0) {
            tab->slots[i] = id;
            return;
        }
        size_t l2;
        const char *k2 = key_of(t, at, &l2);
        if (l2 == len && !memcmp(k2, key, len)) {
            tab->slots[i] = id;
            return;
        }
    }
}

static int32_t table_get(const em_tok *t, const str_table *tab, key_of_fn key_of,
                         const void *key, size_t len) {
    for (uint64_t i = hash_bytes(key, len) & tab->mask;; i = (i + 1) & tab->mask) {
        int32_t at = tab->slots[i];
        if (at < 0) return -1;
        size_t l2;
        const char *k2 = key_of(t, at, &l2);
        if (l2 == len && !memcmp(k2, key, len)) return at;
    }
}

static int32_t find_by_bytes(const em_tok *t, const void *bytes, size_t len) {
    return table_get(t, &t->by_bytes, entry_bytes, bytes, len);
}

int32_t em_tok_find(const em_tok *t, const char *text, size_t len) {
    return table_get(t, &t->by_text, entry_text, text, len);
}

/* First merge of a pair wins (the lowest rank). */
static void merge_put(em_tok *t, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint64_t i = hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        merge_slot *s = &t->merges[i];
        if (s->key == key) return;
        if (s->key == MERGE_EMPTY) {
            *s = (merge_slot){ key, rank, result };
            return;
        }
    }
}

static const merge_slot *merge_get(const em_tok *t, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint64_t i = hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const merge_slot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == MERGE_EMPTY) return NULL;
    }
}

/* ---- loading ---------------------------------------------------------------------------- */

static bool type_is_normal(int32_t type) { return type == EM_TOK_NORMAL || type == EM_TOK_BYTE; }

/* Reads the strings of tokenizer.ggml.tokens and their types into t->tok and the pool. */
static int load_tokens(em_tok *t, const em_gguf *g, em_err *err) {
    const char *path = em_gguf_path(g);
    const em_gguf_arr *toks;
    int rc = em_gguf_get_arr(g, KEY_TOKENS, &toks, err);
    if (rc) return em_err_prefix(err, "tokenizer");
    if (em_gguf_arr_type(toks) != EM_GGUF_STR)
        return em_err_set(err, EM_EFORMAT, "%s: %s is an array of %s, not of strings", path,
                          KEY_TOKENS, em_gguf_type_name(em_gguf_arr_type(toks)));
    uint64_t n = em_gguf_arr_count(toks);
    if (n == 0 || n > MAX_VOCAB)
        return em_err_set(err, EM_EFORMAT, "%s: %s has %llu tokens (1..%d allowed)", path,
                          KEY_TOKENS, (unsigned long long)n, MAX_VOCAB);
    t->n_vocab = (int32_t)n;

    const em_gguf_arr *types = NULL;
    if (em_gguf_find_key(g, KEY_TYPES) >= 0) {
        rc = em_gguf_get_arr(g, KEY_TYPES, &types, err);
        if (rc) return rc;
        if (em_gguf_arr_count(types) != n)
            return em_err_set(err, EM_EFORMAT, "%s: %s has %llu entries but %s has %llu", path,
                              KEY_TYPES, (unsigned long long)em_gguf_arr_count(types), KEY_TOKENS,
                              (unsigned long long)n);
    }

    t->tok = em_calloc(n, sizeof *t->tok, "tokenizer entries", err);
    if (!t->tok) return EM_ENOMEM;
    /* pool: every text, then the unmapped bytes of NORMAL tokens (never longer than the
     * text: each code point turns into at most its own UTF-8 length) */
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        em_gguf_str s = em_gguf_arr_at(toks, i).str;
        if (s.len > UINT32_MAX || em_add_overflow(total, 2 * s.len, &total) || total > UINT32_MAX)
            return em_err_set(err, EM_EOVERFLOW, "%s: %s: token texts exceed 4 GiB (at token %llu)",
                              path, KEY_TOKENS, (unsigned long long)i);
    }
    t->pool = em_malloc(total ? total : 1, "tokenizer strings", err);
    if (!t->pool) return EM_ENOMEM;

    int16_t cp_to_byte[CP_MAP_SIZE];
    build_cp_to_byte(cp_to_byte);
    size_t used = 0;
    for (uint64_t i = 0; i < n; i++) {
        tok_entry *e = &t->tok[i];
        em_gguf_str s = em_gguf_arr_at(toks, i).str;
        int64_t type = EM_TOK_NORMAL;
        if (types) {
            rc = em_gguf_arr_get_int(types, i, &type, err);
            if (rc) return em_err_prefix(err, "%s: %s[%llu]", path, KEY_TYPES, (unsigned long long)i);
            if (type < EM_TOK_UNDEFINED || type > EM_TOK_BYTE)
                return em_err_set(err, EM_EFORMAT, "%s: %s[%llu] = %lld is not a token type (0..6)",
                                  path, KEY_TYPES, (unsigned long long)i, (long long)type);
        }
        e->type = (int32_t)type;
        e->text_off = (uint32_t)used;
        e->text_len = (uint32_t)s.len;
        if (s.len) memcpy(t->pool + used, s.ptr, s.len);
        used += s.len;
        if (type_is_normal(e->type)) {
            e->bytes_off = (uint32_t)used;
            e->bytes_len = (uint32_t)unmap_text(cp_to_byte, (const uint8_t *)t->pool + e->text_off,
                                                s.len, (uint8_t *)t->pool + used);
            used += e->bytes_len;
        } else if (e->type == EM_TOK_UNUSED) {
            e->bytes_off = e->text_off;
            e->bytes_len = 0;
        } else {
            e->bytes_off = e->text_off;
            e->bytes_len = e->text_len;
        }
        if (e->bytes_len > t->max_piece) t->max_piece = e->bytes_len;
    }
    t->pool_len = used;
    return EM_OK;
}

static int build_tables(em_tok *t, em_err *err) {
    int rc = table_init(&t->by_bytes, (uint64_t)t->n_vocab, err);
    if (!rc) rc = table_init(&t->by_text, (uint64_t)t->n_vocab, err);
    if (rc) return rc;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        table_put(t, &t->by_text, entry_text, id);
        if (type_is_normal(t->tok[id].type) && t->tok[id].bytes_len > 0)
            table_put(t, &t->by_bytes, entry_bytes, id);
    }
    return EM_OK;
}

/* Every byte valid UTF-8 can hold must be a token: 00..7F, 80..BF, C2..F4. */
static int find_byte_tokens(em_tok *t, const char *path, em_err *err) {
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        t->byte_id[b] = find_by_bytes(t, &byte, 1);
        bool needed = b <= 0xBF || (b >= 0xC2 && b <= 0xF4);
        if (t->byte_id[b] < 0 && needed) {
            char mapped[8];
            uint32_t cp = em_tok_byte_to_unicode(byte);
            if (cp < 0x80) snprintf(mapped, sizeof mapped, "%c", (char)cp);
            else snprintf(mapped, sizeof mapped, "%c%c", (char)(0xC0 | cp >> 6), (char)(0x80 | (cp & 0x3F)));
            return em_err_set(err, EM_EFORMAT,
                              "%s: %s has no NORMAL token for byte 0x%02X (GPT-2 text \"%s\"); "
                              "a byte-level BPE vocabulary needs all of them",
                              path, KEY_TOKENS, b, mapped);
        }
    }
    return EM_OK;
}

/* tokenizer.ggml.merges: "left right" in GPT-2-mapped text, in priority order. Pairs whose
 * parts or result are not NORMAL tokens can never apply and are skipped. */
static int load_merges(em_tok *t, const em_gguf *g, em_err *err) {
    const char *path = em_gguf_path(g);
    const em_gguf_arr *arr;
    int rc = em_gguf_get_arr(g, KEY_MERGES, &arr, err);
    if (rc) return rc;
    if (em_gguf_arr_type(arr) != EM_GGUF_STR)
        return em_err_set(err, EM_EFORMAT, "%s: %s is an array of %s, not of strings", path,
                          KEY_MERGES, em_gguf_type_name(em_gguf_arr_type(arr)));
    uint64_t n = em_gguf_arr_count(arr);
    if (n > INT32_MAX)
        return em_err_set(err, EM_EFORMAT, "%s: %s has %llu entries", path, KEY_MERGES,
                          (unsigned long long)n);
    uint64_t size = 16;
    while (size < 2 * n) size *= 2;
    t->merges = em_malloc(size * sizeof *t->merges, "tokenizer merges", err);
    if (!t->merges) return EM_ENOMEM;
    for (uint64_t i = 0; i < size; i++) t->merges[i].key = MERGE_EMPTY;
    t->merge_mask = size - 1;
    t->n_merges = (int64_t)n;

    int16_t cp_to_byte[CP_MAP_SIZE];
    build_cp_to_byte(cp_to_byte);
    /* a part longer than 4 text bytes per piece byte cannot name a token */
    size_t part_max = 4 * t->max_piece + 4;
    uint8_t *buf = em_malloc(2 * part_max, "merge scratch", err);
    if (!buf) return EM_ENOMEM;
    uint64_t skipped = 0;
    int32_t last_result = -1;
    t->merges_follow_ids = true;
    for (uint64_t i = 0; i < n; i++) {
        em_gguf_str s = em_gguf_arr_at(arr, i).str;
        /* the separator is the first space after the first byte (llama.cpp's rule); mapped
         * text has no spaces, so a merge of the malformed kind is skipped */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        size_t l1 = sp ? (size_t)(sp - s.ptr) : 0, l2 = sp ? s.len - l1 - 1 : 0;
        if (!sp || l2 == 0 || l1 > part_max || l2 > part_max) {
            skipped++;
            continue;
        }
        /* both parts unmapped into buf, back to back: then the result is buf itself */
        size_t b1 = unmap_text(cp_to_byte, (const uint8_t *)s.ptr, l1, buf);
        size_t b2 = unmap_text(cp_to_byte, (const uint8_t *)sp + 1, l2, buf + b1);
        int32_t left = find_by_bytes(t, buf, b1);
        int32_t right = find_by_bytes(t, buf + b1, b2);
        int32_t result = left >= 0 && right >= 0 ? find_by_bytes(t, buf, b1 + b2) : -1;
        if (result < 0) {
            skipped++;
            continue;
        }
        merge_put(t, left, right, (int32_t)i, result);
        if (result <= last_result || result <= left || result <= right) t->merges_follow_ids = false;
        last_result = result;
    }
    free(buf);
    if (skipped)
        em_log(EM_LOG_DEBUG, "%s: %llu of %llu merges name no tokens and are ignored", path,
               (unsigned long long)skipped, (unsigned long long)n);
    return EM_OK;
}

/* An optional special id; out of range is ignored with a warning, as llama.cpp does. */
static int32_t special_id(const em_tok *t, const em_gguf *g, const char *what) {
    char key[64];
    snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", what);
    if (em_gguf_find_key(g, key) < 0) return -1;
    int64_t v;
    em_err e = { 0 };
    if (em_gguf_get_int(g, key, &v, &e) != EM_OK) {
        em_log(EM_LOG_WARN, "%s: %s ignored: %s", em_gguf_path(g), key, e.msg);
        return -1;
    }
    if (v < 0 || v >= t->n_vocab) {
        em_log(EM_LOG_WARN, "%s: %s = %lld is outside the vocabulary (%d tokens); ignored",
               em_gguf_path(g), key, (long long)v, t->n_vocab);
        return -1;
    }
    return (int32_t)v;
}

static int optional_bool(const em_gguf *g, const char *key, bool *out, em_err *err) {
    if (em_gguf_find_key(g, key) < 0) return EM_OK;
    return em_gguf_get_bool(g, key, out, err);
}

/* Specials matched in text: CONTROL, USER_DEFINED and UNKNOWN tokens whose text is non-empty
 * valid UTF-8 (so a match always starts and ends on a character boundary). */
static bool is_matchable_special(const em_tok *t, int32_t id) {
    const tok_entry *e = &t->tok[id];
    return (e->type == EM_TOK_CONTROL || e->type == EM_TOK_USER_DEFINED || e->type == EM_TOK_UNKNOWN) &&
           e->text_len > 0 && em_utf8_valid_prefix(t->pool + e->text_off, e->text_len) == e->text_len;
}

typedef struct special_key {
    uint8_t first;
    uint32_t len;
    int32_t id;
} special_key;

/* by first byte, then longest first, then lowest id */
static int special_cmp(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_specials(em_tok *t, em_err *err) {
    size_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) n += is_matchable_special(t, id);
    special_key *keys = em_malloc((n ? n : 1) * sizeof *keys, "special tokens", err);
    t->specials = keys ? em_malloc((n ? n : 1) * sizeof *t->specials, "special tokens", err) : NULL;
    if (!t->specials) {
        free(keys);
        return EM_ENOMEM;
    }
    n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (is_matchable_special(t, id))
            keys[n++] = (special_key){ (uint8_t)t->pool[t->tok[id].text_off], t->tok[id].text_len, id };
    qsort(keys, n, sizeof *keys, special_cmp);
    size_t i = 0;
    for (int b = 0; b < 256; b++) {
        t->special_start[b] = (uint32_t)i;
        while (i < n && keys[i].first == b) i++;
    }
    t->special_start[256] = (uint32_t)n;
    for (i = 0; i < n; i++) t->specials[i] = keys[i].id;
    free(keys);
    return EM_OK;
}

static int build_eog(em_tok *t, em_err *err) {
    static const char *const names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
    };
    t->eog = em_calloc((size_t)t->n_vocab, 1, "end-of-generation flags", err);
    if (!t->eog) return EM_ENOMEM;
    int32_t fixed[] = { t->eos, t->eot, t->eom };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i] >= 0) t->eog[fixed[i]] = 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = em_tok_find(t, names[i], strlen(names[i]));
        if (id >= 0 && t->tok[id].type == EM_TOK_CONTROL) t->eog[id] = 1;
    }
    return EM_OK;
}

static int check_model(em_tok *t, const em_gguf *g, const em_tok_opts *opts, em_err *err) {
    const char *path = em_gguf_path(g);
    char model[64];
    int rc = em_gguf_get_cstr(g, KEY_MODEL, model, sizeof model, err);
    if (rc == EM_ENOTFOUND) return em_err_set(err, rc, "%s: no tokenizer (%s is missing)", path, KEY_MODEL);
    if (rc) return rc;
    if (strcmp(model, "gpt2"))
        return em_err_set(err, EM_EUNSUPPORTED,
                          "%s: tokenizer model \"%s\" is not supported (only \"gpt2\", byte-level BPE)",
                          path, model);
    rc = em_gguf_get_cstr(g, KEY_PRE, t->pre_name, sizeof t->pre_name, err);
    if (rc == EM_ENOTFOUND)
        return em_err_set(err, rc, "%s: %s is missing; Ember does not guess a pre-tokenizer", path, KEY_PRE);
    if (rc) return rc;
    t->pre = em_pretok_from_name(t->pre_name);
    if (t->pre < 0)
        return em_err_set(err, EM_EUNSUPPORTED,
                          "%s: pre-tokenizer \"%s\" is not supported (Ember knows \"kimi-k2\", "
                          "\"gpt-2\", \"llama-bpe\", \"qwen2\")",
                          path, t->pre_name);
    int want = opts ? opts->ranks : EM_TOK_RANKS_AUTO;
    if (want < EM_TOK_RANKS_AUTO || want > EM_TOK_RANKS_TIKTOKEN)
        return em_err_set(err, EM_EINVAL, "tokenizer: ranks option %d is not one of auto/merges/tiktoken", want);
    bool has_merges = em_gguf_find_key(g, KEY_MERGES) >= 0;
    t->auto_ranks = want == EM_TOK_RANKS_AUTO;
    if (want == EM_TOK_RANKS_AUTO) /* kimi-k2 may still turn to tiktoken: see em_tok_create */
        want = has_merges ? EM_TOK_RANKS_MERGES : t->pre == EM_TOK_PRE_KIMI_K2 ? EM_TOK_RANKS_TIKTOKEN : -1;
    if (want < 0 || (want == EM_TOK_RANKS_MERGES && !has_merges))
        return em_err_set(err, EM_EFORMAT, "%s: %s is missing (needed for pre-tokenizer \"%s\")",
                          path, KEY_MERGES, t->pre_name);
    t->ranks = want;
    t->whole_piece_first = want == EM_TOK_RANKS_TIKTOKEN || t->pre == EM_TOK_PRE_LLAMA3;
    return EM_OK;
}

int em_tok_create(em_tok **out, const em_gguf *g, const em_tok_opts *opts, em_err *err) {
    *out = NULL;
    em_tok *t = em_calloc(1, sizeof *t, "tokenizer", err);
    if (!t) return EM_ENOMEM;
    const char *path = em_gguf_path(g);
    int rc = check_model(t, g, opts, err);
    if (!rc) rc = load_tokens(t, g, err);
    if (!rc) rc = build_tables(t, err);
    if (!rc) rc = find_byte_tokens(t, path, err);
    if (!rc && t->ranks == EM_TOK_RANKS_MERGES) rc = load_merges(t, g, err);
    /* A kimi-k2 vocabulary comes from tiktoken.model, whose ids are BPE ranks, and merges
     * rebuilt from those ranks miss every token BPE cannot reach in two parts. When the
     * merges confirm that ids are ranks, rank by ids as tiktoken (Kimi's own tokenizer) does. */
    if (!rc && t->auto_ranks && t->pre == EM_TOK_PRE_KIMI_K2 && t->ranks == EM_TOK_RANKS_MERGES &&
        t->merges_follow_ids) {
        t->ranks = EM_TOK_RANKS_TIKTOKEN;
        t->whole_piece_first = true;
    }
    if (!rc) rc = build_specials(t, err);
    if (!rc) {
        t->bos = special_id(t, g, "bos");
        t->eos = special_id(t, g, "eos");
        t->eot = special_id(t, g, "eot");
        t->eom = special_id(t, g, "eom");
        t->pad = special_id(t, g, "padding");
        t->unk = special_id(t, g, "unknown");
        t->add_bos = t->pre == EM_TOK_PRE_LLAMA3 && t->bos >= 0; /* llama.cpp's default */
        rc = optional_bool(g, KEY_ADD_BOS, &t->add_bos, err);
    }
    if (!rc) rc = optional_bool(g, KEY_ADD_EOS, &t->add_eos, err);
    if (!rc && t->add_bos && t->bos < 0)
        rc = em_err_set(err, EM_EFORMAT, "%s: %s is true but there is no bos token id", path, KEY_ADD_BOS);
    if (!rc && t->add_eos && t->eos < 0)
        rc = em_err_set(err, EM_EFORMAT, "%s: %s is true but there is no eos token id", path, KEY_ADD_EOS);
    if (!rc) rc = build_eog(t, err);
    if (!rc) rc = em_pretok_create(&t->pretok, t->pre, err);
    if (rc) {
        em_tok_free(t);
        return rc;
    }
    *out = t;
    return EM_OK;
}

void em_tok_free(em_tok *t) {
    if (!t) return;
    em_pretok_free(t->pretok);
    free(t->tok);
    free(t->pool);
    free(t->by_bytes.slots);
    free(t->by_text.slots);
    free(t->merges);
    free(t->specials);
    free(t->eog);
    free(t);
}

int32_t em_tok_n_vocab(const em_tok *t) { return t->n_vocab; }
int em_tok_pre_type(const em_tok *t) { return t->pre; }
const char *em_tok_pre_name(const em_tok *t) { return t->pre_name; }
int em_tok_ranks(const em_tok *t) { return t->ranks; }
int em_tok_type_of(const em_tok *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->tok[id].type : -1;
}
int32_t em_tok_bos(const em_tok *t) { return t->bos; }
int32_t em_tok_eos(const em_tok *t) { return t->eos; }
int32_t em_tok_eot(const em_tok *t) { return t->eot; }
int32_t em_tok_pad(const em_tok *t) { return t->pad; }
bool em_tok_add_bos(const em_tok *t) { return t->add_bos; }
bool em_tok_add_eos(const em_tok *t) { return t->add_eos; }
bool em_tok_is_eog(const em_tok *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->eog[id]; }
size_t em_tok_max_piece(const em_tok *t) { return t->max_piece; }

const char *em_tok_piece(const em_tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return entry_bytes(t, id, len);
}

const char *em_tok_text(const em_tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return entry_text(t, id, len);
}

/* ---- encoding ---------------------------------------------------------------------------- */

typedef struct bpe_sym {
    int32_t id;   /* the token this span is now */
    uint32_t len; /* 0: merged into the symbol on its left */
    int32_t prev; /* index of the live symbol before, -1 at the start */
} bpe_sym;

typedef struct bpe_pair {
    int32_t rank;
    int32_t result;
    uint32_t left, left_len, right_len;
} bpe_pair;

/* Per-call state of one encode. */
typedef struct encoder {
    const em_tok *t;
    const char *frag; /* the fragment the pre-tokenizer is cutting */
    int32_t *ids;
    size_t n_ids, cap_ids;
    bpe_sym *syms;
    size_t cap_syms;
    bpe_pair *heap;
    size_t n_heap, cap_heap;
    em_err *err;
} encoder;

static int grow(void **buf, size_t *cap, size_t need, size_t elem, const char *what, em_err *err) {
    if (need <= *cap) return EM_OK;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) {
        if (cap2 > SIZE_MAX / 2 / elem) return em_err_set(err, EM_EOVERFLOW, "tokenizer: %s too large", what);
        cap2 *= 2;
    }
    void *p = realloc(*buf, cap2 * elem);
    if (!p) return em_err_set(err, EM_ENOMEM, "tokenizer: out of memory for %s (%zu entries)", what, cap2);
    *buf = p;
    *cap = cap2;
    return EM_OK;
}

static int emit(encoder *e, int32_t id) {
    int rc = grow((void **)&e->ids, &e->cap_ids, e->n_ids + 1, sizeof *e->ids, "token ids", e->err);
    if (rc) return rc;
    e->ids[e->n_ids++] = id;
    return EM_OK;
}

static bool pair_less(const bpe_pair *a, const bpe_pair *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static int heap_push(encoder *e, bpe_pair p) {
    int rc = grow((void **)&e->heap, &e->cap_heap, e->n_heap + 1, sizeof *e->heap, "BPE queue", e->err);
    if (rc) return rc;
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_less(&p, &e->heap[up])) break;
        e->heap[i] = e->heap[up];
        i = up;
    }
    e->heap[i] = p;
    return EM_OK;
}

static bpe_pair heap_pop(encoder *e) {
    bpe_pair top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!pair_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* Queues the pair of live symbols at left and its right neighbour, if it merges. */
static int queue_pair(encoder *e, const char *piece, size_t n, int32_t left) {
    if (left < 0) return EM_OK;
    const bpe_sym *l = &e->syms[left];
    size_t right = (size_t)left + l->len;
    if (right >= n) return EM_OK;
    const bpe_sym *r = &e->syms[right];
    int32_t rank, result;
    if (e->t->ranks == EM_TOK_RANKS_MERGES) {
        const merge_slot *m = merge_get(e->t, l->id, r->id);
        if (!m) return EM_OK;
        rank = m->rank;
        result = m->result;
    } else {
        result = find_by_bytes(e->t, piece + left, l->len + r->len);
        if (result < 0) return EM_OK;
        rank = result; /* tiktoken: ids are ranks */
    }
    return heap_push(e, (bpe_pair){ rank, result, (uint32_t)left, l->len, r->len });
}

/* BPE over one piece: start from single bytes, merge the best-ranked pair (leftmost on
 * ties) until none is left. O(n log n) in the piece length. */
static int encode_piece(encoder *e, const char *piece, size_t n) {
    const em_tok *t = e->t;
    if (n > INT32_MAX) return em_err_set(e->err, EM_EOVERFLOW, "tokenizer: piece of %zu bytes", n);
    if (t->whole_piece_first) {
        int32_t id = find_by_bytes(t, piece, n);
        if (id >= 0) return emit(e, id);
    }
    int rc = grow((void **)&e->syms, &e->cap_syms, n, sizeof *e->syms, "BPE symbols", e->err);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(uint8_t)piece[i]];
        assert(id >= 0); /* valid UTF-8 only holds bytes checked at load */
        e->syms[i] = (bpe_sym){ id, 1, (int32_t)i - 1 };
    }
    e->n_heap = 0;
    for (size_t i = 0; i + 1 < n && !rc; i++) rc = queue_pair(e, piece, n, (int32_t)i);
    while (e->n_heap && !rc) {
        bpe_pair p = heap_pop(e);
        bpe_sym *l = &e->syms[p.left];
        size_t right = (size_t)p.left + p.left_len;
        if (l->len != p.left_len || right >= n || e->syms[right].len != p.right_len) continue; /* stale */
        bpe_sym *r = &e->syms[right];
        l->len += r->len;
        l->id = p.result;
        r->len = 0;
        size_t next = (size_t)p.left + l->len;
        if (next < n) e->syms[next].prev = (int32_t)p.left;
        rc = queue_pair(e, piece, n, l->prev);
        if (!rc) rc = queue_pair(e, piece, n, (int32_t)p.left);
    }
    for (size_t i = 0; i < n && !rc; i += e->syms[i].len) rc = emit(e, e->syms[i].id);
    return rc;
}

static int on_piece(void *ctx, size_t start, size_t end) {
    encoder *e = ctx;
    return encode_piece(e, e->frag + start, end - start);
}

/* The pre-tokenizer sees each stretch between specials alone: a special is a boundary no
 * piece crosses (as in tiktoken and llama.cpp). */
static int encode_fragment(encoder *e, const char *frag, size_t len) {
    if (len == 0) return EM_OK;
    e->frag = frag;
    return em_pretok_run(e->t->pretok, frag, len, on_piece, e, e->err);
}

/* The longest special starting at text[pos], or -1. */
static int32_t special_at(const em_tok *t, const char *text, size_t len, size_t pos,
                          unsigned flags) {
    uint8_t b = (uint8_t)text[pos];
    for (uint32_t i = t->special_start[b]; i < t->special_start[b + 1]; i++) {
        int32_t id = t->specials[i];
        const tok_entry *s = &t->tok[id];
        if (s->type != EM_TOK_USER_DEFINED && !(flags & EM_TOK_PARSE_SPECIAL)) continue;
        if (s->text_len <= len - pos && !memcmp(text + pos, t->pool + s->text_off, s->text_len))
            return id;
    }
    return -1;
}

int em_tok_encode(const em_tok *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                  size_t *n_ids, em_err *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return em_err_set(err, EM_EINVAL, "tokenizer: NULL text of %zu bytes", len);
    if (!text) text = "";
    size_t bad = em_utf8_valid_prefix(text, len);
    if (bad < len)
        return em_err_set(err, EM_EINVAL, "tokenizer: input is not valid UTF-8 at byte %zu (0x%02X)",
                          bad, (uint8_t)text[bad]);
    encoder e = { .t = t, .err = err };
    int rc = grow((void **)&e.ids, &e.cap_ids, len / 3 + 8, sizeof *e.ids, "token ids", err);
    if (!rc && (flags & EM_TOK_ADD_SPECIAL) && t->add_bos) rc = emit(&e, t->bos);
    size_t frag = 0;
    for (size_t pos = 0; pos < len && !rc;) {
        uint8_t b = (uint8_t)text[pos];
        int32_t id = t->special_start[b] < t->special_start[b + 1] ? special_at(t, text, len, pos, flags) : -1;
        if (id < 0) {
            pos++;
            continue;
        }
        rc = encode_fragment(&e, text + frag, pos - frag);
        if (!rc) rc = emit(&e, id);
        pos += t->tok[id].text_len;
        frag = pos;
    }
    if (!rc) rc = encode_fragment(&e, text + frag, len - frag);
    if (!rc && (flags & EM_TOK_ADD_SPECIAL) && t->add_eos) rc = emit(&e, t->eos);
    free(e.syms);
    free(e.heap);
    if (rc) {
        free(e.ids);
        return rc;
    }
    *ids = e.ids;
    *n_ids = e.n_ids;
    return EM_OK;
}

/* ---- decoding ---------------------------------------------------------------------------- */

static bool skipped(const em_tok *t, int32_t id, unsigned flags) {
    int type = t->tok[id].type;
    return (flags & EM_TOK_SKIP_SPECIAL) && (type == EM_TOK_CONTROL || type == EM_TOK_UNKNOWN);
}

int em_tok_decode(const em_tok *t, const int32_t *ids, size_t n_ids, unsigned flags,
                  char **out, size_t *len, em_err *err) {
    *out = NULL;
    *len = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return em_err_set(err, EM_EINVAL, "tokenizer: id %d (position %zu) is outside the vocabulary (%d tokens)",
                              ids[i], i, t->n_vocab);
        if (!skipped(t, ids[i], flags)) total += t->tok[ids[i]].bytes_len;
    }
    if (total > SIZE_MAX - 1) return em_err_set(err, EM_EOVERFLOW, "tokenizer: decoded text too large");
    char *buf = em_malloc((size_t)total + 1, "decoded text", err);
    if (!buf) return EM_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (skipped(t, ids[i], flags)) continue;
        size_t l;
        const char *p = entry_bytes(t, ids[i], &l);
        memcpy(buf + n, p, l);
        n += l;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return EM_OK;
}

struct em_tok_stream {
    const em_tok *t;
    unsigned flags;
    uint8_t pend[4];
    size_t n_pend;
    uint8_t *work; /* pend + one piece */
    char *out;     /* worst case: every byte replaced by U+FFFD (3 bytes) */
};

int em_tok_stream_create(em_tok_stream **out, const em_tok *t, unsigned flags, em_err *err) {
    *out = NULL;
    em_tok_stream *s = em_calloc(1, sizeof *s, "decode stream", err);
    if (!s) return EM_ENOMEM;
    s->t = t;
    s->flags = flags;
    size_t cap = t->max_piece + 4;
    s->work = em_malloc(cap, "decode stream", err);
    s->out = s->work ? em_malloc(3 * cap, "decode stream", err) : NULL;
    if (!s->out) {
        em_tok_stream_free(s);
        return EM_ENOMEM;
    }
    *out = s;
    return EM_OK;
}

void em_tok_stream_free(em_tok_stream *s) {
    if (!s) return;
    free(s->work);
    free(s->out);
    free(s);
}

static size_t put_invalid(const em_tok_stream *s, const uint8_t *p, size_t n, char *out) {
    if (!(s->flags & EM_TOK_STREAM_REPLACE)) {
        memcpy(out, p, n);
        return n;
    }
    memcpy(out, "\xEF\xBF\xBD", 3);
    return 3;
}

int em_tok_stream_push(em_tok_stream *s, int32_t id, const char **bytes, size_t *n, em_err *err) {
    *bytes = s->out;
    *n = 0;
    const em_tok *t = s->t;
    if (id < 0 || id >= t->n_vocab)
        return em_err_set(err, EM_EINVAL, "tokenizer: id %d is outside the vocabulary (%d tokens)", id, t->n_vocab);
    if (skipped(t, id, s->flags)) return EM_OK;
    size_t plen;
    const char *piece = entry_bytes(t, id, &plen);
    memcpy(s->work, s->pend, s->n_pend);
    memcpy(s->work + s->n_pend, piece, plen);
    size_t total = s->n_pend + plen, i = 0, o = 0;
    s->n_pend = 0;
    while (i < total) {
        size_t seq;
        int st = em_utf8_check(s->work + i, total - i, &seq);
        if (st == EM_UTF8_INCOMPLETE) { /* only at the end; at most 3 bytes */
            s->n_pend = total - i;
            memcpy(s->pend, s->work + i, s->n_pend);
            break;
        }
        if (st == EM_UTF8_VALID) {
            memcpy(s->out + o, s->work + i, seq);
            o += seq;
        } else {
            o += put_invalid(s, s->work + i, seq, s->out + o);
        }
        i += seq;
    }
    *n = o;
    return EM_OK;
}

void em_tok_stream_flush(em_tok_stream *s, const char **bytes, size_t *n) {
    *bytes = s->out;
    /* what is held back is one incomplete sequence: one maximal subpart */
    *n = s->n_pend ? put_invalid(s, s->pend, s->n_pend, s->out) : 0;
    s->n_pend = 0;
}
