/* Tests for convert/hftokenizer.
 *
 * References, independent of the C code:
 *   - tests/data/hftokenizer/expected/ files: tokens, types, merges and special ids for
 *     the Kimi fixture (tests/fixtures/kimi_a), a hand-made GPT-2 style tokenizer.json and a
 *     tiktoken.model with a gap in its ranks, computed by make_data.py, a separate Python
 *     transcription of llama.cpp's converter rules;
 *   - tests/fixtures/ref/manifest.json "tokenizer_tests": ids tiktoken produced. Running a
 *     merges-ranked BPE (as llama.cpp's tokenizer does) with the rebuilt merges over text
 *     pre-split by Kimi's regex must give the same ids;
 *   - facts stated by the reference notes and GPT-2's byte map (byte 0x20 -> "Ġ").
 * Plus invariants of the merge rebuild, the tokenizer.json variants (pair merges, known
 * pre-tokenizer regexes, post_processor templates, chat template sources, per-architecture
 * eos rules), and every broken folder of tests/data/hftokenizer/bad.json failing with a
 * message that names the problem and the file. */
#include "testutil.h"

#include "convert/hftokenizer.h"
#include "text/text.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIMI_A "tests/fixtures/kimi_a"
#define DATA "tests/data/hftokenizer"

static void load_ok(em_hf_vocab *v, const char *dir, int64_t vocab_size, const char *arch) {
    em_err err = { 0 };
    int rc = em_hf_vocab_load(v, dir, vocab_size, arch, &err);
    if (rc) fail_msg("%s: %s", dir, err.msg);
}

static json_t *load_json_file(const char *path) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) fail_msg("%s: %s", path, jerr.text);
    return j;
}

/* ---- scratch folders ------------------------------------------------------------------ */

/* A folder under the test's scratch dir (names are unique per test run). */
static const char *scratch(const char *name) {
    const char *d = em_test_path(name);
    if (mkdir(d, 0755) != 0 && errno != EEXIST) fail_msg("mkdir %s", d);
    return d;
}

/* Copies the tokenizer files (and config.json) of a source-tree folder into dir. */
static void copy_dir(const char *from_rel, const char *to) {
    static const char *const names[] = { "tokenizer.json", "tokenizer_config.json",
                                         "config.json", "tiktoken.model" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char from[1024], dst[1024];
        snprintf(from, sizeof from, "%s/%s", em_test_src(from_rel), names[i]);
        snprintf(dst, sizeof dst, "%s/%s", to, names[i]);
        if (access(from, F_OK) != 0) continue;
        size_t n;
        void *data = em_test_read(from, &n);
        em_test_write(dst, data, n);
        free(data);
    }
}

static void write_json(const char *dir, const char *name, const json_t *j) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (json_dump_file(j, path, JSON_INDENT(1)) != 0) fail_msg("write %s", path);
}

static json_t *read_json(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return load_json_file(path);
}

/* ---- comparison with the expected files ---------------------------------------------- */

static int64_t exp_id(const json_t *e, const char *name) {
    json_t *v = json_object_get(json_object_get(e, "ids"), name);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static void compare_expected(const em_hf_vocab *v, const char *rel) {
    json_t *e = load_json_file(em_test_src(rel));
    json_t *tokens = json_object_get(e, "tokens"), *types = json_object_get(e, "types");
    json_t *merges = json_object_get(e, "merges");
    assert_int_equal(v->n_tokens, json_array_size(tokens));
    for (size_t i = 0; i < v->n_tokens; i++) {
        const char *want = json_string_value(json_array_get(tokens, i));
        if (strcmp(v->tokens[i], want) != 0)
            fail_msg("%s: token %zu is '%s', expected '%s'", rel, i, v->tokens[i], want);
        if (v->types[i] != json_integer_value(json_array_get(types, i)))
            fail_msg("%s: token %zu '%s' has type %d, expected %lld", rel, i, v->tokens[i],
                     v->types[i], json_integer_value(json_array_get(types, i)));
    }
    assert_int_equal(v->n_merges, json_array_size(merges));
    for (size_t i = 0; i < v->n_merges; i++)
        if (strcmp(v->merges[i], json_string_value(json_array_get(merges, i))) != 0)
            fail_msg("%s: merge %zu is '%s', expected '%s'", rel, i, v->merges[i],
                     json_string_value(json_array_get(merges, i)));
    assert_int_equal(v->bos, exp_id(e, "bos"));
    assert_int_equal(v->eos, exp_id(e, "eos"));
    assert_int_equal(v->unk, exp_id(e, "unk"));
    assert_int_equal(v->pad, exp_id(e, "pad"));
    assert_int_equal(v->mask, exp_id(e, "mask"));
    assert_string_equal(v->pre, json_string_value(json_object_get(e, "pre")));
    json_t *ct = json_object_get(e, "chat_template");
    if (json_is_string(ct)) assert_string_equal(v->chat_template, json_string_value(ct));
    else assert_null(v->chat_template);
    assert_string_equal(v->model, "gpt2");
    json_decref(e);
}

/* ---- merge invariants --------------------------------------------------------------- */

static int64_t token_id(const em_hf_vocab *v, const char *text) {
    for (uint64_t i = 0; i < v->n_tokens; i++)
        if (strcmp(v->tokens[i], text) == 0) return (int64_t)i;
    return -1;
}

/* Every merge "l r": l, r and lr are tokens, both parts rank below the result, the results
 * come in strictly increasing id (= rank) order, and each NORMAL multi-byte token is the
 * result of exactly one merge. */
static void check_merge_invariants(const em_hf_vocab *v) {
    int *made = calloc(v->n_tokens, sizeof *made);
    int64_t last = -1;
    for (uint64_t i = 0; i < v->n_merges; i++) {
        const char *m = v->merges[i], *sp = strchr(m, ' ');
        assert_non_null(sp);
        assert_null(strchr(sp + 1, ' '));
        char l[256], r[256], lr[512];
        snprintf(l, sizeof l, "%.*s", (int)(sp - m), m);
        snprintf(r, sizeof r, "%s", sp + 1);
        snprintf(lr, sizeof lr, "%s%s", l, r);
        int64_t il = token_id(v, l), ir = token_id(v, r), ilr = token_id(v, lr);
        if (il < 0 || ir < 0 || ilr < 0) fail_msg("merge '%s': a part or the result is no token", m);
        assert_true(il < ilr && ir < ilr);
        assert_true(ilr > last);
        last = ilr;
        made[ilr]++;
    }
    for (uint64_t i = 0; i < v->n_tokens; i++) {
        if (v->types[i] != EM_HF_TOKEN_NORMAL) continue;
        size_t n_chars = 0; /* code points: one per byte of the token */
        for (const unsigned char *p = (const unsigned char *)v->tokens[i]; *p; p++)
            n_chars += (*p & 0xC0) != 0x80;
        if (made[i] != (n_chars >= 2 ? 1 : 0))
            fail_msg("token %llu '%s' is the result of %d merges", (unsigned long long)i,
                     v->tokens[i], made[i]);
    }
    free(made);
}

/* ---- the Kimi fixture ---------------------------------------------------------------- */

static void test_kimi_a(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, em_test_src(KIMI_A), 512, "kimi-linear");
    compare_expected(&v, DATA "/expected/kimi_a.json");
    assert_string_equal(v.source, "tiktoken");
    assert_string_equal(v.pre, "kimi-k2");
    /* GPT-2 byte map: the fixture's byte tokens have rank == byte */
    assert_string_equal(v.tokens[0x20], "\xC4\xA0"); /* Ġ */
    assert_string_equal(v.tokens[0x0A], "\xC4\x8A"); /* Ċ */
    assert_string_equal(v.tokens[0x00], "\xC4\x80"); /* Ā */
    assert_string_equal(v.tokens['A'], "A");
    assert_string_equal(v.tokens[0xAD], "\xC5\x83"); /* soft hyphen -> Ń */
    assert_string_equal(v.tokens[0xFF], "\xC3\xBF"); /* ÿ stays */
    assert_int_equal(v.types[0x20], EM_HF_TOKEN_NORMAL);
    /* specials at their ids, CONTROL (tokenizer_config.json added_tokens_decoder) */
    assert_string_equal(v.tokens[480], "[BOS]");
    assert_string_equal(v.tokens[481], "[EOS]");
    assert_string_equal(v.tokens[482], "<|im_end|>");
    assert_string_equal(v.tokens[497], "<|im_middle|>");
    assert_string_equal(v.tokens[511], "[PAD]");
    for (int i = 480; i < 512; i++) assert_int_equal(v.types[i], EM_HF_TOKEN_CONTROL);
    for (int i = 0; i < 480; i++) assert_int_equal(v.types[i], EM_HF_TOKEN_NORMAL);
    /* ids: bos/pad from config.json, eos = tiktoken [EOS] (Kimi-Linear rule), no unk (the
     * converter reads unk only through tokenizer.json / config.json) */
    assert_int_equal(v.bos, 480);
    assert_int_equal(v.eos, 481);
    assert_int_equal(v.pad, 511);
    assert_int_equal(v.unk, -1);
    assert_int_equal(v.mask, -1);
    assert_int_equal(v.eot, 482); /* <|im_end|>, found by text */
    assert_false(v.eot_stated);
    assert_false(v.has_add_bos);
    assert_false(v.has_add_eos);
    assert_non_null(v.chat_template);
    assert_non_null(strstr(v.chat_template, "<|im_assistant|>assistant<|im_middle|>"));
    /* merges: every multi-byte rank gets one, in rank order */
    assert_int_equal(v.n_merges, 480 - 256);
    assert_string_equal(v.merges[0], "\xC4\xA0 t"); /* "Ġ t" -> rank 256 " t" */
    check_merge_invariants(&v);
    em_hf_vocab_free(&v);
    assert_null(v.tokens);
    em_hf_vocab_free(&v); /* twice is harmless */
}

static void test_kimi_eos_rules(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, em_test_src(KIMI_A), 512, "kimi-k3"); /* K3: back to config's eos */
    assert_int_equal(v.eos, 482);
    em_hf_vocab_free(&v);
    load_ok(&v, em_test_src(KIMI_A), 512, "dflash"); /* no override: SpecialVocab's config eos */
    assert_int_equal(v.eos, 482);
    em_hf_vocab_free(&v);
    load_ok(&v, em_test_src(KIMI_A), 512, NULL);
    assert_int_equal(v.eos, 482);
    assert_int_equal(v.bos, 480);
    em_hf_vocab_free(&v);
    em_err err = { 0 };
    assert_int_equal(em_hf_vocab_load(&v, em_test_src(KIMI_A), 512, "llama", &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "unknown architecture 'llama'"));
    /* a K3-style wrapper config: ids fall back to text_config; K3's eos prefers text_config */
    const char *d = scratch("k3cfg");
    copy_dir(KIMI_A, d);
    json_t *cfg = json_pack("{s:i, s:{s:i, s:i, s:i}}", "eos_token_id", 482, "text_config",
                            "eos_token_id", 483, "bos_token_id", 480, "pad_token_id", 511);
    write_json(d, "config.json", cfg);
    json_decref(cfg);
    load_ok(&v, d, 512, "kimi-k3");
    assert_int_equal(v.eos, 483);
    assert_int_equal(v.bos, 480);
    assert_int_equal(v.pad, 511);
    em_hf_vocab_free(&v);
    load_ok(&v, d, 512, "dflash");
    assert_int_equal(v.eos, 482); /* SpecialVocab: the top level first */
    em_hf_vocab_free(&v);
}

static void test_kimi_vocab_sizes(void **state) {
    (void)state;
    em_hf_vocab v;
    /* Kimi's tokenizer reserves [480, 736): ids past the file's specials are
     * <|reserved_token_N|> (CONTROL), not pads */
    load_ok(&v, em_test_src(KIMI_A), 520, "kimi-linear");
    assert_int_equal(v.n_tokens, 520);
    assert_string_equal(v.tokens[512], "<|reserved_token_512|>");
    assert_string_equal(v.tokens[519], "<|reserved_token_519|>");
    assert_int_equal(v.types[519], EM_HF_TOKEN_CONTROL);
    em_hf_vocab_free(&v);
    load_ok(&v, em_test_src(KIMI_A), 800, "kimi-linear");
    assert_string_equal(v.tokens[735], "<|reserved_token_735|>");
    assert_string_equal(v.tokens[736], "[PAD736]");
    assert_int_equal(v.types[736], EM_HF_TOKEN_UNUSED);
    assert_string_equal(v.tokens[799], "[PAD799]");
    em_hf_vocab_free(&v);
    load_ok(&v, em_test_src(KIMI_A), 0, "kimi-linear"); /* the tokenizer's own size */
    assert_int_equal(v.n_tokens, 736);
    em_hf_vocab_free(&v);
    em_err err = { 0 };
    assert_int_equal(em_hf_vocab_load(&v, em_test_src(KIMI_A), 400, NULL, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "tiktoken.model: line 480: token id (rank) 479 >= vocab_size 400"));
    assert_null(v.tokens);
    assert_int_equal(em_hf_vocab_load(&v, em_test_src(KIMI_A), 500, NULL, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "added_tokens_decoder id 500 ('<|reserved_token_500|>') is "
                                    ">= vocab_size 500"));
}

static void test_holes(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, em_test_src(DATA "/holes"), 640, "kimi-linear");
    compare_expected(&v, DATA "/expected/holes.json");
    assert_string_equal(v.tokens[260], "[PAD260]"); /* a hole below the specials */
    assert_int_equal(v.types[260], EM_HF_TOKEN_UNUSED);
    assert_string_equal(v.tokens[261], "[BOS]");
    assert_string_equal(v.tokens[265], "<|reserved_token_265|>");
    assert_string_equal(v.tokens[516], "[PAD]");
    assert_string_equal(v.tokens[517], "[PAD517]");
    assert_string_equal(v.tokens[600], "abcd");
    assert_int_equal(v.types[600], EM_HF_TOKEN_NORMAL);
    assert_string_equal(v.merges[v.n_merges - 1], "abc d");
    assert_string_equal(v.merges[3], "\xC4\xA0 ab"); /* " ab" */
    assert_int_equal(v.eos, 262);
    assert_int_equal(v.eot, 263);
    check_merge_invariants(&v);
    em_hf_vocab_free(&v);
    load_ok(&v, em_test_src(DATA "/holes"), 0, "kimi-k3");
    assert_int_equal(v.n_tokens, 601); /* the largest rank + 1 */
    assert_int_equal(v.eos, 263);
    em_hf_vocab_free(&v);
    /* "xyz" with neither "xy" nor "yz" ranked: BPE ends in three parts, no merge (as in
     * llama.cpp, which keeps only two-part results) */
    const char *d = scratch("xyz");
    copy_dir(DATA "/holes", d);
    char path[1024];
    snprintf(path, sizeof path, "%s/tiktoken.model", d);
    size_t n;
    char *text = em_test_read(path, &n);
    char *abcd = strstr(text, "YWJjZA== 600");
    assert_non_null(abcd);
    memcpy(abcd, "eHl6", 4); /* base64("xyz") */
    memmove(abcd + 4, abcd + 8, strlen(abcd + 8) + 1);
    em_test_write(path, text, strlen(text));
    free(text);
    load_ok(&v, d, 640, "kimi-linear");
    assert_string_equal(v.tokens[600], "xyz");
    assert_int_equal(v.n_merges, 4);
    for (uint64_t i = 0; i < v.n_merges; i++) assert_null(strchr(v.merges[i], 'z'));
    em_hf_vocab_free(&v);
}

/* ---- the GPT-2 style tokenizer.json -------------------------------------------------- */

static void test_gpt2(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, em_test_src(DATA "/gpt2"), 300, NULL);
    compare_expected(&v, DATA "/expected/gpt2.json");
    assert_string_equal(v.source, "tokenizer.json");
    assert_string_equal(v.pre, "gpt-2");
    assert_int_equal(v.n_tokens, 300);
    assert_string_equal(v.tokens[0], "!");            /* GPT-2 order: printable first */
    assert_string_equal(v.tokens[188], "\xC4\x80");   /* Ā, byte 0 */
    assert_string_equal(v.tokens[292], "<|endoftext|>");
    assert_int_equal(v.types[292], EM_HF_TOKEN_CONTROL);
    assert_int_equal(v.types[293], EM_HF_TOKEN_CONTROL);  /* <|im_end|>: looks special */
    assert_int_equal(v.types[294], EM_HF_TOKEN_USER_DEFINED);
    assert_string_equal(v.tokens[295], " pad me");         /* U+2581 -> ' ' */
    assert_int_equal(v.types[295], EM_HF_TOKEN_USER_DEFINED);
    assert_string_equal(v.tokens[296], "[PAD296]");
    assert_int_equal(v.types[296], EM_HF_TOKEN_UNUSED);
    assert_int_equal(v.types[297], EM_HF_TOKEN_CONTROL);
    assert_int_equal(v.types[100], EM_HF_TOKEN_NORMAL);
    /* tokenizer_config.json values resolved through added_tokens win over config.json */
    assert_int_equal(v.bos, 292);
    assert_int_equal(v.eos, 292); /* {"content": ...} form */
    assert_int_equal(v.unk, 292);
    assert_int_equal(v.mask, 297);
    assert_int_equal(v.pad, 299); /* only config.json names it */
    assert_int_equal(v.sep, -1);
    assert_int_equal(v.cls, -1);
    assert_int_equal(v.eot, 293);
    assert_false(v.eot_stated);
    assert_true(v.has_add_bos);
    assert_false(v.add_bos);
    assert_false(v.has_add_eos);
    assert_int_equal(v.n_merges, 36);
    assert_string_equal(v.merges[0], "\xC4\xA0 t");
    check_merge_invariants(&v);
    em_hf_vocab_free(&v);
    /* the tokenizer's own size is 298, below config.json's pad_token_id */
    em_err err = { 0 };
    assert_int_equal(em_hf_vocab_load(&v, em_test_src(DATA "/gpt2"), 0, NULL, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "config.json: pad_token_id = 299 is outside the vocabulary "
                                    "[0, 298)"));
    load_ok(&v, em_test_src(DATA "/gpt2"), 300, "kimi-linear"); /* no override: tokenizer.json */
    assert_int_equal(v.eos, 292);
    em_hf_vocab_free(&v);
    load_ok(&v, em_test_src(DATA "/gpt2"), 300, "kimi-k3"); /* K3: config.json's eos */
    assert_int_equal(v.eos, 0);
    em_hf_vocab_free(&v);
}

/* A copy of the gpt2 folder with tokenizer.json / tokenizer_config.json changed by fn. */
typedef void (*mutate_fn)(json_t *tj, json_t *tc);

static const char *gpt2_variant(const char *name, mutate_fn fn) {
    const char *d = scratch(name);
    copy_dir(DATA "/gpt2", d);
    json_t *tj = read_json(d, "tokenizer.json"), *tc = read_json(d, "tokenizer_config.json");
    fn(tj, tc);
    write_json(d, "tokenizer.json", tj);
    write_json(d, "tokenizer_config.json", tc);
    json_decref(tj);
    json_decref(tc);
    return d;
}

/* merges as [left, right] pairs (transformers >= 4.45), with one part holding a space */
static void to_pairs(json_t *tj, json_t *tc) {
    (void)tc;
    json_t *model = json_object_get(tj, "model");
    json_t *merges = json_object_get(model, "merges"), *pairs = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        json_array_append_new(pairs, json_pack("[s#s]", s, (int)(sp - s), sp + 1));
    }
    json_t *vocab = json_object_get(model, "vocab");
    json_object_set_new(vocab, " ", json_integer(296));
    json_object_set_new(vocab, "a ", json_integer(298));
    json_array_append_new(pairs, json_pack("[ss]", "a", " "));
    json_object_set_new(model, "merges", pairs);
}

static void test_gpt2_pair_merges(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, gpt2_variant("pairs", to_pairs), 300, NULL);
    assert_int_equal(v.n_merges, 37);
    assert_string_equal(v.merges[0], "\xC4\xA0 t");
    assert_string_equal(v.merges[35], "\xC4\x8A \xC4\x8A");
    assert_string_equal(v.merges[36], "a \xC4\xA0"); /* the space written as U+0120 */
    assert_string_equal(v.tokens[296], " ");
    assert_string_equal(v.tokens[298], "a ");
    em_hf_vocab_free(&v);
}

static const char *g_regex; /* the Split regex of the next split_variant */

static void to_split(json_t *tj, json_t *tc) {
    (void)tc;
    json_t *pt = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                           "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
                           g_regex, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                           "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0);
    assert_non_null(pt);
    json_object_set_new(tj, "pre_tokenizer", pt);
}

static void test_gpt2_pre_names(void **state) {
    (void)state;
    static const struct {
        const char *regex, *pre;
    } cases[] = {
        { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
          "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
          "qwen2" },
        { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
          "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
          "llama-bpe" },
        { "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
          "gpt-2" },
        /* Kimi's pat_str (tokenization_kimi.py), as "|".join of its parts */
        { "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
          "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}"
          "\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}"
          "&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
          "kimi-k2" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g_regex = cases[i].regex;
        em_hf_vocab v;
        load_ok(&v, gpt2_variant("split", to_split), 300, NULL);
        assert_string_equal(v.pre, cases[i].pre);
        em_hf_vocab_free(&v);
    }
}

/* Llama-3 style TemplateProcessing: BOS first; the template ends in <|im_end|> while the
 * config's eos is <|endoftext|> (as an object, which SpecialVocab never equates with the
 * template's string): eos becomes <|im_end|> and the old eos eot. */
static void to_template(json_t *tj, json_t *tc) {
    json_t *pp = json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}]}", "type",
                           "TemplateProcessing", "single", "SpecialToken", "id", "<|endoftext|>",
                           "type_id", 0, "Sequence", "id", "A", "type_id", 0, "SpecialToken",
                           "id", "<|im_end|>", "type_id", 0);
    assert_non_null(pp);
    json_object_set_new(tj, "post_processor", pp);
    json_object_del(tc, "add_bos_token");
}

static void to_roberta(json_t *tj, json_t *tc) {
    json_object_set_new(tj, "post_processor",
                        json_pack("{s:s, s:[s,i], s:[s,i]}", "type", "RobertaProcessing", "sep",
                                  "<|im_end|>", 293, "cls", "<|endoftext|>", 292));
    json_object_del(tc, "add_bos_token");
}

static void test_gpt2_post_processors(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, gpt2_variant("template", to_template), 300, NULL);
    assert_true(v.has_add_bos && v.add_bos);
    assert_true(v.has_add_eos && v.add_eos);
    assert_int_equal(v.bos, 292);
    assert_int_equal(v.eos, 293);
    assert_int_equal(v.eot, 292);
    assert_true(v.eot_stated);
    em_hf_vocab_free(&v);
    load_ok(&v, gpt2_variant("roberta", to_roberta), 300, NULL);
    assert_true(v.has_add_bos && v.add_bos);
    assert_true(v.has_add_eos && v.add_eos);
    assert_int_equal(v.cls, 292);
    assert_int_equal(v.sep, 293);
    em_hf_vocab_free(&v);
}

static void to_template_list(json_t *tj, json_t *tc) {
    (void)tj;
    json_object_set_new(tc, "chat_template",
                        json_pack("[{s:s, s:s}, {s:s, s:s}]", "name", "tool_use", "template",
                                  "TOOLS", "name", "default", "template", "DEFAULT"));
}

static void drop_template(json_t *tj, json_t *tc) {
    (void)tj;
    json_object_del(tc, "chat_template");
}

static void test_chat_template_sources(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, gpt2_variant("tlist", to_template_list), 300, NULL);
    assert_string_equal(v.chat_template, "DEFAULT");
    em_hf_vocab_free(&v);
    const char *d = gpt2_variant("tnone", drop_template);
    load_ok(&v, d, 300, NULL);
    assert_null(v.chat_template);
    em_hf_vocab_free(&v);
    char path[1024];
    snprintf(path, sizeof path, "%s/chat_template.json", d);
    const char *json = "{\"chat_template\": \"FROM JSON\"}";
    em_test_write(path, json, strlen(json));
    load_ok(&v, d, 300, NULL);
    assert_string_equal(v.chat_template, "FROM JSON");
    em_hf_vocab_free(&v);
    snprintf(path, sizeof path, "%s/chat_template.jinja", d); /* preferred over the .json */
    em_test_write(path, "{{ bos_token }}JINJA\n", strlen("{{ bos_token }}JINJA\n"));
    load_ok(&v, d, 300, NULL);
    assert_string_equal(v.chat_template, "{{ bos_token }}JINJA\n");
    em_hf_vocab_free(&v);
}

/* tokenizer.json wins over tiktoken.model, as llama.cpp's Kimi converter tries it first */
static void test_source_order(void **state) {
    (void)state;
    const char *d = scratch("both");
    copy_dir(DATA "/gpt2", d);
    size_t n;
    void *tk = em_test_read(em_test_src(KIMI_A "/tiktoken.model"), &n);
    char path[1024];
    snprintf(path, sizeof path, "%s/tiktoken.model", d);
    em_test_write(path, tk, n);
    free(tk);
    assert_true(em_hf_vocab_present(d));
    em_hf_vocab v;
    load_ok(&v, d, 300, "kimi-linear");
    assert_string_equal(v.source, "tokenizer.json");
    em_hf_vocab_free(&v);
}

static void test_present_and_missing(void **state) {
    (void)state;
    assert_true(em_hf_vocab_present(em_test_src(KIMI_A)));
    assert_true(em_hf_vocab_present(em_test_src(DATA "/gpt2")));
    assert_false(em_hf_vocab_present(em_test_src("tests/fixtures/kimi_b")));
    assert_false(em_hf_vocab_present(NULL));
    em_hf_vocab v;
    em_err err = { 0 };
    assert_int_equal(em_hf_vocab_load(&v, em_test_src("tests/fixtures/kimi_b"), 512, NULL, &err),
                     EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, "no tokenizer.json or tiktoken.model"));
    assert_int_equal(em_hf_vocab_load(&v, "/nonexistent/dir", 512, NULL, &err), EM_ENOTFOUND);
    assert_int_equal(em_hf_vocab_load(&v, em_test_src(KIMI_A), 1ll << 30, NULL, &err),
                     EM_EUNSUPPORTED);
    assert_int_equal(em_tok_byte_to_unicode(' '), 0x120);
    assert_int_equal(em_tok_byte_to_unicode('\n'), 0x10A);
    assert_int_equal(em_tok_byte_to_unicode(127), 0x121);
    assert_int_equal(em_tok_byte_to_unicode(160), 0x142);
    assert_int_equal(em_tok_byte_to_unicode('a'), 'a');
}

/* ---- broken folders (bad.json) ------------------------------------------------------- */

static json_t *path_parent(json_t *root, const char *path, char *last, size_t cap) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = root;
    char *seg = buf, *slash;
    while ((slash = strchr(seg, '/'))) {
        *slash = '\0';
        cur = json_is_array(cur) ? json_array_get(cur, strtoul(seg, NULL, 10))
                                 : json_object_get(cur, seg);
        if (!cur) fail_msg("bad path %s", path);
        seg = slash + 1;
    }
    snprintf(last, cap, "%s", seg);
    return cur;
}

static void patch_json(const char *file, const json_t *c) {
    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    if (!root) fail_msg("%s: %s", file, jerr.text);
    const char *key;
    json_t *val;
    json_object_foreach(json_object_get(c, "set"), key, val) {
        char last[512];
        json_t *parent = path_parent(root, key, last, sizeof last);
        if (json_is_array(parent))
            json_array_set(parent, strtoul(last, NULL, 10), val);
        else
            json_object_set(parent, last, val);
    }
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(c, "delete"), i, p) {
        char last[512];
        json_t *parent = path_parent(root, json_string_value(p), last, sizeof last);
        if (json_object_del(parent, last) != 0) fail_msg("cannot delete %s", json_string_value(p));
    }
    if (json_dump_file(root, file, JSON_INDENT(1)) != 0) fail_msg("write %s", file);
    json_decref(root);
}

/* A line of n 'x' bytes in base64, for "LONG<n> rank" lines. */
static char *long_line(const char *line) {
    unsigned n = (unsigned)strtoul(line + 4, NULL, 10);
    const char *rank = strchr(line, ' ');
    size_t len = (n + 2) / 3 * 4;
    char *out = malloc(len + strlen(rank) + 1);
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (unsigned i = 0; i < n; i += 3) {
        uint32_t acc = (uint32_t)'x' << 16 | (i + 1 < n ? (uint32_t)'x' << 8 : 0) |
                       (i + 2 < n ? 'x' : 0);
        out[o++] = b64[acc >> 18 & 63];
        out[o++] = b64[acc >> 12 & 63];
        out[o++] = i + 1 < n ? b64[acc >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? b64[acc & 63] : '=';
    }
    strcpy(out + o, rank);
    return out;
}

static void patch_lines(const char *file, const json_t *c) {
    size_t n;
    char *text = em_test_read(file, &n);
    FILE *f = fopen(file, "wb");
    if (!f) fail_msg("rewrite %s", file);
    json_t *lines = json_object_get(c, "lines");
    unsigned line = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        char key[16];
        snprintf(key, sizeof key, "%u", ++line);
        json_t *r = json_object_get(lines, key);
        if (!r) fprintf(f, "%s\n", l);
        else if (json_is_string(r)) fprintf(f, "%s\n", json_string_value(r));
    }
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(c, "append"), i, a) {
        const char *s = json_string_value(a);
        if (strncmp(s, "LONG", 4) == 0) {
            char *l = long_line(s);
            fprintf(f, "%s\n", l);
            free(l);
        } else {
            fprintf(f, "%s\n", s);
        }
    }
    fclose(f);
    free(text);
}

static void run_bad_case(const json_t *c, size_t idx) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *base = json_string_value(json_object_get(c, "base"));
    const char *file = json_string_value(json_object_get(c, "file"));
    char dname[32];
    snprintf(dname, sizeof dname, "bad%zu", idx);
    const char *d = scratch(dname);
    bool kimi = strcmp(base, "kimi_a") == 0;
    copy_dir(kimi ? KIMI_A : strcmp(base, "gpt2") == 0 ? DATA "/gpt2" : DATA "/holes", d);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", d, file);
    json_t *raw = json_object_get(c, "raw");
    if (json_is_true(json_object_get(c, "remove")))
        remove(path);
    else if (raw)
        em_test_write(path, json_string_value(raw), json_string_length(raw));
    else if (json_object_get(c, "lines") || json_object_get(c, "append"))
        patch_lines(path, c);
    else
        patch_json(path, c);
    json_t *vs = json_object_get(c, "vocab_size");
    int64_t vocab_size = vs ? json_integer_value(vs) : kimi ? 512 : strcmp(base, "gpt2") ? 640 : 300;
    json_t *arch = json_object_get(c, "arch");
    em_hf_vocab v;
    em_err err = { 0 };
    int rc = em_hf_vocab_load(&v, d, vocab_size, arch ? json_string_value(arch) : "kimi-linear",
                              &err);
    if (rc == 0) fail_msg("case '%s' loaded", name);
    assert_true(rc < 0);
    assert_null(v.tokens);
    assert_null(v.pool);
    if (getenv("EMBER_VERBOSE")) fprintf(stderr, "%-40s %s\n", name, err.msg);
    const char *expect = json_string_value(json_object_get(c, "expect"));
    const char *in = json_string_value(json_object_get(c, "in"));
    if (!strstr(err.msg, expect) || !strstr(err.msg, in))
        fail_msg("case '%s': message '%s' lacks '%s' or '%s'", name, err.msg, expect, in);
}

static void test_bad_variants(void **state) {
    (void)state;
    json_t *all = load_json_file(em_test_src(DATA "/bad.json"));
    json_t *cases = json_object_get(all, "cases");
    assert_true(json_array_size(cases) >= 50);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) run_bad_case(c, i);
    json_decref(all);
}

/* ---- the manifest's tiktoken ids ----------------------------------------------------- */

/* Kimi's pre-tokenizer regex, hand-run for the characters the manifest texts use: ASCII,
 * Latin-1 letters and CJK ideographs (Han). Returns the match length at s[i] or 0 when a
 * character outside that set shows up (the text is then skipped). */
enum cls { C_OTHER, C_UPPER, C_LOWER, C_HAN, C_DIGIT, C_SPACE, C_NL, C_UNKNOWN };

static enum cls cls_of(const char *s, size_t n, size_t i, size_t *len) {
    unsigned char c = (unsigned char)s[i];
    *len = 1;
    if (c < 0x80) {
        if (c >= 'A' && c <= 'Z') return C_UPPER;
        if (c >= 'a' && c <= 'z') return C_LOWER;
        if (c >= '0' && c <= '9') return C_DIGIT;
        if (c == '\n' || c == '\r') return C_NL;
        if (c == ' ' || c == '\t' || c == '\v' || c == '\f') return C_SPACE;
        return C_OTHER;
    }
    uint32_t cp;
    if ((c & 0xE0) == 0xC0 && i + 1 < n) {
        cp = (uint32_t)(c & 0x1F) << 6 | ((unsigned char)s[i + 1] & 0x3F);
        *len = 2;
    } else if ((c & 0xF0) == 0xE0 && i + 2 < n) {
        cp = (uint32_t)(c & 0x0F) << 12 | (uint32_t)((unsigned char)s[i + 1] & 0x3F) << 6 |
             ((unsigned char)s[i + 2] & 0x3F);
        *len = 3;
    } else {
        return C_UNKNOWN;
    }
    if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return C_UPPER;
    if (cp >= 0xDF && cp <= 0xFF && cp != 0xF7) return C_LOWER;
    if (cp >= 0x4E00 && cp <= 0x9FFF) return C_HAN;
    return C_UNKNOWN;
}

static bool is_ws_cls(enum cls c) { return c == C_SPACE || c == C_NL; }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)? at s[i] */
static size_t contraction(const char *s, size_t n, size_t i) {
    static const char *const alts[] = { "'s", "'t", "'re", "'ve", "'m", "'ll", "'d" };
    for (size_t a = 0; a < 7; a++) {
        size_t k = strlen(alts[a]);
        if (i + k <= n && strncasecmp(s + i, alts[a], k) == 0) return k;
    }
    return 0;
}

/* run of class c (or classes c1/c2) from i; returns the end */
static size_t run_of(const char *s, size_t n, size_t i, enum cls c, size_t *count) {
    size_t len;
    *count = 0;
    while (i < n && cls_of(s, n, i, &len) == c) i += len, (*count)++;
    return i;
}

static size_t kimi_match(const char *s, size_t n, size_t i, bool *unknown) {
    size_t len, cnt;
    enum cls c = cls_of(s, n, i, &len);
    if (c == C_UNKNOWN) return *unknown = true, 0;
    if (c == C_HAN) return run_of(s, n, i, C_HAN, &cnt) - i;
    /* [^\r\n\p{L}\p{N}]? U* L+ C?  then  [^\r\n\p{L}\p{N}]? U+ L* C? */
    for (int alt = 0; alt < 2; alt++) {
        for (int pre = 1; pre >= 0; pre--) {
            size_t j = i;
            if (pre) {
                if (c != C_OTHER && c != C_SPACE) continue;
                j += len;
            }
            size_t nu, nl;
            size_t k = run_of(s, n, j, C_UPPER, &nu);
            size_t e = run_of(s, n, k, C_LOWER, &nl);
            if (alt == 0 ? nl == 0 : nu == 0) continue;
            return e + contraction(s, n, e) - i;
        }
    }
    if (c == C_DIGIT) {
        size_t e = i;
        for (int k = 0; k < 3 && e < n && cls_of(s, n, e, &len) == C_DIGIT; k++) e += len;
        return e - i;
    }
    /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
    size_t j = i + (s[i] == ' ' && i + 1 < n && cls_of(s, n, i + 1, &len) == C_OTHER);
    if (cls_of(s, n, j, &len) == C_OTHER) {
        size_t e = run_of(s, n, j, C_OTHER, &cnt);
        e = run_of(s, n, e, C_NL, &cnt);
        return e - i;
    }
    /* whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+ */
    size_t e = i, last_nl = 0;
    bool nl = false;
    while (e < n && is_ws_cls(cls_of(s, n, e, &len))) {
        if (s[e] == '\r' || s[e] == '\n') nl = true, last_nl = e;
        e++;
    }
    if (nl) return last_nl + 1 - i;
    if (e == n || e - i == 1) return e - i;
    return e - 1 - i;
}

/* BPE by merge priority (llama.cpp's way) over one piece; appends ids. */
static void bpe_piece(const em_hf_vocab *v, const char *piece, size_t n, int32_t *ids,
                      size_t *n_ids) {
    char parts[64][64];
    size_t np = 0;
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = em_tok_byte_to_unicode((uint8_t)piece[i]);
        if (cp < 0x80) snprintf(parts[np++], 64, "%c", (char)cp);
        else snprintf(parts[np++], 64, "%c%c", (char)(0xC0 | cp >> 6), (char)(0x80 | (cp & 63)));
    }
    for (;;) {
        int64_t best = -1;
        size_t at = 0;
        for (size_t k = 0; k + 1 < np; k++) {
            char m[130];
            snprintf(m, sizeof m, "%.63s %.63s", parts[k], parts[k + 1]);
            for (uint64_t r = 0; r < v->n_merges && (best < 0 || (int64_t)r < best); r++)
                if (strcmp(v->merges[r], m) == 0) best = (int64_t)r, at = k;
        }
        if (best < 0) break;
        size_t la = strlen(parts[at]), lb = strlen(parts[at + 1]);
        assert_true(la + lb < sizeof parts[0]);
        memmove(parts[at] + la, parts[at + 1], lb + 1);
        memmove(parts[at + 1], parts[at + 2], (np - at - 2) * sizeof parts[0]);
        np--;
    }
    for (size_t k = 0; k < np; k++) {
        int64_t id = token_id(v, parts[k]);
        assert_true(id >= 0);
        ids[(*n_ids)++] = (int32_t)id;
    }
}

static void test_manifest_ids(void **state) {
    (void)state;
    em_hf_vocab v;
    load_ok(&v, em_test_src(KIMI_A), 512, "kimi-linear");
    json_t *m = load_json_file(em_test_src("tests/fixtures/ref/manifest.json"));
    json_t *tests = json_object_get(m, "tokenizer_tests");
    assert_true(json_array_size(tests) > 0);
    size_t t, checked = 0;
    json_t *tc;
    json_array_foreach(tests, t, tc) {
        const char *text = json_string_value(json_object_get(tc, "text"));
        size_t n = strlen(text), n_ids = 0;
        int32_t ids[512];
        bool unknown = false;
        for (size_t i = 0; i < n && !unknown;) {
            /* specials first (allowed_special = all), longest match */
            size_t best = 0;
            int64_t sid = -1;
            for (uint64_t k = 0; k < v.n_tokens; k++) {
                size_t kl = strlen(v.tokens[k]);
                if (v.types[k] == EM_HF_TOKEN_CONTROL && kl > best && strncmp(text + i, v.tokens[k], kl) == 0)
                    best = kl, sid = (int64_t)k;
            }
            if (sid >= 0) {
                ids[n_ids++] = (int32_t)sid;
                i += best;
                continue;
            }
            /* ordinary text up to the next special */
            size_t end = i + 1;
            for (; end < n; end++) {
                bool hit = false;
                for (uint64_t k = 480; k < v.n_tokens && !hit; k++)
                    hit = strncmp(text + end, v.tokens[k], strlen(v.tokens[k])) == 0;
                if (hit) break;
            }
            while (i < end && !unknown) {
                size_t len = kimi_match(text, end, i, &unknown);
                if (unknown) break;
                assert_true(len > 0);
                bpe_piece(&v, text + i, len, ids, &n_ids);
                i += len;
            }
        }
        if (unknown) continue;
        json_t *want = json_object_get(tc, "ids");
        assert_int_equal(n_ids, json_array_size(want));
        for (size_t k = 0; k < n_ids; k++)
            if (ids[k] != json_integer_value(json_array_get(want, k)))
                fail_msg("'%s': id %zu is %d, tiktoken gave %lld", text, k, ids[k],
                         json_integer_value(json_array_get(want, k)));
        checked++;
    }
    assert_int_equal(checked, json_array_size(tests)); /* every text was checkable */
    json_decref(m);
    em_hf_vocab_free(&v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kimi_a),
        cmocka_unit_test(test_kimi_eos_rules),
        cmocka_unit_test(test_kimi_vocab_sizes),
        cmocka_unit_test(test_holes),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_gpt2_pair_merges),
        cmocka_unit_test(test_gpt2_pre_names),
        cmocka_unit_test(test_gpt2_post_processors),
        cmocka_unit_test(test_chat_template_sources),
        cmocka_unit_test(test_source_order),
        cmocka_unit_test(test_present_and_missing),
        cmocka_unit_test(test_bad_variants),
        cmocka_unit_test(test_manifest_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
