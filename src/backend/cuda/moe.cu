/* backend/cuda/moe.cu: the routed experts of one MoE layer over the union of a pass's routes,
 * on the device, without a host sync: a union kernel (which experts the n rows chose, and
 * which rows each got; a one-row pass finds it from its ids inside the products), gate and
 * up of every union expert in one launch (two when their types differ), SwiGLU or SiTU with
 * the Q8_0 quantization of the hidden rows (for integer down weights) in one launch, down in
 * one launch (its weights asked of L2 before it waits for the hidden rows), and the weighted
 * sum per row in ascending expert order (model/moe.c's order); for one row of Q8_0 experts (a
 * decode step) down and the sum are one launch, the same bits. A wide call (a prompt's 512-row
 * pass) runs Q8_0 experts in union slots of up to 8 rows on the tensor cores (mm_tc.cuh), the
 * same bits again.
 * Launch shapes depend only on n, k and the weight types (the union's size is read on the
 * device: blocks past it exit), so a pass can be captured in a graph.
 * Experts of every device layout the products run: an expert's rows get the warp body of
 * em_gpu_matmul for its type (mm_kernels.cuh, mm_quant.cuh) on the expert's rows of the stack,
 * with the activations em_gpu_act_prepare would make, so each row's result is the dense
 * product's, bit for bit, and does not depend on the other rows. */
#include "backend/cuda/mm_kernels.cuh"
#include "backend/cuda/mm_quant.cuh"
#include "backend/cuda/mm_tc.cuh"

#include <math.h>
#include <string.h>

#define MOE_MAX_EXPERTS 1024
/* Rows of a wide call's union slot at most: an expert chosen by more rows takes several slots.
 * Q8_0 experts run slots of 8 rows on the tensor cores (mm_q8_0_tc8_block); other types, or
 * EMBER_GPU_MOE_TC8=0, slots of 4 rows by the 4-row kernels (one wide 48B-shaped layer of 256
 * rows: 1.81 ms with slots of 4, 2.31 of 8, 2.57 of 16, 3.51 of 2; docs/cuda.md runs 61-62).
 * The scratch has room for the slots of 4. */
#define MOE_WIDE_SLOT 4
#define MOE_WIDE_SLOT_TC 8
#define MOE_MAX_K 32

/* The scratch's pieces, each 256-byte aligned. um union slots: min(n * k, n_expert), or for a
 * wide call (an expert may take several slots of up to MOE_WIDE_SLOT rows) that plus
 * n * k / MOE_WIDE_SLOT. */
typedef struct moe_layout {
    int um;
    uint64_t meta, xq, xd, gt, up, hq, hd, out, total;
} moe_layout;

static uint64_t al(uint64_t v) { return (v + 255) & ~(uint64_t)255; }

static moe_layout layout(int n_expert, int k, int ffn, int64_t cols, int n, bool wide) {
    moe_layout l;
    const uint64_t nk = (uint64_t)n * (uint64_t)k;
    l.um = (int)(nk < (uint64_t)n_expert ? nk : (uint64_t)n_expert) + (wide ? (int)(nk / MOE_WIDE_SLOT) : 0);
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
    return layout(n_expert, k, ffn, cols, n, false).total;
}

extern "C" uint64_t em_gpu_moe_wide_scratch_bytes(int n_expert, int k, int ffn, int64_t cols, int n) {
    if (n_expert <= 0 || k <= 0 || ffn <= 0 || cols <= 0 || n <= 0) return 0;
    return layout(n_expert, k, ffn, cols, n, true).total;
}

/* One block of 1024 threads: thread e counts the (row, slot) pairs that chose expert e, in
 * ascending slot order; a block-wide prefix over the experts with rows gives each its union
 * position (ascending expert order). */
__global__ void __launch_bounds__(1024) k_moe_union(const int32_t *ids, int e0, int n, int k, int n_expert, int *meta,
                                                    int um) {
    emc_kernel_begin();
    __shared__ int sid[EM_GPU_MAX_ROWS * MOE_MAX_K];
    __shared__ int wsum[32];
    const int nk = n * k, e = threadIdx.x, lane = e & 31, warp = e >> 5;
    for (int p = e; p < nk; p += blockDim.x) sid[p] = ids[p] - e0; /* local ids; others match no expert */
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

/* k_moe_union for a wide call (nk = n k <= EM_GPU_WIDE_MAX_PAIRS (row, slot) pairs): expert e's
 * pairs in ascending order, cap (at most 16) to a union slot, the slots of all experts in ascending
 * expert order; the same meta. First every expert's count (shared-memory atomics) and, by a
 * block-wide prefix over the slots each needs, its first slot. Then each pair's rank among its
 * expert's pairs counts the pairs before it: per chunk of 1024 pairs the warps take turns, each
 * lane adding to the count its expert had so far the lanes below it that chose the same
 * (__match_any_sync), and the pair is placed at once. Nothing is held per pair between the two
 * walks, so the pairs a call takes do not cost registers. (Thread e scanning all nk pairs for
 * its own took 177 us a layer at 2,048 pairs, docs/cuda.md run 65; ranks held in registers
 * over both walks, 17 us, run 68, but spilled past 16 chunks.) */
__global__ void __launch_bounds__(1024) k_moe_union_wide(const int32_t *ids, int nk, int k, int n_expert, int cap,
                                                         int *meta, int um) {
    emc_kernel_begin();
    __shared__ int cnts[MOE_MAX_EXPERTS], bases[MOE_MAX_EXPERTS], run[MOE_MAX_EXPERTS];
    __shared__ int wsum[32];
    const unsigned all = 0xffffffffu;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < n_expert; e += blockDim.x) cnts[e] = 0, run[e] = 0;
    __syncthreads();
    for (int p = tid; p < nk; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < n_expert) atomicAdd(&cnts[e], 1);
    }
    __syncthreads();
    const int e = tid, cnt = e < n_expert ? cnts[e] : 0, ns = (cnt + cap - 1) / cap;
    int incl = ns; /* inclusive prefix of the slots over the warp, then over the warps before */
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(all, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    int base = incl - ns;
    for (int w = 0; w < warp; w++) base += wsum[w];
    if (cnt > 0) bases[e] = base;
    __syncthreads();
    int *expert = meta + 1, *count = expert + um, *urows = count + um, *uslots = urows + 16 * um;
    for (int c = 0; c * 1024 < nk; c++) { /* the whole block walks the same chunks */
        const int p = c * 1024 + tid;
        int pe = p < nk ? ids[p] : -1;
        if (pe < 0 || pe >= n_expert) pe = -1; /* matches no expert */
        const unsigned same = __match_any_sync(all, pe), valid = __ballot_sync(all, pe >= 0);
        const int below = __popc(same & ((1u << lane) - 1u));
        for (int w = 0; w < 32; w++) {
            __syncthreads();
            if (warp != w || pe < 0) continue;
            const int i = run[pe] + below, s = bases[pe] + i / cap, t = i % cap;
            __syncwarp(valid); /* every lane has read its count before the first lanes add theirs */
            if (below == 0) run[pe] += __popc(same);
            if (s < um) {
                urows[s * 16 + t] = p / k, uslots[s * 16 + t] = p;
                if (t == 0) expert[s] = pe, count[s] = cnts[pe] - i < cap ? cnts[pe] - i : cap;
            }
        }
    }
    if (tid == blockDim.x - 1) {
        int total = 0;
        for (int w = 0; w < 32; w++) total += wsum[w];
        meta[0] = total < um ? total : um;
    }
}

/* Where the kernels find a pass's union: k_moe_union's meta (um slots), or for one row its
 * k ids (n_expert experts). */
typedef struct moe_uref {
    const int *meta;
    int um;
    const int32_t *ids;
    int k, n_expert;
    int e0; /* id of the first expert held (a share: em_gpu_moe_share); 0 for the whole stack */
} moe_uref;

/* One row's k ids as k_moe_union places them (ascending expert order, ids out of range
 * ignored, a repeated id at its first slot): lane t < k holds id v, the mask of the slots that
 * hold it (same; 0 for an invalid id), whether t is its first slot, and its union position
 * (below: the distinct valid ids below it). Every lane of the warp calls it. */
typedef struct moe_rank {
    int32_t v;
    unsigned same, firsts;
    int below;
    bool first;
} moe_rank;

__device__ __forceinline__ moe_rank moe_row_rank(const moe_uref &ur) {
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31, k = ur.k;
    moe_rank r;
    r.v = lane < k ? ur.ids[lane] - ur.e0 : -1; /* local expert; out of [0, n_expert): not held */
    const unsigned valid = __ballot_sync(all, lane < k && r.v >= 0 && r.v < ur.n_expert);
    r.same = __match_any_sync(all, r.v) & valid;
    r.first = (valid >> lane & 1u) && __ffs(r.same) - 1 == lane;
    r.firsts = __ballot_sync(all, r.first);
    r.below = 0;
    for (int t = 0; t < k; t++) { /* lanes from k on hold no id */
        const int32_t w = __shfl_sync(all, r.v, t);
        r.below += (r.firsts >> t & 1u) && w < r.v;
    }
    return r;
}

/* Union slot u of a pass's routes: its expert, how many rows chose it, and (N entries) those
 * rows and their (row, slot) indices. For one row (N == 1) it is found from the row's k ids
 * directly by each warp (moe_row_rank), so a one-row pass needs no union launch; wider passes
 * read k_moe_union's meta. cnt 0: the slot is past the union. Every lane of the warp calls it. */
template <int N>
__device__ __forceinline__ void moe_slot(const moe_uref &ur, int u, int64_t *e, int *cnt, int (&rows)[N], int (&slots)[N]) {
    const int *meta = ur.meta;
    const int um = ur.um;
    if constexpr (N == 1) { /* by the whole warp (warps leave whole) */
        const unsigned all = 0xffffffffu;
        const moe_rank r = moe_row_rank(ur);
        const unsigned hit = __ballot_sync(all, r.first && r.below == u);
        const int s = __ffs(hit) - 1;
        const int c = __popc(r.same);
        *e = __shfl_sync(all, r.v, s < 0 ? 0 : s);
        *cnt = s < 0 ? 0 : __shfl_sync(all, c, s);
        rows[0] = 0, slots[0] = s < 0 ? 0 : s;
    } else {
        if (u >= meta[0]) {
            *cnt = 0;
            return;
        }
        const int *expert = meta + 1, *count = expert + um, *urows = count + um, *uslots = urows + 16 * um;
        *e = expert[u];
        *cnt = count[u];
#pragma unroll
        for (int j = 0; j < N; j++) rows[j] = j < *cnt ? urows[u * 16 + j] : 0, slots[j] = j < *cnt ? uslots[u * 16 + j] : 0;
    }
}

/* One row's whole union at once: lane u gets union slot u's expert (*e) and the mask of the
 * row's slots that chose it (*mask; 0 past the union). Every lane of the warp calls it. */
__device__ __forceinline__ void moe_row_union(const moe_uref &ur, int32_t *e, unsigned *mask) {
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const moe_rank r = moe_row_rank(ur);
    int src = -1;
    for (int t = 0; t < ur.k; t++) {
        const int bt = __shfl_sync(all, r.below, t);
        if ((r.firsts >> t & 1u) && bt == lane) src = t;
    }
    *e = __shfl_sync(all, r.v, src < 0 ? 0 : src);
    const unsigned m = __shfl_sync(all, r.same, src < 0 ? 0 : src);
    *mask = src < 0 ? 0u : m;
}

/* A stacked expert matrix as the kernels read it: its device arrays, the values of the whole
 * stack (Q6_K's scale arrays follow each other, sized by it), and the row length. */
typedef struct moe_mat {
    const uint8_t *data, *scales;
    uint64_t all;
    int64_t cols;
} moe_mat;

/* Activation rows for one product: Q8_0 (qs, d; row r at qs + r * cols) or F32 (x + r * ldx). */
typedef struct moe_act {
    const int8_t *qs;
    const float *d;
    const float *x;
    int64_t ldx;
} moe_act;

static moe_mat mat_of(const em_gpu_mat *m) {
    moe_mat v = { (const uint8_t *)m->data, (const uint8_t *)m->scales, (uint64_t)m->rows * (uint64_t)m->cols, m->cols };
    return v;
}

/* The warp body of weight type T (em_gpu_matmul's, OUTS outputs a warp: mm_outs) on rows
 * [row0, row0 + rows) of the stack, outputs r0.. of that expert. */
template <int T, int N, int OUTS>
__device__ __forceinline__ void expert_warp(const moe_mat &w, int64_t row0, int64_t rows, int64_t r0, const moe_act &a,
                                            int n, const int (&xr)[N], float *y, int64_t ldy, const int (&yr)[N]) {
    const int64_t cols = w.cols;
    if constexpr (T == EM_TYPE_Q8_0) {
        mm_q8_0_warp<N, OUTS>((const int8_t *)w.data + row0 * cols, (const __half *)w.scales + row0 * (cols / 32), rows, cols, r0,
                        a.qs, a.d, n, xr, y, ldy, yr);
    } else if constexpr (T == EM_TYPE_Q4_K) {
        mm_q4_K_warp<N>(w.data + row0 * (cols / 2), w.scales + row0 * (cols / 256) * 16, rows, cols, r0, a.qs, a.d, n, xr,
                        y, ldy, yr);
    } else if constexpr (T == EM_TYPE_Q6_K) {
        mm_q6_K_warp<N>(w.data + row0 * (cols / 2), w.scales + row0 * (cols / 4),
                        (const int8_t *)(w.scales + w.all / 4) + row0 * (cols / 16),
                        (const __half *)(w.scales + w.all / 4 + w.all / 16) + row0 * (cols / 256), rows, cols, r0, a.qs,
                        a.d, n, xr, y, ldy, yr);
    } else if constexpr (T == EM_TYPE_MXFP4) {
        mm_mxfp4_warp<N>(w.data + row0 * (cols / 2), w.scales + row0 * (cols / 32), rows, cols, r0, a.qs, a.d, n, xr, y,
                         ldy, yr);
    } else {
        constexpr int vb = T == EM_TYPE_F32 ? 4 : 2; /* bytes a value */
        mm_float_warp<T, N, OUTS>(w.data + row0 * cols * vb, rows, cols, r0, a.x, a.ldx, n, xr, y, ldy, yr);
    }
}

/* Union slot blockIdx.y: gate or up of its expert over its rows (input rows urows, output rows
 * uslots of the slot-indexed gt / up buffers). blockIdx.z picks the matrix: 0 w0 into y0, 1 w1
 * into y1 (both of type T; gate and up of different types take one launch each). */
template <int T, int N, int OUTS>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_moe_gate_up(moe_mat w0, moe_act a0, float *y0, moe_mat w1, moe_act a1, float *y1, int ffn, moe_uref ur) {
    /* waits before it lets the next kernels start: so once they start, the routes (and the
     * union) are final, and k_moe_down reads them before its own wait */
    emc_wait_prior();
    emc_let_next_start();
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * OUTS;
    if (r0 >= ffn) return;
    int64_t e = 0;
    int cnt, xr[N], yr[N];
    moe_slot<N>(ur, blockIdx.y, &e, &cnt, xr, yr);
    if (cnt == 0) return;
    if (blockIdx.z) expert_warp<T, N, OUTS>(w1, e * ffn, ffn, r0, a1, cnt, xr, y1, ffn, yr);
    else expert_warp<T, N, OUTS>(w0, e * ffn, ffn, r0, a0, cnt, xr, y0, ffn, yr);
}

/* The hidden rows: h = act(gate, up) over count values, and (qs non-NULL) their Q8_0
 * activations as k_quant_q8_0 makes them from h, in the same launch (one warp per 32 values). */
__global__ void k_moe_act(const float *gt, const float *up, int64_t count, mm_glu glu, float *h, int8_t *qs, float *qd) {
    emc_kernel_begin();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return; /* count is a multiple of 32: whole warps leave */
    const float v = glu_of(glu, gt[i], up[i]);
    h[i] = v;
    if (qs) quant_q8_0_block(v, (int)(threadIdx.x & 31), qs + (i & ~(int64_t)31), qd + (i >> 5));
}

/* Union slot blockIdx.y: down of its expert over its rows' hidden rows (slot-indexed). The
 * routes are final when it starts (k_moe_gate_up waits before it lets the kernels after it
 * start), so a warp finds its expert and asks L2 for its weight rows before it waits for the
 * hidden rows. */
template <int T, int N, int OUTS>
__global__ void __launch_bounds__(MM_WARPS * 32)
    k_moe_down(moe_mat w, moe_act a, int64_t cols, moe_uref ur, float *out) {
    emc_let_next_start();
    const int64_t r0 = ((int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * OUTS;
    int64_t e = 0;
    int cnt, rows[N], sr[N];
    moe_slot<N>(ur, blockIdx.y, &e, &cnt, rows, sr);
    if (cnt > 0 && r0 < cols)
        prefetch_weight_rows<T>(w.data, w.scales, w.cols, e * cols + r0, cols - r0 < OUTS ? cols - r0 : OUTS);
    emc_wait_prior();
    if (cnt == 0 || r0 >= cols) return;
    expert_warp<T, N, OUTS>(w, e * cols, cols, r0, a, cnt, sr, out, cols, sr);
}

/* The slots of a wide call on the tensor cores (Q8_0 weights and activations; slots of up to
 * MOE_WIDE_SLOT_TC rows): union slot blockIdx.y, TC8_OUTS outputs a block, the bits of
 * k_moe_gate_up / k_moe_down (mm_tc.cuh). Blocks past the union leave whole. */
struct moe_wide_slot {
    int64_t e;
    int cnt;
    const int *rows, *slots; /* 16 apart in the meta; cnt of them hold the slot's rows */
};
__device__ __forceinline__ moe_wide_slot moe_wide_slot_of(const moe_uref &ur, int u) {
    const int *meta = ur.meta, um = ur.um;
    moe_wide_slot s = { 0, 0, NULL, NULL };
    if (u >= meta[0]) return s;
    const int *expert = meta + 1, *count = expert + um, *urows = count + um, *uslots = urows + 16 * um;
    s.e = expert[u], s.cnt = count[u], s.rows = urows + 16 * u, s.slots = uslots + 16 * u;
    return s;
}

template <int MINB>
__global__ void __launch_bounds__(TC8_THREADS, MINB)
    k_moe_gate_up_tc8(moe_mat w0, moe_act a0, float *y0, moe_mat w1, moe_act a1, float *y1, int ffn, moe_uref ur) {
    emc_wait_prior(); /* as k_moe_gate_up: the next kernels start once the routes are final */
    emc_let_next_start();
    __shared__ tc8_smem sm;
    const moe_wide_slot s = moe_wide_slot_of(ur, blockIdx.y);
    if (s.cnt == 0) return;
    const moe_mat &w = blockIdx.z ? w1 : w0;
    const moe_act &a = blockIdx.z ? a1 : a0;
    const int64_t cols = w.cols;
    mm_q8_0_tc8_block((const int8_t *)w.data + s.e * ffn * cols, (const __half *)w.scales + s.e * ffn * (cols / 32), ffn,
                      cols, (int64_t)blockIdx.x * TC8_OUTS, a.qs, a.d, s.rows, s.cnt, blockIdx.z ? y1 : y0, ffn, s.slots,
                      false, sm);
}

/* Down's weights are asked for before the wait (the routes are final when it starts), its
 * hidden rows (slot-indexed, as k_moe_down's) after it. */
template <int MINB>
__global__ void __launch_bounds__(TC8_THREADS, MINB)
    k_moe_down_tc8(moe_mat w, moe_act a, int64_t cols, moe_uref ur, float *out) {
    emc_let_next_start();
    __shared__ tc8_smem sm;
    const moe_wide_slot s = moe_wide_slot_of(ur, blockIdx.y);
    if (s.cnt == 0) return;
    const int64_t ffn = w.cols;
    mm_q8_0_tc8_block((const int8_t *)w.data + s.e * cols * ffn, (const __half *)w.scales + s.e * cols * (ffn / 32), cols,
                      ffn, (int64_t)blockIdx.x * TC8_OUTS, a.qs, a.d, s.slots, s.cnt, out, cols, s.slots, true, sm);
}

/* Down of one row's experts and their weighted sum in one launch (Q8_0 weights and hidden rows):
 * warp c computes output column c of every union expert, G experts' weights in flight at a
 * time, and adds wts[s] * v for each slot s that chose the expert. Each v is k_moe_down's
 * (mm_q8_0_warp's chain: a lane's blocks ascending, then the butterfly) and the sum is
 * k_moe_sum's (ascending expert id, equal ids in slot order, each product rounded, then the
 * add), so y is the same bits as k_moe_down + k_moe_sum; k_moe_sum's scratch rows are not
 * written. Routes final when it starts (k_moe_gate_up waits before it lets the next start), so
 * the weight rows are asked of L2 before the wait for the hidden rows. */
#define MOE_DS_G 4
__global__ void __launch_bounds__(MM_WARPS * 32, 3)
    k_moe_down_sum(moe_mat w, moe_act a, int64_t cols, moe_uref ur, const float *wts, float *y) {
    emc_let_next_start();
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const int64_t c = (int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5), ffn = w.cols, bpr = ffn / 32;
    if (c >= cols) return; /* whole warps */
    const int8_t *wq = (const int8_t *)w.data;
    const __half *wd = (const __half *)w.scales;
    int32_t ue;
    unsigned umask;
    moe_row_union(ur, &ue, &umask);
    if (umask) { /* lane u asks L2 for slot u's weight row and its scales */
        const int64_t r = (int64_t)ue * cols + c;
        for (int64_t o = 0; o < ffn; o += 128) prefetch_line(wq + r * ffn + o);
        for (int64_t o = 0; o < bpr; o += 64) prefetch_line(wd + r * bpr + o);
    }
    emc_wait_prior();
    float tot = 0.0f;
    for (int u0 = 0; u0 < ur.um; u0 += MOE_DS_G) { /* um <= k <= 32: lane u0 + g holds slot u0 + g */
        int64_t row[MOE_DS_G];
        unsigned mask[MOE_DS_G];
        int hr[MOE_DS_G];
        float acc[MOE_DS_G];
#pragma unroll
        for (int g = 0; g < MOE_DS_G; g++) {
            mask[g] = __shfl_sync(all, umask, (u0 + g) & 31);
            row[g] = (int64_t)__shfl_sync(all, ue, (u0 + g) & 31) * cols + c;
            hr[g] = mask[g] ? __ffs(mask[g]) - 1 : 0; /* the slot whose hidden row gate/up wrote */
            acc[g] = 0.0f;
        }
        for (int64_t b = lane; b < bpr; b += 32) {
            q8_block wb[MOE_DS_G];
#pragma unroll
            for (int g = 0; g < MOE_DS_G; g++)
                if (mask[g]) wb[g] = q8_0_load(wq + row[g] * ffn, wd + row[g] * bpr, b);
#pragma unroll
            for (int g = 0; g < MOE_DS_G; g++)
                if (mask[g])
                    acc[g] = q8_0_block_add(acc[g], wb[g], a.qs + (int64_t)hr[g] * ffn + b * 32,
                                            a.d[(int64_t)hr[g] * bpr + b]);
        }
#pragma unroll
        for (int g = 0; g < MOE_DS_G; g++) {
            if (!mask[g]) continue;
            const float v = warp_sum(acc[g]);
            for (unsigned m = mask[g]; m; m &= m - 1) tot = __fadd_rn(tot, __fmul_rn(wts[__ffs(m) - 1], v));
        }
        if (!mask[MOE_DS_G - 1]) break;
    }
    if (lane == 0) y[c] = tot;
}

/* y[j][i] = 0; then + w * out for row j's experts in ascending id order (em_axpy's rounding:
 * the product rounded, then the sum). A slot's output is in the buffer of the share that holds
 * its expert (one share: the whole stack); a repeated expert's slots all read its first slot's
 * output (the one a one-row down writes; a wider one writes the same values to each), and an
 * expert no share holds adds nothing. */
__global__ void k_moe_sum(const int32_t *ids, const float *wts, int k, em_gpu_moe_parts parts, int64_t cols, float *y,
                          int64_t ldy) {
    emc_kernel_begin();
    __shared__ int ord[MOE_MAX_K], first[MOE_MAX_K];
    __shared__ const float *from[MOE_MAX_K];
    const int j = blockIdx.y;
    if (threadIdx.x == 0) { /* insertion sort of the row's k slots by expert id */
        const int32_t *id = ids + j * k;
        for (int a = 0; a < k; a++) {
            int b = a;
            while (b > 0 && id[ord[b - 1]] > id[a]) ord[b] = ord[b - 1], b--;
            ord[b] = a;
        }
        for (int t = 0; t < k; t++) {
            const int32_t e = id[ord[t]];
            first[t] = t > 0 && e == id[ord[t - 1]] ? first[t - 1] : ord[t];
            from[t] = NULL;
#pragma unroll
            for (int r = 0; r < EM_GPU_MAX_SHARES; r++) /* static indices: the parameters stay in constant memory */
                if (r < parts.n && e >= parts.first[r] && e < parts.first[r + 1]) from[t] = parts.out[r];
        }
    }
    __syncthreads();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    float acc = 0.0f;
#pragma unroll 8
    for (int t = 0; t < k; t++)
        if (from[t]) acc = acc + wts[j * k + ord[t]] * from[t][(int64_t)(j * k + first[t]) * cols + i];
    y[(int64_t)j * ldy + i] = acc;
}

/* The smallest row bucket N >= n (an expert gets at most n rows) and type T's kernel, with
 * mm_outs(T, n, cols of the weights) outputs a warp. */
template <int T, int N, int OUTS>
static void launch_gate_up_n(const moe_mat &w0, const moe_act &a0, float *y0, const moe_mat &w1, const moe_act &a1,
                             float *y1, int mats, int ffn, const moe_uref &ur, const em_gpu *g) {
    dim3 grid(emc_blocks(ffn, MM_WARPS * OUTS), (unsigned)ur.um, (unsigned)mats);
    emc_launch(g, k_moe_gate_up<T, N, OUTS>, grid, MM_WARPS * 32, 0, w0, a0, y0, w1, a1, y1, ffn, ur);
}
template <int T>
static void launch_gate_up_t(int n, const moe_mat &w0, const moe_act &a0, float *y0, const moe_mat &w1,
                             const moe_act &a1, float *y1, int mats, int ffn, const moe_uref &ur, const em_gpu *g) {
    if constexpr (mm_narrow_ok(T)) {
        if (mm_outs(T, n, w0.cols) == MM_OUTS_NARROW) {
            if (n <= 1) launch_gate_up_n<T, 1, MM_OUTS_NARROW>(w0, a0, y0, w1, a1, y1, mats, ffn, ur, g);
            else launch_gate_up_n<T, 2, MM_OUTS_NARROW>(w0, a0, y0, w1, a1, y1, mats, ffn, ur, g);
            return;
        }
    }
    if (n <= 1) launch_gate_up_n<T, 1, MM_OUTS>(w0, a0, y0, w1, a1, y1, mats, ffn, ur, g);
    else if (n <= 2) launch_gate_up_n<T, 2, MM_OUTS>(w0, a0, y0, w1, a1, y1, mats, ffn, ur, g);
    else if (n <= 4) launch_gate_up_n<T, 4, MM_OUTS>(w0, a0, y0, w1, a1, y1, mats, ffn, ur, g);
    else if (n <= 8) launch_gate_up_n<T, 8, MM_OUTS>(w0, a0, y0, w1, a1, y1, mats, ffn, ur, g);
    else launch_gate_up_n<T, 16, MM_OUTS>(w0, a0, y0, w1, a1, y1, mats, ffn, ur, g);
}
/* mats 2: w0 and w1 (one type) in one launch; mats 1: w0 alone. */
static void launch_gate_up(int type, int n, const moe_mat &w0, const moe_act &a0, float *y0, const moe_mat &w1,
                           const moe_act &a1, float *y1, int mats, int ffn, const moe_uref &ur, const em_gpu *g) {
    switch (type) {
    case EM_TYPE_Q8_0: launch_gate_up_t<EM_TYPE_Q8_0>(n, w0, a0, y0, w1, a1, y1, mats, ffn, ur, g); break;
    case EM_TYPE_Q4_K: launch_gate_up_t<EM_TYPE_Q4_K>(n, w0, a0, y0, w1, a1, y1, mats, ffn, ur, g); break;
    case EM_TYPE_Q6_K: launch_gate_up_t<EM_TYPE_Q6_K>(n, w0, a0, y0, w1, a1, y1, mats, ffn, ur, g); break;
    case EM_TYPE_MXFP4: launch_gate_up_t<EM_TYPE_MXFP4>(n, w0, a0, y0, w1, a1, y1, mats, ffn, ur, g); break;
    case EM_TYPE_F32: launch_gate_up_t<EM_TYPE_F32>(n, w0, a0, y0, w1, a1, y1, mats, ffn, ur, g); break;
    case EM_TYPE_F16: launch_gate_up_t<EM_TYPE_F16>(n, w0, a0, y0, w1, a1, y1, mats, ffn, ur, g); break;
    default: launch_gate_up_t<EM_TYPE_BF16>(n, w0, a0, y0, w1, a1, y1, mats, ffn, ur, g); break;
    }
}

template <int T, int N, int OUTS>
static void launch_down_n(const moe_mat &w, const moe_act &a, int64_t cols, const moe_uref &ur, float *out,
                          const em_gpu *g) {
    const dim3 grid(emc_blocks(cols, MM_WARPS * OUTS), (unsigned)ur.um, 1);
    emc_launch(g, k_moe_down<T, N, OUTS>, grid, MM_WARPS * 32, 0, w, a, cols, ur, out);
}
template <int T>
static void launch_down_t(int n, const moe_mat &w, const moe_act &a, int64_t cols, const moe_uref &ur, float *out,
                          const em_gpu *g) {
    if constexpr (mm_narrow_ok(T)) {
        if (mm_outs(T, n, w.cols) == MM_OUTS_NARROW) {
            if (n <= 1) launch_down_n<T, 1, MM_OUTS_NARROW>(w, a, cols, ur, out, g);
            else launch_down_n<T, 2, MM_OUTS_NARROW>(w, a, cols, ur, out, g);
            return;
        }
    }
    if (n <= 1) launch_down_n<T, 1, MM_OUTS>(w, a, cols, ur, out, g);
    else if (n <= 2) launch_down_n<T, 2, MM_OUTS>(w, a, cols, ur, out, g);
    else if (n <= 4) launch_down_n<T, 4, MM_OUTS>(w, a, cols, ur, out, g);
    else if (n <= 8) launch_down_n<T, 8, MM_OUTS>(w, a, cols, ur, out, g);
    else launch_down_n<T, 16, MM_OUTS>(w, a, cols, ur, out, g);
}
static void launch_down(int type, int n, const moe_mat &w, const moe_act &a, int64_t cols, const moe_uref &ur,
                        float *out, const em_gpu *g) {
    switch (type) {
    case EM_TYPE_Q8_0: launch_down_t<EM_TYPE_Q8_0>(n, w, a, cols, ur, out, g); break;
    case EM_TYPE_Q4_K: launch_down_t<EM_TYPE_Q4_K>(n, w, a, cols, ur, out, g); break;
    case EM_TYPE_Q6_K: launch_down_t<EM_TYPE_Q6_K>(n, w, a, cols, ur, out, g); break;
    case EM_TYPE_MXFP4: launch_down_t<EM_TYPE_MXFP4>(n, w, a, cols, ur, out, g); break;
    case EM_TYPE_F32: launch_down_t<EM_TYPE_F32>(n, w, a, cols, ur, out, g); break;
    case EM_TYPE_F16: launch_down_t<EM_TYPE_F16>(n, w, a, cols, ur, out, g); break;
    default: launch_down_t<EM_TYPE_BF16>(n, w, a, cols, ur, out, g); break;
    }
}

/* The argument checks of the MoE ops (EM_EINVAL naming what is wrong): the experts held
 * (whole, or a share), the inputs, and what the op writes (y, or a share's slots). */
static int moe_check(const em_gpu_experts *x, bool share, const float *d_x, int64_t ldx, int n, int max_rows,
                     const int32_t *d_ids, int k, const void *d_scratch, const void *d_out, int64_t ldy, em_err *err) {
    EMC_CHECK(x && x->gate && x->up && x->down && x->gate->data && x->up->data && x->down->data,
              "GPU MoE: missing expert matrices");
    EMC_CHECK(em_gpu_mat_type_ok(x->gate->type) && em_gpu_mat_type_ok(x->up->type) && em_gpu_mat_type_ok(x->down->type),
              "GPU MoE: experts of device types %s/%s/%s (gate/up/down); the GPU products run f32, f16, bf16, q8_0, "
              "q4_K, q6_K, mxfp4", em_type_name(x->gate->type), em_type_name(x->up->type), em_type_name(x->down->type));
    EMC_CHECK(x->n_expert > 0 && x->n_expert <= MOE_MAX_EXPERTS && x->ffn > 0 && x->ffn % 32 == 0,
              "GPU MoE: %d experts of ffn %d (at most %d experts, ffn a multiple of 32)", x->n_expert, x->ffn,
              MOE_MAX_EXPERTS);
    EMC_CHECK(x->act == EM_GPU_ACT_SWIGLU || (x->act == EM_GPU_ACT_SITU && x->situ_beta > 0.0f && isfinite(x->situ_beta) &&
                                               !isnan(x->situ_lin_beta)),
              "GPU MoE: activation %d (SwiGLU %d, SiTU %d) with SiTU beta %g (> 0), lin_beta %g", x->act,
              EM_GPU_ACT_SWIGLU, EM_GPU_ACT_SITU, (double)x->situ_beta, (double)x->situ_lin_beta);
    const int64_t cols = x->gate->cols;
    EMC_CHECK(x->gate->rows == (int64_t)x->n_expert * x->ffn && x->up->rows == x->gate->rows && x->up->cols == cols &&
                  x->down->rows == (int64_t)x->n_expert * cols && x->down->cols == x->ffn,
              "GPU MoE: expert shapes gate %lldx%lld, up %lldx%lld, down %lldx%lld for %d experts of %d",
              (long long)x->gate->rows, (long long)cols, (long long)x->up->rows, (long long)x->up->cols,
              (long long)x->down->rows, (long long)x->down->cols, x->n_expert, x->ffn);
    EMC_CHECK(cols % 32 == 0, "GPU MoE: %lld columns, not a multiple of 32", (long long)cols);
    EMC_CHECK(n >= 1 && n <= max_rows && k >= 1 && k <= MOE_MAX_K && (share || k <= x->n_expert) &&
                  (max_rows <= EM_GPU_MAX_ROWS || n * k <= EM_GPU_WIDE_MAX_PAIRS),
              "GPU MoE: %d rows (1..%d), top-%d (1..%d; at most %d rows x top-k in a wide call)", n, max_rows, k,
              MOE_MAX_K, EM_GPU_WIDE_MAX_PAIRS);
    EMC_CHECK(d_x && ldx >= cols && d_ids && d_out && (share || ldy >= cols) && d_scratch && ((uintptr_t)d_scratch & 255) == 0,
              "GPU MoE: missing buffer, ldx/ldy below %lld, or scratch not 256-byte aligned", (long long)cols);
    const bool fx = em_gpu_act_type(x->gate->type) == EM_TYPE_F32 || em_gpu_act_type(x->up->type) == EM_TYPE_F32;
    EMC_CHECK(!fx || (((uintptr_t)d_x & 15) == 0 && ldx % 4 == 0),
              "GPU MoE: %s/%s gate/up take F32 rows: x must be 16-byte aligned with ldx a multiple of 4 (ldx %lld)",
              em_type_name(x->gate->type), em_type_name(x->up->type), (long long)ldx);
    return 0;
}

/* Whether wide calls of Q8_0 experts run tensor-core slots, and their kernels' blocks an SM:
 * 3 (80 registers), or EMBER_GPU_MOE_TC8=2 (no spills); EMBER_GPU_MOE_TC8=0: the 4-row slots,
 * for comparison (the bits are the same every way). */
static int moe_tc_blocks(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("EMBER_GPU_MOE_TC8");
        on = v && strcmp(v, "0") == 0 ? 0 : v && strcmp(v, "2") == 0 ? 2 : 3;
    }
    return on;
}

/* The routed experts x holds (ids e0 .. e0 + x->n_expert - 1 of the routes) over the n rows:
 * union, gate/up, the hidden rows and down, whose outputs go to the slots (row j, slot t) at
 * (j k + t) cols of out. Then, with wts, the weighted sum into y (down and the sum in one launch
 * for one row of Q8_0 down weights); without, that is all (a share). wide: the union of a wide
 * call (k_moe_union_wide; slots of up to MOE_WIDE_SLOT rows and the kernels of that many, or
 * for Q8_0 experts MOE_WIDE_SLOT_TC rows and the tensor-core kernels). */
static int moe_run(em_gpu *g, const em_gpu_experts *x, int e0, const float *d_x, int64_t ldx, int n, bool wide,
                   const em_gpu_act *x_act, const int32_t *d_ids, const float *d_wts, int k, void *d_scratch, float *out,
                   float *d_y, int64_t ldy, em_err *err) {
    const int64_t cols = x->gate->cols, nk = (int64_t)n * k;
    EMC_CHECK(!x_act || (x_act->type == EM_TYPE_Q8_0 && x_act->n == n && x_act->cols == cols && x_act->qs && x_act->d),
              "GPU MoE: prepared inputs must be Q8_0 activations of the %d rows of %lld columns", n, (long long)cols);
    int rc = emc_use(g, err);
    if (rc) return rc;
    const moe_layout l = layout(x->n_expert, k, x->ffn, cols, n, wide);
    uint8_t *sc = (uint8_t *)d_scratch;
    const moe_uref ur = { (const int *)(sc + l.meta), l.um, d_ids, k, x->n_expert, e0 };
    float *gt = (float *)(sc + l.gt), *upb = (float *)(sc + l.up);
    const int tg = x->gate->type, tu = x->up->type;
    const bool tc = wide && tg == EM_TYPE_Q8_0 && tu == EM_TYPE_Q8_0 && x->down->type == EM_TYPE_Q8_0 && moe_tc_blocks() > 0;
    const int nb = wide ? MOE_WIDE_SLOT : n; /* the row bucket of the products: rows a slot holds at most */
    if (wide) {
        emc_launch(g, k_moe_union_wide, 1, 1024, 0, d_ids, (int)nk, k, x->n_expert, tc ? MOE_WIDE_SLOT_TC : MOE_WIDE_SLOT,
                   (int *)(sc + l.meta), l.um);
        if ((rc = emc_launched(err, "k_moe_union_wide"))) return rc;
    } else if (n > 1) { /* one row's union comes from its ids inside the products (moe_slot) */
        emc_launch(g, k_moe_union, 1, 1024, 0, d_ids, e0, n, k, x->n_expert, (int *)(sc + l.meta), l.um);
        if ((rc = emc_launched(err, "k_moe_union"))) return rc;
    }
    /* the input rows as gate and up take them: Q8_0 (the caller's, or quantized once here) or
     * the F32 rows */
    moe_act xq = { (const int8_t *)(sc + l.xq), (const float *)(sc + l.xd), NULL, 0 };
    const moe_act xf = { NULL, NULL, d_x, ldx };
    if (em_gpu_act_type(tg) == EM_TYPE_Q8_0 || em_gpu_act_type(tu) == EM_TYPE_Q8_0) {
        if (x_act) {
            xq.qs = x_act->qs, xq.d = x_act->d;
        } else {
            const int64_t xw = (int64_t)n * (cols / 32);
            emc_launch(g, k_quant_q8_0, emc_blocks(xw * 32, 256), 256, 0, d_x, ldx, cols, n, (int8_t *)(sc + l.xq),
                       (float *)(sc + l.xd));
            if ((rc = emc_launched(err, "k_quant_q8_0 (expert inputs)"))) return rc;
        }
    }
    const moe_act ag = em_gpu_act_type(tg) == EM_TYPE_Q8_0 ? xq : xf, au = em_gpu_act_type(tu) == EM_TYPE_Q8_0 ? xq : xf;
    const moe_mat wg = mat_of(x->gate), wu = mat_of(x->up), wd = mat_of(x->down);
    if (tc) {
        const dim3 grid(emc_blocks(x->ffn, TC8_OUTS), (unsigned)ur.um, 2);
        emc_launch(g, moe_tc_blocks() == 2 ? k_moe_gate_up_tc8<2> : k_moe_gate_up_tc8<3>, grid, TC8_THREADS, 0, wg, ag, gt,
                   wu, au, upb, x->ffn, ur);
    } else if (tg == tu) {
        launch_gate_up(tg, nb, wg, ag, gt, wu, au, upb, 2, x->ffn, ur, g);
    } else {
        launch_gate_up(tg, nb, wg, ag, gt, wg, ag, gt, 1, x->ffn, ur, g);
        if ((rc = emc_launched(err, "k_moe_gate_up (gate)"))) return rc;
        launch_gate_up(tu, nb, wu, au, upb, wu, au, upb, 1, x->ffn, ur, g);
    }
    if ((rc = emc_launched(err, "k_moe_gate_up"))) return rc;
    /* the hidden rows (slot-indexed, ffn apart) as down takes them: act(gate, up), and their
     * Q8_0 activations for integer down weights, in one launch */
    const mm_glu glu = mm_glu_of(x->act, x->situ_beta, x->situ_lin_beta);
    const bool q8_down = em_gpu_act_type(x->down->type) == EM_TYPE_Q8_0;
    int8_t *hq = q8_down ? (int8_t *)(sc + l.hq) : NULL;
    float *hd = q8_down ? (float *)(sc + l.hd) : NULL;
    emc_launch(g, k_moe_act, emc_blocks(nk * x->ffn, 256), 256, 0, (const float *)gt, (const float *)upb, nk * x->ffn, glu,
               gt, hq, hd);
    if ((rc = emc_launched(err, "k_moe_act"))) return rc;
    const moe_act ah = q8_down ? moe_act{ hq, hd, NULL, 0 } : moe_act{ NULL, NULL, gt, x->ffn };
    if (d_wts && n == 1 && !wide && x->down->type == EM_TYPE_Q8_0) { /* down and the weighted sum in one launch */
        emc_launch(g, k_moe_down_sum, emc_blocks(cols, MM_WARPS), MM_WARPS * 32, 0, wd, ah, cols, ur, d_wts, d_y);
        return emc_launched(err, "k_moe_down_sum");
    }
    if (tc)
        emc_launch(g, moe_tc_blocks() == 2 ? k_moe_down_tc8<2> : k_moe_down_tc8<3>, dim3(emc_blocks(cols, TC8_OUTS), (unsigned)ur.um),
                   TC8_THREADS, 0, wd, ah, cols, ur, out);
    else launch_down(x->down->type, nb, wd, ah, cols, ur, out, g);
    if ((rc = emc_launched(err, "k_moe_down")) || !d_wts) return rc;
    em_gpu_moe_parts whole = {};
    whole.out[0] = out, whole.first[1] = x->n_expert, whole.n = 1;
    emc_launch(g, k_moe_sum, dim3(emc_blocks(cols, 256), (unsigned)n), 256, 0, d_ids, d_wts, k, whole, cols, d_y, ldy);
    return emc_launched(err, "k_moe_sum");
}

/* The whole stack's routed experts with their weighted sum: em_gpu_moe_prepared, or wide. */
static int moe_whole(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n, bool wide,
                     const em_gpu_act *x_act, const int32_t *d_ids, const float *d_wts, int k, void *d_scratch, float *d_y,
                     int64_t ldy, em_err *err) {
    int rc = moe_check(x, false, d_x, ldx, n, wide ? EM_GPU_WIDE_MAX_ROWS : EM_GPU_MAX_ROWS, d_ids, k, d_scratch, d_y, ldy,
                       err);
    if (!rc) EMC_CHECK(d_wts, "GPU MoE: missing routing weights");
    if (rc) return rc;
    uint8_t *sc = (uint8_t *)d_scratch;
    float *out = (float *)(sc + layout(x->n_expert, k, x->ffn, x->gate->cols, n, wide).out);
    return moe_run(g, x, 0, d_x, ldx, n, wide, x_act, d_ids, d_wts, k, d_scratch, out, d_y, ldy, err);
}

extern "C" int em_gpu_moe_prepared(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n,
                                   const em_gpu_act *x_act, const int32_t *d_ids, const float *d_wts, int k,
                                   void *d_scratch, float *d_y, int64_t ldy, em_err *err) {
    return moe_whole(g, x, d_x, ldx, n, false, x_act, d_ids, d_wts, k, d_scratch, d_y, ldy, err);
}

extern "C" int em_gpu_moe_wide(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n,
                               const int32_t *d_ids, const float *d_wts, int k, void *d_scratch, float *d_y, int64_t ldy,
                               em_err *err) {
    return moe_whole(g, x, d_x, ldx, n, true, NULL, d_ids, d_wts, k, d_scratch, d_y, ldy, err);
}

extern "C" int em_gpu_moe(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n,
                          const int32_t *d_ids, const float *d_wts, int k, void *d_scratch, float *d_y, int64_t ldy,
                          em_err *err) {
    return em_gpu_moe_prepared(g, x, d_x, ldx, n, NULL, d_ids, d_wts, k, d_scratch, d_y, ldy, err);
}

extern "C" int em_gpu_moe_share(em_gpu *g, const em_gpu_experts *share, int first_expert, const float *d_x,
                                int64_t ldx, int n, const em_gpu_act *x_act, const int32_t *d_ids, int k,
                                void *d_scratch, float *d_slots, em_err *err) {
    int rc = moe_check(share, true, d_x, ldx, n, EM_GPU_MAX_ROWS, d_ids, k, d_scratch, d_slots, 0, err);
    if (!rc) EMC_CHECK(first_expert >= 0, "GPU MoE share: first expert %d", first_expert);
    return rc ? rc : moe_run(g, share, first_expert, d_x, ldx, n, false, x_act, d_ids, NULL, k, d_scratch, d_slots, NULL, 0,
                             err);
}

extern "C" int em_gpu_moe_combine(em_gpu *g, const em_gpu_moe_parts *parts, const int32_t *d_ids, const float *d_wts,
                                  int n, int k, int64_t cols, float *d_y, int64_t ldy, em_err *err) {
    EMC_CHECK(parts && parts->n >= 1 && parts->n <= EM_GPU_MAX_SHARES && parts->first[0] >= 0,
              "GPU MoE combine: %d shares (1..%d)", parts ? parts->n : 0, EM_GPU_MAX_SHARES);
    for (int r = 0; r < parts->n; r++)
        EMC_CHECK(parts->out[r] && parts->first[r + 1] > parts->first[r],
                  "GPU MoE combine: share %d has no slots, or experts %d..%d (none)", r, parts->first[r],
                  parts->first[r + 1] - 1);
    EMC_CHECK(n >= 1 && n <= EM_GPU_MAX_ROWS && k >= 1 && k <= MOE_MAX_K && cols >= 1 && d_ids && d_wts && d_y &&
                  ldy >= cols,
              "GPU MoE combine: %d rows (1..%d), top-%d (1..%d), %lld columns, ldy %lld, or a missing buffer", n,
              EM_GPU_MAX_ROWS, k, MOE_MAX_K, (long long)cols, (long long)ldy);
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_moe_sum, dim3(emc_blocks(cols, 256), (unsigned)n), 256, 0, d_ids, d_wts, k, *parts, cols, d_y, ldy);
    return emc_launched(err, "k_moe_sum (combine)");
}
