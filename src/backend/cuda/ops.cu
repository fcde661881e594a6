/* backend/cuda/ops.cu: the row ops of the forward (RMSNorm, SwiGLU, SiTU, sigmoid gate,
 * residual add, K3's AttnRes mix, embedding gather, argmax, RoPE) and the MoE router, each the arithmetic of its CPU twin in compute/,
 * sample/ and model/moe.c. The library is built with --fmad=false, so a * b + c rounds twice
 * as the CPU's C does (gcc's ISO C mode contracts nothing); where the CPU sums in double this
 * does too. A row's result depends only on that row: every op is width-invariant. Math library
 * functions (expf, cos, sin) are CUDA's, within their documented ulp of the CPU's libm. */
#include "backend/cuda/mm_kernels.cuh"

#include <math.h>
#include <string.h>

/* ---- RMSNorm ----------------------------------------------------------------------------- */

#define NORM_THREADS 1024
#define NORM_HELD 4 /* values a thread keeps in registers: rows of up to 4096 read once */

/* The sum of v over the warp, in one fixed butterfly (xor 16, 8, 4, 2, 1). */
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block of 1024 threads per row. With y, x += y (+ y2) first (written back). Thread t
 * takes values t, t + 1024, ... (its loads issued together), sums their squares in double in
 * that order; the sums meet in a fixed tree (each warp's butterfly, then the 32 warp sums in
 * warp 0's). The scale is rounded to fp32 once (compute/'s em_rmsnorm). With qs, the normed
 * values are quantized from the registers that hold them: warp w's lanes hold 32-value block
 * w + 32 u of the row (k_quant_q8_0's arithmetic; n a multiple of 32). */
__global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm(float *x, int64_t ldx, const float *y, const float *y2,
                                                          int64_t ldy, const float *w, float eps, int64_t n, float *h,
                                                          int64_t ldh, int8_t *qs, float *qd) {
    emc_kernel_begin();
    __shared__ double wpart[NORM_THREADS / 32];
    __shared__ float sscale;
    const int t = threadIdx.x, lane = t & 31;
    float *xr = x + blockIdx.x * ldx, *hr = h + blockIdx.x * ldh;
    const float *yr = y ? y + blockIdx.x * ldy : NULL, *y2r = y && y2 ? y2 + blockIdx.x * ldy : NULL;
    double s = 0.0;
    float held[NORM_HELD];
    for (int64_t i0 = t; i0 < n; i0 += NORM_HELD * NORM_THREADS) {
        float a[NORM_HELD], b[NORM_HELD], c[NORM_HELD];
#pragma unroll
        for (int u = 0; u < NORM_HELD; u++) {
            const int64_t i = i0 + (int64_t)u * NORM_THREADS;
            if (i >= n) break;
            a[u] = xr[i];
            if (yr) b[u] = yr[i];
            if (y2r) c[u] = y2r[i];
        }
#pragma unroll
        for (int u = 0; u < NORM_HELD; u++) {
            const int64_t i = i0 + (int64_t)u * NORM_THREADS;
            if (i >= n) break;
            float v = a[u];
            if (yr) {
                const float add = y2r ? b[u] + c[u] : b[u];
                xr[i] = v = v + add;
            }
            held[u] = v;
            s += (double)v * (double)v;
        }
    }
    s = warp_sum_d(s);
    if (lane == 0) wpart[t >> 5] = s;
    __syncthreads();
    if (t < 32) {
        const double all = warp_sum_d(wpart[t]);
        if (t == 0) sscale = (float)(1.0 / sqrt(all / (double)n + (double)eps));
    }
    __syncthreads();
    const float scale = sscale;
    const bool in_regs = n <= NORM_HELD * NORM_THREADS;
    for (int64_t i0 = t; i0 < n; i0 += NORM_HELD * NORM_THREADS) {
#pragma unroll
        for (int u = 0; u < NORM_HELD; u++) {
            const int64_t i = i0 + (int64_t)u * NORM_THREADS;
            if (i >= n) break; /* with qs, n is a multiple of 32: whole warps leave */
            const float v = in_regs ? held[u] : xr[i];
            const float hv = w ? v * scale * w[i] : v * scale;
            hr[i] = hv;
            if (qs) quant_q8_0_block(hv, lane, qs + blockIdx.x * n + (i - lane), qd + blockIdx.x * (n / 32) + (i >> 5));
        }
    }
}

extern "C" int em_gpu_rmsnorm_rows(em_gpu *g, const float *d_x, int64_t ldx, const float *d_w, float eps, int rows,
                                   int64_t n, float *d_y, int64_t ldy, em_err *err) {
    EMC_CHECK(d_x && d_y && rows >= 0 && n > 0 && ldx >= n && ldy >= n, "GPU rmsnorm: %d rows of %lld (ldx %lld, ldy %lld)",
              rows, (long long)n, (long long)ldx, (long long)ldy);
    int rc = emc_use(g, err);
    if (rc || rows == 0) return rc;
    emc_launch(g, k_rmsnorm, rows, NORM_THREADS, 0, (float *)d_x, ldx, (const float *)NULL, (const float *)NULL, (int64_t)0, d_w, eps, n, d_y,
               ldy, (int8_t *)NULL, (float *)NULL);
    return emc_launched(err, "k_rmsnorm");
}

extern "C" int em_gpu_add_rmsnorm(em_gpu *g, float *d_x, int64_t ldx, const float *d_y, const float *d_y2, int64_t ldy,
                                  const float *d_w, float eps, int rows, int64_t n, float *d_h, int64_t ldh, void *d_scratch,
                                  em_gpu_act *q, em_err *err) {
    EMC_CHECK(d_x && d_h && rows >= 1 && rows <= EM_GPU_WIDE_MAX_ROWS && n > 0 && ldx >= n && ldh >= n && (!d_y || ldy >= n),
              "GPU add_rmsnorm: %d rows (1..%d) of %lld (ldx %lld, ldy %lld, ldh %lld)", rows, EM_GPU_WIDE_MAX_ROWS,
              (long long)n, (long long)ldx, (long long)ldy, (long long)ldh);
    EMC_CHECK(!q || (n % 32 == 0 && d_scratch && ((uintptr_t)d_scratch & 15) == 0),
              "GPU add_rmsnorm: Q8_0 activations need n a multiple of 32 (%lld) and 16-byte aligned scratch", (long long)n);
    int rc = emc_use(g, err);
    if (rc) return rc;
    int8_t *qs = NULL;
    float *qd = NULL;
    if (q) { /* em_gpu_act_prepare's layout */
        memset(q, 0, sizeof *q);
        qs = (int8_t *)d_scratch;
        qd = (float *)((uint8_t *)d_scratch + (((uint64_t)rows * (uint64_t)n + 15) & ~(uint64_t)15));
        q->type = EM_TYPE_Q8_0, q->n = rows, q->cols = n, q->x = d_h, q->ldx = ldh, q->qs = qs, q->d = qd;
    }
    emc_launch(g, k_rmsnorm, rows, NORM_THREADS, 0, d_x, ldx, d_y, d_y ? d_y2 : NULL, ldy, d_w, eps, n, d_h, ldh, qs, qd);
    return emc_launched(err, "k_rmsnorm (add, Q8_0)");
}

/* ---- element-wise ------------------------------------------------------------------------- */

__global__ void k_swiglu(const float *gt, const float *up, int64_t count, float *y) {
    emc_kernel_begin();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    y[i] = emc_swiglu(gt[i], up[i]);
}

__global__ void k_add(const float *a, const float *b, int64_t count, float *y) {
    emc_kernel_begin();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[i] = a[i] + b[i];
}

extern "C" int em_gpu_swiglu(em_gpu *g, const float *d_gate, const float *d_up, int64_t count, float *d_y, em_err *err) {
    EMC_CHECK(d_gate && d_up && d_y && count >= 0, "GPU swiglu: missing buffer or %lld values", (long long)count);
    int rc = emc_use(g, err);
    if (rc || count == 0) return rc;
    emc_launch(g, k_swiglu, emc_blocks(count, 256), 256, 0, d_gate, d_up, count, d_y);
    return emc_launched(err, "k_swiglu");
}

__global__ void k_fill(float *x, float v, uint64_t n) {
    emc_kernel_begin();
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

extern "C" int em_gpu_fill(em_gpu *g, float *d_x, float v, uint64_t n, em_err *err) {
    EMC_CHECK(d_x || n == 0, "GPU fill: a missing buffer");
    int rc = emc_use(g, err);
    if (rc || n == 0) return rc;
    emc_launch(g, k_fill, emc_blocks((int64_t)n, 256), 256, 0, d_x, v, n);
    return emc_launched(err, "k_fill");
}

extern "C" int em_gpu_add(em_gpu *g, const float *d_a, const float *d_b, int64_t count, float *d_y, em_err *err) {
    EMC_CHECK(d_a && d_b && d_y && count >= 0, "GPU add: missing buffer or %lld values", (long long)count);
    int rc = emc_use(g, err);
    if (rc || count == 0) return rc;
    emc_launch(g, k_add, emc_blocks(count, 256), 256, 0, d_a, d_b, count, d_y);
    return emc_launched(err, "k_add");
}

/* compute/'s em_situ with the reciprocals it rounds to fp32 first (inv, lin_inv from the host,
 * the same division): a = (beta * tanh(g inv)) * sigmoid(g), u, y = a * u. */
__global__ void k_situ(const float *gt, const float *up, int64_t count, float beta, float inv, float lin_beta,
                       float lin_inv, float *y) {
    emc_kernel_begin();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    y[i] = emc_situ(gt[i], up[i], beta, inv, lin_beta, lin_inv);
}

__global__ void k_sigmoid_mul(float *x, const float *gt, int64_t count) {
    emc_kernel_begin();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) x[i] *= emc_sigmoid(gt[i]);
}

extern "C" int em_gpu_situ(em_gpu *g, const float *d_gate, const float *d_up, int64_t count, float beta, float lin_beta,
                           float *d_y, em_err *err) {
    EMC_CHECK(d_gate && d_up && d_y && count >= 0, "GPU situ: missing buffer or %lld values", (long long)count);
    EMC_CHECK(beta > 0.0f && isfinite(beta) && !isnan(lin_beta), "GPU situ: beta %g (> 0), lin_beta %g", (double)beta,
              (double)lin_beta);
    int rc = emc_use(g, err);
    if (rc || count == 0) return rc;
    const mm_glu a = mm_glu_of(EM_GPU_ACT_SITU, beta, lin_beta); /* the reciprocals, rounded once */
    emc_launch(g, k_situ, emc_blocks(count, 256), 256, 0, d_gate, d_up, count, beta, a.inv, lin_beta, a.lin_inv, d_y);
    return emc_launched(err, "k_situ");
}

extern "C" int em_gpu_sigmoid_mul(em_gpu *g, float *d_x, const float *d_gate, int64_t count, em_err *err) {
    EMC_CHECK(d_x && d_gate && count >= 0, "GPU sigmoid_mul: missing buffer or %lld values", (long long)count);
    int rc = emc_use(g, err);
    if (rc || count == 0) return rc;
    emc_launch(g, k_sigmoid_mul, emc_blocks(count, 256), 256, 0, d_x, d_gate, count);
    return emc_launched(err, "k_sigmoid_mul");
}

/* ---- AttnRes mix (model/attnres.c's kimi_res_input) ---------------------------------------- */

#define RES_THREADS 256
#define RES_MAX_BANK 255

/* The block's sums of squares and dots with w of row r (E values): thread t takes values
 * t, t + 256, ... in double; the 256 partials meet in a fixed tree. Returns res_score. */
__device__ float res_score(const float *r, const float *w, int64_t E, float eps, double *ss, double *dt) {
    double a = 0.0, b = 0.0;
    for (int64_t d = threadIdx.x; d < E; d += RES_THREADS) {
        a += (double)r[d] * (double)r[d];
        b += (double)r[d] * (double)w[d];
    }
    ss[threadIdx.x] = a, dt[threadIdx.x] = b;
    __syncthreads();
    for (int h = RES_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) ss[threadIdx.x] += ss[threadIdx.x + h], dt[threadIdx.x] += dt[threadIdx.x + h];
        __syncthreads();
    }
    const float scale = (float)(1.0 / sqrt(ss[0] / (double)E + (double)eps));
    const float score = (float)(dt[0] * (double)scale);
    __syncthreads(); /* ss, dt are reused by the next call */
    return score;
}

/* One block per row t. Scores of the n_bank banked rows and of x, em_softmax over them (by
 * thread 0: exp as (float)exp((double)v), which rounds correctly wherever libm's expf does),
 * then the mix, one thread per column, j ascending. */
__global__ void __launch_bounds__(RES_THREADS) k_res_mix(const float *bank, int nb, int64_t ld_bank, const float *x,
                                                         int64_t ldx, const float *w, int64_t E, float eps, float *out,
                                                         int64_t ldo) {
    emc_kernel_begin();
    __shared__ double ss[RES_THREADS], dt[RES_THREADS];
    __shared__ float p[RES_MAX_BANK + 1];
    const int64_t t = blockIdx.x;
    const float *xr = x + t * ldx;
    float *o = out + t * ldo;
    if (nb == 0) { /* kimi_res_input returns x itself */
        for (int64_t d = threadIdx.x; d < E; d += RES_THREADS) o[d] = xr[d];
        return;
    }
    for (int j = 0; j < nb; j++) {
        const float s = res_score(bank + j * ld_bank + t * E, w, E, eps, ss, dt);
        if (threadIdx.x == 0) p[j] = s;
    }
    const float sx = res_score(xr, w, E, eps, ss, dt);
    if (threadIdx.x == 0) {
        p[nb] = sx;
        float mx = p[0];
        for (int j = 1; j <= nb; j++)
            if (p[j] > mx) mx = p[j];
        double sum = 0.0;
        for (int j = 0; j <= nb; j++) {
            p[j] = (float)exp((double)(p[j] - mx));
            sum += p[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j <= nb; j++) p[j] *= inv;
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < E; d += RES_THREADS) {
        float acc = 0.0f;
        for (int j = 0; j < nb; j++) acc += p[j] * bank[j * ld_bank + t * E + d];
        o[d] = acc + p[nb] * xr[d];
    }
}

extern "C" int em_gpu_res_mix(em_gpu *g, const float *d_bank, int n_bank, int64_t ld_bank, const float *d_x, int64_t ldx,
                              const float *d_w, int64_t E, float eps, int rows, float *d_out, int64_t ldo, em_err *err) {
    EMC_CHECK(n_bank >= 0 && n_bank <= RES_MAX_BANK, "GPU res_mix: %d banked rows (0..%d)", n_bank, RES_MAX_BANK);
    EMC_CHECK(E > 0 && rows >= 0 && d_x && d_out && ldx >= E && ldo >= E,
              "GPU res_mix: %d rows of %lld (ldx %lld, ldo %lld), or missing x/out", rows, (long long)E, (long long)ldx,
              (long long)ldo);
    EMC_CHECK(n_bank == 0 || (d_bank && d_w && ld_bank >= (int64_t)rows * E),
              "GPU res_mix: %d banks need the bank and w, with ld_bank %lld >= rows * E = %lld", n_bank, (long long)ld_bank,
              (long long)rows * E);
    int rc = emc_use(g, err);
    if (rc || rows == 0) return rc;
    emc_launch(g, k_res_mix, rows, RES_THREADS, 0, d_bank, n_bank, ld_bank, d_x, ldx, d_w, E, eps, d_out, ldo);
    return emc_launched(err, "k_res_mix");
}

/* ---- embedding gather ---------------------------------------------------------------------- */

/* Block (column chunk, row j). Values as quant/'s to_float: F16/BF16 widened, Q8_0 q * d,
 * the K types and MXFP4 above. */
__global__ void k_embed(int type, const void *data, const __half *scales, int64_t rows, int64_t cols, const int32_t *tok,
                        float *y, int64_t ldy) {
    emc_kernel_begin();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const int32_t t = tok[blockIdx.y];
    float *yr = y + (int64_t)blockIdx.y * ldy;
    if (t < 0 || t >= rows) {
        yr[i] = __int_as_float(0x7fc00000); /* a bad id shows as NaN, never as a stray read */
        return;
    }
    yr[i] = emc_table_value(type, data, scales, rows, cols, t, i);
}

extern "C" int em_gpu_embed(em_gpu *g, const em_gpu_mat *table, const int32_t *d_tok, int n, float *d_y, int64_t ldy,
                            em_err *err) {
    EMC_CHECK(table && table->data && em_gpu_mat_type_ok(table->type), "GPU embed: no table, or one of an unsupported type");
    EMC_CHECK(d_tok && d_y && n >= 0 && n <= 65535 && ldy >= table->cols, "GPU embed: %d rows, ldy %lld for %lld columns", n,
              (long long)ldy, (long long)table->cols);
    int rc = emc_use(g, err);
    if (rc || n == 0) return rc;
    dim3 grid(emc_blocks(table->cols, 256), (unsigned)n);
    emc_launch(g, k_embed, grid, 256, 0, table->type, table->data, (const __half *)table->scales, table->rows, table->cols,
                                         d_tok, d_y, ldy);
    return emc_launched(err, "k_embed");
}

/* ---- argmax ---------------------------------------------------------------------------------- */

#define ARGMAX_THREADS 1024

__global__ void k_argmax(const float *x, int64_t ldx, int64_t n, int32_t *out) {
    emc_kernel_begin();
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int si[ARGMAX_THREADS];
    const float *xr = x + blockIdx.x * ldx;
    float bv = 0.0f;
    int bi = -1;
    for (int64_t i0 = threadIdx.x; i0 < n; i0 += 8 * ARGMAX_THREADS) { /* 8 loads issued together */
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = i0 + u * ARGMAX_THREADS < n ? xr[i0 + u * ARGMAX_THREADS] : NAN;
#pragma unroll
        for (int u = 0; u < 8; u++) /* ascending: strict > keeps the lowest */
            if (!isnan(v[u]) && (bi < 0 || v[u] > bv)) bv = v[u], bi = (int)(i0 + u * ARGMAX_THREADS);
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    am_block_best(sv, si, ARGMAX_THREADS);
    if (threadIdx.x == 0) out[blockIdx.x] = si[0];
}

extern "C" int em_gpu_argmax_rows(em_gpu *g, const float *d_x, int64_t ldx, int rows, int64_t n, int32_t *d_out,
                                  em_err *err) {
    EMC_CHECK(d_x && d_out && rows >= 0 && n > 0 && n <= INT32_MAX && ldx >= n, "GPU argmax: %d rows of %lld (ldx %lld)",
              rows, (long long)n, (long long)ldx);
    int rc = emc_use(g, err);
    if (rc || rows == 0) return rc;
    emc_launch(g, k_argmax, rows, ARGMAX_THREADS, 0, d_x, ldx, n, d_out);
    return emc_launched(err, "k_argmax");
}

/* ---- RoPE ------------------------------------------------------------------------------------ */

/* One thread per (row, head, pair i < dims/2): em_rope_cos_sin then em_rope_apply. */
__global__ void k_rope(float *x, int64_t ldx, int n_heads, int64_t head_stride, int half, const int32_t *pos,
                       const double *inv_freq, double attn_factor, int64_t total) {
    emc_kernel_begin();
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    const int i = (int)(t % half);
    const int64_t h = (t / half) % n_heads, j = t / half / n_heads;
    const double a = (double)pos[j] * inv_freq[i];
    const float c = (float)(cos(a) * attn_factor), s = (float)(sin(a) * attn_factor);
    float *v = x + j * ldx + h * head_stride;
    const float p = v[i], q = v[i + half];
    v[i] = p * c - q * s;
    v[i + half] = q * c + p * s;
}

extern "C" int em_gpu_rope_rows(em_gpu *g, float *d_x, int64_t ldx, int rows, int n_heads, int64_t head_stride, int dims,
                                const int32_t *d_pos, const double *d_inv_freq, double attn_factor, em_err *err) {
    EMC_CHECK(d_x && d_pos && d_inv_freq && rows >= 0 && n_heads > 0 && dims > 0 && dims % 2 == 0 && head_stride >= dims,
              "GPU rope: %d rows, %d heads of stride %lld, %d dims", rows, n_heads, (long long)head_stride, dims);
    int rc = emc_use(g, err);
    if (rc || rows == 0) return rc;
    const int64_t total = (int64_t)rows * n_heads * (dims / 2);
    emc_launch(g, k_rope, emc_blocks(total, 256), 256, 0, d_x, ldx, n_heads, head_stride, dims / 2, d_pos, d_inv_freq,
                                                         attn_factor, total);
    return emc_launched(err, "k_rope");
}

/* ---- MoE router -------------------------------------------------------------------------- */

#define ROUTE_MAX_EXPERTS 1024
#define ROUTE_MAX_K 32

/* take_max of model/moe.c by one warp over values in shared memory (the group scores): the
 * largest not-taken value (lowest index on ties), each lane's best of values lane, lane + 32,
 * ..., then the lanes' bests in a butterfly under the same order; marks it taken. */
__device__ int route_take_max_shared(const float *v, unsigned char *taken, int n) {
    const int lane = threadIdx.x & 31;
    float bv = 0.0f;
    int bi = -1;
    for (int i = lane; i < n; i += 32)
        if (!taken[i] && (bi < 0 || v[i] > bv)) bv = v[i], bi = i;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    __syncwarp();
    if (lane == 0 && bi >= 0) taken[bi] = 1;
    __syncwarp();
    return bi;
}

/* A score as a selection key: unsigned order is the scores' float order (NaN counts as -inf,
 * -0 as +0, so that equal keys are equal scores); every key is above 0, which means none. */
__device__ __forceinline__ uint32_t route_key(float v) {
    v = v != v ? -INFINITY : v == 0.0f ? 0.0f : v;
    const uint32_t b = __float_as_uint(v);
    return b >> 31 ? ~b : b | 0x80000000u;
}

/* The same selection over a row held as keys in registers: expert lane + 32 p in key[p], a
 * taken bit per p. Each lane's best (ties: its lowest expert), then the warp's largest key and,
 * among the lanes holding it, the lowest expert, each by one warp reduction (redux.sync); the
 * owner marks it. Every lane gets the index (-1 when every expert is taken) and, in *val, the
 * chosen expert's s[p] (0 for none). */
template <int P>
__device__ __forceinline__ int route_take_max(const uint32_t (&key)[P], const float (&s)[P], uint32_t &taken, int lane,
                                              float *val) {
    uint32_t bk = 0;
    int bi = -1;
    float bs = 0.0f;
#pragma unroll
    for (int p = 0; p < P; p++)
        if (!(taken >> p & 1u) && key[p] > bk) bk = key[p], bi = lane + 32 * p, bs = s[p];
    const uint32_t top = __reduce_max_sync(0xffffffffu, bk);
    if (top == 0) {
        *val = 0.0f;
        return -1;
    }
    const int b = (int)__reduce_min_sync(0xffffffffu, bk == top ? (uint32_t)bi : 0xffffffffu);
    if ((b & 31) == lane) taken |= 1u << (b >> 5);
    *val = __shfl_sync(0xffffffffu, bs, b & 31);
    return b;
}

/* One warp per row, the row in registers (P = ceil(n_expert / 32) values a lane): a selection
 * is a pass over a lane's keys and two warp reductions, with no memory traffic (only the group
 * scores, when there are groups, go through shared memory). Lane i ends with the i-th choice. */
template <int P>
__global__ void __launch_bounds__(32) k_route(em_gpu_router r, const float *logits, int64_t ldl, const float *bias,
                                              int32_t *ids, float *wts) {
    emc_kernel_begin();
    const int X = r.n_expert, G = r.n_group, lane = threadIdx.x;
    const float *lr = logits + blockIdx.x * ldl;
    float s[P], c[P];
    uint32_t taken = 0; /* experts past X count as taken */
#pragma unroll
    for (int p = 0; p < P; p++) {
        const int e = lane + 32 * p;
        s[p] = e < X ? emc_sigmoid(lr[e]) : 0.0f;
        c[p] = e < X ? s[p] + bias[e] : 0.0f;
        if (e >= X) taken |= 1u << p;
    }
    if (G > 1) {
        __shared__ float choice[ROUTE_MAX_EXPERTS], gscore[ROUTE_MAX_EXPERTS];
        __shared__ unsigned char gtaken[ROUTE_MAX_EXPERTS];
        const int per = X / G;
#pragma unroll
        for (int p = 0; p < P; p++)
            if (lane + 32 * p < X) choice[lane + 32 * p] = c[p];
        for (int gi = lane; gi < G; gi += 32) gtaken[gi] = 0;
        __syncwarp();
        /* one lane per group: the sum of its two best choices, take_max's order */
        for (int gi = lane; gi < G; gi += 32) {
            const float *cg = choice + gi * per;
            int b0 = -1, b1 = -1;
            for (int i = 0; i < per; i++)
                if (b0 < 0 || cg[i] > cg[b0]) b0 = i;
            for (int i = 0; i < per; i++)
                if (i != b0 && (b1 < 0 || cg[i] > cg[b1])) b1 = i;
            gscore[gi] = per > 1 ? cg[b0] + cg[b1] : cg[b0];
        }
        __syncwarp();
        for (int i = 0; i < r.n_group_used; i++) route_take_max_shared(gscore, gtaken, G);
#pragma unroll
        for (int p = 0; p < P; p++) /* experts of the losing groups cannot be chosen */
            if (lane + 32 * p < X && !gtaken[(lane + 32 * p) / per]) c[p] = -INFINITY;
    }
    uint32_t key[P];
#pragma unroll
    for (int p = 0; p < P; p++) key[p] = route_key(c[p]);
    int mine = -1;
    float w = 0.0f;
    for (int i = 0; i < r.k; i++) {
        float sb;
        const int b = route_take_max(key, s, taken, lane, &sb);
        if (lane == i) mine = b, w = sb;
    }
    double sum = 0.0; /* in selection order, in double, as model/moe.c */
    for (int i = 0; i < r.k; i++) sum += (double)__shfl_sync(0xffffffffu, w, i);
    if (lane < r.k) {
        if (r.norm) w = (float)(w / (sum + 1e-20));
        w *= r.scale;
        ids[blockIdx.x * r.k + lane] = mine;
        wts[blockIdx.x * r.k + lane] = w;
    }
}

extern "C" int em_gpu_route(em_gpu *g, const em_gpu_router *r, const float *d_logits, int64_t ldl, const float *d_bias,
                            int rows, int32_t *d_ids, float *d_wts, em_err *err) {
    EMC_CHECK(r && r->n_expert > 0 && r->n_expert <= ROUTE_MAX_EXPERTS && r->k > 0 && r->k <= ROUTE_MAX_K &&
                  r->k <= r->n_expert,
              "GPU router: %d experts, top-%d (at most %d experts, k <= %d)", r ? r->n_expert : 0, r ? r->k : 0,
              ROUTE_MAX_EXPERTS, ROUTE_MAX_K);
    EMC_CHECK(r->n_group >= 1 && r->n_expert % r->n_group == 0 && r->n_group_used >= 1 && r->n_group_used <= r->n_group &&
                  (r->n_group == 1 || r->n_group_used * (r->n_expert / r->n_group) >= r->k),
              "GPU router: %d groups, %d used, for %d experts top-%d", r->n_group, r->n_group_used, r->n_expert, r->k);
    EMC_CHECK(d_logits && d_bias && d_ids && d_wts && rows >= 0 && ldl >= r->n_expert, "GPU router: %d rows (ldl %lld)",
              rows, (long long)ldl);
    int rc = emc_use(g, err);
    if (rc || rows == 0) return rc;
    const int X = r->n_expert;
    if (X <= 128) emc_launch(g, k_route<4>, rows, 32, 0, *r, d_logits, ldl, d_bias, d_ids, d_wts);
    else if (X <= 256) emc_launch(g, k_route<8>, rows, 32, 0, *r, d_logits, ldl, d_bias, d_ids, d_wts);
    else if (X <= 512) emc_launch(g, k_route<16>, rows, 32, 0, *r, d_logits, ldl, d_bias, d_ids, d_wts);
    else emc_launch(g, k_route<32>, rows, 32, 0, *r, d_logits, ldl, d_bias, d_ids, d_wts);
    return emc_launched(err, "k_route");
}
