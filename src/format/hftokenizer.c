/* format/hftokenizer: Hugging Face tokenizer files (tokenizer.json, or Kimi's tiktoken.model
 * with tokenizer_config.json) -> em_hf_vocab, the content of llama.cpp's tokenizer.ggml.*
 * keys. The rules (which llama.cpp converter behaviour each mirrors) are in hftokenizer.h.
 *
 * Invariants of a successful load: n_tokens == the requested vocab_size (or the tokenizer's
 * own size), every tokens[i] is a NUL-terminated UTF-8 string and every types[i] one of
 * EM_HF_TOKEN_*; no two source tokens share a text; every special id is in [0, n_tokens) or -1; all
 * strings live in v->pool. On failure the struct is empty. Nothing here touches GGUF: the
 * converter writes the keys. No global mutable state. */
#include "format/hftokenizer.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_CAP 4096
/* Longest tiktoken token accepted: the merge rebuild is quadratic in a token's length, so an
 * absurd token must not stall the converter. Real vocabularies stay far below this. */
#define TK_MAX_TOKEN_BYTES 1024
/* Kimi's TikTokenTokenizer reserves this many ids after the ranks for specials. */
#define KIMI_N_RESERVED 256

/* ---- string pool: strings that never move, freed all at once ------------------------ */

typedef struct pool_chunk {
    struct pool_chunk *next;
    size_t used, cap;
    char data[];
} pool_chunk;

struct em_hf_strpool {
    pool_chunk *head;
};

#define POOL_CHUNK (1u << 20)

/* Copies n bytes of s plus a NUL; NULL when memory runs out. */
static char *pool_add(em_hf_strpool *p, const char *s, size_t n) {
    pool_chunk *c = p->head;
    if (!c || c->cap - c->used < n + 1) {
        size_t cap = n + 1 > POOL_CHUNK ? n + 1 : POOL_CHUNK;
        pool_chunk *nc = malloc(sizeof *nc + cap);
        if (!nc) return NULL;
        nc->next = c;
        nc->used = 0;
        nc->cap = cap;
        p->head = nc;
        c = nc;
    }
    char *out = c->data + c->used;
    memcpy(out, s, n);
    out[n] = '\0';
    c->used += n + 1;
    return out;
}

static void pool_free(em_hf_strpool *p) {
    if (!p) return;
    for (pool_chunk *c = p->head; c;) {
        pool_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(p);
}

/* ---- byte-string hash map (fixed capacity, open addressing) -------------------------- */

typedef struct bslot {
    const uint8_t *key; /* NULL = empty; points at memory that outlives the map */
    uint32_t len;
    uint32_t hash; /* high bits of the key's hash: most misses end here, before memcmp */
    int64_t val;
} bslot;

typedef struct bmap {
    bslot *slots;
    uint64_t mask;
} bmap;

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Room for at least n keys at load <= 1/2. */
static int bmap_init(bmap *m, uint64_t n, const char *what, em_err *err) {
    uint64_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    m->slots = em_calloc(cap, sizeof *m->slots, what, err);
    m->mask = cap - 1;
    return m->slots ? EM_OK : EM_ENOMEM;
}

static void bmap_free(bmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static bslot *bmap_find(const bmap *m, const void *key, size_t len, uint32_t *hash) {
    uint64_t h = fnv1a(key, len);
    *hash = (uint32_t)(h >> 32);
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        bslot *s = &m->slots[i];
        if (!s->key ||
            (s->hash == *hash && s->len == len && memcmp(s->key, key, len) == 0))
            return s;
    }
}

static int64_t bmap_get(const bmap *m, const void *key, size_t len) {
    uint32_t hash;
    bslot *s = bmap_find(m, key, len, &hash);
    return s->key ? s->val : -1;
}

/* Inserts key -> val unless the key is there; returns the existing value or -1. The caller
 * never inserts more keys than bmap_init was sized for. */
static int64_t bmap_put(bmap *m, const void *key, size_t len, int64_t val) {
    uint32_t hash;
    bslot *s = bmap_find(m, key, len, &hash);
    if (s->key) return s->val;
    s->key = key;
    s->len = (uint32_t)len;
    s->hash = hash;
    s->val = val;
    return -1;
}

/* ---- GPT-2 byte <-> unicode ---------------------------------------------------------- */

/* Bytes that are printable Latin-1 stand for themselves; the other 68 (0-32, 127-160, 173)
 * take U+0100 onwards in byte order (GPT-2's bytes_to_unicode). */
uint32_t em_hf_byte_to_unicode(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33u + (uint32_t)(b - 127);
    return 256u + 33u + 34u; /* 173 */
}

/* The byte a code point stands for, or -1. */
static int unicode_to_byte(uint32_t cp) {
    if (cp < 256) return em_hf_byte_to_unicode((uint8_t)cp) == cp ? (int)cp : -1;
    if (cp > 256 + 67) return -1;
    uint32_t n = cp - 256;
    if (n <= 32) return (int)n;
    if (n <= 66) return (int)(127 + n - 33);
    return 173;
}

/* Writes the mapped text of bytes[0..n) to out (room for 2n+1); returns its length. */
static size_t bytes_to_text(const uint8_t *bytes, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = em_hf_byte_to_unicode(bytes[i]);
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
        int b = unicode_to_byte(cp);
        if (b < 0) return false;
        out[o++] = (uint8_t)b;
    }
    *out_n = o;
    return true;
}

/* ---- small helpers ------------------------------------------------------------------- */

static int join_path(char out[PATH_CAP], const char *dir, const char *name, em_err *err) {
    int n = snprintf(out, PATH_CAP, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_CAP) return em_err_set(err, EM_EINVAL, "%s: path too long", dir);
    return EM_OK;
}

static int load_json(const char *path, json_t **out, em_err *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = em_file_read_all(path, &text, &len, err);
    if (rc) return rc;
    json_error_t jerr;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!*out)
        return em_err_set(err, EM_EFORMAT, "%s: bad JSON at line %d column %d: %s", path,
                          jerr.line, jerr.column, jerr.text);
    return EM_OK;
}

/* A member that is present and not null, or NULL. */
static json_t *member(const json_t *obj, const char *key) {
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

static const char *member_str(const json_t *obj, const char *key) {
    json_t *v = member(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Python truthiness of a JSON value (absent counts as false). */
static bool truthy(const json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return false;
    if (json_is_string(v)) return json_string_length(v) > 0;
    if (json_is_object(v)) return json_object_size(v) > 0;
    if (json_is_array(v)) return json_array_size(v) > 0;
    if (json_is_integer(v)) return json_integer_value(v) != 0;
    if (json_is_real(v)) return json_real_value(v) != 0;
    return true;
}

/* Whether s looks like a control token to llama.cpp's converter
 * (TextModel.does_token_look_special). */
static bool looks_special(const char *s) {
    static const char *const exact[] = { "<pad>", "<mask>", "<2mass>", "[@BOS@]" };
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strcmp(s, exact[i]) == 0) return true;
    size_t n = strlen(s);
    /* Python's startswith(a) and endswith(z): the two may overlap ("<|>") */
#define STARTS_ENDS(a, z) \
    (n >= strlen(a) && n >= strlen(z) && strncmp(s, a, strlen(a)) == 0 && \
     strcmp(s + n - strlen(z), z) == 0)
    return STARTS_ENDS("<|", "|>") || STARTS_ENDS("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") ||
           STARTS_ENDS("<unused", ">");
#undef STARTS_ENDS
}

/* ---- the vocabulary being built ---------------------------------------------------- */

typedef struct builder {
    em_hf_vocab *v;
    const char *dir;
    em_err *err;
    char tc_path[PATH_CAP]; /* tokenizer_config.json */
    char cfg_path[PATH_CAP];
    json_t *tc;  /* tokenizer_config.json root; NULL when the file is absent */
    json_t *cfg; /* config.json root; NULL when absent */
} builder;

static int alloc_tokens(builder *b, uint64_t n) {
    em_hf_vocab *v = b->v;
    v->n_tokens = n;
    v->tokens = em_calloc(n ? n : 1, sizeof *v->tokens, "token list", b->err);
    v->types = em_calloc(n ? n : 1, sizeof *v->types, "token types", b->err);
    return v->tokens && v->types ? EM_OK : EM_ENOMEM;
}

static char *pool_str(builder *b, const char *s, size_t n) {
    char *out = pool_add(b->v->pool, s, n);
    if (!out) em_err_set(b->err, EM_ENOMEM, "out of memory for tokenizer strings");
    return out;
}

/* Ids nobody named become "[PAD{id}]" (UNUSED), as llama.cpp's converter writes them. */
static int fill_pads(builder *b) {
    em_hf_vocab *v = b->v;
    char buf[40];
    for (uint64_t i = 0; i < v->n_tokens; i++) {
        if (v->tokens[i]) continue;
        int n = snprintf(buf, sizeof buf, "[PAD%llu]", (unsigned long long)i);
        if (!(v->tokens[i] = pool_str(b, buf, (size_t)n))) return EM_ENOMEM;
        v->types[i] = EM_HF_TOKEN_UNUSED;
    }
    return EM_OK;
}

static int64_t find_token(const em_hf_vocab *v, const char *text) {
    for (uint64_t i = 0; i < v->n_tokens; i++)
        if (strcmp(v->tokens[i], text) == 0) return (int64_t)i;
    return -1;
}

/* ---- special token ids (gguf-py SpecialVocab) --------------------------------------- */

enum { SP_BOS, SP_EOS, SP_UNK, SP_SEP, SP_PAD, SP_CLS, SP_MASK, SP_EOT, SP_N };
static const char *const sp_name[SP_N] = { "bos", "eos", "unk", "sep", "pad", "cls", "mask",
                                           "eot" };

/* A tokenizer_config.json <type>_token value: `content` is the string, or the "content" of
 * an object; `is_str` whether the value itself was a string (SpecialVocab compares those
 * only); `truthy` Python truthiness of the value. */
typedef struct tc_val {
    const char *content;
    bool is_str, truthy;
} tc_val;

static tc_val tc_get(const json_t *tc, const char *key) {
    json_t *v = member(tc, key);
    tc_val r = { NULL, false, truthy(v) };
    if (json_is_string(v)) {
        r.content = json_string_value(v);
        r.is_str = true;
    } else if (json_is_object(v)) {
        r.content = member_str(v, "content");
    }
    return r;
}

static tc_val tc_from_str(const char *s) {
    tc_val r = { s, s != NULL, s && *s };
    return r;
}

/* Python `s == value` for a template token string s against a tokenizer_config value. */
static bool tc_eq(const char *s, tc_val v) {
    return s && v.is_str && strcmp(s, v.content) == 0;
}

typedef struct specials {
    int64_t id[SP_N];
    tc_val val[SP_N];  /* effective tokenizer_config values */
    bool with_eot;     /* SpecialVocab added 'eot' to its types (template ends differently) */
    int add_bos, add_eos; /* -1 unset */
} specials;

/* SpecialVocab._set_special_token: the first source to name a type wins; negative ids and
 * (Ember's rule) ids past the vocabulary are errors. */
static int set_special(builder *b, specials *sp, int t, const json_t *val, const char *file,
                       const char *what) {
    if (!json_is_integer(val) || sp->id[t] >= 0) return EM_OK;
    long long id = json_integer_value(val);
    if (id < 0 || (uint64_t)id >= b->v->n_tokens)
        return em_err_set(b->err, EM_EFORMAT, "%s: %s = %lld is outside the vocabulary [0, %llu)",
                          file, what, id, (unsigned long long)b->v->n_tokens);
    sp->id[t] = id;
    return EM_OK;
}

/* The RobertaProcessing / TemplateProcessing part of SpecialVocab (tokenizer.json only). */
static void post_processor_rules(builder *b, const json_t *pp, specials *sp) {
    bool have_tc = truthy(b->tc);
    json_t *procs = member(pp, "processors");
    size_t n = json_is_array(procs) ? json_array_size(procs) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_is_array(procs) ? json_array_get(procs, i) : pp;
        const char *type = member_str(p, "type");
        if (!type) continue;
        if (strcmp(type, "RobertaProcessing") == 0) {
            sp->add_bos = sp->add_eos = 1;
            if (!sp->val[SP_CLS].truthy && have_tc) {
                json_t *cls = member(p, "cls");
                const char *c = NULL;
                if (json_is_array(cls) && json_is_string(json_array_get(cls, 0)))
                    c = json_string_value(json_array_get(cls, 0));
                sp->val[SP_CLS] = c ? tc_from_str(c) : sp->val[SP_BOS];
            }
            if (!sp->val[SP_SEP].truthy && have_tc) {
                json_t *sep = member(p, "sep");
                const char *c = NULL;
                if (json_is_array(sep) && json_is_string(json_array_get(sep, 0)))
                    c = json_string_value(json_array_get(sep, 0));
                sp->val[SP_SEP] = c ? tc_from_str(c) : sp->val[SP_EOS];
            }
            continue;
        }
        if (strcmp(type, "TemplateProcessing") != 0) continue;
        json_t *single = member(p, "single");
        size_t ns = json_is_array(single) ? json_array_size(single) : 0;
        if (ns <= 1) continue;
        const char *first = member_str(member(json_array_get(single, 0), "SpecialToken"), "id");
        const char *last = member_str(member(json_array_get(single, ns - 1), "SpecialToken"),
                                      "id");
        if (first && *first) {
            if (!have_tc) sp->val[SP_BOS] = tc_from_str(first);
            sp->add_bos = tc_eq(first, sp->val[SP_BOS]) || tc_eq(first, sp->val[SP_CLS]);
        }
        if (last && *last) {
            if (!have_tc) {
                sp->val[SP_EOS] = tc_from_str(last);
            } else if (!tc_eq(last, sp->val[SP_EOS])) {
                /* the template ends in another token: the old eos becomes eot (eom, a second
                 * time, is not kept: see the header) and the template's token eos */
                if (!sp->with_eot) {
                    sp->with_eot = true;
                    sp->val[SP_EOT] = sp->val[SP_EOS];
                } else {
                    em_log(EM_LOG_WARN, "%s: post_processor: eos %s dropped (eom not kept)",
                           b->dir, sp->val[SP_EOS].content ? sp->val[SP_EOS].content : "?");
                }
                sp->val[SP_EOS] = tc_from_str(last);
            }
            sp->add_eos = tc_eq(last, sp->val[SP_EOS]);
        }
    }
}

/* First added_tokens entry (tokenizer.json) whose content is s, as SpecialVocab looks
 * tokenizer_config values up; NULL when none. */
static const json_t *added_id(const json_t *tj, const char *s) {
    json_t *added = member(tj, "added_tokens");
    for (size_t i = 0; s && json_is_array(added) && i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        const char *c = member_str(a, "content");
        if (c && strcmp(c, s) == 0) return member(a, "id");
    }
    return NULL;
}

/* config.json <type>_token_id: the top level, else text_config (SpecialVocab order). */
static const json_t *config_id(const json_t *cfg, const char *key) {
    json_t *v = member(cfg, key);
    if (!v) v = member(member(cfg, "text_config"), key);
    return v;
}

static int kimi_eos_override(builder *b, specials *sp);
static int k3_eos_override(builder *b, specials *sp);

/* Fills v's special ids and add flags. tj: the tokenizer.json root, or NULL for tiktoken. */
static int resolve_specials(builder *b, const json_t *tj, const char *arch) {
    em_hf_vocab *v = b->v;
    specials sp = { .add_bos = -1, .add_eos = -1 };
    for (int t = 0; t < SP_N; t++) sp.id[t] = -1;
    for (int t = 0; t < SP_N; t++) {
        char key[32];
        snprintf(key, sizeof key, "%s_token", sp_name[t]);
        sp.val[t] = t == SP_EOT ? tc_from_str(NULL) : tc_get(b->tc, key);
    }
    bool have_tc = truthy(b->tc);
    if (tj) {
        if (!sp.val[SP_BOS].truthy && sp.val[SP_CLS].truthy && have_tc)
            sp.val[SP_BOS] = sp.val[SP_CLS];
        if (!sp.val[SP_EOS].truthy && sp.val[SP_SEP].truthy && have_tc)
            sp.val[SP_EOS] = sp.val[SP_SEP];
        json_t *pp = member(tj, "post_processor");
        if (truthy(pp)) post_processor_rules(b, pp, &sp);
    }
    int rc;
    if (have_tc) {
        json_t *ab = member(b->tc, "add_bos_token"), *ae = member(b->tc, "add_eos_token");
        if (json_is_boolean(ab)) sp.add_bos = json_is_true(ab);
        if (json_is_boolean(ae)) sp.add_eos = json_is_true(ae);
        for (int t = 0; t < SP_N; t++) {
            if (t == SP_EOT && !sp.with_eot) continue;
            char what[64];
            snprintf(what, sizeof what, "id of %s_token '%s'", sp_name[t],
                     sp.val[t].content ? sp.val[t].content : "");
            if ((rc = set_special(b, &sp, t, added_id(tj, sp.val[t].content), b->tc_path, what)))
                return rc;
        }
    }
    for (int t = 0; t < SP_N; t++) {
        if (!b->cfg || (t == SP_EOT && !sp.with_eot)) continue;
        char key[32];
        snprintf(key, sizeof key, "%s_token_id", sp_name[t]);
        if ((rc = set_special(b, &sp, t, config_id(b->cfg, key), b->cfg_path, key))) return rc;
    }
    bool kimi = arch && (strcmp(arch, "kimi-linear") == 0 || strcmp(arch, "kimi-k3") == 0);
    if (kimi && !tj && (rc = kimi_eos_override(b, &sp))) return rc;
    if (arch && strcmp(arch, "kimi-k3") == 0 && (rc = k3_eos_override(b, &sp))) return rc;

    v->bos = sp.id[SP_BOS];
    v->eos = sp.id[SP_EOS];
    v->unk = sp.id[SP_UNK];
    v->sep = sp.id[SP_SEP];
    v->pad = sp.id[SP_PAD];
    v->cls = sp.id[SP_CLS];
    v->mask = sp.id[SP_MASK];
    v->eot = sp.id[SP_EOT];
    v->eot_stated = v->eot >= 0;
    v->has_add_bos = sp.add_bos >= 0;
    v->add_bos = sp.add_bos == 1;
    v->has_add_eos = sp.add_eos >= 0;
    v->add_eos = sp.add_eos == 1;
    return EM_OK;
}

/* Kimi-Linear's converter: eos = the tiktoken tokenizer's eos_id, the special whose content
 * is tokenizer_config.json's eos_token (Kimi's default "[EOS]"). */
static int kimi_eos_override(builder *b, specials *sp) {
    tc_val e = tc_get(b->tc, "eos_token");
    const char *want = e.content ? e.content : "[EOS]";
    em_hf_vocab *v = b->v;
    for (uint64_t i = 0; i < v->n_tokens; i++) {
        if (v->types[i] == EM_HF_TOKEN_CONTROL && strcmp(v->tokens[i], want) == 0) {
            sp->id[SP_EOS] = (int64_t)i;
            return EM_OK;
        }
    }
    return em_err_set(b->err, EM_EFORMAT, "%s: eos_token '%s' is not one of the special tokens",
                      b->tc_path, want);
}

/* Kimi-K3's converter puts back config.json's eos_token_id (its hparams: text_config merged
 * over the top level). */
static int k3_eos_override(builder *b, specials *sp) {
    json_t *e = member(member(b->cfg, "text_config"), "eos_token_id");
    if (!e) e = member(b->cfg, "eos_token_id");
    if (!e) return EM_OK;
    if (!json_is_integer(e))
        return em_err_set(b->err, EM_EFORMAT, "%s: eos_token_id is not an integer", b->cfg_path);
    sp->id[SP_EOS] = -1;
    return set_special(b, sp, SP_EOS, e, b->cfg_path, "eos_token_id");
}

/* eot when no file states it: the first of the texts llama.cpp's loader looks for. */
static void detect_eot(em_hf_vocab *v) {
    static const char *const cand[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>",
        ("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"),
        "<end_of_utterance>",
    };
    if (v->eot >= 0) return;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0] && v->eot < 0; i++)
        v->eot = find_token(v, cand[i]);
}

/* ---- chat template ----------------------------------------------------------------- */

static int set_template(builder *b, const char *s, size_t n) {
    b->v->chat_template = pool_str(b, s, n);
    return b->v->chat_template ? EM_OK : EM_ENOMEM;
}

static int load_chat_template(builder *b) {
    json_t *ct = member(b->tc, "chat_template");
    if (json_is_string(ct)) return set_template(b, json_string_value(ct), json_string_length(ct));
    if (json_is_array(ct)) {
        /* [{name, template}]: llama.cpp writes "default" as tokenizer.chat_template and the
         * others under tokenizer.chat_template.<name>, which Ember does not carry. */
        int rc = EM_OK;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *e = json_array_get(ct, i);
            const char *name = member_str(e, "name");
            json_t *t = member(e, "template");
            if (!name || !json_is_string(t))
                return em_err_set(b->err, EM_EFORMAT, "%s: chat_template[%zu] needs a name and a "
                                  "template string", b->tc_path, i);
            if (strcmp(name, "default") == 0 && !b->v->chat_template)
                rc = set_template(b, json_string_value(t), json_string_length(t));
            else
                em_log(EM_LOG_WARN, "%s: chat template '%s' not carried", b->tc_path, name);
            if (rc) return rc;
        }
        return EM_OK;
    }
    if (ct)
        return em_err_set(b->err, EM_EFORMAT, "%s: chat_template is neither a string nor a list",
                          b->tc_path);
    char path[PATH_CAP];
    int rc = join_path(path, b->dir, "chat_template.jinja", b->err);
    if (rc) return rc;
    if (em_file_exists(path)) {
        char *text = NULL;
        size_t len = 0;
        if ((rc = em_file_read_all(path, &text, &len, b->err))) return rc;
        rc = set_template(b, text, len);
        free(text);
        return rc;
    }
    if ((rc = join_path(path, b->dir, "chat_template.json", b->err))) return rc;
    if (!em_file_exists(path)) return EM_OK;
    json_t *root = NULL;
    if ((rc = load_json(path, &root, b->err))) return rc;
    json_t *t = member(root, "chat_template");
    if (json_is_string(t)) rc = set_template(b, json_string_value(t), json_string_length(t));
    json_decref(root);
    return rc;
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
    bmap map;         /* token bytes -> rank */
} tk_file;

static void tk_free(tk_file *f) {
    free(f->bytes);
    free(f->e);
    free(f->by_rank);
    bmap_free(&f->map);
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
    int rc = bmap_init(&f->map, f->n, "tiktoken map", err);
    if (rc) return rc;
    f->by_rank = em_malloc((size_t)(f->max_rank + 1) * sizeof *f->by_rank, "tiktoken ranks", err);
    if (!f->by_rank) return EM_ENOMEM;
    for (int64_t r = 0; r <= f->max_rank; r++) f->by_rank[r] = -1;
    for (uint64_t i = 0; i < f->n; i++) {
        tk_entry *e = &f->e[i];
        int64_t prev = bmap_put(&f->map, f->bytes + e->off, e->len, (int64_t)i);
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
        if (bmap_get(&f->map, &c, 1) < 0)
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
    for (uint32_t k = 0; k + 1 < np; k++) pr[k] = bmap_get(&f->map, tok + st[k], st[k + 2] - st[k]);
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
        if (at + 1 < np) pr[at] = bmap_get(&f->map, tok + st[at], st[at + 2] - st[at]);
        if (at > 0) pr[at - 1] = bmap_get(&f->map, tok + st[at - 1], st[at + 1] - st[at - 1]);
    }
    *split = np == 2 ? st[1] : 0;
    return (int)np;
}

static int tk_merges(builder *b, const tk_file *f) {
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
        if (!(v->merges[v->n_merges++] = pool_str(b, text, n))) rc = EM_ENOMEM;
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
static int tk_place_decoder(builder *b, const tk_file *f, uint64_t n_ranks) {
    em_hf_vocab *v = b->v;
    json_t *dec = member(b->tc, "added_tokens_decoder");
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
        const char *content = member_str(val, "content");
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
        if (!(v->tokens[id] = pool_str(b, content, strlen(content)))) return EM_ENOMEM;
        v->types[id] = EM_HF_TOKEN_CONTROL;
    }
    return EM_OK;
}

/* Kimi's reserved range [n_ranks, n_ranks + 256): ids the decoder does not name. */
static int tk_place_reserved(builder *b, const tk_file *f, uint64_t n_ranks) {
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
        if (!(v->tokens[id] = pool_str(b, buf, (size_t)n))) return EM_ENOMEM;
        v->types[id] = EM_HF_TOKEN_CONTROL;
    }
    return EM_OK;
}

/* Specials must not repeat each other or a tiktoken token's text (Kimi's tokenizer keys
 * them by text: one would silently vanish). */
static int tk_check_specials(builder *b, const tk_file *f) {
    em_hf_vocab *v = b->v;
    uint64_t n_sp = 0;
    for (uint64_t i = 0; i < v->n_tokens; i++) n_sp += v->types[i] == EM_HF_TOKEN_CONTROL;
    bmap seen;
    int rc = bmap_init(&seen, n_sp, "special map", b->err);
    if (rc) return rc;
    uint8_t *bytes = NULL;
    for (uint64_t i = 0; i < v->n_tokens && !rc; i++) {
        if (v->types[i] != EM_HF_TOKEN_CONTROL) continue;
        const char *s = v->tokens[i];
        size_t n = strlen(s), nb = 0;
        int64_t prev = bmap_put(&seen, s, n, (int64_t)i);
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
        if (text_to_bytes(s, n, bytes, &nb) && nb && bmap_get(&f->map, bytes, nb) >= 0)
            rc = em_err_set(b->err, EM_EFORMAT, "%s: special '%s' (id %llu) has the text of "
                            "tiktoken token %lld", b->tc_path, s, (unsigned long long)i,
                            (long long)bmap_get(&f->map, bytes, nb));
    }
    free(bytes);
    bmap_free(&seen);
    return rc;
}

static int tk_build(builder *b, const char *tk_path, int64_t vocab_size, const char *arch) {
    em_hf_vocab *v = b->v;
    tk_file f = { 0 };
    int rc = tk_read(&f, tk_path, b->err);
    if (rc) goto out;
    const char *cls = member_str(b->tc, "tokenizer_class");
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
        json_t *dec = member(b->tc, "added_tokens_decoder");
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
    if ((rc = alloc_tokens(b, n))) goto out;
    char text[2 * TK_MAX_TOKEN_BYTES + 1];
    for (uint64_t i = 0; i < f.n; i++) {
        const tk_entry *e = &f.e[i];
        size_t len = bytes_to_text(f.bytes + e->off, e->len, text);
        if (!(v->tokens[e->rank] = pool_str(b, text, len))) {
            rc = EM_ENOMEM;
            goto out;
        }
        v->types[e->rank] = EM_HF_TOKEN_NORMAL;
    }
    if ((rc = tk_place_decoder(b, &f, n_ranks)) || (rc = tk_place_reserved(b, &f, n_ranks)) ||
        (rc = tk_check_specials(b, &f)) || (rc = fill_pads(b)) || (rc = tk_merges(b, &f)))
        goto out;
    snprintf(v->pre, sizeof v->pre, "kimi-k2");
    snprintf(v->source, sizeof v->source, "tiktoken");
    rc = resolve_specials(b, NULL, arch);
out:
    tk_free(&f);
    return rc;
}

/* ---- tokenizer.json ---------------------------------------------------------------- */

/* Pre-tokenizer regexes (as tokenizer.json spells them) and llama.cpp's names for them. */
static const struct {
    const char *regex, *pre;
} known_splits[] = {
    { "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
      "gpt-2" },
    { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "llama-bpe" },
    { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "qwen2" },
    { "[\\p{Han}]+"
      "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
      "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
      "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
      "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
      "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "kimi-k2" },
};

static bool json_flag(const json_t *o, const char *key, bool dflt) {
    json_t *v = member(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int map_pre(builder *b, const char *path, const json_t *pt) {
    em_err *err = b->err;
    const char *type = member_str(pt, "type");
    if (!type) return em_err_set(err, EM_EUNSUPPORTED, "%s: no pre_tokenizer", path);
    const char *regex = NULL;
    if (strcmp(type, "ByteLevel") == 0) {
        if (json_flag(pt, "add_prefix_space", true))
            return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer ByteLevel with "
                              "add_prefix_space: no llama.cpp pre-tokenizer adds one", path);
        if (!json_flag(pt, "use_regex", true))
            return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer ByteLevel without its "
                              "regex (no splitting) is not a llama.cpp pre-tokenizer", path);
        regex = known_splits[0].regex;
    } else if (strcmp(type, "Sequence") == 0) {
        json_t *list = member(pt, "pretokenizers");
        json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
        const char *t0 = member_str(split, "type"), *t1 = member_str(bl, "type");
        if (json_array_size(list) != 2 || !t0 || !t1 || strcmp(t0, "Split") ||
            strcmp(t1, "ByteLevel"))
            return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer Sequence of %zu (%s, "
                              "%s, ...) is not the [Split, ByteLevel] form Ember maps", path,
                              json_array_size(list), t0 ? t0 : "?", t1 ? t1 : "?");
        regex = member_str(member(split, "pattern"), "Regex");
        const char *behavior = member_str(split, "behavior");
        if (!regex || !behavior || strcmp(behavior, "Isolated") || json_flag(split, "invert", false))
            return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer Split must be an "
                              "Isolated, non-inverted Regex split", path);
        if (json_flag(bl, "add_prefix_space", true) || json_flag(bl, "use_regex", true))
            return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer ByteLevel after Split "
                              "must have add_prefix_space and use_regex false", path);
    } else {
        return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer type '%s' is not one Ember "
                          "maps to a llama.cpp pre-tokenizer", path, type);
    }
    for (size_t i = 0; i < sizeof known_splits / sizeof known_splits[0]; i++) {
        if (strcmp(regex, known_splits[i].regex) == 0) {
            snprintf(b->v->pre, sizeof b->v->pre, "%s", known_splits[i].pre);
            return EM_OK;
        }
    }
    return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer regex '%.200s' is not one Ember "
                      "maps to a llama.cpp pre-tokenizer (known: gpt-2, llama-bpe, qwen2, "
                      "kimi-k2)", path, regex);
}

static bool has_lowercase(const json_t *norm) {
    const char *type = member_str(norm, "type");
    if (!type) return false;
    if (strcmp(type, "Lowercase") == 0) return true;
    if (strcmp(type, "BertNormalizer") == 0) return json_flag(norm, "lowercase", true);
    json_t *list = member(norm, "normalizers");
    for (size_t i = 0; strcmp(type, "Sequence") == 0 && i < json_array_size(list); i++)
        if (has_lowercase(json_array_get(list, i))) return true;
    return false;
}

/* model.type BPE, no byte_fallback, ByteLevel decoder, no lowercasing, known pre. */
static int tj_check_kind(builder *b, const char *path, const json_t *root, const json_t *model) {
    em_err *err = b->err;
    if (!json_is_object(model)) return em_err_set(err, EM_EFORMAT, "%s: no 'model' object", path);
    const char *type = member_str(model, "type");
    if (!type) return em_err_set(err, EM_EFORMAT, "%s: model.type missing", path);
    if (strcmp(type, "BPE") != 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: unknown model type '%s' (Ember reads BPE)",
                          path, type);
    if (json_flag(model, "byte_fallback", false))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: model.byte_fallback: a SentencePiece-style "
                          "BPE, not byte-level", path);
    const char *affix[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int i = 0; i < 2; i++) {
        const char *a = member_str(model, affix[i]);
        if (a && *a)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: model.%s '%s' is not byte-level BPE",
                              path, affix[i], a);
    }
    const char *dec = member_str(member(root, "decoder"), "type");
    if (!dec || strcmp(dec, "ByteLevel") != 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: decoder.type '%s' is not ByteLevel", path,
                          dec ? dec : "(none)");
    if (has_lowercase(member(root, "normalizer")))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: lowercasing normalizer not supported", path);
    return map_pre(b, path, member(root, "pre_tokenizer"));
}

static int64_t json_id(const json_t *v) {
    if (!json_is_integer(v)) return -1;
    long long id = json_integer_value(v);
    return id < 0 || id >= (long long)EM_HF_VOCAB_MAX ? -2 : id;
}

/* added_tokens over the vocab: CONTROL when special (or special-looking), else
 * USER_DEFINED. amap: content -> id, to catch one content at two ids. */
static int tj_added(builder *b, const char *path, const json_t *added, uint64_t n,
                    const bmap *vmap, bmap *amap) {
    em_hf_vocab *v = b->v;
    em_err *err = b->err;
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        int64_t id = json_integer_value(member(a, "id"));
        const char *c = member_str(a, "content");
        if ((uint64_t)id >= n)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s': token id %lld >= "
                              "vocab_size %llu", path, i, c, (long long)id, (unsigned long long)n);
        int64_t in_vocab = bmap_get(vmap, c, strlen(c));
        if (in_vocab >= 0 && in_vocab != id)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s' has id %lld but "
                              "model.vocab gives it %lld", path, i, c, (long long)id,
                              (long long)in_vocab);
        int64_t prev = bmap_put(amap, c, strlen(c), id);
        if (prev >= 0 && prev != id)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s' has id %lld and also "
                              "%lld", path, i, c, (long long)id, (long long)prev);
        if (v->tokens[id] && in_vocab < 0 && prev < 0)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s' takes id %lld of "
                              "'%s'", path, i, c, (long long)id, v->tokens[id]);
        bool special = json_flag(a, "special", false) || looks_special(c);
        size_t len = strlen(c);
        if (!(v->tokens[id] = pool_str(b, c, len))) return EM_ENOMEM;
        v->types[id] = special ? EM_HF_TOKEN_CONTROL : EM_HF_TOKEN_USER_DEFINED;
        if (!special) {
            /* llama.cpp pre-normalizes user-defined spaces: U+2581 -> ' ' (in place: shorter) */
            char *s = v->tokens[id], *o = s;
            for (const char *p = s; *p;) {
                if (strncmp(p, "\xE2\x96\x81", 3) == 0) *o++ = ' ', p += 3;
                else *o++ = *p++;
            }
            *o = '\0';
        }
    }
    return EM_OK;
}

/* model.vocab and added_tokens into v->tokens / v->types. */
static int tj_tokens(builder *b, const char *path, const json_t *model, const json_t *added,
                     int64_t vocab_size, bmap *vmap) {
    em_hf_vocab *v = b->v;
    em_err *err = b->err;
    json_t *vocab = member(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return em_err_set(err, EM_EFORMAT, "%s: model.vocab missing or empty", path);
    if (added && !json_is_array(added))
        return em_err_set(err, EM_EFORMAT, "%s: added_tokens is not a list", path);
    size_t n_added = json_array_size(added);
    int rc = bmap_init(vmap, json_object_size(vocab), "vocab map", err);
    if (rc) return rc;
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        int64_t id = json_id(val);
        if (id < 0)
            return em_err_set(err, EM_EFORMAT, "%s: model.vocab['%s']: id is not an integer in "
                              "[0, %u)", path, key, EM_HF_VOCAB_MAX);
        bmap_put(vmap, key, strlen(key), id);
        if (id > max_id) max_id = id;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        int64_t id = json_id(member(a, "id"));
        const char *c = member_str(a, "content");
        if (id < 0 || !c || !*c)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] needs an id in [0, %u) "
                              "and a content", path, i, EM_HF_VOCAB_MAX);
        if (id > max_id) max_id = id;
    }
    uint64_t n = vocab_size > 0 ? (uint64_t)vocab_size : (uint64_t)max_id + 1;
    if (n > EM_HF_VOCAB_MAX)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: vocab_size %llu is above %u", path,
                          (unsigned long long)n, EM_HF_VOCAB_MAX);
    if ((rc = alloc_tokens(b, n))) return rc;
    json_object_foreach((json_t *)vocab, key, val) {
        int64_t id = json_integer_value(val);
        if ((uint64_t)id >= n)
            return em_err_set(err, EM_EFORMAT, "%s: model.vocab['%s']: token id %lld >= "
                              "vocab_size %llu", path, key, (long long)id, (unsigned long long)n);
        if (v->tokens[id])
            return em_err_set(err, EM_EFORMAT, "%s: model.vocab: id %lld given to both '%s' and "
                              "'%s'", path, (long long)id, v->tokens[id], key);
        if (!(v->tokens[id] = pool_str(b, key, strlen(key)))) return EM_ENOMEM;
        v->types[id] = EM_HF_TOKEN_NORMAL;
    }
    bmap amap;
    if ((rc = bmap_init(&amap, n_added, "added token map", err))) return rc;
    rc = tj_added(b, path, added, n, vmap, &amap);
    bmap_free(&amap);
    return rc;
}

/* One merge: "a b" (exactly one space) or ["a", "b"]; both parts and their concatenation
 * must be vocab pieces (as HF tokenizers requires). */
static int tj_merge(builder *b, const char *path, size_t i, const json_t *m, const bmap *vmap,
                    char **out) {
    em_err *err = b->err;
    const char *l, *r;
    size_t ln, rn;
    bool pair = json_is_array(m);
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1])
            return em_err_set(err, EM_EFORMAT, "%s: model.merges[%zu] '%s' is not \"left right\"",
                              path, i, s);
        l = s, ln = (size_t)(sp - s), r = sp + 1, rn = strlen(r);
    } else if (pair && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        l = json_string_value(json_array_get(m, 0)), ln = strlen(l);
        r = json_string_value(json_array_get(m, 1)), rn = strlen(r);
        if (!ln || !rn)
            return em_err_set(err, EM_EFORMAT, "%s: model.merges[%zu] has an empty part", path, i);
    } else {
        return em_err_set(err, EM_EFORMAT, "%s: model.merges[%zu] is neither \"left right\" nor "
                          "[left, right]", path, i);
    }
    char *cat = em_malloc(ln + rn + 2, "merge", err);
    if (!cat) return EM_ENOMEM;
    memcpy(cat, l, ln);
    memcpy(cat + ln, r, rn);
    const char *missing = bmap_get(vmap, l, ln) < 0 ? "left part" :
                          bmap_get(vmap, r, rn) < 0 ? "right part" :
                          bmap_get(vmap, cat, ln + rn) < 0 ? "merged token" : NULL;
    free(cat);
    if (missing)
        return em_err_set(err, EM_EFORMAT, "%s: model.merges[%zu] '%.*s' '%.*s': the %s is not "
                          "in model.vocab", path, i, (int)ln, l, (int)rn, r, missing);
    /* pair form: spaces inside parts are written as U+0120 (gguf-py SpecialVocab) */
    size_t spaces = 0;
    for (size_t k = 0; pair && k < ln; k++) spaces += l[k] == ' ';
    for (size_t k = 0; pair && k < rn; k++) spaces += r[k] == ' ';
    char *buf = em_malloc(ln + rn + 2 + spaces, "merge", err);
    if (!buf) return EM_ENOMEM;
    size_t o = 0;
    for (int side = 0; side < 2; side++) {
        const char *p = side ? r : l;
        size_t n = side ? rn : ln;
        if (side) buf[o++] = ' ';
        for (size_t k = 0; k < n; k++) {
            if (pair && p[k] == ' ') buf[o++] = (char)0xC4, buf[o++] = (char)0xA0;
            else buf[o++] = p[k];
        }
    }
    *out = pool_str(b, buf, o);
    free(buf);
    return *out ? EM_OK : EM_ENOMEM;
}

static int tj_merges(builder *b, const char *path, const json_t *model, const bmap *vmap) {
    em_hf_vocab *v = b->v;
    json_t *merges = member(model, "merges");
    if (!json_is_array(merges) || json_array_size(merges) == 0)
        return em_err_set(b->err, EM_EFORMAT, "%s: missing merges (model.merges absent or empty; "
                          "llama.cpp needs them)", path);
    size_t n = json_array_size(merges);
    v->merges = em_calloc(n, sizeof *v->merges, "merges", b->err);
    if (!v->merges) return EM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = tj_merge(b, path, i, json_array_get(merges, i), vmap, &v->merges[i]);
        if (rc) return rc;
        v->n_merges++;
    }
    return EM_OK;
}

static int tj_build(builder *b, const char *path, int64_t vocab_size, const char *arch) {
    json_t *root = NULL;
    bmap vmap = { 0 };
    int rc = load_json(path, &root, b->err);
    if (rc) return rc;
    const json_t *model = member(root, "model");
    if (!(rc = tj_check_kind(b, path, root, model)) &&
        !(rc = tj_tokens(b, path, model, member(root, "added_tokens"), vocab_size, &vmap)) &&
        !(rc = tj_merges(b, path, model, &vmap)) && !(rc = fill_pads(b))) {
        snprintf(b->v->source, sizeof b->v->source, "tokenizer.json");
        rc = resolve_specials(b, root, arch);
    }
    bmap_free(&vmap);
    json_decref(root);
    return rc;
}

/* ---- entry points ------------------------------------------------------------------ */

bool em_hf_vocab_present(const char *dir) {
    char path[PATH_CAP];
    if (!dir || join_path(path, dir, "tokenizer.json", NULL)) return false;
    if (em_file_exists(path)) return true;
    return !join_path(path, dir, "tiktoken.model", NULL) && em_file_exists(path);
}

void em_hf_vocab_free(em_hf_vocab *v) {
    if (!v) return;
    free(v->tokens);
    free(v->types);
    free(v->merges);
    pool_free(v->pool);
    memset(v, 0, sizeof *v);
}

static int load_optional_json(const char *path, json_t **out, em_err *err) {
    *out = NULL;
    return em_file_exists(path) ? load_json(path, out, err) : EM_OK;
}

int em_hf_vocab_load(em_hf_vocab *v, const char *dir, int64_t vocab_size, const char *arch,
                     em_err *err) {
    memset(v, 0, sizeof *v);
    if (!dir) return em_err_set(err, EM_EINVAL, "tokenizer: no folder given");
    if (arch && strcmp(arch, "kimi-linear") && strcmp(arch, "kimi-k3") && strcmp(arch, "dflash"))
        return em_err_set(err, EM_EINVAL, "%s: unknown architecture '%s' for the tokenizer rules",
                          dir, arch);
    if (vocab_size > (int64_t)EM_HF_VOCAB_MAX)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: vocab_size %lld is above %u", dir,
                          (long long)vocab_size, EM_HF_VOCAB_MAX);
    builder b = { .v = v, .dir = dir, .err = err };
    char tj_path[PATH_CAP], tk_path[PATH_CAP];
    int rc;
    if ((rc = join_path(tj_path, dir, "tokenizer.json", err)) ||
        (rc = join_path(tk_path, dir, "tiktoken.model", err)) ||
        (rc = join_path(b.tc_path, dir, "tokenizer_config.json", err)) ||
        (rc = join_path(b.cfg_path, dir, "config.json", err)))
        return rc;
    v->pool = calloc(1, sizeof *v->pool);
    if (!v->pool) return em_err_set(err, EM_ENOMEM, "out of memory for the tokenizer");
    snprintf(v->model, sizeof v->model, "gpt2");
    if ((rc = load_optional_json(b.tc_path, &b.tc, err)) ||
        (rc = load_optional_json(b.cfg_path, &b.cfg, err)))
        goto out;
    if (b.tc && !json_is_object(b.tc)) {
        rc = em_err_set(err, EM_EFORMAT, "%s: not a JSON object", b.tc_path);
        goto out;
    }
    if (em_file_exists(tj_path)) {
        rc = tj_build(&b, tj_path, vocab_size, arch);
    } else if (em_file_exists(tk_path)) {
        if (!b.tc)
            rc = em_err_set(err, EM_ENOTFOUND, "%s: tiktoken.model needs tokenizer_config.json "
                            "beside it", dir);
        else
            rc = tk_build(&b, tk_path, vocab_size, arch);
    } else {
        rc = em_err_set(err, EM_ENOTFOUND, "%s: no tokenizer.json or tiktoken.model", dir);
    }
    if (!rc) rc = load_chat_template(&b);
    if (!rc) detect_eot(v);
out:
    json_decref(b.tc);
    json_decref(b.cfg);
    if (rc) em_hf_vocab_free(v);
    return rc;
}
