/* backend/cuda/mm_quant.cuh: the Q4_K, Q6_K and MXFP4 weight layouts of the GPU (repack
 * kernels from GGUF blocks) and their warp product bodies against Q8_0 activations, shared
 * like mm_kernels.cuh's Q8_0 body. Internal to backend/cuda/.
 *
 * Invariants (matmul.cu's, docs/cuda.md "width invariance"): a warp computes MM_OUTS
 * consecutive outputs for all n rows; lane l owns the same 64-value chunks (Q4_K, Q6_K) or
 * 32-value blocks (MXFP4) l, l + 32, ... whatever n is; each chunk's integer dots are exact
 * (dp4a), and each row's per-lane sum is one chain of explicitly rounded float operations in
 * ascending chunk order; the 32 lane sums meet in store_rows' fixed butterfly. So row j is the
 * same bits for every n. The repacks move bits only: the device holds the GGUF's bytes and
 * numbers (gpu.h, em_gpu_mat), and every value the kernels form equals quant/'s dequantized
 * one (d * sc * q - dmin * m, d * sc * (q - 32), e8m0 * code) up to the order of the sums. */
#ifndef EM_MM_QUANT_CUH
#define EM_MM_QUANT_CUH

#include "backend/cuda/mm_kernels.cuh"

/* ---- repack kernels (one thread per GGUF block; src is the staging buffer) ---------------- */

/* Q4_K (144-byte super-blocks, 4-byte aligned in the staging buffer): the first 16 bytes to
 * meta, the 128 quant bytes to qs as they are. */
static __global__ void k_repack_q4_K(const uint8_t *src, int64_t n_blocks, uint8_t *qs, uint8_t *meta) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint32_t *s = (const uint32_t *)(src + b * 144);
    uint32_t *m = (uint32_t *)(meta + b * 16), *q = (uint32_t *)(qs + b * 128);
    for (int i = 0; i < 4; i++) m[i] = s[i];
    for (int i = 0; i < 32; i++) q[i] = s[4 + i];
}

/* Q6_K (210-byte super-blocks, 2-byte aligned): value u (0..255) of the GGUF block has its low
 * nibble at ql[64 (u/128) + 32 ((u%128)/32 % 2) + u%32] >> 4 ((u%128)/64) and its high 2 bits
 * at qh[32 (u/128) + u%32] >> 2 ((u%128)/32) (quant/dequant.c's em_dequant_q6_K). Written in
 * the device layout of gpu.h: ql chunks, qh chunks, the 16 int8 scales, d. */
static __device__ __forceinline__ int q6_low(const uint8_t *ql, int u) {
    const int h = u / 128, k = (u % 128) / 32, l = u % 32;
    return (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
}
static __device__ __forceinline__ int q6_high(const uint8_t *qh, int u) {
    const int h = u / 128, k = (u % 128) / 32, l = u % 32;
    return (qh[32 * h + l] >> (2 * k)) & 3;
}
static __global__ void k_repack_q6_K(const uint8_t *src, int64_t n_blocks, uint8_t *ql_out, uint8_t *qh_out,
                                     int8_t *sc_out, uint16_t *d_out) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint8_t *blk = src + b * 210, *ql = blk, *qh = blk + 128;
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < 32; i++)
            ql_out[b * 128 + 32 * c + i] = (uint8_t)(q6_low(ql, 64 * c + i) | q6_low(ql, 64 * c + 32 + i) << 4);
        for (int i = 0; i < 16; i++) {
            int v = 0;
            for (int t = 0; t < 4; t++) v |= q6_high(qh, 64 * c + i + 16 * t) << (2 * t);
            qh_out[b * 64 + 16 * c + i] = (uint8_t)v;
        }
    }
    for (int i = 0; i < 16; i++) sc_out[b * 16 + i] = (int8_t)blk[192 + i];
    d_out[b] = (uint16_t)(blk[208] | blk[209] << 8);
}

/* MXFP4 (17-byte blocks): the exponent byte to e, the 16 quant bytes to qs. */
static __global__ void k_repack_mxfp4(const uint8_t *src, int64_t n_blocks, uint8_t *qs, uint8_t *e) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint8_t *s = src + b * 17;
    e[b] = s[0];
    for (int i = 0; i < 16; i++) qs[b * 16 + i] = s[1 + i];
}

/* ---- shared pieces ------------------------------------------------------------------------- */

/* Sum of the 4 int8 lanes of each word of a 16-byte piece, added to s (exact). */
static __device__ __forceinline__ int bsum16(int4 a, int s) {
    s = __dp4a(a.x, 0x01010101, s);
    s = __dp4a(a.y, 0x01010101, s);
    s = __dp4a(a.z, 0x01010101, s);
    return __dp4a(a.w, 0x01010101, s);
}
static __device__ __forceinline__ int4 map4(int4 v, uint32_t mask, int shift) {
    return make_int4((int)(((uint32_t)v.x >> shift) & mask), (int)(((uint32_t)v.y >> shift) & mask),
                     (int)(((uint32_t)v.z >> shift) & mask), (int)(((uint32_t)v.w >> shift) & mask));
}
static __device__ __forceinline__ int4 or4(int4 a, int4 b) {
    return make_int4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w);
}

/* Warp setup shared by the bodies: row pointers of the MM_OUTS outputs (a row past the end
 * reads the last row and is never stored) and zeroed accumulators. */
#define MMQ_ROWS(r0, rows)                                          \
    int64_t rr[MM_OUTS];                                            \
    _Pragma("unroll") for (int o = 0; o < MM_OUTS; o++) rr[o] = (r0) + o < (rows) ? (r0) + o : (rows) - 1; \
    float acc[N][MM_OUTS];                                          \
    _Pragma("unroll") for (int j = 0; j < N; j++)                   \
    _Pragma("unroll") for (int o = 0; o < MM_OUTS; o++) acc[j][o] = 0.0f;

/* ---- Q4_K x Q8_0 ------------------------------------------------------------------------- */

/* Chunk c (64 values) = sub-blocks 2p, 2p + 1 (p = c % 4) of super-block c / 4 = Q8_0 activation
 * blocks 2c, 2c + 1. Per sub-block s: sum_i (d sc_s q_i - dmin m_s) da a_i
 * = da * ((d sc_s) * qsum - (dmin m_s) * asum), qsum and asum exact integers. */
template <int N>
__device__ __forceinline__ void mm_q4_K_warp(const uint8_t *wq, const uint8_t *wm, int64_t rows, int64_t cols, int64_t r0,
                                             const int8_t *xq, const float *xd, int n, const int (&xr)[N], float *y,
                                             int64_t ldy, const int (&yr)[N]) {
    const int lane = threadIdx.x & 31;
    const int64_t chunks = cols / 64, bpr = cols / 32;
    MMQ_ROWS(r0, rows)
    for (int64_t c = lane; c < chunks; c += 32) {
        int4 lo0[MM_OUTS], lo1[MM_OUTS], hi0[MM_OUTS], hi1[MM_OUTS];
        float dl0[MM_OUTS], dl1[MM_OUTS], ml0[MM_OUTS], ml1[MM_OUTS];
#pragma unroll
        for (int o = 0; o < MM_OUTS; o++) {
            const uint8_t *q = wq + rr[o] * (cols / 2) + c * 32;
            const int4 q0 = ld_nc16(q), q1 = ld_nc16(q + 16);
            const int4 m = ld_nc16(wm + (rr[o] * (cols / 256) + c / 4) * 16);
            lo0[o] = map4(q0, 0x0f0f0f0fu, 0), lo1[o] = map4(q1, 0x0f0f0f0fu, 0);
            hi0[o] = map4(q0, 0x0f0f0f0fu, 4), hi1[o] = map4(q1, 0x0f0f0f0fu, 4);
            /* 12 scale bytes at m bytes 4..15: quant/'s k4_scale_min for j = 2p, 2p + 1 */
            const uint32_t u0 = (uint32_t)m.y, u1 = (uint32_t)m.z, u2 = (uint32_t)m.w;
            const uint8_t s_[12] = { (uint8_t)u0, (uint8_t)(u0 >> 8), (uint8_t)(u0 >> 16), (uint8_t)(u0 >> 24),
                                     (uint8_t)u1, (uint8_t)(u1 >> 8), (uint8_t)(u1 >> 16), (uint8_t)(u1 >> 24),
                                     (uint8_t)u2, (uint8_t)(u2 >> 8), (uint8_t)(u2 >> 16), (uint8_t)(u2 >> 24) };
            const int p = (int)(c % 4);
            int sc[2], mn[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = 2 * p + h;
                if (j < 4) {
                    sc[h] = s_[j] & 63;
                    mn[h] = s_[j + 4] & 63;
                } else {
                    sc[h] = (s_[j + 4] & 0xF) | (s_[j - 4] >> 6) << 4;
                    mn[h] = (s_[j + 4] >> 4) | (s_[j] >> 6) << 4;
                }
            }
            const float d = __half2float(__ushort_as_half((unsigned short)((uint32_t)m.x & 0xffffu)));
            const float dmin = __half2float(__ushort_as_half((unsigned short)((uint32_t)m.x >> 16)));
            dl0[o] = __fmul_rn(d, (float)sc[0]), dl1[o] = __fmul_rn(d, (float)sc[1]);
            ml0[o] = __fmul_rn(dmin, (float)mn[0]), ml1[o] = __fmul_rn(dmin, (float)mn[1]);
        }
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            const int4 *xa = (const int4 *)(xq + (int64_t)xr[j] * cols + c * 64);
            const int4 a0 = xa[0], a1 = xa[1], a2 = xa[2], a3 = xa[3];
            const float da0 = xd[(int64_t)xr[j] * bpr + 2 * c], da1 = xd[(int64_t)xr[j] * bpr + 2 * c + 1];
            const float as0 = (float)bsum16(a1, bsum16(a0, 0)), as1 = (float)bsum16(a3, bsum16(a2, 0));
#pragma unroll
            for (int o = 0; o < MM_OUTS; o++) {
                const float q0 = (float)dot16(lo1[o], a1, dot16(lo0[o], a0, 0));
                const float q1 = (float)dot16(hi1[o], a3, dot16(hi0[o], a2, 0));
                float s = acc[j][o];
                s = __fadd_rn(s, __fmul_rn(da0, __fsub_rn(__fmul_rn(dl0[o], q0), __fmul_rn(ml0[o], as0))));
                s = __fadd_rn(s, __fmul_rn(da1, __fsub_rn(__fmul_rn(dl1[o], q1), __fmul_rn(ml1[o], as1))));
                acc[j][o] = s;
            }
        }
    }
    store_rows<N, MM_OUTS>(acc, n, lane, y, ldy, yr, r0, rows);
}

/* ---- Q6_K x Q8_0 ------------------------------------------------------------------------- */

/* Chunk c (64 values, 4 groups of 16 with one int8 scale each) = activation blocks 2c, 2c + 1.
 * Codes u in 0..63 stand for u - 32: per group g, dot_g = sum u a - 32 sum a (exact); per
 * activation block sum_i d sc_g (u_i - 32) da a_i = da * (d * (sc_g0 dot_g0 + sc_g1 dot_g1)). */
template <int N>
__device__ __forceinline__ void mm_q6_K_warp(const uint8_t *wl, const uint8_t *wh, const int8_t *wsc,
                                             const __half *wd, int64_t rows, int64_t cols, int64_t r0,
                                             const int8_t *xq, const float *xd, int n, const int (&xr)[N], float *y,
                                             int64_t ldy, const int (&yr)[N]) {
    const int lane = threadIdx.x & 31;
    const int64_t chunks = cols / 64, bpr = cols / 32;
    MMQ_ROWS(r0, rows)
    for (int64_t c = lane; c < chunks; c += 32) {
        int4 u0[MM_OUTS], u1[MM_OUTS], u2[MM_OUTS], u3[MM_OUTS]; /* groups 0..3 of the chunk */
        int sc[MM_OUTS][4];
        float d[MM_OUTS];
#pragma unroll
        for (int o = 0; o < MM_OUTS; o++) {
            const uint8_t *l = wl + rr[o] * (cols / 2) + c * 32;
            const int4 l0 = ld_nc16(l), l1 = ld_nc16(l + 16);
            const int4 h = ld_nc16(wh + rr[o] * (cols / 4) + c * 16);
            /* values 0..31 of the chunk: low nibbles of l0 (0..15), l1 (16..31); high bits from h
             * at 2t, t = value / 16; values 32..63: high nibbles, t = 2 + (value - 32) / 16 */
            u0[o] = or4(map4(l0, 0x0f0f0f0fu, 0), make_int4((int)((((uint32_t)h.x) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.y) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.z) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.w) & 0x03030303u) << 4)));
            u1[o] = or4(map4(l1, 0x0f0f0f0fu, 0), make_int4((int)((((uint32_t)h.x >> 2) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.y >> 2) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.z >> 2) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.w >> 2) & 0x03030303u) << 4)));
            u2[o] = or4(map4(l0, 0x0f0f0f0fu, 4), make_int4((int)((((uint32_t)h.x >> 4) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.y >> 4) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.z >> 4) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.w >> 4) & 0x03030303u) << 4)));
            u3[o] = or4(map4(l1, 0x0f0f0f0fu, 4), make_int4((int)((((uint32_t)h.x >> 6) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.y >> 6) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.z >> 6) & 0x03030303u) << 4),
                                                            (int)((((uint32_t)h.w >> 6) & 0x03030303u) << 4)));
            const uint32_t s4 = *(const uint32_t *)(wsc + rr[o] * (cols / 16) + c * 4);
#pragma unroll
            for (int g = 0; g < 4; g++) sc[o][g] = (int)(int8_t)(uint8_t)(s4 >> (8 * g));
            d[o] = __half2float(wd[rr[o] * (cols / 256) + c / 4]);
        }
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            const int4 *xa = (const int4 *)(xq + (int64_t)xr[j] * cols + c * 64);
            const int4 a0 = xa[0], a1 = xa[1], a2 = xa[2], a3 = xa[3];
            const float da0 = xd[(int64_t)xr[j] * bpr + 2 * c], da1 = xd[(int64_t)xr[j] * bpr + 2 * c + 1];
            const int s0 = 32 * bsum16(a0, 0), s1 = 32 * bsum16(a1, 0), s2 = 32 * bsum16(a2, 0), s3 = 32 * bsum16(a3, 0);
#pragma unroll
            for (int o = 0; o < MM_OUTS; o++) {
                const int i0 = sc[o][0] * (dot16(u0[o], a0, 0) - s0) + sc[o][1] * (dot16(u1[o], a1, 0) - s1);
                const int i1 = sc[o][2] * (dot16(u2[o], a2, 0) - s2) + sc[o][3] * (dot16(u3[o], a3, 0) - s3);
                float s = acc[j][o];
                s = __fadd_rn(s, __fmul_rn(da0, __fmul_rn(d[o], (float)i0)));
                s = __fadd_rn(s, __fmul_rn(da1, __fmul_rn(d[o], (float)i1)));
                acc[j][o] = s;
            }
        }
    }
    store_rows<N, MM_OUTS>(acc, n, lane, y, ldy, yr, r0, rows);
}

/* ---- MXFP4 x Q8_0 ------------------------------------------------------------------------ */

/* 2^(e-128) as quant/'s em_dot_e8m0_half (the code points are doubled E2M1 values). */
static __device__ __forceinline__ float e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* The 8 codes of a quant word (byte i: code of value i low, of value 16 + i high) as int8
 * values: lo gets values 0..3 of the word, hi values 16..19 (relative to the word). Two byte
 * permutes look the 4-bit codes up in the positive and negative halves of the table
 * {0 1 2 3 4 6 8 12, 0 -1 -2 -3 -4 -6 -8 -12}, a third picks per byte by the code's bit 3. */
static __device__ __forceinline__ void mxfp4_codes(uint32_t q, int &lo, int &hi) {
    const uint32_t p0 = 0x03020100u, p1 = 0x0c080604u, n0 = 0xfdfeff00u, n1 = 0xf4f8fafcu;
    uint32_t r[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t s = (q >> (16 * h)) & 0x7777u, sign = (q >> (16 * h)) & 0x8888u;
        const uint32_t pos = __byte_perm(p0, p1, s), neg = __byte_perm(n0, n1, s);
        r[h] = __byte_perm(pos, neg, 0x3210u | (sign >> 1));
    }
    /* r[0] = values (0, 16, 1, 17), r[1] = (2, 18, 3, 19) */
    lo = (int)__byte_perm(r[0], r[1], 0x6420u);
    hi = (int)__byte_perm(r[0], r[1], 0x7531u);
}

/* Lane l takes blocks l, l + 32, ..., two per loop step, in ascending block order (the same
 * chain as one at a time). Per block sum += (e * da) * isum, as quant/'s scalar kernel. */
template <int N>
__device__ __forceinline__ void mm_mxfp4_warp(const uint8_t *wq, const uint8_t *we, int64_t rows, int64_t cols, int64_t r0,
                                              const int8_t *xq, const float *xd, int n, const int (&xr)[N], float *y,
                                              int64_t ldy, const int (&yr)[N]) {
    const int lane = threadIdx.x & 31;
    const int64_t bpr = cols / 32;
    MMQ_ROWS(r0, rows)
    for (int64_t b0 = lane; b0 < bpr; b0 += 64) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int64_t b = b0 + 32 * k;
            if (b >= bpr) break;
            int4 lo[MM_OUTS], hi[MM_OUTS];
            float s[MM_OUTS];
#pragma unroll
            for (int o = 0; o < MM_OUTS; o++) {
                const int4 q = ld_nc16(wq + (rr[o] * bpr + b) * 16);
                mxfp4_codes((uint32_t)q.x, lo[o].x, hi[o].x);
                mxfp4_codes((uint32_t)q.y, lo[o].y, hi[o].y);
                mxfp4_codes((uint32_t)q.z, lo[o].z, hi[o].z);
                mxfp4_codes((uint32_t)q.w, lo[o].w, hi[o].w);
                s[o] = e8m0_half(we[rr[o] * bpr + b]);
            }
#pragma unroll
            for (int j = 0; j < N; j++) {
                if (j >= n) break;
                const int4 *xa = (const int4 *)(xq + (int64_t)xr[j] * cols + b * 32);
                const int4 a0 = xa[0], a1 = xa[1];
                const float da = xd[(int64_t)xr[j] * bpr + b];
#pragma unroll
                for (int o = 0; o < MM_OUTS; o++) {
                    const int i0 = dot16(hi[o], a1, dot16(lo[o], a0, 0));
                    acc[j][o] = __fadd_rn(acc[j][o], __fmul_rn(__fmul_rn(s[o], da), (float)i0));
                }
            }
        }
    }
    store_rows<N, MM_OUTS>(acc, n, lane, y, ldy, yr, r0, rows);
}

#endif
