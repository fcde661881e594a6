/* Row and element-wise ops in fp32: RMSNorm, L2 norm, sigmoid, SiLU, SwiGLU, SiTU, softmax, axpy,
 * attention's score and weighted-sum rows (their lane order is fixed, see compute.h).
 * Sums of squares and the softmax denominator accumulate in double, so the order of the sum
 * (fixed all the same) hardly matters: their error is far below one float rounding. Outputs
 * may alias inputs; nothing is allocated. */
#include "compute/compute.h"

#include "compute/ops_kernels.h"

#include <math.h>

/* Eight independent lanes (lane j takes the values j, j + 8, ...; a single dependent chain of
 * double adds made a 2048-wide norm cost ~15 us), added in a fixed tree. */
static double sum_squares(const float *x, int64_t n) {
    double a[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += (double)x[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) a[j] += (double)x[i] * x[i];
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

void em_rmsnorm(const float *x, const float *w, float eps, int64_t n, float *y) {
    if (n <= 0) return;
    /* the scale is rounded to fp32 once, as torch's x * rsqrt(mean + eps) does */
    float scale = (float)(1.0 / sqrt(sum_squares(x, n) / (double)n + (double)eps));
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

void em_rmsnorm_rows(const float *x, int64_t ldx, const float *w, float eps, int64_t rows, int64_t n, float *y,
                     int64_t ldy) {
    if (n <= 0) return;
    for (int64_t r = 0; r < rows; r++) em_rmsnorm(x + r * ldx, w, eps, n, y + r * ldy);
}

void em_l2norm(const float *x, float eps, int64_t n, float *y) {
    if (n <= 0) return;
    float scale = (float)(1.0 / sqrt(sum_squares(x, n) + (double)eps));
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

void em_sigmoid(const float *x, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = em_sigmoidf(x[i]);
}

void em_silu(const float *x, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = em_siluf(x[i]);
}

void em_swiglu(const float *gate, const float *up, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = em_siluf(gate[i]) * up[i];
}

void em_situ(const float *gate, const float *up, float beta, float lin_beta, int64_t n, float *y) {
    const float inv = 1.0f / beta, lin_inv = lin_beta > 0.0f ? 1.0f / lin_beta : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        /* the scales as multiplications by the reciprocal, as llama.cpp's graph has them */
        const float a = beta * tanhf(gate[i] * inv) * em_sigmoidf(gate[i]);
        const float u = lin_beta > 0.0f ? lin_beta * tanhf(up[i] * lin_inv) : up[i];
        y[i] = a * u;
    }
}

void em_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void em_axpy(float a, const float *x, int64_t n, float *y) {
    /* the vector form reads 16 values of x before writing 16 of y: the same result only when
     * the arrays are one and the same or do not overlap */
    const uintptr_t xa = (uintptr_t)x, ya = (uintptr_t)y, bytes = (uintptr_t)n * sizeof(float);
    const bool apart = xa == ya || xa + bytes <= ya || ya + bytes <= xa;
    if (n >= 16 && apart && em_isa_default() == EM_ISA_AVX512) {
        em_axpy_avx512(a, x, n, y);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const float p = a * x[i]; /* its own statement: no compiler contracts it into an fma */
        y[i] += p;
    }
}

/* The 16-lane sum of em_dot_rows: lanes, then halves 16 -> 8 -> 4 -> 2 -> 1. */
static float dot_lanes(const float *x, const float *q, int64_t n) {
    float acc[16] = { 0 };
    for (int64_t k = 0; k < n; k += 16)
        for (int l = 0; l < 16; l++)
            acc[l] = k + l < n ? fmaf(x[k + l], q[k + l], acc[l]) : fmaf(0.0f, 0.0f, acc[l]);
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

void em_dot_rows(const float *x, int64_t ldx, int64_t m, const float *q, int64_t n, float scale, float *s) {
    if (m <= 0) return;
    if (n > 0 && em_isa_default() == EM_ISA_AVX512) {
        em_dot_rows_avx512(x, ldx, m, q, n, scale, s);
        return;
    }
    for (int64_t u = 0; u < m; u++) s[u] = dot_lanes(x + u * ldx, q, n) * scale;
}

void em_weighted_rows(const float *p, const float *x, int64_t ldx, int64_t m, int64_t n, float *y) {
    if (n <= 0) return;
    if (m > 0 && em_isa_default() == EM_ISA_AVX512) {
        em_weighted_rows_avx512(p, x, ldx, m, n, y);
        return;
    }
    for (int64_t i = 0; i < n; i++) y[i] = 0.0f;
    for (int64_t u = 0; u < m; u++)
        for (int64_t i = 0; i < n; i++) y[i] = fmaf(p[u], x[u * ldx + i], y[i]);
}

void em_dot_rows_multi(const float *x, int64_t ldx, int64_t m, const float *q, int64_t ldq, int nq, int64_t n,
                       float scale, float *s, int64_t lds) {
    if (m <= 0 || nq <= 0) return;
    if (n > 0 && em_isa_default() == EM_ISA_AVX512) {
        em_dot_rows_multi_avx512(x, ldx, m, q, ldq, nq, n, scale, s, lds);
        return;
    }
    for (int t = 0; t < nq; t++) em_dot_rows(x, ldx, m, q + t * ldq, n, scale, s + t * lds);
}

void em_weighted_rows_multi(const float *p, int64_t ldp, const int64_t *m, int nq, const float *x, int64_t ldx,
                            int64_t n, float *y, int64_t ldy) {
    if (n <= 0 || nq <= 0) return;
    if (em_isa_default() == EM_ISA_AVX512) {
        em_weighted_rows_multi_avx512(p, ldp, m, nq, x, ldx, n, y, ldy);
        return;
    }
    for (int t = 0; t < nq; t++) em_weighted_rows(p + t * ldp, x, ldx, m[t], n, y + t * ldy);
}

/* The constants of em_expf_poly: ln 2 in two parts (the high part has trailing zero bits, so
 * k * LN2_HI is exact for |k| < 2^11), and 1/j! for the polynomial. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693145751953125f
#define EXP_LN2_LO 1.42860682030941723e-06f
#define EXP_LO -103.0f
#define EXP_HI 88.7228394f

float em_expf_poly(float x) {
    if (!(x >= EXP_LO)) return x != x ? x : 0.0f; /* NaN stays NaN */
    if (x > EXP_HI) return INFINITY;
    const float k = nearbyintf(x * EXP_LOG2E);
    const float r = fmaf(-k, EXP_LN2_LO, fmaf(-k, EXP_LN2_HI, x));
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return scalbnf(p, (int)k);
}

void em_softmax_poly(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    if (em_isa_default() == EM_ISA_AVX512) em_exp_shift_avx512(x, n, mx);
    else
        for (int64_t i = 0; i < n; i++) x[i] = em_expf_poly(x[i] - mx);
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}
