/* Tests of sample/: greedy choice and its tie rule, each filter's kept set on hand-made
 * logits (probabilities chosen so every boundary is clear of rounding), the order of the
 * filters (llama.cpp's: top-k, top-p, min-p, then temperature), seeded determinism, and
 * draws whose frequencies match the filtered distribution (chi-square bound below). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample.h"

#define V 6

/* probabilities 0.40 0.30 0.15 0.10 0.05 placed at ids 3 0 4 1 2; id 5 is -inf */
static void five(float *logits) {
    static const int at[5] = { 3, 0, 4, 1, 2 };
    static const double p[5] = { 0.40, 0.30, 0.15, 0.10, 0.05 };
    for (int i = 0; i < 5; i++) logits[at[i]] = (float)log(p[i]);
    logits[5] = -INFINITY;
}

static em_sampler *make(float temp, int top_k, float top_p, float min_p, uint64_t seed, int32_t n_vocab) {
    em_sampler_params p = { .temperature = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p, .seed = seed };
    em_sampler *s;
    em_err err = { 0 };
    if (em_sampler_create(&s, &p, n_vocab, &err)) fail_msg("%s", err.msg);
    return s;
}

/* Checks the kept ids (in order) and, when want_p is given, their probabilities. */
static void expect_dist(float temp, int top_k, float top_p, float min_p, const int32_t *want_ids,
                        const double *want_p, int n_want) {
    float logits[V];
    five(logits);
    em_sampler *s = make(temp, top_k, top_p, min_p, 1, V);
    em_sample_dist d;
    em_err err = { 0 };
    assert_int_equal(em_sample_dist_init(&d, V, &err), 0);
    assert_int_equal(em_sampler_dist(s, logits, &d, &err), 0);
    if (d.n != n_want) fail_msg("T=%g k=%d p=%g m=%g: kept %d ids, want %d", (double)temp, top_k, (double)top_p, (double)min_p, d.n, n_want);
    double sum = 0;
    for (int i = 0; i < d.n; i++) {
        assert_int_equal(d.ids[i], want_ids[i]);
        if (want_p && fabs(d.probs[i] - want_p[i]) > 1e-6)
            fail_msg("T=%g k=%d p=%g m=%g: p(id %d) = %.8f, want %.8f", (double)temp, top_k, (double)top_p,
                     (double)min_p, d.ids[i], (double)d.probs[i], want_p[i]);
        sum += d.probs[i];
    }
    assert_true(fabs(sum - 1) < 1e-6);
    em_sample_dist_free(&d);
    em_sampler_free(s);
}

static void test_filters(void **state) {
    (void)state;
    const int32_t order[5] = { 3, 0, 4, 1, 2 };
    const double all[5] = { 0.40, 0.30, 0.15, 0.10, 0.05 };
    expect_dist(1, 0, 1, 0, order, all, 5); /* no filter; -inf never kept */
    const double k2[2] = { 0.4 / 0.7, 0.3 / 0.7 };
    expect_dist(1, 2, 1, 0, order, k2, 2);
    expect_dist(1, 0, 0.69f, 0, order, k2, 2);              /* 0.40 + 0.30 reaches 0.69 */
    const double p3[3] = { 0.40 / 0.85, 0.30 / 0.85, 0.15 / 0.85 };
    expect_dist(1, 0, 0.71f, 0, order, p3, 3);
    expect_dist(1, 0, 0.0f, 0, order, NULL, 1);             /* top-p keeps at least one */
    expect_dist(1, 0, 1, 0.3f, order, p3, 3);               /* >= 0.3 * 0.4 = 0.12 */
    expect_dist(1, 0, 1, 0.5f, order, k2, 2);               /* >= 0.20 */
    expect_dist(1, 0, 1, 1.0f, order, NULL, 1);
    /* top-p measures within the top-k set: renormalised over the top 4 the first two reach
     * .737, over all five .700; so p = 0.73 keeps 2 after top-k 4 but 3 without it */
    expect_dist(1, 4, 0.8f, 0, order, p3, 3);
    expect_dist(1, 4, 0.74f, 0, order, p3, 3);
    expect_dist(1, 0, 0.74f, 0, order, p3, 3);
    expect_dist(1, 4, 0.73f, 0, order, k2, 2);
    expect_dist(1, 0, 0.73f, 0, order, p3, 3);
    /* min-p after top-p */
    expect_dist(1, 4, 0.8f, 0.4f, order, k2, 2);            /* 0.15 < 0.16 */
    /* temperature last, over the kept ids: p^(1/T) renormalised */
    double t2[3], z = 0;
    for (int i = 0; i < 3; i++) z += sqrt(all[i]);
    for (int i = 0; i < 3; i++) t2[i] = sqrt(all[i]) / z;
    expect_dist(2, 3, 1, 0, order, t2, 3);
    /* the filters see temperature-1 probabilities: at T = 0.25 the top-p cut stays at 2 */
    double t4[2];
    z = pow(0.4, 4) + pow(0.3, 4);
    t4[0] = pow(0.4, 4) / z;
    t4[1] = pow(0.3, 4) / z;
    expect_dist(0.25f, 0, 0.69f, 0, order, t4, 2);
    /* greedy ignores the filters */
    expect_dist(0, 3, 0.5f, 0.9f, order, NULL, 1);
}

static void test_greedy_and_edges(void **state) {
    (void)state;
    float l[8] = { 1, 5, 2, 5, NAN, -INFINITY, 5, 0 };
    assert_int_equal(em_argmax(l, 8), 1); /* lowest id of the ties */
    float nan3[3] = { NAN, NAN, NAN };
    assert_int_equal(em_argmax(nan3, 3), -1);
    assert_int_equal(em_argmax(l, 0), -1);

    em_sampler *s = make(0, 0, 1, 0, 7, 8);
    int32_t id;
    em_err err = { 0 };
    assert_int_equal(em_sampler_sample(s, l, &id, &err), 0);
    assert_int_equal(id, 1);
    em_sampler_free(s);

    float none[4] = { NAN, -INFINITY, NAN, -INFINITY };
    s = make(0, 0, 1, 0, 7, 4);
    assert_int_equal(em_sampler_sample(s, none, &id, &err), EM_EINVAL);
    em_sampler_free(s);
    s = make(1, 0, 1, 0, 7, 4);
    assert_int_equal(em_sampler_sample(s, none, &id, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "no usable logit"));
    em_sampler_free(s);

    /* top-k on ties keeps the lower ids */
    s = make(1, 2, 1, 0, 7, 8);
    em_sample_dist d;
    assert_int_equal(em_sample_dist_init(&d, 8, &err), 0);
    assert_int_equal(em_sampler_dist(s, l, &d, &err), 0);
    assert_int_equal(d.n, 2);
    assert_int_equal(d.ids[0], 1);
    assert_int_equal(d.ids[1], 3);
    assert_true(fabsf(d.probs[0] - 0.5f) < 1e-6f);
    assert_true(fabsf(em_sample_dist_prob(&d, 3) - 0.5f) < 1e-6f);
    assert_true(em_sample_dist_prob(&d, 6) == 0.0f);
    em_sampler_free(s);

    /* +inf logits share everything */
    float inf[5] = { 1, INFINITY, 3, INFINITY, NAN };
    s = make(0.7f, 0, 1, 0, 7, 5);
    assert_int_equal(em_sampler_dist(s, inf, &d, &err), 0);
    assert_int_equal(d.n, 2);
    assert_int_equal(d.ids[0], 1);
    assert_int_equal(d.ids[1], 3);
    assert_true(fabsf(d.probs[1] - 0.5f) < 1e-6f);
    em_sampler_free(s);
    em_sample_dist_free(&d);

    /* parameters */
    em_sampler_params bad[] = {
        { .temperature = NAN, .top_p = 1 },
        { .temperature = INFINITY, .top_p = 1 },
        { .temperature = 1, .top_p = -0.1f },
        { .temperature = 1, .top_p = NAN },
        { .temperature = 1, .top_p = 1, .min_p = 1.5f },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        em_sampler *x = NULL;
        assert_int_equal(em_sampler_create(&x, &bad[i], 4, &err), EM_EINVAL);
        assert_null(x);
    }
    em_sampler_params ok = em_sampler_default_params();
    em_sampler *x = NULL;
    assert_int_equal(em_sampler_create(&x, &ok, 0, &err), EM_EINVAL);
    assert_int_equal(em_sampler_create(&x, &ok, 4, &err), 0);
    assert_true(em_sampler_params_of(x)->top_k == 40);
    em_sampler_free(x);
}

static void test_determinism(void **state) {
    (void)state;
    enum { N = 1000, VOCAB = 1000 };
    float *logits = malloc(VOCAB * sizeof *logits);
    uint64_t r = 3;
    for (int i = 0; i < VOCAB; i++) logits[i] = 3 * em_test_randf(&r);
    int32_t a[N], b[N], c[N];
    em_err err = { 0 };
    em_sampler *s1 = make(1.0f, 50, 0.9f, 0.01f, 1234, VOCAB), *s2 = make(1.0f, 50, 0.9f, 0.01f, 1234, VOCAB);
    em_sampler *s3 = make(1.0f, 50, 0.9f, 0.01f, 1235, VOCAB);
    for (int i = 0; i < N; i++) {
        assert_int_equal(em_sampler_sample(s1, logits, &a[i], &err), 0);
        assert_int_equal(em_sampler_sample(s2, logits, &b[i], &err), 0);
        assert_int_equal(em_sampler_sample(s3, logits, &c[i], &err), 0);
    }
    assert_memory_equal(a, b, sizeof a);
    int same = 0;
    for (int i = 0; i < N; i++) same += a[i] == c[i];
    assert_true(same < N / 2); /* another seed, another stream */
    em_sampler_reseed(s1, 1234);
    for (int i = 0; i < N; i++) {
        int32_t id;
        assert_int_equal(em_sampler_sample(s1, logits, &id, &err), 0);
        assert_int_equal(id, a[i]);
    }
    /* uniform numbers stay in [0, 1) */
    for (int i = 0; i < 100000; i++) {
        double u = em_sampler_uniform(s1);
        assert_true(u >= 0 && u < 1);
    }
    em_sampler_free(s1);
    em_sampler_free(s2);
    em_sampler_free(s3);
    free(logits);
}

/* Upper tail of the chi-square distribution with an even number of degrees of freedom:
 * P(X > x) = exp(-x/2) * sum_{i < df/2} (x/2)^i / i!. */
static double chi2_sf_even(double x, int df) {
    double term = 1, sum = 1;
    for (int i = 1; i < df / 2; i++) {
        term *= x / 2 / i;
        sum += term;
    }
    return exp(-x / 2) * sum;
}

static void test_frequencies(void **state) {
    (void)state;
    /* 5 kept ids (top-k 5 of 6 at T = 0.7), 200,000 draws: the chi-square statistic of the
     * counts against the reported probabilities (df = 4) must have an upper-tail
     * probability above 1e-6, i.e. chi2 < 33.4. The seed is fixed, so the outcome is too. */
    enum { N = 200000 };
    float logits[V] = { 0.5f, -0.2f, 1.1f, 0.9f, -1.0f, -3.0f };
    em_sampler *s = make(0.7f, 5, 1, 0, 2024, V);
    em_sample_dist d;
    em_err err = { 0 };
    assert_int_equal(em_sample_dist_init(&d, V, &err), 0);
    assert_int_equal(em_sampler_dist(s, logits, &d, &err), 0);
    assert_int_equal(d.n, 5);
    long count[V] = { 0 };
    for (int i = 0; i < N; i++) {
        int32_t id;
        assert_int_equal(em_sampler_sample(s, logits, &id, &err), 0);
        assert_true(id >= 0 && id < V && id != 5); /* id 5 is filtered out by top-k */
        count[id]++;
    }
    double chi2 = 0;
    for (int i = 0; i < d.n; i++) {
        double expect = (double)N * d.probs[i];
        double diff = (double)count[d.ids[i]] - expect;
        chi2 += diff * diff / expect;
    }
    double p = chi2_sf_even(chi2, d.n - 1);
    print_message("chi-square %.3f (df %d), upper-tail probability %.4f\n", chi2, d.n - 1, p);
    assert_true(fabs(chi2_sf_even(33.38, 4) - 1e-6) < 2e-8); /* the stated bound */
    assert_true(p > 1e-6);

    /* em_sampler_draw over a hand-written distribution */
    d.n = 3;
    d.ids[0] = 4, d.ids[1] = 1, d.ids[2] = 2;
    d.probs[0] = 0.5f, d.probs[1] = 0.25f, d.probs[2] = 0.25f;
    long c3[V] = { 0 };
    for (int i = 0; i < N; i++) c3[em_sampler_draw(s, &d)]++;
    chi2 = 0;
    const double pr[3] = { 0.5, 0.25, 0.25 };
    for (int i = 0; i < 3; i++) {
        double e = N * pr[i], diff = (double)c3[d.ids[i]] - e;
        chi2 += diff * diff / e;
    }
    assert_true(chi2_sf_even(chi2, 2) > 1e-6);
    assert_int_equal(c3[0] + c3[3] + c3[5], 0);
    em_sample_dist_free(&d);
    em_sampler_free(s);
}

/* A vocabulary-sized row: what is kept is exactly the best-ranked prefix. */
static void test_large_vocab(void **state) {
    (void)state;
    const int32_t n = 163840;
    float *logits = malloc((size_t)n * sizeof *logits);
    uint64_t r = 11;
    for (int32_t i = 0; i < n; i++) logits[i] = 8 * em_test_randf(&r);
    em_sample_dist d;
    em_err err = { 0 };
    assert_int_equal(em_sample_dist_init(&d, n, &err), 0);
    struct { int k; float p, m; } cfg[] = { { 0, 0.95f, 0 }, { 40, 0.95f, 0.05f }, { 0, 1, 0.05f }, { 1000, 1, 0 } };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        em_sampler *s = make(0.8f, cfg[c].k, cfg[c].p, cfg[c].m, 1, n);
        assert_int_equal(em_sampler_dist(s, logits, &d, &err), 0);
        assert_true(d.n >= 1);
        if (cfg[c].k) assert_true(d.n <= cfg[c].k);
        float min_kept = INFINITY;
        double sum = 0;
        char *kept = calloc((size_t)n, 1);
        for (int32_t i = 0; i < d.n; i++) {
            if (i) assert_true(d.probs[i] <= d.probs[i - 1]);
            min_kept = fminf(min_kept, logits[d.ids[i]]);
            kept[d.ids[i]] = 1;
            sum += d.probs[i];
        }
        assert_true(fabs(sum - 1) < 1e-4);
        for (int32_t i = 0; i < n; i++)
            if (!kept[i]) assert_true(logits[i] <= min_kept);
        free(kept);
        em_sampler_free(s);
    }
    em_sample_dist_free(&d);
    free(logits);
}

/* ---- the fast path against a plain reference ---------------------------------------------- */

/* The reference: the sampler as first written (and as sample.h states it), with a plain
 * qsort of every candidate. The one order-dependent sum, top-p's normaliser z over the top-k
 * set, is taken in the same order as em_sampler_dist (id order, or the order a size-k heap
 * leaves after pushing the ids in order), so results must agree to the bit. */
typedef struct ref_cand {
    float logit;
    int32_t id;
} ref_cand;

static bool ref_better(const ref_cand *a, const ref_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int ref_cmp(const void *x, const void *y) {
    const ref_cand *a = x, *b = y;
    return ref_better(a, b) ? -1 : ref_better(b, a) ? 1 : 0;
}

/* k best of c[0..n) into c[0..k): ids pushed in order onto a heap rooted at the worst. */
static void ref_top_k(ref_cand *c, int32_t n, int32_t k) {
    for (int32_t i = 0; i < n; i++) {
        ref_cand x = c[i];
        int32_t j;
        if (i < k) {
            for (j = i; j > 0 && ref_better(&c[(j - 1) / 2], &x); j = (j - 1) / 2) c[j] = c[(j - 1) / 2];
        } else {
            if (!ref_better(&x, &c[0])) continue;
            for (j = 0;;) {
                int32_t l = 2 * j + 1, w = j;
                const ref_cand *worst = &x;
                if (l < k && ref_better(worst, &c[l])) w = l, worst = &c[l];
                if (l + 1 < k && ref_better(worst, &c[l + 1])) w = l + 1;
                if (w == j) break;
                c[j] = c[w];
                j = w;
            }
        }
        c[j] = x;
    }
}

/* Filtered distribution of logits[v] under p (temperature > 0) into ids/probs; returns n. */
static int32_t ref_dist(const em_sampler_params *p, const float *logits, int32_t v, int32_t *ids, float *probs) {
    ref_cand *c = malloc((size_t)v * sizeof *c);
    bool pinf = false;
    int32_t n = 0;
    for (int32_t i = 0; i < v; i++) pinf |= logits[i] == INFINITY;
    for (int32_t i = 0; i < v; i++) {
        float l = logits[i];
        if (pinf ? l == INFINITY : !(isnan(l) || l == -INFINITY)) c[n++] = (ref_cand){ pinf ? 0.0f : l, i };
    }
    if (p->top_k > 0 && p->top_k < n) {
        ref_top_k(c, n, p->top_k);
        n = p->top_k;
    }
    float max = -INFINITY;
    for (int32_t i = 0; i < n; i++) max = fmaxf(max, c[i].logit);
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp((double)c[i].logit - max);
    qsort(c, (size_t)n, sizeof *c, ref_cmp);
    if (p->top_p < 1) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - max) / z;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        double floor = (double)max + log((double)p->min_p);
        int32_t m = 0;
        while (m < n && (double)c[m].logit >= floor) m++;
        n = m;
    }
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp(((double)c[i].logit - max) / p->temperature);
    for (int32_t i = 0; i < n; i++) {
        ids[i] = c[i].id;
        probs[i] = (float)(exp(((double)c[i].logit - max) / p->temperature) / sum);
    }
    free(c);
    return n;
}

/* Row r of a test set: shapes chosen for ties (coarse grids, constant rows, +0/-0), holes
 * (NaN, -inf), +inf rows, peaked and flat spreads. */
static void tie_row(float *l, int32_t v, int r, uint64_t *rng) {
    int shape = r % 7;
    for (int32_t i = 0; i < v; i++) {
        float x = em_test_randf(rng);
        switch (shape) {
        case 0: l[i] = roundf(x * 12) / 4; break;                /* 97 levels: many ties */
        case 1: l[i] = roundf(x * 2) * 0.5f; break;              /* 5 levels */
        case 2: l[i] = 1.25f; break;                             /* all equal */
        case 3: l[i] = 6 * x * fabsf(x) * fabsf(x); break;       /* continuous, heavy top */
        case 4: l[i] = x < -0.3f ? -0.0f : x < 0.4f ? 0.0f : x; break; /* +0/-0 ties */
        case 5: l[i] = 3 * x; break;
        default: l[i] = roundf(x * 40); break;                   /* integers */
        }
        float h = em_test_randf(rng);
        if (h > 0.9f) l[i] = -INFINITY;
        else if (h > 0.85f) l[i] = NAN;
    }
    if (shape == 5 && r % 2) /* a few +inf: they take everything */
        for (int j = 0; j < 3; j++) l[(int32_t)((em_test_randf(rng) + 1) * 0.5f * (float)(v - 1))] = INFINITY;
    if (shape == 3) l[r % v] = 20; /* one clear favourite */
}

static void test_matches_reference(void **state) {
    (void)state;
    static const int32_t vocabs[] = { 5, 37, 700, 5000 };
    static const float temps[] = { 0.3f, 0.7f, 1.5f }, top_ps[] = { 1, 0.95f, 0.5f }, min_ps[] = { 0, 0.05f };
    enum { ROWS = 14, DRAWS = 8 };
    uint64_t rng = 99;
    long checked = 0;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        int32_t v = vocabs[vi];
        const int32_t top_ks[] = { 0, 1, 40, 100, v - 1, v };
        float *l = malloc((size_t)v * ROWS * sizeof *l);
        for (int r = 0; r < ROWS; r++) tie_row(l + (size_t)r * (size_t)v, v, r, &rng);
        int32_t *ref_ids = malloc((size_t)v * sizeof *ref_ids);
        float *ref_probs = malloc((size_t)v * sizeof *ref_probs);
        em_sample_dist d, rd;
        em_err err = { 0 };
        assert_int_equal(em_sample_dist_init(&d, v, &err), 0);
        assert_int_equal(em_sample_dist_init(&rd, v, &err), 0);
        for (size_t ki = 0; ki < 6; ki++)
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t pi = 0; pi < 3; pi++)
                    for (size_t mi = 0; mi < 2; mi++) {
                        em_sampler_params p = { .temperature = temps[ti], .top_k = top_ks[ki], .top_p = top_ps[pi],
                                                .min_p = min_ps[mi], .seed = 7 + ki };
                        em_sampler *s, *s2;
                        assert_int_equal(em_sampler_create(&s, &p, v, &err), 0);
                        assert_int_equal(em_sampler_create(&s2, &p, v, &err), 0);
                        for (int r = 0; r < ROWS; r++) {
                            const float *row = l + (size_t)r * (size_t)v;
                            int32_t n = ref_dist(&p, row, v, ref_ids, ref_probs);
                            if (n == 0) { /* nothing usable (possible only for tiny rows) */
                                assert_int_equal(em_sampler_dist(s, row, &d, &err), EM_EINVAL);
                                continue;
                            }
                            assert_int_equal(em_sampler_dist(s, row, &d, &err), 0);
                            if (d.n != n || memcmp(d.ids, ref_ids, (size_t)n * sizeof *ref_ids) ||
                                memcmp(d.probs, ref_probs, (size_t)n * sizeof *ref_probs))
                                fail_msg("V=%d row %d T=%g k=%d p=%g m=%g: %d ids kept, the reference %d; first "
                                         "id %d p %.9g vs %d p %.9g", v, r, (double)p.temperature, p.top_k,
                                         (double)p.top_p, (double)p.min_p, d.n, n, d.ids[0], (double)d.probs[0],
                                         ref_ids[0], (double)ref_probs[0]);
                            /* the same seed, the same draws: em_sampler_sample against draws
                             * from the reference distribution */
                            rd.n = n;
                            memcpy(rd.ids, ref_ids, (size_t)n * sizeof *ref_ids);
                            memcpy(rd.probs, ref_probs, (size_t)n * sizeof *ref_probs);
                            for (int k = 0; k < DRAWS; k++) {
                                int32_t id;
                                assert_int_equal(em_sampler_sample(s, row, &id, &err), 0);
                                assert_int_equal(id, em_sampler_draw(s2, &rd));
                            }
                            checked++;
                        }
                        em_sampler_free(s);
                        em_sampler_free(s2);
                    }
        em_sample_dist_free(&d);
        em_sample_dist_free(&rd);
        free(ref_ids);
        free(ref_probs);
        free(l);
    }
    print_message("%ld distributions identical to the reference\n", checked);
    assert_true(checked > 4000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_greedy_and_edges),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
