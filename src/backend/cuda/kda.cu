/* backend/cuda/kda.cu: the KDA recurrent core on the device (gpu.h, "KDA"), model/kda.c's
 * twin: conv + SiLU + L2 norms + gates per (row, head) block; the delta rule with one thread
 * per value column of a head's state, the column's D floats in registers; the gated RMSNorm
 * per (row, head), with the output's Q8_0 activations; narrow forwards (up to 4 rows) in one
 * launch of a block per head; the ReplaySSM commit (window advance, replay in place) of any
 * number of layers in one launch.
 *
 * Invariants:
 * - The forward never writes the committed state (S is read into registers, not written back);
 *   em_gpu_kda_forward_commit (prompts) writes it as em_gpu_kda_commit of all its rows would.
 * - The per-column recurrence is one device function (kda_rows) used by the forward and the
 *   commit: for row t, x = a k and y = a q (a = expf(g)); u = sum_r x[r] S[r][c] and w = sum_r
 *   y[r] S[r][c], r ascending, one multiply then one add (--fmad=false); delta = beta (v - u);
 *   o = w + (k.q) delta; S[r][c] = a[r] S[r][c] + k[r] delta. The scalar CPU kernel's order.
 *   So commit(k) after a forward of n rows leaves the bits of k one-row forwards + commits.
 * - Everything a row computes reads only the committed window, earlier rows' pre-conv inputs
 *   and its own inputs: row j of an n-row forward does not depend on n.
 * - Reductions over a head (L2 norms, k.q, the output norm) use one fixed tree (warp
 *   butterfly, then warps in order), so every block computes them the same way. */
#include "backend/cuda/mm_kernels.cuh"

#include <math.h>
#include <string.h>

#define KDA_MAX_CONV 16
/* Forwards of at most this many rows run in one launch (k_kda_fused: the rows one after another
 * in each head's block); wider ones in three, rows side by side. */
#define KDA_FUSED_ROWS 4

/* Sum of one value per thread over a block of D (32, 64, 128) threads, the same tree
 * everywhere; every thread gets the sum. red: D / 32 floats of shared memory. */
template <int D> __device__ __forceinline__ float kda_block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o);
    if (D == 32) return v;
    const int warp = threadIdx.x / 32;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    float s = red[0];
    for (int i = 1; i < D / 32; i++) s = s + red[i];
    return s;
}

/* Block (row t, head h), thread c = channel h*D + c: conv + SiLU of q, k, v; L2 norms; gate,
 * beta, k.q; everything into the log (pre-conv rows too). */
template <int D>
__device__ __forceinline__ void kda_prep_row(const em_gpu_kda_dims &d, const em_gpu_kda_params &p, const float *win,
                                             const float *qkv, const float *f, const float *b, const em_gpu_kda_log &lg,
                                             int t, int h, float *red) {
    const int c = threadIdx.x;
    const int64_t di = (int64_t)d.n_head * D, ch = (int64_t)h * D + c;
    const int dc = d.d_conv, W = dc - 1;
    const float *conv_w[3] = { p.conv_q, p.conv_k, p.conv_v };
    float val[3];
    for (int m = 0; m < 3; m++) {
        float acc = 0.0f;
        for (int i = 0; i < dc; i++) { /* taps oldest first; tap dc-1 is row t */
            const int tau = t - W + i;
            const float z = tau < 0 ? win[((int64_t)m * W + (tau + W)) * di + ch] : qkv[(int64_t)tau * 3 * di + m * di + ch];
            acc = acc + conv_w[m][ch * dc + i] * z;
        }
        val[m] = acc / (1.0f + expf(-acc)); /* SiLU */
        lg.pre[(int64_t)t * 3 * di + m * di + ch] = qkv[(int64_t)t * 3 * di + m * di + ch];
    }
    const float ssq = kda_block_sum<D>(val[0] * val[0], red);
    const float ssk = kda_block_sum<D>(val[1] * val[1], red);
    const float q = val[0] * ((1.0f / sqrtf(ssq + d.l2_eps)) * (1.0f / sqrtf((float)D)));
    const float k = val[1] * (1.0f / sqrtf(ssk + d.l2_eps));
    const float kq = kda_block_sum<D>(k * q, red);
    float g = f[(int64_t)t * di + ch] + p.dt_bias[ch];
    const float a = p.ssm_a[h];
    if (d.bounded_gate) g = d.gate_lower_bound / (1.0f + expf(a * g));
    else g = a * (g > 20.0f ? g : log1pf(expf(g)));
    const int64_t at = (int64_t)t * di + ch;
    lg.q[at] = q;
    lg.k[at] = k;
    lg.v[at] = val[2];
    lg.g[at] = g;
    if (c == 0) {
        lg.beta[(int64_t)t * d.n_head + h] = emc_sigmoid(b[(int64_t)t * d.n_head + h]);
        lg.kq[(int64_t)t * d.n_head + h] = kq;
    }
}

template <int D>
__global__ void k_kda_prep(em_gpu_kda_dims d, em_gpu_kda_params p, const float *win, const float *qkv, const float *f,
                           const float *b, em_gpu_kda_log lg) {
    emc_kernel_begin();
    __shared__ float red[D / 32];
    kda_prep_row<D>(d, p, win, qkv, f, b, lg, blockIdx.x, blockIdx.y, red);
}

/* What row t of the log gives one thread of kda_rows: its P of the head's gate, k and q values
 * (r = threadIdx.x + i * stride), and the row's beta, v of column c and k.q. */
template <int P> struct kda_row_in {
    float g[P], k[P], q[P];
    float beta, v, kq;
};

template <int P>
__device__ __forceinline__ void kda_row_load(kda_row_in<P> &in, const em_gpu_kda_log &lg, int n_head, int h, int c, int t,
                                             int stride, bool out) {
    const int64_t row = (int64_t)t * n_head * (P * stride) + (int64_t)h * (P * stride);
#pragma unroll
    for (int i = 0; i < P; i++) {
        const int64_t r = row + threadIdx.x + i * stride;
        in.g[i] = lg.g[r];
        in.k[i] = lg.k[r];
        in.q[i] = out ? lg.q[r] : 0.0f;
    }
    in.beta = lg.beta[(int64_t)t * n_head + h];
    in.v = lg.v[row + c];
    in.kq = out ? lg.kq[(int64_t)t * n_head + h] : 0.0f;
}

/* Rows [0, L) through one column c of head h's state s[D] (registers). With out, writes the
 * pre-norm output of each row (o = S_new^T q) into lg.o. Row t + 1's log values are loaded
 * while row t is computed (the loads are the latency of a row otherwise); the arithmetic is
 * the same. */
template <int D, bool BLOCK = false>
__device__ __forceinline__ void kda_rows(float (&s)[D], const em_gpu_kda_log &lg, int n_head, int h, int c, int L,
                                         bool out) {
    constexpr int P = BLOCK ? 1 : D / 32, stride = BLOCK ? D : 32;
    __shared__ float sa[D], sk[D], sx[D], sy[D];
    const int64_t di = (int64_t)n_head * D;
    kda_row_in<P> cur, nxt;
    if (L > 0) kda_row_load<P>(nxt, lg, n_head, h, c, 0, stride, out);
    for (int t = 0; t < L; t++) {
        cur = nxt;
        if (t + 1 < L) kda_row_load<P>(nxt, lg, n_head, h, c, t + 1, stride, out);
        if (BLOCK) __syncthreads(); /* BLOCK: the head's D columns in one block (k_kda_fused) */
        else __syncwarp();
#pragma unroll
        for (int i = 0; i < P; i++) {
            const int r = threadIdx.x + i * stride;
            const float a = expf(cur.g[i]), k = cur.k[i];
            sa[r] = a;
            sk[r] = k;
            sx[r] = a * k;
            sy[r] = out ? a * cur.q[i] : 0.0f;
        }
        if (BLOCK) __syncthreads();
        else __syncwarp();
        float u = 0.0f, w = 0.0f;
#pragma unroll
        for (int r = 0; r < D; r++) {
            u = u + sx[r] * s[r];
            if (out) w = w + sy[r] * s[r];
        }
        const float delta = cur.beta * (cur.v - u);
        if (out) lg.o[(int64_t)t * di + (int64_t)h * D + c] = w + cur.kq * delta;
#pragma unroll
        for (int r = 0; r < D; r++) s[r] = sa[r] * s[r] + sk[r] * delta;
    }
}

/* The window of channel ch (one of q, k, v: m) after k rows: slots ascending, a slot's source
 * is a later slot or a logged pre-conv row (so the update is in place). */
__device__ __forceinline__ void kda_window_advance(float *win, const float *pre, int64_t di, int W, int k, int m,
                                                   int64_t ch) {
    for (int j = 0; j < W; j++) {
        const int tau = k - W + j;
        const float v = tau < 0 ? win[(m * W + (tau + W)) * di + ch] : pre[(int64_t)tau * 3 * di + m * di + ch];
        win[(m * W + j) * di + ch] = v;
    }
}

/* Block (head h, 32-column slice), one warp: the state's columns in registers, through the
 * forward's rows (S is read, never written). COMMIT (a forward that commits all its rows, for
 * prefill): then the slice's conv window advanced and its columns written back, what
 * k_kda_commit of L rows does with the same kda_rows (the state update does not depend on
 * whether outputs are made), so the same bits. */
template <int D, bool COMMIT>
__global__ void __launch_bounds__(32) k_kda_recur(float *S, float *win, em_gpu_kda_log lg, int n_head, int W, int L) {
    emc_kernel_begin();
    const int h = blockIdx.x, c = blockIdx.y * 32 + threadIdx.x;
    float *Sh = S + (int64_t)h * D * D;
    float s[D];
#pragma unroll
    for (int r = 0; r < D; r++) s[r] = Sh[(int64_t)r * D + c];
    kda_rows<D>(s, lg, n_head, h, c, L, true);
    if (!COMMIT) return;
    if (W > 0)
        for (int m = 0; m < 3; m++) kda_window_advance(win, lg.pre, (int64_t)n_head * D, W, L, m, (int64_t)h * D + c);
#pragma unroll
    for (int r = 0; r < D; r++) Sh[(int64_t)r * D + c] = s[r];
}

/* Row t, head h: out = o_norm * (o * rs) / (1 + exp(-g2)), rs = 1/sqrt(mean(o^2) + eps); with
 * qs, out's Q8_0 activations too (warp w holds 32-value block w of the head's slice:
 * k_quant_q8_0's arithmetic on the same values). */
template <int D>
__device__ __forceinline__ void kda_finish_row(const em_gpu_kda_dims &d, const float *o_norm, const em_gpu_kda_log &lg,
                                               const float *g2, float *out, int8_t *qs, float *qd, int t, int h,
                                               float *red) {
    const int c = threadIdx.x;
    const int64_t at = (int64_t)t * d.n_head * D + (int64_t)h * D + c;
    const float o = lg.o[at];
    const float ss = kda_block_sum<D>(o * o, red);
    const float rs = 1.0f / sqrtf(ss / (float)D + d.norm_eps);
    const float v = o_norm[c] * (o * rs) / (1.0f + expf(-g2[at]));
    out[at] = v;
    if (qs) quant_q8_0_block(v, c & 31, qs + (at & ~(int64_t)31), qd + (at >> 5));
}

template <int D> __global__ void k_kda_finish(em_gpu_kda_dims d, const float *o_norm, em_gpu_kda_log lg, const float *g2,
                                              float *out, int8_t *qs, float *qd) {
    emc_kernel_begin();
    __shared__ float red[D / 32];
    kda_finish_row<D>(d, o_norm, lg, g2, out, qs, qd, blockIdx.x, blockIdx.y, red);
}

/* The three steps of a narrow forward in one launch, block h = head h of D threads: every row's
 * preparation (kda_prep_row), then the delta rule with thread c on column c (kda_rows over the
 * block), then every row's gated norm (kda_finish_row). The same device functions in the same
 * block shapes (D threads for the rows' reductions): the bits of the three launches. */
template <int D>
__global__ void __launch_bounds__(D) k_kda_fused(em_gpu_kda_dims d, em_gpu_kda_params p, const float *win,
                                                 const float *S, const float *qkv, const float *f, const float *b,
                                                 const float *g2, float *out, int8_t *qs, float *qd, em_gpu_kda_log lg,
                                                 int n) {
    emc_kernel_begin();
    __shared__ float red[D / 32];
    const int h = blockIdx.x, c = threadIdx.x;
    for (int t = 0; t < n; t++) kda_prep_row<D>(d, p, win, qkv, f, b, lg, t, h, red);
    __syncthreads();
    const float *Sh = S + (int64_t)h * D * D;
    float s[D];
#pragma unroll
    for (int r = 0; r < D; r++) s[r] = Sh[(int64_t)r * D + c];
    kda_rows<D, true>(s, lg, d.n_head, h, c, n, true);
    __syncthreads();
    for (int t = 0; t < n; t++) kda_finish_row<D>(d, p.o_norm, lg, g2, out, qs, qd, t, h, red);
}

/* One layer's commit in a batched launch: its state and its log. */
typedef struct kda_commit_job {
    float *S, *conv;
    em_gpu_kda_log lg;
} kda_commit_job;
#define KDA_COMMIT_BATCH 24 /* layers a launch commits (the jobs stay within 4 KiB of parameters) */
typedef struct kda_commit_jobs {
    kda_commit_job job[KDA_COMMIT_BATCH];
} kda_commit_jobs;

/* Block (head h, 32-column slice, layer z), one warp: the layer's conv window for the slice's
 * channels of q, k and v, then the replay of its state columns in place. The layers are
 * independent, so one launch commits them all (the per-layer arithmetic is k_kda_recur's). */
template <int D> __global__ void __launch_bounds__(32) k_kda_commit(kda_commit_jobs js, int n_head, int W, int k) {
    emc_kernel_begin();
    kda_commit_job j = js.job[0];
#pragma unroll
    for (int i = 1; i < KDA_COMMIT_BATCH; i++) /* static indexing: the parameters stay in constant memory */
        if (blockIdx.z == (unsigned)i) j = js.job[i];
    const int h = blockIdx.x, c = blockIdx.y * 32 + threadIdx.x;
    const int64_t di = (int64_t)n_head * D;
    if (W > 0)
        for (int m = 0; m < 3; m++) kda_window_advance(j.conv, j.lg.pre, di, W, k, m, (int64_t)h * D + c);
    float *Sh = j.S + (int64_t)h * D * D;
    float s[D];
#pragma unroll
    for (int r = 0; r < D; r++) s[r] = Sh[(int64_t)r * D + c];
    kda_rows<D>(s, j.lg, n_head, h, c, k, false);
#pragma unroll
    for (int r = 0; r < D; r++) Sh[(int64_t)r * D + c] = s[r];
}

/* ---- host side ----------------------------------------------------------------------------- */

static uint64_t kda_di(const em_gpu_kda_dims *d) { return (uint64_t)d->n_head * (uint64_t)d->head_dim; }

extern "C" int em_gpu_kda_dims_check(const em_gpu_kda_dims *d, em_err *err) {
    if (!d) return em_err_set(err, EM_EINVAL, "GPU kda: dims is NULL");
    if (d->n_head < 1 || d->n_head > 65535)
        return em_err_set(err, EM_EINVAL, "GPU kda: n_head %d out of range [1, 65535]", d->n_head);
    if (d->head_dim != 32 && d->head_dim != 64 && d->head_dim != 128)
        return em_err_set(err, EM_EUNSUPPORTED, "GPU kda: head_dim %d (the kernels take 32, 64 or 128)", d->head_dim);
    if (d->d_conv < 1 || d->d_conv > KDA_MAX_CONV)
        return em_err_set(err, EM_EINVAL, "GPU kda: d_conv %d out of range [1, %d]", d->d_conv, KDA_MAX_CONV);
    if (!isfinite(d->norm_eps) || d->norm_eps < 0.0f || !isfinite(d->l2_eps) || d->l2_eps < 0.0f)
        return em_err_set(err, EM_EINVAL, "GPU kda: norm_eps %g / l2_eps %g must be finite and >= 0", (double)d->norm_eps,
                          (double)d->l2_eps);
    if (d->bounded_gate && !(isfinite(d->gate_lower_bound) && d->gate_lower_bound < 0.0f))
        return em_err_set(err, EM_EINVAL, "GPU kda: gate_lower_bound %g must be finite and < 0", (double)d->gate_lower_bound);
    return EM_OK;
}

extern "C" uint64_t em_gpu_kda_state_floats(const em_gpu_kda_dims *d) {
    if (em_gpu_kda_dims_check(d, NULL)) return 0;
    return 3 * (uint64_t)(d->d_conv - 1) * kda_di(d) + (uint64_t)d->n_head * d->head_dim * d->head_dim;
}

/* Log pieces in floats, each rounded up to 64 floats (256 bytes). */
static uint64_t kda_piece(uint64_t f) { return (f + 63) / 64 * 64; }

static uint64_t kda_log_floats(const em_gpu_kda_dims *d, int rows, em_gpu_kda_log *lg, float *base) {
    const uint64_t di = kda_di(d), r = (uint64_t)rows, H = (uint64_t)d->n_head;
    const uint64_t sizes[8] = { r * di, r * di, r * di, r * H, r * 3 * di, r * di, r * H, r * di };
    float **dst[8] = { &lg->k, &lg->v, &lg->g, &lg->beta, &lg->pre, &lg->q, &lg->kq, &lg->o };
    uint64_t off = 0;
    for (int i = 0; i < 8; i++) {
        if (base) *dst[i] = base + off;
        off += kda_piece(sizes[i]);
    }
    return off;
}

extern "C" uint64_t em_gpu_kda_log_bytes(const em_gpu_kda_dims *d, int max_rows) {
    if (em_gpu_kda_dims_check(d, NULL) || max_rows < 1 || max_rows > EM_GPU_WIDE_MAX_ROWS) return 0;
    em_gpu_kda_log lg;
    return kda_log_floats(d, max_rows, &lg, NULL) * sizeof(float);
}

extern "C" int em_gpu_kda_log_init(const em_gpu_kda_dims *d, int max_rows, void *d_mem, em_gpu_kda_log *out, em_err *err) {
    int rc = em_gpu_kda_dims_check(d, err);
    if (rc) return rc;
    EMC_CHECK(out && d_mem && ((uintptr_t)d_mem & 255) == 0, "GPU kda log: no output, or memory not 256-byte aligned");
    EMC_CHECK(max_rows >= 1 && max_rows <= EM_GPU_WIDE_MAX_ROWS, "GPU kda log: max_rows %d outside [1, %d]", max_rows,
              EM_GPU_WIDE_MAX_ROWS);
    *out = em_gpu_kda_log{};
    out->max_rows = max_rows;
    out->consumed = true; /* nothing to commit before a forward */
    kda_log_floats(d, max_rows, out, (float *)d_mem);
    return EM_OK;
}

/* commit: the recurrence also commits all n rows (n > KDA_FUSED_ROWS; the caller commits after
 * a fused forward). */
template <int D>
static void kda_launch_forward(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p, const em_gpu_kda_state *st,
                               int n, const float *qkv, const float *f, const float *b, const float *g2, float *out,
                               int8_t *qs, float *qd, const em_gpu_kda_log *lg, bool commit) {
    if (n <= KDA_FUSED_ROWS) {
        emc_launch(g, k_kda_fused<D>, (unsigned)d->n_head, D, 0, *d, *p, (const float *)st->conv, (const float *)st->S,
                   qkv, f, b, g2, out, qs, qd, *lg, n);
        return;
    }
    const dim3 rows((unsigned)n, (unsigned)d->n_head), cols((unsigned)d->n_head, D / 32);
    emc_launch(g, k_kda_prep<D>, rows, D, 0, *d, *p, st->conv, qkv, f, b, *lg);
    if (commit) emc_launch(g, k_kda_recur<D, true>, cols, 32, 0, st->S, st->conv, *lg, d->n_head, d->d_conv - 1, n);
    else emc_launch(g, k_kda_recur<D, false>, cols, 32, 0, st->S, st->conv, *lg, d->n_head, d->d_conv - 1, n);
    emc_launch(g, k_kda_finish<D>, rows, D, 0, *d, p->o_norm, *lg, g2, out, qs, qd);
}

static int kda_forward(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p, const em_gpu_kda_state *committed,
                       int n, const float *d_qkv, const float *d_f, const float *d_b, const float *d_g2, float *d_out,
                       void *d_q8, em_gpu_act *q8, em_gpu_kda_log *log, bool commit, em_err *err) {
    int rc = em_gpu_kda_dims_check(d, err);
    if (rc) return rc;
    EMC_CHECK(p && p->conv_q && p->conv_k && p->conv_v && p->ssm_a && p->dt_bias && p->o_norm,
              "GPU kda forward: a weight pointer is NULL");
    EMC_CHECK(committed && committed->S && (d->d_conv == 1 || committed->conv), "GPU kda forward: no committed state");
    EMC_CHECK(log && log->k, "GPU kda forward: no log");
    EMC_CHECK(n >= 0 && n <= log->max_rows, "GPU kda forward: %d rows outside [0, %d] (the log's max_rows)", n, log->max_rows);
    EMC_CHECK(n == 0 || (d_qkv && d_f && d_b && d_g2 && d_out), "GPU kda forward: an input or output pointer is NULL");
    EMC_CHECK(!q8 || (n >= 1 && d_q8 && ((uintptr_t)d_q8 & 15) == 0),
              "GPU kda forward: Q8_0 output scratch missing or not 16-byte aligned (or no rows)");
    const int64_t di = (int64_t)kda_di(d);
    int8_t *qs = NULL;
    float *qd = NULL;
    if (q8) { /* em_gpu_act_prepare's layout: n rows of quants, padded to 16 bytes, then the scales */
        qs = (int8_t *)d_q8;
        qd = (float *)((uint8_t *)d_q8 + (((uint64_t)n * (uint64_t)di + 15) & ~(uint64_t)15));
        memset(q8, 0, sizeof *q8);
        q8->type = EM_TYPE_Q8_0, q8->n = n, q8->cols = di, q8->x = d_out, q8->ldx = di, q8->qs = qs, q8->d = qd;
    }
    log->n = n;
    log->consumed = commit && n == 0;
    if ((rc = emc_use(g, err)) || n == 0) return rc;
    const bool in_recur = commit && n > KDA_FUSED_ROWS;
    switch (d->head_dim) {
    case 32: kda_launch_forward<32>(g, d, p, committed, n, d_qkv, d_f, d_b, d_g2, d_out, qs, qd, log, in_recur); break;
    case 64: kda_launch_forward<64>(g, d, p, committed, n, d_qkv, d_f, d_b, d_g2, d_out, qs, qd, log, in_recur); break;
    default: kda_launch_forward<128>(g, d, p, committed, n, d_qkv, d_f, d_b, d_g2, d_out, qs, qd, log, in_recur); break;
    }
    if ((rc = emc_launched(err, "k_kda_fused / k_kda_prep / k_kda_recur / k_kda_finish")) || !commit) return rc;
    if (in_recur) {
        log->consumed = true;
        return EM_OK;
    }
    em_gpu_kda_state st = *committed; /* the caller's state (em_gpu_kda_forward_commit's st) */
    return em_gpu_kda_commit(g, d, &st, log, n, err);
}

extern "C" int em_gpu_kda_forward(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p,
                                  const em_gpu_kda_state *committed, int n, const float *d_qkv, const float *d_f,
                                  const float *d_b, const float *d_g2, float *d_out, void *d_q8, em_gpu_act *q8,
                                  em_gpu_kda_log *log, em_err *err) {
    return kda_forward(g, d, p, committed, n, d_qkv, d_f, d_b, d_g2, d_out, d_q8, q8, log, false, err);
}

extern "C" int em_gpu_kda_forward_commit(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p,
                                         em_gpu_kda_state *st, int n, const float *d_qkv, const float *d_f,
                                         const float *d_b, const float *d_g2, float *d_out, void *d_q8, em_gpu_act *q8,
                                         em_gpu_kda_log *log, em_err *err) {
    return kda_forward(g, d, p, st, n, d_qkv, d_f, d_b, d_g2, d_out, d_q8, q8, log, true, err);
}

template <int D>
static void kda_launch_commit(em_gpu *g, const em_gpu_kda_dims *d, const kda_commit_jobs &js, int layers, int k) {
    const dim3 grid((unsigned)d->n_head, D / 32, (unsigned)layers);
    emc_launch(g, k_kda_commit<D>, grid, 32, 0, js, d->n_head, d->d_conv - 1, k);
}

extern "C" int em_gpu_kda_commit_layers(em_gpu *g, const em_gpu_kda_dims *d, em_gpu_kda_state *st, em_gpu_kda_log *log,
                                        int layers, int k, em_err *err) {
    int rc = em_gpu_kda_dims_check(d, err);
    if (rc) return rc;
    EMC_CHECK(st && log && layers >= 1, "GPU kda commit: no states or logs (%d layers)", layers);
    for (int i = 0; i < layers; i++) {
        EMC_CHECK(st[i].S && (d->d_conv == 1 || st[i].conv), "GPU kda commit: no state (layer %d of the call)", i);
        EMC_CHECK(log[i].k, "GPU kda commit: no log (layer %d of the call)", i);
        EMC_CHECK(!log[i].consumed, "GPU kda commit: the log of layer %d of the call was already committed (or no "
                  "forward ran)", i);
        EMC_CHECK(k >= 0 && k <= log[i].n, "GPU kda commit: k = %d outside [0, %d] logged rows (layer %d of the call)", k,
                  log[i].n, i);
    }
    for (int i = 0; i < layers; i++) log[i].consumed = true;
    if ((rc = emc_use(g, err)) || k == 0) return rc;
    for (int i0 = 0; i0 < layers; i0 += KDA_COMMIT_BATCH) {
        const int m = layers - i0 < KDA_COMMIT_BATCH ? layers - i0 : KDA_COMMIT_BATCH;
        kda_commit_jobs js = {};
        for (int i = 0; i < m; i++) js.job[i] = kda_commit_job{ st[i0 + i].S, st[i0 + i].conv, log[i0 + i] };
        switch (d->head_dim) {
        case 32: kda_launch_commit<32>(g, d, js, m, k); break;
        case 64: kda_launch_commit<64>(g, d, js, m, k); break;
        default: kda_launch_commit<128>(g, d, js, m, k); break;
        }
        if ((rc = emc_launched(err, "k_kda_commit"))) return rc;
    }
    return EM_OK;
}

extern "C" int em_gpu_kda_commit(em_gpu *g, const em_gpu_kda_dims *d, em_gpu_kda_state *st, em_gpu_kda_log *log, int k,
                                 em_err *err) {
    return em_gpu_kda_commit_layers(g, d, st, log, 1, k, err);
}
