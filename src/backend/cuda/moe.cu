/* backend/cuda/moe.cu: the routed experts of one MoE layer over the union of a pass's routes,
 * on the device, without a host sync: a union kernel (which experts the n rows chose, and
 * which rows each got), gate and up of every union expert in one launch, SwiGLU, the Q8_0
 * quantization of the hidden rows, down in one launch, and the weighted sum per row in
 * ascending expert order (model/moe.c's order). Launch shapes depend only on n and k (the
 * union's size is read on the device: blocks past it exit), so a pass can be captured in a
 * graph. An expert's rows get mm_q8_0_warp's arithmetic, the dense products' own: row j's
 * result does not depend on the other rows. */
#include "backend/cuda/mm_kernels.cuh"

#include <string.h>

#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_K 32

/* The scratch's pieces, each 256-byte aligned. um = min(n * k, n_expert) union slots. */
typedef struct moe_layout {
    int um;
    uint64_t meta, xq, xd, gt, up, hq, hd, out, total;
} moe_layout;

static uint64_t al(uint64_t v) { return (v + 255) & ~(uint64_t)255; }

static moe_layout layout(int n_expert, int k, int ffn, int64_t cols, int n) {
    moe_layout l;
    const uint64_t nk = (uint64_t)n * (uint64_t)k;
    l.um = (int)(nk < (uint64_t)n_expert ? nk : (uint64_t)n_expert);
    uint64_t at = 0;
    /* meta: count, then expert[um], cnt[um], rows[um][16], slots[um][16] */
    l.meta = at, at += al(4 * (1 + 2 * (uint64_t)l.um + 2 * 16 * (uint64_t)l.um));
    l.xq = at, at += al((uint64_t)n * cols);
    l.xd = at, at += al((uint64_t)n * (cols / 32) * 4);
    l.gt = at, at += al(nk * ffn * 4);
    l.up = at, at += al(nk * ffn * 4);
    l.hq = at, at += al(nk * ffn);
    l.hd = at, at += al(nk * (ffn / 32) * 4);
    l.out = at, at += al(nk * cols * 4);
    l.total = at;
    return l;
}

extern "C" uint64_t em_gpu_moe_scratch_bytes(int n_expert, int k, int ffn, int64_t cols, int n) {
    if (n_expert <= 0 || k <= 0 || ffn <= 0 || cols <= 0 || n <= 0) return 0;
    return layout(n_expert, k, ffn, cols, n).total;
}

/* One block of 1024 threads: thread e counts the (row, slot) pairs that chose expert e, in
 * ascending slot order; a block-wide prefix over the experts with rows gives each its union
 * position (ascending expert order). */
__global__ void __launch_bounds__(1024) k_moe_union(const int32_t *ids, int n, int k, int n_expert, int *meta, int um) {
    __shared__ int sid[EM_GPU_MAX_ROWS * MOE_MAX_K];
    __shared__ int wsum[32];
    const int nk = n * k, e = threadIdx.x, lane = e & 31, warp = e >> 5;
    for (int p = e; p < nk; p += blockDim.x) sid[p] = ids[p];
    __syncthreads();
    int cnt = 0, rows[EM_GPU_MAX_ROWS], slots[EM_GPU_MAX_ROWS];
    if (e < n_expert)
        for (int p = 0; p < nk; p++)
            if (sid[p] == e && cnt < EM_GPU_MAX_ROWS) rows[cnt] = p / k, slots[cnt] = p, cnt++;
    const unsigned has = __ballot_sync(0xffffffffu, cnt > 0);
    if (lane == 0) wsum[warp] = __popc(has);
    __syncthreads();
    int before = 0;
    for (int w = 0; w < warp; w++) before += wsum[w];
    const int pos = before + __popc(has & ((1u << lane) - 1u));
    if (cnt > 0 && pos < um) {
        int *expert = meta + 1, *count = expert + um, *urows = count + um, *uslots = urows + 16 * um;
        expert[pos] = e;
        count[pos] = cnt;
        for (int i = 0; i < cnt; i++) urows[pos * 16 + i] = rows[i], uslots[pos * 16 + i] = slots[i];
    }
    if (e == blockDim.x - 1) {
        int total = 0;
        for (int w = 0; w < 32; w++) total += wsum[w];
        meta[0] = total < um ? total : um;
    }
}

/* Union slot blockIdx.y: gate (blockIdx.z 0) or up (1) of its expert over its rows. */
template <int N>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_moe_gate_up(const int8_t *gq, const __half *gd, const int8_t *uq, const __half *ud, int ffn, int64_t cols,
                  const int *meta, int um, const int8_t *xq, const float *xd, float *gt, float *up) {
    const int u = blockIdx.y;
    if (u >= meta[0]) return;
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * MM_OUTS;
    if (r0 >= ffn) return;
    const int *expert = meta + 1, *count = expert + um, *urows = count + um, *uslots = urows + 16 * um;
    const int64_t e = expert[u];
    const int cnt = count[u];
    int xr[N], yr[N];
#pragma unroll
    for (int j = 0; j < N; j++) xr[j] = j < cnt ? urows[u * 16 + j] : 0, yr[j] = j < cnt ? uslots[u * 16 + j] : 0;
    const int8_t *wq = blockIdx.z ? uq : gq;
    const __half *wd = blockIdx.z ? ud : gd;
    mm_q8_0_warp<N>(wq + e * ffn * cols, wd + e * ffn * (cols / 32), ffn, cols, r0, xq, xd, cnt, xr,
                    blockIdx.z ? up : gt, ffn, yr);
}

/* Union slot blockIdx.y: down of its expert over its rows' hidden rows (slot-indexed). */
template <int N>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_moe_down(const int8_t *dq, const __half *dd, int ffn, int64_t cols, const int *meta, int um, const int8_t *hq,
               const float *hd, float *out) {
    const int u = blockIdx.y;
    if (u >= meta[0]) return;
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * MM_OUTS;
    if (r0 >= cols) return;
    const int *expert = meta + 1, *count = expert + um, *uslots = count + um + 16 * um;
    const int64_t e = expert[u];
    const int cnt = count[u];
    int sr[N];
#pragma unroll
    for (int j = 0; j < N; j++) sr[j] = j < cnt ? uslots[u * 16 + j] : 0;
    mm_q8_0_warp<N>(dq + e * cols * ffn, dd + e * cols * (ffn / 32), cols, ffn, r0, hq, hd, cnt, sr, out, cols, sr);
}

/* y[j][i] = 0; then + w * out for row j's experts in ascending id order (em_axpy's rounding:
 * the product rounded, then the sum). */
__global__ void k_moe_sum(const int32_t *ids, const float *wts, int k, const float *out, int64_t cols, float *y,
                          int64_t ldy) {
    __shared__ int ord[MOE_MAX_K];
    const int j = blockIdx.y;
    if (threadIdx.x == 0) { /* insertion sort of the row's k slots by expert id */
        for (int a = 0; a < k; a++) {
            int b = a;
            while (b > 0 && ids[j * k + ord[b - 1]] > ids[j * k + a]) ord[b] = ord[b - 1], b--;
            ord[b] = a;
        }
    }
    __syncthreads();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    float acc = 0.0f;
    for (int t = 0; t < k; t++) {
        const int s = j * k + ord[t];
        acc = acc + wts[s] * out[(int64_t)s * cols + i];
    }
    y[(int64_t)j * ldy + i] = acc;
}

template <int N>
static void launch_experts(const em_gpu_experts *x, const moe_layout *l, uint8_t *sc, int64_t cols, int k, int n,
                           cudaStream_t s) {
    (void)k, (void)n;
    const int *meta = (const int *)(sc + l->meta);
    dim3 g1(emc_blocks(x->ffn, MM_WARPS * MM_OUTS), (unsigned)l->um, 2);
    k_moe_gate_up<N><<<g1, MM_WARPS * 32, 0, s>>>((const int8_t *)x->gate->data, (const __half *)x->gate->scales,
                                                   (const int8_t *)x->up->data, (const __half *)x->up->scales, x->ffn,
                                                   cols, meta, l->um, (const int8_t *)(sc + l->xq),
                                                   (const float *)(sc + l->xd), (float *)(sc + l->gt),
                                                   (float *)(sc + l->up));
}

template <int N>
static void launch_down(const em_gpu_experts *x, const moe_layout *l, uint8_t *sc, int64_t cols, cudaStream_t s) {
    const int *meta = (const int *)(sc + l->meta);
    dim3 g2(emc_blocks(cols, MM_WARPS * MM_OUTS), (unsigned)l->um, 1);
    k_moe_down<N><<<g2, MM_WARPS * 32, 0, s>>>((const int8_t *)x->down->data, (const __half *)x->down->scales, x->ffn,
                                                cols, meta, l->um, (const int8_t *)(sc + l->hq),
                                                (const float *)(sc + l->hd), (float *)(sc + l->out));
}

extern "C" int em_gpu_moe(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n,
                          const int32_t *d_ids, const float *d_wts, int k, void *d_scratch, float *d_y, int64_t ldy,
                          em_err *err) {
    EMC_CHECK(x && x->gate && x->up && x->down, "GPU MoE: missing expert matrices");
    EMC_CHECK(x->gate->type == EM_TYPE_Q8_0 && x->up->type == EM_TYPE_Q8_0 && x->down->type == EM_TYPE_Q8_0,
              "GPU MoE: experts of types %s/%s/%s; only Q8_0 runs on the GPU yet", em_type_name(x->gate->type),
              em_type_name(x->up->type), em_type_name(x->down->type));
    EMC_CHECK(x->n_expert > 0 && x->n_expert <= MOE_MAX_EXPERTS && x->ffn > 0 && x->ffn % 32 == 0,
              "GPU MoE: %d experts of ffn %d (at most %d experts, ffn a multiple of 32)", x->n_expert, x->ffn,
              MOE_MAX_EXPERTS);
    const int64_t cols = x->gate->cols;
    EMC_CHECK(x->gate->rows == (int64_t)x->n_expert * x->ffn && x->up->rows == x->gate->rows && x->up->cols == cols &&
                  x->down->rows == (int64_t)x->n_expert * cols && x->down->cols == x->ffn,
              "GPU MoE: expert shapes gate %lldx%lld, up %lldx%lld, down %lldx%lld for %d experts of %d",
              (long long)x->gate->rows, (long long)cols, (long long)x->up->rows, (long long)x->up->cols,
              (long long)x->down->rows, (long long)x->down->cols, x->n_expert, x->ffn);
    EMC_CHECK(n >= 1 && n <= EM_GPU_MAX_ROWS && k >= 1 && k <= MOE_MAX_K && k <= x->n_expert,
              "GPU MoE: %d rows (1..%d), top-%d (1..%d)", n, EM_GPU_MAX_ROWS, k, MOE_MAX_K);
    EMC_CHECK(d_x && ldx >= cols && d_ids && d_wts && d_y && ldy >= cols && d_scratch && ((uintptr_t)d_scratch & 255) == 0,
              "GPU MoE: missing buffer, ldx/ldy below %lld, or scratch not 256-byte aligned", (long long)cols);
    int rc = emc_use(g, err);
    if (rc) return rc;
    const moe_layout l = layout(x->n_expert, k, x->ffn, cols, n);
    uint8_t *sc = (uint8_t *)d_scratch;
    cudaStream_t s = g->stream;
    k_moe_union<<<1, 1024, 0, s>>>(d_ids, n, k, x->n_expert, (int *)(sc + l.meta), l.um);
    if ((rc = emc_launched(err, "k_moe_union"))) return rc;
    const int64_t xw = (int64_t)n * (cols / 32);
    k_quant_q8_0<<<emc_blocks(xw * 32, 256), 256, 0, s>>>(d_x, ldx, cols, n, (int8_t *)(sc + l.xq), (float *)(sc + l.xd));
    if ((rc = emc_launched(err, "k_quant_q8_0 (expert inputs)"))) return rc;
    /* an expert gets at most n rows: the smallest bucket >= n covers every union slot */
    if (n <= 1) launch_experts<1>(x, &l, sc, cols, k, n, s);
    else if (n <= 2) launch_experts<2>(x, &l, sc, cols, k, n, s);
    else if (n <= 4) launch_experts<4>(x, &l, sc, cols, k, n, s);
    else if (n <= 8) launch_experts<8>(x, &l, sc, cols, k, n, s);
    else launch_experts<16>(x, &l, sc, cols, k, n, s);
    if ((rc = emc_launched(err, "k_moe_gate_up"))) return rc;
    const int64_t nk = (int64_t)n * k;
    if ((rc = em_gpu_swiglu(g, (const float *)(sc + l.gt), (const float *)(sc + l.up), nk * x->ffn, (float *)(sc + l.gt), err)))
        return rc;
    const int64_t hw = nk * (x->ffn / 32);
    k_quant_q8_0<<<emc_blocks(hw * 32, 256), 256, 0, s>>>((const float *)(sc + l.gt), x->ffn, x->ffn, (int)nk,
                                                         (int8_t *)(sc + l.hq), (float *)(sc + l.hd));
    if ((rc = emc_launched(err, "k_quant_q8_0 (expert hidden rows)"))) return rc;
    if (n <= 1) launch_down<1>(x, &l, sc, cols, s);
    else if (n <= 2) launch_down<2>(x, &l, sc, cols, s);
    else if (n <= 4) launch_down<4>(x, &l, sc, cols, s);
    else if (n <= 8) launch_down<8>(x, &l, sc, cols, s);
    else launch_down<16>(x, &l, sc, cols, s);
    if ((rc = emc_launched(err, "k_moe_down"))) return rc;
    dim3 g3(emc_blocks(cols, 256), (unsigned)n);
    k_moe_sum<<<g3, 256, 0, s>>>(d_ids, d_wts, k, (const float *)(sc + l.out), cols, d_y, ldy);
    return emc_launched(err, "k_moe_sum");
}
