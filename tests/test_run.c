/* `ember run` as a program ($EMBER_BIN) on the kimi_a fixture converted to F32:
 *  - usage errors exit 2 (no or two prompts; unknown flags; bad values), flags of features
 *    still to come exit 2 saying they
 *    are not available yet, and their accepted values (--draft none, --device cpu, ...) run;
 *  - --draft with the DSpark fixture drafter: the same greedy tokens as plain decoding, spec
 *    statistics that count drafts; --verify-width > 1 without a drafter, a bad
 *    --feature-dtype, a missing drafter file and a width past the block are refused;
 *  - --json: the last line of stdout is one JSON object with every field, of the right type
 *    and consistent (n_gen = tokens, passes = n_gen - 1 at length, tau 1, zero experts), and
 *    the text before it is exactly the decode of the tokens;
 *  - greedy tokens equal the argmax chain of fresh full-sequence verifies computed here
 *    through the library (plain prompt and --chat, -p and -f);
 *  - failures exit 1: a prompt longer than --ctx-size, a missing model file;
 *  - the default pair (EMBER_MODELS pointed at a folder holding the fixtures under the default
 *    pair's names): no -m speculates with the default drafter (greedy tokens equal -m's plain
 *    ones), --draft none and a -m without --draft decode plainly, a folder without the target
 *    or without the drafter exits 1 naming what is missing. */
#include "testutil.h"

#include "backend/gpu.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "model/model.h"
#include "sample/sample.h"
#include "text/text.h"

/* The default pair's file names (tools/model_flags.h). */
#define EM_TEST_DEFAULT_TARGET "kimi-linear-19m-q8_0.gguf"
#define EM_TEST_DEFAULT_DRAFT "dspark-kimi-linear-19m-q8_0.gguf"

static const char *g_bin;
static char g_model[600];
static em_tok *g_tok;
static em_target *g_ref;
static bool g_have;

static int setup(void **state) {
    (void)state;
    g_bin = getenv("EMBER_BIN");
    if (!g_bin || !*g_bin) {
        fprintf(stderr, "EMBER_BIN is not set: run tests are skipped\n");
        return 0;
    }
    if (em_test_convert_fixture(g_bin, "kimi_a", "f32", g_model, sizeof g_model)) return -1;
    em_err err = { 0 };
    em_gguf *g = NULL;
    if (em_gguf_open(&g, g_model, &err) || em_tok_create(&g_tok, g, NULL, &err) ||
        em_model_open(&g_ref, g_model, &(em_model_opts){ .n_threads = 2 }, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        em_gguf_close(g);
        return -1;
    }
    em_gguf_close(g);
    g_have = true;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    em_target_close(g_ref);
    em_tok_free(g_tok);
    return 0;
}

#define NEED_MODEL()                                                                           \
    do {                                                                                       \
        if (!g_have) skip();                                                                   \
    } while (0)

/* Runs `ember run -m MODEL ARGS`, capturing stdout/stderr; returns the exit status. */
static int run(const char *args) { return em_test_sh(1, "'%s' run -m '%s' %s", g_bin, g_model, args); }

static char *read_text(const char *name) {
    size_t n;
    return em_test_read(em_test_path(name), &n);
}

static void expect_stderr(const char *needle) {
    char *err = read_text("err.txt");
    if (!strstr(err, needle)) fail_msg("stderr lacks '%s': %s", needle, err);
    free(err);
}

/* The greedy chain of n tokens after prompt, from a fresh full-sequence verify per token. */
static void argmax_chain(const int32_t *prompt, int n_prompt, int32_t *out, int n) {
    int vocab = em_target_get_info(g_ref)->n_vocab;
    int32_t *seq = malloc((size_t)(n_prompt + n) * sizeof *seq);
    float *logits = malloc((size_t)(n_prompt + n) * (size_t)vocab * sizeof *logits);
    assert_non_null(seq);
    assert_non_null(logits);
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    for (int i = 0; i < n; i++) {
        em_target_reset(g_ref);
        em_rows rows = { .logits = logits };
        OK(em_target_verify(g_ref, seq, n_prompt + i, &rows, E));
        out[i] = seq[n_prompt + i] = em_argmax(logits + (size_t)(n_prompt + i - 1) * (size_t)vocab, vocab);
    }
    free(seq);
    free(logits);
}

/* Splits stdout into the text before the last line and the JSON object of the last line. */
static json_t *split_json(char **text, size_t *text_len) {
    char *out = read_text("out.txt");
    size_t n = strlen(out);
    assert_true(n > 0 && out[n - 1] == '\n');
    out[n - 1] = 0;
    char *nl = strrchr(out, '\n');
    const char *line = nl ? nl + 1 : out;
    json_error_t jerr;
    json_t *j = json_loads(line, 0, &jerr);
    if (!j) fail_msg("last line is not JSON (%s): %s", jerr.text, line);
    assert_true(json_is_object(j));
    *text_len = nl ? (size_t)(nl - out) + 1 : 0; /* the text keeps its newline */
    *text = out;
    return j;
}

static json_int_t get_int(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) fail_msg("'%s' is missing or not an integer", key);
    return json_integer_value(v);
}

static double get_num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) fail_msg("'%s' is missing or not a number", key);
    return json_number_value(v);
}

/* Checks every field; returns the tokens (malloc'd) and their count. */
static int32_t *check_json(json_t *j, int *n_tokens) {
    static const char *const top[] = { "tokens", "n_prompt", "n_gen", "tok_per_s", "prompt_tok_per_s",
                                       "finish", "spec", "experts", "device", "draft_device" };
    assert_int_equal(json_object_size(j), sizeof top / sizeof top[0]);
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!json_object_get(j, top[i])) fail_msg("no '%s'", top[i]);
    json_t *tokens = json_object_get(j, "tokens");
    assert_true(json_is_array(tokens));
    int n = (int)json_array_size(tokens);
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    assert_non_null(ids);
    for (int i = 0; i < n; i++) {
        json_t *t = json_array_get(tokens, (size_t)i);
        assert_true(json_is_integer(t));
        assert_true(json_integer_value(t) >= 0 && json_integer_value(t) < 512);
        ids[i] = (int32_t)json_integer_value(t);
    }
    assert_int_equal(get_int(j, "n_gen"), n);
    assert_true(get_int(j, "n_prompt") > 0);
    assert_true(get_num(j, "tok_per_s") >= 0);
    assert_true(get_num(j, "prompt_tok_per_s") > 0);
    const char *finish = json_string_value(json_object_get(j, "finish"));
    assert_non_null(finish);
    assert_true(!strcmp(finish, "stop") || !strcmp(finish, "length"));
    assert_string_equal(json_string_value(json_object_get(j, "device")), "cpu");
    assert_true(json_is_null(json_object_get(j, "draft_device"))); /* plain: no drafter */

    json_t *spec = json_object_get(j, "spec");
    static const char *const spec_keys[] = { "passes", "drafted", "accepted", "tau", "fast_commits",
                                             "full_replays", "failed_fallbacks", "accept_hist",
                                             "mean_verify_width", "draft_seconds", "target_seconds",
                                             "plain_passes" };
    assert_int_equal(json_object_size(spec), sizeof spec_keys / sizeof spec_keys[0]);
    json_int_t passes = get_int(spec, "passes");
    assert_int_equal(passes, !strcmp(finish, "length") ? n - 1 : n);
    assert_int_equal(get_int(spec, "drafted"), 0);
    assert_int_equal(get_int(spec, "accepted"), 0);
    assert_true(fabs(get_num(spec, "tau") - (passes ? 1.0 : 0.0)) < 1e-12);
    assert_int_equal(get_int(spec, "fast_commits"), passes);
    assert_int_equal(get_int(spec, "full_replays"), 0);
    assert_int_equal(get_int(spec, "failed_fallbacks"), 0);
    json_t *hist = json_object_get(spec, "accept_hist"); /* plain: every pass accepted 0 drafts */
    assert_true(json_is_array(hist) && json_array_size(hist) == 1);
    assert_int_equal(json_integer_value(json_array_get(hist, 0)), passes);
    assert_true(fabs(get_num(spec, "mean_verify_width") - (passes ? 1.0 : 0.0)) < 1e-12);
    assert_true(get_num(spec, "draft_seconds") == 0);
    assert_true(passes == 0 || get_num(spec, "target_seconds") > 0); /* plain passes verify one row */
    assert_int_equal(get_int(spec, "plain_passes"), 0); /* counts passes that could have drafted */

    json_t *ex = json_object_get(j, "experts");
    static const char *const ex_keys[] = { "bytes_read", "hits", "misses", "cache_bytes", "gen_bytes_read",
                                           "prefetched", "prefetch_used" };
    assert_int_equal(json_object_size(ex), 9);
    for (int i = 0; i < 7; i++) /* resident (auto on a small model): every expert use is a hit */
        if (strcmp(ex_keys[i], "hits")) assert_int_equal(get_int(ex, ex_keys[i]), 0);
    assert_true(get_num(ex, "gen_bytes_per_token") == 0);
    assert_true(get_num(ex, "read_seconds") == 0); /* nothing waited for */
    assert_true(get_int(ex, "hits") > 0);
    *n_tokens = n;
    return ids;
}

/* Runs greedy with --json, checks the output against the chain after prompt. */
static void check_greedy_run(const char *args, const int32_t *prompt, int n_prompt, int n) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s -n %d --temp 0 --json", args, n);
    assert_int_equal(run(cmd), 0);
    char *text;
    size_t text_len;
    json_t *j = split_json(&text, &text_len);
    int n_tokens;
    int32_t *ids = check_json(j, &n_tokens);
    assert_int_equal(get_int(j, "n_prompt"), n_prompt);
    int32_t *want = malloc((size_t)n * sizeof *want);
    assert_non_null(want);
    argmax_chain(prompt, n_prompt, want, n);
    /* a chain may end early at an end-of-generation id */
    int n_want = n;
    for (int i = 0; i < n; i++)
        if (em_tok_is_eog(g_tok, want[i])) {
            n_want = i;
            break;
        }
    assert_int_equal(n_tokens, n_want);
    assert_memory_equal(ids, want, (size_t)n_want * sizeof *ids);
    assert_string_equal(json_string_value(json_object_get(j, "finish")), n_want < n ? "stop" : "length");
    /* the text before the JSON line: the decode of the tokens, then a newline if it had none */
    char *dec;
    size_t dec_len;
    OK(em_tok_decode(g_tok, ids, (size_t)n_tokens, EM_TOK_SKIP_SPECIAL, &dec, &dec_len, E));
    size_t expect_len = dec_len + (dec_len && dec[dec_len - 1] != '\n');
    assert_int_equal(text_len, expect_len);
    assert_memory_equal(text, dec, dec_len);
    expect_stderr("tok/s");
    free(dec);
    free(want);
    free(ids);
    free(text);
    json_decref(j);
}

static void test_greedy_json(void **state) {
    (void)state;
    NEED_MODEL();
    const char *text = "Hello there, general";
    int32_t *ids;
    size_t n;
    OK(em_tok_encode(g_tok, text, strlen(text), EM_TOK_PARSE_SPECIAL | EM_TOK_ADD_SPECIAL, &ids, &n, E));
    check_greedy_run("-p 'Hello there, general'", ids, (int)n, 16);
    /* the same prompt from a file */
    char args[800];
    em_test_write(em_test_path("prompt.txt"), text, strlen(text));
    snprintf(args, sizeof args, "-f '%s'", em_test_path("prompt.txt"));
    check_greedy_run(args, ids, (int)n, 16);
    free(ids);

    em_chat_msg m = { .role = "user", .content = "Who are you?" };
    OK(em_chat_encode_kimi(g_tok, &m, 1, true, &ids, &n, E));
    check_greedy_run("--chat -p 'Who are you?' --threads 1 --draft none --device cpu --draft-device cpu "
                     "--moe-storage resident --verify-width 1",
                     ids, (int)n, 20);
    free(ids);
}

static void test_sampled_json(void **state) {
    (void)state;
    NEED_MODEL();
    assert_int_equal(run("-p 'Once upon' -n 12 --temp 1.2 --top-k 20 --top-p 0.9 --min-p 0.01 --seed 5 --json"), 0);
    char *text;
    size_t len;
    json_t *a = split_json(&text, &len);
    int na;
    int32_t *ia = check_json(a, &na);
    free(text);
    assert_int_equal(run("-p 'Once upon' -n 12 --temp 1.2 --top-k 20 --top-p 0.9 --min-p 0.01 --seed 5 --json "
                         "--moe-storage auto"),
                     0);
    json_t *b = split_json(&text, &len);
    int nb;
    int32_t *ib = check_json(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, (size_t)na * sizeof *ia);
    free(text);
    free(ia);
    free(ib);
    json_decref(a);
    json_decref(b);
}

static void test_usage_errors(void **state) {
    (void)state;
    NEED_MODEL();
    assert_int_equal(run(""), 2);
    expect_stderr("exactly one of -p");
    assert_int_equal(run("-p a -f b"), 2);
    assert_int_equal(run("-p a --bogus"), 2);
    expect_stderr("unknown flag '--bogus'");
    assert_int_equal(run("-p a stray"), 2);
    assert_int_equal(run("-p a -n"), 2);
    expect_stderr("-n needs a value");
    assert_int_equal(run("-p a -n 0"), 2);
    assert_int_equal(run("-p a --temp -1"), 2);
    assert_int_equal(run("-p a --temp nan"), 2);
    assert_int_equal(run("-p a --top-p 1.5"), 2);
    assert_int_equal(run("-p a --min-p x"), 2);
    assert_int_equal(run("-p a --seed -1"), 2);
    assert_int_equal(run("-p a --threads 0"), 2);
    assert_int_equal(run("-p a --ctx-size 0"), 2);
    assert_int_equal(run("-p a --device tpu"), 2);
    expect_stderr("is not cpu, auto, cuda or cuda:N");
    assert_int_equal(run("-p a --device cuda:x"), 2);
    assert_int_equal(run("-p a --draft-device auto"), 2);
    assert_int_equal(run("-p a --devices cuda:0,cuda:0"), 2);
    expect_stderr("--devices: cuda:0 is listed twice");
    assert_int_equal(run("-p a --devices cpu"), 2);
    expect_stderr("'cpu' is not cuda:N");
    assert_int_equal(run("-p a --devices cuda:0,cuda:1,cuda:2,cuda:3,cuda:4,cuda:5,cuda:6,cuda:7,cuda:8"), 2);
    expect_stderr("more than 8 devices");
    assert_int_equal(run("-p a --devices ,"), 2);
    expect_stderr("no device in");
    assert_int_equal(run("-p a --moe-storage disk"), 2);
    assert_int_equal(run("-p a --expert-cache 12XB"), 2);
    assert_int_equal(em_test_sh(1, "'%s' run --help", g_bin), 0);
}

static void test_draft_device(void **state) {
    (void)state;
    NEED_MODEL();
    /* a drafter on a device this machine does not have (CI: no driver, or no second GPU) */
    char draft[600], args[900];
    if (em_test_convert_fixture(g_bin, "dspark_deepspec", "f32", draft, sizeof draft)) fail_msg("converting the drafter");
    int n = 0;
    em_err err = { 0 };
    const bool gpus = em_gpu_device_count(&n, &err) == EM_OK && n > 1;
    snprintf(args, sizeof args, "-p a -n 2 --temp 0 --draft '%s' --draft-device cuda:1", draft);
    assert_int_equal(run(args), gpus ? 0 : 1);
    if (!gpus) {
        expect_stderr("CUDA");
        char *out = read_text("out.txt");
        assert_string_equal(out, ""); /* nothing generated */
        free(out);
    }
}

/* --device cuda:N where no GPU can run it (CI: no driver, or a build without CUDA): exit 1 with
 * a message that says why, nothing generated. Where a GPU is there (the device machine) it runs. */
static void test_device(void **state) {
    (void)state;
    NEED_MODEL();
    int n = 0;
    em_err err = { 0 };
    const bool gpu = em_gpu_device_count(&n, &err) == EM_OK && n > 0;
    assert_int_equal(run("-p a -n 2 --device cuda:0 --temp 0"), gpu ? 0 : 1);
    if (!gpu) {
        expect_stderr("CUDA");
        char *out = read_text("out.txt");
        assert_string_equal(out, "");
        free(out);
    }
    assert_int_equal(run("-p a -n 2 --device cuda:1024"), 2); /* not a device name */
    assert_int_equal(run("-p a -n 2 --device cpu --temp 0"), 0);
    assert_int_equal(run("-p a -n 2 --device auto --temp 0"), 0);
}

/* --draft: the DSpark fixture drafter; greedy tokens equal plain decoding's, spec counts drafts. */
static void test_draft(void **state) {
    (void)state;
    NEED_MODEL();
    char draft[600], args[900];
    if (em_test_convert_fixture(g_bin, "dspark_deepspec", "f32", draft, sizeof draft)) fail_msg("converting the drafter");
    assert_int_equal(run("-p 'Once upon' -n 16 --temp 0 --threads 1 --json"), 0);
    char *out = read_text("out.txt");
    const char *plain = strstr(out, "\"tokens\":");
    assert_non_null(plain);
    snprintf(args, sizeof args, "-p 'Once upon' -n 16 --temp 0 --threads 1 --json --draft '%s' --draft-device cpu "
                                "--verify-width 5 --feature-dtype q8_0", draft);
    assert_int_equal(run(args), 0);
    char *text;
    size_t len;
    json_t *j = split_json(&text, &len);
    char *spec_out = read_text("out.txt");
    assert_memory_equal(strstr(spec_out, "\"tokens\":"), plain, (size_t)(strchr(plain, ']') - plain));
    json_t *spec = json_object_get(j, "spec");
    assert_string_equal(json_string_value(json_object_get(j, "device")), "cpu"); /* where each ran */
    assert_string_equal(json_string_value(json_object_get(j, "draft_device")), "cpu");
    assert_true(get_int(spec, "drafted") <= 4 * get_int(spec, "passes")); /* width 5: 4 drafts at most */
    assert_true(get_int(spec, "drafted") > 0 && get_num(spec, "draft_seconds") > 0);
    assert_true(get_num(spec, "mean_verify_width") > 1 && get_num(spec, "mean_verify_width") <= 5);
    assert_int_equal(get_int(spec, "full_replays"), 0);
    json_decref(j);
    free(text);
    free(spec_out);
    /* flags that need --draft, bad values, a missing drafter file */
    assert_int_equal(run("-p a -n 2 --verify-width 4"), 2);
    expect_stderr("needs a drafter");
    assert_int_equal(run("-p a -n 2 --feature-dtype q4_0"), 2);
    expect_stderr("not f32, f16, bf16 or q8_0");
    assert_int_equal(run("-p a -n 2 --spec-policy sometimes"), 2);
    expect_stderr("--spec-policy: 'sometimes' is not auto, nominal or always");
    /* the nominal policy: the same tokens (greedy), and every pass either drafted or counted plain */
    snprintf(args, sizeof args, "-p 'Once upon' -n 16 --temp 0 --threads 1 --json --draft '%s' --spec-policy nominal",
             draft);
    assert_int_equal(run(args), 0);
    j = split_json(&text, &len);
    spec_out = read_text("out.txt");
    assert_memory_equal(strstr(spec_out, "\"tokens\":"), plain, (size_t)(strchr(plain, ']') - plain));
    spec = json_object_get(j, "spec");
    assert_true(get_int(spec, "plain_passes") <= get_int(spec, "passes"));
    json_decref(j);
    free(text);
    free(spec_out);
    snprintf(args, sizeof args, "-p a -n 2 --draft '%s'", em_test_path("nodraft.gguf"));
    assert_int_equal(run(args), 1);
    expect_stderr("nodraft.gguf");
    snprintf(args, sizeof args, "-p a -n 2 --draft '%s' --verify-width 9", draft);
    assert_int_equal(run(args), 1);
    expect_stderr("verify width 9");
    free(out);
    /* a drafter that does not fit (the shipped one: 256 wide, and it taps layer 5 of this
     * 4-layer target): exit 1, naming both files and what differs */
    snprintf(args, sizeof args, "-p a -n 2 --draft '%s'", em_test_src("models/dspark-kimi-linear-19m-q8_0.gguf"));
    assert_int_equal(run(args), 1);
    expect_stderr("dspark-kimi-linear-19m-q8_0.gguf does not fit target");
    expect_stderr(g_model);
    expect_stderr("hidden size 256");
}

/* --spec-memory: a run with a drafter under the auto policy leaves one line for its setup
 * (64 hex digits of key, which kinds are known, 20 numbers); the next run reads it and keeps
 * one line; a damaged file is rewritten, a file that cannot be written is a warning, and off
 * writes nothing; the tokens stay plain greedy's throughout. */
static void test_spec_memory(void **state) {
    (void)state;
    NEED_MODEL();
    char draft[600], args[1400], mem[600];
    if (em_test_convert_fixture(g_bin, "dspark_deepspec", "f32", draft, sizeof draft)) fail_msg("converting the drafter");
    snprintf(mem, sizeof mem, "%s", em_test_path("spec-memory")); /* em_test_path's buffer is reused */
    remove(mem);
    const char *base = "-p 'Once upon' -n 12 --temp 0 --threads 1 --json";
    snprintf(args, sizeof args, "%s --draft none", base);
    assert_int_equal(run(args), 0);
    char *plain = read_text("out.txt");
    for (int i = 0; i < 3; i++) {
        if (i == 2) { /* damaged: a line that is not one, and a key's line with a bad value */
            FILE *f = fopen(mem, "w");
            assert_non_null(f);
            fputs("garbage\n", f);
            fclose(f);
        }
        snprintf(args, sizeof args, "%s --draft '%s' --spec-memory '%s'", base, draft, mem);
        assert_int_equal(run(args), 0);
        char *out = read_text("out.txt");
        assert_memory_equal(strstr(out, "\"tokens\":"), strstr(plain, "\"tokens\":"),
                            (size_t)(strchr(strstr(plain, "\"tokens\":"), ']') - strstr(plain, "\"tokens\":")));
        free(out);
        char *text = read_text("spec-memory");
        int lines = 0, hex = 0, fields = 0;
        for (const char *p = text; *p; p++) lines += *p == '\n';
        while (hex < 64 && ((text[hex] >= '0' && text[hex] <= '9') || (text[hex] >= 'a' && text[hex] <= 'f'))) hex++;
        for (char *t = strtok(text, " \n"); t; t = strtok(NULL, " \n")) fields++;
        assert_int_equal(lines, 1);
        assert_int_equal(hex, 64);
        assert_int_equal(fields, 2 + 20);
        free(text);
    }
    /* a line for this setup whose numbers are out of range: a warning, the run goes on */
    char *text = read_text("spec-memory");
    FILE *f = fopen(mem, "w");
    assert_non_null(f);
    fprintf(f, "%.64s 1 5000 0 0 0 0 0 0 0 32 0 0 0 0 0 0 0 0 0 32 0\n", text);
    fclose(f);
    free(text);
    assert_int_equal(run(args), 0);
    expect_stderr("governor value 0");
    /* where nothing can be written: a warning */
    snprintf(args, sizeof args, "%s --draft '%s' --spec-memory /proc/ember-no/such/file", base, draft);
    assert_int_equal(run(args), 0);
    expect_stderr("not written");
    /* off: no file */
    remove(mem);
    snprintf(args, sizeof args, "%s --draft '%s' --spec-memory off", base, draft);
    assert_int_equal(run(args), 0);
    assert_false(em_file_exists(mem));
    free(plain);
}

/* Runs `EMBER_MODELS=DIR ember run ARGS` (no -m unless ARGS has one). */
static int run_default(const char *dir, const char *args) {
    return em_test_sh(1, "EMBER_MODELS='%s' '%s' run %s", dir, g_bin, args);
}

/* The drafted count of the JSON line of the last run. */
static json_int_t last_drafted(void) {
    char *text;
    size_t len;
    json_t *j = split_json(&text, &len);
    json_int_t d = get_int(json_object_get(j, "spec"), "drafted");
    json_decref(j);
    free(text);
    return d;
}

/* Without -m: the default pair from $EMBER_MODELS (here the fixtures under the pair's names). */
static void test_default_pair(void **state) {
    (void)state;
    NEED_MODEL();
    char draft[600], dir[600], only[600];
    if (em_test_convert_fixture(g_bin, "dspark_deepspec", "f32", draft, sizeof draft)) fail_msg("converting the drafter");
    snprintf(dir, sizeof dir, "%s", em_test_path("pair"));
    snprintf(only, sizeof only, "%s", em_test_path("target_only"));
    assert_int_equal(em_test_sh(0, "mkdir -p '%s' '%s' && ln -sf '%s' '%s/" EM_TEST_DEFAULT_TARGET "' && "
                                   "ln -sf '%s' '%s/" EM_TEST_DEFAULT_DRAFT "' && ln -sf '%s' '%s/" EM_TEST_DEFAULT_TARGET "'",
                                dir, only, g_model, dir, draft, dir, g_model, only),
                     0);
    assert_int_equal(run("-p 'Once upon' -n 12 --temp 0 --threads 1 --json"), 0);
    char *plain = read_text("out.txt");
    char *plain_tokens = strstr(plain, "\"tokens\":");
    assert_non_null(plain_tokens);
    size_t n_cmp = (size_t)(strchr(plain_tokens, ']') - plain_tokens);

    /* no -m, no --draft: the default target with the default drafter */
    assert_int_equal(run_default(dir, "-p 'Once upon' -n 12 --temp 0 --threads 1 --json --verify-width 4"), 0);
    char *out = read_text("out.txt");
    assert_non_null(strstr(out, "\"tokens\":"));
    assert_memory_equal(strstr(out, "\"tokens\":"), plain_tokens, n_cmp);
    free(out);
    assert_true(last_drafted() > 0);
    expect_stderr("speculative:");
    /* --draft none: the default target alone */
    assert_int_equal(run_default(dir, "-p 'Once upon' -n 12 --temp 0 --threads 1 --json --draft none"), 0);
    assert_int_equal(last_drafted(), 0);
    /* -m without --draft: no drafter, whatever the default */
    char args[900];
    snprintf(args, sizeof args, "-m '%s' -p 'Once upon' -n 4 --temp 0 --json", g_model);
    assert_int_equal(run_default(dir, args), 0);
    assert_int_equal(last_drafted(), 0);
    /* no -m, --draft FILE: the default target with that drafter (drafting every pass: a
     * governed run of 4 tokens may spend its one probe on a pass whose keep test drafts none) */
    snprintf(args, sizeof args, "-p 'Once upon' -n 4 --temp 0 --json --spec-policy always --draft '%s'", draft);
    assert_int_equal(run_default(only, args), 0);
    assert_true(last_drafted() > 0);
    /* missing files: exit 1, naming what is missing and where it looked */
    assert_int_equal(run_default(em_test_path("nowhere"), "-p a -n 2"), 1);
    expect_stderr(EM_TEST_DEFAULT_TARGET);
    expect_stderr("nowhere");
    assert_int_equal(run_default(only, "-p a -n 2"), 1);
    expect_stderr(EM_TEST_DEFAULT_DRAFT);
    expect_stderr("--draft none");
    assert_int_equal(run_default(only, "-p a -n 2 --draft none"), 0);
    free(plain);
}

static void test_failures(void **state) {
    (void)state;
    NEED_MODEL();
    assert_int_equal(run("-p 'Hello there, general' --ctx-size 3"), 1);
    expect_stderr("does not fit in the context of 3 positions");
    assert_int_equal(em_test_sh(1, "'%s' run -m '%s' -p a", g_bin, em_test_path("missing.gguf")), 1);
    expect_stderr("missing.gguf");
    assert_int_equal(run("-f /nonexistent/prompt.txt"), 1);
    expect_stderr("/nonexistent/prompt.txt");
    assert_int_equal(run("-p ''"), 1);
    expect_stderr("empty");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_json),  cmocka_unit_test(test_sampled_json), cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_draft_device),
        cmocka_unit_test(test_device),      cmocka_unit_test(test_failures),
        cmocka_unit_test(test_draft),        cmocka_unit_test(test_default_pair),
        cmocka_unit_test(test_spec_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
