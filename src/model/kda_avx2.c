/* model/kda_avx2.c: the AVX2+FMA table of KDA kernels (see kda_kern.h). Compiled with
 * -mavx2 -mfma; kda.c only hands this table out when the CPU runs AVX2 (em_isa_default).
 * Every kernel keeps a fixed accumulation order per output element, independent of M/N
 * blocking decisions made by callers. exp is our own (Cody-Waite reduction + degree-7
 * Taylor polynomial, about 1-2 ulp); it flushes results below FLT_MIN to 0. */
#include <immintrin.h>
#include <math.h>

#include "model/kda_kern.h"
#include "quant/simd.h"

/* exp(x), 8 lanes. x < -87.3365 gives 0 (true value is subnormal), x > 88.7228 gives inf,
 * x in (88.37, 88.7228] gives exp(88.37) (never used by KDA), NaN stays NaN. */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 hi = _mm256_set1_ps(88.37f);
    __m256 nan_m = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283f), _CMP_GT_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = EM_EXP_TAYLOR7(_mm256_fmadd_ps, _mm256_set1_ps, r);
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
    return _mm256_blendv_ps(y, x, nan_m);
}

/* softplus(x) = max(x, 0) + log1p(exp(-|x|)); log1p(y) for y in [0, 1] as 2 atanh(s),
 * s = y / (2 + y) <= 1/3, series to s^15 (relative truncation < 2e-9). For x > 20 the
 * log1p term is below half an ulp of x, so this equals torch's "x > 20 -> x" threshold. */
static inline __m256 softplus8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 y = exp8(_mm256_or_ps(x, sign)); /* exp(-|x|) */
    __m256 s = _mm256_div_ps(y, _mm256_add_ps(y, _mm256_set1_ps(2.0f)));
    __m256 z = _mm256_mul_ps(s, s);
    __m256 p = _mm256_set1_ps(1.0f / 15.0f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.0f / 13.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.0f / 11.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.0f / 9.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.0f / 7.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.0f / 5.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.0f / 3.0f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.0f));
    __m256 l = _mm256_mul_ps(_mm256_add_ps(s, s), p);
    /* max(0, x) returns x when x is NaN (second operand), so NaN propagates. */
    return _mm256_add_ps(_mm256_max_ps(_mm256_setzero_ps(), x), l);
}

/* Loads/stores of the 8 lanes at p, of which only rem (< 8) exist at a row's tail: the
 * same vector code handles every element, whatever n is. */
static inline __m256i tail_mask(int rem) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256 ld(const float *p, int rem) {
    return rem >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(rem));
}
static inline void st(float *p, __m256 v, int rem) {
    if (rem >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, tail_mask(rem), v);
}

static void vexp_avx2(const float *x, float *y, int n) {
    for (int i = 0; i < n; i += 8) st(y + i, exp8(ld(x + i, n - i)), n - i);
}

static void add_avx2(float *y, const float *x, int n) {
    for (int i = 0; i < n; i += 8) st(y + i, _mm256_add_ps(ld(y + i, n - i), ld(x + i, n - i)), n - i);
}

static void mul_avx2(float *y, const float *a, const float *x, int n) {
    for (int i = 0; i < n; i += 8) st(y + i, _mm256_mul_ps(ld(a + i, n - i), ld(x + i, n - i)), n - i);
}

static void muladd_avx2(float *y, const float *a, const float *x, int n) {
    for (int i = 0; i < n; i += 8)
        st(y + i, _mm256_fmadd_ps(ld(a + i, n - i), ld(x + i, n - i), ld(y + i, n - i)), n - i);
}

static void axpy_avx2(float *y, float s, const float *x, int n) {
    const __m256 vs = _mm256_set1_ps(s);
    for (int i = 0; i < n; i += 8)
        st(y + i, _mm256_fmadd_ps(vs, ld(x + i, n - i), ld(y + i, n - i)), n - i);
}

static void scale_avx2(float *y, float s, int n) {
    const __m256 vs = _mm256_set1_ps(s);
    for (int i = 0; i < n; i += 8) st(y + i, _mm256_mul_ps(vs, ld(y + i, n - i)), n - i);
}

static void wxpy_avx2(float *y, const float *w, float s, const float *x, int n) {
    const __m256 vs = _mm256_set1_ps(s);
    for (int i = 0; i < n; i += 8)
        st(y + i, _mm256_fmadd_ps(vs, ld(x + i, n - i), ld(w + i, n - i)), n - i);
}

static void delta_avx2(float *y, float beta, const float *v, const float *u, int n) {
    const __m256 vb = _mm256_set1_ps(beta);
    for (int i = 0; i < n; i += 8)
        st(y + i, _mm256_mul_ps(vb, _mm256_sub_ps(ld(v + i, n - i), ld(u + i, n - i))), n - i);
}

static void silu_avx2(float *x, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 8) {
        __m256 v = ld(x + i, n - i);
        __m256 e = exp8(_mm256_xor_ps(v, sign));
        st(x + i, _mm256_div_ps(v, _mm256_add_ps(one, e)), n - i);
    }
}

static void gate_softplus_avx2(float *g, float a, int n) {
    const __m256 va = _mm256_set1_ps(a);
    for (int i = 0; i < n; i += 8) st(g + i, _mm256_mul_ps(va, softplus8(ld(g + i, n - i))), n - i);
}

static void gate_bounded_avx2(float *g, float a, float lb, int n) {
    const __m256 va = _mm256_set1_ps(a), vlb = _mm256_set1_ps(lb), one = _mm256_set1_ps(1.0f);
    for (int i = 0; i < n; i += 8) {
        __m256 e = exp8(_mm256_mul_ps(va, ld(g + i, n - i)));
        st(g + i, _mm256_div_ps(vlb, _mm256_add_ps(one, e)), n - i);
    }
}

static void norm_gate_avx2(float *y, const float *w, const float *o, float rs, const float *g2,
                           int n) {
    const __m256 vr = _mm256_set1_ps(rs), one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 8) {
        const int rem = n - i;
        __m256 e = exp8(_mm256_xor_ps(ld(g2 + i, rem), sign));
        __m256 num = _mm256_mul_ps(ld(w + i, rem), _mm256_mul_ps(ld(o + i, rem), vr));
        st(y + i, _mm256_div_ps(num, _mm256_add_ps(one, e)), rem);
    }
}

static void dot2_avx2(const float *a, const float *b, const float *c, int n, float *r1,
                      float *r2) {
    __m256 s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vc = _mm256_loadu_ps(c + i);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), vc, s1);
        if (b) s2 = _mm256_fmadd_ps(_mm256_loadu_ps(b + i), vc, s2);
    }
    float t1 = em_hsum256_ps(s1), t2 = em_hsum256_ps(s2);
    for (; i < n; i++) {
        t1 = fmaf(a[i], c[i], t1);
        if (b) t2 = fmaf(b[i], c[i], t2);
    }
    *r1 = t1;
    if (b) *r2 = t2;
}

/* The sweep over the 32 columns at c0 (4 vectors), rows r ascending. UPD/RX/RY are
 * compile-time constants at each call site, so the branches fold away. Named variables, not
 * arrays: gcc -O2 keeps arrays of vectors in memory. */
#define SWEEP_VEC(V, OFF)                                                                    \
    do {                                                                                     \
        __m256 s_ = _mm256_loadu_ps(srow + (OFF));                                           \
        if (UPD) {                                                                           \
            s_ = _mm256_fmadd_ps(kr, d##V, _mm256_mul_ps(ar, s_));                           \
            _mm256_storeu_ps(row + (OFF), s_);                                               \
        }                                                                                    \
        if (RX) u##V = _mm256_fmadd_ps(xr, s_, u##V);                                        \
        if (RY) w##V = _mm256_fmadd_ps(yr, s_, w##V);                                        \
    } while (0)

/* Row r of the sweep at c0: its state and source pointers and the per-row scalars broadcast
 * (the operands SWEEP_VEC reads), the same for the 4-vector and the 1-vector blocks. */
#define SWEEP_ROW(r)                                                                         \
    float *row = S + (size_t)(r) * D + c0;                                                   \
    const float *srow = src + (size_t)(r) * D + c0;                                          \
    const __m256 ar = UPD ? _mm256_set1_ps(a[r]) : z, kr = UPD ? _mm256_set1_ps(k[r]) : z;   \
    const __m256 xr = RX ? _mm256_set1_ps(x[r]) : z, yr = RY ? _mm256_set1_ps(y[r]) : z

static inline __attribute__((always_inline)) void
sweep_body(float *S, const float *src, int D, const float *a, const float *k, const float *delta,
           const float *x, const float *y, float *u, float *w, const int UPD, const int RX,
           const int RY) {
    const __m256 z = _mm256_setzero_ps();
    int c0 = 0;
    for (; c0 + 32 <= D; c0 += 32) {
        __m256 d0 = z, d1 = z, d2 = z, d3 = z;
        __m256 u0 = z, u1 = z, u2 = z, u3 = z, w0 = z, w1 = z, w2 = z, w3 = z;
        if (UPD) {
            d0 = _mm256_loadu_ps(delta + c0), d1 = _mm256_loadu_ps(delta + c0 + 8);
            d2 = _mm256_loadu_ps(delta + c0 + 16), d3 = _mm256_loadu_ps(delta + c0 + 24);
        }
        for (int r = 0; r < D; r++) {
            SWEEP_ROW(r);
            SWEEP_VEC(0, 0);
            SWEEP_VEC(1, 8);
            SWEEP_VEC(2, 16);
            SWEEP_VEC(3, 24);
        }
        if (RX) {
            _mm256_storeu_ps(u + c0, u0), _mm256_storeu_ps(u + c0 + 8, u1);
            _mm256_storeu_ps(u + c0 + 16, u2), _mm256_storeu_ps(u + c0 + 24, u3);
        }
        if (RY) {
            _mm256_storeu_ps(w + c0, w0), _mm256_storeu_ps(w + c0 + 8, w1);
            _mm256_storeu_ps(w + c0 + 16, w2), _mm256_storeu_ps(w + c0 + 24, w3);
        }
    }
    for (; c0 + 8 <= D; c0 += 8) {
        __m256 d0 = UPD ? _mm256_loadu_ps(delta + c0) : z, u0 = z, w0 = z;
        for (int r = 0; r < D; r++) {
            SWEEP_ROW(r);
            SWEEP_VEC(0, 0);
        }
        if (RX) _mm256_storeu_ps(u + c0, u0);
        if (RY) _mm256_storeu_ps(w + c0, w0);
    }
    for (; c0 < D; c0++) { /* scalar tail columns, same per-element operation order */
        float uu = 0.0f, ww = 0.0f;
        for (int r = 0; r < D; r++) {
            float v = src[(size_t)r * D + c0];
            if (UPD) {
                v = fmaf(k[r], delta[c0], a[r] * v);
                S[(size_t)r * D + c0] = v;
            }
            if (RX) uu = fmaf(x[r], v, uu);
            if (RY) ww = fmaf(y[r], v, ww);
        }
        if (RX) u[c0] = uu;
        if (RY) w[c0] = ww;
    }
}

static void sweep_avx2(float *S, const float *src, int D, const float *a, const float *k,
                       const float *delta, const float *x, const float *y, float *u, float *w) {
    if (a) {
        if (x && y) sweep_body(S, src, D, a, k, delta, x, y, u, w, 1, 1, 1);
        else if (x) sweep_body(S, src, D, a, k, delta, x, y, u, w, 1, 1, 0);
        else if (y) sweep_body(S, src, D, a, k, delta, x, y, u, w, 1, 0, 1);
        else sweep_body(S, src, D, a, k, delta, x, y, u, w, 1, 0, 0);
    } else {
        if (x && y) sweep_body(S, src, D, a, k, delta, x, y, u, w, 0, 1, 1);
        else if (x) sweep_body(S, src, D, a, k, delta, x, y, u, w, 0, 1, 0);
        else if (y) sweep_body(S, src, D, a, k, delta, x, y, u, w, 0, 0, 1);
    }
}

static inline void gemm_store16(float *cp, __m256 va, __m256 c0, __m256 c1) {
    _mm256_storeu_ps(cp, _mm256_fmadd_ps(va, c0, _mm256_loadu_ps(cp)));
    _mm256_storeu_ps(cp + 8, _mm256_fmadd_ps(va, c1, _mm256_loadu_ps(cp + 8)));
}

/* C += alpha*A*B with a 4x16 register block; remainder rows 1x16, then 8-wide column
 * blocks, then scalar columns. Each C element is accumulated over p ascending from 0 and
 * then added to C once, whatever block it falls in. */
static void gemm_avx2(int M, int N, int K, float alpha, const float *A, ptrdiff_t ars,
                      ptrdiff_t acs, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc) {
    const __m256 va = _mm256_set1_ps(alpha);
    int j = 0;
    for (; j + 16 <= N; j += 16) {
        int i = 0;
        for (; i + 4 <= M; i += 4) {
            __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00;
            __m256 c20 = c00, c21 = c00, c30 = c00, c31 = c00;
            const float *a0 = A + (ptrdiff_t)i * ars, *a1 = a0 + ars, *a2 = a1 + ars, *a3 = a2 + ars;
            for (int p = 0; p < K; p++) {
                const float *bp = B + (ptrdiff_t)p * ldb + j;
                const ptrdiff_t ap = (ptrdiff_t)p * acs;
                const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
                __m256 av = _mm256_set1_ps(a0[ap]);
                c00 = _mm256_fmadd_ps(av, b0, c00), c01 = _mm256_fmadd_ps(av, b1, c01);
                av = _mm256_set1_ps(a1[ap]);
                c10 = _mm256_fmadd_ps(av, b0, c10), c11 = _mm256_fmadd_ps(av, b1, c11);
                av = _mm256_set1_ps(a2[ap]);
                c20 = _mm256_fmadd_ps(av, b0, c20), c21 = _mm256_fmadd_ps(av, b1, c21);
                av = _mm256_set1_ps(a3[ap]);
                c30 = _mm256_fmadd_ps(av, b0, c30), c31 = _mm256_fmadd_ps(av, b1, c31);
            }
            gemm_store16(C + (ptrdiff_t)i * ldc + j, va, c00, c01);
            gemm_store16(C + (ptrdiff_t)(i + 1) * ldc + j, va, c10, c11);
            gemm_store16(C + (ptrdiff_t)(i + 2) * ldc + j, va, c20, c21);
            gemm_store16(C + (ptrdiff_t)(i + 3) * ldc + j, va, c30, c31);
        }
        for (; i < M; i++) {
            __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
            for (int p = 0; p < K; p++) {
                const float *bp = B + (ptrdiff_t)p * ldb + j;
                __m256 av = _mm256_set1_ps(A[(ptrdiff_t)i * ars + (ptrdiff_t)p * acs]);
                c0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(bp), c0);
                c1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(bp + 8), c1);
            }
            float *cp = C + (ptrdiff_t)i * ldc + j;
            _mm256_storeu_ps(cp, _mm256_fmadd_ps(va, c0, _mm256_loadu_ps(cp)));
            _mm256_storeu_ps(cp + 8, _mm256_fmadd_ps(va, c1, _mm256_loadu_ps(cp + 8)));
        }
    }
    for (; j + 8 <= N; j += 8) {
        for (int i = 0; i < M; i++) {
            __m256 c0 = _mm256_setzero_ps();
            for (int p = 0; p < K; p++) {
                __m256 av = _mm256_set1_ps(A[(ptrdiff_t)i * ars + (ptrdiff_t)p * acs]);
                c0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(B + (ptrdiff_t)p * ldb + j), c0);
            }
            float *cp = C + (ptrdiff_t)i * ldc + j;
            _mm256_storeu_ps(cp, _mm256_fmadd_ps(va, c0, _mm256_loadu_ps(cp)));
        }
    }
    for (; j < N; j++) {
        for (int i = 0; i < M; i++) {
            float s = 0.0f;
            for (int p = 0; p < K; p++)
                s = fmaf(A[(ptrdiff_t)i * ars + (ptrdiff_t)p * acs], B[(ptrdiff_t)p * ldb + j], s);
            float *cp = C + (ptrdiff_t)i * ldc + j;
            *cp = fmaf(alpha, s, *cp);
        }
    }
}

/* Every kernel but the sweep, shared by both tables. */
#define AVX2_KERNELS                                                                          \
    .gemm = gemm_avx2, .dot2 = dot2_avx2, .vexp = vexp_avx2, .add = add_avx2, .mul = mul_avx2, \
    .muladd = muladd_avx2, .axpy = axpy_avx2, .scale = scale_avx2, .wxpy = wxpy_avx2,           \
    .delta = delta_avx2, .silu = silu_avx2, .gate_softplus = gate_softplus_avx2,               \
    .gate_bounded = gate_bounded_avx2, .norm_gate = norm_gate_avx2

static const em_kda_kern kern_avx2 = { .sweep = sweep_avx2, AVX2_KERNELS };

const em_kda_kern *em_kda_kern_avx2(void) { return &kern_avx2; }

static void sweep_avx512_or_avx2(float *S, const float *src, int D, const float *a, const float *k,
                                 const float *delta, const float *x, const float *y, float *u, float *w) {
    if (em_kda_sweep_avx512_fits(D)) em_kda_sweep_avx512(S, src, D, a, k, delta, x, y, u, w);
    else sweep_avx2(S, src, D, a, k, delta, x, y, u, w);
}

static const em_kda_kern kern_avx512 = { .sweep = sweep_avx512_or_avx2, AVX2_KERNELS };

const em_kda_kern *em_kda_kern_avx512(void) { return &kern_avx512; }
