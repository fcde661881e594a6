/* Tests for compute/: the multi-row matmul over quant types and the row ops.
 *
 * References, independent of the code under test:
 *  - matmul: each output equals the dot kernel of that weight row with that activation row
 *    converted on its own (em_dot_quantize_act + em_dot_get), bit for bit (the product only
 *    organizes the work); and, through dequantized weights and activations in double, agrees
 *    to float rounding (so the strides and the row/column roles are right);
 *  - row ops: the formulas evaluated in double. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compute/compute.h"
#include "compute/matmul_kernels.h"
#include "quant/quant.h"

static uint64_t rng = 0x1234567887654321ULL;

static float *rand_floats(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = scale * em_test_randf(&rng);
    return p;
}

/* rows x cols weights of type t made by quantizing random floats. */
static void *rand_weights(int t, int64_t rows, int64_t cols, uint64_t *row_bytes) {
    assert_int_equal(em_type_row_bytes(t, (uint64_t)cols, row_bytes, NULL), 0);
    uint8_t *w = malloc((size_t)(*row_bytes * (uint64_t)rows));
    float *f = rand_floats(rows * cols, 1.0f);
    assert_non_null(w);
    assert_int_equal(em_quantize(t, f, w, rows * cols, NULL), 0);
    free(f);
    return w;
}

static const int mm_types[] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16, EM_TYPE_Q8_0,
                                EM_TYPE_Q4_0, EM_TYPE_Q4_K, EM_TYPE_Q6_K };

static void check_matmul(em_pool *pool, int t, int64_t rows, int64_t cols, int64_t n) {
    uint64_t rb;
    void *w = rand_weights(t, rows, cols, &rb);
    const int64_t ldx = cols + 7, ldy = rows + 3;
    float *x = rand_floats(n * ldx, 2.0f);
    float *y = malloc((size_t)(n * ldy) * sizeof *y);
    assert_non_null(y);
    for (int64_t i = 0; i < n * ldy; i++) y[i] = NAN;
    em_mat m;
    assert_int_equal(em_mat_init(&m, t, rows, cols, w, NULL), 0);
    assert_int_equal(m.row_bytes, rb);
    uint64_t bytes;
    assert_int_equal(em_act_bytes(t, cols, n, &bytes, NULL), 0);
    void *buf = bytes ? malloc((size_t)bytes) : NULL;
    em_err err = { 0 };
    if (em_matmul(pool, &m, x, ldx, n, y, ldy, buf, &err)) fail_msg("matmul %s: %s", em_type_name(t), err.msg);

    uint64_t ab;
    assert_int_equal(em_dot_act_bytes(t, cols, &ab, NULL), 0);
    void *act = malloc((size_t)ab + 64);
    float *wf = malloc((size_t)cols * sizeof *wf), *af = malloc((size_t)cols * sizeof *af);
    assert_true(act && wf && af);
    em_dot_fn dot = em_dot_get(t);
    int at = em_dot_act_type(t);
    for (int64_t j = 0; j < n; j++) {
        assert_int_equal(em_dot_quantize_act(t, x + j * ldx, act, cols, NULL), 0);
        assert_int_equal(em_dequantize(at, act, af, cols, NULL), 0);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *wr = (const uint8_t *)w + (uint64_t)r * rb;
            float want = dot(wr, act, cols), got = y[j * ldy + r];
            if (!(got == want))
                fail_msg("%s %lldx%lld n=%lld: y[%lld][%lld] = %g, its dot %g", em_type_name(t), (long long)rows,
                         (long long)cols, (long long)n, (long long)j, (long long)r, got, want);
            assert_int_equal(em_dequantize(t, wr, wf, cols, NULL), 0);
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                ref += (double)wf[c] * af[c];
                mag += fabs((double)wf[c] * af[c]);
            }
            if (fabs(got - ref) > 1e-5 * mag + 1e-6)
                fail_msg("%s: y[%lld][%lld] = %g, reference %g", em_type_name(t), (long long)j, (long long)r, got, ref);
        }
        for (int64_t r = rows; r < ldy; r++) assert_true(isnan(y[j * ldy + r])); /* padding untouched */
    }
    free(act);
    free(wf);
    free(af);
    free(buf);
    free(w);
    free(x);
    free(y);
}

static void test_matmul(void **state) {
    (void)state;
    em_pool *pools[3] = { NULL, NULL, NULL };
    assert_int_equal(em_pool_create(&pools[1], 1, NULL), 0);
    assert_int_equal(em_pool_create(&pools[2], 2, NULL), 0);
    static const int64_t shapes[][3] = { { 1, 256, 1 }, { 37, 512, 3 }, { 130, 256, 17 }, { 64, 768, 40 } };
    for (size_t ti = 0; ti < sizeof mm_types / sizeof mm_types[0]; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_matmul(pools[s % 3], mm_types[ti], shapes[s][0], shapes[s][1], shapes[s][2]);
    em_pool_free(pools[1]);
    em_pool_free(pools[2]);
}

/* Q8_0 shapes for the register-tiled path (AVX-512 CPUs): row counts that leave a single
 * weight row after the pairs, activation counts that leave 1..3 after the fours, and widths
 * whose block count is not a multiple of 4 (the tail goes to the AVX2 dot kernel: 96 is
 * only tail, 160 one step and a block, 416 three steps and a block; 2176 and wider take the
 * activation-major form only with 1-2 activation rows, up to 4096 columns: 2208 with a tail
 * block, 4096 with 2 rows and with 3, 4160 past it); row counts around the 16 (8 for rows of 1..3 blocks) outputs
 * whose horizontal sums are formed together. The outputs must equal
 * the dot kernel pair by pair, bit for bit (check_matmul). */
static void test_matmul_q8_0_tiles(void **state) {
    (void)state;
    em_pool *pool;
    assert_int_equal(em_pool_create(&pool, 2, NULL), 0);
    static const int64_t shapes[][3] = { { 5, 96, 6 },   { 9, 160, 5 },  { 3, 32, 9 },    { 33, 416, 19 },
                                         { 2, 128, 2 },  { 1, 128, 7 },  { 67, 2048, 33 }, { 3, 2176, 10 },
                                         { 19, 64, 8 },  { 17, 64, 3 },  { 40, 256, 8 },   { 31, 128, 1 },
                                         { 16, 256, 4 }, { 300, 256, 2 }, { 9, 2176, 2 },  { 3, 2208, 1 },
                                         { 21, 2304, 1 }, { 18, 4096, 2 }, { 5, 4096, 3 },  { 7, 4160, 1 } };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        check_matmul(NULL, EM_TYPE_Q8_0, shapes[s][0], shapes[s][1], shapes[s][2]);
        check_matmul(pool, EM_TYPE_Q8_0, shapes[s][0], shapes[s][1], shapes[s][2]);
        check_matmul(pool, EM_TYPE_Q4_0, shapes[s][0], shapes[s][1], shapes[s][2]); /* Q8_0 acts */
    }
    em_pool_free(pool);
}

/* Packed Q8_0 (compute/packed.c): packing in place gives em_mat_pack's bytes; the product
 * through em_matmul_act at every width and
 * thread count is bit for bit the packed layout's scalar reference (its own order: blocks in
 * sequence, acc = fma(d_w * d_a, sum, acc)), which is itself within float rounding of the
 * unpacked product; a row's outputs never depend on the other rows of the call (width
 * invariance: every width against width 1); slices of 16-row multiples stay packed (an
 * expert or a head of a stacked matrix), others fall back to the rows as stored; bad packed
 * matrices are refused. Shapes: one group, several, a chunk of blocks and more (64 blocks a
 * chunk in the AVX-512 kernel: 2048 and 2080 columns), activation rows past 8 (the kernel's
 * registers) and past 16 (matmul's tiles). */
static void check_packed(em_pool *pool, int64_t rows, int64_t cols, int64_t n) {
    uint64_t rb;
    void *w = rand_weights(EM_TYPE_Q8_0, rows, cols, &rb);
    em_mat m, p;
    assert_int_equal(em_mat_init(&m, EM_TYPE_Q8_0, rows, cols, w, NULL), 0);
    p = m;
    assert_true(em_mat_packable(&p));
    assert_int_equal(em_mat_packed_bytes(&p), rb * (uint64_t)rows);
    void *packed = malloc((size_t)em_mat_packed_bytes(&p));
    assert_non_null(packed);
    em_mat_pack(&p, packed);
    assert_ptr_equal(p.packed, packed);
    assert_false(em_mat_packable(&p)); /* once */
    { /* in place (the expert cache's slots): the same bytes where the rows were */
        uint8_t *copy = malloc((size_t)(rb * (uint64_t)rows)), *tmp = malloc((size_t)(EM_PACK_ROWS * rb));
        assert_true(copy && tmp);
        memcpy(copy, w, (size_t)(rb * (uint64_t)rows));
        em_mat q = m;
        em_mat_pack_inplace(&q, copy, tmp);
        assert_ptr_equal(q.packed, copy);
        assert_ptr_equal(q.data, copy);
        assert_memory_equal(copy, packed, (size_t)(rb * (uint64_t)rows));
        free(tmp);
        free(copy);
    }

    const int64_t ldx = cols + 5, ldy = rows + 2;
    float *x = rand_floats(n * ldx, 2.0f);
    uint64_t ab;
    assert_int_equal(em_act_bytes(EM_TYPE_Q8_0, cols, n, &ab, NULL), 0);
    void *abuf = malloc((size_t)ab);
    em_act act;
    assert_int_equal(em_act_prepare(pool, EM_TYPE_Q8_0, x, ldx, cols, n, abuf, &act, NULL), 0);
    float *y = malloc((size_t)(n * ldy) * sizeof *y), *ref = malloc((size_t)(n * rows) * sizeof *ref);
    float *plain = malloc((size_t)(n * ldy) * sizeof *plain), *one = malloc((size_t)rows * sizeof *one);
    assert_true(abuf && y && ref && plain && one);
    for (int64_t i = 0; i < n * ldy; i++) y[i] = NAN;
    em_err err = { 0 };
    if (em_matmul_act(pool, &p, &act, y, ldy, &err)) fail_msg("packed matmul: %s", err.msg);
    assert_int_equal(em_matmul_act(pool, &m, &act, plain, ldy, NULL), 0);
    em_mm_q8_0x16_ref(packed, rows / EM_PACK_ROWS, cols, act.data, act.stride, n, ref, rows);
    for (int64_t j = 0; j < n; j++) {
        em_act a1 = act;
        a1.n = 1;
        a1.data = (const uint8_t *)act.data + (uint64_t)j * act.stride;
        assert_int_equal(em_matmul_act(NULL, &p, &a1, one, rows, NULL), 0);
        for (int64_t r = 0; r < rows; r++) {
            const float got = y[j * ldy + r], want = ref[j * rows + r], u = plain[j * ldy + r];
            if (!(got == want) || !(one[r] == got))
                fail_msg("packed %lldx%lld n=%lld: y[%lld][%lld] = %.9g, reference %.9g, alone %.9g", (long long)rows,
                         (long long)cols, (long long)n, (long long)j, (long long)r, got, want, one[r]);
            if (fabsf(got - u) > 1e-5f * (fabsf(u) + 1.0f))
                fail_msg("packed %lldx%lld: y[%lld][%lld] = %g, unpacked %g", (long long)rows, (long long)cols,
                         (long long)j, (long long)r, got, u);
        }
        for (int64_t r = rows; r < ldy; r++) assert_true(isnan(y[j * ldy + r])); /* padding untouched */
    }
    /* slices: 16-row multiples read the packed rows, others the rows as stored */
    if (rows >= 32) {
        em_mat s16 = em_mat_rows(&p, 16, 16), s5 = em_mat_rows(&p, 5, 7);
        assert_non_null(s16.packed);
        assert_null(s5.packed);
        assert_int_equal(em_matmul_act(NULL, &s16, &act, y, ldy, NULL), 0);
        for (int64_t j = 0; j < n; j++)
            for (int64_t r = 0; r < 16; r++) assert_true(y[j * ldy + r] == ref[j * rows + 16 + r]);
        assert_int_equal(em_matmul_act(NULL, &s5, &act, y, ldy, NULL), 0);
        for (int64_t j = 0; j < n; j++)
            for (int64_t r = 0; r < 7; r++) assert_true(y[j * ldy + r] == plain[j * ldy + 5 + r]);
    }
    free(one);
    free(plain);
    free(ref);
    free(y);
    free(abuf);
    free(x);
    free(packed);
    free(w);
}

static void test_matmul_packed(void **state) {
    (void)state;
    em_pool *pool;
    assert_int_equal(em_pool_create(&pool, 2, NULL), 0);
    static const int64_t shapes[][3] = { { 16, 32, 1 },   { 16, 256, 3 },  { 48, 256, 8 },  { 128, 256, 9 },
                                         { 256, 512, 17 }, { 32, 2048, 2 }, { 64, 2080, 5 }, { 8192, 256, 7 },
                                         { 160, 96, 40 } };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        check_packed(NULL, shapes[s][0], shapes[s][1], shapes[s][2]);
        check_packed(pool, shapes[s][0], shapes[s][1], shapes[s][2]);
    }
    /* what cannot be packed, and a packed matrix that is not what packing makes */
    uint64_t rb;
    void *w = rand_weights(EM_TYPE_Q8_0, 24, 64, &rb);
    em_mat m;
    assert_int_equal(em_mat_init(&m, EM_TYPE_Q8_0, 24, 64, w, NULL), 0);
    assert_false(em_mat_packable(&m)); /* 24 rows */
    m.rows = 16;
    assert_true(em_mat_packable(&m));
    m.data = NULL;
    assert_false(em_mat_packable(&m)); /* a file cut short */
    em_mat f;
    float fw[16 * 32] = { 0 };
    assert_int_equal(em_mat_init(&f, EM_TYPE_F32, 16, 32, fw, NULL), 0);
    assert_false(em_mat_packable(&f));
    em_mat bad = { .type = EM_TYPE_Q8_0, .rows = 24, .cols = 64, .row_bytes = rb, .data = w, .packed = w };
    float x[64] = { 0 }, y[24];
    uint8_t abuf[2 * 34];
    em_act act;
    assert_int_equal(em_act_prepare(NULL, EM_TYPE_Q8_0, x, 64, 64, 1, abuf, &act, NULL), 0);
    em_err err = { 0 };
    assert_int_equal(em_matmul_act(NULL, &bad, &act, y, 24, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "packed"));
    free(w);
    em_pool_free(pool);
}

/* em_act_prepare's Q8_0 activations (a vector quantizer on AVX-512 CPUs) are byte for byte
 * em_dot_quantize_act's (the reference quantizer): random rows at several magnitudes, exact
 * halves (x * id = k + 0.5 must round away from zero), zero blocks, fp16-subnormal and
 * fp16-overflowing scales, and blocks holding NaN or infinities. */
static void test_act_q8_0_bytes(void **state) {
    (void)state;
    enum { COLS = 32 * 24, ROWS = 12 };
    float *x = rand_floats((int64_t)COLS * ROWS, 1.0f);
    static const float mags[ROWS] = { 1.0f, 1e-3f, 100.0f, 1e-7f, 3e-9f, 1e6f, 1e9f, 1e38f, 1.0f, 1.0f, 1.0f, 1e-40f };
    for (int j = 0; j < ROWS; j++)
        for (int c = 0; c < COLS; c++) x[j * COLS + c] *= mags[j];
    float *h = x + 8 * COLS; /* amax 127: d = 1, id = 1, so x * id is x itself */
    for (int c = 0; c < COLS; c++) h[c] = (float)((c % 255) - 127) + ((c & 1) ? 0.5f : 0.0f);
    for (int b = 0; b < COLS / 32; b++) h[b * 32] = b % 2 ? 127.0f : -127.0f;
    float *z = x + 9 * COLS; /* zero blocks, signed zeros */
    for (int c = 0; c < 64; c++) z[c] = (c & 1) ? -0.0f : 0.0f;
    float *e = x + 10 * COLS; /* specials in some blocks, at different places */
    e[3] = NAN;
    e[32 + 31] = INFINITY;
    e[64 + 5] = -INFINITY;
    e[96] = NAN, e[96 + 17] = 2.0f;
    e[128 + 16] = -NAN;
    uint64_t ab, bytes;
    assert_int_equal(em_dot_act_bytes(EM_TYPE_Q8_0, COLS, &ab, NULL), 0);
    assert_int_equal(em_act_bytes(EM_TYPE_Q8_0, COLS, ROWS, &bytes, NULL), 0);
    uint8_t *got = malloc((size_t)bytes), *want = malloc((size_t)ab);
    assert_true(got && want);
    em_act act;
    assert_int_equal(em_act_prepare(NULL, EM_TYPE_Q8_0, x, COLS, COLS, ROWS, got, &act, NULL), 0);
    for (int j = 0; j < ROWS; j++) {
        assert_int_equal(em_dot_quantize_act(EM_TYPE_Q8_0, x + j * COLS, want, COLS, NULL), 0);
        for (uint64_t i = 0; i < ab; i++)
            if (got[(uint64_t)j * act.stride + i] != want[i])
                fail_msg("row %d byte %llu (block %llu): %u, reference %u", j, (unsigned long long)i,
                         (unsigned long long)(i / 34), got[(uint64_t)j * act.stride + i], want[i]);
    }
    free(got);
    free(want);
    free(x);
}

/* em_matmul_multi: several products in one pool run give exactly em_matmul_act's outputs
 * (weight types with different kernels, one and several activation rows, a product with no
 * rows and one with zero columns among them); a bad item is refused before anything is
 * written. */
static void test_matmul_multi(void **state) {
    (void)state;
    em_pool *pool;
    assert_int_equal(em_pool_create(&pool, 2, NULL), 0);
    enum { K = 6 };
    static const int types[K] = { EM_TYPE_Q8_0, EM_TYPE_Q8_0, EM_TYPE_F32, EM_TYPE_Q4_K, EM_TYPE_Q8_0, EM_TYPE_Q8_0 };
    static const int64_t rows[K] = { 300, 77, 40, 33, 0, 5 }, cols[K] = { 256, 512, 96, 256, 64, 0 },
                         ns[K] = { 1, 5, 3, 2, 2, 3 };
    em_mat m[K];
    em_act act[K];
    em_mm_item items[K];
    void *w[K], *buf[K];
    float *x[K], *want[K], *got[K];
    for (int k = 0; k < K; k++) {
        uint64_t rb, bytes;
        w[k] = rows[k] && cols[k] ? rand_weights(types[k], rows[k], cols[k], &rb) : malloc(64);
        assert_int_equal(em_mat_init(&m[k], types[k], rows[k], cols[k], w[k], NULL), 0);
        x[k] = rand_floats(ns[k] * cols[k] + 1, 1.0f);
        assert_int_equal(em_act_bytes(types[k], cols[k], ns[k], &bytes, NULL), 0);
        buf[k] = malloc((size_t)bytes + 64);
        assert_int_equal(em_act_prepare(pool, types[k], x[k], cols[k], cols[k], ns[k], buf[k], &act[k], NULL), 0);
        size_t out = (size_t)(ns[k] * (rows[k] + 1) + 1) * sizeof(float);
        want[k] = malloc(out), got[k] = malloc(out);
        for (size_t i = 0; i < out / sizeof(float); i++) want[k][i] = got[k][i] = NAN;
        assert_int_equal(em_matmul_act(NULL, &m[k], &act[k], want[k], rows[k] + 1, NULL), 0);
        items[k] = (em_mm_item){ .w = &m[k], .act = &act[k], .y = got[k], .ldy = rows[k] + 1 };
    }
    /* a bad item last: nothing is written */
    em_mm_item bad[K + 1];
    memcpy(bad, items, sizeof items);
    bad[K] = (em_mm_item){ .w = &m[0], .act = &act[1], .y = got[0], .ldy = rows[0] };
    em_err err = { 0 };
    assert_int_equal(em_matmul_multi(pool, bad, K + 1, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "product 6"));
    for (int k = 0; k < K; k++) assert_true(isnan(got[k][0]));
    assert_int_equal(em_matmul_multi(pool, items, EM_MATMUL_MULTI_MAX + 1, &err), EM_EINVAL);
    assert_int_equal(em_matmul_multi(pool, items, 0, &err), 0);

    assert_int_equal(em_matmul_multi(pool, items, K, &err), 0);
    for (int k = 0; k < K; k++) {
        size_t out = (size_t)(ns[k] * (rows[k] + 1) + 1) * sizeof(float);
        assert_memory_equal(got[k], want[k], out); /* NaN padding included: same bits */
        if (cols[k] == 0) assert_true(got[k][0] == 0.0f);
        free(w[k]), free(buf[k]), free(x[k]), free(want[k]), free(got[k]);
    }
    em_pool_free(pool);
}

/* A prepared activation set is reusable across matrices of the same activation type, and
 * a slice of rows (em_mat_rows) is the matrix of those rows. */
static void test_act_reuse_and_slices(void **state) {
    (void)state;
    const int64_t rows = 48, cols = 64, n = 5;
    uint64_t rb;
    void *w = rand_weights(EM_TYPE_Q8_0, rows, cols, &rb);
    float *x = rand_floats(n * cols, 1.0f);
    float *full = malloc((size_t)(n * rows) * sizeof *full), *part = malloc((size_t)(n * 16) * sizeof *part);
    uint64_t bytes;
    assert_int_equal(em_act_bytes(EM_TYPE_Q8_0, cols, n, &bytes, NULL), 0);
    void *buf = malloc((size_t)bytes);
    em_mat m, s;
    em_act act;
    assert_int_equal(em_mat_init(&m, EM_TYPE_Q8_0, rows, cols, w, NULL), 0);
    assert_int_equal(em_act_prepare(NULL, EM_TYPE_Q8_0, x, cols, cols, n, buf, &act, NULL), 0);
    assert_int_equal(em_matmul_act(NULL, &m, &act, full, rows, NULL), 0);
    s = em_mat_rows(&m, 16, 16);
    assert_int_equal(em_matmul_act(NULL, &s, &act, part, 16, NULL), 0);
    for (int64_t j = 0; j < n; j++)
        assert_memory_equal(part + j * 16, full + j * rows + 16, 16 * sizeof(float));
    /* F32 weights use the rows in place: no scratch */
    assert_int_equal(em_act_bytes(EM_TYPE_F32, cols, n, &bytes, NULL), 0);
    assert_int_equal(bytes, 0);
    assert_int_equal(em_act_prepare(NULL, EM_TYPE_F32, x, cols, cols, n, NULL, &act, NULL), 0);
    assert_ptr_equal(act.data, x);
    free(buf);
    free(w);
    free(x);
    free(full);
    free(part);
}

/* em_acts / em_mm / em_mm_many: each output is exactly em_matmul's (its own conversion into
 * its own buffer) for weights of several activation types read from one input; the input is
 * converted once per activation type (the same prepared rows come back, and the arena grows by
 * one conversion per type only); a weight type without activations is refused. */
static void test_acts_cache(void **state) {
    (void)state;
    em_pool *pool;
    assert_int_equal(em_pool_create(&pool, 2, NULL), 0);
    em_arena *arena;
    assert_int_equal(em_arena_create(&arena, 1u << 16, NULL), 0);
    enum { K = 5 };
    /* Q8_0 rows twice, Q8_K rows (Q4_K, Q6_K) twice, F32 in place */
    static const int types[K] = { EM_TYPE_Q8_0, EM_TYPE_Q4_K, EM_TYPE_F32, EM_TYPE_Q8_0, EM_TYPE_Q6_K };
    static const int64_t rows[K] = { 70, 33, 19, 5, 40 };
    const int64_t cols = 256, n = 3, ldx = cols + 5;
    float *x = rand_floats(n * ldx, 1.5f);
    em_mat m[K];
    void *w[K];
    float *want[K], *one[K], *many[K];
    em_acts a;
    em_acts_init(&a, x, ldx, cols, n);
    em_mm_out out[K];
    for (int k = 0; k < K; k++) {
        uint64_t rb, bytes;
        w[k] = rand_weights(types[k], rows[k], cols, &rb);
        assert_int_equal(em_mat_init(&m[k], types[k], rows[k], cols, w[k], NULL), 0);
        const size_t sz = (size_t)(n * rows[k]) * sizeof(float);
        want[k] = malloc(sz), one[k] = malloc(sz), many[k] = malloc(sz);
        assert_int_equal(em_act_bytes(types[k], cols, n, &bytes, NULL), 0);
        void *buf = bytes ? malloc((size_t)bytes) : NULL;
        assert_int_equal(em_matmul(pool, &m[k], x, ldx, n, want[k], rows[k], buf, NULL), 0);
        free(buf);
        out[k] = (em_mm_out){ .x = &a, .w = &m[k], .y = many[k], .ldy = rows[k] };
    }
    assert_int_equal(em_mm_many(out, K, pool, arena, NULL), 0);
    const size_t used = em_arena_used(arena);
    uint64_t q8_0, q8_k;
    assert_int_equal(em_act_bytes(EM_TYPE_Q8_0, cols, n, &q8_0, NULL), 0);
    assert_int_equal(em_act_bytes(EM_TYPE_Q4_K, cols, n, &q8_k, NULL), 0);
    assert_true(used >= q8_0 + q8_k && used < q8_0 + q8_k + 2 * 64); /* two conversions, 64-aligned */
    const em_act *first, *again;
    assert_int_equal(em_acts_for(&a, EM_TYPE_Q6_K, pool, arena, &first, NULL), 0);
    assert_int_equal(em_acts_for(&a, EM_TYPE_Q4_K, pool, arena, &again, NULL), 0);
    assert_ptr_equal(first, again);
    assert_int_equal(em_acts_for(&a, EM_TYPE_F32, pool, arena, &first, NULL), 0);
    assert_ptr_equal(first->data, x); /* f32 rows in place */
    for (int k = 0; k < K; k++) {
        assert_int_equal(em_mm(&a, &m[k], one[k], rows[k], pool, arena, NULL), 0);
        const size_t sz = (size_t)(n * rows[k]) * sizeof(float);
        assert_memory_equal(many[k], want[k], sz);
        assert_memory_equal(one[k], want[k], sz);
        free(w[k]), free(want[k]), free(one[k]), free(many[k]);
    }
    assert_int_equal(em_arena_used(arena), used); /* nothing converted twice */
    em_err err = { 0 };
    assert_int_equal(em_mm_many(out, EM_MATMUL_MULTI_MAX + 1, pool, arena, &err), EM_EINVAL);
    float *f = em_falloc(arena, UINT64_MAX / 2, "test rows", &err);
    assert_null(f);
    assert_non_null(strstr(err.msg, "test rows"));
    assert_non_null(em_falloc(arena, 10, "ten", NULL));
    em_arena_free(arena);
    em_pool_free(pool);
    free(x);
}

/* The CPU's nominal costs are the fixed rates the seeded decisions were made on (the old
 * formula, bit for bit), and a device's table adds its kinds and per-op costs. */
static void test_device_costs(void **state) {
    (void)state;
    const double bytes[] = { 0.0, 1.0, 12345.0, 3.3e9, 7.77e7 }, flops[] = { 0.0, 2.0, 9.9e9, 1.234567e11 };
    const int threads[] = { 0, 1, 2, 3, 16 };
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        const em_device_costs d = em_device_costs_cpu(threads[t]);
        assert_string_equal(d.name, "cpu");
        assert_true(d.disk_bps == 2e9);
        for (size_t b = 0; b < sizeof bytes / sizeof bytes[0]; b++)
            for (size_t f = 0; f < sizeof flops / sizeof flops[0]; f++) {
                const double old = bytes[b] / 20e9 + flops[f] / (20e9 * (threads[t] > 0 ? threads[t] : 1));
                const em_work w = { .bytes = bytes[b], .flops = { [EM_WORK_WEIGHTS] = flops[f] } };
                const double got = em_device_seconds(&d, &w);
                assert_memory_equal(&got, &old, sizeof got);
            }
    }
    const em_device_costs gpu = { .name = "gpu", .mem_bps = 4e12, .flops_per_s = { 1e15, 5e13 }, .op_seconds = 1e-6,
                                  .disk_bps = 1e10 };
    const em_work w = { .bytes = 8e9, .flops = { 2e15, 1e14 }, .ops = 100 };
    assert_true(fabs(em_device_seconds(&gpu, &w) - (2e-3 + 2.0 + 2.0 + 1e-4)) < 1e-12);
}

static void test_matmul_errors(void **state) {
    (void)state;
    em_err err = { 0 };
    uint8_t w[4096] = { 0 };
    float x[256] = { 0 }, y[64];
    em_mat m;
    em_act act;
    assert_int_equal(em_mat_init(&m, EM_TYPE_Q8_0, 2, 48, w, &err), EM_EFORMAT); /* not a block multiple */
    assert_int_equal(em_mat_init(&m, EM_TYPE_Q8_0, -1, 32, w, &err), EM_EINVAL);
    assert_int_equal(em_mat_init(&m, EM_TYPE_Q8_0, INT64_MAX / 2, 32, w, &err), EM_EOVERFLOW);
    assert_int_equal(em_mat_init(&m, EM_TYPE_Q8_0, 2, 64, w, NULL), 0);
    /* activations prepared for F32 weights do not meet Q8_0 weights */
    assert_int_equal(em_act_prepare(NULL, EM_TYPE_F32, x, 64, 64, 1, NULL, &act, NULL), 0);
    assert_int_equal(em_matmul_act(NULL, &m, &act, y, 2, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "q8_0"));
    /* wrong width */
    assert_int_equal(em_act_prepare(NULL, EM_TYPE_Q8_0, x, 32, 32, 1, w + 2048, &act, NULL), 0);
    assert_int_equal(em_matmul_act(NULL, &m, &act, y, 2, &err), EM_EINVAL);
    /* a weight type without a dot kernel */
    uint64_t bytes;
    assert_int_equal(em_act_bytes(EM_TYPE_I32, 32, 1, &bytes, &err), EM_EUNSUPPORTED);
    /* stride shorter than a row */
    assert_int_equal(em_act_prepare(NULL, EM_TYPE_Q8_0, x, 16, 32, 2, w, &act, &err), EM_EINVAL);
}

/* ---- row ops ---------------------------------------------------------------------------- */

static void test_norms(void **state) {
    (void)state;
    const int64_t n = 96;
    float *x = rand_floats(n, 3.0f), *w = rand_floats(n, 1.0f), y[96], z[96];
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    em_rmsnorm(x, w, 1e-5f, n, y);
    em_rmsnorm(x, NULL, 1e-6f, n, z);
    for (int64_t i = 0; i < n; i++) {
        double r = x[i] / sqrt(ss / n + 1e-5) * w[i], r0 = x[i] / sqrt(ss / n + 1e-6);
        assert_true(fabs(y[i] - r) <= 2e-7 * fabs(r) + 1e-12);
        assert_true(fabs(z[i] - r0) <= 2e-7 * fabs(r0) + 1e-12);
    }
    em_l2norm(x, 1e-6f, n, y);
    double s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = x[i] / sqrt(ss + 1e-6);
        assert_true(fabs(y[i] - r) <= 2e-7 * fabs(r) + 1e-12);
        s2 += (double)y[i] * y[i];
    }
    assert_true(fabs(s2 - 1.0) < 1e-6);
    /* the eps matters for tiny inputs: all zeros stay zero, no NaN */
    float zero[4] = { 0 }, out[4];
    em_rmsnorm(zero, NULL, 1e-6f, 4, out);
    em_l2norm(zero, 1e-6f, 4, out);
    for (int i = 0; i < 4; i++) assert_true(out[i] == 0.0f);
    /* in place */
    memcpy(z, x, sizeof z);
    em_rmsnorm(z, w, 1e-5f, n, z);
    em_rmsnorm(x, w, 1e-5f, n, y);
    assert_memory_equal(z, y, sizeof y);
    free(x);
    free(w);
}

static void test_activations(void **state) {
    (void)state;
    static const float xs[] = { -30.0f, -5.0f, -0.5f, 0.0f, 0.25f, 3.0f, 19.9f, 20.0f, 20.5f, 60.0f };
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        double x = xs[i];
        double sig = 1.0 / (1.0 + exp(-x));
        assert_true(fabs(em_sigmoidf(xs[i]) - sig) <= 2e-7 * sig + 1e-30);
        assert_true(fabs(em_siluf(xs[i]) - x * sig) <= 2e-7 * fabs(x * sig) + 1e-30);
        double sp = x > 20.0 ? x : log1p(exp(x));
        assert_true(fabs(em_softplusf(xs[i]) - sp) <= 2e-7 * fabs(sp) + 1e-30);
    }
    assert_true(em_softplusf(20.5f) == 20.5f); /* identity above the threshold */
    assert_true(em_softplusf(-30.0f) > 0.0f);  /* never rounds to a log of 1 too early */
    float x[5] = { -2, -1, 0, 1, 2 }, u[5] = { 1, 2, 3, 4, 5 }, y[5];
    em_sigmoid(x, 5, y);
    for (int i = 0; i < 5; i++) assert_true(y[i] == em_sigmoidf(x[i]));
    em_silu(x, 5, y);
    for (int i = 0; i < 5; i++) assert_true(y[i] == em_siluf(x[i]));
    em_swiglu(x, u, 5, y);
    for (int i = 0; i < 5; i++) assert_true(fabs(y[i] - em_siluf(x[i]) * u[i]) <= 1e-6f * fabs(y[i]));
    em_axpy(2.0f, u, 5, y);
    for (int i = 0; i < 5; i++) assert_true(fabs(y[i] - (em_siluf(x[i]) * u[i] + 2 * u[i])) < 1e-5f);
}

static void test_softmax(void **state) {
    (void)state;
    float x[7] = { 1.0f, -3.0f, 0.5f, 80.0f, 79.0f, -100.0f, 2.0f }, ref_in[7];
    memcpy(ref_in, x, sizeof x);
    em_softmax(x, 7);
    double mx = 80, sum = 0;
    for (int i = 0; i < 7; i++) sum += exp(ref_in[i] - mx);
    double total = 0;
    for (int i = 0; i < 7; i++) {
        double r = exp(ref_in[i] - mx) / sum;
        assert_true(fabs(x[i] - r) <= 1e-6 * r + 1e-30);
        total += x[i];
    }
    assert_true(fabs(total - 1.0) < 1e-6); /* no overflow at 80, sums to 1 */
    float one = -5.0f;
    em_softmax(&one, 1);
    assert_true(one == 1.0f);
}

/* em_axpy (an AVX-512 loop on such CPUs) gives the scalar loop's floats exactly: a product
 * rounded, then a sum rounded, element by element, also in place (x == y) and when x and y
 * overlap (where the loop's order shows: later elements see earlier updates). */
static void scalar_axpy(float a, const float *x, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) {
        volatile float p = a * x[i]; /* no contraction into an fma */
        y[i] = y[i] + p;
    }
}

static void test_axpy(void **state) {
    (void)state;
    static const int64_t lens[] = { 0, 1, 15, 16, 17, 100, 515 };
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        const int64_t n = lens[k];
        float *x = rand_floats(n + 8, 3.0f), *y = rand_floats(n + 8, 5.0f);
        float *want = malloc((size_t)(n + 8) * sizeof *want), *x2 = malloc((size_t)(n + 8) * sizeof *x2);
        assert_true(want && x2);
        const float a = 0.3183099f;
        memcpy(want, y, (size_t)(n + 8) * sizeof *y);
        scalar_axpy(a, x, n, want);
        em_axpy(a, x, n, y);
        assert_memory_equal(y, want, (size_t)(n + 8) * sizeof *y); /* and nothing past n */
        memcpy(x2, x, (size_t)(n + 8) * sizeof *x);
        scalar_axpy(a, x2, n, x2); /* in place */
        em_axpy(a, x, n, x);
        assert_memory_equal(x, x2, (size_t)(n + 8) * sizeof *x);
        if (n > 2) { /* overlapping: y starts one element after x */
            memcpy(x2, x, (size_t)(n + 8) * sizeof *x);
            scalar_axpy(a, x2, n - 1, x2 + 1);
            em_axpy(a, x, n - 1, x + 1);
            assert_memory_equal(x, x2, (size_t)(n + 8) * sizeof *x);
        }
        free(x), free(y), free(want), free(x2);
    }
}

/* Attention rows (em_dot_rows, em_weighted_rows) against their documented arithmetic, spelled
 * out here in plain C: the same floats on every ISA, whatever the length (tails of 1..15
 * values, rows shorter than a vector) and row count (groups of four and their remainders),
 * with rows strided in a wider buffer; and nothing written past m scores / n outputs. */
static float lane_dot(const float *x, const float *q, int64_t n) {
    float acc[16];
    for (int l = 0; l < 16; l++) acc[l] = 0.0f;
    for (int64_t k = 0; k < n; k += 16)
        for (int l = 0; l < 16; l++) acc[l] = k + l < n ? fmaf(x[k + l], q[k + l], acc[l]) : fmaf(0.0f, 0.0f, acc[l]);
    float s8[8], s4[4], s2[2];
    for (int l = 0; l < 8; l++) s8[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
    for (int l = 0; l < 2; l++) s2[l] = s4[l] + s4[l + 2];
    return s2[0] + s2[1];
}

static void test_attention_rows(void **state) {
    (void)state;
    static const int64_t widths[] = { 1, 15, 16, 17, 64, 100, 128, 130, 160, 200, 300 };
    static const int64_t counts[] = { 1, 3, 4, 5, 9, 130 };
    for (size_t a = 0; a < sizeof widths / sizeof widths[0]; a++)
        for (size_t b = 0; b < sizeof counts / sizeof counts[0]; b++) {
            const int64_t n = widths[a], m = counts[b], ld = n + 7;
            float *x = rand_floats(m * ld, 2.0f), *q = rand_floats(n, 1.5f), *p = rand_floats(m, 0.5f);
            float *s = malloc((size_t)(m + 4) * sizeof *s), *y = malloc((size_t)(n + 4) * sizeof *y);
            assert_true(s && y);
            for (int64_t i = 0; i < m + 4; i++) s[i] = -7.0f;
            for (int64_t i = 0; i < n + 4; i++) y[i] = -7.0f;
            em_dot_rows(x, ld, m, q, n, 0.125f, s);
            for (int64_t u = 0; u < m; u++) {
                const float want = lane_dot(x + u * ld, q, n) * 0.125f;
                assert_memory_equal(&s[u], &want, sizeof want);
            }
            for (int64_t i = m; i < m + 4; i++) assert_true(s[i] == -7.0f);
            em_weighted_rows(p, x, ld, m, n, y);
            for (int64_t i = 0; i < n; i++) {
                float want = 0.0f;
                for (int64_t u = 0; u < m; u++) want = fmaf(p[u], x[u * ld + i], want);
                assert_memory_equal(&y[i], &want, sizeof want);
            }
            for (int64_t i = n; i < n + 4; i++) assert_true(y[i] == -7.0f);
            free(x), free(q), free(p), free(s), free(y);
        }
}

/* em_rmsnorm_rows gives em_rmsnorm's floats row by row, bit for bit: 1..19 rows (groups of
 * eight and their remainders), strided input and output, in place, with and without weights,
 * rows of very different magnitudes side by side; nothing written between rows. */
static void test_rmsnorm_rows(void **state) {
    (void)state;
    static const int64_t widths[] = { 1, 7, 64, 256, 1000 };
    for (size_t a = 0; a < sizeof widths / sizeof widths[0]; a++)
        for (int64_t rows = 1; rows <= 19; rows += 3)
            for (int weighted = 0; weighted < 2; weighted++) {
                const int64_t n = widths[a], ldx = n + 5, ldy = n + 2;
                float *x = rand_floats(rows * ldx, 3.0f), *w = weighted ? rand_floats(n, 1.0f) : NULL;
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t i = 0; i < n; i++) x[r * ldx + i] *= (r % 3 == 0) ? 1e-20f : (r % 3 == 1) ? 1e15f : 1.0f;
                float *y = malloc((size_t)(rows * ldy) * sizeof *y), *want = malloc((size_t)n * sizeof *want);
                float *in_place = malloc((size_t)(rows * ldx) * sizeof *in_place);
                assert_true(y && want && in_place);
                for (int64_t i = 0; i < rows * ldy; i++) y[i] = -7.0f;
                memcpy(in_place, x, (size_t)(rows * ldx) * sizeof *x);
                em_rmsnorm_rows(x, ldx, w, 1e-6f, rows, n, y, ldy);
                em_rmsnorm_rows(in_place, ldx, w, 1e-6f, rows, n, in_place, ldx);
                for (int64_t r = 0; r < rows; r++) {
                    em_rmsnorm(x + r * ldx, w, 1e-6f, n, want);
                    assert_memory_equal(y + r * ldy, want, (size_t)n * sizeof *want);
                    assert_memory_equal(in_place + r * ldx, want, (size_t)n * sizeof *want);
                    for (int64_t i = n; i < ldy; i++) assert_true(y[r * ldy + i] == -7.0f);
                }
                free(x), free(w), free(y), free(want), free(in_place);
            }
}

/* The multi-query forms (em_dot_rows_multi, em_weighted_rows_multi) give, query by query, the
 * one-row forms' floats bit for bit: widths with and without a 16-value tail and past one
 * 128-column block, row counts around the 16-row blocks, 1..9 queries (pairs and a lone
 * one), per-query row counts that differ (causal rows: m, m - 1, ...; one of 0), strided
 * queries and outputs; nothing written past a query's scores / outputs. */
static void test_attention_rows_multi(void **state) {
    (void)state;
    static const int64_t widths[] = { 16, 17, 64, 128, 130, 160, 300 };
    static const int64_t counts[] = { 1, 5, 16, 17, 33, 150 };
    static const int nqs[] = { 1, 2, 3, 8, 9 };
    for (size_t a = 0; a < sizeof widths / sizeof widths[0]; a++)
        for (size_t b = 0; b < sizeof counts / sizeof counts[0]; b++)
            for (size_t c = 0; c < sizeof nqs / sizeof nqs[0]; c++) {
                const int64_t n = widths[a], m = counts[b], ld = n + 7, lds = m + 5, ldy = n + 3;
                const int nq = nqs[c];
                float *x = rand_floats(m * ld, 2.0f), *q = rand_floats(nq * ld, 1.5f), *p = rand_floats(nq * lds, 0.5f);
                float *s = malloc((size_t)(nq * lds) * sizeof *s), *y = malloc((size_t)(nq * ldy) * sizeof *y);
                float *want = malloc((size_t)(m + n) * sizeof *want);
                int64_t mt[9];
                assert_true(s && y && want);
                for (int64_t i = 0; i < nq * lds; i++) s[i] = -7.0f;
                for (int64_t i = 0; i < nq * ldy; i++) y[i] = -7.0f;
                em_dot_rows_multi(x, ld, m, q, ld, nq, n, 0.125f, s, lds);
                for (int t = 0; t < nq; t++) {
                    em_dot_rows(x, ld, m, q + t * ld, n, 0.125f, want);
                    assert_memory_equal(s + t * lds, want, (size_t)m * sizeof *want);
                    for (int64_t i = m; i < lds; i++) assert_true(s[t * lds + i] == -7.0f);
                    mt[t] = m - t > 0 ? m - t : 0;
                }
                if (nq > 2) mt[1] = 0;
                em_weighted_rows_multi(p, lds, mt, nq, x, ld, n, y, ldy);
                for (int t = 0; t < nq; t++) {
                    em_weighted_rows(p + t * lds, x, ld, mt[t], n, want);
                    assert_memory_equal(y + t * ldy, want, (size_t)n * sizeof *want);
                    for (int64_t i = n; i < ldy; i++) assert_true(y[t * ldy + i] == -7.0f);
                }
                free(x), free(q), free(p), free(s), free(y), free(want);
            }
}

/* em_expf_poly within 3 ulp of exp over the range softmax feeds it (and its edges), and
 * em_softmax_poly (vectorized on AVX-512) equal, bit for bit, to its definition through the
 * scalar em_expf_poly, for lengths with and without a vector tail. */
static void test_softmax_poly(void **state) {
    (void)state;
    for (int i = 0; i <= 20000; i++) {
        const float x = -110.0f + 200.0f * (float)i / 20000.0f;
        const double want = exp((double)x);
        const float got = em_expf_poly(x);
        if (x < -103.0f) assert_true(got == 0.0f);
        else if (x > 88.7228394f) assert_true(isinf(got));
        else if (want >= 1.17549435e-38) assert_true(fabs(got - want) <= 3.0 * (double)nextafterf((float)want, INFINITY) - 3.0 * want + 1e-300);
        else assert_true(fabs(got - want) <= 1.5e-45);
    }
    assert_true(em_expf_poly(0.0f) == 1.0f);
    assert_true(isnan(em_expf_poly(NAN)));
    static const int64_t lens[] = { 1, 5, 16, 17, 100, 513 };
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        const int64_t n = lens[k];
        float *x = rand_floats(n, 30.0f), *want = malloc((size_t)n * sizeof *want);
        assert_true(want);
        float mx = x[0];
        for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += want[i] = em_expf_poly(x[i] - mx);
        for (int64_t i = 0; i < n; i++) want[i] *= (float)(1.0 / sum);
        em_softmax_poly(x, n);
        assert_memory_equal(x, want, (size_t)n * sizeof *x);
        free(x), free(want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_poly),
        cmocka_unit_test(test_attention_rows),
        cmocka_unit_test(test_attention_rows_multi),
        cmocka_unit_test(test_rmsnorm_rows),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_q8_0_tiles),
        cmocka_unit_test(test_matmul_packed),
        cmocka_unit_test(test_act_q8_0_bytes),
        cmocka_unit_test(test_matmul_multi),
        cmocka_unit_test(test_act_reuse_and_slices),
        cmocka_unit_test(test_matmul_errors),
        cmocka_unit_test(test_acts_cache),
        cmocka_unit_test(test_device_costs),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_axpy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
