/* backend/cuda/mla.cu: MLA's latent cache and absorbed attention on the device (gpu.h, "MLA"),
 * model/mla.c's twin for what happens between the absorbed queries and the contexts (the
 * W_UK / W_UV products are em_gpu_matmul_heads'). Three kernels per call:
 * - scores: a block takes a tile of 32 cache positions and all heads of one query row; the
 *   tile and the row's queries are staged in shared memory (coalesced, one read of the tile
 *   for every head); a 16-lane group owns 8 positions x 8 heads, lane l the fma chain of
 *   elements l, l + 16, ... of each (em_dot_rows' lanes), and the 16 chains meet in
 *   em_dot_rows' halving tree (16 -> 8 -> 4 -> 2 -> 1), done by a transposing shuffle;
 * - softmax: a block per (row, head): max, exp by em_expf_poly's polynomial, the sum in
 *   double over a fixed tree (256 sequential partial sums, then halves 128 -> 1: the CPU's
 *   sum is sequential, so the normalizer can differ by an ulp in rare cases), p = e * inv;
 * - context: a thread owns one column of two heads for 1..4 query rows and runs each column's
 *   fma chain over the positions in ascending order (em_weighted_rows' chain; never split),
 *   the cache columns and the probabilities streamed through shared memory (cp.async, a ring
 *   of CX_ST stages), so the parallelism is columns x heads x rows. It is the slow part: each
 *   chain is as long as the context and the block is latency-bound (docs/cuda.md, run 7).
 * Every score, sum and chain is a fixed sequence of IEEE operations that depends only on its
 * query, its position and the cache, never on n or on the tiling: width invariance by
 * construction. Positions are read on the device; launch shapes depend only on n, the dims
 * and the capacity (graph capture). */
#include "backend/cuda/cuda_impl.cuh"

#include <math.h>

#define MLA_THREADS 256
#define MLA_MAX_C 1024 /* kv_lora + rope floats of one cache row */

/* Block j: cache row pos + j = [c * scale * w | k_pe]; the RMSNorm as k_rmsnorm (double sums,
 * fixed tree, the scale rounded once). */
__global__ void k_mla_append(em_gpu_mla_dims d, float *cache, const int32_t *pos, const float *lat, int64_t ldl,
                             const float *w, float eps) {
    emc_kernel_begin();
    __shared__ double part[MLA_THREADS];
    const int64_t row = (int64_t)pos[0] + blockIdx.x, C = d.kv_lora + d.rope;
    if (row < 0 || row >= d.capacity) return;
    const float *x = lat + blockIdx.x * ldl;
    float *y = cache + row * C;
    double s = 0.0;
    for (int i = threadIdx.x; i < d.kv_lora; i += MLA_THREADS) s += (double)x[i] * (double)x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = MLA_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    const float scale = (float)(1.0 / sqrt(part[0] / (double)d.kv_lora + (double)eps));
    for (int i = threadIdx.x; i < d.kv_lora; i += MLA_THREADS) y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
    for (int i = threadIdx.x; i < d.rope; i += MLA_THREADS) y[d.kv_lora + i] = x[d.kv_lora + i];
}

/* em_expf_poly, the same operations. */
__device__ __forceinline__ float mla_expf_poly(float x) {
    if (!(x >= -103.0f)) return x != x ? x : 0.0f;
    if (x > 88.7228394f) return __int_as_float(0x7f800000);
    const float k = rintf(x * 1.44269504088896341f);
    const float r = fmaf(-k, 1.42860682030941723e-06f, fmaf(-k, 0.693145751953125f, x));
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return scalbnf(p, (int)k);
}

/* The length row t attends over (its position + 1), or 0 for a position outside the cache. */
__device__ __forceinline__ int64_t mla_len(const em_gpu_mla_dims &d, const int32_t *pos, int t) {
    const int64_t p = (int64_t)pos[0] + t;
    return p < 0 || p >= d.capacity ? 0 : p + 1;
}

/* ---- asynchronous copies to shared memory (sm_80+) ------------------------------------ */

__device__ __forceinline__ void cp16(float *s, const float *g) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g));
}
__device__ __forceinline__ void cp4(float *s, const float *g) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Four floats at s: g[0..m) copied (one 16-byte copy when vec and all four are there), the rest
 * zero. s is 16-byte aligned; g is when vec. */
__device__ __forceinline__ void cp_quad(float *s, const float *g, int m, bool vec) {
    if (vec && m >= 4) {
        cp16(s, g);
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (k < m) cp4(s + k, g + k);
        else s[k] = 0.0f;
    }
}

/* ---- scores ----------------------------------------------------------------------------- */

#define SC_TU 32                 /* cache positions per tile */
#define SC_HP 32                 /* heads per pass */
#define SC_KC 144                /* floats of a cache row (and a query) per stage; a multiple of 16 */
#define SC_S SC_KC               /* shared row stride: 16 mod 32, so a warp's two 16-lane groups
                                  * reading rows r and r + 1 hit disjoint banks */
#define SC_STAGE ((SC_TU + SC_HP) * SC_S)
#define SC_SMEM (2 * SC_STAGE * 4)

/* Stage floats [k0, k0 + SC_KC) of the tile's 32 cache rows (rows past len: zeros) and of the
 * pass's 32 queries (heads past n_head: zeros); floats past C up to the next multiple of 16 are
 * zeros, so those lane steps are em_dot_rows' fmaf(0, 0, acc). */
__device__ __forceinline__ void sc_stage(float *st, const em_gpu_mla_dims &d, const float *cache, const float *q,
                                         int64_t u0, int64_t len, int hc, int k0, bool vec_c, bool vec_q) {
    const int C = d.kv_lora + d.rope, Cp = (C + 15) & ~15;
    const int e = Cp - k0 < SC_KC ? Cp - k0 : SC_KC, have = C - k0 < e ? C - k0 : e;
    for (int idx = threadIdx.x; idx < (SC_TU + SC_HP) * (SC_KC / 4); idx += MLA_THREADS) {
        const int row = idx / (SC_KC / 4), i = (idx % (SC_KC / 4)) * 4;
        if (i >= e) continue;
        float *s = st + row * SC_S + i;
        if (row < SC_TU) {
            const int64_t u = u0 + row;
            cp_quad(s, cache + u * C + k0 + i, u < len ? have - i : 0, vec_c);
        } else {
            const int h = hc + row - SC_TU;
            cp_quad(s, q + (int64_t)h * C + k0 + i, h < d.n_head ? have - i : 0, vec_q);
        }
    }
}

/* One halving step of the 16-lane tree over `half` pairs of scores: lane l keeps the upper half
 * when bit w is set, the lower one otherwise, and adds its partner's (l ^ w) value of the same
 * score: acc[l] + acc[l + w] of em_dot_rows, for every score at once. */
template <int HALF>
__device__ __forceinline__ void sc_halve(float (&v)[64], int w, bool up) {
#pragma unroll
    for (int i = 0; i < HALF; i++) {
        const float send = up ? v[i] : v[i + HALF], keep = up ? v[i + HALF] : v[i];
        v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, w));
    }
}

/* Grid (slots, n): block (x, t) takes tiles x, x + slots, ... of row t. Scores of row t, head
 * h, position u < len at sc + (t * n_head + h) * ldsc + u. */
__global__ void __launch_bounds__(MLA_THREADS, 1)
    k_mla_scores(em_gpu_mla_dims d, const float *cache, const int32_t *pos, const float *qa, int64_t ldq, float *sc,
                 int64_t ldsc, bool vec_c, bool vec_q) {
    emc_kernel_begin();
    extern __shared__ __align__(16) float smem[];
    const int t = blockIdx.y;
    const int64_t len = mla_len(d, pos, t);
    if (len == 0) return; /* the context kernel writes the NaN row */
    const int C = d.kv_lora + d.rope, Cp = (C + 15) & ~15, nk = (Cp + SC_KC - 1) / SC_KC;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, l = lane & 15;
    const int pb = (warp & 3) * 8;                 /* the warp's 8 positions of the tile */
    const int hb = (warp >> 2) * 16 + (lane >> 4); /* its group's heads: hb + 2j, j < 8 */
    const float scale = (float)(1.0 / sqrt((double)(d.nope + d.rope)));
    const float *q = qa + (int64_t)t * ldq;
    const int64_t tiles = (len + SC_TU - 1) / SC_TU;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t u0 = tile * SC_TU;
        for (int hc = 0; hc < d.n_head; hc += SC_HP) {
            float v[64]; /* v[8 hj + pj]: lane l's chain of head hb + 2 hj, position u0 + pb + pj */
#pragma unroll
            for (int i = 0; i < 64; i++) v[i] = 0.0f;
            sc_stage(smem, d, cache, q, u0, len, hc, 0, vec_c, vec_q);
            cp_commit();
            for (int kc = 0; kc < nk; kc++) {
                if (kc + 1 < nk)
                    sc_stage(smem + ((kc + 1) & 1) * SC_STAGE, d, cache, q, u0, len, hc, (kc + 1) * SC_KC, vec_c, vec_q);
                cp_commit();
                cp_wait<1>();
                __syncthreads();
                const float *xs = smem + (kc & 1) * SC_STAGE, *qs = xs + SC_TU * SC_S;
                const int kn = Cp - kc * SC_KC < SC_KC ? Cp - kc * SC_KC : SC_KC;
                for (int k = 0; k < kn; k += 16) {
                    float xv[8], qv[8];
#pragma unroll
                    for (int j = 0; j < 8; j++) xv[j] = xs[(pb + j) * SC_S + k + l];
#pragma unroll
                    for (int j = 0; j < 8; j++) qv[j] = qs[(hb + 2 * j) * SC_S + k + l];
#pragma unroll
                    for (int hj = 0; hj < 8; hj++)
#pragma unroll
                        for (int pj = 0; pj < 8; pj++) v[8 * hj + pj] = fmaf(xv[pj], qv[hj], v[8 * hj + pj]);
                }
                __syncthreads(); /* the stage is free for the next load */
            }
            /* em_dot_rows' halves 16 -> 1 over the 16 lanes; lane l ends with scores 4l .. 4l + 3 */
            sc_halve<32>(v, 8, (l & 8) != 0);
            sc_halve<16>(v, 4, (l & 4) != 0);
            sc_halve<8>(v, 2, (l & 2) != 0);
            sc_halve<4>(v, 1, (l & 1) != 0);
            const int h = hc + hb + 2 * (l >> 1);
            const int64_t u = u0 + pb + (l & 1) * 4;
            if (h < d.n_head) {
                float *y = sc + ((int64_t)t * d.n_head + h) * ldsc + u;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (u + i < len) y[i] = __fmul_rn(v[i], scale);
            }
        }
    }
}

/* ---- softmax ---------------------------------------------------------------------------- */

#define SM_B 8 /* scores per thread and batch */

/* Block (t, h): the scores of (t, h) in place become probabilities. The max in any order
 * (it is exact); thread i sums e(u) for u = i, i + 256, ... in double, then the 256 sums meet
 * in halves 128 -> 1 (128 .. 32 through shared memory, 16 .. 1 by shuffles: the same pairs). */
__global__ void __launch_bounds__(MLA_THREADS) k_mla_softmax(em_gpu_mla_dims d, const int32_t *pos, float *sc, int64_t ldsc) {
    emc_kernel_begin();
    __shared__ double dred[MLA_THREADS];
    __shared__ float fred[MLA_THREADS / 32];
    __shared__ double total;
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t len = mla_len(d, pos, t);
    if (len == 0) return;
    float *s = sc + ((int64_t)t * d.n_head + h) * ldsc;
    float mx = -__int_as_float(0x7f800000);
    for (int64_t u = threadIdx.x; u < len; u += MLA_THREADS) mx = s[u] > mx ? s[u] : mx; /* no stores: pipelined */
    for (int o = 16; o > 0; o >>= 1) {
        const float b = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = b > mx ? b : mx;
    }
    if (lane == 0) fred[warp] = mx;
    __syncthreads();
    mx = fred[0];
    for (int i = 1; i < MLA_THREADS / 32; i++) mx = fred[i] > mx ? fred[i] : mx;
    /* SM_B values per thread loaded before any is stored back (the loads do not wait on the
     * stores), added in u order */
    double sum = 0.0;
    for (int64_t u0 = threadIdx.x; u0 < len; u0 += SM_B * MLA_THREADS) {
        float e[SM_B];
#pragma unroll
        for (int b = 0; b < SM_B; b++) e[b] = u0 + b * MLA_THREADS < len ? s[u0 + b * MLA_THREADS] : 0.0f;
#pragma unroll
        for (int b = 0; b < SM_B; b++) {
            if (u0 + b * MLA_THREADS >= len) break;
            e[b] = mla_expf_poly(e[b] - mx);
            s[u0 + b * MLA_THREADS] = e[b];
            sum += e[b];
        }
    }
    dred[threadIdx.x] = sum;
    __syncthreads();
    for (int w = MLA_THREADS / 2; w >= 32; w >>= 1) {
        if ((int)threadIdx.x < w) dred[threadIdx.x] += dred[threadIdx.x + w];
        __syncthreads();
    }
    if (warp == 0) {
        double v = dred[lane];
        for (int w = 16; w > 0; w >>= 1) v += __shfl_down_sync(0xffffffffu, v, w);
        if (lane == 0) total = v;
    }
    __syncthreads();
    const float inv = (float)(1.0 / total);
    for (int64_t u0 = threadIdx.x; u0 < len; u0 += SM_B * MLA_THREADS) {
        float e[SM_B];
#pragma unroll
        for (int b = 0; b < SM_B; b++) e[b] = u0 + b * MLA_THREADS < len ? s[u0 + b * MLA_THREADS] : 0.0f;
#pragma unroll
        for (int b = 0; b < SM_B; b++)
            if (u0 + b * MLA_THREADS < len) s[u0 + b * MLA_THREADS] = e[b] * inv;
    }
}

/* ---- context ---------------------------------------------------------------------------- */

/* The block shape (tuning knobs, overridable at compile time: docs/cuda.md run 7 measured
 * 16x8/128/3, 16x8/128/6, 16x32/64/4, 32x16/64/4 and 32x32/64/4; this one is 4% slower than
 * 16x8 at one row and 36% faster at 16). A thread owns one column of a head pair; a warp holds
 * 32 / CX_COLS head pairs of the same columns. */
#ifndef CX_COLS
#define CX_COLS 32             /* columns per block: 16 or 32 */
#endif
#ifndef CX_HEADS
#define CX_HEADS 16            /* heads per block (even) */
#endif
#ifndef CX_UC
#define CX_UC 64               /* positions per stage (a multiple of 4) */
#endif
#ifndef CX_ST
#define CX_ST 4                /* stages (CX_ST - 1 in flight) */
#endif
#define CX_THREADS (CX_COLS * CX_HEADS / 2)
#define CX_PS (CX_UC + 4)      /* shared stride of a probability row (head pairs 2 apart: 8 banks) */
#define CX_CSTAGE (CX_UC * CX_COLS)
static_assert(CX_THREADS % 32 == 0 && CX_THREADS <= 1024 && (CX_COLS == 16 || CX_COLS == 32), "context block shape");
template <int RT> struct cx_smem {
    static constexpr int PSTAGE = RT * CX_HEADS * CX_PS;
    static constexpr int BYTES = CX_ST * (CX_CSTAGE + PSTAGE) * 4;
    static_assert(BYTES <= 227 * 1024, "context stages exceed shared memory");
};

/* Grid (column blocks, head blocks, row blocks of RT). ctx[t][h][i] = fma chain over u < len_t
 * ascending of p(t, h, u) * cache[u][i], from 0 (em_weighted_rows). */
template <int RT>
__global__ void __launch_bounds__(CX_THREADS)
    k_mla_context(em_gpu_mla_dims d, const float *cache, const int32_t *pos, int n, const float *sc, int64_t ldsc,
                  float *ctx, int64_t ldc, bool vec_c, bool vec_p) {
    emc_kernel_begin();
    extern __shared__ __align__(16) float smem[];
    float *cs = smem, *ps = smem + CX_ST * CX_CSTAGE;
    constexpr int PSTAGE = cx_smem<RT>::PSTAGE;
    const int C = d.kv_lora + d.rope;
    const int col0 = blockIdx.x * CX_COLS, h0 = blockIdx.y * CX_HEADS, t0 = blockIdx.z * RT;
    const int cl = threadIdx.x % CX_COLS, hl = 2 * (threadIdx.x / CX_COLS);
    int64_t len[RT], lo = INT64_MAX, hi = 0;
#pragma unroll
    for (int r = 0; r < RT; r++) {
        len[r] = t0 + r < n ? mla_len(d, pos, t0 + r) : 0;
        if (len[r] > 0 && len[r] < lo) lo = len[r];
        if (len[r] > hi) hi = len[r];
    }
    float acc[RT][2];
#pragma unroll
    for (int r = 0; r < RT; r++) acc[r][0] = acc[r][1] = 0.0f;
    const int64_t nch = (hi + CX_UC - 1) / CX_UC;
    /* stage s of chunk k: cache columns col0.. of positions u0.. (< hi), probabilities of the
     * block's rows and heads (u < that row's length; the rest is never read) */
    auto fill = [&](int s, int64_t k) {
        const int64_t u0 = k * CX_UC;
        float *cst = cs + s * CX_CSTAGE, *pst = ps + s * PSTAGE;
        for (int idx = threadIdx.x; idx < CX_UC * (CX_COLS / 4); idx += CX_THREADS) {
            const int row = idx / (CX_COLS / 4), c = col0 + (idx % (CX_COLS / 4)) * 4;
            const int64_t u = u0 + row;
            if (u < hi) cp_quad(cst + row * CX_COLS + (c - col0), cache + u * C + c, C - c, vec_c);
        }
        for (int idx = threadIdx.x; idx < RT * CX_HEADS * (CX_UC / 4); idx += CX_THREADS) {
            const int rh = idx / (CX_UC / 4), i = (idx % (CX_UC / 4)) * 4, r = rh / CX_HEADS, h = h0 + rh % CX_HEADS;
            int64_t lr = 0;
#pragma unroll
            for (int q = 0; q < RT; q++)
                if (q == r) lr = len[q];
            if (h < d.n_head && u0 + i < lr)
                cp_quad(pst + rh * CX_PS + i, sc + ((int64_t)(t0 + r) * d.n_head + h) * ldsc + u0 + i, 4, vec_p);
        }
    };
#pragma unroll
    for (int s = 0; s < CX_ST - 1; s++) {
        if (s < nch) fill(s, s);
        cp_commit();
    }
    for (int64_t k = 0; k < nch; k++) {
        cp_wait<CX_ST - 2>();
        __syncthreads();
        if (k + CX_ST - 1 < nch) fill((int)((k + CX_ST - 1) % CX_ST), k + CX_ST - 1);
        cp_commit();
        const int s = (int)(k % CX_ST);
        const float *cst = cs + s * CX_CSTAGE, *pst = ps + s * PSTAGE;
        const int64_t u0 = k * CX_UC;
        const int nu = (int)(hi - u0 < CX_UC ? hi - u0 : CX_UC);          /* positions some row needs */
        const int64_t f = lo - u0 < (int64_t)nu ? lo - u0 : (int64_t)nu; /* positions every row needs */
        int uu = 0;
        for (; uu + 4 <= f; uu += 4) {
            float cv[4];
#pragma unroll
            for (int k4 = 0; k4 < 4; k4++) cv[k4] = cst[(uu + k4) * CX_COLS + cl];
            float4 pv[RT][2];
#pragma unroll
            for (int r = 0; r < RT; r++)
#pragma unroll
                for (int e = 0; e < 2; e++) pv[r][e] = *(const float4 *)(pst + (r * CX_HEADS + hl + e) * CX_PS + uu);
#pragma unroll
            for (int r = 0; r < RT; r++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float a = acc[r][e];
                    a = fmaf(pv[r][e].x, cv[0], a);
                    a = fmaf(pv[r][e].y, cv[1], a);
                    a = fmaf(pv[r][e].z, cv[2], a);
                    a = fmaf(pv[r][e].w, cv[3], a);
                    acc[r][e] = a;
                }
        }
        for (; uu < nu; uu++) { /* the last positions, which not every row has */
            const float cv = cst[uu * CX_COLS + cl];
#pragma unroll
            for (int r = 0; r < RT; r++)
                if (u0 + uu < len[r])
#pragma unroll
                    for (int e = 0; e < 2; e++) acc[r][e] = fmaf(pst[(r * CX_HEADS + hl + e) * CX_PS + uu], cv, acc[r][e]);
        }
    }
    cp_wait<0>();
    const int col = col0 + cl;
    if (col >= d.kv_lora) return;
#pragma unroll
    for (int r = 0; r < RT; r++) {
        if (t0 + r >= n) break;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int h = h0 + hl + e;
            if (h < d.n_head)
                ctx[(int64_t)(t0 + r) * ldc + (int64_t)h * d.kv_lora + col] =
                    len[r] > 0 ? acc[r][e] : __int_as_float(0x7fc00000); /* a bad position shows as NaN */
        }
    }
}

/* ---- entry points ----------------------------------------------------------------------- */

static int mla_check(const em_gpu_mla_dims *d, em_err *err) {
    EMC_CHECK(d && d->n_head >= 1 && d->n_head <= 65535 && d->kv_lora >= 1 && d->rope >= 0 && d->nope >= 0 &&
                  d->kv_lora + d->rope <= MLA_MAX_C && d->nope + d->rope > 0 && d->capacity >= 1 &&
                  d->capacity <= ((int64_t)1 << 31),
              "GPU mla: dims (heads %d, kv_lora %d, rope %d, nope %d, capacity %lld) unusable (row at most %d floats)",
              d ? d->n_head : 0, d ? d->kv_lora : 0, d ? d->rope : 0, d ? d->nope : 0, d ? (long long)d->capacity : 0LL,
              MLA_MAX_C);
    return EM_OK;
}

/* Floats per (row, head) score row in the scratch: the capacity rounded up to 4 (16-byte rows). */
static int64_t mla_ldsc(const em_gpu_mla_dims *d) { return (d->capacity + 3) & ~(int64_t)3; }

extern "C" uint64_t em_gpu_mla_scratch_floats(const em_gpu_mla_dims *d, int n) {
    if (mla_check(d, NULL) || n < 1 || n > EM_GPU_MAX_ROWS) return 0;
    return (uint64_t)n * (uint64_t)d->n_head * (uint64_t)mla_ldsc(d);
}

extern "C" int em_gpu_mla_append(em_gpu *g, const em_gpu_mla_dims *d, float *d_cache, const int32_t *d_pos, int n,
                                 const float *d_lat, int64_t ldl, const float *d_norm_w, float eps, em_err *err) {
    int rc = mla_check(d, err);
    if (rc) return rc;
    EMC_CHECK(d_cache && d_pos && (n == 0 || d_lat) && n >= 0 && n <= EM_GPU_MAX_ROWS && ldl >= d->kv_lora + d->rope,
              "GPU mla append: %d rows (ldl %lld) or a missing buffer", n, (long long)ldl);
    if ((rc = emc_use(g, err)) || n == 0) return rc;
    emc_launch(g, k_mla_append, n, MLA_THREADS, 0, *d, d_cache, d_pos, d_lat, ldl, d_norm_w, eps);
    return emc_launched(err, "k_mla_append");
}

/* Shared memory past 48 KB needs an opt-in per kernel and device (once: the value never
 * changes; done holds a bit per device index below 64, others ask every time). The first call
 * may come inside a graph capture, where the attribute call is not a stream operation but may
 * count as an unsafe one: the thread's capture mode is relaxed around it. */
template <typename K> static int mla_smem_optin(const em_gpu *g, K kernel, int bytes, unsigned long long *done,
                                                em_err *err) {
    const unsigned long long bit = g->index >= 0 && g->index < 64 ? 1ull << g->index : 0;
    if (bit && (*done & bit)) return 0;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    EMC_TRY(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    EMC_TRY(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    EMC_TRY(e, "cudaFuncSetAttribute (MLA shared memory)");
    *done |= bit;
    return 0;
}

template <int RT>
static int mla_launch_context(em_gpu *g, const em_gpu_mla_dims *d, const float *d_cache, const int32_t *d_pos, int n,
                              const float *sc, int64_t ldsc, float *d_ctx, int64_t ldc, bool vec_c, bool vec_p,
                              em_err *err) {
    static unsigned long long optin;
    const int bytes = cx_smem<RT>::BYTES;
    int rc = mla_smem_optin(g, k_mla_context<RT>, bytes, &optin, err);
    if (rc) return rc;
    const dim3 grid(emc_blocks(d->kv_lora, CX_COLS), emc_blocks(d->n_head, CX_HEADS), emc_blocks(n, RT));
    emc_launch(g, k_mla_context<RT>, grid, CX_THREADS, bytes, *d, d_cache, d_pos, n, sc, ldsc, d_ctx, ldc, vec_c, vec_p);
    return emc_launched(err, "k_mla_context");
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" int em_gpu_mla_attend(em_gpu *g, const em_gpu_mla_dims *d, const float *d_cache, const int32_t *d_pos, int n,
                                 const float *d_qa, int64_t ldq, float *d_scratch, float *d_ctx, int64_t ldc, em_err *err) {
    int rc = mla_check(d, err);
    if (rc) return rc;
    const int64_t C = d->kv_lora + d->rope;
    EMC_CHECK(d_cache && d_pos && d_scratch && (n == 0 || (d_qa && d_ctx)) && n >= 0 && n <= EM_GPU_MAX_ROWS &&
                  ldq >= d->n_head * C && ldc >= (int64_t)d->n_head * d->kv_lora,
              "GPU mla attend: %d rows (ldq %lld, ldc %lld) or a missing buffer", n, (long long)ldq, (long long)ldc);
    if ((rc = emc_use(g, err)) || n == 0) return rc;
    static unsigned long long sc_optin;
    if ((rc = mla_smem_optin(g, k_mla_scores, SC_SMEM, &sc_optin, err))) return rc;
    const int64_t ldsc = mla_ldsc(d), tiles = (d->capacity + SC_TU - 1) / SC_TU;
    const int sms = g->info.sm_count > 0 ? g->info.sm_count : 1;
    const bool vec_c = C % 4 == 0 && aligned16(d_cache), vec_q = C % 4 == 0 && ldq % 4 == 0 && aligned16(d_qa);
    /* one tile per block where the cache fits one wave, else blocks loop over tiles */
    const dim3 sgrid((unsigned)(tiles < sms ? tiles : sms), (unsigned)n);
    emc_launch(g, k_mla_scores, sgrid, MLA_THREADS, SC_SMEM, *d, d_cache, d_pos, d_qa, ldq, d_scratch, ldsc, vec_c, vec_q);
    if ((rc = emc_launched(err, "k_mla_scores"))) return rc;
    emc_launch(g, k_mla_softmax, dim3((unsigned)n, (unsigned)d->n_head), MLA_THREADS, 0, *d, d_pos, d_scratch, ldsc);
    if ((rc = emc_launched(err, "k_mla_softmax"))) return rc;
    const bool vec_p = aligned16(d_scratch);
    if (n == 1) return mla_launch_context<1>(g, d, d_cache, d_pos, n, d_scratch, ldsc, d_ctx, ldc, vec_c, vec_p, err);
    if (n == 2) return mla_launch_context<2>(g, d, d_cache, d_pos, n, d_scratch, ldsc, d_ctx, ldc, vec_c, vec_p, err);
    return mla_launch_context<4>(g, d, d_cache, d_pos, n, d_scratch, ldsc, d_ctx, ldc, vec_c, vec_p, err);
}
