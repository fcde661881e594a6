/* convert/hftok_json.c: Hugging Face tokenizer.json (byte-level BPE) -> em_hf_vocab (rules in
 * hftokenizer.h, source 1): model.vocab pieces verbatim, added_tokens typed CONTROL or
 * USER_DEFINED, merges as the file writes them (each part and their concatenation a vocab
 * piece), the pre-tokenizer mapped to llama.cpp's name by its regex (no default).
 *
 * Invariants: anything outside byte-level BPE (byte_fallback, WordPiece/Unigram, Lowercase,
 * unknown pre-tokenizers) is an error, never a guess; messages name the file and JSON path. */
#include "convert/hftok_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    json_t *v = em_hft_member(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int map_pre(hft_builder *b, const char *path, const json_t *pt) {
    em_err *err = b->err;
    const char *type = em_hft_member_str(pt, "type");
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
        json_t *list = em_hft_member(pt, "pretokenizers");
        json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
        const char *t0 = em_hft_member_str(split, "type"), *t1 = em_hft_member_str(bl, "type");
        if (json_array_size(list) != 2 || !t0 || !t1 || strcmp(t0, "Split") ||
            strcmp(t1, "ByteLevel"))
            return em_err_set(err, EM_EUNSUPPORTED, "%s: pre_tokenizer Sequence of %zu (%s, "
                              "%s, ...) is not the [Split, ByteLevel] form Ember maps", path,
                              json_array_size(list), t0 ? t0 : "?", t1 ? t1 : "?");
        regex = em_hft_member_str(em_hft_member(split, "pattern"), "Regex");
        const char *behavior = em_hft_member_str(split, "behavior");
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
    const char *type = em_hft_member_str(norm, "type");
    if (!type) return false;
    if (strcmp(type, "Lowercase") == 0) return true;
    if (strcmp(type, "BertNormalizer") == 0) return json_flag(norm, "lowercase", true);
    json_t *list = em_hft_member(norm, "normalizers");
    for (size_t i = 0; strcmp(type, "Sequence") == 0 && i < json_array_size(list); i++)
        if (has_lowercase(json_array_get(list, i))) return true;
    return false;
}

/* model.type BPE, no byte_fallback, ByteLevel decoder, no lowercasing, known pre. */
static int tj_check_kind(hft_builder *b, const char *path, const json_t *root, const json_t *model) {
    em_err *err = b->err;
    if (!json_is_object(model)) return em_err_set(err, EM_EFORMAT, "%s: no 'model' object", path);
    const char *type = em_hft_member_str(model, "type");
    if (!type) return em_err_set(err, EM_EFORMAT, "%s: model.type missing", path);
    if (strcmp(type, "BPE") != 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: unknown model type '%s' (Ember reads BPE)",
                          path, type);
    if (json_flag(model, "byte_fallback", false))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: model.byte_fallback: a SentencePiece-style "
                          "BPE, not byte-level", path);
    const char *affix[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int i = 0; i < 2; i++) {
        const char *a = em_hft_member_str(model, affix[i]);
        if (a && *a)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: model.%s '%s' is not byte-level BPE",
                              path, affix[i], a);
    }
    const char *dec = em_hft_member_str(em_hft_member(root, "decoder"), "type");
    if (!dec || strcmp(dec, "ByteLevel") != 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: decoder.type '%s' is not ByteLevel", path,
                          dec ? dec : "(none)");
    if (has_lowercase(em_hft_member(root, "normalizer")))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: lowercasing normalizer not supported", path);
    return map_pre(b, path, em_hft_member(root, "pre_tokenizer"));
}

static int64_t json_id(const json_t *v) {
    if (!json_is_integer(v)) return -1;
    long long id = json_integer_value(v);
    return id < 0 || id >= (long long)EM_HF_VOCAB_MAX ? -2 : id;
}

/* added_tokens over the vocab: CONTROL when special (or special-looking), else
 * USER_DEFINED. amap: content -> id, to catch one content at two ids. */
static int tj_added(hft_builder *b, const char *path, const json_t *added, uint64_t n,
                    const hft_map *vmap, hft_map *amap) {
    em_hf_vocab *v = b->v;
    em_err *err = b->err;
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        int64_t id = json_integer_value(em_hft_member(a, "id"));
        const char *c = em_hft_member_str(a, "content");
        if ((uint64_t)id >= n)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s': token id %lld >= "
                              "vocab_size %llu", path, i, c, (long long)id, (unsigned long long)n);
        int64_t in_vocab = em_hft_map_get(vmap, c, strlen(c));
        if (in_vocab >= 0 && in_vocab != id)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s' has id %lld but "
                              "model.vocab gives it %lld", path, i, c, (long long)id,
                              (long long)in_vocab);
        int64_t prev = em_hft_map_put(amap, c, strlen(c), id);
        if (prev >= 0 && prev != id)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s' has id %lld and also "
                              "%lld", path, i, c, (long long)id, (long long)prev);
        if (v->tokens[id] && in_vocab < 0 && prev < 0)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] '%s' takes id %lld of "
                              "'%s'", path, i, c, (long long)id, v->tokens[id]);
        bool special = json_flag(a, "special", false) || em_hft_looks_special(c);
        size_t len = strlen(c);
        if (!(v->tokens[id] = em_hft_pool_str(b, c, len))) return EM_ENOMEM;
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
static int tj_tokens(hft_builder *b, const char *path, const json_t *model, const json_t *added,
                     int64_t vocab_size, hft_map *vmap) {
    em_hf_vocab *v = b->v;
    em_err *err = b->err;
    json_t *vocab = em_hft_member(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return em_err_set(err, EM_EFORMAT, "%s: model.vocab missing or empty", path);
    if (added && !json_is_array(added))
        return em_err_set(err, EM_EFORMAT, "%s: added_tokens is not a list", path);
    size_t n_added = json_array_size(added);
    int rc = em_hft_map_init(vmap, json_object_size(vocab), "vocab map", err);
    if (rc) return rc;
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        int64_t id = json_id(val);
        if (id < 0)
            return em_err_set(err, EM_EFORMAT, "%s: model.vocab['%s']: id is not an integer in "
                              "[0, %u)", path, key, EM_HF_VOCAB_MAX);
        em_hft_map_put(vmap, key, strlen(key), id);
        if (id > max_id) max_id = id;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        int64_t id = json_id(em_hft_member(a, "id"));
        const char *c = em_hft_member_str(a, "content");
        if (id < 0 || !c || !*c)
            return em_err_set(err, EM_EFORMAT, "%s: added_tokens[%zu] needs an id in [0, %u) "
                              "and a content", path, i, EM_HF_VOCAB_MAX);
        if (id > max_id) max_id = id;
    }
    uint64_t n = vocab_size > 0 ? (uint64_t)vocab_size : (uint64_t)max_id + 1;
    if (n > EM_HF_VOCAB_MAX)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: vocab_size %llu is above %u", path,
                          (unsigned long long)n, EM_HF_VOCAB_MAX);
    if ((rc = em_hft_alloc_tokens(b, n))) return rc;
    json_object_foreach((json_t *)vocab, key, val) {
        int64_t id = json_integer_value(val);
        if ((uint64_t)id >= n)
            return em_err_set(err, EM_EFORMAT, "%s: model.vocab['%s']: token id %lld >= "
                              "vocab_size %llu", path, key, (long long)id, (unsigned long long)n);
        if (v->tokens[id])
            return em_err_set(err, EM_EFORMAT, "%s: model.vocab: id %lld given to both '%s' and "
                              "'%s'", path, (long long)id, v->tokens[id], key);
        if (!(v->tokens[id] = em_hft_pool_str(b, key, strlen(key)))) return EM_ENOMEM;
        v->types[id] = EM_HF_TOKEN_NORMAL;
    }
    hft_map amap;
    if ((rc = em_hft_map_init(&amap, n_added, "added token map", err))) return rc;
    rc = tj_added(b, path, added, n, vmap, &amap);
    em_hft_map_free(&amap);
    return rc;
}

/* One merge: "a b" (exactly one space) or ["a", "b"]; both parts and their concatenation
 * must be vocab pieces (as HF tokenizers requires). */
static int tj_merge(hft_builder *b, const char *path, size_t i, const json_t *m, const hft_map *vmap,
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
    const char *missing = em_hft_map_get(vmap, l, ln) < 0 ? "left part" :
                          em_hft_map_get(vmap, r, rn) < 0 ? "right part" :
                          em_hft_map_get(vmap, cat, ln + rn) < 0 ? "merged token" : NULL;
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
    *out = em_hft_pool_str(b, buf, o);
    free(buf);
    return *out ? EM_OK : EM_ENOMEM;
}

static int tj_merges(hft_builder *b, const char *path, const json_t *model, const hft_map *vmap) {
    em_hf_vocab *v = b->v;
    json_t *merges = em_hft_member(model, "merges");
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

int em_hft_json_build(hft_builder *b, const char *path, int64_t vocab_size, const char *arch) {
    json_t *root = NULL;
    hft_map vmap = { 0 };
    int rc = em_hft_load_json(path, &root, b->err);
    if (rc) return rc;
    const json_t *model = em_hft_member(root, "model");
    if (!(rc = tj_check_kind(b, path, root, model)) &&
        !(rc = tj_tokens(b, path, model, em_hft_member(root, "added_tokens"), vocab_size, &vmap)) &&
        !(rc = tj_merges(b, path, model, &vmap)) && !(rc = em_hft_fill_pads(b))) {
        snprintf(b->v->source, sizeof b->v->source, "tokenizer.json");
        rc = em_hft_resolve_specials(b, root, arch);
    }
    em_hft_map_free(&vmap);
    json_decref(root);
    return rc;
}
