/* convert/hftokenizer: Hugging Face tokenizer files (tokenizer.json, or Kimi's tiktoken.model
 * with tokenizer_config.json) -> em_hf_vocab, the content of llama.cpp's tokenizer.ggml.*
 * keys. The rules (which llama.cpp converter behaviour each mirrors) are in hftokenizer.h.
 * This file holds what both sources share (string pool, byte-string map, special ids, chat
 * template) and the entry points; each source format has its own file (hftok_tiktoken.c,
 * hftok_json.c).
 *
 * Invariants of a successful load: n_tokens == the requested vocab_size (or the tokenizer's
 * own size), every tokens[i] is a NUL-terminated UTF-8 string and every types[i] one of
 * EM_HF_TOKEN_*; no two source tokens share a text; every special id is in [0, n_tokens) or -1; all
 * strings live in v->pool. On failure the struct is empty. Nothing here touches GGUF: the
 * converter writes the keys. No global mutable state. */
#include "convert/hftok_impl.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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


static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Room for at least n keys at load <= 1/2. */
int em_hft_map_init(hft_map *m, uint64_t n, const char *what, em_err *err) {
    uint64_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    m->slots = em_calloc(cap, sizeof *m->slots, what, err);
    m->mask = cap - 1;
    return m->slots ? EM_OK : EM_ENOMEM;
}

void em_hft_map_free(hft_map *m) {
    free(m->slots);
    m->slots = NULL;
}

static hft_slot *hft_map_find(const hft_map *m, const void *key, size_t len, uint32_t *hash) {
    uint64_t h = fnv1a(key, len);
    *hash = (uint32_t)(h >> 32);
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        hft_slot *s = &m->slots[i];
        if (!s->key ||
            (s->hash == *hash && s->len == len && memcmp(s->key, key, len) == 0))
            return s;
    }
}

int64_t em_hft_map_get(const hft_map *m, const void *key, size_t len) {
    uint32_t hash;
    hft_slot *s = hft_map_find(m, key, len, &hash);
    return s->key ? s->val : -1;
}

/* Inserts key -> val unless the key is there; returns the existing value or -1. The caller
 * never inserts more keys than bmap_init was sized for. */
int64_t em_hft_map_put(hft_map *m, const void *key, size_t len, int64_t val) {
    uint32_t hash;
    hft_slot *s = hft_map_find(m, key, len, &hash);
    if (s->key) return s->val;
    s->key = key;
    s->len = (uint32_t)len;
    s->hash = hash;
    s->val = val;
    return -1;
}

/* ---- small helpers ------------------------------------------------------------------- */

static int join_path(char out[PATH_CAP], const char *dir, const char *name, em_err *err) {
    int n = snprintf(out, PATH_CAP, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_CAP) return em_err_set(err, EM_EINVAL, "%s: path too long", dir);
    return EM_OK;
}

int em_hft_load_json(const char *path, json_t **out, em_err *err) {
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
json_t *em_hft_member(const json_t *obj, const char *key) {
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

const char *em_hft_member_str(const json_t *obj, const char *key) {
    json_t *v = em_hft_member(obj, key);
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
bool em_hft_looks_special(const char *s) {
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


int em_hft_alloc_tokens(hft_builder *b, uint64_t n) {
    em_hf_vocab *v = b->v;
    v->n_tokens = n;
    v->tokens = em_calloc(n ? n : 1, sizeof *v->tokens, "token list", b->err);
    v->types = em_calloc(n ? n : 1, sizeof *v->types, "token types", b->err);
    return v->tokens && v->types ? EM_OK : EM_ENOMEM;
}

char *em_hft_pool_str(hft_builder *b, const char *s, size_t n) {
    char *out = pool_add(b->v->pool, s, n);
    if (!out) em_err_set(b->err, EM_ENOMEM, "out of memory for tokenizer strings");
    return out;
}

/* Ids nobody named become "[PAD{id}]" (UNUSED), as llama.cpp's converter writes them. */
int em_hft_fill_pads(hft_builder *b) {
    em_hf_vocab *v = b->v;
    char buf[40];
    for (uint64_t i = 0; i < v->n_tokens; i++) {
        if (v->tokens[i]) continue;
        int n = snprintf(buf, sizeof buf, "[PAD%llu]", (unsigned long long)i);
        if (!(v->tokens[i] = em_hft_pool_str(b, buf, (size_t)n))) return EM_ENOMEM;
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
    json_t *v = em_hft_member(tc, key);
    tc_val r = { NULL, false, truthy(v) };
    if (json_is_string(v)) {
        r.content = json_string_value(v);
        r.is_str = true;
    } else if (json_is_object(v)) {
        r.content = em_hft_member_str(v, "content");
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
static int set_special(hft_builder *b, specials *sp, int t, const json_t *val, const char *file,
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
static void post_processor_rules(hft_builder *b, const json_t *pp, specials *sp) {
    bool have_tc = truthy(b->tc);
    json_t *procs = em_hft_member(pp, "processors");
    size_t n = json_is_array(procs) ? json_array_size(procs) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_is_array(procs) ? json_array_get(procs, i) : pp;
        const char *type = em_hft_member_str(p, "type");
        if (!type) continue;
        if (strcmp(type, "RobertaProcessing") == 0) {
            sp->add_bos = sp->add_eos = 1;
            if (!sp->val[SP_CLS].truthy && have_tc) {
                json_t *cls = em_hft_member(p, "cls");
                const char *c = NULL;
                if (json_is_array(cls) && json_is_string(json_array_get(cls, 0)))
                    c = json_string_value(json_array_get(cls, 0));
                sp->val[SP_CLS] = c ? tc_from_str(c) : sp->val[SP_BOS];
            }
            if (!sp->val[SP_SEP].truthy && have_tc) {
                json_t *sep = em_hft_member(p, "sep");
                const char *c = NULL;
                if (json_is_array(sep) && json_is_string(json_array_get(sep, 0)))
                    c = json_string_value(json_array_get(sep, 0));
                sp->val[SP_SEP] = c ? tc_from_str(c) : sp->val[SP_EOS];
            }
            continue;
        }
        if (strcmp(type, "TemplateProcessing") != 0) continue;
        json_t *single = em_hft_member(p, "single");
        size_t ns = json_is_array(single) ? json_array_size(single) : 0;
        if (ns <= 1) continue;
        const char *first = em_hft_member_str(em_hft_member(json_array_get(single, 0), "SpecialToken"), "id");
        const char *last = em_hft_member_str(em_hft_member(json_array_get(single, ns - 1), "SpecialToken"),
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
    json_t *added = em_hft_member(tj, "added_tokens");
    for (size_t i = 0; s && json_is_array(added) && i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        const char *c = em_hft_member_str(a, "content");
        if (c && strcmp(c, s) == 0) return em_hft_member(a, "id");
    }
    return NULL;
}

/* config.json <type>_token_id: the top level, else text_config (SpecialVocab order). */
static const json_t *config_id(const json_t *cfg, const char *key) {
    json_t *v = em_hft_member(cfg, key);
    if (!v) v = em_hft_member(em_hft_member(cfg, "text_config"), key);
    return v;
}

static int kimi_eos_override(hft_builder *b, specials *sp);
static int k3_eos_override(hft_builder *b, specials *sp);

/* Fills v's special ids and add flags. tj: the tokenizer.json root, or NULL for tiktoken. */
int em_hft_resolve_specials(hft_builder *b, const json_t *tj, const char *arch) {
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
        json_t *pp = em_hft_member(tj, "post_processor");
        if (truthy(pp)) post_processor_rules(b, pp, &sp);
    }
    int rc;
    if (have_tc) {
        json_t *ab = em_hft_member(b->tc, "add_bos_token"), *ae = em_hft_member(b->tc, "add_eos_token");
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
static int kimi_eos_override(hft_builder *b, specials *sp) {
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
static int k3_eos_override(hft_builder *b, specials *sp) {
    json_t *e = em_hft_member(em_hft_member(b->cfg, "text_config"), "eos_token_id");
    if (!e) e = em_hft_member(b->cfg, "eos_token_id");
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

static int set_template(hft_builder *b, const char *s, size_t n) {
    b->v->chat_template = em_hft_pool_str(b, s, n);
    return b->v->chat_template ? EM_OK : EM_ENOMEM;
}

static int load_chat_template(hft_builder *b) {
    json_t *ct = em_hft_member(b->tc, "chat_template");
    if (json_is_string(ct)) return set_template(b, json_string_value(ct), json_string_length(ct));
    if (json_is_array(ct)) {
        /* [{name, template}]: llama.cpp writes "default" as tokenizer.chat_template and the
         * others under tokenizer.chat_template.<name>, which Ember does not carry. */
        int rc = EM_OK;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *e = json_array_get(ct, i);
            const char *name = em_hft_member_str(e, "name");
            json_t *t = em_hft_member(e, "template");
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
    if ((rc = em_hft_load_json(path, &root, b->err))) return rc;
    json_t *t = em_hft_member(root, "chat_template");
    if (json_is_string(t)) rc = set_template(b, json_string_value(t), json_string_length(t));
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
    return em_file_exists(path) ? em_hft_load_json(path, out, err) : EM_OK;
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
    hft_builder b = { .v = v, .dir = dir, .err = err };
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
        rc = em_hft_json_build(&b, tj_path, vocab_size, arch);
    } else if (em_file_exists(tk_path)) {
        if (!b.tc)
            rc = em_err_set(err, EM_ENOTFOUND, "%s: tiktoken.model needs tokenizer_config.json "
                            "beside it", dir);
        else
            rc = em_hft_tiktoken_build(&b, tk_path, vocab_size, arch);
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
