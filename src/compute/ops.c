/* Row and element-wise ops in fp32: RMSNorm, L2 norm, sigmoid, SiLU, SwiGLU, SiTU, softmax, axpy.
 * Sums of squares and the softmax denominator accumulate in double, so results do not depend
 * on the order of the sum (they are the exact value rounded once, up to libm's expf). Outputs
 * may alias inputs; nothing is allocated. */
#include "compute/compute.h"

#include "compute/ops_kernels.h"

static double sum_squares(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
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
