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
 * tc_fold also serves the F32 products of wide passes (matmul.cu, k_mm_f32_wide), whose warp
 * body's lane chains meet in the same butterfly.
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
                    v[4 * u + 0] = __fadd_rn(v[4 * u + 0], __fmul_rn(__fmul_rn(w0[k][u], fa[k]), (float)d[0]));
                    v[4 * u + 1] = __fadd_rn(v[4 * u + 1], __fmul_rn(__fmul_rn(w1[k][u], fa[k]), (float)d[1]));
                    v[4 * u + 2] = __fadd_rn(v[4 * u + 2], __fmul_rn(__fmul_rn(w0[k][u], fb[k]), (float)d[2]));
                    v[4 * u + 3] = __fadd_rn(v[4 * u + 3], __fmul_rn(__fmul_rn(w1[k][u], fb[k]), (float)d[3]));
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

#endif
