/* model/kda_avx512.c: the KDA state sweep (kda_kern.h's sweep) with 512-bit vectors, for
 * head dims that are a multiple of 64 (Kimi's is 128, the default pair's 64). Compiled with
 * -mavx512f; kda.c hands it out (through em_kda_kern_avx512 of kda_avx2.c) only on CPUs that
 * run AVX-512.
 *
 * Why: the AVX2 sweep walks S in blocks of 32 columns, so each pass over a head's 64 KiB
 * strides 512 bytes from row to row, which the hardware prefetchers follow poorly; after a
 * token's weights streamed through the caches S comes from memory at a few GB/s. Here 128
 * columns (eight registers each of u, w and delta) are held at once, or 64 (four) when the
 * head dim is not a multiple of 128, so with head_dim 128 or 64 a pass reads S front to back.
 *
 * Invariant: every element gets exactly the AVX2 sweep's operations in its order: the
 * update fma(k[r], delta[c], a[r] * src[r][c]), then u[c] = fma(x[r], row[r][c], u[c]) and
 * w[c] = fma(y[r], row[r][c], w[c]) over r ascending from 0. Only the loop order over
 * (r, c) changes, so results are bit for bit those of kda_avx2.c's sweep. */
#include <immintrin.h>
#include <stddef.h>

#include "model/kda_kern.h"

#define UNROLL _Pragma("GCC unroll 8")
#define MAX_VECS 8 /* columns per pass: up to 8 vectors of 16 */

/* Columns [c0, c0 + 16 NV) over every row; NV / UPD / RX / RY are constants at each call site. */
static inline __attribute__((always_inline)) void
sweep_chunk(float *S, const float *src, int D, int c0, const float *a, const float *k, const float *delta,
            const float *x, const float *y, float *u, float *w, const int NV, const int UPD, const int RX,
            const int RY) {
    const __m512 z = _mm512_setzero_ps();
    __m512 d[MAX_VECS], uu[MAX_VECS], ww[MAX_VECS];
    UNROLL for (int v = 0; v < NV; v++) {
        d[v] = UPD ? _mm512_loadu_ps(delta + c0 + 16 * v) : z;
        uu[v] = ww[v] = z;
    }
    for (int r = 0; r < D; r++) {
        const float *sr = src + (size_t)r * (size_t)D + c0;
        float *row = S + (size_t)r * (size_t)D + c0;
        const __m512 ar = UPD ? _mm512_set1_ps(a[r]) : z, kr = UPD ? _mm512_set1_ps(k[r]) : z;
        const __m512 xr = RX ? _mm512_set1_ps(x[r]) : z, yr = RY ? _mm512_set1_ps(y[r]) : z;
        UNROLL for (int v = 0; v < NV; v++) {
            __m512 s = _mm512_loadu_ps(sr + 16 * v);
            if (UPD) {
                s = _mm512_fmadd_ps(kr, d[v], _mm512_mul_ps(ar, s));
                _mm512_storeu_ps(row + 16 * v, s);
            }
            if (RX) uu[v] = _mm512_fmadd_ps(xr, s, uu[v]);
            if (RY) ww[v] = _mm512_fmadd_ps(yr, s, ww[v]);
        }
    }
    UNROLL for (int v = 0; v < NV; v++) {
        if (RX) _mm512_storeu_ps(u + c0 + 16 * v, uu[v]);
        if (RY) _mm512_storeu_ps(w + c0 + 16 * v, ww[v]);
    }
}

int em_kda_sweep_avx512_fits(int D) { return D > 0 && D % 64 == 0; }

/* Every column chunk of one width NV (8 vectors when D allows, else 4). */
static inline __attribute__((always_inline)) void
sweep_all(float *S, const float *src, int D, const float *a, const float *k, const float *delta, const float *x,
          const float *y, float *u, float *w, const int NV) {
    for (int c0 = 0; c0 < D; c0 += 16 * NV) {
        if (a) {
            if (x && y) sweep_chunk(S, src, D, c0, a, k, delta, x, y, u, w, NV, 1, 1, 1);
            else if (x) sweep_chunk(S, src, D, c0, a, k, delta, x, y, u, w, NV, 1, 1, 0);
            else if (y) sweep_chunk(S, src, D, c0, a, k, delta, x, y, u, w, NV, 1, 0, 1);
            else sweep_chunk(S, src, D, c0, a, k, delta, x, y, u, w, NV, 1, 0, 0);
        } else {
            if (x && y) sweep_chunk(S, src, D, c0, a, k, delta, x, y, u, w, NV, 0, 1, 1);
            else if (x) sweep_chunk(S, src, D, c0, a, k, delta, x, y, u, w, NV, 0, 1, 0);
            else if (y) sweep_chunk(S, src, D, c0, a, k, delta, x, y, u, w, NV, 0, 0, 1);
        }
    }
}

void em_kda_sweep_avx512(float *S, const float *src, int D, const float *a, const float *k, const float *delta,
                         const float *x, const float *y, float *u, float *w) {
    if (D % 128 == 0) sweep_all(S, src, D, a, k, delta, x, y, u, w, 8);
    else sweep_all(S, src, D, a, k, delta, x, y, u, w, 4);
}
