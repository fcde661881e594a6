/* model/kda_kern.h (internal to model/kda*.c): the few numeric kernels the KDA core spends
 * its time in, as a table with a portable scalar implementation (kda.c), an AVX2+FMA one
 * (kda_avx2.c) and that one with an AVX-512 state sweep (kda_avx512.c). Within one table every kernel is deterministic and its accumulation order
 * does not depend on how a caller splits work, which is what makes a fused multi-row sweep
 * bit-identical to the same rows fed one call at a time. */
#ifndef EM_MODEL_KDA_KERN_H
#define EM_MODEL_KDA_KERN_H

#include <stddef.h>

typedef struct em_kda_kern {
    /* One pass over a head's state [D][D] (row r = key channel r, contiguous over value
     * columns), read from src (src == S allowed). If a != NULL: S[r][c] = a[r]*src[r][c] +
     * k[r]*delta[c] (decay then rank-1 update; S written). Then, on the resulting rows (src's
     * rows when a == NULL), if x != NULL: u[c] = sum_r x[r]*row[r][c], and if y != NULL:
     * w[c] = sum_r y[r]*row[r][c] (r ascending). */
    void (*sweep)(float *S, const float *src, int D, const float *a, const float *k,
                  const float *delta, const float *x, const float *y, float *u, float *w);
    /* C[M][N] += alpha * (A B). A(i,p) = A[i*ars + p*acs]; B(p,j) = B[p*ldb + j];
     * C(i,j) = C[i*ldc + j]. */
    void (*gemm)(int M, int N, int K, float alpha, const float *A, ptrdiff_t ars,
                 ptrdiff_t acs, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc);
    /* r1 = sum a[i]*c[i], r2 = sum b[i]*c[i] (b may be NULL: r2 untouched). */
    void (*dot2)(const float *a, const float *b, const float *c, int n, float *r1, float *r2);
    /* y[i] = exp(x[i]) (x == y allowed). */
    void (*vexp)(const float *x, float *y, int n);
    /* Element-wise row operations (n any; y may alias an input of the same index). */
    void (*add)(float *y, const float *x, int n);                     /* y += x */
    void (*mul)(float *y, const float *a, const float *x, int n);     /* y = a x */
    void (*muladd)(float *y, const float *a, const float *x, int n);  /* y += a x */
    void (*axpy)(float *y, float s, const float *x, int n);           /* y += s x */
    void (*scale)(float *y, float s, int n);                          /* y *= s */
    void (*wxpy)(float *y, const float *w, float s, const float *x, int n); /* y = w + s x */
    void (*delta)(float *y, float beta, const float *v, const float *u, int n); /* beta (v-u) */
    void (*silu)(float *x, int n);                                    /* x / (1 + exp(-x)) */
    /* g = a softplus(g), softplus(x) = log(1 + exp(x)) (= x for x > 20, torch threshold) */
    void (*gate_softplus)(float *g, float a, int n);
    void (*gate_bounded)(float *g, float a, float lb, int n);         /* lb / (1 + exp(a g)) */
    /* y = w (o rs) / (1 + exp(-g2)): the gated RMSNorm output */
    void (*norm_gate)(float *y, const float *w, const float *o, float rs, const float *g2, int n);
} em_kda_kern;

/* AVX2+FMA table (kda_avx2.c); only call when the CPU supports it. */
const em_kda_kern *em_kda_kern_avx2(void);
/* The same table with the AVX-512 sweep where the head dim suits it (kda_avx2.c; only call
 * on CPUs that run AVX-512); bit for bit the AVX2 table's results. */
const em_kda_kern *em_kda_kern_avx512(void);
/* The AVX-512 sweep (kda_avx512.c), for head dims em_kda_sweep_avx512_fits. */
int em_kda_sweep_avx512_fits(int D);
void em_kda_sweep_avx512(float *S, const float *src, int D, const float *a, const float *k, const float *delta,
                         const float *x, const float *y, float *u, float *w);

#endif
