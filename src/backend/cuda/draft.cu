/* backend/cuda/draft.cu: the drafter's own ops on the device (gpu.h, "the drafter"): grouped-
 * query attention of a block over [context cache ; block], a bias added to rows, and the slot
 * chain of a greedy propose (confidence and keep test, pick), which reads and writes one
 * em_gpu_draft_io in device memory so that a block needs no host round trip per slot.
 * draft/dspark.c and draft/schedule.c are the references:
 * - attention: a block per (row, query head); a warp per position computes a score (lanes over
 *   the head's values, a butterfly), the scores go to scratch, the block takes their max and
 *   the sum of exp in double, and each thread owns columns of the output, summing p V over the
 *   positions in ascending order. Close to the CPU's floats, not bit-identical (the drafter
 *   only steers proposals; acceptance is the target's).
 * - keep: one thread, the confidence sum in the CPU's order and doubles (bit-identical for the
 *   same h and e), then em_draft_sched_keep's arithmetic.
 * - pick: one block, em_argmax's rule on the corrected logits in target ids.
 * Launch shapes depend only on the dims and n (graph capture); the context length, the chain's
 * state and the previous pick are read on the device. */
#include "backend/cuda/cuda_impl.cuh"

#include <math.h>

#define GQA_THREADS 128
#define GQA_MAX_HD 256

uint64_t em_gpu_gqa_scratch_floats(const em_gpu_gqa_dims *d, int n) {
    if (!d || n < 1 || d->capacity < 0) return 0;
    return (uint64_t)n * (uint64_t)d->n_head * (uint64_t)(d->capacity + EM_GPU_MAX_ROWS);
}

/* Block (i, h): row i, query head h. */
__global__ void __launch_bounds__(GQA_THREADS)
    k_gqa(em_gpu_gqa_dims d, const float *q, const float *kc, const float *vc, const int64_t *n_ctx_p, const float *k,
          const float *v, int n, float *scratch, float *out) {
    emc_kernel_begin();
    __shared__ float qs[GQA_MAX_HD];
    __shared__ double red[GQA_THREADS];
    __shared__ float redf[GQA_THREADS];
    const int i = blockIdx.x, h = blockIdx.y, hd = d.hd, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = h / (d.n_head / d.n_kv);
    const int64_t kw = (int64_t)d.n_kv * hd, qw = (int64_t)d.n_head * hd;
    int64_t n_ctx = *n_ctx_p;
    n_ctx = n_ctx < 0 ? 0 : n_ctx > d.capacity ? d.capacity : n_ctx;
    const int nb = d.causal ? i + 1 : n;
    const int64_t total = n_ctx + nb;
    float *sc = scratch + ((int64_t)i * d.n_head + h) * (d.capacity + EM_GPU_MAX_ROWS);
    for (int c = threadIdx.x; c < hd; c += GQA_THREADS) qs[c] = q[i * qw + (int64_t)h * hd + c];
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t p = warp; p < total; p += GQA_THREADS / 32) {
        const float *kr = p < n_ctx ? kc + p * kw + (int64_t)grp * hd : k + (p - n_ctx) * kw + (int64_t)grp * hd;
        float s = 0.0f;
        for (int c = lane; c < hd; c += 32) s = fmaf(qs[c], kr[c], s);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) sc[p] = s * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t p = threadIdx.x; p < total; p += GQA_THREADS) mx = fmaxf(mx, sc[p]);
    redf[threadIdx.x] = mx;
    __syncthreads();
    for (int s = GQA_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) redf[threadIdx.x] = fmaxf(redf[threadIdx.x], redf[threadIdx.x + s]);
        __syncthreads();
    }
    mx = redf[0];
    double sum = 0.0;
    for (int64_t p = threadIdx.x; p < total; p += GQA_THREADS) {
        const float e = expf(sc[p] - mx);
        sc[p] = e;
        sum += (double)e;
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = GQA_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = (float)(1.0 / red[0]);
    for (int c = threadIdx.x; c < hd; c += GQA_THREADS) {
        float acc = 0.0f;
        for (int64_t p = 0; p < total; p++) {
            const float *vr = p < n_ctx ? vc + p * kw + (int64_t)grp * hd : v + (p - n_ctx) * kw + (int64_t)grp * hd;
            acc = fmaf(sc[p] * inv, vr[c], acc);
        }
        out[i * qw + (int64_t)h * hd + c] = acc;
    }
}

extern "C" int em_gpu_gqa_attend(em_gpu *g, const em_gpu_gqa_dims *d, const float *d_q, const float *d_kc,
                                 const float *d_vc, const int64_t *d_n_ctx, const float *d_k, const float *d_v, int n,
                                 float *d_scratch, float *d_out, em_err *err) {
    EMC_CHECK(d && d->n_head > 0 && d->n_kv > 0 && d->n_head % d->n_kv == 0 && d->hd > 0 && d->hd <= GQA_MAX_HD &&
                  d->capacity >= 0,
              "GPU attention: %d heads over %d kv heads of %d values (want n_head a multiple of n_kv, hd 1..%d)",
              d ? d->n_head : 0, d ? d->n_kv : 0, d ? d->hd : 0, GQA_MAX_HD);
    EMC_CHECK(n >= 1 && n <= EM_GPU_MAX_ROWS, "GPU attention: %d rows (1..%d)", n, EM_GPU_MAX_ROWS);
    EMC_CHECK(d_q && d_kc && d_vc && d_n_ctx && d_k && d_v && d_scratch && d_out, "GPU attention: a missing buffer");
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_gqa, dim3((unsigned)n, (unsigned)d->n_head), GQA_THREADS, 0, *d, d_q, d_kc, d_vc, d_n_ctx, d_k, d_v,
               n, d_scratch, d_out);
    return emc_launched(err, "k_gqa");
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

__global__ void k_draft_keep(em_gpu_draft_io *io, int k, const float *h, int d, const float *e, int rank,
                             const float *w, float b, const float *t) {
    emc_kernel_begin();
    if (threadIdx.x != 0 || !io->alive || k >= io->n_max) return;
    double z = b; /* dspark.c's confidence(): the same order, the same doubles */
    for (int i = 0; i < d; i++) z += (double)w[i] * h[i];
    if (e)
        for (int i = 0; i < rank; i++) z += (double)w[d + i] * e[i];
    if (t) z /= t[k];
    const float zf = (float)z;
    io->conf[k] = zf;
    if (io->may_stop && !chain_keep(io, zf)) io->alive = 0;
}

extern "C" int em_gpu_draft_keep(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_h, int d, const float *d_e,
                                 int rank, const float *d_w, float b, const float *d_t, em_err *err) {
    EMC_CHECK(d_io && d_h && d_w && d > 0 && (!d_e || rank > 0) && k >= 0 && k < EM_GPU_DRAFT_MAX_BLOCK,
              "GPU draft keep: slot %d, %d + %d values, or a missing buffer", k, d, rank);
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_draft_keep, 1, 32, 0, d_io, k, d_h, d, d_e, rank, d_w, b, d_t);
    return emc_launched(err, "k_draft_keep");
}

#define PICK_THREADS 1024

__global__ void __launch_bounds__(PICK_THREADS)
    k_draft_pick(em_gpu_draft_io *io, int k, const float *base, const float *bias, int dvocab, float softcap,
                 const int32_t *d2t, float *logits, int vocab) {
    emc_kernel_begin();
    __shared__ float sv[PICK_THREADS];
    __shared__ int si[PICK_THREADS];
    if (!io->alive || k >= io->n_max) return; /* uniform over the block */
    if (logits && d2t)
        for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) logits[i] = -INFINITY;
    __syncthreads();
    float bv = 0.0f;
    int bi = -1;
    for (int i = threadIdx.x; i < dvocab; i += PICK_THREADS) {
        float x = base[i];
        if (softcap > 0) x = softcap * tanhf(x / softcap);
        if (bias) x += bias[i];
        const int id = d2t ? d2t[i] : i;
        if (logits) logits[id] = x;
        if (!isnan(x) && am_better(x, id, bv, bi)) bv = x, bi = id; /* ids: target ids */
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    am_block_best(sv, si, PICK_THREADS);
    if (threadIdx.x != 0) return;
    /* em_argmax gives -1 only when every logit is NaN; a row of -inf still has an argmax */
    if (si[0] < 0) {
        io->alive = 0;
        return;
    }
    io->toks[k + 1] = si[0];
    io->n = k + 1;
    if (k + 1 >= io->n_max) io->alive = 0;
}

extern "C" int em_gpu_draft_pick(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_base, const float *d_bias,
                                 int dvocab, float softcap, const int32_t *d_d2t, float *d_logits, int vocab,
                                 em_err *err) {
    EMC_CHECK(d_io && d_base && dvocab > 0 && vocab >= dvocab && k >= 0 && k < EM_GPU_DRAFT_MAX_BLOCK &&
                  (d_d2t || vocab == dvocab),
              "GPU draft pick: slot %d, %d draft ids for %d target ids (d2t %s)", k, dvocab, vocab,
              d_d2t ? "given" : "missing");
    int rc = emc_use(g, err);
    if (rc) return rc;
    emc_launch(g, k_draft_pick, 1, PICK_THREADS, 0, d_io, k, d_base, d_bias, dvocab, softcap, d_d2t, d_logits, vocab);
    return emc_launched(err, "k_draft_pick");
}
