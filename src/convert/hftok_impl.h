/* convert/hftok_impl.h: what the tokenizer reader's files share (hftokenizer.c: the string
 * pool, the byte-string map, JSON helpers, special ids, chat template, the entry points;
 * hftok_tiktoken.c and hftok_json.c: one source format each). Internal to convert/: callers
 * use hftokenizer.h. */
#ifndef EM_CONVERT_HFTOK_IMPL_H
#define EM_CONVERT_HFTOK_IMPL_H

#include "convert/hftokenizer.h"

#include <jansson.h>

#define PATH_CAP 4096

typedef struct hft_slot {
    const uint8_t *key; /* NULL = empty; points at memory that outlives the map */
    uint32_t len;
    uint32_t hash; /* high bits of the key's hash: most misses end here, before memcmp */
    int64_t val;
} hft_slot;

typedef struct hft_map {
    hft_slot *slots;
    uint64_t mask;
} hft_map;

typedef struct hft_builder {
    em_hf_vocab *v;
    const char *dir;
    em_err *err;
    char tc_path[PATH_CAP]; /* tokenizer_config.json */
    char cfg_path[PATH_CAP];
    json_t *tc;  /* tokenizer_config.json root; NULL when the file is absent */
    json_t *cfg; /* config.json root; NULL when absent */
} hft_builder;

/* Hash map from byte strings to ids (fixed capacity: room for n keys at load <= 1/2; the
 * keys point at memory that outlives the map). get: the id or -1; put: inserts unless the key
 * is there, returning the existing id or -1. */
int em_hft_map_init(hft_map *m, uint64_t n, const char *what, em_err *err);
void em_hft_map_free(hft_map *m);
int64_t em_hft_map_get(const hft_map *m, const void *key, size_t len);
int64_t em_hft_map_put(hft_map *m, const void *key, size_t len, int64_t val);

/* JSON helpers: a file parsed (the message names it and the line), a member of an object
 * (NULL when obj is not one or lacks it), a string member (NULL when not a string). */
int em_hft_load_json(const char *path, json_t **out, em_err *err);
json_t *em_hft_member(const json_t *obj, const char *key);
const char *em_hft_member_str(const json_t *obj, const char *key);
/* Whether an added token's text looks special (<|...|>, <pad>, <unused...>, ...). */
bool em_hft_looks_special(const char *s);

/* The vocabulary being built: n token slots; a string copied into the vocabulary's pool;
 * the ids no source named filled with "[PAD{id}]"; the special ids resolved (SpecialVocab
 * plus the architecture's eos rule, hftokenizer.h) once the tokens are in. */
int em_hft_alloc_tokens(hft_builder *b, uint64_t n);
char *em_hft_pool_str(hft_builder *b, const char *s, size_t n);
int em_hft_fill_pads(hft_builder *b);
int em_hft_resolve_specials(hft_builder *b, const json_t *tj, const char *arch);

/* The two sources, each filling b->v completely (tokens, types, merges, pre, source,
 * specials) or failing with a message naming the file: tiktoken.model with
 * tokenizer_config.json (hftok_tiktoken.c), tokenizer.json (hftok_json.c). */
int em_hft_tiktoken_build(hft_builder *b, const char *tk_path, int64_t vocab_size, const char *arch);
int em_hft_json_build(hft_builder *b, const char *path, int64_t vocab_size, const char *arch);

#endif
