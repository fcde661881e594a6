/* tests/cuda/test_gpu_seq.c: the sequence-state ops of backend/gpu.h (KDA forward / commit, the
 * MLA latent cache and absorbed attention) against their CPU twins (model/kda.c's
 * em_kda_forward / em_kda_commit; compute/'s em_dot_rows, em_softmax_poly, em_weighted_rows as
 * model/mla.c calls them), at Kimi-Linear-48B-A3B's shapes (32 KDA heads of 128, conv 4; MLA 32
 * heads, kv_lora 512 + rope 64, nope 128), with stated tolerances; width invariance (rows of an
 * n-row call memcmp-equal to one-row steps, n = 1..16); verify(n) + commit(k) memcmp-equal to k
 * single steps for every 0 <= k <= n <= 16; the committed state untouched by verify; rollback by
 * position; poisoned outputs; error paths; a few timings. Needs a GPU (tests/cuda/run.sh runs it
 * on the device machine; not registered with ctest). Prints one line per check; exit 1 when
 * any check failed, 2 when no GPU could be opened.
 * Usage: test_gpu_seq [--device cuda:N] [--no-bench] [--mla-only] [--mla-profile] */
#include "backend/gpu.h"
#include "compute/compute.h"
#include "model/kda.h"

#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define R EM_GPU_MAX_ROWS
#define KH 32   /* KDA heads */
#define KD 128  /* KDA head dim */
#define KDI (KH * KD)
#define KCONV 4
#define MH 32   /* MLA heads */
#define LORA 512
#define ROPE 64
#define NOPE 128
#define MC (LORA + ROPE)

static em_gpu *G;
static em_err E;
static int no_bench;    /* --no-bench: checks only (the memcheck run) */
static int mla_only;    /* --mla-only: the MLA checks and timings only */
static int mla_profile; /* --mla-profile: one attend of 1 and of 16 rows at context 4096, nothing else
                         * (for a profiler: ncu -k regex:k_mla_) */


static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}
static float rndf(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static void fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (rndf() + 1.0f) * 0.5f * (hi - lo);
}
static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, E.msg);
    exit(1);
}
static void *dalloc(uint64_t bytes) {
    void *p = NULL;
    if (em_gpu_alloc(G, bytes, "test buffer", &p, &E)) die("device allocation");
    return p;
}
static void up(void *d, const void *h, uint64_t n) {
    if (em_gpu_upload(G, d, h, n, &E)) die("upload");
}
static void down(void *h, const void *d, uint64_t n) {
    if (em_gpu_download(G, h, d, n, &E)) die("download");
}
static void dcopy(void *d, const void *s, uint64_t n) {
    if (em_gpu_copy(G, d, s, n, &E)) die("copy");
}
static void poison(void *d, uint64_t n) {
    if (em_gpu_memset(G, d, 0xff, n, &E)) die("memset");
}
static int64_t unwritten(const float *h, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += isnan(h[i]);
    return c;
}
/* rel L2 <= tol_l2 and max |diff| <= tol_max * max |ref|; NaN anywhere fails. */
static void record_cmp(const char *name, const float *got, const float *ref, int64_t n, double tol_l2, double tol_max) {
    double num = 0, den = 0, mx = 0, mr = 0;
    int64_t nan = 0, same = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) {
            nan++;
            continue;
        }
        same += memcmp(&got[i], &ref[i], 4) == 0;
        const double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        if (fabs(d) > mx) mx = fabs(d);
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    record(name, nan == 0 && rel <= tol_l2 && mx <= tol_max * (mr > 0 ? mr : 1),
           "relL2 %.2e (<= %.0e) maxabs %.2e (<= %.0e x %.3g) identical %lld/%lld nan %lld", rel, tol_l2, mx, tol_max, mr,
           (long long)same, (long long)n, (long long)nan);
}

/* ==== KDA ====================================================================================== */

typedef struct kda_fix {
    em_kda_dims cd;
    em_gpu_kda_dims gd;
    float *conv_q, *conv_k, *conv_v, *ssm_a, *dt_bias, *o_norm; /* host */
    em_kda_params cp;
    em_gpu_kda_params gp;
    float *qkv, *f, *b, *g2; /* host inputs of R rows */
    float *d_qkv, *d_f, *d_b, *d_g2, *d_out;
    em_kda_state cs;         /* the committed state on the CPU */
    uint64_t st_floats, conv_floats;
    float *d_st0;            /* the committed state on the device: conv then S */
    em_gpu_kda_log lg;
} kda_fix;

static em_gpu_kda_state dstate(const kda_fix *x, float *base) {
    return (em_gpu_kda_state){ .conv = base, .S = base + x->conv_floats };
}

static void kda_open(kda_fix *x, bool bounded) {
    memset(x, 0, sizeof *x);
    x->cd = (em_kda_dims){ .n_head = KH, .head_dim = KD, .d_conv = KCONV, .norm_eps = 1e-5f, .l2_eps = 1e-6f,
                           .bounded_gate = bounded, .gate_lower_bound = -5.0f };
    x->gd = (em_gpu_kda_dims){ .n_head = KH, .head_dim = KD, .d_conv = KCONV, .norm_eps = 1e-5f, .l2_eps = 1e-6f,
                               .bounded_gate = bounded, .gate_lower_bound = -5.0f };
    float **hw[6] = { &x->conv_q, &x->conv_k, &x->conv_v, &x->ssm_a, &x->dt_bias, &x->o_norm };
    const int64_t nw[6] = { KDI * KCONV, KDI * KCONV, KDI * KCONV, KH, KDI, KD };
    const float lo[6] = { -0.6f, -0.6f, -0.6f, 0, -0.5f, 0.8f }, hi[6] = { 0.6f, 0.6f, 0.6f, 0, 0.5f, 1.2f };
    float *dw[6];
    for (int i = 0; i < 6; i++) {
        *hw[i] = xmalloc((size_t)nw[i] * 4);
        fill(*hw[i], nw[i], lo[i], hi[i]);
        if (i == 3)
            for (int h = 0; h < KH; h++) x->ssm_a[h] = -expf(rndf()); /* -exp(A_log) */
        dw[i] = dalloc((uint64_t)nw[i] * 4);
        up(dw[i], *hw[i], (uint64_t)nw[i] * 4);
    }
    x->cp = (em_kda_params){ x->conv_q, x->conv_k, x->conv_v, x->ssm_a, x->dt_bias, x->o_norm };
    x->gp = (em_gpu_kda_params){ dw[0], dw[1], dw[2], dw[3], dw[4], dw[5] };
    x->qkv = xmalloc(R * 3 * KDI * 4), x->f = xmalloc(R * KDI * 4), x->b = xmalloc(R * KH * 4), x->g2 = xmalloc(R * KDI * 4);
    fill(x->qkv, R * 3 * KDI, -1, 1), fill(x->f, R * KDI, -4, 1), fill(x->b, R * KH, -2, 2), fill(x->g2, R * KDI, -2, 2);
    x->d_qkv = dalloc(R * 3 * KDI * 4), x->d_f = dalloc(R * KDI * 4), x->d_b = dalloc(R * KH * 4);
    x->d_g2 = dalloc(R * KDI * 4), x->d_out = dalloc(R * KDI * 4);
    up(x->d_qkv, x->qkv, R * 3 * KDI * 4), up(x->d_f, x->f, R * KDI * 4), up(x->d_b, x->b, R * KH * 4);
    up(x->d_g2, x->g2, R * KDI * 4);
    /* a committed state mid-sequence: random window and S */
    if (em_kda_state_init(&x->cs, &x->cd, &E)) die("kda state");
    x->conv_floats = 3 * (KCONV - 1) * KDI;
    x->st_floats = em_gpu_kda_state_floats(&x->gd);
    fill(x->cs.conv, (int64_t)x->conv_floats, -1, 1);
    fill(x->cs.S, KH * KD * KD, -0.2f, 0.2f);
    x->d_st0 = dalloc(x->st_floats * 4);
    up(x->d_st0, x->cs.conv, x->conv_floats * 4);
    up(x->d_st0 + x->conv_floats, x->cs.S, (uint64_t)KH * KD * KD * 4);
    void *lm = dalloc(em_gpu_kda_log_bytes(&x->gd, R));
    if (em_gpu_kda_log_init(&x->gd, R, lm, &x->lg, &E)) die("kda log");
}

/* Host copy of a device state: conv then S. */
static float *state_down(const kda_fix *x, const float *d) {
    float *h = xmalloc(x->st_floats * 4);
    down(h, d, x->st_floats * 4);
    return h;
}

/* em_gpu_kda_commit_layers: L layers (one launch) each memcmp-equal to its own commit; a
 * consumed log among them refuses the call and consumes none. */
static void test_kda_layers(void) {
    enum { L = 3, K = 5 };
    kda_fix x;
    kda_open(&x, false);
    const uint64_t SB = x.st_floats * 4;
    em_gpu_kda_state st0 = dstate(&x, x.d_st0), one[L], many[L];
    em_gpu_kda_log lg[L];
    float *want[L];
    int rc = 0;
    for (int i = 0; i < L && !rc; i++) { /* layer i: the forward of rows i.. of the inputs */
        if (em_gpu_kda_log_init(&x.gd, R, dalloc(em_gpu_kda_log_bytes(&x.gd, R)), &lg[i], &E)) die("kda log");
        one[i] = dstate(&x, dalloc(SB)), many[i] = dstate(&x, dalloc(SB));
        dcopy(one[i].conv, x.d_st0, SB), dcopy(many[i].conv, x.d_st0, SB);
        rc = em_gpu_kda_forward(G, &x.gd, &x.gp, &st0, 8, x.d_qkv + (int64_t)i * 3 * KDI, x.d_f + (int64_t)i * KDI,
                                x.d_b + i * KH, x.d_g2 + (int64_t)i * KDI, x.d_out, NULL, NULL, &lg[i], &E) ||
             em_gpu_kda_commit(G, &x.gd, &one[i], &lg[i], K, &E);
        want[i] = state_down(&x, one[i].conv);
        lg[i].consumed = false; /* the same log again, for the batched call */
    }
    if (!rc) rc = em_gpu_kda_commit_layers(G, &x.gd, many, lg, L, K, &E);
    int differ = 0;
    for (int i = 0; i < L && !rc; i++) {
        float *got = state_down(&x, many[i].conv);
        differ += memcmp(got, want[i], SB) != 0;
        free(got);
    }
    record("kda commit of 3 layers in one launch", rc == 0 && differ == 0, "%s%d of %d layers differ from their own commit",
           rc ? E.msg : "", differ, L);
    lg[0].consumed = false, lg[2].consumed = false; /* lg[1] stays consumed */
    rc = em_gpu_kda_commit_layers(G, &x.gd, many, lg, L, K, &E);
    record("kda commit of layers: a consumed log refuses", rc == EM_EINVAL && strstr(E.msg, "layer 1") && !lg[0].consumed,
           "%s", E.msg);
    for (int i = 0; i < L; i++) free(want[i]);
}

/* A prefill's wide pass: forward_commit of EM_GPU_WIDE_MAX_ROWS rows in one call on a log of that
 * many rows == the same rows in calls of R rows on a log of R (outputs and state memcmp-equal;
 * a chunk's first rows read their conv taps from the window the chunk before advanced, the one
 * call's from the rows before them). */
static void test_kda_wide(void) {
    enum { N = EM_GPU_WIDE_MAX_ROWS };
    kda_fix x;
    kda_open(&x, false);
    const uint64_t SB = x.st_floats * 4;
    float *qkv = xmalloc(N * 3 * KDI * 4), *f = xmalloc(N * KDI * 4), *b = xmalloc(N * KH * 4), *g2 = xmalloc(N * KDI * 4);
    fill(qkv, N * 3 * KDI, -1, 1), fill(f, N * KDI, -4, 1), fill(b, N * KH, -2, 2), fill(g2, N * KDI, -2, 2);
    float *d_qkv = dalloc(N * 3 * KDI * 4), *d_f = dalloc(N * KDI * 4), *d_b = dalloc(N * KH * 4);
    float *d_g2 = dalloc(N * KDI * 4), *d_out = dalloc(N * KDI * 4);
    up(d_qkv, qkv, N * 3 * KDI * 4), up(d_f, f, N * KDI * 4), up(d_b, b, N * KH * 4), up(d_g2, g2, N * KDI * 4);
    em_gpu_kda_log wide;
    const uint64_t lb = em_gpu_kda_log_bytes(&x.gd, N);
    if (!lb || em_gpu_kda_log_init(&x.gd, N, dalloc(lb), &wide, &E)) die("wide kda log");
    float *d_s = dalloc(SB);
    em_gpu_kda_state st = dstate(&x, d_s);
    float *want = xmalloc(N * KDI * 4), *got = xmalloc(N * KDI * 4);
    int rc = 0;
    dcopy(d_s, x.d_st0, SB);
    for (int r = 0; r < N && !rc; r += R)
        rc = em_gpu_kda_forward_commit(G, &x.gd, &x.gp, &st, R, d_qkv + (int64_t)r * 3 * KDI, d_f + (int64_t)r * KDI,
                                       d_b + r * KH, d_g2 + (int64_t)r * KDI, d_out + (int64_t)r * KDI, NULL, NULL, &x.lg,
                                       &E);
    if (!rc) down(want, d_out, N * KDI * 4);
    float *want_st = state_down(&x, d_s);
    dcopy(d_s, x.d_st0, SB);
    poison(d_out, N * KDI * 4);
    if (!rc) rc = em_gpu_kda_forward_commit(G, &x.gd, &x.gp, &st, N, d_qkv, d_f, d_b, d_g2, d_out, NULL, NULL, &wide, &E);
    if (!rc) down(got, d_out, N * KDI * 4);
    float *got_st = state_down(&x, d_s);
    const char *name = "kda forward_commit of a wide pass's rows == calls of 16";
    if (rc) record(name, 0, "%s", E.msg);
    else {
        const bool out = !memcmp(got, want, N * KDI * 4), state = !memcmp(got_st, want_st, SB);
        record(name, out && state && wide.consumed, "%d rows: outputs %s, window and S %s, log %s", N, out ? "equal" : "differ",
               state ? "equal" : "differ", wide.consumed ? "consumed" : "not consumed");
    }
    free(qkv), free(f), free(b), free(g2), free(want), free(got), free(want_st), free(got_st);
}

static void test_kda(bool bounded) {
    kda_fix x;
    kda_open(&x, bounded);
    const char *tag = bounded ? "kda (K3 gate)" : "kda";
    char name[64];
    const uint64_t SB = x.st_floats * 4;
    /* CPU: 16 rows, recurrent form */
    float *out_cpu = xmalloc(R * KDI * 4), *out = xmalloc(R * KDI * 4);
    em_kda_log *clog = NULL;
    if (em_kda_log_create(&clog, &x.cd, R, false, &E)) die("cpu kda log");
    if (em_kda_forward(&x.cd, &x.cp, &x.cs, R, x.qkv, x.f, x.b, x.g2, out_cpu, clog, NULL, NULL, &E)) die("cpu kda forward");
    /* GPU: 16 rows on the committed state, outputs poisoned */
    em_gpu_kda_state st0 = dstate(&x, x.d_st0);
    poison(x.d_out, R * KDI * 4);
    int rc = em_gpu_kda_forward(G, &x.gd, &x.gp, &st0, R, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, NULL, NULL, &x.lg, &E);
    if (rc) {
        record(tag, 0, "forward: %s", E.msg);
        return;
    }
    down(out, x.d_out, R * KDI * 4);
    snprintf(name, sizeof name, "%s forward 16 rows vs CPU", tag);
    record_cmp(name, out, out_cpu, R * KDI, 1e-5, 1e-4);
    snprintf(name, sizeof name, "%s forward writes every output", tag);
    const int64_t un = unwritten(out, R * KDI);
    record(name, un == 0, "%lld of %d values unwritten", (long long)un, R * KDI);
    float *st_h = state_down(&x, x.d_st0);
    snprintf(name, sizeof name, "%s forward leaves committed state", tag);
    record(name, !memcmp(st_h, x.cs.conv, x.conv_floats * 4) && !memcmp(st_h + x.conv_floats, x.cs.S, (size_t)KH * KD * KD * 4),
           "conv window and S memcmp-equal to the upload");
    /* GPU commit(7) vs the CPU's */
    float *d_w = dalloc(SB);
    em_gpu_kda_state sw = dstate(&x, d_w);
    dcopy(d_w, x.d_st0, SB);
    rc = em_gpu_kda_commit(G, &x.gd, &sw, &x.lg, 7, &E);
    em_kda_state cw;
    em_kda_state_init(&cw, &x.cd, &E);
    em_kda_state_copy(&cw, &x.cs, &x.cd);
    if (em_kda_commit(&x.cd, &cw, clog, 7, NULL, &E)) die("cpu kda commit");
    float *got = state_down(&x, d_w);
    snprintf(name, sizeof name, "%s commit(7) window vs CPU", tag);
    record(name, rc == 0 && !memcmp(got, cw.conv, x.conv_floats * 4), "%s", rc ? E.msg : "memcmp-equal");
    snprintf(name, sizeof name, "%s commit(7) state vs CPU", tag);
    record_cmp(name, got + x.conv_floats, cw.S, KH * KD * KD, 1e-5, 1e-4);
    free(got);
    /* error paths: a second commit; k past the logged rows */
    rc = em_gpu_kda_commit(G, &x.gd, &sw, &x.lg, 1, &E);
    snprintf(name, sizeof name, "%s error: second commit", tag);
    record(name, rc == EM_EINVAL && strstr(E.msg, "already"), "%s", E.msg);
    em_gpu_kda_forward(G, &x.gd, &x.gp, &st0, 3, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, NULL, NULL, &x.lg, &E);
    rc = em_gpu_kda_commit(G, &x.gd, &sw, &x.lg, 4, &E);
    snprintf(name, sizeof name, "%s error: commit(4) after 3 rows", tag);
    record(name, rc == EM_EINVAL && strstr(E.msg, "k = 4"), "%s", E.msg);
    em_gpu_kda_dims bad = x.gd;
    bad.head_dim = 96;
    rc = em_gpu_kda_forward(G, &bad, &x.gp, &st0, 1, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, NULL, NULL, &x.lg, &E);
    snprintf(name, sizeof name, "%s error: head_dim 96", tag);
    record(name, rc == EM_EUNSUPPORTED && strstr(E.msg, "96"), "%s", E.msg);

    /* single steps: forward(1 row) + commit(1), 16 times; every state kept */
    float *single = xmalloc(R * KDI * 4), **states = xmalloc((R + 1) * sizeof(float *));
    dcopy(d_w, x.d_st0, SB);
    states[0] = state_down(&x, d_w);
    int step_rc = 0;
    for (int t = 0; t < R && !step_rc; t++) {
        step_rc = em_gpu_kda_forward(G, &x.gd, &x.gp, &sw, 1, x.d_qkv + (int64_t)t * 3 * KDI, x.d_f + (int64_t)t * KDI,
                                     x.d_b + t * KH, x.d_g2 + (int64_t)t * KDI, x.d_out, NULL, NULL, &x.lg, &E) ||
                  em_gpu_kda_commit(G, &x.gd, &sw, &x.lg, 1, &E);
        down(single + (int64_t)t * KDI, x.d_out, KDI * 4);
        states[t + 1] = state_down(&x, d_w);
    }
    snprintf(name, sizeof name, "%s 16 single steps vs CPU forward", tag);
    if (step_rc) record(name, 0, "%s", E.msg);
    else record_cmp(name, single, out_cpu, R * KDI, 1e-5, 1e-4);
    /* width invariance and verify(n) + commit(k) == k single steps, every 0 <= k <= n <= 16 */
    int rows_bad = 0, states_bad = 0, pairs = 0, first_bad_n = 0, first_bad_k = -1;
    for (int n = 1; n <= R; n++) {
        for (int k = 0; k <= n; k++) {
            dcopy(d_w, x.d_st0, SB);
            poison(x.d_out, R * KDI * 4);
            if (em_gpu_kda_forward(G, &x.gd, &x.gp, &sw, n, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, NULL, NULL, &x.lg, &E) ||
                em_gpu_kda_commit(G, &x.gd, &sw, &x.lg, k, &E)) {
                record("kda verify/commit", 0, "n %d k %d: %s", n, k, E.msg);
                return;
            }
            if (k == 0) {
                down(out, x.d_out, (uint64_t)n * KDI * 4);
                rows_bad += memcmp(out, single, (size_t)n * KDI * 4) != 0;
            }
            float *s = state_down(&x, d_w);
            if (memcmp(s, states[k], SB)) {
                states_bad++;
                if (first_bad_k < 0) first_bad_n = n, first_bad_k = k;
            }
            free(s);
            pairs++;
        }
    }
    snprintf(name, sizeof name, "%s width invariance n=1..16", tag);
    record(name, rows_bad == 0, "%d of 16 widths differ from single steps (memcmp)", rows_bad);
    snprintf(name, sizeof name, "%s verify(n)+commit(k) == k steps", tag);
    record(name, states_bad == 0, "%d of %d (n, k) pairs differ (memcmp of window + S; first n %d k %d)", states_bad, pairs,
           first_bad_n, first_bad_k);
    /* forward_commit(n) == forward(n) + commit(n): outputs, window and S memcmp-equal; log consumed */
    int fc_bad = 0, fc_log = 0;
    const int fc_rows[4] = { 1, 4, 5, R };
    float *fc_out = xmalloc(R * KDI * 4);
    for (int i = 0; i < 4 && !fc_bad; i++) {
        const int n = fc_rows[i];
        dcopy(d_w, x.d_st0, SB);
        if (em_gpu_kda_forward(G, &x.gd, &x.gp, &sw, n, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, NULL, NULL, &x.lg, &E) ||
            em_gpu_kda_commit(G, &x.gd, &sw, &x.lg, n, &E)) {
            fc_bad = n;
            break;
        }
        down(out, x.d_out, (uint64_t)n * KDI * 4);
        float *want_st = state_down(&x, d_w);
        dcopy(d_w, x.d_st0, SB);
        poison(x.d_out, R * KDI * 4);
        if (em_gpu_kda_forward_commit(G, &x.gd, &x.gp, &sw, n, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, NULL, NULL, &x.lg,
                                      &E))
            fc_bad = n;
        float *got_st = state_down(&x, d_w);
        down(fc_out, x.d_out, (uint64_t)n * KDI * 4);
        if (memcmp(fc_out, out, (size_t)n * KDI * 4) || memcmp(got_st, want_st, SB)) fc_bad = n;
        fc_log += x.lg.consumed;
        free(want_st), free(got_st);
    }
    free(fc_out);
    snprintf(name, sizeof name, "%s forward_commit == forward + commit", tag);
    if (fc_bad) record(name, 0, "n = %d: outputs, window or S differ (or a call failed: %s)", fc_bad, E.msg);
    else record(name, fc_log == 4, "n = 1, 4, 5, 16: outputs, window and S memcmp-equal; %d of 4 logs consumed", fc_log);
    /* the output's Q8_0 activations made by the forward == em_gpu_act_prepare of its output */
    const int q8_rows[3] = { 1, 3, R };
    int q8_bad = 0;
    const uint64_t qb = em_gpu_act_bytes(EM_TYPE_Q8_0, KDI, R);
    uint8_t *d_q1 = dalloc(qb), *d_q2 = dalloc(qb), *h1 = xmalloc(qb), *h2 = xmalloc(qb);
    for (int i = 0; i < 3; i++) {
        const int n = q8_rows[i];
        em_gpu_act a1, a2;
        poison(d_q1, qb), poison(d_q2, qb);
        if (em_gpu_kda_forward(G, &x.gd, &x.gp, &st0, n, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, d_q1, &a1, &x.lg, &E) ||
            em_gpu_act_prepare(G, EM_TYPE_Q8_0, x.d_out, KDI, KDI, n, d_q2, &a2, &E)) {
            record("kda forward Q8_0 output", 0, "%s", E.msg);
            break;
        }
        const uint64_t used = (uint64_t)((const uint8_t *)a1.d - d_q1) + (uint64_t)n * (KDI / 32) * 4;
        down(h1, d_q1, used), down(h2, d_q2, used);
        q8_bad += a1.qs != (const int8_t *)d_q1 || a1.n != n || a1.cols != KDI || a1.x != x.d_out ||
                  (const uint8_t *)a1.d - d_q1 != (const uint8_t *)a2.d - d_q2 || memcmp(h1, h2, used) != 0;
    }
    snprintf(name, sizeof name, "%s forward's Q8_0 output == act_prepare", tag);
    record(name, q8_bad == 0, "%d of 3 widths (1, 3, 16) differ (memcmp of quants and scales)", q8_bad);
    free(h1), free(h2);
    /* timing: forward of n rows, commit of n rows */
    if (!bounded) {
        for (int n = 1; n <= R; n *= 4) {
            float fms = 0, cms = 0;
            em_gpu_mark(G, 0, &E);
            for (int i = 0; i < 20; i++)
                em_gpu_kda_forward(G, &x.gd, &x.gp, &st0, n, x.d_qkv, x.d_f, x.d_b, x.d_g2, x.d_out, NULL, NULL, &x.lg, &E);
            em_gpu_mark(G, 1, &E);
            em_gpu_elapsed_ms(G, &fms, &E);
            em_gpu_mark(G, 0, &E);
            for (int i = 0; i < 20; i++) {
                x.lg.consumed = false; /* replays the same rows: timing only */
                em_gpu_kda_commit(G, &x.gd, &sw, &x.lg, n, &E);
            }
            em_gpu_mark(G, 1, &E);
            em_gpu_elapsed_ms(G, &cms, &E);
            printf("bench kda layer (32x128x128): n=%2d forward %.1f us, commit %.1f us\n", n, fms * 50, cms * 50);
        }
    }
    for (int t = 0; t <= R; t++) free(states[t]);
    free(states), free(single), free(out), free(out_cpu), free(st_h);
    em_kda_log_free(clog);
    em_kda_state_free(&cw);
    em_gpu_sync(G, &E);
}

/* ==== MLA ====================================================================================== */

#define CAP (4096 + 2 * R)
/* rel L2 of the GPU's contexts against mla.c's: the CPU sums a context in one chain over the
 * positions, the GPU in up to 64 splits merged, so the two round differently; at context 4096
 * they were 1.01e-6 apart on the device (run 36), and mla.c's long chain is the less accurate
 * of the two there (a float64 check off the tree: docs/cuda.md, run 36). */
#define MLA_CPU_TOL 3e-6

/* The CPU's attention for row t at position p, head h (mla.c's head_task, one row). */
static void mla_cpu(const float *cache, const float *qa, int64_t p, float *scores, float *ctx) {
    const float scale = (float)(1.0 / sqrt((double)(NOPE + ROPE)));
    em_dot_rows(cache, MC, p + 1, qa, MC, scale, scores);
    em_softmax_poly(scores, p + 1);
    em_weighted_rows(scores, cache, MC, p + 1, LORA, ctx);
}

static void set_pos(int32_t *d_pos, int32_t p) { up(d_pos, &p, 4); }

/* mla.cu's documented order on the CPU: tiles of 32 positions over S = min(64, tiles of the
 * capacity) splits, each split's scores (8 slices of float4 steps of the zero-padded row, each
 * an fma chain, meeting in ascending order), its online softmax (em_expf_poly; the tile's sum
 * by a 32-lane xor butterfly) and context (fma over the whole tile, zero rows past the length),
 * then the merge; the GPU must match it bit for bit (memcmp), for any dims. */
#define TW_U 32
static float tw_butterfly(const float *v) {
    float w[TW_U], nw[TW_U];
    memcpy(w, v, sizeof w);
    for (int o = 16; o > 0; o >>= 1) {
        for (int i = 0; i < TW_U; i++) nw[i] = w[i] + w[i ^ o];
        memcpy(w, nw, sizeof w);
    }
    return w[0];
}

static void mla_twin(const em_gpu_mla_dims *d, const float *cache, const float *qa, int64_t p, float *ctx) {
    const int C = d->kv_lora + d->rope, Cp = (C + 3) & ~3, q4 = Cp / 4, KS = (q4 + 7) / 8, L = d->kv_lora;
    const int64_t len = p + 1, tiles = (len + TW_U - 1) / TW_U, cap_tiles = (d->capacity + TW_U - 1) / TW_U;
    const int S = (int)(cap_tiles < 64 ? cap_tiles : 64), ns = (int)(tiles < S ? tiles : S);
    const float scale = (float)(1.0 / sqrt((double)(d->nope + d->rope))), ninf = -INFINITY;
    float *q = xmalloc((size_t)Cp * 4), *row = xmalloc((size_t)Cp * 4), *acc = xmalloc((size_t)64 * L * 4);
    float ms[64], ls[64], sc[TW_U], pv[TW_U];
    memcpy(q, qa, (size_t)C * 4);
    for (int sp = 0; sp < ns; sp++) {
        float mx = ninf, l = 0.0f, *a = acc + (int64_t)sp * L;
        for (int64_t tile = sp; tile < tiles; tile += S) {
            const int64_t u0 = tile * TW_U;
            for (int lane = 0; lane < TW_U; lane++) {
                const int64_t u = u0 + lane;
                memset(row, 0, (size_t)Cp * 4);
                if (u < len) memcpy(row, cache + u * C, (size_t)C * 4);
                float dot = 0.0f;
                for (int w = 0; w < 8; w++) {
                    float sl = 0.0f;
                    for (int k = w * KS; k < (w + 1) * KS && k < q4; k++)
                        for (int e = 0; e < 4; e++) sl = fmaf(q[4 * k + e], row[4 * k + e], sl);
                    dot = w == 0 ? sl : dot + sl;
                }
                sc[lane] = u < len ? dot * scale : ninf;
            }
            float tm = ninf;
            for (int lane = 0; lane < TW_U; lane++) tm = sc[lane] > tm ? sc[lane] : tm;
            const float mn = tm > mx ? tm : mx, al = em_expf_poly(mx - mn);
            for (int lane = 0; lane < TW_U; lane++) pv[lane] = u0 + lane < len ? em_expf_poly(sc[lane] - mn) : 0.0f;
            l = l * al + tw_butterfly(pv);
            mx = mn;
            for (int i = 0; i < L; i++) {
                float x = a[i] * al;
                for (int lane = 0; lane < TW_U; lane++)
                    x = fmaf(pv[lane], u0 + lane < len ? cache[(u0 + lane) * C + i] : 0.0f, x);
                a[i] = x;
            }
        }
        ms[sp] = mx, ls[sp] = l;
    }
    float M = ms[0], ws[64], Ls = 0.0f;
    for (int sp = 1; sp < ns; sp++) M = ms[sp] > M ? ms[sp] : M;
    for (int sp = 0; sp < ns; sp++) ws[sp] = em_expf_poly(ms[sp] - M), Ls = fmaf(ws[sp], ls[sp], Ls);
    for (int i = 0; i < L; i++) {
        float c = 0.0f;
        for (int sp = 0; sp < ns; sp++) c = fmaf(ws[sp], acc[(int64_t)sp * L + i], c);
        ctx[i] = c / Ls;
    }
    free(q), free(row), free(acc);
}

/* n rows at pos against the twin: 1 when every value is memcmp-equal (rows past the capacity:
 * all NaN); *same counts the equal values. */
static int mla_vs_twin(const em_gpu_mla_dims *d, const float *cache, const float *qa, int64_t pos, int n,
                       const float *ctx, float *ref, int64_t *same) {
    const int C = d->kv_lora + d->rope, H = d->n_head, L = d->kv_lora;
    int ok = 1;
    *same = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const float *g = ctx + ((int64_t)t * H + h) * L;
            if (pos + t >= d->capacity) {
                const int64_t nan = unwritten(g, L);
                *same += nan, ok &= nan == L;
                continue;
            }
            mla_twin(d, cache, qa + ((int64_t)t * H + h) * C, pos + t, ref);
            for (int i = 0; i < L; i++) *same += !memcmp(&g[i], &ref[i], 4);
            ok &= !memcmp(g, ref, (size_t)L * 4);
        }
    return ok;
}

/* Dims no tile fits (40 heads: two passes of 32 and a part block of 8; kv_lora 40: a part
 * column block; rows of 46 floats: no 16-byte copies, zero padding to 48; capacity 301),
 * random cache rows: memcmp against the twin, rows past the capacity inside a call NaN, width
 * invariance. */
static void test_mla_odd(void) {
    const em_gpu_mla_dims d = { .n_head = 40, .kv_lora = 40, .rope = 6, .nope = 10, .capacity = 301 };
    const int C = 46, H = 40, L = 40;
    const uint64_t CB = (uint64_t)d.capacity * C * 4, QF = (uint64_t)R * H * C, CF = (uint64_t)R * H * L;
    float *cache = xmalloc(CB), *qa = xmalloc(QF * 4), *ctx = xmalloc(CF * 4), *one = xmalloc(CF * 4);
    float *ref = xmalloc((size_t)L * 4);
    fill(cache, d.capacity * C, -1, 1);
    fill(qa, (int64_t)QF, -2, 2);
    float *d_cache = dalloc(CB), *d_qa = dalloc(QF * 4), *d_ctx = dalloc(CF * 4);
    float *d_sc = dalloc(em_gpu_mla_scratch_floats(&d, R) * 4);
    int32_t *d_pos = dalloc(4);
    up(d_cache, cache, CB), up(d_qa, qa, QF * 4);
    const int64_t at[] = { 0, 249, 290 }; /* 290: rows 11.. are past the capacity */
    for (int k = 0; k < 3; k++) {
        char name[80];
        set_pos(d_pos, (int32_t)at[k]);
        poison(d_ctx, CF * 4);
        int rc = em_gpu_mla_attend(G, &d, d_cache, d_pos, R, d_qa, H * C, d_sc, d_ctx, H * L, &E);
        down(ctx, d_ctx, CF * 4);
        int64_t same = 0;
        const int ok = !rc && mla_vs_twin(&d, cache, qa, at[k], R, ctx, ref, &same);
        snprintf(name, sizeof name, "mla odd dims pos %lld, 16 rows vs twin", (long long)at[k]);
        record(name, ok, "40 heads, kv_lora 40 + rope 6, capacity 301: %lld/%lld memcmp-equal%s %s", (long long)same,
               (long long)CF, rc ? ";" : "", rc ? E.msg : "");
        for (int t = 0; t < R; t++) {
            set_pos(d_pos, (int32_t)(at[k] + t));
            em_gpu_mla_attend(G, &d, d_cache, d_pos, 1, d_qa + (int64_t)t * H * C, H * C, d_sc, d_ctx, H * L, &E);
            down(one + (int64_t)t * H * L, d_ctx, (uint64_t)H * L * 4);
        }
        set_pos(d_pos, (int32_t)at[k]);
        int bad = 0;
        for (int n = 1; n <= R; n++) {
            poison(d_ctx, CF * 4);
            em_gpu_mla_attend(G, &d, d_cache, d_pos, n, d_qa, H * C, d_sc, d_ctx, H * L, &E);
            down(ctx, d_ctx, (uint64_t)n * H * L * 4);
            bad += memcmp(ctx, one, (size_t)n * H * L * 4) != 0;
        }
        snprintf(name, sizeof name, "mla odd dims pos %lld width invariance", (long long)at[k]);
        record(name, bad == 0, "%d of 16 widths differ from one-row calls (memcmp)", bad);
    }
    free(cache), free(qa), free(ctx), free(one), free(ref);
    em_gpu_free(G, d_cache), em_gpu_free(G, d_qa), em_gpu_free(G, d_ctx), em_gpu_free(G, d_sc), em_gpu_free(G, d_pos);
}

/* Mean microseconds of one attend of n rows at pos: 20 plain calls, and 20 replays of a graph
 * of one call (the target's way). */
static void bench_mla(const em_gpu_mla_dims *md, const float *d_cache, int32_t *d_pos, const float *d_qa,
                      float *d_sc, float *d_ctx, int64_t pos, int n, double *plain, double *graph) {
    float ms = 0;
    set_pos(d_pos, (int32_t)pos);
    em_gpu_mla_attend(G, md, d_cache, d_pos, n, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
    em_gpu_mark(G, 0, &E);
    for (int i = 0; i < 20; i++) em_gpu_mla_attend(G, md, d_cache, d_pos, n, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
    em_gpu_mark(G, 1, &E);
    em_gpu_elapsed_ms(G, &ms, &E);
    *plain = ms * 50.0;
    *graph = -1;
    em_gpu_graph *gr = NULL;
    if (em_gpu_capture_begin(G, &E)) return;
    em_gpu_mla_attend(G, md, d_cache, d_pos, n, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
    if (em_gpu_capture_end(G, &gr, &E)) return;
    em_gpu_graph_launch(G, gr, &E);
    em_gpu_mark(G, 0, &E);
    for (int i = 0; i < 20; i++) em_gpu_graph_launch(G, gr, &E);
    em_gpu_mark(G, 1, &E);
    if (!em_gpu_elapsed_ms(G, &ms, &E)) *graph = ms * 50.0;
    em_gpu_graph_free(gr);
}

static void test_mla(void) {
    const em_gpu_mla_dims md = { .n_head = MH, .kv_lora = LORA, .rope = ROPE, .nope = NOPE, .capacity = CAP };
    const uint64_t CB = (uint64_t)CAP * MC * 4;
    float *lat = xmalloc((size_t)CAP * MC * 4), *w = xmalloc(LORA * 4), *cache = xmalloc(CB);
    fill(lat, (int64_t)CAP * MC, -1, 1);
    fill(w, LORA, 0.5f, 1.5f);
    for (int64_t u = 0; u < CAP; u++) { /* the CPU's cache rows, as kimi_mla_forward writes them */
        em_rmsnorm(lat + u * MC, w, 1e-6f, LORA, cache + u * MC);
        memcpy(cache + u * MC + LORA, lat + u * MC + LORA, ROPE * 4);
    }
    float *d_lat = dalloc(CB), *d_w = dalloc(LORA * 4), *d_cache = dalloc(CB), *d_cache2 = dalloc(CB);
    int32_t *d_pos = dalloc(4);
    up(d_lat, lat, CB), up(d_w, w, LORA * 4);
    /* append: all rows, 16 at a time */
    poison(d_cache, CB);
    int rc = 0;
    for (int64_t p = 0; p < CAP && !rc; p += R) {
        set_pos(d_pos, (int32_t)p);
        rc = em_gpu_mla_append(G, &md, d_cache, d_pos, R, d_lat + p * MC, MC, d_w, 1e-6f, &E);
    }
    float *got = xmalloc(CB);
    down(got, d_cache, CB);
    if (rc) record("mla append", 0, "%s", E.msg);
    else record_cmp("mla append (4128 rows) vs em_rmsnorm", got, cache, (int64_t)CAP * MC, 1e-7, 1e-6);
    up(d_cache, cache, CB); /* attention checks read the CPU's cache */

    const uint64_t QF = (uint64_t)R * MH * MC, CF = (uint64_t)R * MH * LORA;
    float *qa = xmalloc(QF * 4), *ctx = xmalloc(CF * 4), *ref = xmalloc(CF * 4), *one = xmalloc(CF * 4);
    float *scores = xmalloc((size_t)CAP * 4);
    fill(qa, (int64_t)QF, -1, 1);
    float *d_qa = dalloc(QF * 4), *d_ctx = dalloc(CF * 4);
    float *d_sc = dalloc(em_gpu_mla_scratch_floats(&md, R) * 4);
    up(d_qa, qa, QF * 4);
    /* the first attend of the process inside a graph capture (kernel attributes set then),
     * replayed: memcmp-equal to a plain call */
    {
        em_gpu_graph *gr = NULL;
        set_pos(d_pos, 99);
        poison(d_ctx, CF * 4);
        rc = em_gpu_capture_begin(G, &E);
        if (!rc) rc = em_gpu_mla_attend(G, &md, d_cache, d_pos, R, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
        const int rc2 = em_gpu_capture_end(G, &gr, &E);
        if (!rc) rc = rc2;
        if (!rc) rc = em_gpu_graph_launch(G, gr, &E);
        down(ctx, d_ctx, CF * 4);
        poison(d_ctx, CF * 4);
        if (!rc) rc = em_gpu_mla_attend(G, &md, d_cache, d_pos, R, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
        down(one, d_ctx, CF * 4);
        record("mla attend captured first, replayed", !rc && !memcmp(ctx, one, CF * 4) && !unwritten(ctx, (int64_t)CF),
               "16 rows at 99..114: %s", rc ? E.msg : "replay memcmp-equal to a plain call");
        em_gpu_graph_free(gr);
    }
    const int64_t lens[] = { 1, 31, 100, 129, 4096 };
    for (int li = 0; li < 5; li++) {
        const int64_t pos = lens[li] - 1; /* row 0 sees lens[li] positions */
        char name[80];
        for (int t = 0; t < R; t++)
            for (int h = 0; h < MH; h++)
                mla_cpu(cache, qa + ((int64_t)t * MH + h) * MC, pos + t, scores, ref + ((int64_t)t * MH + h) * LORA);
        set_pos(d_pos, (int32_t)pos);
        poison(d_ctx, CF * 4);
        rc = em_gpu_mla_attend(G, &md, d_cache, d_pos, R, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
        down(ctx, d_ctx, CF * 4);
        snprintf(name, sizeof name, "mla attend ctx %lld, 16 rows vs CPU", (long long)lens[li]);
        if (rc) record(name, 0, "%s", E.msg);
        else record_cmp(name, ctx, ref, (int64_t)CF, MLA_CPU_TOL, 1e-5);
        int64_t same = 0;
        const int exact = !rc && mla_vs_twin(&md, cache, qa, pos, R, ctx, one, &same);
        snprintf(name, sizeof name, "mla attend ctx %lld, 16 rows vs twin", (long long)lens[li]);
        record(name, exact, "%lld/%lld memcmp-equal to the CPU in the GPU's sum order", (long long)same, (long long)CF);
        /* width invariance: n-row calls against one-row calls at pos + t */
        for (int t = 0; t < R; t++) {
            set_pos(d_pos, (int32_t)(pos + t));
            em_gpu_mla_attend(G, &md, d_cache, d_pos, 1, d_qa + (int64_t)t * MH * MC, MH * MC, d_sc, d_ctx, MH * LORA, &E);
            down(one + (int64_t)t * MH * LORA, d_ctx, (uint64_t)MH * LORA * 4);
        }
        int bad = 0;
        set_pos(d_pos, (int32_t)pos);
        for (int n = 1; n <= R; n++) {
            poison(d_ctx, CF * 4);
            em_gpu_mla_attend(G, &md, d_cache, d_pos, n, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
            down(ctx, d_ctx, (uint64_t)n * MH * LORA * 4);
            bad += memcmp(ctx, one, (size_t)n * MH * LORA * 4) != 0;
        }
        snprintf(name, sizeof name, "mla width invariance ctx %lld", (long long)lens[li]);
        record(name, bad == 0, "%d of 16 widths differ from one-row calls (memcmp)", bad);
    }
    /* rollback: rows past the commit point hold a rejected draft's latents; a row attending at
     * or before the commit point must not see them, and re-appending overwrites them */
    {
        const int64_t P = 1000;
        float *junk = xmalloc((size_t)R * MC * 4);
        fill(junk, R * MC, -3, 3);
        float *d_junk = dalloc((uint64_t)R * MC * 4);
        up(d_junk, junk, (uint64_t)R * MC * 4);
        dcopy(d_cache2, d_cache, CB);
        set_pos(d_pos, (int32_t)(P + 3));
        em_gpu_mla_append(G, &md, d_cache2, d_pos, R, d_junk, MC, d_w, 1e-6f, &E); /* the rejected rows */
        set_pos(d_pos, (int32_t)P);
        em_gpu_mla_attend(G, &md, d_cache2, d_pos, 3, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
        down(ctx, d_ctx, 3ull * MH * LORA * 4);
        em_gpu_mla_attend(G, &md, d_cache, d_pos, 3, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
        down(one, d_ctx, 3ull * MH * LORA * 4);
        const int blind = !memcmp(ctx, one, 3ull * MH * LORA * 4);
        set_pos(d_pos, (int32_t)(P + 3)); /* the accepted continuation overwrites them */
        em_gpu_mla_append(G, &md, d_cache2, d_pos, R, d_lat + (P + 3) * MC, MC, d_w, 1e-6f, &E);
        float *c2 = xmalloc((size_t)R * MC * 4);
        down(c2, d_cache2 + (P + 3) * MC, (uint64_t)R * MC * 4);
        down(got, d_cache + (P + 3) * MC, (uint64_t)R * MC * 4); /* the CPU's rows (uploaded) */
        float *g2 = xmalloc((size_t)R * MC * 4);
        memcpy(g2, got, (size_t)R * MC * 4);
        set_pos(d_pos, (int32_t)P);
        em_gpu_mla_attend(G, &md, d_cache2, d_pos, R, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
        down(ctx, d_ctx, CF * 4);
        for (int t = 0; t < R; t++)
            for (int h = 0; h < MH; h++)
                mla_cpu(cache, qa + ((int64_t)t * MH + h) * MC, P + t, scores, ref + ((int64_t)t * MH + h) * LORA);
        record("mla rollback: later rows unseen", blind, "3 rows at 1000..1002 with junk at 1003.. memcmp-equal to a clean cache");
        record_cmp("mla rollback: re-appended rows vs CPU", c2, g2, R * MC, 1e-7, 1e-6);
        record_cmp("mla rollback: attend after overwrite", ctx, ref, (int64_t)CF, MLA_CPU_TOL, 1e-5);
        free(junk), free(c2), free(g2);
    }
    /* a position past the capacity: NaN rows, no stray read */
    set_pos(d_pos, (int32_t)CAP);
    rc = em_gpu_mla_attend(G, &md, d_cache, d_pos, 1, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
    down(ctx, d_ctx, (uint64_t)MH * LORA * 4);
    record("mla position past capacity", rc == 0 && unwritten(ctx, MH * LORA) == MH * LORA, "row of %d NaN", MH * LORA);
    em_gpu_mla_dims bad = md;
    bad.kv_lora = 2048;
    rc = em_gpu_mla_attend(G, &bad, d_cache, d_pos, 1, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E);
    record("mla error: kv_lora 2048", rc == EM_EINVAL && strstr(E.msg, "2048"), "%s", E.msg);
    /* timings: row 0 sees ctx positions */
    const int64_t bl[] = { 1, 512, 4096 };
    for (int li = 0; li < 3 && !no_bench; li++)
        for (int n = 1; n <= R; n *= 4) {
            double plain = 0, graph = 0;
            bench_mla(&md, d_cache, d_pos, d_qa, d_sc, d_ctx, bl[li] - 1, n, &plain, &graph);
            printf("bench mla attend (32 heads, ctx %4lld): n=%2d %.1f us plain, %.1f us graph replay\n", (long long)bl[li], n,
                   plain, graph);
        }
    free(lat), free(w), free(cache), free(got), free(qa), free(ctx), free(ref), free(one), free(scores);
    em_gpu_sync(G, &E);
}

/* --mla-profile: attend at context 4096 for 1 and 16 rows on a random cache (timing only). */
static void profile_mla(void) {
    const em_gpu_mla_dims md = { .n_head = MH, .kv_lora = LORA, .rope = ROPE, .nope = NOPE, .capacity = CAP };
    const uint64_t CB = (uint64_t)CAP * MC * 4, QF = (uint64_t)R * MH * MC;
    float *cache = xmalloc(CB), *qa = xmalloc(QF * 4);
    fill(cache, (int64_t)CAP * MC, -1, 1);
    fill(qa, (int64_t)QF, -1, 1);
    float *d_cache = dalloc(CB), *d_qa = dalloc(QF * 4), *d_ctx = dalloc((uint64_t)R * MH * LORA * 4);
    float *d_sc = dalloc(em_gpu_mla_scratch_floats(&md, R) * 4);
    int32_t *d_pos = dalloc(4);
    up(d_cache, cache, CB), up(d_qa, qa, QF * 4);
    set_pos(d_pos, 4095);
    for (int n = 1; n <= R; n *= 16)
        if (em_gpu_mla_attend(G, &md, d_cache, d_pos, n, d_qa, MH * MC, d_sc, d_ctx, MH * LORA, &E)) die("attend");
    if (em_gpu_sync(G, &E)) die("sync");
    free(cache), free(qa);
}

int main(int argc, char **argv) {
    const char *dev = "cuda:0";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev = argv[++i];
        else if (!strcmp(argv[i], "--no-bench")) no_bench = 1;
        else if (!strcmp(argv[i], "--mla-only")) mla_only = 1;
        else if (!strcmp(argv[i], "--mla-profile")) mla_profile = 1;
        else {
            fprintf(stderr, "usage: %s [--device cuda:N] [--no-bench] [--mla-only] [--mla-profile]\n", argv[0]);
            return 2;
        }
    }
    int idx = 0;
    if (em_gpu_parse_device(dev, &idx, &E) || em_gpu_open(idx, &G, &E)) {
        fprintf(stderr, "test_gpu_seq: %s\n", E.msg);
        return 2;
    }
    if (mla_profile) {
        profile_mla();
        em_gpu_close(G);
        return 0;
    }
    if (!mla_only) {
        test_kda(false);
        test_kda(true);
        test_kda_layers();
        test_kda_wide();
    }
    test_mla();
    test_mla_odd();
    int rc = em_gpu_sync(G, &E);
    if (rc) record("context after the tests", 0, "%s", E.msg);
    printf("== test_gpu_seq: %d checks, %d passed, %d failed ==\n", n_ok + n_fail, n_ok, n_fail);
    em_gpu_close(G);
    return n_fail ? 1 : 0;
}
