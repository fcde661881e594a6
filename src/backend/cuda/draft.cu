/* backend/cuda/draft.cu: the drafter's own ops on the device (gpu.h, "the drafter"): grouped-
 * query attention of a block over [context cache ; block], a bias added to rows, and the slot
 * chain of a greedy propose (confidence and keep test, pick), which reads and writes one
 * em_gpu_draft_io in device memory so that a block needs no host round trip per slot.
 * draft/dspark.c and draft/schedule.c are the references:
 * - attention: a block per (row, query head); hd / 16 neighbouring lanes compute a position's
 *   score (each an fma chain over its 16-byte pieces of the key, then a fixed butterfly; one
 *   thread's dot in column order without 16-byte loads or when hd / 16 is not a power of
 *   two), the scores go to scratch, the block takes their max and the sum of exp in double,
 *   then each thread sums p V for a piece of the columns over every G-th position and the G
 *   groups are added in order. Close to the CPU's floats, not bit-identical (the
 *   drafter only steers proposals; acceptance is the target's); the same bits every launch.
 * - a slot's start: the block reads the previous pick's Markov row (and quantizes it for W2),
 *   then one warp sums the confidence in doubles (lanes over the terms, a fixed butterfly:
 *   the CPU's sum up to rounding) and one thread runs em_draft_sched_keep's arithmetic.
 * - pick: one block, em_argmax's rule on the corrected logits in target ids; the same block may
 *   go on with the next slot's start (a launch less per slot). The vanilla Markov head with a
 *   Q8_0 W2 runs its whole greedy chain in one launch (below: a cluster of blocks, each with
 *   a slice of the draft ids and their W2 rows in shared memory).
 * - the gated and rnn Markov heads: their input gathered and their output mixed in one block
 *   each, the CPU's float arithmetic (the product between them is em_gpu_matmul).
 * Launch shapes depend only on the dims and n (graph capture); the context length, the chain's
 * state and the previous pick are read on the device. */
#include "backend/cuda/mm_kernels.cuh"

#include <cooperative_groups.h>

#include <math.h>

namespace cg = cooperative_groups;

#define GQA_THREADS 256
#define GQA_WARPS (GQA_THREADS / 32)
#define GQA_MAX_HD 256

uint64_t em_gpu_gqa_scratch_floats(const em_gpu_gqa_dims *d, int n) {
    if (!d || n < 1 || d->capacity < 0) return 0;
    return (uint64_t)n * (uint64_t)d->n_head * (uint64_t)(d->capacity + EM_GPU_MAX_ROWS);
}

#define HNR_WARPS 4

/* One head vector by a warp: dst = RoPE(RMSNorm(src) * w) (w NULL: no weight; rows past 2 half
 * values as normed), em_rmsnorm's scale from a double sum in a fixed butterfly and k_rope's
 * rotation at position pos. t: hd floats of the warp's scratch; src may be dst (every value is
 * read before any is written). */
__device__ void norm_rope_unit(const float *src, float *dst, const float *w, float *t, int hd, float eps, int half,
                               int pos, const double *inv_freq, double attn_factor) {
    const int lane = threadIdx.x & 31;
    double s = 0.0;
    for (int c = lane; c < hd; c += 32) {
        const float x = src[c];
        t[c] = x;
        s += (double)x * (double)x;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float scale = (float)(1.0 / sqrt(s / (double)hd + (double)eps)); /* em_rmsnorm's */
    for (int c = lane; c < hd; c += 32) t[c] = w ? t[c] * scale * w[c] : t[c] * scale;
    __syncwarp();
    for (int i = lane; i < half; i += 32) { /* k_rope's rotation */
        const double a = (double)pos * inv_freq[i];
        const float cs = (float)(cos(a) * attn_factor), sn = (float)(sin(a) * attn_factor);
        const float p = t[i], r = t[i + half];
        dst[i] = p * cs - r * sn;
        dst[i + half] = r * cs + p * sn;
    }
    for (int c = 2 * half + lane; c < hd; c += 32) dst[c] = t[c];
    __syncwarp(); /* t is the warp's again */
}

/* Warp w of block b: head unit b * HNR_WARPS + w, units by row, then q's heads, then k's. */
__global__ void __launch_bounds__(HNR_WARPS * 32)
    k_head_norm_rope(float *q, int64_t ldq, int n_qh, const float *wq, float *k, int64_t ldk, int n_kh, const float *wk,
                     int rows, int hd, float eps, int half, const int32_t *pos, const double *inv_freq,
                     double attn_factor) {
    emc_kernel_begin();
    __shared__ float sv[HNR_WARPS][GQA_MAX_HD];
    const int warp = threadIdx.x >> 5, per_row = n_qh + n_kh;
    const int unit = blockIdx.x * HNR_WARPS + warp;
    if (unit >= rows * per_row) return; /* whole warps leave; only __syncwarp below */
    const int j = unit / per_row, hh = unit % per_row;
    const bool is_q = hh < n_qh;
    float *v = is_q ? q + j * ldq + (int64_t)hh * hd : k + j * ldk + (int64_t)(hh - n_qh) * hd;
    norm_rope_unit(v, v, is_q ? wq : wk, sv[warp], hd, eps, half, pos[j], inv_freq, attn_factor);
}

/* Position p's key (or value) row of kv head grp: the cache's rows, then the block's. */
__device__ __forceinline__ const float *gqa_row(const float *cache, const float *block, int64_t n_ctx, int64_t p,
                                                int64_t kw, int64_t off) {
    return p < n_ctx ? cache + p * kw + off : block + (p - n_ctx) * kw + off;
}

/* Block (i, h): row i, query head h. A group of lanes a position for the scores (below),
 * block reductions for the max and the sum (the sum in double), then p V by groups of
 * positions (below): every launch the same order, whatever the timing. */
__global__ void __launch_bounds__(GQA_THREADS)
    k_gqa(em_gpu_gqa_dims d, const float *q, const float *kc, const float *vc, const int64_t *n_ctx_p, const float *k,
          const float *v, int n, em_gpu_gqa_rope rope, float *scratch, float *out, bool vec) {
    emc_kernel_begin();
    __shared__ __align__(16) float qs[GQA_MAX_HD];
    __shared__ __align__(16) float ks[EM_GPU_MAX_ROWS][GQA_MAX_HD]; /* with rope: the block rows' keys, normed and rotated */
    __shared__ float tv[GQA_WARPS][GQA_MAX_HD];                      /* norm_rope_unit's scratch */
    __shared__ float part[GQA_THREADS * 4]; /* [groups][hd] of p V's partial sums */
    __shared__ float redf[GQA_WARPS];
    __shared__ double red[GQA_WARPS];
    const int i = blockIdx.x, h = blockIdx.y, hd = d.hd, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t kw = (int64_t)d.n_kv * hd, qw = (int64_t)d.n_head * hd;
    const int64_t off = (int64_t)(h / (d.n_head / d.n_kv)) * hd;
    int64_t n_ctx = *n_ctx_p;
    n_ctx = n_ctx < 0 ? 0 : n_ctx > d.capacity ? d.capacity : n_ctx;
    const int64_t total = n_ctx + (d.causal ? i + 1 : n);
    float *sc = scratch + ((int64_t)i * d.n_head + h) * (d.capacity + EM_GPU_MAX_ROWS);
    const float *qi = q + i * qw + (int64_t)h * hd;
    if (rope.pos) { /* unit 0 the query, unit 1 + j block row j's key: em_gpu_head_norm_rope's values */
        for (int u = warp; u <= total - n_ctx; u += GQA_WARPS)
            norm_rope_unit(u ? k + (u - 1) * kw + off : qi, u ? ks[u - 1] : qs, u ? rope.wk : rope.wq, tv[warp], hd,
                           rope.eps, rope.half, rope.pos[u ? u - 1 : i], rope.inv_freq, rope.attn_factor);
    } else {
        for (int c = threadIdx.x; c < hd; c += GQA_THREADS) qs[c] = qi[c];
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    if (vec && !((hd / 16) & (hd / 16 - 1))) {
        /* a position by LP = hd / 16 neighbouring lanes: lane q of its group takes the key's
         * 16-byte pieces q, q + LP, q + 2 LP, q + 3 LP (one fma chain over them in that order),
         * so a warp's load reads 32 / LP whole 16 LP-byte spans where a thread a position read 32
         * rows; the group's chains meet in a fixed butterfly */
        const int LP = hd / 16, q = lane % LP, per_warp = 32 / LP;
        for (int64_t p0 = (int64_t)warp * per_warp; p0 < total; p0 += (int64_t)GQA_WARPS * per_warp) { /* per warp */
            const int64_t p = p0 + lane / LP;
            const bool live = p < total;
            const float *kr = !live ? qs : p >= n_ctx && rope.pos ? ks[p - n_ctx] : gqa_row(kc, k, n_ctx, p, kw, off);
            float4 kv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) kv[u] = *(const float4 *)(kr + 4 * (u * LP + q));
            float s = 0.0f;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float *qc = qs + 4 * (u * LP + q);
                s = fmaf(qc[0], kv[u].x, s);
                s = fmaf(qc[1], kv[u].y, s);
                s = fmaf(qc[2], kv[u].z, s);
                s = fmaf(qc[3], kv[u].w, s);
            }
            for (int o = 1; o < LP; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            s *= scale;
            if (live) {
                if (q == 0) sc[p] = s;
                mx = fmaxf(mx, s);
            }
        }
    } else {
        for (int64_t p = threadIdx.x; p < total; p += GQA_THREADS) {
            const float *kr = p >= n_ctx && rope.pos ? ks[p - n_ctx] : gqa_row(kc, k, n_ctx, p, kw, off);
            float s = 0.0f;
#pragma unroll 8
            for (int c = 0; c < hd; c++) s = fmaf(qs[c], kr[c], s);
            s *= scale;
            sc[p] = s;
            mx = fmaxf(mx, s);
        }
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) redf[warp] = mx;
    __syncthreads();
    mx = redf[0];
    for (int w = 1; w < GQA_WARPS; w++) mx = fmaxf(mx, redf[w]);
    double sum = 0.0;
    for (int64_t p = threadIdx.x; p < total; p += GQA_THREADS) { /* each thread its own positions again */
        const float e = expf(sc[p] - mx);
        sc[p] = e;
        sum += (double)e;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) red[warp] = sum;
    __syncthreads(); /* sc's new values and red visible */
    sum = 0.0;
    for (int w = 0; w < GQA_WARPS; w++) sum += red[w];
    const float inv = (float)(1.0 / sum);
    /* p V: thread t takes column piece t % P (P pieces of W values: float4 with vec) of the
     * positions t / P, t / P + G, ... (G = threads / P groups) in ascending order, so a thread
     * has many independent loads in flight; then the groups' sums in group order */
    const int W = vec ? 4 : 1, P = hd / W, G = GQA_THREADS / P, piece = threadIdx.x % P, grp = threadIdx.x / P;
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    if (grp < G) {
#pragma unroll 8
        for (int64_t p = grp; p < total; p += G) {
            const float *vr = gqa_row(vc, v, n_ctx, p, kw, off) + piece * W;
            const float w = sc[p] * inv;
            if (vec) {
                const float4 x = *(const float4 *)vr;
                acc[0] = fmaf(w, x.x, acc[0]), acc[1] = fmaf(w, x.y, acc[1]);
                acc[2] = fmaf(w, x.z, acc[2]), acc[3] = fmaf(w, x.w, acc[3]);
            } else {
                acc[0] = fmaf(w, vr[0], acc[0]);
            }
        }
#pragma unroll
        for (int t = 0; t < 4; t++)
            if (t < W) part[grp * hd + piece * W + t] = acc[t];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < hd; c += GQA_THREADS) {
        float o = part[c];
        for (int w = 1; w < G; w++) o += part[w * hd + c];
        out[i * qw + (int64_t)h * hd + c] = o;
    }
}

extern "C" int em_gpu_gqa_attend(em_gpu *g, const em_gpu_gqa_dims *d, const float *d_q, const float *d_kc,
                                 const float *d_vc, const int64_t *d_n_ctx, const float *d_k, const float *d_v, int n,
                                 const em_gpu_gqa_rope *rope, float *d_scratch, float *d_out, em_err *err) {
    EMC_CHECK(d && d->n_head > 0 && d->n_kv > 0 && d->n_head % d->n_kv == 0 && d->hd > 0 && d->hd <= GQA_MAX_HD &&
                  d->capacity >= 0,
              "GPU attention: %d heads over %d kv heads of %d values (want n_head a multiple of n_kv, hd 1..%d)",
              d ? d->n_head : 0, d ? d->n_kv : 0, d ? d->hd : 0, GQA_MAX_HD);
    EMC_CHECK(n >= 1 && n <= EM_GPU_MAX_ROWS, "GPU attention: %d rows (1..%d)", n, EM_GPU_MAX_ROWS);
    EMC_CHECK(d_q && d_kc && d_vc && d_n_ctx && d_k && d_v && d_scratch && d_out, "GPU attention: a missing buffer");
    int rc = emc_use(g, err);
    if (rc) return rc;
    /* key and value rows in 16-byte loads when every row starts 16-byte aligned */
    const bool vec = d->hd % 16 == 0 && d->n_kv * d->hd % 4 == 0 &&
                     (((uintptr_t)d_kc | (uintptr_t)d_k | (uintptr_t)d_vc | (uintptr_t)d_v) & 15) == 0;
    EMC_CHECK(!rope || (rope->pos && rope->inv_freq && rope->half > 0 && 2 * rope->half <= d->hd),
              "GPU attention: RoPE over %d of %d values, or a missing table", rope ? 2 * rope->half : 0, d->hd);
    emc_launch(g, k_gqa, dim3((unsigned)n, (unsigned)d->n_head), GQA_THREADS, 0, *d, d_q, d_kc, d_vc, d_n_ctx, d_k, d_v,
               n, rope ? *rope : em_gpu_gqa_rope{}, d_scratch, d_out, vec);
    return emc_launched(err, "k_gqa");
}

/* ---- features rounded through a ring's type ------------------------------------------------------ */

/* Warp w of block b: 32-value block b * 8 + w over the rows' blocks (row by row). */
__global__ void k_round_rows(int type, const float *x, int64_t n, int64_t blocks, float *y) {
    emc_kernel_begin();
    const int64_t blk = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk >= blocks) return; /* whole warps leave */
    const int lane = threadIdx.x & 31;
    const int64_t per_row = (n + 31) / 32, j = blk / per_row, i = blk % per_row * 32 + lane;
    const bool in = i < n;
    const float v = in ? x[j * n + i] : 0.0f;
    float r = v;
    if (type == EM_TYPE_F16) {
        r = __half2float(__float2half_rn(v));
    } else if (type == EM_TYPE_BF16) { /* em_fp32_to_bf16 */
        const uint32_t u = __float_as_uint(v);
        r = __uint_as_float(((u + (0x7fffu + ((u >> 16) & 1u))) >> 16) << 16);
    } else if (type == EM_TYPE_Q8_0) {
        int8_t q[32];
        float d;
        quant_q8_0_block(v, lane, q, &d); /* lane writes q[lane]; lane 0 writes d */
        d = __shfl_sync(0xffffffffu, d, 0);
        r = (float)q[lane] * d;
    }
    if (in) y[j * n + i] = r;
}

extern "C" int em_gpu_round_rows(em_gpu *g, int type, const float *d_x, int64_t n, int rows, float *d_y, em_err *err) {
    EMC_CHECK(d_x && d_y && n > 0 && rows >= 0 &&
                  (type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16 || type == EM_TYPE_Q8_0),
              "GPU round rows: %d rows of %lld, type %d (F32, F16, BF16 or Q8_0)", rows, (long long)n, type);
    int rc = emc_use(g, err);
    if (rc || rows == 0) return rc;
    if (type == EM_TYPE_F32) return d_x == d_y ? EM_OK : em_gpu_copy(g, d_y, d_x, (uint64_t)rows * (uint64_t)n * 4, err);
    const int64_t blocks = (int64_t)rows * ((n + 31) / 32);
    emc_launch(g, k_round_rows, emc_blocks(blocks * 32, 256), 256, 0, type, d_x, n, blocks, d_y);
    return emc_launched(err, "k_round_rows");
}

/* ---- head norms and RoPE ------------------------------------------------------------------------ */

extern "C" int em_gpu_head_norm_rope(em_gpu *g, float *d_q, int64_t ldq, int n_qh, const float *d_wq, float *d_k,
                                     int64_t ldk, int n_kh, const float *d_wk, int rows, int hd, float eps, int dims,
                                     const int32_t *d_pos, const double *d_inv_freq, double attn_factor, em_err *err) {
    EMC_CHECK((d_q || n_qh == 0) && (d_k || n_kh == 0) && n_qh >= 0 && n_kh >= 0 && d_pos && d_inv_freq && rows >= 0 &&
                  hd > 0 && hd <= GQA_MAX_HD && dims > 0 && dims % 2 == 0 && dims <= hd && ldq >= (int64_t)n_qh * hd &&
                  ldk >= (int64_t)n_kh * hd,
              "GPU head norm + rope: %d rows, %d + %d heads of %d, %d dims, or a missing buffer", rows, n_qh, n_kh, hd, dims);
    int rc = emc_use(g, err);
    const int64_t units = (int64_t)rows * (n_qh + n_kh);
    if (rc || units == 0) return rc;
    emc_launch(g, k_head_norm_rope, (unsigned)((units + HNR_WARPS - 1) / HNR_WARPS), HNR_WARPS * 32, 0, d_q, ldq, n_qh, d_wq,
               d_k, ldk, n_kh, d_wk, rows, hd, eps, dims / 2, d_pos, d_inv_freq, attn_factor);
    return emc_launched(err, "k_head_norm_rope");
}

__global__ void k_add_bias(float *x, int64_t ldx, int64_t n, const float *b) {
    emc_kernel_begin();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[blockIdx.y * ldx + i] += b[i];
}

extern "C" int em_gpu_add_bias(em_gpu *g, float *d_x, int64_t ldx, int rows, int64_t n, const float *d_b, em_err *err) {
    EMC_CHECK(d_x && d_b && rows >= 0 && n >= 0 && ldx >= n, "GPU bias: %d rows of %lld (ldx %lld) or a missing buffer",
              rows, (long long)n, (long long)ldx);
    int rc = emc_use(g, err);
    if (rc || rows == 0 || n == 0) return rc;
    emc_launch(g, k_add_bias, dim3(emc_blocks(n, 256), (unsigned)rows), 256, 0, d_x, ldx, n, d_b);
    return emc_launched(err, "k_add_bias");
}

/* ---- the slot chain ------------------------------------------------------------------------- */

/* schedule.c's cost_of / usable / sigmoid, on the io's table. */
__device__ double chain_cost(const em_gpu_draft_io *io, int n) {
    return n >= 1 && n <= io->n_cost && n <= EM_GPU_DRAFT_MAX_BLOCK + 1 ? io->cost[n - 1] : 0.0;
}
__device__ bool chain_usable(double c) { return isfinite(c) && c > 0; }

/* em_draft_sched_keep on the io's walk. */
__device__ bool chain_keep(em_gpu_draft_io *io, float z) {
    if (io->stopped) return false;
    if (io->all) return ++io->width, true;
    io->survival *= isnan(z) ? 0.0 : 1.0 / (1.0 + exp(-(double)z));
    const double c = chain_cost(io, io->width + 2);
    if (!chain_usable(c)) {
        io->all = 1;
        return ++io->width, true;
    }
    const double gain = (io->expected + io->survival) / c;
    if (!(gain > io->best)) {
        io->stopped = 1;
        return false;
    }
    io->expected += io->survival;
    io->best = gain;
    return ++io->width, true;
}

/* Lane's share of slot k's confidence over the terms of h (w[i] h[i], i = lane, lane + 32, ...
 * below d): the first part of the chain slot_begin's confidence runs. */
__device__ double conf_h_part(const em_gpu_draft_slot &s, int k, int lane) {
    const float *h = s.d_h + (int64_t)(s.slot0 + k) * s.d, *w = s.d_conf_w;
    double z = 0.0;
#pragma unroll 4
    for (int i = lane; i < s.d; i += 32) z += (double)w[i] * h[i];
    return z;
}

/* The start of slot k by a whole block (blockDim a multiple of 32): e = W1[toks[k]] (and its
 * Q8_0 activations), then the confidence and keep test by warp 0 (zh: each lane's
 * conf_h_part when made beforehand, else NULL). The exit when the chain is over is uniform
 * over the block (io read after a barrier). */
__device__ void slot_begin(em_gpu_draft_io *io, int k, const em_gpu_draft_slot &s, const double *zh = nullptr) {
    __shared__ float es[EM_GPU_DRAFT_MAX_RANK];
    if (!io->alive || k >= io->n_max) return;
    const int lane = threadIdx.x & 31;
    if (s.w1_data) {
        const int32_t t = io->toks[k];
        const bool bad = t < 0 || t >= s.w1_rows;
        for (int i = threadIdx.x; i < s.rank; i += blockDim.x) {
            const float v = bad ? __int_as_float(0x7fc00000)
                                : emc_table_value(s.w1_type, s.w1_data, (const __half *)s.w1_scales, s.w1_rows, s.rank, t, i);
            es[i] = v;
            if (s.d_e) s.d_e[i] = v;
        }
        __syncthreads();
        if (s.d_e_qs)
            for (int b = (int)(threadIdx.x >> 5); b < s.rank / 32; b += (int)(blockDim.x >> 5))
                quant_q8_0_block(es[b * 32 + lane], lane, s.d_e_qs + b * 32, s.d_e_qd + b);
    }
    if (!s.d_conf_w || threadIdx.x >= 32) return;
    /* dspark.c's confidence() in doubles by warp 0: lane l sums terms l, l + 32, ... of
     * w . [h ; e] (h's first), the lanes meet in a fixed butterfly */
    const int n = s.d + (s.conf_markov && s.w1_data ? s.rank : 0);
    double z = zh ? zh[lane] : conf_h_part(s, k, lane);
    int i = lane;
    while (i < s.d) i += 32;
#pragma unroll 4
    for (; i < n; i += 32) z += (double)s.d_conf_w[i] * es[i - s.d];
    for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
    if (lane != 0) return;
    z += s.conf_b;
    if (s.d_conf_t) z /= s.d_conf_t[k];
    const float zf = (float)z;
    io->conf[k] = zf;
    if (io->may_stop && !chain_keep(io, zf)) io->alive = 0;
}

#define SLOT_THREADS 256

__global__ void __launch_bounds__(SLOT_THREADS) k_draft_slot_begin(em_gpu_draft_io *io, int k, em_gpu_draft_slot s) {
    emc_kernel_begin();
    slot_begin(io, k, s);
}

static bool slot_ok(const em_gpu_draft_slot *s) {
    if (!s->d_h || s->d < 1 || s->slot0 < 0 || s->slot0 > 1) return false;
    if (!s->w1_data) return !s->conf_markov || !s->d_conf_w;
    const bool floats = s->w1_type == EM_TYPE_F32 || s->w1_type == EM_TYPE_F16 || s->w1_type == EM_TYPE_BF16;
    return s->rank >= 1 && s->rank <= EM_GPU_DRAFT_MAX_RANK && s->d_e && s->w1_rows >= 1 && (floats || s->w1_scales) &&
           (!s->d_e_qs || (s->rank % 32 == 0 && s->d_e_qd));
}

extern "C" int em_gpu_draft_slot_begin(em_gpu *g, em_gpu_draft_io *d_io, int k, const em_gpu_draft_slot *slot,
                                       em_err *err) {
    EMC_CHECK(d_io && slot && slot_ok(slot) && k >= 0 && k < EM_GPU_DRAFT_MAX_BLOCK,
              "GPU draft slot: slot %d, rank %d (1..%d, a multiple of 32 with activations), d %d, or a missing buffer", k,
              slot ? slot->rank : 0, EM_GPU_DRAFT_MAX_RANK, slot ? slot->d : 0);
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_draft_slot_begin, 1, SLOT_THREADS, 0, d_io, k, *slot);
    return emc_launched(err, "k_draft_slot_begin");
}

/* ---- the gated and rnn Markov heads ------------------------------------------------------------ */

#define MARKOV_THREADS 256

__global__ void k_draft_markov_in(int kind, const float *h, int d, const float *e, const float *state, int rank,
                                  float *zin) {
    emc_kernel_begin();
    const int n = kind == EM_GPU_MARKOV_GATED ? d + rank : 2 * rank + d;
    for (int i = threadIdx.x; i < n; i += MARKOV_THREADS) {
        float v;
        if (kind == EM_GPU_MARKOV_GATED) v = i < d ? h[i] : e[i - d];
        else v = i < rank ? state[i] : i < 2 * rank ? e[i - rank] : h[i - 2 * rank];
        zin[i] = v;
    }
}

__global__ void k_draft_markov_out(int kind, const float *z, const float *b, const float *e, float *state, int rank,
                                   float *out) {
    emc_kernel_begin();
    for (int i = threadIdx.x; i < rank; i += MARKOV_THREADS) {
        if (kind == EM_GPU_MARKOV_GATED) {
            out[i] = emc_sigmoid(z[i] + b[i]) * e[i];
            continue;
        }
        const float a = z[i] + b[i], c = z[rank + i] + b[rank + i], o = z[2 * rank + i] + b[2 * rank + i];
        const float gt = emc_sigmoid(a);
        state[i] = gt * state[i] + (1.0f - gt) * tanhf(c);
        out[i] = tanhf(o);
    }
}

static bool markov_args(int kind, const float *e, const float *state, int rank) {
    return (kind == EM_GPU_MARKOV_GATED || (kind == EM_GPU_MARKOV_RNN && state)) && e && rank > 0;
}

extern "C" int em_gpu_draft_markov_in(em_gpu *g, int kind, const float *d_h, int d, const float *d_e,
                                      const float *d_state, int rank, float *d_zin, em_err *err) {
    EMC_CHECK(markov_args(kind, d_e, d_state, rank) && d_h && d_zin && d > 0,
              "GPU Markov input: kind %d, %d + %d values, or a missing buffer", kind, d, rank);
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_draft_markov_in, 1, MARKOV_THREADS, 0, kind, d_h, d, d_e, d_state, rank, d_zin);
    return emc_launched(err, "k_draft_markov_in");
}

extern "C" int em_gpu_draft_markov_out(em_gpu *g, int kind, const float *d_z, const float *d_b, const float *d_e,
                                       float *d_state, int rank, float *d_out, em_err *err) {
    EMC_CHECK(markov_args(kind, d_e, d_state, rank) && d_z && d_b && d_out,
              "GPU Markov output: kind %d, %d values, or a missing buffer", kind, rank);
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_draft_markov_out, 1, MARKOV_THREADS, 0, kind, d_z, d_b, d_e, d_state, rank, d_out);
    return emc_launched(err, "k_draft_markov_out");
}

/* Draft id i's corrected logit: c tanh(base[i] / c) when the softcap c > 0, then + bias[j] when
 * there is a bias (j: where the bias of id i sits). */
__device__ __forceinline__ float draft_value(const float *base, int i, float softcap, const float *bias, int j) {
    float x = base[i];
    if (softcap > 0) x = softcap * tanhf(x / softcap);
    return bias ? x + bias[j] : x;
}

/* Draft ids i0 + j, j < n, strided over the block's threads: their values into logits (at their
 * target ids: d2t[i0 + j], or id0 + i0 + j without a d2t) when asked, and this thread's best
 * pair so far, bv and bi, updated (NaN skipped; ids: target ids). bias is indexed by j. */
__device__ void scan_ids(const float *base, const float *bias, int i0, int n, float softcap, const int32_t *d2t,
                         int id0, float *logits, float &bv, int &bi) {
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float x = draft_value(base, i0 + j, softcap, bias, j);
        const int id = d2t ? d2t[i0 + j] : id0 + i0 + j;
        if (logits) logits[id] = x;
        if (!isnan(x) && am_better(x, id, bv, bi)) bv = x, bi = id;
    }
}

/* Slot k's pick bi recorded in io (by one thread): its token, or the chain's end (em_argmax
 * gives -1 only when every value is NaN; a row of -inf still has an argmax), and the end after
 * the pick when k + 1 reaches n_max. */
__device__ void pick_record(em_gpu_draft_io *io, int k, int bi) {
    if (bi < 0) {
        io->alive = 0;
        return;
    }
    io->toks[k + 1] = bi;
    io->n = k + 1;
    if (k + 1 >= io->n_max) io->alive = 0;
}

/* The end of a pick, by the whole block (n threads, a power of two): each thread's best pair
 * into sv, si, the block's best by the fixed tree, recorded by thread 0; then the block starts
 * slot k + 1 when asked. */
__device__ void pick_finish(em_gpu_draft_io *io, int k, float bv, int bi, float *sv, int *si, int n, int has_next,
                            const em_gpu_draft_slot &next) {
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    am_block_best(sv, si, n);
    if (threadIdx.x == 0) pick_record(io, k, si[0]);
    if (!has_next) return;
    __syncthreads();
    slot_begin(io, k + 1, next);
}

#define PICK_THREADS 1024

__global__ void __launch_bounds__(PICK_THREADS)
    k_draft_pick(em_gpu_draft_io *io, int k, const float *base, const float *bias, int dvocab, float softcap,
                 const int32_t *d2t, float *logits, int vocab, int has_next, em_gpu_draft_slot next) {
    emc_kernel_begin();
    __shared__ float sv[PICK_THREADS];
    __shared__ int si[PICK_THREADS];
    if (!io->alive || k >= io->n_max) return; /* uniform over the block */
    if (logits && d2t)
        for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) logits[i] = -INFINITY;
    __syncthreads();
    float bv = 0.0f;
    int bi = -1;
    scan_ids(base, bias, 0, dvocab, softcap, d2t, 0, logits, bv, bi);
    pick_finish(io, k, bv, bi, sv, si, PICK_THREADS, has_next, next);
}

extern "C" int em_gpu_draft_pick(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_base, const float *d_bias,
                                 int dvocab, float softcap, const int32_t *d_d2t, float *d_logits, int vocab,
                                 const em_gpu_draft_slot *next, em_err *err) {
    EMC_CHECK(d_io && d_base && dvocab > 0 && vocab >= dvocab && k >= 0 && k < EM_GPU_DRAFT_MAX_BLOCK &&
                  (d_d2t || vocab == dvocab),
              "GPU draft pick: slot %d, %d draft ids for %d target ids (d2t %s)", k, dvocab, vocab,
              d_d2t ? "given" : "missing");
    EMC_CHECK(!next || (slot_ok(next) && k + 1 < EM_GPU_DRAFT_MAX_BLOCK), "GPU draft pick: a bad next slot after %d", k);
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_draft_pick, 1, PICK_THREADS, 0, d_io, k, d_base, d_bias, dvocab, softcap, d_d2t, d_logits, vocab,
               next ? 1 : 0, next ? *next : em_gpu_draft_slot{});
    return emc_launched(err, "k_draft_pick");
}

/* ---- the vanilla Markov head's greedy chain in one launch ------------------------------------
 * A cluster of MC_CLUSTER blocks; block r takes the draft ids r * per .. (per: a multiple of 8,
 * so that its slices of W2's scales start 16-byte aligned) and, where they fit, copies their
 * W2 rows into its shared memory before the wait for the kernels before it (weights are
 * constant while passes run), then every slot's base logits of its ids (and their d2t) after
 * it. Every block keeps its own copy of the io and of e's activations and runs the same chain
 * on them: the confidences' h terms of every slot at once (a warp a slot: they do not depend
 * on the picks), slot 0's start, then per slot its ids' bias (em_gpu_matmul's values), their
 * corrected values and its best; the blocks' bests meet through distributed shared memory
 * after a cluster barrier, every block takes the best of them (the tie rule is a total order,
 * so the pick does not depend on how the ids were split) and runs the next slot's start
 * itself. The same arithmetic on the same inputs gives every block the same io, so the chain's
 * control flow stays uniform over the cluster; block 0 writes the io and e back. The bests
 * alternate between two slots per block: a block writes slot k's only after the barrier of
 * slot k - 1, which every block passes only after reading slot k - 2's. */

#define MC_CLUSTER 8
#define MC_THREADS 1024
#define MC_STAGE_MAX (196 * 1024) /* bytes a block stages in shared memory at most */

static int mc_ids_per_block(int dvocab) { return ((dvocab + MC_CLUSTER - 1) / MC_CLUSTER + 7) / 8 * 8; }

/* Staged bytes: W2's quants and scales of per rows, every slot's base logits, the ids' d2t. */
static size_t mc_stage_bytes(int per, int rank, int n_slots, bool d2t) {
    return (size_t)per * ((size_t)rank + (size_t)rank / 16 + 4 * (size_t)n_slots + (d2t ? 4 : 0));
}

/* W2 row r (rank / 32 <= 32 blocks, wq / wd in global or shared memory) against e: em_gpu_matmul's
 * value bit for bit. Its warp body (mm_q8_0_warp) gives lane l block l, one rounded add onto
 * 0, then the 32-lane butterfly; lanes past the row's blocks hold 0 and every add of theirs is
 * exact, so a group of L lanes (the power of two >= the blocks) with the butterfly's last
 * log2 L steps gives the same sum, and a warp takes 32 / L rows at once. */
__device__ __forceinline__ float mc_bias_row(const int8_t *wq, const __half *wd, int r, int bpr, int L,
                                             const int8_t *e_qs, const float *e_qd, bool live) {
    const int j = (threadIdx.x & 31) % L;
    float v = 0.0f;
    if (live && j < bpr) {
        const int64_t b = (int64_t)r * bpr + j;
        const q8_block w = { *(const int4 *)(wq + b * 32), *(const int4 *)(wq + b * 32 + 16), __half2float(wd[b]) };
        v = q8_0_block_add(0.0f, w, e_qs + j * 32, e_qd[j]);
    }
    for (int o = L / 2; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The best (value, id) pair of a warp's lanes into every lane (am_better's order). */
__device__ __forceinline__ void mc_warp_best(float &bv, int &bi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, o);
        const int i = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(v, i, bv, bi)) bv = v, bi = i;
    }
}

/* The best pair of the block's threads into every thread. */
__device__ float mc_block_best(float bv, int bi, float *wv, int *wi, int *out_i) {
    mc_warp_best(bv, bi);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) wv[warp] = bv, wi[warp] = bi;
    __syncthreads();
    bv = 0.0f, bi = -1;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        if (am_better(wv[w], wi[w], bv, bi)) bv = wv[w], bi = wi[w];
    __syncthreads(); /* wv, wi reused */
    *out_i = bi;
    return bv;
}

/* What a block of the chain reads: its W2 rows, slot 0's base logits of its ids and their d2t
 * (in shared memory when staged; base_ld: floats from one slot's logits to the next). */
typedef struct mc_slice {
    const int8_t *wq;
    const __half *wd;
    const float *base;
    int64_t base_ld;
    const int32_t *d2t;
    int i0, n, bpr;
} mc_slice;

/* Slot k's values over the slice's ids (the bias made in chunks of the block's threads, each
 * chunk by scan_ids) and the block's best pair. */
__device__ float mc_slot_best(const mc_slice &c, int k, const int8_t *e_qs, const float *e_qd, float softcap,
                              float *logits, float *bias, float *wv, int *wi, int *best_i) {
    const int lane = threadIdx.x & 31, warps = (int)(blockDim.x >> 5);
    int L = 1;
    while (L < c.bpr) L <<= 1;
    const int per_warp = 32 / L, grp = lane / L;
    const float *base = c.base + k * c.base_ld;
    float bv = 0.0f;
    int bi = -1;
    for (int c0 = 0; c0 < c.n; c0 += (int)blockDim.x) {
        const int m = c.n - c0 < (int)blockDim.x ? c.n - c0 : (int)blockDim.x;
        for (int r0 = (int)(threadIdx.x >> 5) * per_warp; r0 < m; r0 += warps * per_warp) { /* uniform per warp */
            const int r = r0 + grp;
            const float v = mc_bias_row(c.wq, c.wd, c0 + r, c.bpr, L, e_qs, e_qd, r < m);
            if (lane % L == 0 && r < m) bias[r] = v;
        }
        __syncthreads();
        scan_ids(base, bias, c0, m, softcap, c.d2t, c.i0, logits, bv, bi);
        __syncthreads(); /* bias reused by the next chunk */
    }
    return mc_block_best(bv, bi, wv, wi, best_i);
}

/* The staged copies (weights before the wait for the kernels before, the rest after it). */
__device__ void mc_stage_weights(mc_slice &c, int per, int rank, int8_t *smem) {
    int8_t *sq = smem;
    __half *sd = (__half *)(smem + (int64_t)per * rank);
    for (int64_t i = threadIdx.x; i < (int64_t)c.n * rank / 16; i += blockDim.x) ((int4 *)sq)[i] = ((const int4 *)c.wq)[i];
    for (int64_t i = threadIdx.x; i < (int64_t)c.n * c.bpr; i += blockDim.x) sd[i] = c.wd[i];
    c.wq = sq, c.wd = sd;
}
__device__ void mc_stage_rows(mc_slice &c, int per, int rank, int n_slots, int8_t *smem) {
    float *sb = (float *)(smem + (int64_t)per * (rank + rank / 16));
    int32_t *st = (int32_t *)(sb + (int64_t)n_slots * per);
    for (int64_t i = threadIdx.x; i < (int64_t)n_slots * c.n; i += blockDim.x)
        sb[i / c.n * per + i % c.n] = c.base[i / c.n * c.base_ld + i % c.n];
    if (c.d2t)
        for (int i = threadIdx.x; i < c.n; i += blockDim.x) st[i] = c.d2t[i];
    c.base = sb, c.base_ld = per;
    if (c.d2t) c.d2t = st;
}

__global__ void __launch_bounds__(MC_THREADS)
    k_draft_markov_chain(em_gpu_draft_io *io, int n_slots, const float *base, const int8_t *w2q, const __half *w2d,
                         int dvocab, int rank, int per, int staged, float softcap, const int32_t *d2t, float *logits,
                         int vocab, em_gpu_draft_slot slot) {
    extern __shared__ __align__(16) int8_t mc_smem[];
    __shared__ em_gpu_draft_io sio;
    __shared__ __align__(16) int8_t eqs[EM_GPU_DRAFT_MAX_RANK];
    __shared__ float eqd[EM_GPU_DRAFT_MAX_RANK / 32];
    __shared__ float bias[MC_THREADS];
    __shared__ float wv[MC_THREADS / 32];
    __shared__ int wi[MC_THREADS / 32];
    __shared__ double zh[EM_GPU_DRAFT_MAX_BLOCK][32];
    __shared__ float cand_v[2];
    __shared__ int cand_i[2];
    cg::cluster_group cl = cg::this_cluster();
    const unsigned me = cl.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, i0 = (int)me * per;
    mc_slice c = { w2q + (int64_t)i0 * rank, w2d + (int64_t)i0 * (rank / 32), base + i0, dvocab, d2t ? d2t + i0 : NULL,
                   i0, dvocab - i0 < per ? (dvocab - i0 > 0 ? dvocab - i0 : 0) : per, rank / 32 };
    emc_let_next_start();
    if (staged) mc_stage_weights(c, per, rank, mc_smem);
    emc_wait_prior();
    if (staged) mc_stage_rows(c, per, rank, n_slots, mc_smem);
    for (int i = threadIdx.x; i < (int)(sizeof sio / 4); i += MC_THREADS) ((int *)&sio)[i] = ((const int *)io)[i];
    em_gpu_draft_slot my = slot; /* e's activations in this block's shared memory; e itself from block 0 */
    my.d_e = me == 0 ? slot.d_e : NULL, my.d_e_qs = eqs, my.d_e_qd = eqd;
    if (slot.d_conf_w && warp < n_slots) zh[warp][lane] = conf_h_part(my, warp, lane);
    __syncthreads();
    slot_begin(&sio, 0, my, zh[0]);
    __syncthreads();
    for (int k = 0; k < n_slots && sio.alive && k < sio.n_max; k++) { /* uniform over the cluster */
        int bi;
        float *lk = logits ? logits + (int64_t)k * vocab : NULL;
        const float bv = mc_slot_best(c, k, eqs, eqd, softcap, lk, bias, wv, wi, &bi);
        if (threadIdx.x == 0) cand_v[k & 1] = bv, cand_i[k & 1] = bi;
        cl.sync();
        if (warp == 0) { /* the cluster's best, lane b reading block b's, recorded on every block's copy */
            float gv = 0.0f;
            int gi = -1;
            if (lane < (int)cl.num_blocks())
                gv = *cl.map_shared_rank(&cand_v[k & 1], lane), gi = *cl.map_shared_rank(&cand_i[k & 1], lane);
            mc_warp_best(gv, gi);
            if (lane == 0) pick_record(&sio, k, gi);
        }
        __syncthreads();
        if (k + 1 < n_slots) slot_begin(&sio, k + 1, my, zh[k + 1]);
        __syncthreads();
    }
    cl.sync(); /* no block leaves while another may read its bests */
    if (me == 0)
        for (int i = threadIdx.x; i < (int)(sizeof sio / 4); i += MC_THREADS) ((int *)io)[i] = ((const int *)&sio)[i];
}

extern "C" int em_gpu_draft_markov_chain(em_gpu *g, em_gpu_draft_io *d_io, int n_slots, const float *d_base,
                                         const void *w2_data, const void *w2_scales, int dvocab, int rank, float softcap,
                                         const int32_t *d_d2t, float *d_logits, int vocab, const em_gpu_draft_slot *slot,
                                         em_err *err) {
    EMC_CHECK(d_io && d_base && w2_data && w2_scales && slot && dvocab > 0 && vocab >= dvocab && rank >= 32 &&
                  rank <= EM_GPU_DRAFT_MAX_RANK && rank % 32 == 0 && n_slots >= 1 && n_slots <= EM_GPU_DRAFT_MAX_BLOCK &&
                  (d_d2t || vocab == dvocab),
              "GPU Markov chain: %d slots, %d draft ids for %d target ids, rank %d (a multiple of 32 up to %d), or a "
              "missing buffer",
              n_slots, dvocab, vocab, rank, EM_GPU_DRAFT_MAX_RANK);
    em_gpu_draft_slot s = *slot;
    s.d_e_qs = NULL, s.d_e_qd = NULL; /* slot_ok's check of the activations: the launch keeps its own */
    EMC_CHECK(slot_ok(&s) && s.w1_data && s.rank == rank, "GPU Markov chain: a bad slot start (W1 of rank %d for W2 of %d)",
              s.rank, rank);
    int rc = emc_use(g, err);
    if (rc) return rc;
    static int optin[64];
    const int per = mc_ids_per_block(dvocab);
    const size_t bytes = mc_stage_bytes(per, rank, n_slots, d_d2t != NULL);
    const bool staged = bytes <= MC_STAGE_MAX;
    if (staged && (rc = emc_smem_optin(g, k_draft_markov_chain, (int)bytes, optin, err))) return rc;
    emc_launch_clusters(g, MC_CLUSTER, k_draft_markov_chain, dim3(1, MC_CLUSTER), MC_THREADS, staged ? bytes : 0, d_io,
                        n_slots, d_base, (const int8_t *)w2_data, (const __half *)w2_scales, dvocab, rank, per,
                        staged ? 1 : 0, softcap, d_d2t, d_logits, vocab, s);
    return emc_launched(err, "k_draft_markov_chain");
}

/* ---- a sampled slot -------------------------------------------------------------------------- */

#define SAMPLE_THREADS 1024
#define SAMPLE_K EM_GPU_DRAFT_TOPK

/* sample/sample.c's rank_key: ascending keys in rank order (larger logits first). */
__device__ __forceinline__ uint32_t sample_rank_key(float l) {
    uint32_t u = __float_as_uint(l);
    if (u == 0x80000000u) u = 0;
    const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~ascending;
}

/* Draft id i as a candidate: its value (pick's corrected logit; 0 for +inf when only the +inf
 * ids count) and its 64-bit key (rank key, then the target id: unique, ascending in rank
 * order). False when it is no candidate (NaN, -inf; anything but +inf when only_inf). */
__device__ __forceinline__ bool sample_cand(const float *base, const float *bias, float softcap, const int32_t *d2t,
                                            bool only_inf, int i, unsigned long long *key, float *val) {
    float v = draft_value(base, i, softcap, bias, i);
    if (only_inf) {
        if (v != INFINITY) return false;
        v = 0.0f;
    } else if (isnan(v) || isinf(v)) {
        return false;
    }
    const uint32_t id = d2t ? (uint32_t)d2t[i] : (uint32_t)i;
    *key = ((unsigned long long)sample_rank_key(v) << 32) | id;
    *val = v;
    return true;
}

/* 53 random bits of (key, slot) as a uniform in [0, 1) (splitmix64's finalizer). */
__device__ __forceinline__ double sample_uniform(uint64_t key, int k) {
    uint64_t x = key ^ (0x9e3779b97f4a7c15ull * (uint64_t)(k + 1));
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* The sampler's filters and draw over the n candidates in rank order (one thread; sample.c's
 * em_sampler_dist from its step 3 on, and em_sampler_draw); returns the drawn target id. */
__device__ int32_t sample_finish(em_gpu_draft_io *io, int k, const float *val, const int *id, int n,
                                 em_gpu_draft_q *q) {
    double term[SAMPLE_K], z = 0;
    const double max = val[0];
    if (io->top_p < 1)
        for (int i = 0; i < n; i++) z += term[i] = exp((double)val[i] - max);
    if (io->min_p > 0 && n > 1) { /* a prefix of the ranks: the max always stays */
        const double floor = max + log((double)io->min_p);
        int m = 1;
        while (m < n && (double)val[m] >= floor) m++;
        n = m;
    }
    if (io->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += term[i] / z;
            if (cum >= io->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += term[i] = exp(((double)val[i] - max) / io->temperature);
    double total = 0;
    for (int i = 0; i < n; i++) {
        q->id[i] = id[i];
        q->p[i] = (float)(term[i] / sum);
        total += q->p[i];
    }
    io->n_q[k] = n;
    if (n == 1) return id[0];
    const double u = sample_uniform(io->key, k) * total;
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += q->p[i];
        if (u < cum) return id[i];
    }
    return id[n - 1];
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_draft_sample(em_gpu_draft_io *io, int k, const float *base, const float *bias, int dvocab, float softcap,
                   const int32_t *d2t, em_gpu_draft_q *q) {
    emc_kernel_begin();
    __shared__ unsigned int hist[256];
    __shared__ unsigned long long s_prefix, s_mask;
    __shared__ int s_left, s_pinf, s_usable, s_n;
    __shared__ unsigned long long ckey[SAMPLE_K];
    __shared__ float cval[SAMPLE_K], sval[SAMPLE_K];
    __shared__ int cid[SAMPLE_K], sid[SAMPLE_K];
    if (!io->alive || k >= io->n_max) return; /* uniform over the block */
    const int t = threadIdx.x, K = io->top_k >= 1 && io->top_k < SAMPLE_K ? io->top_k : SAMPLE_K;
    if (t == 0) s_pinf = 0, s_usable = 0, s_n = 0;
    __syncthreads();
    int pinf = 0, usable = 0;
    for (int i = t; i < dvocab; i += SAMPLE_THREADS) {
        const float v = draft_value(base, i, softcap, bias, i);
        pinf += v == INFINITY;
        usable += !(isnan(v) || isinf(v));
    }
    if (pinf) atomicAdd(&s_pinf, pinf);
    if (usable) atomicAdd(&s_usable, usable);
    __syncthreads();
    const bool only_inf = s_pinf > 0; /* sample.c: +inf logits take everything */
    const int total = only_inf ? s_pinf : s_usable;
    if (total == 0) {
        if (t == 0) io->alive = 0;
        return;
    }
    const int want = total < K ? total : K;
    unsigned long long limit = ~0ull, key;
    float v;
    if (total > want) { /* radix select of the want-th smallest key, 8 bits a pass */
        unsigned long long prefix = 0, mask = 0;
        int left = want;
        for (int shift = 56; shift >= 0; shift -= 8) {
            for (int b = t; b < 256; b += SAMPLE_THREADS) hist[b] = 0;
            __syncthreads();
            for (int i = t; i < dvocab; i += SAMPLE_THREADS)
                if (sample_cand(base, bias, softcap, d2t, only_inf, i, &key, &v) && (key & mask) == prefix)
                    atomicAdd(&hist[(key >> shift) & 255], 1u);
            __syncthreads();
            if (t == 0) {
                unsigned int cum = 0;
                int b = 0;
                while (b < 255 && cum + hist[b] < (unsigned int)left) cum += hist[b++];
                s_left = left - (int)cum;
                s_prefix = prefix | ((unsigned long long)b << shift);
                s_mask = mask | (0xffull << shift);
            }
            __syncthreads();
            prefix = s_prefix, mask = s_mask, left = s_left;
            __syncthreads();
        }
        limit = prefix;
    }
    for (int i = t; i < dvocab; i += SAMPLE_THREADS)
        if (sample_cand(base, bias, softcap, d2t, only_inf, i, &key, &v) && key <= limit) {
            const int at = atomicAdd(&s_n, 1);
            if (at < SAMPLE_K) ckey[at] = key, cval[at] = v, cid[at] = (int)(key & 0xffffffffu);
        }
    __syncthreads();
    const int n = s_n < want ? s_n : want;
    if (t < n) { /* rank by key: the keys are unique */
        int r = 0;
        for (int j = 0; j < n; j++) r += ckey[j] < ckey[t];
        sval[r] = cval[t], sid[r] = cid[t];
    }
    __syncthreads();
    if (t != 0) return;
    pick_record(io, k, sample_finish(io, k, sval, sid, n, q + k)); /* a candidate's id: never -1 */
}

extern "C" int em_gpu_draft_sample(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_base, const float *d_bias,
                                   int dvocab, float softcap, const int32_t *d_d2t, em_gpu_draft_q *d_q, em_err *err) {
    EMC_CHECK(d_io && d_base && d_q && dvocab > 0 && k >= 0 && k < EM_GPU_DRAFT_MAX_BLOCK,
              "GPU draft sample: slot %d, %d draft ids, or a missing buffer", k, dvocab);
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_draft_sample, 1, SAMPLE_THREADS, 0, d_io, k, d_base, d_bias, dvocab, softcap, d_d2t, d_q);
    return emc_launched(err, "k_draft_sample");
}
