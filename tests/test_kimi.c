/* Tests for the kimi-linear target (model/): the committed fixtures converted to GGUF by the
 * CLI (`$EMBER_BIN convert`, so these tests do not depend on the converter's internals), run
 * through the target interface and compared with transformers 5.17's fp32 logits
 * (tests/fixtures/ref/manifest.json).
 *
 *  - F32 conversions: max |d| <= 1e-3 * max |logit| at every position. The routing Ember
 *    chose is compared with the reference's at every MoE layer and position; a differing
 *    choice is accepted only as a near tie (reference margin < TIE_MARGIN), is reported, and
 *    the positions from there on (which see that row through KDA/MLA state) are left out of
 *    the logit check (the tolerance itself never changes). A differing choice with a clear
 *    margin fails.
 *  - the BF16 checkpoint (kimi_b_bf16) converted to BF16: <= 1e-2 relative.
 *  - Q8_0 conversions: argmax agreement and mean KL(transformers || ember). The issue's
 *    criterion (argmax >= 98% of positions, mean KL < 1e-3 per sequence) is asserted on kimi_c,
 *    the fixture made with a trained model's conditioning (tools/fixtures/README.md): kimi_a/b
 *    are chaotic random models whose ~1% weight error grows to KL 0.01-0.4 in any engine
 *    (llama.cpp's run of the same Q8_0 files matches Ember's to 1e-6, tests/kimi_llama.sh), so
 *    on them the numbers are printed and only a sanity floor is asserted.
 *  - features: the residual stream after layers 0..2 against transformers' hidden states.
 *  - decoding: prefill 32, then one token at a time, then a block of 8 through verify, gives
 *    the logits of the full forward (1e-4 relative).
 *  - verify/commit: for n in 1..8 and every k <= n, verify(n) + commit(k) leaves the state
 *    that feeding the k tokens one at a time leaves (the following logits within 1e-5
 *    relative); verify leaves the committed state untouched; wide verifies (past max_verify)
 *    commit by replay.
 *  - row requests (em_rows): for every verify width 1..16 (and 40, past max_verify and the LM
 *    head's row groups) argmax-only rows equal the greedy choice (an independent argmax, and
 *    the sampler's greedy) of the full-logits rows; logits asked for some rows (masks, mixed
 *    with argmaxes) are the full request's floats bit for bit and leave the other rows' slots
 *    untouched; prompts' last-row argmax; on kimi_a (F32, Q8_0) and a K3 file (AttnRes on);
 *    masks without their buffer or with last_only are refused with a message.
 *  - bad input: missing / misshapen tensors, keys of the wrong type, unknown architecture,
 *    token ids out of range, prompts longer than the context, commit misuse; the CLI's exits.
 */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compat/k3_synth.h"
#include "format/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "sample/sample.h"

#define TIE_MARGIN 1e-3 /* routing margins below this are near ties */

static json_t *manifest;
static bool have_models;

/* ---- fixtures --------------------------------------------------------------------------- */

static const char *model_path(const char *cfg, const char *type) {
    static char buf[8][512];
    static int slot;
    char *p = buf[slot++ % 8];
    snprintf(p, 512, "%s/%s_%s.gguf", em_test_dir(), cfg, type);
    return p;
}

static int setup(void **state) {
    (void)state;
    json_error_t jerr;
    manifest = json_load_file(em_test_src("tests/fixtures/ref/manifest.json"), 0, &jerr);
    if (!manifest) {
        fprintf(stderr, "manifest: %s\n", jerr.text);
        return -1;
    }
    const char *bin = getenv("EMBER_BIN");
    if (!bin) {
        fprintf(stderr, "EMBER_BIN is not set: model tests are skipped\n");
        return 0;
    }
    static const char *const convs[][2] = {
        { "kimi_a", "f32" }, { "kimi_a", "q8_0" }, { "kimi_b", "f32" }, { "kimi_b", "q8_0" },
        { "kimi_b_bf16", "bf16" }, { "kimi_b_bf16", "q8_0" }, { "kimi_c", "f32" }, { "kimi_c", "q8_0" },
    };
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) {
        char path[600]; /* model_path(convs[i][0], convs[i][1]) */
        if (em_test_convert_fixture(bin, convs[i][0], convs[i][1], path, sizeof path)) return -1;
    }
    have_models = true;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    json_decref(manifest);
    return 0;
}

#define NEED_MODELS()                                       \
    do {                                                    \
        if (!have_models) {                                 \
            skip();                                         \
        }                                                   \
    } while (0)

static json_t *sequences(const char *cfg) {
    json_t *s = json_object_get(json_object_get(json_object_get(manifest, "configs"), cfg), "sequences");
    assert_non_null(s);
    return s;
}

/* A sequence's tokens (malloc'd) and count. */
static int32_t *seq_tokens(json_t *seq, int *n) {
    json_t *t = json_object_get(seq, "tokens");
    *n = (int)json_array_size(t);
    int32_t *v = malloc((size_t)*n * sizeof *v);
    assert_non_null(v);
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(t, (size_t)i));
    return v;
}

static float *seq_logits(json_t *seq, int n, int vocab) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/%s", json_string_value(json_object_get(seq, "logits_file")));
    return em_test_read_f32(em_test_src(rel), (size_t)n * (size_t)vocab);
}

static em_target *open_model(const char *path, const em_model_opts *opts) {
    em_target *t = NULL;
    em_err err = { 0 };
    if (em_model_open(&t, path, opts, &err)) fail_msg("open %s: %s", path, err.msg);
    return t;
}

static float row_max_abs(const float *r, int v) {
    float m = 0;
    for (int i = 0; i < v; i++) m = fmaxf(m, fabsf(r[i]));
    return m;
}

static float row_max_diff(const float *a, const float *b, int v) {
    float m = 0;
    for (int i = 0; i < v; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

static int argmax(const float *r, int v) {
    int b = 0;
    for (int i = 1; i < v; i++)
        if (r[i] > r[b]) b = i;
    return b;
}

/* KL(p || q) of the softmaxes of logits p and q, in double. */
static double kl_div(const float *p, const float *q, int v) {
    double mp = p[argmax(p, v)], mq = q[argmax(q, v)], sp = 0, sq = 0;
    for (int i = 0; i < v; i++) {
        sp += exp(p[i] - mp);
        sq += exp(q[i] - mq);
    }
    double lp = log(sp), lq = log(sq), kl = 0;
    for (int i = 0; i < v; i++) {
        double a = p[i] - mp - lp, b = q[i] - mq - lq;
        kl += exp(a) * (a - b);
    }
    return kl;
}

static int cmp_int(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

/* The first position (or n) where Ember's routing differs from the reference's. A difference
 * with a clear reference margin fails the test; a near tie is reported. */
static int first_route_flip(json_t *seq, const em_target_info *info, const int32_t *routes, int n,
                            const char *what, bool strict) {
    json_t *router = json_object_get(seq, "router");
    assert_int_equal(json_array_size(router), (size_t)info->n_moe_layers);
    int K = info->n_route / (info->n_moe_layers ? info->n_moe_layers : 1), first = n, flips = 0;
    for (int m = 0; m < info->n_moe_layers; m++) {
        json_t *r = json_array_get(router, (size_t)m);
        json_t *experts = json_object_get(r, "experts"), *em = json_object_get(r, "expert_margin");
        json_t *gm = json_object_get(r, "group_margin");
        for (int t = 0; t < n; t++) {
            int32_t mine[64], want[64];
            assert_true(K <= 64);
            json_t *row = json_array_get(experts, (size_t)t);
            assert_int_equal(json_array_size(row), (size_t)K);
            for (int i = 0; i < K; i++) {
                mine[i] = routes[(int64_t)t * info->n_route + m * K + i];
                want[i] = (int32_t)json_integer_value(json_array_get(row, (size_t)i));
            }
            qsort(mine, (size_t)K, sizeof *mine, cmp_int);
            qsort(want, (size_t)K, sizeof *want, cmp_int);
            if (!memcmp(mine, want, (size_t)K * sizeof *mine)) continue;
            double margin = json_number_value(json_array_get(em, (size_t)t));
            if (json_is_array(gm)) margin = fmin(margin, json_number_value(json_array_get(gm, (size_t)t)));
            if (strict) {
                print_message("   %s: routing differs at MoE layer %lld position %d (reference margin %.3g)\n", what,
                              (long long)json_integer_value(json_object_get(r, "layer")), t, margin);
                if (margin >= TIE_MARGIN)
                    fail_msg("%s: expert choice differs at position %d with a clear margin %.3g", what, t, margin);
            }
            flips++;
            if (t < first) first = t;
        }
    }
    if (!strict && flips) print_message("   %s: routing differs from the reference at %d (layer, position) pairs\n", what, flips);
    return first;
}

typedef struct run_result {
    float *logits;
    int32_t *routes;
    int n, vocab;
    const em_target_info *info;
} run_result;

/* One full-sequence forward (prefill from an empty state) with logits and routes. */
static void run_seq(em_target *t, const int32_t *tok, int n, run_result *r) {
    r->info = em_target_get_info(t);
    r->n = n;
    r->vocab = r->info->n_vocab;
    r->logits = malloc((size_t)n * (size_t)r->vocab * sizeof(float));
    r->routes = malloc(((size_t)n * (size_t)r->info->n_route + 1) * sizeof(int32_t));
    float *margins = malloc(((size_t)n * (size_t)r->info->n_moe_layers + 1) * sizeof(float));
    assert_true(r->logits && r->routes && margins);
    em_target_reset(t);
    em_rows rows = { .logits = r->logits, .routes = r->routes, .route_margins = margins };
    em_err err = { 0 };
    if (em_target_prefill(t, tok, n, &rows, &err)) fail_msg("prefill: %s", err.msg);
    for (int i = 0; i < n * r->info->n_moe_layers; i++) assert_true(margins[i] >= 0.0f);
    free(margins);
}

/* ---- comparisons with transformers ------------------------------------------------------ */

static void check_close(const char *cfg, const char *type, double rel_tol) {
    em_target *t = open_model(model_path(cfg, type), NULL);
    json_t *seqs = sequences(cfg);
    for (size_t s = 0; s < json_array_size(seqs); s++) {
        json_t *seq = json_array_get(seqs, s);
        int n;
        int32_t *tok = seq_tokens(seq, &n);
        run_result r;
        run_seq(t, tok, n, &r);
        float *ref = seq_logits(seq, n, r.vocab);
        char what[96];
        snprintf(what, sizeof what, "%s %s %s", cfg, type, json_string_value(json_object_get(seq, "name")));
        int flip = first_route_flip(seq, r.info, r.routes, n, what, true);
        double worst = 0;
        for (int p = 0; p < flip; p++) {
            const float *a = r.logits + (int64_t)p * r.vocab, *b = ref + (int64_t)p * r.vocab;
            double rel = row_max_diff(a, b, r.vocab) / row_max_abs(b, r.vocab);
            if (rel > worst) worst = rel;
            if (rel > rel_tol) fail_msg("%s: position %d: max |d| / max |logit| = %.3g > %.3g", what, p, rel, rel_tol);
        }
        print_message("   %s: %d positions, max |d| / max |logit| = %.3g%s\n", what, flip, worst,
                      flip < n ? " (positions after a near-tie routing flip left out)" : "");
        free(tok);
        free(ref);
        free(r.logits);
        free(r.routes);
    }
    em_target_close(t);
}

static void test_f32_vs_transformers(void **state) {
    (void)state;
    NEED_MODELS();
    check_close("kimi_a", "f32", 1e-3);
    check_close("kimi_b", "f32", 1e-3);
    check_close("kimi_c", "f32", 1e-3);
}

static void test_bf16_vs_transformers(void **state) {
    (void)state;
    NEED_MODELS();
    check_close("kimi_b_bf16", "bf16", 1e-2);
}

/* strict: the criterion (argmax >= 98% over all positions, mean KL < 1e-3 for every
 * sequence); else only a sanity floor (see the top of this file). */
static void check_q8(const char *cfg, bool strict) {
    em_target *t = open_model(model_path(cfg, "q8_0"), NULL);
    json_t *seqs = sequences(cfg);
    int agree_total = 0, n_total = 0;
    for (size_t s = 0; s < json_array_size(seqs); s++) {
        json_t *seq = json_array_get(seqs, s);
        int n;
        int32_t *tok = seq_tokens(seq, &n);
        run_result r;
        run_seq(t, tok, n, &r);
        float *ref = seq_logits(seq, n, r.vocab);
        char what[96];
        snprintf(what, sizeof what, "%s q8_0 %s", cfg, json_string_value(json_object_get(seq, "name")));
        int flip = first_route_flip(seq, r.info, r.routes, n, what, false);
        int agree_all = 0, agree_pre = 0;
        double kl_all = 0, kl_pre = 0;
        for (int p = 0; p < n; p++) {
            const float *a = r.logits + (int64_t)p * r.vocab, *b = ref + (int64_t)p * r.vocab;
            int same = argmax(a, r.vocab) == argmax(b, r.vocab);
            double kl = kl_div(b, a, r.vocab);
            agree_all += same;
            kl_all += kl;
            if (p < flip) {
                agree_pre += same;
                kl_pre += kl;
            }
        }
        print_message("   %s: whole sequence: argmax %d/%d, mean KL %.3g; before the first routing flip "
                      "(%d positions): argmax %d/%d, mean KL %.3g\n",
                      what, agree_all, n, kl_all / n, flip, agree_pre, flip, flip ? kl_pre / flip : 0.0);
        agree_total += agree_all;
        n_total += n;
        if (strict && kl_all / n >= 1e-3) fail_msg("%s: mean KL %.3g (limit 1e-3)", what, kl_all / n);
        if (agree_all < 0.5 * n) fail_msg("%s: argmax agrees at only %d of %d positions", what, agree_all, n);
        if (kl_all / n >= 1.0) fail_msg("%s: mean KL %.3g", what, kl_all / n);
        free(tok);
        free(ref);
        free(r.logits);
        free(r.routes);
    }
    print_message("   %s q8_0: argmax agrees at %d of %d positions (%.1f%%)\n", cfg, agree_total, n_total,
                  100.0 * agree_total / n_total);
    if (strict && agree_total < 0.98 * n_total)
        fail_msg("%s q8_0: argmax agrees at %d of %d positions (< 98%%)", cfg, agree_total, n_total);
    em_target_close(t);
}

static void test_q8_0_vs_transformers(void **state) {
    (void)state;
    NEED_MODELS();
    check_q8("kimi_c", true);
    check_q8("kimi_a", false);
    check_q8("kimi_b", false);
    check_q8("kimi_b_bf16", false);
}

/* The residual stream after layers 0..2 (captured features) against transformers'
 * output_hidden_states[l + 1]. */
static void test_features(void **state) {
    (void)state;
    NEED_MODELS();
    const int layers[3] = { 0, 1, 2 };
    em_model_opts opts = { .feature_layers = layers, .n_feature_layers = 3 };
    em_target *t = open_model(model_path("kimi_a", "f32"), &opts);
    const em_target_info *info = em_target_get_info(t);
    assert_int_equal(info->n_feat, 3 * 96);
    json_t *seqs = sequences("kimi_a");
    for (size_t s = 0; s < json_array_size(seqs); s++) {
        json_t *seq = json_array_get(seqs, s);
        json_t *hf = json_object_get(seq, "hidden_file");
        if (!json_is_string(hf)) continue;
        int n;
        int32_t *tok = seq_tokens(seq, &n);
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/%s", json_string_value(hf));
        float *ref = em_test_read_f32(em_test_src(rel), (size_t)3 * n * 96);
        float *feat = malloc((size_t)n * info->n_feat * sizeof(float));
        em_rows rows = { .features = feat, .logits = NULL };
        em_target_reset(t);
        assert_int_equal(em_target_prefill(t, tok, n, &rows, NULL), 0);
        double worst = 0;
        for (int l = 0; l < 3; l++)
            for (int p = 0; p < n; p++)
                for (int i = 0; i < 96; i++) {
                    double d = fabs(feat[(int64_t)p * info->n_feat + l * 96 + i] - ref[((int64_t)l * n + p) * 96 + i]);
                    if (d > worst) worst = d;
                }
        print_message("   kimi_a %s features: max |d| = %.3g\n", json_string_value(json_object_get(seq, "name")), worst);
        assert_true(worst < 1e-4);
        free(tok);
        free(ref);
        free(feat);
    }
    em_target_close(t);
}

/* ---- decoding and speculation ------------------------------------------------------------- */

static void verify_rows(em_target *t, const int32_t *tok, int n, float *logits) {
    em_rows rows = { .logits = logits };
    em_err err = { 0 };
    if (em_target_verify(t, tok, n, &rows, &err)) fail_msg("verify %d: %s", n, err.msg);
}

static void commit_rows(em_target *t, int k) {
    em_err err = { 0 };
    if (em_target_commit(t, k, &err)) fail_msg("commit %d: %s", k, err.msg);
}

static void expect_rows_close(const float *a, const float *b, int n, int vocab, double rel_tol, const char *what) {
    for (int p = 0; p < n; p++) {
        const float *x = a + (int64_t)p * vocab, *y = b + (int64_t)p * vocab;
        double rel = row_max_diff(x, y, vocab) / row_max_abs(y, vocab);
        if (rel > rel_tol) fail_msg("%s: row %d differs by %.3g relative (> %.3g)", what, p, rel, rel_tol);
    }
}

/* prefill 32, then one token at a time, then a block of 8 through verify: the logits of one
 * full-sequence forward. */
static void check_decode(const char *cfg) {
    em_target *t = open_model(model_path(cfg, "f32"), NULL);
    json_t *seq = json_array_get(sequences(cfg), 2);
    int n;
    int32_t *tok = seq_tokens(seq, &n);
    assert_true(n >= 48);
    run_result full;
    run_seq(t, tok, n, &full);
    const int V = full.vocab, P = 32, B = 8;
    float *got = malloc((size_t)n * V * sizeof(float));
    em_target_reset(t);
    em_rows rows = { .logits = got };
    assert_int_equal(em_target_prefill(t, tok, P, &rows, NULL), 0);
    assert_int_equal(em_target_position(t), P);
    int p = P;
    for (; p < n - B; p++) {
        verify_rows(t, tok + p, 1, got + (int64_t)p * V);
        commit_rows(t, 1);
    }
    verify_rows(t, tok + p, B, got + (int64_t)p * V);
    commit_rows(t, B);
    assert_int_equal(em_target_position(t), n);
    expect_rows_close(got, full.logits, n, V, 1e-4, cfg);
    double worst = 0;
    for (int i = 0; i < n; i++)
        worst = fmax(worst, row_max_diff(got + (int64_t)i * V, full.logits + (int64_t)i * V, V) /
                                row_max_abs(full.logits + (int64_t)i * V, V));
    print_message("   %s: decode vs full forward: max relative %.3g\n", cfg, worst);
    free(got);
    free(tok);
    free(full.logits);
    free(full.routes);
    em_target_close(t);
}

static void test_decode_matches_full_forward(void **state) {
    (void)state;
    NEED_MODELS();
    check_decode("kimi_a");
    check_decode("kimi_b");
}

/* verify(n) + commit(k) == feeding k tokens one at a time, for n in 1..8 and k in 0..n: the
 * logits of the 3 rows that follow agree (1e-5 relative); and verify leaves the committed
 * state alone (the same verify twice gives the same rows). */
static void check_verify_commit(const char *cfg) {
    em_target *t = open_model(model_path(cfg, "f32"), NULL), *ref = open_model(model_path(cfg, "f32"), NULL);
    json_t *seq = json_array_get(sequences(cfg), 1);
    int n_tok;
    int32_t *tok = seq_tokens(seq, &n_tok);
    const int P = 20, F = 3;
    assert_true(n_tok >= P + 8 + F);
    const int V = em_target_get_info(t)->n_vocab;
    float *a = malloc((size_t)8 * V * sizeof(float)), *b = malloc((size_t)8 * V * sizeof(float));
    float *a2 = malloc((size_t)8 * V * sizeof(float));
    /* ref: feeds one token at a time from P, remembering nothing: rebuilt per k */
    for (int n = 1; n <= 8; n++) {
        for (int k = 0; k <= n; k++) {
            em_target_reset(t);
            assert_int_equal(em_target_prefill(t, tok, P, &(em_rows){ 0 }, NULL), 0);
            verify_rows(t, tok + P, n, a);
            verify_rows(t, tok + P, n, a2); /* again: the committed state was not touched */
            assert_memory_equal(a, a2, (size_t)n * V * sizeof(float));
            commit_rows(t, k);
            assert_int_equal(em_target_position(t), P + k);
            verify_rows(t, tok + P + k, F, a);

            em_target_reset(ref);
            assert_int_equal(em_target_prefill(ref, tok, P, &(em_rows){ 0 }, NULL), 0);
            for (int i = 0; i < k; i++) {
                verify_rows(ref, tok + P + i, 1, b);
                commit_rows(ref, 1);
            }
            verify_rows(ref, tok + P + k, F, b);
            char what[64];
            snprintf(what, sizeof what, "%s verify(%d) commit(%d)", cfg, n, k);
            expect_rows_close(a, b, F, V, 1e-5, what);
        }
    }
    assert_true(t->stats.fast_commits > 0);
    assert_int_equal(t->stats.full_replays, 0);
    free(a);
    free(a2);
    free(b);
    free(tok);
    em_target_close(t);
    em_target_close(ref);
}

static void test_verify_commit(void **state) {
    (void)state;
    NEED_MODELS();
    check_verify_commit("kimi_a");
    check_verify_commit("kimi_b");
}

/* A verify wider than max_verify is committed by replaying the accepted tokens; the result is
 * the same as a fast commit. */
static void test_wide_verify_replays(void **state) {
    (void)state;
    NEED_MODELS();
    em_model_opts narrow = { .max_verify = 2 };
    em_target *t = open_model(model_path("kimi_a", "f32"), &narrow), *ref = open_model(model_path("kimi_a", "f32"), NULL);
    json_t *seq = json_array_get(sequences("kimi_a"), 1);
    int n;
    int32_t *tok = seq_tokens(seq, &n);
    const int V = em_target_get_info(t)->n_vocab;
    float *a = malloc((size_t)8 * V * sizeof(float)), *b = malloc((size_t)8 * V * sizeof(float));
    assert_int_equal(em_target_prefill(t, tok, 10, &(em_rows){ 0 }, NULL), 0);
    assert_int_equal(em_target_prefill(ref, tok, 10, &(em_rows){ 0 }, NULL), 0);
    verify_rows(t, tok + 10, 6, a);
    verify_rows(ref, tok + 10, 6, b);
    expect_rows_close(a, b, 6, V, 1e-6, "wide verify rows");
    commit_rows(t, 4);
    commit_rows(ref, 4);
    assert_int_equal(t->stats.full_replays, 1);
    assert_int_equal(ref->stats.full_replays, 0);
    verify_rows(t, tok + 14, 3, a);
    verify_rows(ref, tok + 14, 3, b);
    expect_rows_close(a, b, 3, V, 1e-5, "after a replayed commit");
    free(a);
    free(b);
    free(tok);
    em_target_close(t);
    em_target_close(ref);
}

/* One thread and two give the same logits bit for bit (work is split by rows and heads). */
static void test_threads_agree(void **state) {
    (void)state;
    NEED_MODELS();
    em_model_opts one = { .n_threads = 1 }, two = { .n_threads = 2 };
    em_target *a = open_model(model_path("kimi_b", "q8_0"), &one), *b = open_model(model_path("kimi_b", "q8_0"), &two);
    json_t *seq = json_array_get(sequences("kimi_b"), 2);
    int n;
    int32_t *tok = seq_tokens(seq, &n);
    run_result ra, rb;
    run_seq(a, tok, n, &ra);
    run_seq(b, tok, n, &rb);
    assert_memory_equal(ra.logits, rb.logits, (size_t)n * ra.vocab * sizeof(float));
    free(ra.logits);
    free(rb.logits);
    free(ra.routes);
    free(rb.routes);
    free(tok);
    em_target_close(a);
    em_target_close(b);
}

/* Every row of a verify is bit for bit the row a one-token decoding step gives for that token
 * (a row never depends on the rows it is verified with): after a prefill of 18, verifies of
 * 2..8 rows (Q8_0 and f32 weights, one and two threads) against verify(1) + commit(1) token
 * by token on a second target, the two advancing together. */
static void check_verify_rows_exact(const char *cfg, const char *type, int threads) {
    em_model_opts opts = { .n_threads = threads };
    em_target *t = open_model(model_path(cfg, type), &opts), *ref = open_model(model_path(cfg, type), &opts);
    int n;
    int32_t *tok = seq_tokens(json_array_get(sequences(cfg), 2), &n);
    const int P = 18, V = em_target_get_info(t)->n_vocab;
    assert_true(n >= P + 35);
    assert_int_equal(em_target_prefill(t, tok, P, &(em_rows){ 0 }, NULL), 0);
    assert_int_equal(em_target_prefill(ref, tok, P, &(em_rows){ 0 }, NULL), 0);
    float *a = malloc((size_t)8 * V * sizeof *a), *b = malloc((size_t)8 * V * sizeof *b);
    assert_true(a && b);
    int p = P;
    for (int w = 2; w <= 8; p += w, w++) {
        verify_rows(t, tok + p, w, a);
        commit_rows(t, w);
        for (int i = 0; i < w; i++) {
            verify_rows(ref, tok + p + i, 1, b + (int64_t)i * V);
            commit_rows(ref, 1);
        }
        for (int i = 0; i < w; i++)
            if (memcmp(a + (int64_t)i * V, b + (int64_t)i * V, (size_t)V * sizeof *a))
                fail_msg("%s %s, %d threads: row %d of a verify of %d at %d differs from its decoding step", cfg, type,
                         threads, i, w, p);
    }
    free(a);
    free(b);
    free(tok);
    em_target_close(t);
    em_target_close(ref);
}

static void test_verify_rows_exact(void **state) {
    (void)state;
    NEED_MODELS();
    check_verify_rows_exact("kimi_a", "q8_0", 2);
    check_verify_rows_exact("kimi_b", "q8_0", 2);
    check_verify_rows_exact("kimi_b", "q8_0", 1);
    check_verify_rows_exact("kimi_a", "f32", 2);
}


/* ---- row requests ------------------------------------------------------------------------ */

/* The greedy choice of a row, written out: the first largest non-NaN logit, -1 without any
 * usable one (all NaN or -inf). */
static int32_t greedy_of(const float *r, int v) {
    int32_t b = -1;
    for (int i = 0; i < v; i++)
        if (!isnan(r[i]) && (b < 0 || r[i] > r[b])) b = i;
    return b >= 0 && r[b] != -INFINITY ? b : -1;
}

#define SENT_BYTE 0xA5
#define SENT_ID (-7)

static bool untouched(const float *row, int v) {
    const unsigned char *b = (const unsigned char *)row;
    for (size_t i = 0; i < (size_t)v * sizeof *row; i++)
        if (b[i] != SENT_BYTE) return false;
    return true;
}

static void check_row_requests(const char *path, const char *what) {
    em_target *t = open_model(path, &(em_model_opts){ .n_threads = 2 });
    const int V = em_target_get_info(t)->n_vocab, P = 5, WMAX = 40;
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (int32_t)((i * 37 + 5) % V);
    OK(em_target_prefill(t, tok, P, NULL, E));
    float *full = malloc((size_t)WMAX * V * sizeof *full), *got = malloc((size_t)WMAX * V * sizeof *got);
    assert_true(full && got);
    int32_t am[64], am2[64];
    bool lmask[64], amask[64];
    em_sampler *greedy;
    OK(em_sampler_create(&greedy, &(em_sampler_params){ .temperature = 0 }, V, E));
    for (int w = 1; w <= WMAX; w = w < 16 ? w + 1 : WMAX + (w == WMAX)) {
        const int32_t *rt = tok + P;
        OK(em_target_verify(t, rt, w, &(em_rows){ .logits = full }, E));
        /* argmaxes only */
        for (int i = 0; i < w; i++) am[i] = SENT_ID;
        OK(em_target_verify(t, rt, w, &(em_rows){ .argmax = am }, E));
        for (int i = 0; i < w; i++) {
            const float *row = full + (int64_t)i * V;
            int32_t sid;
            OK(em_sampler_sample(greedy, row, &sid, E));
            if (am[i] != greedy_of(row, V) || am[i] != sid)
                fail_msg("%s width %d row %d: argmax %d, the full row's greedy choice %d (sampler %d)", what, w, i, am[i],
                         greedy_of(row, V), sid);
        }
        /* both at once: the same floats and argmaxes */
        memset(got, SENT_BYTE, (size_t)w * V * sizeof *got);
        OK(em_target_verify(t, rt, w, &(em_rows){ .logits = got, .argmax = am2 }, E));
        assert_memory_equal(got, full, (size_t)w * V * sizeof *got);
        assert_memory_equal(am2, am, (size_t)w * sizeof *am);
        /* some rows' logits, other rows' argmaxes: requested rows bit for bit, the rest untouched */
        for (int pat = 0; pat < 3; pat++) {
            for (int i = 0; i < w; i++) {
                lmask[i] = pat == 0 ? i % 3 == 1 : pat == 1 ? i == w - 1 : i % 2 == 0;
                amask[i] = pat == 0 ? i % 2 == 0 : pat == 1 ? i < w / 2 : i % 4 == 1;
                am2[i] = SENT_ID;
            }
            memset(got, SENT_BYTE, (size_t)w * V * sizeof *got);
            OK(em_target_verify(t, rt, w, &(em_rows){ .logits = got, .logit_rows = lmask, .argmax = am2, .argmax_rows = amask }, E));
            for (int i = 0; i < w; i++) {
                const float *g = got + (int64_t)i * V, *f = full + (int64_t)i * V;
                if (lmask[i] ? memcmp(g, f, (size_t)V * sizeof *g) != 0 : !untouched(g, V))
                    fail_msg("%s width %d pattern %d row %d: logits %s", what, w, pat, i,
                             lmask[i] ? "differ from the full request's" : "written though not asked for");
                assert_int_equal(am2[i], amask[i] ? am[i] : SENT_ID);
            }
        }
        assert_int_equal(em_target_position(t), P); /* verifies only */
    }
    /* a prompt's last row: its argmax alone, its logits alone, as a full prefill gives them */
    em_target_reset(t);
    OK(em_target_prefill(t, tok, 20, &(em_rows){ .logits = full }, E));
    int32_t last = SENT_ID;
    em_target_reset(t);
    OK(em_target_prefill(t, tok, 20, &(em_rows){ .argmax = &last, .last_only = true }, E));
    assert_int_equal(last, greedy_of(full + (int64_t)19 * V, V));
    em_target_reset(t);
    OK(em_target_prefill(t, tok, 20, &(em_rows){ .logits = got, .last_only = true }, E));
    assert_memory_equal(got, full + (int64_t)19 * V, (size_t)V * sizeof *got);

    /* requests that make no sense: refused, nothing written, the target as it was */
    em_err err = { 0 };
    am[0] = SENT_ID;
    const struct {
        em_rows rows;
        const char *needle;
    } bads[] = {
        { { .logit_rows = lmask, .argmax = am }, "logit_rows given without a logits buffer" },
        { { .argmax_rows = amask, .logits = got }, "argmax_rows given without an argmax buffer" },
        { { .logits = got, .logit_rows = lmask, .last_only = true }, "last_only with a logit_rows mask" },
        { { .argmax = am, .argmax_rows = amask, .last_only = true }, "last_only with a argmax_rows mask" },
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        assert_int_equal(em_target_verify(t, tok, 2, &bads[i].rows, &err), EM_EINVAL);
        if (!strstr(err.msg, bads[i].needle)) fail_msg("%s: request %zu: '%s' lacks '%s'", what, i, err.msg, bads[i].needle);
        assert_int_equal(em_target_prefill(t, tok, 2, &bads[i].rows, &err), EM_EINVAL);
        assert_int_equal(am[0], SENT_ID);
        assert_int_equal(em_target_position(t), 20);
        assert_int_equal(em_target_commit(t, 0, &err), EM_EINVAL); /* no verify was made */
    }
    em_sampler_free(greedy);
    free(full);
    free(got);
    em_target_close(t);
}

static void test_row_requests(void **state) {
    (void)state;
    NEED_MODELS();
    check_row_requests(model_path("kimi_a", "q8_0"), "kimi_a q8_0");
    check_row_requests(model_path("kimi_a", "f32"), "kimi_a f32");
    k3_synth_opts o = k3_synth_defaults();
    const char *k3 = em_test_path("rows_k3.gguf");
    em_err err = { 0 };
    if (k3_synth_write(k3, &o, &err)) fail_msg("k3_synth_write: %s", err.msg);
    check_row_requests(k3, "kimi-k3 (AttnRes)");
}

static void test_cost(void **state) {
    (void)state;
    NEED_MODELS();
    em_target *t = open_model(model_path("kimi_a", "q8_0"), NULL);
    em_cost c1 = em_target_cost(t, 1), c8 = em_target_cost(t, 8);
    assert_true(c1.seconds > 0 && c8.seconds > c1.seconds);
    assert_int_equal(c1.bytes_read, 0);
    assert_true(em_target_cost(t, 0).seconds == 0);
    em_target_close(t);
}

/* The decode breakdown (ember bench): over verify(1) + commit(1) steps the phases charge every
 * weight byte a step streams, which em_cost's weight_bytes counts from the model's tensor table
 * independently (the embedding's rows are read, not streamed, and stay out of both), and every
 * step ends the LM head and commits the KDA layers once. Off, nothing is reported. */
static void check_phases(const char *path, const char *what) {
    const em_model_opts mo = { .n_threads = 2 };
    em_target *t = open_model(path, &mo);
    em_err err = { 0 };
    const int32_t prompt[] = { 5, 9, 2, 7 };
    int32_t tok = 3, am = 0;
    const em_rows one = { .argmax = &am };
    em_target_phase ph[EM_PHASES_MAX];
    assert_int_equal(em_target_phases(t, ph, EM_PHASES_MAX), 0);
    assert_int_equal(em_target_prefill(t, prompt, 4, NULL, &err), EM_OK);
    assert_int_equal(em_target_phases_enable(t, true, &err), EM_OK);
    const int steps = 3;
    for (int i = 0; i < steps; i++) {
        assert_int_equal(em_target_verify(t, &tok, 1, &one, &err), EM_OK);
        assert_int_equal(em_target_commit(t, 1, &err), EM_OK);
        tok = am;
    }
    const int n = em_target_phases(t, ph, EM_PHASES_MAX);
    assert_true(n > 0);
    uint64_t bytes = 0;
    double seconds = 0;
    for (int i = 0; i < n; i++) {
        assert_non_null(ph[i].name);
        assert_true(ph[i].seconds >= 0);
        seconds += ph[i].seconds;
        if (strcmp(ph[i].name, "embed") != 0) bytes += ph[i].bytes;
        if (!strcmp(ph[i].name, "lm_head")) assert_int_equal(ph[i].laps, steps);
        if (!strcmp(ph[i].name, "kda.commit")) assert_int_equal(ph[i].laps, steps);
    }
    print_message("   %s: %d phases, %.3f ms a step, %llu weight bytes a step\n", what, n, seconds / steps * 1e3,
                  (unsigned long long)(bytes / steps));
    assert_true(seconds > 0);
    if (bytes != steps * em_target_cost(t, 1).weight_bytes)
        fail_msg("%s: the phases streamed %llu bytes in %d steps, em_cost says %llu a step", what,
                 (unsigned long long)bytes, steps, (unsigned long long)em_target_cost(t, 1).weight_bytes);
    assert_int_equal(em_target_phases_enable(t, false, &err), EM_OK);
    assert_int_equal(em_target_phases(t, ph, EM_PHASES_MAX), 0);
    em_target_close(t);
}

static void test_phases(void **state) {
    (void)state;
    NEED_MODELS();
    check_phases(model_path("kimi_a", "q8_0"), "kimi_a q8_0");
    k3_synth_opts o = k3_synth_defaults();
    const char *k3 = em_test_path("phases_k3.gguf");
    em_err err = { 0 };
    if (k3_synth_write(k3, &o, &err)) fail_msg("k3_synth_write: %s", err.msg);
    check_phases(k3, "kimi-k3");
}

/* ---- bad input ------------------------------------------------------------------------------ */

typedef struct edit {
    const char *drop_tensor;    /* leave this tensor out */
    const char *reshape_tensor; /* write this tensor (f32 zeros) with shape ne */
    int64_t ne[2];
    const char *key;            /* write this key as a string instead */
} edit;

/* Copies the GGUF at src to dst with one edit. */
static void rewrite(const char *src, const char *dst, const edit *e) {
    em_gguf *g;
    em_gguf_writer *w;
    em_err err = { 0 };
    assert_int_equal(em_gguf_open(&g, src, &err), 0);
    assert_int_equal(em_gguf_writer_create(&w, dst, NULL, &err), 0);
    for (int64_t i = 0; i < em_gguf_n_keys(g); i++) {
        const char *k = em_gguf_key(g, i);
        em_gguf_value v = em_gguf_value_at(g, i);
        if (e->key && !strcmp(k, e->key)) assert_int_equal(em_gguf_writer_set_str(w, k, "four", &err), 0);
        else assert_int_equal(em_gguf_writer_set_value(w, k, &v, &err), 0);
    }
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
            const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
            if (e->drop_tensor && !strcmp(t->name, e->drop_tensor)) continue;
            bool re = e->reshape_tensor && !strcmp(t->name, e->reshape_tensor);
            if (pass == 0) {
                int rc = re ? em_gguf_writer_add_tensor(w, t->name, EM_TYPE_F32, 2, e->ne, &err)
                            : em_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, &err);
                if (rc) fail_msg("%s", err.msg);
            } else if (re) {
                size_t bytes = (size_t)(e->ne[0] * e->ne[1]) * sizeof(float);
                void *z = calloc(1, bytes);
                assert_int_equal(em_gguf_writer_write_tensor(w, t->name, z, bytes, &err), 0);
                free(z);
            } else {
                assert_int_equal(em_gguf_writer_write_tensor(w, t->name, t->data, t->bytes, &err), 0);
            }
        }
    if (em_gguf_writer_finish(w, &err)) fail_msg("%s", err.msg);
    em_gguf_writer_free(w);
    em_gguf_close(g);
}

static void expect_open_error(const edit *e, int code, const char *needle) {
    const char *bad = em_test_path("bad.gguf");
    rewrite(model_path("kimi_a", "f32"), bad, e);
    em_target *t = NULL;
    em_err err = { 0 };
    int rc = em_model_open(&t, bad, NULL, &err);
    print_message("   open error: %s\n", err.msg);
    assert_int_equal(rc, code);
    assert_null(t);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' does not name '%s'", err.msg, needle);
}

static void test_bad_files(void **state) {
    (void)state;
    NEED_MODELS();
    expect_open_error(&(edit){ .drop_tensor = "blk.2.ssm_beta.weight" }, EM_ENOTFOUND, "blk.2.ssm_beta.weight");
    expect_open_error(&(edit){ .drop_tensor = "blk.3.ffn_down_exps.weight" }, EM_ENOTFOUND, "blk.3.ffn_down_exps.weight");
    expect_open_error(&(edit){ .drop_tensor = "output.weight" }, EM_ENOTFOUND, "output.weight");
    expect_open_error(&(edit){ .reshape_tensor = "blk.1.attn_kv_a_mqa.weight", .ne = { 96, 79 } }, EM_EFORMAT,
                      "blk.1.attn_kv_a_mqa.weight");
    expect_open_error(&(edit){ .reshape_tensor = "blk.0.ssm_norm.weight", .ne = { 16, 2 } }, EM_EFORMAT,
                      "blk.0.ssm_norm.weight");
    expect_open_error(&(edit){ .reshape_tensor = "token_embd.weight", .ne = { 95, 512 } }, EM_EFORMAT, "token_embd.weight");
    expect_open_error(&(edit){ .key = "kimi-linear.block_count" }, EM_EFORMAT, "kimi-linear.block_count");
    expect_open_error(&(edit){ .key = "kimi-linear.attention.layer_norm_rms_epsilon" }, EM_EFORMAT,
                      "layer_norm_rms_epsilon");
    expect_open_error(&(edit){ .key = "kimi-linear.attention.head_count_kv" }, EM_EFORMAT, "head_count_kv");
    expect_open_error(&(edit){ .key = "kimi-linear.expert_weights_norm" }, EM_EFORMAT, "expert_weights_norm");
    expect_open_error(&(edit){ .key = "general.architecture" }, EM_EUNSUPPORTED, "four");

    em_target *t = NULL;
    em_err err = { 0 };
    assert_int_equal(em_model_open(&t, em_test_path("no-such-file.gguf"), NULL, &err), EM_EIO);
    assert_non_null(strstr(err.msg, "no-such-file.gguf"));
    const char *junk = em_test_path("junk.gguf");
    em_test_write(junk, "GGUF\3\0\0\0junk", 12);
    assert_true(em_model_open(&t, junk, NULL, &err) < 0);
    assert_null(t);
}

static void test_bad_calls(void **state) {
    (void)state;
    NEED_MODELS();
    em_model_opts opts = { .n_ctx = 16 };
    em_target *t = open_model(model_path("kimi_a", "f32"), &opts);
    assert_int_equal(em_target_get_info(t)->n_ctx, 16);
    float *logits = malloc((size_t)17 * 512 * sizeof(float));
    em_rows rows = { .logits = logits };
    int32_t tok[17] = { 1, 2, 3 };
    em_err err = { 0 };
    tok[1] = 512;
    assert_int_equal(em_target_prefill(t, tok, 3, &rows, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "512"));
    tok[1] = -1;
    assert_int_equal(em_target_verify(t, tok, 3, &rows, &err), EM_EINVAL);
    tok[1] = 2;
    assert_int_equal(em_target_position(t), 0);
    assert_int_equal(em_target_prefill(t, tok, 17, &rows, &err), EM_EINVAL); /* longer than the context */
    assert_non_null(strstr(err.msg, "context"));
    assert_int_equal(em_target_prefill(t, tok, 0, &rows, &err), EM_EINVAL);
    assert_int_equal(em_target_commit(t, 1, &err), EM_EINVAL); /* no verify */
    assert_int_equal(em_target_prefill(t, tok, 14, &rows, &err), 0);
    assert_int_equal(em_target_verify(t, tok, 3, &rows, &err), EM_EINVAL); /* 14 + 3 > 16 */
    assert_int_equal(em_target_verify(t, tok, 2, &rows, &err), 0);
    assert_int_equal(em_target_commit(t, 3, &err), EM_EINVAL);
    assert_int_equal(em_target_commit(t, -1, &err), EM_EINVAL);
    assert_int_equal(em_target_commit(t, 2, &err), 0);
    assert_int_equal(em_target_commit(t, 2, &err), EM_EINVAL); /* already committed */
    assert_int_equal(em_target_position(t), 16);
    rows.features = logits; /* no feature layers were set */
    em_target_reset(t);
    assert_int_equal(em_target_verify(t, tok, 1, &rows, &err), EM_EINVAL);
    em_target_close(t);
    free(logits);

    const int bad_layer = 4;
    em_model_opts bad = { .feature_layers = &bad_layer, .n_feature_layers = 1 };
    assert_int_equal(em_model_open(&t, model_path("kimi_a", "f32"), &bad, &err), EM_EINVAL);
    assert_null(t);
}

/* The CLI: logits of a short sequence equal the target's; bad input gives exit 1 and a
 * message, bad usage exit 2. */
static void test_cli(void **state) {
    (void)state;
    NEED_MODELS();
    const char *bin = getenv("EMBER_BIN");
    json_t *seq = json_array_get(sequences("kimi_a"), 0);
    int n;
    int32_t *tok = seq_tokens(seq, &n);
    char list[1024] = "";
    for (int i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "", tok[i]);
    const char *out = em_test_path("cli.f32");
    assert_int_equal(em_test_sh(1, "'%s' logits -m '%s' --tokens %s -o '%s' --threads 2", bin, model_path("kimi_a", "f32"), list, out), 0);
    float *got = em_test_read_f32(out, (size_t)n * 512);
    float *ref = seq_logits(seq, n, 512);
    expect_rows_close(got, ref, n, 512, 1e-3, "ember logits");
    free(got);
    free(ref);
    /* @FILE form */
    const char *lf = em_test_path("tokens.txt");
    em_test_write(lf, "1, 2\n3", 6);
    assert_int_equal(em_test_sh(1, "'%s' logits -m '%s' --tokens @%s -o '%s'", bin, model_path("kimi_a", "f32"), lf, out), 0);
    free(em_test_read_f32(out, (size_t)3 * 512));

    assert_int_equal(em_test_sh(1, "'%s' logits -m '%s' --tokens 1,512 -o '%s'", bin, model_path("kimi_a", "f32"), out), 1);
    size_t elen;
    char *e = em_test_read(em_test_path("err.txt"), &elen); /* NUL-terminated */
    assert_non_null(strstr(e, "out of range"));
    free(e);
    assert_int_equal(em_test_sh(1, "'%s' logits -m '%s' --tokens 1,x -o '%s'", bin, model_path("kimi_a", "f32"), out), 1);
    assert_int_equal(em_test_sh(1, "'%s' logits -m '%s' --tokens 1,2,3 --ctx 2 -o '%s'", bin, model_path("kimi_a", "f32"), out), 1);
    assert_int_equal(em_test_sh(1, "'%s' logits -m '%s' --tokens 1 -o '%s'", bin, em_test_path("missing.gguf"), out), 1);
    assert_int_equal(em_test_sh(1, "'%s' logits --tokens 1 -o '%s'", bin, out), 2);
    assert_int_equal(em_test_sh(1, "'%s' logits -m x --tokens 1 -o y --bogus", bin), 2);
    free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_vs_transformers),
        cmocka_unit_test(test_bf16_vs_transformers),
        cmocka_unit_test(test_q8_0_vs_transformers),
        cmocka_unit_test(test_features),
        cmocka_unit_test(test_decode_matches_full_forward),
        cmocka_unit_test(test_verify_commit),
        cmocka_unit_test(test_wide_verify_replays),
        cmocka_unit_test(test_threads_agree),
        cmocka_unit_test(test_verify_rows_exact),
        cmocka_unit_test(test_row_requests),
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_phases),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
