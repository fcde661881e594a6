/* backend/cuda/mm_tc.cuh: Q8_0 weights x Q8_0 activations on the tensor cores, for products of
 * many rows (a wide prefill pass), with exactly the bits of mm_q8_0_warp (mm_kernels.cuh).
 *
 * Why the bits can be the same: mm_q8_0_warp gives lane l the blocks l, l + 32, l + 64, ... of
 * an output; per block it takes the exact integer dot of the 32 quants, then
 * c_l = c_l + (d_w * d_a) * float(dot), each operation rounded; then the fixed butterfly
 * (xor 16, 8, 4, 2, 1) sums the 32 chains. An int8 MMA (m16n8k32) gives each block's integer
 * dot exactly, for 16 rows x 8 outputs at once. So a warp here walks the blocks class by class
 * (class l: blocks l, l + 32, ... in ascending order), makes each class's chain with the same
 * rounded operations, and folds the 32 chains into the butterfly's sum tree: leaf i of that
 * tree, left to right, is class brev5(i) (the first level pairs l with l ^ 16, the next l with
 * l ^ 8, ...), so taking the classes in bit-reversed order lets a stack of five partial sums
 * a pair build the tree as a binary counter does (tc_fold). Float addition is commutative, so
 * which operand comes first in each add does not matter; the tree's shape does, and it is the
 * butterfly's.
 *
 * Fragments (PTX ISA, mma.m16n8k32 with .s8): thread t of the warp, g = t / 4, q = t % 4, holds
 * A rows g and g + 8, B column (output) g, and the results of rows g, g + 8 and outputs 2q,
 * 2q + 1. A register's four k positions may be any four, as long as A and B use the same: here
 * thread t reads bytes 8q .. 8q + 7 of a block (one 8-byte load) for its A rows and its B column,
 * the first four as the PTX layout's k = 4q .. 4q + 3, the last four as k = 16 + 4q .. 16 + 4q + 3.
 * Every k meets its own k, so the dot is the block's.
 *
 * Internal to backend/cuda/. */
#ifndef EM_MM_TC_CUH
#define EM_MM_TC_CUH

#include "backend/cuda/mm_kernels.cuh"

#define TC_NT 2   /* 8-output tiles a warp */
#define TC_U 2    /* blocks of a class whose loads a warp issues together */
#define TC_WM 4   /* warps of a block along the rows (16 rows each) */
#define TC_WN 2   /* warps of a block along the outputs */
#define TC_ROWS (16 * TC_WM)        /* rows of a block */
#define TC_OUTS (8 * TC_NT * TC_WN) /* outputs of a block */

__device__ __forceinline__ uint2 ld_nc8(const void *p) {
    uint2 v;
    asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p)); /* not volatile: free to schedule */
    return v;
}

/* d = the exact int32 dots of A (16 x 32) and B (32 x 8), from zero. */
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(0));
}

/* Leaf i (0..31, left to right) of P sums into the stack s; after leaf 31, v is the root. */
template <int P>
__device__ __forceinline__ void tc_fold(int i, float (&v)[P], float (&s)[5][P]) {
    bool carry = true; /* the levels below lv were full: v climbs on */
#pragma unroll
    for (int lv = 0; lv < 5; lv++) {
        const bool full = carry && ((i >> lv) & 1);
#pragma unroll
        for (int p = 0; p < P; p++) {
            if (full) v[p] = __fadd_rn(s[lv][p], v[p]);
            else if (carry) s[lv][p] = v[p];
        }
        carry = full;
    }
}

/* The exact float of an integer |d| < 2^22 (an int8 block dot is at most 32 x 128 x 128):
 * 1.5 * 2^23 + d is a float of unit spacing, so its bits are those of 1.5 * 2^23 plus d, and
 * the subtraction is exact. Two full-rate operations where an I2F is a quarter-rate one. */
__device__ __forceinline__ float tc_i2f(int d) { return __fsub_rn(__int_as_float(0x4B400000 + d), 12582912.0f); }

/* One warp: activation rows ja (for A rows g) and jb (g + 8) of (xq, xd: em_gpu_act_prepare's
 * layout; thread t = 4 g + q passes its own) against outputs o0 .. o0 + 8 TC_NT - 1 (those below
 * rows) of the Q8_0 matrix (wq, wd), into output rows ya and yb of y (ldy; -1: not stored).
 * Outputs past rows read the last row and are not stored. */
__device__ __forceinline__ void mm_q8_0_tc_warp(const int8_t *wq, const __half *wd, int64_t rows, int64_t cols,
                                                int64_t o0, const int8_t *xq, const float *xd, int ja, int jb, float *y,
                                                int64_t ldy, int ya, int yb) {
    constexpr int P = 4 * TC_NT; /* (row, output) pairs a thread holds */
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t bpr = cols / 32;
    const int8_t *xa = xq + (int64_t)ja * cols + 8 * q, *xb = xq + (int64_t)jb * cols + 8 * q;
    const float *da = xd + (int64_t)ja * bpr, *db = xd + (int64_t)jb * bpr;
    const int8_t *wb[TC_NT];
    const __half *ws0[TC_NT], *ws1[TC_NT];
#pragma unroll
    for (int u = 0; u < TC_NT; u++) {
        const int64_t ob = min(o0 + 8 * u + g, rows - 1), os = min(o0 + 8 * u + 2 * q, rows - 1);
        wb[u] = wq + ob * cols + 8 * q;
        ws0[u] = wd + os * bpr;
        ws1[u] = wd + min(os + 1, rows - 1) * bpr;
    }
    float s[5][P], v[P];
    for (int i = 0; i < 32; i++) {
        const int l = (int)(__brev((unsigned)i) >> 27);
#pragma unroll
        for (int p = 0; p < P; p++) v[p] = 0.0f;
        for (int64_t b0 = l; b0 < bpr; b0 += 32 * TC_U) { /* TC_U blocks of the class loaded together */
            uint2 pa[TC_U], pb[TC_U], wq2[TC_U][TC_NT];
            float fa[TC_U], fb[TC_U], w0[TC_U][TC_NT], w1[TC_U][TC_NT];
#pragma unroll
            for (int k = 0; k < TC_U; k++) {
                const int64_t b = b0 + 32 * k;
                if (b >= bpr) break;
                pa[k] = *(const uint2 *)(xa + b * 32), pb[k] = *(const uint2 *)(xb + b * 32);
                fa[k] = da[b], fb[k] = db[b];
#pragma unroll
                for (int u = 0; u < TC_NT; u++) {
                    wq2[k][u] = ld_nc8(wb[u] + b * 32);
                    w0[k][u] = __half2float(ws0[u][b]), w1[k][u] = __half2float(ws1[u][b]);
                }
            }
#pragma unroll
            for (int k = 0; k < TC_U; k++) { /* in ascending block order: the chain's */
                if (b0 + 32 * k >= bpr) break;
                const uint32_t a[4] = { pa[k].x, pb[k].x, pa[k].y, pb[k].y };
#pragma unroll
                for (int u = 0; u < TC_NT; u++) {
                    int d[4];
                    mma_s8(d, a, wq2[k][u]);
                    v[4 * u + 0] = __fadd_rn(v[4 * u + 0], __fmul_rn(__fmul_rn(w0[k][u], fa[k]), tc_i2f(d[0])));
                    v[4 * u + 1] = __fadd_rn(v[4 * u + 1], __fmul_rn(__fmul_rn(w1[k][u], fa[k]), tc_i2f(d[1])));
                    v[4 * u + 2] = __fadd_rn(v[4 * u + 2], __fmul_rn(__fmul_rn(w0[k][u], fb[k]), tc_i2f(d[2])));
                    v[4 * u + 3] = __fadd_rn(v[4 * u + 3], __fmul_rn(__fmul_rn(w1[k][u], fb[k]), tc_i2f(d[3])));
                }
            }
        }
        tc_fold<P>(i, v, s);
    }
#pragma unroll
    for (int u = 0; u < TC_NT; u++)
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const int yr = p < 2 ? ya : yb;
            const int64_t o = o0 + 8 * u + 2 * q + (p & 1);
            if (yr >= 0 && o < rows) y[(int64_t)yr * ldy + o] = v[4 * u + p];
        }
}

/* ---- expert slots of up to 8 rows (wide MoE calls) ----------------------------------------
 * Here the weights are the MMA's A (16 outputs) and a union slot's rows its B (n = 8), so the
 * about 8 rows an expert gets from each 256 rows of a pass fill the tile, and a slot reads its
 * expert's weights once. A block of 8 warps takes 32 outputs: warp w's tile is w / 4 (16
 * outputs) and its leaves of the butterfly's tree are 8 (w % 4) .. 8 (w % 4) + 7 (classes
 * brev5 of them). The block stages 16 blocks of each weight row and activation row at a time
 * in shared memory in their natural order, so global reads are coalesced (a class-ordered
 * walk from global memory reads 32-byte pieces 1 KB apart), in two buffers: the copies of the
 * next chunk fly while the block computes this one. Each warp carries its 8 classes' chains
 * across the chunks (a chunk holds one block of 16 classes, in the chain's ascending block
 * order), folds them into its subtree of 8 leaves (tc_fold, levels 0-2), and the top two
 * levels join the four subtrees: (S0 + S1) + (S2 + S3). */
#define TC8_ROWS 8
#define TC8_OUTS 32
#define TC8_THREADS 256
#define TC8_CHUNK 16                    /* blocks of a row staged at once */
#define TC8_PITCH (TC8_CHUNK * 32 + 32) /* bytes of a staged row: 136 words, 8 banks on, so a
                                           half-warp's 8-byte fragment reads meet no conflict */

struct tc8_stage {
    int8_t w[TC8_OUTS][TC8_PITCH];
    int8_t x[TC8_ROWS][TC8_PITCH];
    float wd[TC8_OUTS][TC8_CHUNK + 1];
    float xd[TC8_ROWS][TC8_CHUNK + 1];
};
union tc8_smem { /* 48,960 bytes: under the 48 KiB of static shared memory */
    tc8_stage buf[2];
    float part[TC8_OUTS / 16][4][32][4]; /* after the chunks: each warp's subtree values */
};

/* Where a thread stages from: weight row tid / 8 (clamped to the matrix) with 16-byte pieces
 * tid % 8 + 8 m, activation row tid / 32 with piece tid % 32 (the slot's rows past cnt repeat
 * the last, never stored), and (tid < 128) activation scale row tid / 16, block tid % 16. */
struct tc8_src {
    const int8_t *w, *x;
    const __half *wd;
    const float *xd;
};

/* Chunk b0 (nbc blocks): the quants by asynchronous copies into st. */
__device__ __forceinline__ void tc8_copy_w(tc8_stage &st, const tc8_src &src, int64_t b0, int nbc) {
    const int r = threadIdx.x >> 3;
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const int c = (threadIdx.x & 7) + 8 * m;
        if (c < 2 * nbc) cp16(&st.w[r][16 * c], src.w + 32 * b0 + 16 * c);
    }
}
__device__ __forceinline__ void tc8_copy_x(tc8_stage &st, const tc8_src &src, int64_t b0, int nbc) {
    const int j = threadIdx.x >> 5, c = threadIdx.x & 31;
    if (c < 2 * nbc) cp16(&st.x[j][16 * c], src.x + 32 * b0 + 16 * c);
}
/* The chunk's scales, loaded into registers (in flight while the block computes) and stored
 * as floats later: weights r = tid / 8, blocks tid % 8 and tid % 8 + 8; activations (tid < 128). */
struct tc8_scales {
    float w[2], x;
};
__device__ __forceinline__ tc8_scales tc8_load_scales(const tc8_src &src, int64_t b0, int nbc, bool acts) {
    tc8_scales v = { { 0.0f, 0.0f }, 0.0f };
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int c = (threadIdx.x & 7) + 8 * m;
        if (c < nbc) v.w[m] = __half2float(__ldg(src.wd + b0 + c));
    }
    if (acts && threadIdx.x < TC8_ROWS * TC8_CHUNK && (int)(threadIdx.x & 15) < nbc) v.x = src.xd[b0 + (threadIdx.x & 15)];
    return v;
}
__device__ __forceinline__ void tc8_store_scales(tc8_stage &st, const tc8_scales &v) {
    st.wd[threadIdx.x >> 3][threadIdx.x & 7] = v.w[0];
    st.wd[threadIdx.x >> 3][(threadIdx.x & 7) + 8] = v.w[1];
    if (threadIdx.x < TC8_ROWS * TC8_CHUNK) st.xd[threadIdx.x >> 4][threadIdx.x & 15] = v.x;
}

/* The whole block (TC8_THREADS threads, every one calls it): outputs o0 .. o0 + 31 (those
 * below rows) of the Q8_0 matrix (wq, wd) against the slot's cnt (1..8) activation rows xr[j]
 * of (xq, xd: em_gpu_act_prepare's layout), into rows yr[j] of y (ldy). wait: the first
 * chunk's weights are asked for before emc_wait_prior(), the activations after it (they come
 * from the kernel before; the weights do not). */
__device__ __forceinline__ void mm_q8_0_tc8_block(const int8_t *wq, const __half *wd, int64_t rows, int64_t cols,
                                                  int64_t o0, const int8_t *xq, const float *xd, const int *xr, int cnt,
                                                  float *y, int64_t ldy, const int *yr, bool wait, tc8_smem &sm) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int t = warp >> 2, grp = warp & 3, ow = 16 * t + g; /* this thread's A rows: ow, ow + 8 */
    const int64_t bpr = cols / 32;
    const int nch = (int)((bpr + TC8_CHUNK - 1) / TC8_CHUNK);
    const int64_t wr = min(o0 + (threadIdx.x >> 3), rows - 1);
    tc8_src src = { wq + wr * cols, NULL, wd + wr * bpr, NULL };
    const int nb0 = (int)min((int64_t)TC8_CHUNK, bpr);
    tc8_copy_w(sm.buf[0], src, 0, nb0);
    tc8_scales sc = tc8_load_scales(src, 0, nb0, false);
    if (wait) emc_wait_prior();
    const int xj = xr[min((int)(threadIdx.x >> 5), cnt - 1)], xs = xr[min((int)(threadIdx.x >> 4), cnt - 1)];
    src.x = xq + (int64_t)xj * cols, src.xd = xd + (int64_t)xs * bpr;
    tc8_copy_x(sm.buf[0], src, 0, nb0);
    cp_commit();
    if (threadIdx.x < TC8_ROWS * TC8_CHUNK && (int)(threadIdx.x & 15) < nb0) sc.x = src.xd[threadIdx.x & 15];
    tc8_store_scales(sm.buf[0], sc);
    float c[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int p = 0; p < 4; p++) c[j][p] = 0.0f;
    for (int ch = 0; ch < nch; ch++) {
        const int64_t b0 = (int64_t)ch * TC8_CHUNK;
        const int nbc = (int)min((int64_t)TC8_CHUNK, bpr - b0);
        const bool next = ch + 1 < nch;
        if (next) { /* the next chunk's copies and scale loads fly while this one is computed */
            const int nbn = (int)min((int64_t)TC8_CHUNK, bpr - b0 - TC8_CHUNK);
            tc8_copy_w(sm.buf[(ch + 1) & 1], src, b0 + TC8_CHUNK, nbn);
            tc8_copy_x(sm.buf[(ch + 1) & 1], src, b0 + TC8_CHUNK, nbn);
            cp_commit();
            sc = tc8_load_scales(src, b0 + TC8_CHUNK, nbn, true);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const tc8_stage &st = sm.buf[ch & 1];
        const int cls0 = (int)(b0 & 31); /* the chunk's first class: 0 or 16 */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = (int)(__brev((unsigned)(8 * grp + j)) >> 27) - cls0; /* leaf 8 grp + j's class, here */
            if (i < 0 || i >= nbc) continue;
            const uint2 wa = *(const uint2 *)&st.w[ow][32 * i + 8 * q], wb = *(const uint2 *)&st.w[ow + 8][32 * i + 8 * q];
            const uint2 xb = *(const uint2 *)&st.x[g][32 * i + 8 * q];
            const uint32_t a[4] = { wa.x, wb.x, wa.y, wb.y };
            int d[4];
            mma_s8(d, a, xb); /* d: (output ow, row 2q), (ow, 2q + 1), (ow + 8, 2q), (ow + 8, 2q + 1) */
            const float w0 = st.wd[ow][i], w1 = st.wd[ow + 8][i], x0 = st.xd[2 * q][i], x1 = st.xd[2 * q + 1][i];
            c[j][0] = __fadd_rn(c[j][0], __fmul_rn(__fmul_rn(w0, x0), tc_i2f(d[0])));
            c[j][1] = __fadd_rn(c[j][1], __fmul_rn(__fmul_rn(w0, x1), tc_i2f(d[1])));
            c[j][2] = __fadd_rn(c[j][2], __fmul_rn(__fmul_rn(w1, x0), tc_i2f(d[2])));
            c[j][3] = __fadd_rn(c[j][3], __fmul_rn(__fmul_rn(w1, x1), tc_i2f(d[3])));
        }
        if (next) tc8_store_scales(sm.buf[(ch + 1) & 1], sc); /* that buffer was last read before the barrier above */
        __syncthreads(); /* the next copies (or the subtree values) overwrite this buffer */
    }
    float s[5][4], v[4];
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int p = 0; p < 4; p++) v[p] = c[j][p];
        tc_fold<4>(j, v, s); /* after leaf 7, v is the subtree's root */
    }
#pragma unroll
    for (int p = 0; p < 4; p++) sm.part[t][grp][lane][p] = v[p];
    __syncthreads();
    if (grp != 0) return;
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const float r = __fadd_rn(__fadd_rn(sm.part[t][0][lane][p], sm.part[t][1][lane][p]),
                                  __fadd_rn(sm.part[t][2][lane][p], sm.part[t][3][lane][p]));
        const int j = 2 * q + (p & 1);
        const int64_t o = o0 + ow + 8 * (p >> 1);
        if (j < cnt && o < rows) y[(int64_t)yr[j] * ldy + o] = r;
    }
}

#endif
