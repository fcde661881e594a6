/* Tests for the kimi-k3 variant of the Kimi target (model/) on small random kimi-k3 GGUFs
 * written by tests/compat/k3_synth.h (every K3 feature on: q-LoRA + gated MLA, full-rank and
 * lower-bounded KDA gates, SiTU, latent MoE, AttnRes with several banks). Agreement with
 * llama.cpp's own kimi-k3 graph on the same files is tests/k3_llama.sh; here:
 *  - SiTU (compute/ em_situ) against its formula in double, the linear beta switch included;
 *  - the file opens as kimi-k3 with the expected sizes;
 *  - decoding: prefill, then one token at a time, then a block through verify, gives the
 *    logits of one full-sequence forward (1e-4 relative to the row's largest logit);
 *  - verify(n) + commit(k) == feeding the k tokens one at a time (the following rows within
 *    1e-5 relative), for n in 1..6 and every k <= n; verify leaves the committed state alone
 *    (the same verify twice is bit-identical); a verify wider than max_verify commits by
 *    replay with the same result;
 *  - one thread and two agree bit for bit; latent experts streamed through the expert cache
 *    (--moe-storage ssd, a quarter of the routed bytes) give the resident logits bit for bit;
 *  - AttnRes is live: the same weights without it give other logits;
 *  - bad input: a file missing attn_res.block_size or the SiTU betas, or with a misshapen
 *    attn_res_score / output_res_score / ffn_routed_down / attn_gate, fails to open with the
 *    key or tensor named. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compat/k3_synth.h"
#include "compute/compute.h"
#include "model/model.h"

static const int32_t SEQ[] = { 5,  77, 300, 12, 200, 45, 9,   130, 250, 61, 33, 98,  140, 7,   19, 260,
                               300, 2, 180, 111, 64, 3,  222, 17,  90,  150, 8, 201, 33,  270, 41, 5 };
#define N_SEQ ((int)(sizeof SEQ / sizeof SEQ[0]))

static const char *write_model(const char *name, const k3_synth_opts *o) {
    const char *path = em_test_path(name);
    em_err err = { 0 };
    if (k3_synth_write(path, o, &err)) fail_msg("k3_synth_write %s: %s", name, err.msg);
    return path;
}

static const char *model_a(void) {
    static char path[512];
    if (!path[0]) {
        k3_synth_opts o = k3_synth_defaults();
        snprintf(path, sizeof path, "%s", write_model("k3_a.gguf", &o));
    }
    return path;
}

static em_target *open_model(const char *path, const em_model_opts *opts) {
    em_target *t = NULL;
    em_err err = { 0 };
    if (em_model_open(&t, path, opts, &err)) fail_msg("open %s: %s", path, err.msg);
    return t;
}

static double row_rel(const float *a, const float *b, int v) {
    double d = 0, m = 0;
    for (int i = 0; i < v; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

static double worst_rel(const float *a, const float *b, int n, int v) {
    double w = 0;
    for (int p = 0; p < n; p++) w = fmax(w, row_rel(a + (int64_t)p * v, b + (int64_t)p * v, v));
    return w;
}

static float *full_forward(em_target *t, const int32_t *tok, int n) {
    const int V = em_target_get_info(t)->n_vocab;
    float *l = malloc((size_t)n * V * sizeof(float));
    assert_non_null(l);
    em_target_reset(t);
    em_err err = { 0 };
    if (em_target_prefill(t, tok, n, &(em_rows){ .logits = l }, &err)) fail_msg("prefill: %s", err.msg);
    return l;
}

static void verify_rows(em_target *t, const int32_t *tok, int n, float *logits) {
    em_err err = { 0 };
    if (em_target_verify(t, tok, n, &(em_rows){ .logits = logits }, &err)) fail_msg("verify %d: %s", n, err.msg);
}

static void commit_rows(em_target *t, int k) {
    em_err err = { 0 };
    if (em_target_commit(t, k, &err)) fail_msg("commit %d: %s", k, err.msg);
}

/* ---- SiTU ------------------------------------------------------------------------------- */

static void test_situ(void **state) {
    (void)state;
    enum { N = 1000 };
    float g[N], u[N], y[N];
    uint64_t s = 7;
    for (int i = 0; i < N; i++) {
        g[i] = 12.0f * em_test_randf(&s); /* past both betas, so both tanh bend */
        u[i] = 40.0f * em_test_randf(&s);
    }
    const float betas[][2] = { { 4.0f, 25.0f }, { 1.5f, 2.0f }, { 4.0f, 0.0f }, { 4.0f, -1.0f } };
    for (size_t b = 0; b < sizeof betas / sizeof betas[0]; b++) {
        const double beta = betas[b][0], lin = betas[b][1];
        em_situ(g, u, betas[b][0], betas[b][1], N, y);
        for (int i = 0; i < N; i++) {
            double a = beta * tanh(g[i] / beta) / (1.0 + exp(-(double)g[i]));
            double want = a * (lin > 0 ? lin * tanh(u[i] / lin) : u[i]);
            if (fabs(y[i] - want) > 1e-5 * fmax(1.0, fabs(want)))
                fail_msg("situ(%g, %g) beta %g lin %g: %.9g, want %.9g", g[i], u[i], beta, lin, y[i], want);
        }
    }
    /* bounded like the reference: |y| <= beta * lin_beta */
    em_situ(g, u, 4.0f, 25.0f, N, y);
    for (int i = 0; i < N; i++) assert_true(fabsf(y[i]) <= 100.0f);
    memcpy(y, g, sizeof y); /* in place */
    em_situ(y, u, 4.0f, 25.0f, N, y);
    float z[N];
    em_situ(g, u, 4.0f, 25.0f, N, z);
    assert_memory_equal(y, z, sizeof y);
}

/* ---- the model --------------------------------------------------------------------------- */

static void test_open(void **state) {
    (void)state;
    em_target *t = open_model(model_a(), NULL);
    const em_target_info *info = em_target_get_info(t);
    assert_string_equal(info->arch, "kimi-k3");
    assert_int_equal(info->n_layer, 8);
    assert_int_equal(info->n_embd, 64);
    assert_int_equal(info->n_vocab, 320);
    assert_int_equal(info->n_moe_layers, 7);
    assert_int_equal(info->n_route, 7 * 3);
    float *l = full_forward(t, SEQ, 4);
    for (int i = 0; i < 4 * 320; i++) assert_true(isfinite(l[i]));
    free(l);
    em_target_close(t);
}

/* prefill P, then one token at a time, then a block of B through verify == one full forward */
static void check_decode(const char *path) {
    em_target *t = open_model(path, NULL);
    const int V = em_target_get_info(t)->n_vocab, P = 12, B = 6, n = N_SEQ;
    float *full = full_forward(t, SEQ, n);
    float *got = malloc((size_t)n * V * sizeof(float));
    em_target_reset(t);
    assert_int_equal(em_target_prefill(t, SEQ, P, &(em_rows){ .logits = got }, NULL), 0);
    int p = P;
    for (; p < n - B; p++) {
        verify_rows(t, SEQ + p, 1, got + (int64_t)p * V);
        commit_rows(t, 1);
    }
    verify_rows(t, SEQ + p, B, got + (int64_t)p * V);
    commit_rows(t, B);
    assert_int_equal(em_target_position(t), n);
    double w = worst_rel(got, full, n, V);
    print_message("   %s: decode vs full forward: max relative %.3g\n", path, w);
    assert_true(w <= 1e-4);
    free(got);
    free(full);
    em_target_close(t);
}

static void test_decode_matches_full_forward(void **state) {
    (void)state;
    check_decode(model_a());
    k3_synth_opts o = k3_synth_defaults();
    o.n_layer = 6, o.res_block = 4, o.routed_norm = false, o.situ_beta = 1.5f, o.situ_lin_beta = 2.0f;
    check_decode(write_model("k3_b.gguf", &o));
}

/* verify(n) + commit(k) == feeding the k tokens one at a time */
static void test_verify_commit(void **state) {
    (void)state;
    em_target *t = open_model(model_a(), NULL), *ref = open_model(model_a(), NULL);
    const int V = em_target_get_info(t)->n_vocab, P = 10, F = 3;
    float *a = malloc((size_t)8 * V * sizeof(float)), *a2 = malloc((size_t)8 * V * sizeof(float));
    float *b = malloc((size_t)8 * V * sizeof(float));
    double worst = 0;
    for (int n = 1; n <= 6; n++)
        for (int k = 0; k <= n; k++) {
            em_target_reset(t);
            assert_int_equal(em_target_prefill(t, SEQ, P, &(em_rows){ 0 }, NULL), 0);
            verify_rows(t, SEQ + P, n, a);
            verify_rows(t, SEQ + P, n, a2);
            assert_memory_equal(a, a2, (size_t)n * V * sizeof(float));
            commit_rows(t, k);
            assert_int_equal(em_target_position(t), P + k);
            verify_rows(t, SEQ + P + k, F, a);

            em_target_reset(ref);
            assert_int_equal(em_target_prefill(ref, SEQ, P, &(em_rows){ 0 }, NULL), 0);
            for (int i = 0; i < k; i++) {
                verify_rows(ref, SEQ + P + i, 1, b);
                commit_rows(ref, 1);
            }
            verify_rows(ref, SEQ + P + k, F, b);
            double w = worst_rel(a, b, F, V);
            worst = fmax(worst, w);
            if (w > 1e-5) fail_msg("verify(%d) commit(%d): following rows differ by %.3g relative", n, k, w);
        }
    print_message("   verify(n)+commit(k) vs token by token: max relative %.3g\n", worst);
    assert_true(t->stats.fast_commits > 0);
    assert_int_equal(t->stats.full_replays, 0);
    free(a);
    free(a2);
    free(b);
    em_target_close(t);
    em_target_close(ref);
}

static void test_wide_verify_replays(void **state) {
    (void)state;
    em_target *t = open_model(model_a(), &(em_model_opts){ .max_verify = 2 }), *ref = open_model(model_a(), NULL);
    const int V = em_target_get_info(t)->n_vocab;
    float *a = malloc((size_t)8 * V * sizeof(float)), *b = malloc((size_t)8 * V * sizeof(float));
    assert_int_equal(em_target_prefill(t, SEQ, 10, &(em_rows){ 0 }, NULL), 0);
    assert_int_equal(em_target_prefill(ref, SEQ, 10, &(em_rows){ 0 }, NULL), 0);
    verify_rows(t, SEQ + 10, 6, a);
    verify_rows(ref, SEQ + 10, 6, b);
    assert_true(worst_rel(a, b, 6, V) <= 1e-6);
    commit_rows(t, 4);
    commit_rows(ref, 4);
    assert_int_equal(t->stats.full_replays, 1);
    verify_rows(t, SEQ + 14, 3, a);
    verify_rows(ref, SEQ + 14, 3, b);
    assert_true(worst_rel(a, b, 3, V) <= 1e-5);
    free(a);
    free(b);
    em_target_close(t);
    em_target_close(ref);
}

static void test_threads_agree(void **state) {
    (void)state;
    em_target *a = open_model(model_a(), &(em_model_opts){ .n_threads = 1 });
    em_target *b = open_model(model_a(), &(em_model_opts){ .n_threads = 2 });
    float *la = full_forward(a, SEQ, 16), *lb = full_forward(b, SEQ, 16);
    assert_memory_equal(la, lb, (size_t)16 * 320 * sizeof(float));
    free(la);
    free(lb);
    em_target_close(a);
    em_target_close(b);
}

/* Latent experts read from the file through the expert cache (a quarter of the routed bytes)
 * give the resident logits bit for bit. */
static void test_ssd_experts(void **state) {
    (void)state;
    em_target *a = open_model(model_a(), NULL);
    em_target *b = open_model(model_a(), &(em_model_opts){ .moe_storage = EM_MOE_SSD, .expert_cache_bytes = 168 << 10 });
    em_target_expert_counts st;
    em_err err = { 0 };
    if (em_target_expert_stats(b, -1, &st, &err)) fail_msg("expert stats: %s", err.msg);
    assert_int_equal(st.storage, EM_MOE_SSD);
    assert_int_equal(st.file_bytes, 7 * 8 * 3 * 32 * 32 * 4); /* 7 layers, 8 experts of 3 [32 x 32] f32 */
    float *la = full_forward(a, SEQ, 16), *lb = full_forward(b, SEQ, 16);
    assert_memory_equal(la, lb, (size_t)16 * 320 * sizeof(float));
    if (em_target_expert_stats(b, -1, &st, &err)) fail_msg("expert stats: %s", err.msg);
    print_message("   ssd experts: %llu misses, %llu hits, %llu bytes read\n", (unsigned long long)st.misses,
                  (unsigned long long)st.hits, (unsigned long long)st.bytes_read);
    assert_true(st.misses > 0);
    free(la);
    free(lb);
    em_target_close(a);
    em_target_close(b);
}

/* AttnRes is wired in: the same weights without it (block size 0) give other logits. */
static void test_attnres_live(void **state) {
    (void)state;
    em_target *t = open_model(model_a(), NULL);
    float *base = full_forward(t, SEQ, 8);
    em_target_close(t);
    k3_synth_opts o = k3_synth_defaults();
    o.res_block = 0;
    t = open_model(write_model("k3_nores.gguf", &o), NULL);
    float *nores = full_forward(t, SEQ, 8);
    em_target_close(t);
    double d = worst_rel(nores, base, 8, 320);
    print_message("   AttnRes on vs off: logits differ by %.3g relative\n", d);
    assert_true(d > 1e-2);
    free(base);
    free(nores);
}

/* ---- bad input ----------------------------------------------------------------------------- */

static void expect_open_error(const k3_synth_opts *o, int code, const char *needle) {
    const char *bad = write_model("bad.gguf", o);
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
    k3_synth_opts o = k3_synth_defaults();
    o.skip_key = "kimi-k3.attn_res.block_size";
    expect_open_error(&o, EM_ENOTFOUND, "kimi-k3.attn_res.block_size");
    o.skip_key = "kimi-k3.activation.situ_beta";
    expect_open_error(&o, EM_ENOTFOUND, "kimi-k3.activation.situ_beta");
    o.skip_key = "kimi-k3.activation.situ_linear_beta";
    expect_open_error(&o, EM_ENOTFOUND, "situ_linear_beta");
    o.skip_key = NULL;
    o.reshape_tensor = "blk.5.attn_res_score.weight", o.reshape_len = 63;
    expect_open_error(&o, EM_EFORMAT, "blk.5.attn_res_score.weight");
    o.reshape_tensor = "blk.0.ffn_res_score.weight", o.reshape_len = 65;
    expect_open_error(&o, EM_EFORMAT, "blk.0.ffn_res_score.weight");
    o.reshape_tensor = "output_res_score.weight", o.reshape_len = 32;
    expect_open_error(&o, EM_EFORMAT, "output_res_score.weight");
    o.reshape_tensor = "blk.2.ffn_routed_down.weight", o.reshape_len = 64 * 32;
    expect_open_error(&o, EM_EFORMAT, "blk.2.ffn_routed_down.weight");
    o.reshape_tensor = "blk.3.attn_gate.weight", o.reshape_len = 64 * 64;
    expect_open_error(&o, EM_EFORMAT, "blk.3.attn_gate.weight");
    o.reshape_tensor = "blk.1.ssm_g.weight", o.reshape_len = 64 * 64;
    expect_open_error(&o, EM_EFORMAT, "blk.1.ssm_g.weight");
    o.reshape_tensor = NULL;
    o.gate_lb = 1.0f; /* a lower bound must be negative */
    expect_open_error(&o, EM_EFORMAT, "gate_lower_bound");
    o = k3_synth_defaults();
    o.situ_beta = 0.0f;
    expect_open_error(&o, EM_EFORMAT, "situ_beta");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_situ),
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_decode_matches_full_forward),
        cmocka_unit_test(test_verify_commit),
        cmocka_unit_test(test_wide_verify_replays),
        cmocka_unit_test(test_threads_agree),
        cmocka_unit_test(test_ssd_experts),
        cmocka_unit_test(test_attnres_live),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
