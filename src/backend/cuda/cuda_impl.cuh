/* backend/cuda/cuda_impl.cuh: what the backend's .cu files share: the context struct, the
 * CUDA error helpers, and small device helpers. Internal to backend/cuda/. */
#ifndef EM_CUDA_IMPL_CUH
#define EM_CUDA_IMPL_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <stdint.h>

extern "C" {
#include "backend/gpu.h"
#include "quant/quant.h"
}

#define EMC_BRANCHES 4 /* side streams for concurrent branches (em_gpu_fork) */

struct em_gpu {
    int index;
    cudaStream_t stream;  /* where ops go now: main, or a side stream between fork and join */
    cudaStream_t main;
    cudaStream_t side[EMC_BRANCHES];
    cudaEvent_t fork_ev, join_ev[EMC_BRANCHES];
    int n_branches;       /* side streams forked and not yet joined */
    cudaEvent_t ev[2];
    bool pdl;             /* launches may overlap the kernel before them (emc_launch) */
    int prio_main, prio_side; /* kernel priorities: a branch's above the main chain's (device.cu) */
    em_gpu_info info;
};

struct em_gpu_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

/* EM_EIO naming the CUDA call (what) and CUDA's error name and text; clears a non-sticky error. */
int emc_fail(em_err *err, cudaError_t e, const char *what);
/* Makes g's device current for this thread (contexts of several devices may share a thread). */
int emc_use(em_gpu *g, em_err *err);
/* The launch status of the last kernel (a bad configuration shows here, not at the sync). */
int emc_launched(em_err *err, const char *kernel);

#define EMC_TRY(call, what)                             \
    do {                                                \
        cudaError_t e_ = (call);                        \
        if (e_ != cudaSuccess) return emc_fail(err, e_, what); \
    } while (0)

/* Argument checks shared by the ops: EM_EINVAL naming the op and the argument. */
#define EMC_CHECK(cond, ...)                                               \
    do {                                                                   \
        if (!(cond)) return em_err_set(err, EM_EINVAL, __VA_ARGS__);        \
    } while (0)

/* ---- programmatic dependent launch (docs/cuda.md, "Fewer, fuller launches") ----------------------
 * With g->pdl, emc_launch lets a kernel start while the kernel before it in the stream (or the
 * graph) is still running. So every kernel of the backend keeps one rule: it reads nothing an
 * earlier kernel wrote, and writes nothing, before emc_wait_prior() (which returns once the
 * kernels before it have finished and their writes are visible; a no-op in a launch without
 * overlap). Before that it may only read weights (constant while passes run), which the
 * products prefetch into L2. emc_let_next_start() lets the next kernel's blocks be scheduled
 * (they wait in turn); the kernels call it first thing. */
__device__ __forceinline__ void emc_wait_prior() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void emc_let_next_start() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
/* Both, for kernels that prefetch nothing. */
__device__ __forceinline__ void emc_kernel_begin() {
    emc_let_next_start();
    emc_wait_prior();
}

/* kernel<<<grid, block, smem, g->stream>>>(args...), with launch overlap when g->pdl, at the
 * stream's priority (kept by a captured graph's nodes), in thread block clusters of cluster_y
 * blocks along grid y (1: none; gridDim.y a multiple of it). */
template <typename... P, typename... A>
static inline void emc_launch_clusters(const em_gpu *g, unsigned cluster_y, void (*kernel)(P...), dim3 grid, dim3 block,
                                       size_t smem, A... args) {
    cudaLaunchAttribute at[3];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = g->pdl ? 1 : 0;
    at[1].id = cudaLaunchAttributePriority;
    at[1].val.priority = g->stream == g->main ? g->prio_main : g->prio_side;
    at[2].id = cudaLaunchAttributeClusterDimension;
    at[2].val.clusterDim.x = 1, at[2].val.clusterDim.y = cluster_y, at[2].val.clusterDim.z = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = g->stream;
    c.attrs = at;
    c.numAttrs = cluster_y > 1 ? 3 : 2;
    (void)cudaLaunchKernelEx(&c, kernel, args...); /* its error is the last error: emc_launched reads it */
}
/* Without clusters. */
template <typename... P, typename... A>
static inline void emc_launch(const em_gpu *g, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A... args) {
    emc_launch_clusters(g, 1, kernel, grid, block, smem, args...);
}

/* Shared memory past 48 KB needs an opt-in per kernel and device, and the opt-in is also a
 * limit: a kernel opted in for fewer bytes refuses a launch asking for more (the 48 KB default
 * no longer holds). So done[index] keeps the largest size opted in per device index below 64
 * (others ask every time), and a call asking for more raises it. The first call may come
 * inside a graph capture, where the attribute call is not a stream operation but may count as
 * an unsafe one: the thread's capture mode is relaxed around it. */
template <typename K> static int emc_smem_optin(const em_gpu *g, K kernel, int bytes, int *done, em_err *err) {
    int *have = g->index >= 0 && g->index < 64 ? &done[g->index] : NULL;
    if (have && *have >= bytes) return 0;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    EMC_TRY(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    EMC_TRY(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    EMC_TRY(e, "cudaFuncSetAttribute (shared memory)");
    if (have) *have = bytes;
    return 0;
}

/* The activations, each the arithmetic of its CPU twin (the kernels of every .cu share them):
 * compute/'s em_sigmoidf (gates, KDA's beta, the router, the Markov heads), em_siluf(g) * u,
 * and em_situ with the reciprocals inv = 1 / beta, lin_inv = 1 / lin_beta rounded to fp32
 * first as there. */
/* ---- asynchronous copies to shared memory (sm_80+): 16 bytes (both addresses 16-byte aligned)
 * or 4, then a group committed and waited for ---- */
__device__ __forceinline__ void cp16(void *s, const void *g) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g));
}
__device__ __forceinline__ void cp4(void *s, const void *g) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ float emc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float emc_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float emc_situ(float g, float v, float beta, float inv, float lin_beta, float lin_inv) {
    const float a = beta * tanhf(g * inv) * emc_sigmoid(g);
    const float u = lin_beta > 0.0f ? lin_beta * tanhf(v * lin_inv) : v;
    return a * u;
}

static inline unsigned emc_blocks(int64_t work, int per_block) {
    return (unsigned)((work + per_block - 1) / per_block);
}

/* ---- weights' values and Q8_0 activations ---------------------------------------------------- */

/* Value i of row t of a Q4_K, Q6_K or MXFP4 table in gpu.h's layouts, with quant/'s
 * dequantization arithmetic ((d sc) q - dmin m; (d sc) q; code * e8m0), so bit-identical. */
static __device__ float embed_q4_K(const uint8_t *qs, const uint8_t *meta, int64_t cols, int64_t t, int64_t i) {
    const int64_t at = t * cols + i;
    const uint8_t q = (qs[at / 64 * 32 + i % 32] >> (4 * ((i % 64) / 32))) & 15;
    const uint8_t *m = meta + at / 256 * 16, *s = m + 4;
    const int j = (int)((i % 256) / 32);
    int sc, mn;
    if (j < 4) {
        sc = s[j] & 63, mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
        mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
    const float d = __half2float(__ushort_as_half((unsigned short)(m[0] | m[1] << 8)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(m[2] | m[3] << 8)));
    return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)q), __fmul_rn(dmin, (float)mn));
}
static __device__ float embed_q6_K(const uint8_t *ql, const uint8_t *sc, int64_t rows, int64_t cols, int64_t t, int64_t i) {
    const int64_t at = t * cols + i, all = rows * cols;
    const int lo = (ql[at / 64 * 32 + i % 32] >> (4 * ((i % 64) / 32))) & 15;
    const int hi = (sc[at / 64 * 16 + i % 16] >> (2 * ((i % 64) / 16))) & 3;
    const float s = (float)((const int8_t *)(sc + all / 4))[at / 16];
    const float d = __half2float(((const __half *)(sc + all / 4 + all / 16))[at / 256]);
    return __fmul_rn(__fmul_rn(d, s), (float)((lo | hi << 4) - 32));
}
static __device__ float embed_mxfp4(const uint8_t *qs, const uint8_t *e, int64_t cols, int64_t t, int64_t i) {
    const int64_t at = t * cols + i;
    const int code = (qs[at / 32 * 16 + i % 16] >> (4 * ((i % 32) / 16))) & 15;
    const int mag[8] = { 0, 1, 2, 3, 4, 6, 8, 12 };
    const uint32_t x = e[at / 32];
    const float d = __uint_as_float(x < 2 ? 0x00200000u << x : (x - 1) << 23);
    return __fmul_rn((float)(code & 8 ? -mag[code & 7] : mag[code & 7]), d);
}

/* Value i of row t of a table of type type in gpu.h's layouts (em_gpu_mat: data, scales), as
 * quant/'s to_float gives it: F16/BF16 widened, Q8_0 q * d, the K types and MXFP4 above. */
static __device__ float emc_table_value(int type, const void *data, const __half *scales, int64_t rows, int64_t cols,
                                        int64_t t, int64_t i) {
    const int64_t at = t * cols + i;
    const uint8_t *d8 = (const uint8_t *)data, *s8 = (const uint8_t *)scales;
    switch (type) {
    case EM_TYPE_F32: return ((const float *)data)[at];
    case EM_TYPE_F16: return __half2float(((const __half *)data)[at]);
    case EM_TYPE_BF16: return __uint_as_float((uint32_t)((const uint16_t *)data)[at] << 16);
    case EM_TYPE_Q4_K: return embed_q4_K(d8, s8, cols, t, i);
    case EM_TYPE_Q6_K: return embed_q6_K(d8, s8, rows, cols, t, i);
    case EM_TYPE_MXFP4: return embed_mxfp4(d8, s8, cols, t, i);
    default: return (float)((const int8_t *)data)[at] * __half2float(scales[at / 32]); /* Q8_0 */
    }
}

/* One 32-value block of Q8_0 activations by a warp, lane l quantizing value v of lane l: the
 * block's quants at q, its scale at *d. em_quant_q8_0's arithmetic: amax, d = amax / 127,
 * id = 1 / d (0 when d is 0), q = trunc(roundf(x * id)), the fp16-rounded d kept (as float). */
static __device__ __forceinline__ void quant_q8_0_block(float v, int lane, int8_t *q, float *d) {
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float dd = __fdiv_rn(amax, 127.0f);
    const float id = dd != 0.0f ? __fdiv_rn(1.0f, dd) : 0.0f;
    const float r = roundf(__fmul_rn(v, id));
    q[lane] = (int8_t)(r > -2147483904.0f && r < 2147483648.0f ? (int32_t)r : INT32_MIN);
    if (lane == 0) *d = __half2float(__float2half_rn(dd));
}

/* ---- argmax in a block (k_argmax, the drafter's pick) ---------------------------------------- */

/* b beats a: a larger value, or an equal one at a lower index; an index of -1 is "none"
 * (sample/'s em_argmax order). */
__device__ __forceinline__ bool am_better(float bv, int bi, float av, int ai) {
    if (bi < 0) return false;
    if (ai < 0) return true;
    return bv > av || (bv == av && bi < ai);
}

/* The best of the block's n (a power of two, = blockDim.x) (value, index) pairs in shared
 * memory into sv[0], si[0], by a fixed halving tree. Every thread calls it after writing its
 * pair and a barrier. */
__device__ __forceinline__ void am_block_best(float *sv, int *si, int n) {
    for (int h = n / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h && am_better(sv[threadIdx.x + h], si[threadIdx.x + h], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + h];
            si[threadIdx.x] = si[threadIdx.x + h];
        }
        __syncthreads();
    }
}

#endif
