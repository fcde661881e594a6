/* backend/cuda/matmul.cu: weight matrices in device layouts (upload; Q8_0, Q4_K, Q6_K, MXFP4
 * repacked on the device, other quantized types converted to F32 on the host), activation
 * preparation (Q8_0 quantization exactly as quant/'s em_quant_q8_0), and the multi-row
 * matrix-vector products y[j][r] = W[r, :] . x[j] for j < n <= 16, up to EM_GPU_MULTI_MAX
 * products of one input in one launch.
 *
 * Invariants (docs/cuda.md, "width invariance" and "Fewer, fuller launches"):
 * - one warp computes OUTS consecutive outputs for all n rows (MM_OUTS, or one for narrow
 *   passes: mm_outs); lane l owns the same column pieces (l, l + 32, ...) of each whatever n
 *   and OUTS are; per lane every row's sum is its own chain of explicitly rounded operations
 *   (__fmul_rn, __fadd_rn, __fmaf_rn: nothing left for the compiler to contract differently in
 *   another instantiation); the 32 lane sums meet in one fixed butterfly (xor 16, 8, 4, 2, 1).
 *   So row j's result is the same bits for every n.
 * - each weight byte is read once per call, by one lane, in 16-byte loads that bypass L1
 *   (ld.global.nc: weights are read-only while a pass runs), and asked of L2 before the kernel
 *   waits for the ones before it (launch overlap); activations are loaded once per lane and
 *   step for the warp's outputs and come from L1/L2.
 * - the kernels are instantiated for N in {1, 2, 4, 8, 16} rows; a call of n rows uses the
 *   smallest N >= n, and rows j >= n are skipped (not computed, not written).
 * - calls of more rows (up to EM_GPU_WIDE_MAX_ROWS: wide prefill passes) run Q8_0 weights on
 *   the tensor cores (mm_tc.cuh), folding the lane chains as the butterfly adds them, F32
 *   weights in one launch of em_gpu_matmul's warp body (k_mm_f32_wide), and every other
 *   product in chunks of EM_GPU_MAX_ROWS rows, so each row still gets the arithmetic of a
 *   one-row call. */
#include "backend/cuda/mm_kernels.cuh"
#include "backend/cuda/mm_quant.cuh"
#include "backend/cuda/mm_tc.cuh"

#include <stdlib.h>
#include <string.h>


/* ---- upload and repack ------------------------------------------------------------------ */

/* GGUF Q8_0 blocks (fp16 d, 32 int8 quants; 34 bytes, 2-byte aligned) of `rows` rows into
 * quants [rows][cols] and scales [rows][cols/32]. One thread per block. */
__global__ void k_repack_q8_0(const uint8_t *src, int64_t n_blocks, int64_t blocks_per_row, int8_t *qs, __half *d) {
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint16_t *s = (const uint16_t *)(src + b * 34);
    uint16_t h = s[0];
    uint32_t w[8];
    for (int i = 0; i < 8; i++) w[i] = (uint32_t)s[1 + 2 * i] | ((uint32_t)s[2 + 2 * i] << 16);
    int4 *q = (int4 *)(qs + b * 32);
    q[0] = make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
    q[1] = make_int4((int)w[4], (int)w[5], (int)w[6], (int)w[7]);
    d[b] = __ushort_as_half(h);
    (void)blocks_per_row;
}

/* ---- upload (wt-cuda3: per-type repack through staging, and the F32 fallback) ----------- */

/* Device arrays of a repacked type (gpu.h's em_gpu_mat): bytes of data and of scales. */
static void repacked_sizes(int type, int64_t rows, int64_t cols, uint64_t *data, uint64_t *scales) {
    const uint64_t v = (uint64_t)rows * (uint64_t)cols;
    switch (type) {
    case EM_TYPE_Q8_0: *data = v, *scales = v / 32 * 2; break;
    case EM_TYPE_Q4_K: *data = v / 2, *scales = v / 256 * 16; break;
    case EM_TYPE_Q6_K: *data = v / 2, *scales = v / 4 + v / 16 + v / 256 * 2; break;
    default: *data = v / 2, *scales = v / 32; break; /* MXFP4 */
    }
}

/* Repacks nr rows (staged GGUF bytes) into rows r0.. of out. */
static void repack_rows(cudaStream_t st, const em_gpu_mat *out, const uint8_t *stage, int64_t r0, int64_t nr) {
    const int64_t cols = out->cols, v0 = r0 * cols, nv = nr * cols;
    uint8_t *d = (uint8_t *)out->data, *s = (uint8_t *)out->scales;
    const uint64_t all = (uint64_t)out->rows * (uint64_t)cols;
    switch (out->type) {
    case EM_TYPE_Q8_0:
        k_repack_q8_0<<<emc_blocks(nv / 32, 256), 256, 0, st>>>(stage, nv / 32, cols / 32, (int8_t *)d + v0,
                                                                  (__half *)s + v0 / 32);
        break;
    case EM_TYPE_Q4_K:
        k_repack_q4_K<<<emc_blocks(nv / 256, 256), 256, 0, st>>>(stage, nv / 256, d + v0 / 2, s + v0 / 256 * 16);
        break;
    case EM_TYPE_Q6_K:
        k_repack_q6_K<<<emc_blocks(nv / 256, 128), 128, 0, st>>>(stage, nv / 256, d + v0 / 2, s + v0 / 4,
                                                                   (int8_t *)(s + all / 4) + v0 / 16,
                                                                   (uint16_t *)(s + all / 4 + all / 16) + v0 / 256);
        break;
    default:
        k_repack_mxfp4<<<emc_blocks(nv / 32, 256), 256, 0, st>>>(stage, nv / 32, d + v0 / 2, s + v0 / 32);
        break;
    }
}

/* Row bytes of the GGUF type; rows per staging chunk of at most 64 MiB (at least one). */
static int64_t stage_rows(uint64_t row_bytes, int64_t rows) {
    int64_t chunk = (int64_t)((64ull << 20) / row_bytes);
    if (chunk < 1) chunk = 1;
    return chunk > rows ? rows : chunk;
}

/* A type without a GPU kernel: em_dequantize on the host, chunk by chunk, into F32 rows. */
static int upload_converted(em_gpu *g, int type, const void *host, const char *nm, em_gpu_mat *out, em_err *err) {
    uint64_t src_row = 0;
    int rc = em_type_row_bytes(type, (uint64_t)out->cols, &src_row, err);
    if (rc) return em_err_prefix(err, "%s", nm);
    const uint64_t dst_row = (uint64_t)out->cols * 4;
    const int64_t chunk = stage_rows(dst_row, out->rows);
    float *buf = (float *)malloc((size_t)(chunk * (int64_t)dst_row));
    if (!buf) return em_err_set(err, EM_ENOMEM, "%s: no host memory for converting %s to F32", nm, em_type_name(type));
    for (int64_t r0 = 0; r0 < out->rows && !rc; r0 += chunk) {
        const int64_t nr = out->rows - r0 < chunk ? out->rows - r0 : chunk;
        rc = em_dequantize(type, (const uint8_t *)host + (uint64_t)r0 * src_row, buf, nr * out->cols, err);
        if (!rc) rc = em_gpu_upload(g, (uint8_t *)out->data + (uint64_t)r0 * dst_row, buf, (uint64_t)nr * dst_row, err);
    }
    free(buf);
    if (rc) return em_err_prefix(err, "%s", nm);
    em_log(EM_LOG_INFO, "%s: %s has no GPU kernel; converted to f32 at upload (%.1f MB on the device, %.1f MB in the file)",
           nm, em_type_name(type), (double)out->bytes / 1e6, (double)(src_row * (uint64_t)out->rows) / 1e6);
    return 0;
}

extern "C" int em_gpu_mat_upload(em_gpu *g, int type, int64_t rows, int64_t cols, const void *host,
                                 const char *name, em_gpu_mat *out, em_err *err) {
    memset(out, 0, sizeof *out);
    const char *nm = name ? name : "matrix";
    uint64_t bytes = 0;
    int rc = em_gpu_mat_bytes(type, rows, cols, &bytes, err);
    if (rc) return em_err_prefix(err, "%s", nm);
    if (!host) return em_err_set(err, EM_EINVAL, "%s: no host data", nm);
    const int dev = em_gpu_mat_dev_type(type);
    if ((dev == EM_TYPE_F32 && cols % 4) || ((dev == EM_TYPE_F16 || dev == EM_TYPE_BF16) && cols % 8))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: %lld columns of %s; the GPU products need 16-byte rows", nm,
                          (long long)cols, em_type_name(type));
    out->type = dev;
    out->src_type = type;
    out->rows = rows;
    out->cols = cols;
    if (dev == EM_TYPE_F32 || dev == EM_TYPE_F16 || dev == EM_TYPE_BF16) {
        if ((rc = em_gpu_alloc(g, bytes, nm, &out->data, err))) return rc;
        out->bytes = bytes;
        rc = dev != type ? upload_converted(g, type, host, nm, out, err) : em_gpu_upload(g, out->data, host, bytes, err);
        if (rc) {
            em_gpu_mat_free(g, out);
            return dev != type ? rc : em_err_prefix(err, "%s", nm);
        }
        return 0;
    }
    uint64_t db = 0, sb = 0;
    repacked_sizes(type, rows, cols, &db, &sb);
    if ((rc = em_gpu_alloc(g, db, nm, &out->data, err)) || (rc = em_gpu_alloc(g, sb, nm, &out->scales, err))) {
        em_gpu_mat_free(g, out);
        return rc;
    }
    out->bytes = bytes;
    uint64_t row_bytes = 0;
    em_type_row_bytes(type, (uint64_t)cols, &row_bytes, NULL);
    const int64_t chunk = stage_rows(row_bytes, rows);
    void *stage = NULL;
    if ((rc = em_gpu_alloc(g, (uint64_t)chunk * row_bytes, "upload staging buffer", &stage, err))) {
        em_gpu_mat_free(g, out);
        return em_err_prefix(err, "%s", nm);
    }
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += chunk) {
        const int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        rc = em_gpu_upload(g, stage, (const uint8_t *)host + (uint64_t)r0 * row_bytes, (uint64_t)nr * row_bytes, err);
        if (rc) break;
        repack_rows(g->stream, out, (const uint8_t *)stage, r0, nr);
        rc = emc_launched(err, "weight repack");
        /* the next upload into stage is ordered after the kernel (same stream, and the upload syncs) */
    }
    if (!rc) rc = em_gpu_sync(g, err);
    em_gpu_free(g, stage);
    if (rc) {
        em_gpu_mat_free(g, out);
        return em_err_prefix(err, "%s", nm);
    }
    return 0;
}

/* ---- end of upload ---------------------------------------------------------------------- */

extern "C" void em_gpu_mat_free(em_gpu *g, em_gpu_mat *m) {
    if (!m) return;
    em_gpu_free(g, m->data);
    em_gpu_free(g, m->scales);
    memset(m, 0, sizeof *m);
}

/* ---- activations ---------------------------------------------------------------------- */

/* em_gpu_act_prepare's checks and layout: *out filled, true when the rows need a Q8_0 launch. */
static int act_layout(em_gpu *g, int wtype, const float *d_x, int64_t ldx, int64_t cols, int n, void *d_scratch,
                      em_gpu_act *out, bool *q8, em_err *err) {
    memset(out, 0, sizeof *out);
    *q8 = false;
    EMC_CHECK(n >= 1 && n <= EM_GPU_WIDE_MAX_ROWS, "GPU activations: %d rows (1..%d)", n, EM_GPU_WIDE_MAX_ROWS);
    EMC_CHECK(cols > 0 && ldx >= cols && d_x, "GPU activations: %lld columns, ldx %lld", (long long)cols, (long long)ldx);
    EMC_CHECK(em_gpu_mat_type_ok(wtype), "GPU activations for weights of type %s", em_type_name(wtype));
    out->n = n;
    out->cols = cols;
    out->x = d_x;
    out->ldx = ldx;
    if (em_gpu_act_type(wtype) != EM_TYPE_Q8_0) {
        out->type = EM_TYPE_F32;
        return 0;
    }
    EMC_CHECK(cols % 32 == 0, "GPU Q8_0 activations: %lld columns, not a multiple of 32", (long long)cols);
    EMC_CHECK(d_scratch && ((uintptr_t)d_scratch & 15) == 0, "GPU Q8_0 activations: scratch missing or not 16-byte aligned");
    int rc = emc_use(g, err);
    if (rc) return rc;
    const uint64_t qbytes = ((uint64_t)n * (uint64_t)cols + 15) & ~(uint64_t)15;
    out->type = EM_TYPE_Q8_0;
    out->qs = (const int8_t *)d_scratch;
    out->d = (const float *)((uint8_t *)d_scratch + qbytes);
    *q8 = true;
    return 0;
}

extern "C" int em_gpu_act_prepare(em_gpu *g, int wtype, const float *d_x, int64_t ldx, int64_t cols, int n,
                                  void *d_scratch, em_gpu_act *out, em_err *err) {
    bool q8;
    int rc = act_layout(g, wtype, d_x, ldx, cols, n, d_scratch, out, &q8, err);
    if (rc || !q8) return rc;
    const int64_t warps = (int64_t)n * (cols / 32);
    emc_launch(g, k_quant_q8_0, emc_blocks(warps * 32, 256), 256, 0, d_x, ldx, cols, n, (int8_t *)out->qs,
               (float *)out->d);
    return emc_launched(err, "k_quant_q8_0");
}

/* k_quant_q8_0 of glu(gate, up) (k_swiglu's or k_situ's activation first): the same bits as
 * the activation's launch and then k_quant_q8_0's. */
static __global__ void k_quant_q8_0_glu(const float *gate, const float *up, mm_glu glu, int64_t ldx, int64_t cols, int n,
                                        int8_t *qs, float *d) {
    emc_kernel_begin();
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t bpr = cols / 32;
    if (warp >= (int64_t)n * bpr) return;
    const int64_t j = warp / bpr, b = warp % bpr, i = j * ldx + b * 32 + lane;
    quant_q8_0_block(glu_of(glu, gate[i], up[i]), lane, qs + j * cols + b * 32, d + j * bpr + b);
}

extern "C" int em_gpu_act_prepare_glu(em_gpu *g, int wtype, const float *d_gate, const float *d_up, int64_t ldx,
                                      int64_t cols, int n, int act, float beta, float lin_beta, void *d_scratch,
                                      em_gpu_act *out, em_err *err) {
    EMC_CHECK(em_gpu_act_type(wtype) == EM_TYPE_Q8_0, "GPU activations of a GLU for weights of type %s (they take F32 rows)",
              em_type_name(wtype));
    EMC_CHECK(d_up && (act == EM_GPU_ACT_SWIGLU || act == EM_GPU_ACT_SITU), "GPU activations of a GLU: act %d or no up rows",
              act);
    bool q8;
    int rc = act_layout(g, wtype, d_gate, ldx, cols, n, d_scratch, out, &q8, err);
    if (rc) return rc;
    out->x = NULL; /* the GLU rows exist only quantized */
    const int64_t warps = (int64_t)n * (cols / 32);
    emc_launch(g, k_quant_q8_0_glu, emc_blocks(warps * 32, 256), 256, 0, d_gate, d_up, mm_glu_of(act, beta, lin_beta), ldx,
               cols, n, (int8_t *)out->qs, (float *)out->d);
    return emc_launched(err, "k_quant_q8_0_glu");
}

/* ---- products ---------------------------------------------------------------------------- */

/* One launch runs up to EM_GPU_MULTI_MAX products of one input and one weight layout
 * (em_gpu_matmul is a launch of one): product i owns blocks [block0, block0 + its blocks) of
 * the grid, and each of its warps runs exactly the body em_gpu_matmul's warps run, so an
 * output does not depend on the products launched beside it. */
typedef struct mm_job {
    const uint8_t *data, *scales;
    int64_t rows;
    float *y;
    int64_t ldy;
    unsigned block0;
} mm_job;

typedef struct mm_jobs {
    mm_job job[EM_GPU_MULTI_MAX];
    int count;
    int64_t cols;
} mm_jobs;

/* This block's product (static indexing only: the parameters stay in constant memory). */
__device__ __forceinline__ mm_job mm_pick(const mm_jobs &js) {
    mm_job w = js.job[0];
#pragma unroll
    for (int i = 1; i < EM_GPU_MULTI_MAX; i++)
        if (i < js.count && blockIdx.x >= js.job[i].block0) w = js.job[i];
    return w;
}

/* In-block activations (em_gpu_act in_block): the rows x (ldx), or glu(x, up) when up is set. */
typedef struct mm_prep {
    const float *up;
    mm_glu glu;
} mm_prep;

/* The n rows' Q8_0 activations made by the block in shared memory, in em_gpu_act_prepare's
 * layout (quants of row j at qs + j * cols, scales at d + j * cols / 32): warp w makes the
 * 32-value blocks w, w + MM_WARPS, ... as k_quant_q8_0 does, after k_swiglu's or k_situ's
 * activation when p.up is set, so the same bits. Every thread of the block calls it. */
__device__ __forceinline__ void mm_prep_rows(const mm_prep &p, const float *x, int64_t ldx, int n, int64_t cols,
                                             int8_t *qs, float *d) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t bpr = cols / 32;
    for (int64_t b = warp; b < n * bpr; b += MM_WARPS) {
        const int64_t i = b / bpr * ldx + b % bpr * 32 + lane;
        quant_q8_0_block(p.up ? glu_of(p.glu, x[i], p.up[i]) : x[i], lane, qs + b * 32, d + b);
    }
    __syncthreads();
}

/* Shared-memory bytes of in-block activations: n rows of quants, then their scales. */
static size_t mm_prep_bytes(int n, int64_t cols) {
    return (size_t)n * (size_t)cols + (size_t)n * (size_t)(cols / 32) * 4;
}

/* One block of product w: rows j of x into rows j of w's y, integer layouts with Q8_0
 * activations (xq, xd; IB: made here from x by mm_prep_rows), float layouts with the F32 rows
 * (x, ldx); OUTS outputs a warp (mm_outs), FU steps loaded together by the float bodies (0:
 * their default). rb: the block's index within w's blocks. */
template <int T, int N, int OUTS, bool IB = false, int FU = 0>
__device__ __forceinline__ void mm_block(const mm_job &w, unsigned rb, int64_t cols, const int8_t *xq, const float *xd,
                                         const float *x, int64_t ldx, int n, const mm_prep *p = nullptr) {
    extern __shared__ __align__(16) int8_t mm_smem[];
    const int64_t rows = w.rows;
    const int64_t r0 = ((int64_t)rb * MM_WARPS + (threadIdx.x >> 5)) * OUTS;
    if (r0 < rows) prefetch_weight_rows<T>(w.data, w.scales, cols, r0, rows - r0 < OUTS ? rows - r0 : OUTS);
    emc_wait_prior();
    if constexpr (IB) {
        mm_prep_rows(*p, x, ldx, n, cols, mm_smem, (float *)(mm_smem + (int64_t)n * cols));
        xq = mm_smem, xd = (const float *)(mm_smem + (int64_t)n * cols);
    }
    if (r0 >= rows) return;
    int idx[N];
#pragma unroll
    for (int j = 0; j < N; j++) idx[j] = j;
    if constexpr (T == EM_TYPE_Q8_0) {
        mm_q8_0_warp<N, OUTS>((const int8_t *)w.data, (const __half *)w.scales, rows, cols, r0, xq, xd, n, idx, w.y, w.ldy,
                              idx);
    } else if constexpr (T == EM_TYPE_F32 || T == EM_TYPE_F16 || T == EM_TYPE_BF16) {
        mm_float_warp<T, N, OUTS, FU>(w.data, rows, cols, r0, x, ldx, n, idx, w.y, w.ldy, idx);
    } else {
        static_assert(OUTS == MM_OUTS, "the Q4_K, Q6_K and MXFP4 bodies compute MM_OUTS outputs a warp");
        if constexpr (T == EM_TYPE_Q4_K) {
            mm_q4_K_warp<N>(w.data, w.scales, rows, cols, r0, xq, xd, n, idx, w.y, w.ldy, idx);
        } else if constexpr (T == EM_TYPE_Q6_K) {
            const uint64_t all = (uint64_t)rows * (uint64_t)cols;
            mm_q6_K_warp<N>(w.data, w.scales, (const int8_t *)(w.scales + all / 4),
                            (const __half *)(w.scales + all / 4 + all / 16), rows, cols, r0, xq, xd, n, idx, w.y, w.ldy,
                            idx);
        } else {
            mm_mxfp4_warp<N>(w.data, w.scales, rows, cols, r0, xq, xd, n, idx, w.y, w.ldy, idx);
        }
    }
}

template <int T, int N, int OUTS, int FU = 0>
__global__ void __launch_bounds__(MM_WARPS * 32) k_mm(mm_jobs js, const int8_t *xq, const float *xd, const float *x,
                                                     int64_t ldx, int n) {
    emc_let_next_start();
    const mm_job w = mm_pick(js);
    mm_block<T, N, OUTS, false, FU>(w, blockIdx.x - w.block0, js.cols, xq, xd, x, ldx, n);
}

/* k_mm with in-block activations (integer layouts only). */
template <int T, int N, int OUTS>
__global__ void __launch_bounds__(MM_WARPS * 32) k_mm_ib(mm_jobs js, mm_prep p, const float *x, int64_t ldx, int n) {
    emc_let_next_start();
    const mm_job w = mm_pick(js);
    mm_block<T, N, OUTS, true>(w, blockIdx.x - w.block0, js.cols, nullptr, nullptr, x, ldx, n, &p);
}

/* F32 products (blocks below split, O2 outputs a warp) and Q8_0 products (O1) of one input in
 * one launch: each block runs k_mm's body of its product's type, so each output is its own
 * em_gpu_matmul's (the KDA layer's beta beside its Q8_0 projections). The F32 blocks come
 * first: their rows take a lane more memory round trips, so they start in the first wave
 * rather than lengthen the last. */
template <int N, int O1, int O2>
__global__ void __launch_bounds__(MM_WARPS * 32) k_mm_mixed(mm_jobs js, unsigned split, const int8_t *xq, const float *xd,
                                                           const float *x, int64_t ldx, int n) {
    emc_let_next_start();
    const mm_job w = mm_pick(js);
    if (blockIdx.x < split) mm_block<EM_TYPE_F32, N, O2>(w, blockIdx.x - w.block0, js.cols, xq, xd, x, ldx, n);
    else mm_block<EM_TYPE_Q8_0, N, O1>(w, blockIdx.x - w.block0, js.cols, xq, xd, x, ldx, n);
}

/* k_mm<T, N, OUTS>, or k_mm_ib for in-block activations of an integer layout. */
template <int T, int N, int OUTS>
static void launch_mm_n(const em_gpu *g, const mm_jobs &js, unsigned blocks, const em_gpu_act *a) {
    const int th = MM_WARPS * 32;
    if constexpr (T != EM_TYPE_F32 && T != EM_TYPE_F16 && T != EM_TYPE_BF16) {
        if (a->in_block) {
            const mm_prep p = { a->up, mm_glu_of(a->glu, a->situ_beta, a->situ_lin_beta) };
            emc_launch(g, k_mm_ib<T, N, OUTS>, blocks, th, mm_prep_bytes(a->n, a->cols), js, p, a->x, a->ldx, a->n);
            return;
        }
    }
    emc_launch(g, k_mm<T, N, OUTS>, blocks, th, 0, js, a->qs, a->d, a->x, a->ldx, a->n);
}
template <int T, int OUTS>
static void launch_mm_o(const em_gpu *g, const mm_jobs &js, unsigned blocks, const em_gpu_act *a) {
    const int n = a->n;
    if (n <= 1) launch_mm_n<T, 1, OUTS>(g, js, blocks, a);
    else if (n <= 2) launch_mm_n<T, 2, OUTS>(g, js, blocks, a);
    else if constexpr (OUTS == MM_OUTS || T == EM_TYPE_F32) { /* wider passes take MM_OUTS (mm_outs), or one
                                                               * output a warp for small F32 products (mm_outs_w) */
        if (n <= 4) launch_mm_n<T, 4, OUTS>(g, js, blocks, a);
        else if (n <= 8) launch_mm_n<T, 8, OUTS>(g, js, blocks, a);
        else launch_mm_n<T, 16, OUTS>(g, js, blocks, a);
    }
}
/* Whether a launch of F32 weights takes MM_STEPS_DEEP steps a lane: one row, one output a
 * warp, and at most one block an SM, so that occupancy is not what it lacks. */
static bool mm_deep(const em_gpu *g, int n, int64_t cols, unsigned blocks) {
    return n == 1 && mm_outs(EM_TYPE_F32, n, cols) == MM_OUTS_NARROW && blocks <= (unsigned)g->info.sm_count;
}

/* The outputs a warp of a product of rows weight rows: mm_outs, or one for F32 products of
 * at most MM_FEW_ROWS rows at any width (a MoE router, KDA's beta: with MM_OUTS, 256 outputs
 * are eight blocks, each warp taking every row of a wide pass in turn). The arithmetic of an
 * output is the same either way. */
#define MM_FEW_ROWS 4096
static int mm_outs_w(int type, int n, int64_t cols, int64_t rows) {
    const int o = mm_outs(type, n, cols);
    return type == EM_TYPE_F32 && rows <= MM_FEW_ROWS && cols > 32 * 4 ? MM_OUTS_NARROW : o;
}

template <int T>
static void launch_mm_t(const em_gpu *g, const mm_jobs &js, unsigned blocks, const em_gpu_act *a, int outs) {
    if constexpr (T == EM_TYPE_F32) {
        if (mm_deep(g, a->n, js.cols, blocks)) {
            emc_launch(g, k_mm<T, 1, MM_OUTS_NARROW, MM_STEPS_DEEP>, blocks, MM_WARPS * 32, 0, js, a->qs, a->d, a->x,
                       a->ldx, a->n);
            return;
        }
    }
    if constexpr (mm_narrow_ok(T)) {
        if (outs == MM_OUTS_NARROW) {
            launch_mm_o<T, MM_OUTS_NARROW>(g, js, blocks, a);
            return;
        }
    }
    launch_mm_o<T, MM_OUTS>(g, js, blocks, a);
}

static void launch_mm(const em_gpu *g, int type, const mm_jobs &js, unsigned blocks, const em_gpu_act *a, int outs) {
    switch (type) {
    case EM_TYPE_Q8_0: launch_mm_t<EM_TYPE_Q8_0>(g, js, blocks, a, outs); break;
    case EM_TYPE_Q4_K: launch_mm_t<EM_TYPE_Q4_K>(g, js, blocks, a, outs); break;
    case EM_TYPE_Q6_K: launch_mm_t<EM_TYPE_Q6_K>(g, js, blocks, a, outs); break;
    case EM_TYPE_MXFP4: launch_mm_t<EM_TYPE_MXFP4>(g, js, blocks, a, outs); break;
    case EM_TYPE_F32: launch_mm_t<EM_TYPE_F32>(g, js, blocks, a, outs); break;
    case EM_TYPE_F16: launch_mm_t<EM_TYPE_F16>(g, js, blocks, a, outs); break;
    default: launch_mm_t<EM_TYPE_BF16>(g, js, blocks, a, outs); break;
    }
}

template <int N, int O1, int O2>
static void launch_mixed_o(const em_gpu *g, const mm_jobs &js, unsigned split, unsigned blocks, const em_gpu_act *a) {
    emc_launch(g, k_mm_mixed<N, O1, O2>, blocks, MM_WARPS * 32, 0, js, split, a->qs, a->d, a->x, a->ldx, a->n);
}
/* q1, f1: the Q8_0 and the F32 products take one output a warp (mm_outs_w). */
template <int N>
static void launch_mixed_n(const em_gpu *g, const mm_jobs &js, unsigned split, unsigned blocks, const em_gpu_act *a,
                           bool q1, bool f1) {
    if (q1 && f1) launch_mixed_o<N, MM_OUTS_NARROW, MM_OUTS_NARROW>(g, js, split, blocks, a);
    else if (q1) launch_mixed_o<N, MM_OUTS_NARROW, MM_OUTS>(g, js, split, blocks, a);
    else if (f1) launch_mixed_o<N, MM_OUTS, MM_OUTS_NARROW>(g, js, split, blocks, a);
    else launch_mixed_o<N, MM_OUTS, MM_OUTS>(g, js, split, blocks, a);
}
static void launch_mixed(const em_gpu *g, const mm_jobs &js, unsigned split, unsigned blocks, const em_gpu_act *a,
                         bool q1, bool f1) {
    const int n = a->n;
    if (n <= 1) launch_mixed_n<1>(g, js, split, blocks, a, q1, f1);
    else if (n <= 2) launch_mixed_n<2>(g, js, split, blocks, a, q1, f1);
    /* wider passes: Q8_0 takes MM_OUTS (mm_outs) */
    else if (n <= 4) f1 ? launch_mixed_o<4, MM_OUTS, MM_OUTS_NARROW>(g, js, split, blocks, a)
                        : launch_mixed_o<4, MM_OUTS, MM_OUTS>(g, js, split, blocks, a);
    else if (n <= 8) f1 ? launch_mixed_o<8, MM_OUTS, MM_OUTS_NARROW>(g, js, split, blocks, a)
                        : launch_mixed_o<8, MM_OUTS, MM_OUTS>(g, js, split, blocks, a);
    else f1 ? launch_mixed_o<16, MM_OUTS, MM_OUTS_NARROW>(g, js, split, blocks, a)
            : launch_mixed_o<16, MM_OUTS, MM_OUTS>(g, js, split, blocks, a);
}

/* Whether products of these types go in one launch: one type, or Q8_0 and F32 together with
 * Q8_0 activations that carry their F32 rows (k_mm_mixed). */
static bool mm_types_ok(const em_gpu_mm_out *outs, int count, const em_gpu_act *act, bool *mixed) {
    bool q8 = false, f32 = false, other = false;
    const int t0 = outs[0].w->type;
    for (int i = 0; i < count; i++) {
        const int t = outs[i].w->type;
        q8 |= t == EM_TYPE_Q8_0, f32 |= t == EM_TYPE_F32, other |= t != t0;
    }
    *mixed = q8 && f32;
    return !other || (*mixed && act->type == EM_TYPE_Q8_0 && act->x);
}

/* ---- products of many rows (wide prefill passes) ------------------------------------------- */

/* A block of TC_WM x TC_WN warps takes TC_ROWS rows (blockIdx.y) of TC_OUTS outputs of its
 * product (blockIdx.x, as k_mm's blocks pick theirs); warp w the rows 16 (w % TC_WM) .. and the
 * outputs 8 TC_NT (w / TC_WM) .. of those. */
__global__ void __launch_bounds__(TC_WM * TC_WN * 32) k_mm_tc(mm_jobs js, const int8_t *xq, const float *xd, int n) {
    emc_kernel_begin();
    const mm_job w = mm_pick(js);
    const int warp = threadIdx.x >> 5;
    const int j0 = (int)blockIdx.y * TC_ROWS + (warp % TC_WM) * 16;
    const int64_t o0 = ((int64_t)(blockIdx.x - w.block0) * TC_WN + warp / TC_WM) * 8 * TC_NT;
    if (j0 >= n || o0 >= w.rows) return;
    const int ja = j0 + ((threadIdx.x & 31) >> 2), jb = ja + 8; /* A rows g and g + 8 (mm_tc.cuh) */
    mm_q8_0_tc_warp((const int8_t *)w.data, (const __half *)w.scales, w.rows, js.cols, o0, xq, xd, min(ja, n - 1),
                    min(jb, n - 1), w.y, w.ldy, ja < n ? ja : -1, jb < n ? jb : -1);
}

/* F32 weights x F32 rows over many rows (a MoE router, KDA's beta in a wide pass): the warp
 * body of em_gpu_matmul (mm_float_warp: lane l takes the 16-byte pieces l, l + 32, ... of an
 * output, one fma chain over their values in order, then the butterfly), a warp F32W_OUTS
 * outputs of F32W_ROWS rows, a block MM_WARPS such warps on the same rows (their activation
 * pieces found in L1 by all but the first). An output's chain does not depend on the rows or
 * outputs a warp takes, so the bits are those of calls of EM_GPU_MAX_ROWS rows. Each lane's
 * weight and activation loads are 16 bytes of a 512-byte span the warp reads together; a thread
 * an output and row (runs 66-74) read a row's pieces 9 KB apart, and the router took 180 us of
 * a wide pass's layer. */
#define F32W_ROWS 8
#define F32W_OUTS 4
__global__ void __launch_bounds__(256) k_mm_f32_wide(mm_jobs js, const float *x, int64_t ldx, int n) {
    emc_kernel_begin();
    const mm_job w = mm_pick(js);
    const int64_t r0 = ((int64_t)(blockIdx.x - w.block0) * MM_WARPS + (threadIdx.x >> 5)) * F32W_OUTS;
    const int j0 = (int)blockIdx.y * F32W_ROWS;
    if (r0 >= w.rows) return; /* a whole warp */
    int rows[F32W_ROWS];
#pragma unroll
    for (int j = 0; j < F32W_ROWS; j++) rows[j] = j0 + j;
    mm_float_warp<EM_TYPE_F32, F32W_ROWS, F32W_OUTS, 2>(w.data, w.rows, js.cols, r0, x, ldx, min(n - j0, F32W_ROWS), rows,
                                                        w.y, w.ldy, rows);
}

/* Rows r0 .. r0 + m - 1 of a. */
static em_gpu_act act_rows(const em_gpu_act *a, int r0, int m) {
    em_gpu_act c = *a;
    c.n = m;
    if (a->x) c.x = a->x + (int64_t)r0 * a->ldx;
    if (a->type == EM_TYPE_Q8_0) {
        c.qs = a->qs + (int64_t)r0 * a->cols;
        c.d = a->d + (int64_t)r0 * (a->cols / 32);
    }
    return c;
}

/* em_gpu_matmul_multi of more than EM_GPU_MAX_ROWS rows (checked by the caller): the Q8_0
 * products in one tensor-core launch, the F32 ones in one k_mm_f32_wide launch, the others in
 * calls of EM_GPU_MAX_ROWS rows. */
static int mm_wide(em_gpu *g, const em_gpu_mm_out *outs, int count, const em_gpu_act *act, em_err *err) {
    EMC_CHECK(!act->in_block, "GPU matmul: activations made in block for %d rows (1..%d)", act->n, EM_GPU_MAX_ROWS);
    mm_jobs jq, jf; /* Q8_0 on the tensor cores, F32 */
    memset(&jq, 0, sizeof jq), memset(&jf, 0, sizeof jf);
    jq.cols = jf.cols = act->cols;
    em_gpu_mm_out rest[EM_GPU_MULTI_MAX];
    int n_rest = 0;
    uint64_t bq = 0, bf = 0;
    for (int i = 0; i < count; i++) {
        const em_gpu_mat *w = outs[i].w;
        const bool q8 = w->type == EM_TYPE_Q8_0 && act->type == EM_TYPE_Q8_0, f32 = w->type == EM_TYPE_F32 && act->x;
        if (!q8 && !f32) {
            rest[n_rest++] = outs[i];
            continue;
        }
        mm_jobs *js = q8 ? &jq : &jf;
        uint64_t *blocks = q8 ? &bq : &bf;
        js->job[js->count++] = (mm_job){ (const uint8_t *)w->data, (const uint8_t *)w->scales, w->rows, outs[i].d_y,
                                         outs[i].ldy, (unsigned)*blocks };
        *blocks += emc_blocks(w->rows, q8 ? TC_OUTS : MM_WARPS * F32W_OUTS);
    }
    int rc = emc_use(g, err);
    if (!rc && jq.count) {
        const dim3 grid((unsigned)bq, emc_blocks(act->n, TC_ROWS));
        emc_launch(g, k_mm_tc, grid, TC_WM * TC_WN * 32, 0, jq, act->qs, act->d, act->n);
        rc = emc_launched(err, "k_mm_tc");
    }
    if (!rc && jf.count) {
        emc_launch(g, k_mm_f32_wide, dim3((unsigned)bf, emc_blocks(act->n, F32W_ROWS)), MM_WARPS * 32, 0, jf, act->x,
                   act->ldx, act->n);
        rc = emc_launched(err, "k_mm_f32_wide");
    }
    for (int r0 = 0; !rc && n_rest && r0 < act->n; r0 += EM_GPU_MAX_ROWS) {
        const int m = act->n - r0 < EM_GPU_MAX_ROWS ? act->n - r0 : EM_GPU_MAX_ROWS;
        em_gpu_mm_out part[EM_GPU_MULTI_MAX];
        for (int i = 0; i < n_rest; i++) part[i] = (em_gpu_mm_out){ rest[i].w, rest[i].d_y + (int64_t)r0 * rest[i].ldy, rest[i].ldy };
        const em_gpu_act c = act_rows(act, r0, m);
        rc = em_gpu_matmul_multi(g, part, n_rest, &c, err);
    }
    return rc;
}

extern "C" int em_gpu_matmul_multi(em_gpu *g, const em_gpu_mm_out *outs, int count, const em_gpu_act *act, em_err *err) {
    EMC_CHECK(outs && count >= 1 && count <= EM_GPU_MULTI_MAX, "GPU matmul: %d products in one launch (1..%d)", count,
              EM_GPU_MULTI_MAX);
    EMC_CHECK(act && act->n >= 1 && act->n <= EM_GPU_WIDE_MAX_ROWS, "GPU matmul: activations of %d rows (1..%d)",
              act ? act->n : 0, EM_GPU_WIDE_MAX_ROWS);
    for (int i = 0; i < count; i++)
        EMC_CHECK(outs[i].w && outs[i].w->data && em_gpu_mat_type_ok(outs[i].w->type),
                  "GPU matmul: product %d has no matrix, or one of an unsupported type", i);
    const em_gpu_mat *w0 = outs[0].w;
    bool mixed = false;
    EMC_CHECK(mm_types_ok(outs, count, act, &mixed),
              "GPU matmul: products of one launch must share a type, or be q8_0 and f32 with Q8_0 activations (product "
              "0 is %s)", em_type_name(w0->type));
    const int want = mixed ? EM_TYPE_Q8_0 : em_gpu_act_type(w0->type);
    EMC_CHECK(act->type == want, "GPU matmul: %s activations for %s weights (prepare them for this type)",
              em_type_name(act->type), em_type_name(w0->type));
    const bool ib_ok = !mixed && act->x && act->cols % 32 == 0 && (int64_t)act->n * act->cols <= EM_GPU_IN_BLOCK_MAX;
    EMC_CHECK(act->in_block ? ib_ok : act->type != EM_TYPE_Q8_0 || (act->qs && act->d), "GPU matmul: Q8_0 activations %s",
              act->in_block ? "made in block need one integer weight type, an input and at most EM_GPU_IN_BLOCK_MAX values"
                            : "without quants or scales");
    if (want == EM_TYPE_F32 || mixed)
        EMC_CHECK(((uintptr_t)act->x & 15) == 0 && act->ldx % 4 == 0,
                  "GPU matmul: F32 activations must be 16-byte aligned with ldx a multiple of 4");
    for (int i = 0; i < count; i++)
        EMC_CHECK(outs[i].w->cols == act->cols && outs[i].d_y && outs[i].ldy >= outs[i].w->rows,
                  "GPU matmul: product %d: activations of %lld columns for a matrix of %lld x %lld, output %s, ldy %lld", i,
                  (long long)act->cols, (long long)outs[i].w->rows, (long long)outs[i].w->cols,
                  outs[i].d_y ? "set" : "missing", (long long)outs[i].ldy);
    if (act->n > EM_GPU_MAX_ROWS) return mm_wide(g, outs, count, act, err);
    mm_jobs js;
    memset(&js, 0, sizeof js);
    js.count = count;
    js.cols = w0->cols;
    /* outputs a warp: one count per launch, or one per type in a mixed launch */
    int64_t f32_rows = 0, rows = 0;
    for (int i = 0; i < count; i++) {
        rows = outs[i].w->rows > rows ? outs[i].w->rows : rows;
        if (outs[i].w->type == EM_TYPE_F32 && outs[i].w->rows > f32_rows) f32_rows = outs[i].w->rows;
    }
    const int o_q8 = mm_outs(EM_TYPE_Q8_0, act->n, w0->cols), o_f32 = mm_outs_w(EM_TYPE_F32, act->n, w0->cols, f32_rows);
    const int o_one = mm_outs_w(w0->type, act->n, w0->cols, rows);
    uint64_t blocks = 0, split = 0;
    /* mixed: the F32 products' blocks first, then the Q8_0 ones' (k_mm_mixed) */
    for (int pass = 0, m = 0; pass < (mixed ? 2 : 1); pass++) {
        for (int i = 0; i < count; i++) {
            const em_gpu_mat *w = outs[i].w;
            if (mixed && (w->type == EM_TYPE_F32) != (pass == 0)) continue;
            js.job[m++] = (mm_job){ (const uint8_t *)w->data, (const uint8_t *)w->scales, w->rows, outs[i].d_y,
                                    outs[i].ldy, (unsigned)blocks };
            blocks += emc_blocks(w->rows, MM_WARPS * (!mixed ? o_one : w->type == EM_TYPE_F32 ? o_f32 : o_q8));
        }
        if (pass == 0) split = blocks;
    }
    EMC_CHECK(blocks < (1u << 31), "GPU matmul: %llu blocks in one launch", (unsigned long long)blocks);
    int rc = emc_use(g, err);
    if (rc) return rc;
    if (mixed) launch_mixed(g, js, (unsigned)split, (unsigned)blocks, act, o_q8 == MM_OUTS_NARROW, o_f32 == MM_OUTS_NARROW);
    else launch_mm(g, w0->type, js, (unsigned)blocks, act, o_one);
    return emc_launched(err, "em_gpu_matmul");
}

extern "C" int em_gpu_matmul(em_gpu *g, const em_gpu_mat *w, const em_gpu_act *act, float *d_y, int64_t ldy,
                             em_err *err) {
    const em_gpu_mm_out one = { w, d_y, ldy };
    return em_gpu_matmul_multi(g, &one, 1, act, err);
}

/* ---- per-head products (MLA's absorbed query and value up-projection) ------------------- */

/* Q8_0 activations of every head: warp (h, j, b) quantizes block b of head h's slice of row j
 * (x + j * ldx + h * xhs) into virtual row h * n + j (quants at qs + (h n + j) cols, scales at
 * d + (h n + j) cols/32): each head's n rows laid out as em_gpu_act_prepare lays out n rows. */
static __global__ void k_quant_q8_0_heads(const float *x, int64_t ldx, int64_t xhs, int64_t cols, int n, int heads,
                                          int8_t *qs, float *d) {
    emc_kernel_begin();
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t bpr = cols / 32;
    if (warp >= (int64_t)heads * n * bpr) return;
    const int64_t hj = warp / bpr, b = warp % bpr, h = hj / n, j = hj % n;
    quant_q8_0_block(x[j * ldx + h * xhs + b * 32 + lane], lane, qs + hj * cols + b * 32, d + hj * bpr + b);
}

/* Block (x, h, z): the warps of head h, over the hr rows of its matrix (rows h * hr.. of the
 * whole) as a matrix of its own, for rows zN .. zN + N - 1 (below n; a wide pass's call has
 * several such groups): the dense product's warp bodies on pointers offset to the head, so each
 * output is computed exactly as em_gpu_matmul of that head's rows computes it. */
template <int T, int N>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_mm_heads(const uint8_t *wq, const uint8_t *ws, int64_t all_rows, int64_t hr, int64_t cols, const int8_t *xq,
               const float *xd, const float *x, int64_t ldx, int64_t xhs, int n, float *y, int64_t ldy, int64_t yhs) {
    emc_kernel_begin();
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * MM_OUTS;
    if (r0 >= hr) return;
    const int64_t h = blockIdx.y, v0 = h * hr * cols; /* the head's first weight value */
    float *yh = y + h * yhs;
    const int j0 = (int)blockIdx.z * N;
    int idx[N];
#pragma unroll
    for (int j = 0; j < N; j++) idx[j] = j0 + j;
    const int8_t *xqh = xq + h * n * cols;
    const float *xdh = xd + h * n * (cols / 32);
    n = min(n - j0, N); /* the group's rows */
    if constexpr (T == EM_TYPE_Q8_0) {
        mm_q8_0_warp<N>((const int8_t *)wq + v0, (const __half *)ws + v0 / 32, hr, cols, r0, xqh, xdh, n, idx, yh, ldy, idx);
    } else if constexpr (T == EM_TYPE_Q4_K) {
        mm_q4_K_warp<N>(wq + v0 / 2, ws + v0 / 256 * 16, hr, cols, r0, xqh, xdh, n, idx, yh, ldy, idx);
    } else if constexpr (T == EM_TYPE_Q6_K) {
        const int64_t all = all_rows * cols;
        mm_q6_K_warp<N>(wq + v0 / 2, ws + v0 / 4, (const int8_t *)(ws + all / 4) + v0 / 16,
                        (const __half *)(ws + all / 4 + all / 16) + v0 / 256, hr, cols, r0, xqh, xdh, n, idx, yh, ldy, idx);
    } else if constexpr (T == EM_TYPE_MXFP4) {
        mm_mxfp4_warp<N>(wq + v0 / 2, ws + v0 / 32, hr, cols, r0, xqh, xdh, n, idx, yh, ldy, idx);
    } else {
        mm_float_warp<T, N>(wq + v0 * (16 / wpiece<T>::V), hr, cols, r0, x + h * xhs, ldx, n, idx, yh, ldy, idx);
    }
}

template <int T, int N>
static void launch_heads_t(const em_gpu_mat *w, int heads, int64_t hr, const int8_t *xq, const float *xd,
                           const float *x, int64_t ldx, int64_t xhs, int n, float *y, int64_t ldy, int64_t yhs,
                           const em_gpu *g) {
    const dim3 grid(emc_blocks(hr, MM_WARPS * MM_OUTS), (unsigned)heads, emc_blocks(n, N));
    emc_launch(g, k_mm_heads<T, N>, grid, MM_WARPS * 32, 0, (const uint8_t *)w->data, (const uint8_t *)w->scales,
               w->rows, hr, w->cols, xq, xd, x, ldx, xhs, n, y, ldy, yhs);
}

template <int N>
static void launch_heads(const em_gpu_mat *w, int heads, int64_t hr, const int8_t *xq, const float *xd, const float *x,
                         int64_t ldx, int64_t xhs, int n, float *y, int64_t ldy, int64_t yhs, const em_gpu *g) {
    switch (w->type) {
    case EM_TYPE_Q8_0: launch_heads_t<EM_TYPE_Q8_0, N>(w, heads, hr, xq, xd, x, ldx, xhs, n, y, ldy, yhs, g); break;
    case EM_TYPE_Q4_K: launch_heads_t<EM_TYPE_Q4_K, N>(w, heads, hr, xq, xd, x, ldx, xhs, n, y, ldy, yhs, g); break;
    case EM_TYPE_Q6_K: launch_heads_t<EM_TYPE_Q6_K, N>(w, heads, hr, xq, xd, x, ldx, xhs, n, y, ldy, yhs, g); break;
    case EM_TYPE_MXFP4: launch_heads_t<EM_TYPE_MXFP4, N>(w, heads, hr, xq, xd, x, ldx, xhs, n, y, ldy, yhs, g); break;
    case EM_TYPE_F32: launch_heads_t<EM_TYPE_F32, N>(w, heads, hr, xq, xd, x, ldx, xhs, n, y, ldy, yhs, g); break;
    case EM_TYPE_F16: launch_heads_t<EM_TYPE_F16, N>(w, heads, hr, xq, xd, x, ldx, xhs, n, y, ldy, yhs, g); break;
    case EM_TYPE_BF16: launch_heads_t<EM_TYPE_BF16, N>(w, heads, hr, xq, xd, x, ldx, xhs, n, y, ldy, yhs, g); break;
    }
}

extern "C" uint64_t em_gpu_matmul_heads_scratch_bytes(int wtype, int n_heads, int64_t cols, int n) {
    if (n_heads < 1 || n < 1 || n > EM_GPU_WIDE_MAX_ROWS) return 0;
    return em_gpu_act_bytes(wtype, cols, n_heads * n); /* n_heads x n rows of em_gpu_act_prepare's layout */
}

extern "C" int em_gpu_matmul_heads(em_gpu *g, const em_gpu_mat *w, int n_heads, int64_t head_rows, const float *d_x,
                                   int64_t ldx, int64_t x_head_stride, int64_t cols, int n, void *d_scratch, float *d_y,
                                   int64_t ldy, int64_t y_head_stride, em_err *err) {
    EMC_CHECK(w && w->data && em_gpu_mat_type_ok(w->type), "GPU matmul heads: no matrix, or one of an unsupported type");
    EMC_CHECK(n >= 1 && n <= EM_GPU_WIDE_MAX_ROWS, "GPU matmul heads: %d rows (1..%d)", n, EM_GPU_WIDE_MAX_ROWS);
    EMC_CHECK(n_heads >= 1 && n_heads <= 65535 && head_rows >= 1 && (int64_t)n_heads * head_rows == w->rows,
              "GPU matmul heads: %d heads of %lld rows for a matrix of %lld rows", n_heads, (long long)head_rows,
              (long long)w->rows);
    EMC_CHECK(cols == w->cols, "GPU matmul heads: %lld columns for a matrix of %lld", (long long)cols, (long long)w->cols);
    EMC_CHECK(d_x && x_head_stride >= 0 && ldx >= (int64_t)(n_heads - 1) * x_head_stride + cols,
              "GPU matmul heads: input missing, or ldx %lld too short for %d heads %lld apart of %lld columns",
              (long long)ldx, n_heads, (long long)x_head_stride, (long long)cols);
    EMC_CHECK(d_y && y_head_stride >= 0 && ldy >= (int64_t)(n_heads - 1) * y_head_stride + head_rows,
              "GPU matmul heads: output missing, or ldy %lld too short for %d heads %lld apart of %lld rows",
              (long long)ldy, n_heads, (long long)y_head_stride, (long long)head_rows);
    const bool q8 = em_gpu_act_type(w->type) == EM_TYPE_Q8_0;
    if (q8) {
        EMC_CHECK(cols % 32 == 0, "GPU matmul heads: Q8_0 activations of %lld columns, not a multiple of 32",
                  (long long)cols);
        EMC_CHECK(d_scratch && ((uintptr_t)d_scratch & 15) == 0,
                  "GPU matmul heads: scratch missing or not 16-byte aligned (em_gpu_matmul_heads_scratch_bytes)");
    } else {
        EMC_CHECK(((uintptr_t)d_x & 15) == 0 && ldx % 4 == 0 && x_head_stride % 4 == 0,
                  "GPU matmul heads: F32 activations must be 16-byte aligned with ldx and the head stride multiples of 4");
    }
    int rc = emc_use(g, err);
    if (rc) return rc;
    const int8_t *xq = NULL;
    const float *xd = NULL;
    if (q8) {
        const uint64_t rows = (uint64_t)n_heads * (uint64_t)n;
        const uint64_t qbytes = (rows * (uint64_t)cols + 15) & ~(uint64_t)15;
        xq = (const int8_t *)d_scratch;
        xd = (const float *)((uint8_t *)d_scratch + qbytes);
        const int64_t warps = (int64_t)rows * (cols / 32);
        emc_launch(g, k_quant_q8_0_heads, emc_blocks(warps * 32, 256), 256, 0, d_x, ldx, x_head_stride, cols, n,
                   n_heads, (int8_t *)xq, (float *)xd);
        if ((rc = emc_launched(err, "k_quant_q8_0_heads"))) return rc;
    }
    if (n <= 1) launch_heads<1>(w, n_heads, head_rows, xq, xd, d_x, ldx, x_head_stride, n, d_y, ldy, y_head_stride, g);
    else if (n <= 2) launch_heads<2>(w, n_heads, head_rows, xq, xd, d_x, ldx, x_head_stride, n, d_y, ldy, y_head_stride, g);
    else if (n <= 4) launch_heads<4>(w, n_heads, head_rows, xq, xd, d_x, ldx, x_head_stride, n, d_y, ldy, y_head_stride, g);
    else if (n <= 8) launch_heads<8>(w, n_heads, head_rows, xq, xd, d_x, ldx, x_head_stride, n, d_y, ldy, y_head_stride, g);
    else launch_heads<16>(w, n_heads, head_rows, xq, xd, d_x, ldx, x_head_stride, n, d_y, ldy, y_head_stride, g);
    return emc_launched(err, "em_gpu_matmul_heads");
}
