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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_greedy_and_edges),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_large_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
