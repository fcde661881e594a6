/* backend/cuda/mm_kernels.cuh: the warp-level product bodies (Q8_0 here, the float types'
 * here, Q4_K/Q6_K/MXFP4 in mm_quant.cuh) shared by the dense products (matmul.cu) and the
 * grouped expert products (moe.cu), so that an expert's rows get exactly the arithmetic of a
 * dense product of the same rows (see matmul.cu's invariants): every body takes its rows
 * through indirection (activation row xr[j], output row yr[j]), and the Q8_0 activation
 * quantizer both use. Internal to backend/cuda/. */
#ifndef EM_MM_KERNELS_CUH
#define EM_MM_KERNELS_CUH

#include "backend/cuda/cuda_impl.cuh"

#define MM_WARPS 8 /* warps per block of 256 threads */
#define MM_OUTS 4  /* outputs (weight rows) per warp */

/* 16 bytes of weights through the read-only path, allocated in L1: a lane reads a Q8_0 block's
 * 32 bytes (one sector) as two 16-byte loads, and the second finds the sector the first brought
 * (with L1::no_allocate both went to L2: 3% of a 48B decode step, docs/cuda.md run 27). */
__device__ __forceinline__ int4 ld_nc16(const void *p) {
    int4 v;
    asm volatile("ld.global.nc.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* The 128-byte line holding p asked of L2. */
__device__ __forceinline__ void prefetch_line(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* Before waiting for the kernels before it, a warp asks L2 for the weight bytes it is about to
 * stream (lane l takes the 128-byte lines l, l + 32, ... of [p, p + bytes)): a product whose
 * launch overlaps the kernel before it (emc_launch) reads its weights meanwhile. */
__device__ __forceinline__ void prefetch_l2(const void *p, uint64_t bytes) {
    const uintptr_t end = (uintptr_t)p + bytes;
    for (uintptr_t a = ((uintptr_t)p & ~(uintptr_t)127) + (uintptr_t)(threadIdx.x & 31) * 128; a < end; a += 32 * 128)
        prefetch_line((const void *)a);
}

/* Weight bytes of rows [r0, r0 + nr) of a matrix of device type T (data, scales: gpu.h's
 * layouts) asked of L2: the quants, and Q8_0's scales too. */
template <int T>
__device__ __forceinline__ void prefetch_weight_rows(const uint8_t *data, const uint8_t *scales, int64_t cols, int64_t r0,
                                                     int64_t nr) {
    if constexpr (T == EM_TYPE_Q8_0) {
        prefetch_l2(data + r0 * cols, (uint64_t)(nr * cols));
        prefetch_l2(scales + r0 * (cols / 32) * 2, (uint64_t)(nr * (cols / 32) * 2));
    } else if constexpr (T == EM_TYPE_F32) {
        prefetch_l2(data + r0 * cols * 4, (uint64_t)(nr * cols * 4));
    } else if constexpr (T == EM_TYPE_F16 || T == EM_TYPE_BF16) {
        prefetch_l2(data + r0 * cols * 2, (uint64_t)(nr * cols * 2));
    } else { /* Q4_K, Q6_K, MXFP4: 4-bit quants */
        prefetch_l2(data + r0 * cols / 2, (uint64_t)(nr * cols / 2));
    }
}

/* The fixed butterfly: every lane ends with the same sum, in the same order for every row. */
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Row j, output o: the warp's sum of acc[j][o], stored by lane o into row yr[j] of y
 * (outputs past rows skipped). */
template <int N, int OUTS>
__device__ __forceinline__ void store_rows(const float (&acc)[N][OUTS], int n, int lane, float *y, int64_t ldy,
                                           const int (&yr)[N], int64_t r0, int64_t rows) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        if (j >= n) break;
#pragma unroll
        for (int o = 0; o < OUTS; o++) {
            const float s = warp_sum(acc[j][o]);
            if (lane == o && r0 + o < rows) y[(int64_t)yr[j] * ldy + r0 + o] = s;
        }
    }
}

/* Outputs a warp computes: MM_OUTS, or one for narrow passes (mm_outs), where the weights are
 * the only traffic and a small matrix needs all the warps it can get. The arithmetic of an
 * output is the same either way (see below). */
#define MM_OUTS_NARROW 1
/* The outputs per warp for a pass of n rows of cols values and weights of device type: one for
 * narrow passes of Q8_0 and float weights (their bodies take OUTS) whose rows give each lane
 * more than one step (a single step already has MM_OUTS loads in flight per lane, in a
 * quarter of the blocks), MM_OUTS otherwise. */
static constexpr bool mm_narrow_ok(int type) {
    return type == EM_TYPE_Q8_0 || type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16;
}
static inline int mm_outs(int type, int n, int64_t cols) {
    const int64_t step = type == EM_TYPE_Q8_0 ? 32 : type == EM_TYPE_F32 ? 4 : 8; /* values a lane takes a step */
    return mm_narrow_ok(type) && n <= 2 && cols > 32 * step ? MM_OUTS_NARROW : MM_OUTS;
}
/* Column steps whose weight loads a one-output warp issues together (the rounds of its loop
 * overlap in memory). */
#define MM_STEPS_NARROW 4
/* 16-byte float pieces a lane of a one-row F32 launch that cannot fill the GPU (at most one
 * block an SM: a MoE router) loads at once: a row of up to 3,072 values in one memory round
 * trip instead of three; the registers it takes cost nothing at that size (mm_deep). */
#define MM_STEPS_DEEP 24

/* The 16 int8 products of w and a added to s, in dp4a order x, y, z, w (exact integers). */
static __device__ __forceinline__ int dot16(int4 w, int4 a, int s) {
    s = __dp4a(w.x, a.x, s);
    s = __dp4a(w.y, a.y, s);
    s = __dp4a(w.z, a.z, s);
    return __dp4a(w.w, a.w, s);
}

/* Q8_0 block b of a weight row (quants w, scales d) as a lane holds it: its 32 quants in two
 * 16-byte loads and its scale. */
typedef struct q8_block {
    int4 lo, hi;
    float d;
} q8_block;
__device__ __forceinline__ q8_block q8_0_load(const int8_t *w, const __half *d, int64_t b) {
    return { ld_nc16(w + b * 32), ld_nc16(w + b * 32 + 16), __half2float(d[b]) };
}
/* acc + (d_w * d_a) * (the exact integer dot of the block with activation quants a): quant/'s
 * scalar kernel's rounding, one rounded add per block. */
__device__ __forceinline__ float q8_0_block_add(float acc, const q8_block &w, const int8_t *a, float da) {
    const int4 *xa = (const int4 *)a;
    const int i0 = dot16(w.hi, xa[1], dot16(w.lo, xa[0], 0));
    return __fadd_rn(acc, __fmul_rn(__fmul_rn(w.d, da), (float)i0));
}

/* Q8_0 weights x Q8_0 activations: a warp computes OUTS consecutive outputs; lane l takes
 * blocks l, l + 32, ... of each; per block an exact integer dot (dp4a), then
 * sum += (d_w * d_a) * isum, as quant/'s scalar kernel. The activation block is loaded once
 * per lane and step and meets all OUTS weight rows. An output's chain is the same whatever N,
 * OUTS and the steps loaded together: blocks in ascending order, one rounded add each, then
 * the fixed butterfly. */
template <int N, int OUTS = MM_OUTS>
__device__ __forceinline__ void mm_q8_0_warp(const int8_t *wq, const __half *wd, int64_t rows, int64_t cols, int64_t r0,
                                             const int8_t *xq, const float *xd, int n, const int (&xr)[N], float *y,
                                             int64_t ldy, const int (&yr)[N]) {
    constexpr int U = OUTS == 1 ? MM_STEPS_NARROW : 1;
    const int lane = threadIdx.x & 31;
    const int64_t bpr = cols / 32;
    const int8_t *w[OUTS];
    const __half *dw[OUTS];
#pragma unroll
    for (int o = 0; o < OUTS; o++) { /* a row past the end reads the last row; never stored */
        const int64_t r = r0 + o < rows ? r0 + o : rows - 1;
        w[o] = wq + r * cols;
        dw[o] = wd + r * bpr;
    }
    float acc[N][OUTS];
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int o = 0; o < OUTS; o++) acc[j][o] = 0.0f;
    for (int64_t b0 = lane; b0 < bpr; b0 += 32 * U) {
        q8_block wb[U][OUTS];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t b = b0 + 32 * u;
            if (b >= bpr) break;
#pragma unroll
            for (int o = 0; o < OUTS; o++) wb[u][o] = q8_0_load(w[o], dw[o], b);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t b = b0 + 32 * u;
            if (b >= bpr) break;
#pragma unroll
            for (int j = 0; j < N; j++) {
                if (j >= n) break;
                const int8_t *xa = xq + (int64_t)xr[j] * cols + b * 32;
                const float da = xd[(int64_t)xr[j] * bpr + b];
#pragma unroll
                for (int o = 0; o < OUTS; o++) acc[j][o] = q8_0_block_add(acc[j][o], wb[u][o], xa, da);
            }
        }
    }
    store_rows<N, OUTS>(acc, n, lane, y, ldy, yr, r0, rows);
}

/* ---- float weights (F32, F16, BF16) x F32 activations ------------------------------------ */

/* 16 bytes of weights as floats: 4 F32, or 8 F16 / BF16 values. */
template <int T> struct wpiece;
template <> struct wpiece<EM_TYPE_F32> {
    static constexpr int V = 4;
    static __device__ __forceinline__ void get(int4 p, float (&f)[8]) {
        f[0] = __int_as_float(p.x), f[1] = __int_as_float(p.y), f[2] = __int_as_float(p.z), f[3] = __int_as_float(p.w);
    }
};
template <> struct wpiece<EM_TYPE_F16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ void get(int4 p, float (&f)[8]) {
        const uint32_t u[4] = { (uint32_t)p.x, (uint32_t)p.y, (uint32_t)p.z, (uint32_t)p.w };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __half2float(__ushort_as_half((unsigned short)(u[i] & 0xffffu)));
            f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(u[i] >> 16)));
        }
    }
};
template <> struct wpiece<EM_TYPE_BF16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ void get(int4 p, float (&f)[8]) {
        const uint32_t u[4] = { (uint32_t)p.x, (uint32_t)p.y, (uint32_t)p.z, (uint32_t)p.w };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};

/* V activation floats (16-byte aligned) in 16-byte loads. */
template <int V>
__device__ __forceinline__ void load_x(const float *p, float (&v)[8]) {
#pragma unroll
    for (int i = 0; i < V / 4; i++) {
        const float4 t = ((const float4 *)p)[i];
        v[4 * i] = t.x, v[4 * i + 1] = t.y, v[4 * i + 2] = t.z, v[4 * i + 3] = t.w;
    }
}

/* Float weights x F32 activations: a warp computes OUTS consecutive outputs; lane l takes
 * 16-byte pieces l, l + 32, ... of each; per piece one fma chain over its values in order.
 * Row j reads activation row xr[j] (x + xr[j] * ldx) and writes output row yr[j]. As for
 * Q8_0, an output's chain does not depend on N, OUTS or the steps loaded together (U; 0: the
 * default, 2 MM_STEPS_NARROW for one output a warp, since a float step is 16 bytes and a Q8_0
 * step 34, else 1). */
template <int T, int N, int OUTS = MM_OUTS, int U0 = 0>
__device__ __forceinline__ void mm_float_warp(const uint8_t *wdata, int64_t rows, int64_t cols, int64_t r0, const float *x,
                                              int64_t ldx, int n, const int (&xr)[N], float *y, int64_t ldy,
                                              const int (&yr)[N]) {
    constexpr int V = wpiece<T>::V;
    constexpr int U = U0 > 0 ? U0 : OUTS == 1 ? 2 * MM_STEPS_NARROW : 1;
    const int lane = threadIdx.x & 31;
    const int64_t pieces = cols / V;
    const uint8_t *w[OUTS];
#pragma unroll
    for (int o = 0; o < OUTS; o++) w[o] = wdata + (r0 + o < rows ? r0 + o : rows - 1) * cols * (16 / V);
    float acc[N][OUTS];
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int o = 0; o < OUTS; o++) acc[j][o] = 0.0f;
    for (int64_t p0 = lane; p0 < pieces; p0 += 32 * U) {
        int4 raw[U][OUTS];
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (p0 + 32 * u >= pieces) break;
#pragma unroll
            for (int o = 0; o < OUTS; o++) raw[u][o] = ld_nc16(w[o] + (p0 + 32 * u) * 16);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t p = p0 + 32 * u;
            if (p >= pieces) break;
            float f[OUTS][8];
#pragma unroll
            for (int o = 0; o < OUTS; o++) wpiece<T>::get(raw[u][o], f[o]);
#pragma unroll
            for (int j = 0; j < N; j++) {
                if (j >= n) break;
                float xa[8];
                load_x<V>(x + (int64_t)xr[j] * ldx + p * V, xa);
#pragma unroll
                for (int o = 0; o < OUTS; o++) {
                    float a = acc[j][o];
#pragma unroll
                    for (int i = 0; i < V; i++) a = __fmaf_rn(f[o][i], xa[i], a);
                    acc[j][o] = a;
                }
            }
        }
    }
    store_rows<N, OUTS>(acc, n, lane, y, ldy, yr, r0, rows);
}

/* The MLP activation between two products (SwiGLU or SiTU, ops.cu's arithmetic, with SiTU's
 * reciprocals rounded on the host as em_gpu_situ rounds them). */
typedef struct mm_glu {
    int act;
    float beta, inv, lin_beta, lin_inv;
} mm_glu;

static inline mm_glu mm_glu_of(int act, float beta, float lin_beta) {
    const bool sit = act == EM_GPU_ACT_SITU;
    const mm_glu g = { act, beta, sit ? 1.0f / beta : 0.0f, lin_beta, sit && lin_beta > 0.0f ? 1.0f / lin_beta : 0.0f };
    return g;
}

__device__ __forceinline__ float glu_of(const mm_glu &a, float gv, float uv) {
    return a.act == EM_GPU_ACT_SITU ? emc_situ(gv, uv, a.beta, a.inv, a.lin_beta, a.lin_inv) : emc_swiglu(gv, uv);
}

/* One warp per 32-value block (quant_q8_0_block; also em_gpu_matmul_heads'). */
static __global__ void k_quant_q8_0(const float *x, int64_t ldx, int64_t cols, int n, int8_t *qs, float *d) {
    emc_kernel_begin();
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t bpr = cols / 32;
    if (warp >= (int64_t)n * bpr) return;
    const int64_t j = warp / bpr, b = warp % bpr;
    quant_q8_0_block(x[j * ldx + b * 32 + lane], lane, qs + j * cols + b * 32, d + j * bpr + b);
}

#endif
