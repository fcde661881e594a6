/* model/kda: the KDA core against an independent double-precision reference written here
 * (the straight per-token recurrence of kimi-linear.md §3: conv + SiLU, L2 norms, both gate
 * forms, S <- diag(e^g) S, S += beta k (v - S^T k)^T, o = S^T q, gated RMSNorm), over several
 * geometries, row counts crossing chunk boundaries, huge negative gates and near-zero beta.
 * Both forms (recurrent, chunked WY) run against it. Also: the two forms agree; forward leaves the committed state untouched;
 * forward(n) + commit(k) equals feeding k rows one by one (bit-exact) and later forwards
 * agree; prefill = forward + commit(n); 1 vs 2 threads bit-identical; argument errors. The
 * whole suite re-runs itself once with EMBER_ISA=scalar to cover the portable kernels. */
#include "testutil.h"

#include "model/kda.h"
#include "model/kda_kern.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tolerance of fp32 results against the double reference, relative to the largest
 * reference magnitude of the compared array. */
#define TOL_OUT 5e-6
#define TOL_STATE 5e-6

enum { MODE_PLAIN = 0, MODE_BIG_GATES = 1, MODE_SMALL_BETA = 2 };

typedef struct kcase {
    em_kda_dims d;
    int di, n;
    float *conv_q, *conv_k, *conv_v, *ssm_a, *dt_bias, *o_norm;
    em_kda_params p;
    float *qkv, *f, *b, *g2;
    em_kda_state st0; /* random committed state */
} kcase;

static float *rnd_vec(uint64_t *rng, size_t n, float lo, float hi) {
    float *v = malloc(n * sizeof(float) + 1);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * 0.5f * (em_test_randf(rng) + 1.0f);
    return v;
}

/* chunk_min: 0 = recurrent form only, 1 = chunked for every n, 17 = transformers' split */
static em_kda_dims mkdims(int H, int D, int dc, bool bounded, int chunk_min) {
    em_kda_dims d = { .n_head = H, .head_dim = D, .d_conv = dc, .norm_eps = 1e-5f,
                      .l2_eps = 1e-6f, .bounded_gate = bounded, .gate_lower_bound = -5.0f,
                      .chunk_min_rows = chunk_min };
    return d;
}

static void kcase_make(kcase *c, em_kda_dims d, int n, uint64_t seed, int mode) {
    memset(c, 0, sizeof(*c));
    uint64_t rng = seed;
    c->d = d;
    c->di = d.n_head * d.head_dim;
    c->n = n;
    const size_t di = (size_t)c->di, dc = (size_t)d.d_conv, nn = n > 0 ? (size_t)n : 1;
    c->conv_q = rnd_vec(&rng, di * dc, -0.6f, 0.6f);
    c->conv_k = rnd_vec(&rng, di * dc, -0.6f, 0.6f);
    c->conv_v = rnd_vec(&rng, di * dc, -0.6f, 0.6f);
    c->ssm_a = malloc((size_t)d.n_head * sizeof(float));
    for (int h = 0; h < d.n_head; h++) /* A = exp(A_log) in [1, 16] as in Kimi-Linear */
        c->ssm_a[h] = -expf(logf(16.0f) * 0.5f * (em_test_randf(&rng) + 1.0f));
    c->dt_bias = rnd_vec(&rng, di, -1.0f, 1.0f);
    c->o_norm = rnd_vec(&rng, (size_t)d.head_dim, 0.5f, 1.5f);
    c->p = (em_kda_params){ c->conv_q, c->conv_k, c->conv_v, c->ssm_a, c->dt_bias, c->o_norm };
    c->qkv = rnd_vec(&rng, nn * 3 * di, -2.0f, 2.0f);
    /* f + dt_bias around -4: decays of a few percent per row, so state carries over. */
    c->f = rnd_vec(&rng, nn * di, -6.0f, -1.0f);
    c->b = rnd_vec(&rng, nn * (size_t)d.n_head, -3.0f, 3.0f);
    c->g2 = rnd_vec(&rng, nn * di, -3.0f, 3.0f);
    if (mode & MODE_BIG_GATES) { /* some rows (and channels) with huge negative gates */
        for (int t = 0; t < n; t++) {
            uint64_t r = em_test_rand(&rng) % 4;
            for (size_t c2 = 0; c2 < di; c2++) {
                if (r == 0) c->f[(size_t)t * di + c2] = 40.0f + 20.0f * em_test_randf(&rng);
                else if (r == 1 && c2 % 3 == 0) c->f[(size_t)t * di + c2] = 25.0f;
            }
        }
    }
    if (mode & MODE_SMALL_BETA)
        for (size_t i = 0; i < nn * (size_t)d.n_head; i++)
            if (i % 2 == 0) c->b[i] = -18.0f - 4.0f * em_test_randf(&rng);
    assert_int_equal(em_kda_state_init(&c->st0, &d, NULL), EM_OK);
    size_t nS = (size_t)d.n_head * (size_t)d.head_dim * (size_t)d.head_dim;
    for (size_t i = 0; i < nS; i++) c->st0.S[i] = 0.5f * em_test_randf(&rng);
    for (size_t i = 0; i < 3 * (dc - 1) * di; i++) c->st0.conv[i] = 2.0f * em_test_randf(&rng);
}

static void kcase_free(kcase *c) {
    free(c->conv_q), free(c->conv_k), free(c->conv_v), free(c->ssm_a), free(c->dt_bias);
    free(c->o_norm), free(c->qkv), free(c->f), free(c->b), free(c->g2);
    em_kda_state_free(&c->st0);
}

/* ---- the double reference: one token at a time ---------------------------------------- */

typedef struct ref_state {
    double *conv; /* [3][dc-1][di] */
    double *S;    /* [H][D][D] */
} ref_state;

static void ref_init(ref_state *r, const kcase *c, const em_kda_state *from) {
    size_t nc = 3 * (size_t)(c->d.d_conv - 1) * (size_t)c->di;
    size_t nS = (size_t)c->d.n_head * (size_t)c->d.head_dim * (size_t)c->d.head_dim;
    r->conv = malloc(nc * sizeof(double) + 1);
    r->S = malloc(nS * sizeof(double));
    for (size_t i = 0; i < nc; i++) r->conv[i] = from->conv[i];
    for (size_t i = 0; i < nS; i++) r->S[i] = from->S[i];
}

static void ref_free(ref_state *r) { free(r->conv), free(r->S); }

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static void ref_token(const kcase *c, ref_state *r, int t, double *out) {
    const int H = c->d.n_head, D = c->d.head_dim, dc = c->d.d_conv, W = dc - 1, di = c->di;
    const float *row = c->qkv + (size_t)t * 3 * di;
    double *qkv = malloc(3 * (size_t)di * sizeof(double));
    const float *w3[3] = { c->conv_q, c->conv_k, c->conv_v };
    for (int m = 0; m < 3; m++) {
        for (int ch = 0; ch < di; ch++) {
            double acc = 0;
            for (int i = 0; i < W; i++)
                acc += (double)w3[m][ch * dc + i] * r->conv[((size_t)m * W + i) * di + ch];
            acc += (double)w3[m][ch * dc + W] * row[m * di + ch];
            qkv[m * di + ch] = acc * sigm(acc); /* SiLU */
            for (int i = 0; i + 1 < W; i++) /* window shift */
                r->conv[((size_t)m * W + i) * di + ch] = r->conv[((size_t)m * W + i + 1) * di + ch];
            if (W > 0) r->conv[((size_t)m * W + W - 1) * di + ch] = row[m * di + ch];
        }
    }
    double *q = qkv, *k = qkv + di, *v = qkv + 2 * di;
    double *g = malloc((size_t)D * sizeof(double)), *u = malloc((size_t)D * sizeof(double));
    double *o = malloc((size_t)D * sizeof(double));
    for (int h = 0; h < H; h++) {
        double *qh = q + h * D, *kh = k + h * D, *vh = v + h * D, sq = 0, sk = 0;
        for (int i = 0; i < D; i++) sq += qh[i] * qh[i], sk += kh[i] * kh[i];
        for (int i = 0; i < D; i++) {
            qh[i] = qh[i] / sqrt(sq + (double)c->d.l2_eps) / sqrt((double)D);
            kh[i] = kh[i] / sqrt(sk + (double)c->d.l2_eps);
        }
        for (int i = 0; i < D; i++) {
            double raw = (double)c->f[(size_t)t * di + h * D + i] + c->dt_bias[h * D + i];
            if (c->d.bounded_gate)
                g[i] = (double)c->d.gate_lower_bound * sigm(-(double)c->ssm_a[h] * raw);
            else
                g[i] = (double)c->ssm_a[h] * (raw > 20 ? raw : log1p(exp(raw)));
        }
        double beta = sigm(c->b[(size_t)t * H + h]);
        double *S = r->S + (size_t)h * D * D;
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) S[i * D + j] *= exp(g[i]);
        for (int j = 0; j < D; j++) {
            u[j] = 0;
            for (int i = 0; i < D; i++) u[j] += kh[i] * S[i * D + j];
        }
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) S[i * D + j] += kh[i] * beta * (vh[j] - u[j]);
        double ms = 0;
        for (int j = 0; j < D; j++) {
            o[j] = 0;
            for (int i = 0; i < D; i++) o[j] += qh[i] * S[i * D + j];
            ms += o[j] * o[j];
        }
        ms /= D;
        for (int j = 0; j < D; j++)
            out[h * D + j] = (double)c->o_norm[j] * o[j] / sqrt(ms + (double)c->d.norm_eps) *
                             sigm(c->g2[(size_t)t * di + h * D + j]);
    }
    free(qkv), free(g), free(u), free(o);
}

/* max |a - ref| / max |ref| */
static double rel_err_f(const float *a, const double *ref, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]);
        if (!(e <= md)) md = e; /* NaN makes it NaN-ish: caught below */
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return mr > 0 ? md / mr : md;
}

static double rel_err_ff(const float *a, const float *b, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= md)) md = e;
        if (fabs((double)b[i]) > mr) mr = fabs((double)b[i]);
    }
    return mr > 0 ? md / mr : md;
}

static size_t s_count(const em_kda_dims *d) {
    return (size_t)d->n_head * (size_t)d->head_dim * (size_t)d->head_dim;
}
static size_t conv_count(const em_kda_dims *d) {
    return 3 * (size_t)(d->d_conv - 1) * (size_t)d->n_head * (size_t)d->head_dim;
}

static void state_clone(em_kda_state *dst, const kcase *c) {
    assert_int_equal(em_kda_state_init(dst, &c->d, NULL), EM_OK);
    em_kda_state_copy(dst, &c->st0, &c->d);
}

static bool state_same(const em_kda_state *a, const em_kda_state *b, const em_kda_dims *d) {
    return memcmp(a->S, b->S, s_count(d) * sizeof(float)) == 0 &&
           (conv_count(d) == 0 || memcmp(a->conv, b->conv, conv_count(d) * sizeof(float)) == 0);
}

/* ---- forward vs reference ------------------------------------------------------------- */

typedef struct geo {
    int H, D, dc;
    bool bounded;
} geo;

static const geo GEOS[] = {
    { 2, 16, 4, false }, { 3, 32, 2, true }, { 1, 128, 4, false }, { 2, 128, 3, true },
    { 2, 12, 1, false }, /* head_dim not a multiple of 8 (kernel tails), no conv window */
};

static void check_forward_vs_ref(const geo *gm, int n, int mode, int chunk_min, uint64_t seed) {
    kcase c;
    kcase_make(&c, mkdims(gm->H, gm->D, gm->dc, gm->bounded, chunk_min), n, seed, mode);
    const size_t di = (size_t)c.di;
    float *out = malloc((size_t)n * di * sizeof(float));
    double *ref = malloc((size_t)n * di * sizeof(double));
    em_kda_state before;
    state_clone(&before, &c);
    em_err err = { 0 };
    int rc = em_kda_forward(&c.d, &c.p, &c.st0, n, c.qkv, c.f, c.b, c.g2, out, NULL, NULL, NULL, &err);
    assert_int_equal(rc, EM_OK);
    assert_true(state_same(&before, &c.st0, &c.d)); /* committed untouched */
    ref_state r;
    ref_init(&r, &c, &c.st0);
    for (int t = 0; t < n; t++) ref_token(&c, &r, t, ref + (size_t)t * di);
    double e = rel_err_f(out, ref, (size_t)n * di);
    /* the state after a forward_commit against the reference state */
    em_kda_state st;
    state_clone(&st, &c);
    float *out2 = malloc((size_t)n * di * sizeof(float));
    assert_int_equal(em_kda_forward_commit(&c.d, &c.p, &st, n, c.qkv, c.f, c.b, c.g2, out2, NULL,
                                           NULL, &err),
                     EM_OK);
    assert_memory_equal(out, out2, (size_t)n * di * sizeof(float));
    double es = rel_err_f(st.S, r.S, s_count(&c.d));
    for (size_t i = 0; i < conv_count(&c.d); i++) assert_true(st.conv[i] == (float)r.conv[i]);
    if (!(e <= TOL_OUT) || !(es <= TOL_STATE) || getenv("KDA_TEST_VERBOSE"))
        print_error("H=%d D=%d dc=%d bounded=%d n=%d mode=%d chunk_min=%d: out err %.3g "
                    "state err %.3g\n", gm->H, gm->D, gm->dc, gm->bounded, n, mode, chunk_min, e, es);
    assert_true(e <= TOL_OUT);
    assert_true(es <= TOL_STATE);
    free(out), free(out2), free(ref);
    ref_free(&r);
    em_kda_state_free(&before);
    em_kda_state_free(&st);
    kcase_free(&c);
}

static const int NS[] = { 1, 2, 5, 16, 17, 40, 63, 64, 65, 130, 200 };

static void test_forward_matches_reference(void **state) {
    (void)state;
    for (size_t g = 0; g < sizeof GEOS / sizeof GEOS[0]; g++)
        for (size_t i = 0; i < sizeof NS / sizeof NS[0]; i++)
            if (GEOS[g].D < 128 || NS[i] % 5 == 0 || NS[i] == 65 || NS[i] == 1 || NS[i] == 16) {
                check_forward_vs_ref(&GEOS[g], NS[i], MODE_PLAIN, 0, 1000 + 17 * g + i);
                check_forward_vs_ref(&GEOS[g], NS[i], MODE_PLAIN, 17, 2000 + 17 * g + i);
            }
}

static void test_forward_big_gates_small_beta(void **state) {
    (void)state;
    static const int ns[] = { 3, 16, 65, 130 };
    for (size_t g = 0; g < sizeof GEOS / sizeof GEOS[0]; g++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            for (int cm = 0; cm <= 1; cm++) {
                check_forward_vs_ref(&GEOS[g], ns[i], MODE_BIG_GATES, cm, 77 + g * 5 + i);
                check_forward_vs_ref(&GEOS[g], ns[i], MODE_SMALL_BETA, cm, 91 + g * 5 + i);
                check_forward_vs_ref(&GEOS[g], ns[i], MODE_BIG_GATES | MODE_SMALL_BETA, cm,
                                     5 + g + i);
            }
        }
}

/* The chunked form (one forward_commit with chunk_min_rows 1) against the recurrent form (the
 * same rows fed in pieces of 11, and in one call, with chunk_min_rows 0). */
static void test_recurrent_vs_chunked(void **state) {
    (void)state;
    static const int ns[] = { 1, 5, 17, 64, 100, 200 };
    for (size_t g = 0; g < sizeof GEOS / sizeof GEOS[0]; g++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            kcase c;
            kcase_make(&c, mkdims(GEOS[g].H, GEOS[g].D, GEOS[g].dc, GEOS[g].bounded, 1), ns[i],
                       300 + g * 7 + i, i % 2 ? MODE_BIG_GATES : MODE_PLAIN);
            em_kda_dims drec = c.d;
            drec.chunk_min_rows = 0;
            const size_t di = (size_t)c.di, n = (size_t)c.n;
            float *oc = malloc(n * di * sizeof(float)), *orr = malloc(n * di * sizeof(float));
            em_kda_state sc, sr;
            state_clone(&sc, &c);
            state_clone(&sr, &c);
            assert_int_equal(em_kda_forward_commit(&c.d, &c.p, &sc, c.n, c.qkv, c.f, c.b, c.g2,
                                                   oc, NULL, NULL, NULL),
                             EM_OK);
            for (int t0 = 0; t0 < c.n; t0 += 11) { /* pieces of 11 rows: recurrent form */
                int m = c.n - t0 < 11 ? c.n - t0 : 11;
                assert_int_equal(em_kda_forward_commit(&drec, &c.p, &sr, m, c.qkv + t0 * 3 * di,
                                                       c.f + t0 * di, c.b + t0 * c.d.n_head,
                                                       c.g2 + t0 * di, orr + t0 * di, NULL,
                                                       NULL, NULL),
                                 EM_OK);
            }
            double e = rel_err_ff(oc, orr, n * di), es = rel_err_ff(sc.S, sr.S, s_count(&c.d));
            if (!(e <= TOL_OUT) || !(es <= TOL_STATE) || getenv("KDA_TEST_VERBOSE"))
                print_error("geo %zu n %d: chunked vs recurrent out %.3g state %.3g\n", g, c.n,
                            e, es);
            assert_true(e <= TOL_OUT && es <= TOL_STATE);
            assert_memory_equal(sc.conv, sr.conv, conv_count(&c.d) * sizeof(float));
            /* the recurrent form in one call (blocks of EM_KDA_CHUNK) == in pieces, bitwise */
            em_kda_state s1;
            state_clone(&s1, &c);
            assert_int_equal(em_kda_forward_commit(&drec, &c.p, &s1, c.n, c.qkv, c.f, c.b, c.g2,
                                                   oc, NULL, NULL, NULL),
                             EM_OK);
            assert_memory_equal(oc, orr, n * di * sizeof(float));
            assert_true(state_same(&s1, &sr, &c.d));
            em_kda_state_free(&s1);
            free(oc), free(orr);
            em_kda_state_free(&sc), em_kda_state_free(&sr);
            kcase_free(&c);
        }
}

/* ---- ReplaySSM commit ----------------------------------------------------------------- */

/* For n rows forwarded with a log and every k <= n: commit(k) == k one-row forward_commits
 * (bit-exact), and the next forward from both states gives identical outputs. */
static void check_commit(const geo *gm, int n, bool keep_final, int chunk_min, uint64_t seed) {
    const int next = 5;
    kcase c;
    kcase_make(&c, mkdims(gm->H, gm->D, gm->dc, gm->bounded, chunk_min), n + next, seed,
               MODE_PLAIN);
    const bool chunked = chunk_min > 0 && n >= chunk_min;
    const size_t di = (size_t)c.di;
    em_kda_log *log;
    assert_int_equal(em_kda_log_create(&log, &c.d, n < 8 ? 8 : n, keep_final, NULL), EM_OK);
    float *out = malloc((size_t)(n + next) * di * sizeof(float));
    float *o1 = malloc((size_t)next * di * sizeof(float)), *o2 = malloc((size_t)next * di * sizeof(float));
    em_kda_state before;
    state_clone(&before, &c);
    for (int k = 0; k <= n; k++) {
        assert_int_equal(em_kda_forward(&c.d, &c.p, &c.st0, n, c.qkv, c.f, c.b, c.g2, out, log,
                                        NULL, NULL, NULL),
                         EM_OK);
        assert_int_equal(em_kda_log_rows(log), n);
        assert_true(state_same(&before, &c.st0, &c.d));
        em_kda_state a, b;
        state_clone(&a, &c);
        state_clone(&b, &c);
        assert_int_equal(em_kda_commit(&c.d, &a, log, k, NULL, NULL), EM_OK);
        em_kda_dims drec = c.d; /* one row at a time, recurrent form */
        drec.chunk_min_rows = 0;
        for (int t = 0; t < k; t++)
            assert_int_equal(em_kda_forward_commit(&drec, &c.p, &b, 1, c.qkv + t * 3 * di,
                                                   c.f + t * di, c.b + t * c.d.n_head,
                                                   c.g2 + t * di, o1, NULL, NULL, NULL),
                             EM_OK);
        if (!chunked || k < n || !keep_final) {
            assert_true(state_same(&a, &b, &c.d));
        } else { /* chunked final state vs the one-by-one state: rounding only */
            assert_memory_equal(a.conv, b.conv, conv_count(&c.d) * sizeof(float));
            assert_true(rel_err_ff(a.S, b.S, s_count(&c.d)) <= TOL_STATE);
        }
        /* the rows after the accepted ones, from both states */
        const int off = n;
        assert_int_equal(em_kda_forward(&c.d, &c.p, &a, next, c.qkv + off * 3 * di, c.f + off * di,
                                        c.b + off * c.d.n_head, c.g2 + off * di, o1, NULL, NULL,
                                        NULL, NULL),
                         EM_OK);
        assert_int_equal(em_kda_forward(&c.d, &c.p, &b, next, c.qkv + off * 3 * di, c.f + off * di,
                                        c.b + off * c.d.n_head, c.g2 + off * di, o2, NULL, NULL,
                                        NULL, NULL),
                         EM_OK);
        assert_true(rel_err_ff(o1, o2, (size_t)next * di) <= TOL_OUT);
        em_kda_state_free(&a), em_kda_state_free(&b);
    }
    em_kda_log_free(log);
    em_kda_state_free(&before);
    free(out), free(o1), free(o2);
    kcase_free(&c);
}

static void test_commit_replay(void **state) {
    (void)state;
    for (size_t g = 0; g < sizeof GEOS / sizeof GEOS[0]; g++)
        for (int n = 1; n <= 8; n++)
            check_commit(&GEOS[g], n, n % 2 == 0, (n % 3 == 0) ? 1 : 0, 40 + g * 9 + (uint64_t)n);
    /* longer forwards, replayed partly, and fully with and without the kept final state */
    check_commit(&GEOS[0], 40, true, 17, 4040);
    check_commit(&GEOS[1], 20, false, 17, 4041);
    check_commit(&GEOS[2], 70, true, 0, 4042);
}

/* Prefill: forward_commit(n) == forward(n) + commit(n) with a kept final state (bit-exact),
 * and against the replayed commit within rounding. */
static void test_prefill_path(void **state) {
    (void)state;
    static const int ns[] = { 3, 16, 70 };
    for (size_t g = 0; g < sizeof GEOS / sizeof GEOS[0]; g++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            kcase c;
            kcase_make(&c, mkdims(GEOS[g].H, GEOS[g].D, GEOS[g].dc, GEOS[g].bounded, (int)(g % 2) * 17),
                       ns[i], 700 + g * 3 + i, MODE_PLAIN);
            const size_t di = (size_t)c.di, n = (size_t)c.n;
            float *o1 = malloc(n * di * sizeof(float)), *o2 = malloc(n * di * sizeof(float));
            em_kda_state a, b, r;
            state_clone(&a, &c), state_clone(&b, &c), state_clone(&r, &c);
            em_kda_log *lk, *lr;
            assert_int_equal(em_kda_log_create(&lk, &c.d, c.n, true, NULL), EM_OK);
            assert_int_equal(em_kda_log_create(&lr, &c.d, c.n, false, NULL), EM_OK);
            assert_int_equal(em_kda_forward_commit(&c.d, &c.p, &a, c.n, c.qkv, c.f, c.b, c.g2,
                                                   o1, NULL, NULL, NULL),
                             EM_OK);
            assert_int_equal(em_kda_forward(&c.d, &c.p, &b, c.n, c.qkv, c.f, c.b, c.g2, o2, lk,
                                            NULL, NULL, NULL),
                             EM_OK);
            assert_memory_equal(o1, o2, n * di * sizeof(float));
            assert_int_equal(em_kda_commit(&c.d, &b, lk, c.n, NULL, NULL), EM_OK);
            assert_true(state_same(&a, &b, &c.d));
            assert_int_equal(em_kda_forward(&c.d, &c.p, &r, c.n, c.qkv, c.f, c.b, c.g2, o2, lr,
                                            NULL, NULL, NULL),
                             EM_OK);
            assert_int_equal(em_kda_commit(&c.d, &r, lr, c.n, NULL, NULL), EM_OK);
            assert_memory_equal(a.conv, r.conv, conv_count(&c.d) * sizeof(float));
            assert_true(rel_err_ff(r.S, a.S, s_count(&c.d)) <= TOL_STATE);
            em_kda_log_free(lk), em_kda_log_free(lr);
            em_kda_state_free(&a), em_kda_state_free(&b), em_kda_state_free(&r);
            free(o1), free(o2);
            kcase_free(&c);
        }
}

/* 1 vs 2 threads (and the arena) give identical bits, for forward, forward_commit, commit. */
static void test_threads_bit_exact(void **state) {
    (void)state;
    em_pool *pool;
    em_arena *arena;
    assert_int_equal(em_pool_create(&pool, 2, NULL), EM_OK);
    assert_int_equal(em_arena_create(&arena, 1 << 20, NULL), EM_OK);
    static const int ns[] = { 1, 7, 90 };
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        kcase c;
        kcase_make(&c, mkdims(5, 32, 4, i == 1, 17), ns[i], 900 + i, MODE_PLAIN);
        const size_t di = (size_t)c.di, n = (size_t)c.n;
        float *o1 = malloc(n * di * sizeof(float)), *o2 = malloc(n * di * sizeof(float));
        em_kda_state a, b;
        state_clone(&a, &c), state_clone(&b, &c);
        assert_int_equal(em_kda_forward_commit(&c.d, &c.p, &a, c.n, c.qkv, c.f, c.b, c.g2, o1,
                                               NULL, NULL, NULL),
                         EM_OK);
        em_arena_reset(arena);
        assert_int_equal(em_kda_forward_commit(&c.d, &c.p, &b, c.n, c.qkv, c.f, c.b, c.g2, o2,
                                               pool, arena, NULL),
                         EM_OK);
        assert_true(em_arena_used(arena) >= em_kda_scratch_bytes(&c.d, 2, 1));
        assert_true(em_arena_used(arena) <= em_kda_scratch_bytes(&c.d, 2, c.n) + 64);
        assert_memory_equal(o1, o2, n * di * sizeof(float));
        assert_true(state_same(&a, &b, &c.d));
        /* forward + partial commit through the pool */
        em_kda_log *log;
        assert_int_equal(em_kda_log_create(&log, &c.d, c.n, false, NULL), EM_OK);
        em_kda_state x, y;
        state_clone(&x, &c), state_clone(&y, &c);
        assert_int_equal(em_kda_forward(&c.d, &c.p, &x, c.n, c.qkv, c.f, c.b, c.g2, o1, log,
                                        NULL, NULL, NULL),
                         EM_OK);
        assert_int_equal(em_kda_commit(&c.d, &x, log, c.n / 2 + 1, NULL, NULL), EM_OK);
        em_arena_reset(arena);
        assert_int_equal(em_kda_forward(&c.d, &c.p, &y, c.n, c.qkv, c.f, c.b, c.g2, o2, log, pool,
                                        arena, NULL),
                         EM_OK);
        assert_int_equal(em_kda_commit(&c.d, &y, log, c.n / 2 + 1, pool, NULL), EM_OK);
        assert_memory_equal(o1, o2, n * di * sizeof(float));
        assert_true(state_same(&x, &y, &c.d));
        em_kda_log_free(log);
        em_kda_state_free(&a), em_kda_state_free(&b), em_kda_state_free(&x), em_kda_state_free(&y);
        free(o1), free(o2);
        kcase_free(&c);
    }
    em_arena_free(arena);
    em_pool_free(pool);
}

/* ---- state helpers and argument errors ------------------------------------------------ */

static void test_state_helpers_and_errors(void **state) {
    (void)state;
    em_kda_dims d = mkdims(2, 16, 4, false, 0);
    assert_int_equal(em_kda_state_floats(&d), 3 * 3 * 32 + 2 * 16 * 16);
    em_kda_state s;
    assert_int_equal(em_kda_state_init(&s, &d, NULL), EM_OK);
    for (size_t i = 0; i < em_kda_state_floats(&d) - (size_t)(2 * 16 * 16); i++)
        assert_true(s.conv[i] == 0.0f);
    s.S[5] = 3.0f, s.conv[7] = 2.0f;
    em_kda_state s2;
    assert_int_equal(em_kda_state_init(&s2, &d, NULL), EM_OK);
    em_kda_state_copy(&s2, &s, &d);
    assert_true(s2.S[5] == 3.0f && s2.conv[7] == 2.0f);
    em_kda_state_reset(&s2, &d);
    assert_true(s2.S[5] == 0.0f && s2.conv[7] == 0.0f);
    em_kda_state_free(&s);
    em_kda_state_free(&s2);
    em_kda_state_free(&s2); /* idempotent */
    em_kda_state_free(NULL);
    em_kda_log_free(NULL);

    em_err err = { 0 };
    em_kda_dims bad = d;
    bad.n_head = 0;
    assert_int_equal(em_kda_state_init(&s2, &bad, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "n_head"));
    bad = d, bad.d_conv = EM_KDA_MAX_CONV + 1;
    assert_int_equal(em_kda_dims_check(&bad, &err), EM_EINVAL);
    bad = d, bad.bounded_gate = true, bad.gate_lower_bound = 0.0f;
    assert_int_equal(em_kda_dims_check(&bad, &err), EM_EINVAL);
    bad = d, bad.chunk_min_rows = -1;
    assert_int_equal(em_kda_dims_check(&bad, &err), EM_EINVAL);
    bad = d, bad.l2_eps = NAN;
    assert_int_equal(em_kda_dims_check(&bad, &err), EM_EINVAL);
    assert_int_equal(em_kda_state_floats(&bad), 0);

    kcase c;
    kcase_make(&c, d, 6, 5, MODE_PLAIN);
    float out[6 * 32];
    em_kda_log *log;
    assert_int_equal(em_kda_log_create(&log, &d, 4, false, &err), EM_OK);
    assert_int_equal(em_kda_log_create(NULL, &d, 4, false, &err), EM_EINVAL);
    em_kda_log *l2 = (em_kda_log *)&err;
    assert_int_equal(em_kda_log_create(&l2, &d, 0, false, &err), EM_EINVAL);
    assert_null(l2);
    assert_int_equal(em_kda_forward(&c.d, &c.p, &c.st0, 6, c.qkv, c.f, c.b, c.g2, out, log, NULL,
                                    NULL, &err),
                     EM_EINVAL); /* n > max_rows */
    assert_non_null(strstr(err.msg, "max_rows"));
    assert_int_equal(em_kda_forward(&c.d, &c.p, &c.st0, -1, c.qkv, c.f, c.b, c.g2, out, NULL,
                                    NULL, NULL, &err),
                     EM_EINVAL);
    assert_int_equal(em_kda_forward(&c.d, &c.p, &c.st0, 2, NULL, c.f, c.b, c.g2, out, NULL,
                                    NULL, NULL, &err),
                     EM_EINVAL);
    em_kda_params np = c.p;
    np.o_norm = NULL;
    assert_int_equal(em_kda_forward(&c.d, &np, &c.st0, 2, c.qkv, c.f, c.b, c.g2, out, NULL,
                                    NULL, NULL, &err),
                     EM_EINVAL);
    assert_int_equal(em_kda_forward(&c.d, &c.p, &c.st0, 0, NULL, NULL, NULL, NULL, NULL, log,
                                    NULL, NULL, &err),
                     EM_OK); /* zero rows: nothing to do */
    assert_int_equal(em_kda_log_rows(log), 0);
    assert_int_equal(em_kda_forward(&c.d, &c.p, &c.st0, 3, c.qkv, c.f, c.b, c.g2, out, log, NULL,
                                    NULL, &err),
                     EM_OK);
    em_kda_state a;
    state_clone(&a, &c);
    assert_int_equal(em_kda_commit(&c.d, &a, log, 4, NULL, &err), EM_EINVAL); /* k > n */
    em_kda_dims other = mkdims(2, 16, 3, false, 0);
    assert_int_equal(em_kda_commit(&other, &a, log, 1, NULL, &err), EM_EINVAL);
    assert_true(state_same(&a, &c.st0, &c.d)); /* failed commits changed nothing */
    assert_int_equal(em_kda_commit(&c.d, &a, log, 2, NULL, &err), EM_OK);
    assert_int_equal(em_kda_commit(&c.d, &a, log, 2, NULL, &err), EM_EINVAL); /* twice */
    assert_non_null(strstr(err.msg, "already"));
    em_kda_log_free(log);
    em_kda_state_free(&a);
    kcase_free(&c);
}

/* The AVX-512 table's state sweep (kda_avx512.c, row after row) gives the AVX2 sweep's floats
 * bit for bit in every mode (update or not, u, w, both), in place and not, at head dims it
 * takes in chunks of 128 columns (128, 256) or 64 (64, 192) and ones it hands back to AVX2
 * (96, 32). */
static void test_sweep_avx512(void **state) {
    (void)state;
    if (!em_isa_cpu_supports(EM_ISA_AVX512)) skip();
    const em_kda_kern *k2 = em_kda_kern_avx2(), *k5 = em_kda_kern_avx512();
    static const int dims[] = { 128, 256, 64, 192, 96, 32 };
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int D = dims[di];
        const size_t dd = (size_t)D * (size_t)D;
        uint64_t rng = 77 + di;
        float *src = malloc(dd * sizeof(float)), *s2 = malloc(dd * sizeof(float)), *s5 = malloc(dd * sizeof(float));
        float *v = malloc(9 * (size_t)D * sizeof(float));
        assert_true(src && s2 && s5 && v);
        for (size_t i = 0; i < dd; i++) src[i] = em_test_randf(&rng);
        for (int i = 0; i < 5 * D; i++) v[i] = em_test_randf(&rng);
        const float *a = v, *kk = v + D, *delta = v + 2 * D, *x = v + 3 * D, *y = v + 4 * D;
        float *u2 = v + 5 * D, *w2 = v + 6 * D, *u5 = v + 7 * D, *w5 = v + 8 * D;
        for (int mode = 0; mode < 8; mode++) {
            const bool upd = mode & 1, rx = mode & 2, ry = mode & 4, in_place = mode == 7;
            if (!upd && !rx && !ry) continue;
            memcpy(s2, src, dd * sizeof(float));
            memcpy(s5, src, dd * sizeof(float));
            memset(u2, 0, 4 * (size_t)D * sizeof(float));
            k2->sweep(s2, in_place ? s2 : src, D, upd ? a : NULL, kk, delta, rx ? x : NULL, ry ? y : NULL, u2, w2);
            k5->sweep(s5, in_place ? s5 : src, D, upd ? a : NULL, kk, delta, rx ? x : NULL, ry ? y : NULL, u5, w5);
            assert_memory_equal(s2, s5, dd * sizeof(float));
            assert_memory_equal(u2, u5, 2 * (size_t)D * sizeof(float)); /* u and w, adjacent */
        }
        free(src), free(s2), free(s5), free(v);
    }
}

/* Re-runs this executable with EMBER_ISA=scalar, covering the portable kernel table. */
static void test_scalar_kernels(void **state) {
    (void)state;
    if (getenv("EMBER_ISA")) skip(); /* already the child (or an ISA was forced) */
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(len > 0);
    exe[len] = 0;
    int rc = em_test_sh(0, "EMBER_ISA=scalar '%s'", exe);
    assert_int_equal(rc, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_helpers_and_errors),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_forward_big_gates_small_beta),
        cmocka_unit_test(test_recurrent_vs_chunked),
        cmocka_unit_test(test_commit_replay),
        cmocka_unit_test(test_prefill_path),
        cmocka_unit_test(test_threads_bit_exact),
        cmocka_unit_test(test_sweep_avx512),
        cmocka_unit_test(test_scalar_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
