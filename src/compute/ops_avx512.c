/* AVX-512 forms of the row ops of ops.c that sit in hot loops (MLA's scores and context sums,
 * the MoE combine). Each gives exactly the scalar loop's floats: the same IEEE operations per
 * element (axpy: a multiply rounded, then an add rounded, no fused multiply-add; the
 * attention rows: the fused multiply-adds and lane order that ops.c spells out), only
 * sixteen at a time. The forms over several query rows (verification and prefill attention)
 * only change the loop order: every score and context value is made by the operations of the
 * one-row form, in its order. */
#include "compute/ops_kernels.h"

#include <immintrin.h>

#include "compute/hsum_avx512.h"
#include "quant/simd.h"

/* Loops over a fixed set of accumulators must be unrolled, or -O2 keeps the accumulators in
 * memory and every fma waits on a store (measured 4-5x slower). */
#define UNROLL _Pragma("GCC unroll 8")

void em_axpy_avx512(float a, const float *x, int64_t n, float *y) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(va, _mm512_loadu_ps(x + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* The multi-query form with one query: its scores are bit for bit the one-row sums (16 lanes
 * halved 16 -> 8 -> 4 -> 2 -> 1, as dot_lanes of ops.c), summed 16 rows at a time. */
void em_dot_rows_avx512(const float *x, int64_t ldx, int64_t m, const float *q, int64_t n, float scale, float *s) {
    em_dot_rows_multi_avx512(x, ldx, m, q, n, 1, n, scale, s, m);
}

static void weighted_block(const float *p, int64_t u0, int64_t u1, const float *x, int64_t ldx, int64_t n, float *y);

/* Columns in blocks of 8 x 16 held in registers while every row streams past (the blocked
 * form below over one block of every row, from zeros). */
void em_weighted_rows_avx512(const float *p, const float *x, int64_t ldx, int64_t m, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = 0.0f;
    weighted_block(p, 0, m, x, ldx, n, y);
}

/* The accumulators of the scores of rows x[0..U) (U <= 16) for query q (four independent
 * chains at a time, each row's one fma chain in column order), into part[0..U). */
static inline void dot_accs(const float *x, int64_t ldx, int U, const float *q, int64_t full, __mmask16 tail,
                            __m512 *part) {
    int r = 0;
    for (; r + 4 <= U; r += 4) {
        const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k < full; k += 16) {
            const __m512 vq = _mm512_loadu_ps(q + k);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x0 + k), vq, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x1 + k), vq, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x2 + k), vq, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x3 + k), vq, a3);
        }
        if (tail) {
            const __m512 vq = _mm512_maskz_loadu_ps(tail, q + k);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x0 + k), vq, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x1 + k), vq, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x2 + k), vq, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x3 + k), vq, a3);
        }
        part[r] = a0, part[r + 1] = a1, part[r + 2] = a2, part[r + 3] = a3;
    }
    for (; r < U; r++) {
        const float *xu = x + r * ldx;
        __m512 a = _mm512_setzero_ps();
        int64_t k = 0;
        for (; k < full; k += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(xu + k), _mm512_loadu_ps(q + k), a);
        if (tail) a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, xu + k), _mm512_maskz_loadu_ps(tail, q + k), a);
        part[r] = a;
    }
}

/* dot_accs for two queries at once: eight independent chains (four rows x two queries) keep
 * both fma units busy where four wait on their latency, and each row value loaded feeds two
 * products. Every chain is one score's, in dot_accs's order. */
static inline void dot_accs2(const float *x, int64_t ldx, int U, const float *qa, const float *qb, int64_t full,
                             __mmask16 tail, __m512 *pa, __m512 *pb) {
    int r = 0;
    for (; r + 4 <= U; r += 4) {
        const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        int64_t k = 0;
        for (; k < full; k += 16) {
            const __m512 va = _mm512_loadu_ps(qa + k), vb = _mm512_loadu_ps(qb + k);
            const __m512 v0 = _mm512_loadu_ps(x0 + k), v1 = _mm512_loadu_ps(x1 + k);
            const __m512 v2 = _mm512_loadu_ps(x2 + k), v3 = _mm512_loadu_ps(x3 + k);
            a0 = _mm512_fmadd_ps(v0, va, a0), b0 = _mm512_fmadd_ps(v0, vb, b0);
            a1 = _mm512_fmadd_ps(v1, va, a1), b1 = _mm512_fmadd_ps(v1, vb, b1);
            a2 = _mm512_fmadd_ps(v2, va, a2), b2 = _mm512_fmadd_ps(v2, vb, b2);
            a3 = _mm512_fmadd_ps(v3, va, a3), b3 = _mm512_fmadd_ps(v3, vb, b3);
        }
        if (tail) {
            const __m512 va = _mm512_maskz_loadu_ps(tail, qa + k), vb = _mm512_maskz_loadu_ps(tail, qb + k);
            const __m512 v0 = _mm512_maskz_loadu_ps(tail, x0 + k), v1 = _mm512_maskz_loadu_ps(tail, x1 + k);
            const __m512 v2 = _mm512_maskz_loadu_ps(tail, x2 + k), v3 = _mm512_maskz_loadu_ps(tail, x3 + k);
            a0 = _mm512_fmadd_ps(v0, va, a0), b0 = _mm512_fmadd_ps(v0, vb, b0);
            a1 = _mm512_fmadd_ps(v1, va, a1), b1 = _mm512_fmadd_ps(v1, vb, b1);
            a2 = _mm512_fmadd_ps(v2, va, a2), b2 = _mm512_fmadd_ps(v2, vb, b2);
            a3 = _mm512_fmadd_ps(v3, va, a3), b3 = _mm512_fmadd_ps(v3, vb, b3);
        }
        pa[r] = a0, pa[r + 1] = a1, pa[r + 2] = a2, pa[r + 3] = a3;
        pb[r] = b0, pb[r + 1] = b1, pb[r + 2] = b2, pb[r + 3] = b3;
    }
    if (r < U) {
        dot_accs(x + r * ldx, ldx, U - r, qa, full, tail, pa + r);
        dot_accs(x + r * ldx, ldx, U - r, qb, full, tail, pb + r);
    }
}

/* The scores of rows [u0, u0 + U) for one query from their accumulators part[0..U). */
static inline void store_scores(__m512 *part, int U, __m512 vs, float *s) {
    for (int r = U; r < 16; r++) part[r] = _mm512_setzero_ps(); /* lanes that are not stored */
    _mm512_mask_storeu_ps(s, (__mmask16)((1u << U) - 1), _mm512_mul_ps(em_hsum512_x16(part), vs));
}

/* Blocks of 16 rows stay in L1 while every query passes them (the one-row form streams all
 * rows again for each query), queries two at a time; the 16 sums of a block and query go
 * through one tree. */
void em_dot_rows_multi_avx512(const float *x, int64_t ldx, int64_t m, const float *q, int64_t ldq, int nq, int64_t n,
                              float scale, float *s, int64_t lds) {
    const int64_t full = n / 16 * 16;
    const __mmask16 tail = (__mmask16)((1u << (n - full)) - 1);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t u0 = 0; u0 < m; u0 += 16) {
        const int U = m - u0 < 16 ? (int)(m - u0) : 16;
        const float *xu = x + u0 * ldx;
        int t = 0;
        for (; t + 2 <= nq; t += 2) {
            __m512 pa[16], pb[16];
            dot_accs2(xu, ldx, U, q + t * ldq, q + (t + 1) * ldq, full, tail, pa, pb);
            store_scores(pa, U, vs, s + t * lds + u0);
            store_scores(pb, U, vs, s + (t + 1) * lds + u0);
        }
        if (t < nq) {
            __m512 part[16];
            dot_accs(xu, ldx, U, q + t * ldq, full, tail, part);
            store_scores(part, U, vs, s + t * lds + u0);
        }
    }
}

/* Rows of x in blocks of WR_BLOCK that stay in L1 while every query passes over them; a
 * query's sums go back to y between blocks (an exact store and reload), so each value is still
 * one fused multiply-add chain over u ascending from 0, em_weighted_rows's floats, while x is
 * read from memory once for all the queries instead of once per query. */
#define WR_BLOCK 16

/* The same for w <= 64 columns: four chains side by side (one per 16 columns, masked to the
 * columns there are), so that a head of 64 values does not wait on one fma chain's latency per
 * 16 columns in turn; each column's chain is unchanged. */
static void weighted_cols64(const float *p, int64_t u0, int64_t u1, const float *x, int64_t ldx, int64_t w, float *y) {
    __mmask16 mk[4];
    __m512 a[4];
    UNROLL for (int b = 0; b < 4; b++) {
        const int64_t c = w - 16 * b;
        mk[b] = c >= 16 ? (__mmask16)0xFFFF : c > 0 ? (__mmask16)((1u << c) - 1) : (__mmask16)0;
        a[b] = _mm512_maskz_loadu_ps(mk[b], y + 16 * b);
    }
    for (int64_t u = u0; u < u1; u++) {
        const __m512 pu = _mm512_set1_ps(p[u]);
        const float *xu = x + u * ldx;
        UNROLL for (int b = 0; b < 4; b++) a[b] = _mm512_fmadd_ps(pu, _mm512_maskz_loadu_ps(mk[b], xu + 16 * b), a[b]);
    }
    UNROLL for (int b = 0; b < 4; b++) _mm512_mask_storeu_ps(y + 16 * b, mk[b], a[b]);
}

/* y[0..n) += the weighted rows [u0, u1) of query p (y holds the sums of the rows before u0). */
static void weighted_block(const float *p, int64_t u0, int64_t u1, const float *x, int64_t ldx, int64_t n, float *y) {
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m512 a[8];
        UNROLL for (int b = 0; b < 8; b++) a[b] = _mm512_loadu_ps(y + i + 16 * b);
        for (int64_t u = u0; u < u1; u++) {
            const __m512 pu = _mm512_set1_ps(p[u]);
            const float *xu = x + u * ldx + i;
            UNROLL for (int b = 0; b < 8; b++) a[b] = _mm512_fmadd_ps(pu, _mm512_loadu_ps(xu + 16 * b), a[b]);
        }
        UNROLL for (int b = 0; b < 8; b++) _mm512_storeu_ps(y + i + 16 * b, a[b]);
    }
    for (; i < n; i += 64) weighted_cols64(p, u0, u1, x + i, ldx, n - i < 64 ? n - i : 64, y + i);
}

void em_weighted_rows_multi_avx512(const float *p, int64_t ldp, const int64_t *m, int nq, const float *x, int64_t ldx,
                                   int64_t n, float *y, int64_t ldy) {
    if (nq == 1) {
        em_weighted_rows_avx512(p, x, ldx, m[0], n, y);
        return;
    }
    int64_t most = 0;
    for (int t = 0; t < nq; t++) {
        for (int64_t i = 0; i < n; i++) y[t * ldy + i] = 0.0f;
        if (m[t] > most) most = m[t];
    }
    for (int64_t u0 = 0; u0 < most; u0 += WR_BLOCK)
        for (int t = 0; t < nq; t++) {
            const int64_t u1 = u0 + WR_BLOCK < m[t] ? u0 + WR_BLOCK : m[t];
            if (u1 > u0) weighted_block(p + t * ldp, u0, u1, x, ldx, n, y + t * ldy);
        }
}

/* em_expf_poly of ops.c sixteen at a time (the same operations; 2^k by scalef, exact as
 * scalbnf is, subnormal results rounded once the same way). */
void em_exp_shift_avx512(float *x, int64_t n, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx), lo = _mm512_set1_ps(-103.0f), hi = _mm512_set1_ps(88.7228394f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), ln2hi = _mm512_set1_ps(0.693145751953125f),
                 ln2lo = _mm512_set1_ps(1.42860682030941723e-06f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmx);
        const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 r = _mm512_fnmadd_ps(k, ln2lo, _mm512_fnmadd_ps(k, ln2hi, v));
        const __m512 p = EM_EXP_TAYLOR7(_mm512_fmadd_ps, _mm512_set1_ps, r);
        __m512 e = _mm512_scalef_ps(p, k);
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), _mm512_setzero_ps());
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), _mm512_set1_ps(__builtin_inff()));
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
        _mm512_mask_storeu_ps(x + i, m, e);
    }
}
