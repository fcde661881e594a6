/* backend/cuda/mla.cu: MLA's latent cache and absorbed attention on the device (gpu.h, "MLA"),
 * model/mla.c's twin for what happens between the absorbed queries and the contexts (the
 * W_UK / W_UV products are em_gpu_matmul's). One block per (query row, head): scores over the
 * cache in em_dot_rows' lane order (16 fma chains, halves 16 -> 1), the max, exp by
 * em_expf_poly's polynomial, the sum in double (a fixed tree: the CPU's is sequential, so the
 * normalizer can differ by an ulp in rare cases), the context by fma over u ascending as
 * em_weighted_rows. A row depends only on its query, its position and the cache: width
 * invariance by construction. Positions are read on the device, launch shapes depend only on
 * n and the capacity (graph capture). */
#include "backend/cuda/cuda_impl.cuh"

#include <math.h>

#define MLA_THREADS 256
#define MLA_MAX_C 1024 /* kv_lora + rope floats of one cache row in shared memory */

/* Block j: cache row pos + j = [c * scale * w | k_pe]; the RMSNorm as k_rmsnorm (double sums,
 * fixed tree, the scale rounded once). */
__global__ void k_mla_append(em_gpu_mla_dims d, float *cache, const int32_t *pos, const float *lat, int64_t ldl,
                             const float *w, float eps) {
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

/* Block (row t, head h). sc: this (t, h)'s scores, capacity floats. */
__global__ void k_mla_attend(em_gpu_mla_dims d, const float *cache, const int32_t *pos, const float *qa, int64_t ldq,
                             float *scratch, float *ctx, int64_t ldc) {
    __shared__ float q[MLA_MAX_C];
    __shared__ double dred[MLA_THREADS];
    __shared__ float fred[MLA_THREADS];
    const int t = blockIdx.x, h = blockIdx.y, C = d.kv_lora + d.rope;
    const int64_t p = (int64_t)pos[0] + t, len = p + 1;
    float *y = ctx + (int64_t)t * ldc + (int64_t)h * d.kv_lora;
    if (p < 0 || p >= d.capacity) { /* a bad position shows as NaN, never as a stray read */
        for (int i = threadIdx.x; i < d.kv_lora; i += MLA_THREADS) y[i] = __int_as_float(0x7fc00000);
        return;
    }
    float *sc = scratch + ((int64_t)t * d.n_head + h) * d.capacity;
    const float *qr = qa + (int64_t)t * ldq + (int64_t)h * C;
    for (int i = threadIdx.x; i < C; i += MLA_THREADS) q[i] = qr[i];
    __syncthreads();
    const float scale = (float)(1.0 / sqrt((double)(d.nope + d.rope)));
    float mx = -__int_as_float(0x7f800000);
    for (int64_t u = threadIdx.x; u < len; u += MLA_THREADS) {
        const float *x = cache + u * C;
        float acc[16];
#pragma unroll
        for (int l = 0; l < 16; l++) acc[l] = 0.0f;
        for (int k = 0; k < C; k += 16) {
#pragma unroll
            for (int l = 0; l < 16; l++) acc[l] = k + l < C ? fmaf(x[k + l], q[k + l], acc[l]) : fmaf(0.0f, 0.0f, acc[l]);
        }
#pragma unroll
        for (int w = 8; w >= 1; w /= 2)
#pragma unroll
            for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
        const float s = acc[0] * scale;
        sc[u] = s;
        mx = s > mx ? s : mx;
    }
    fred[threadIdx.x] = mx;
    __syncthreads();
    for (int w = MLA_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) fred[threadIdx.x] = fred[threadIdx.x + w] > fred[threadIdx.x] ? fred[threadIdx.x + w] : fred[threadIdx.x];
        __syncthreads();
    }
    mx = fred[0];
    double sum = 0.0;
    for (int64_t u = threadIdx.x; u < len; u += MLA_THREADS) {
        const float e = mla_expf_poly(sc[u] - mx);
        sc[u] = e;
        sum += e;
    }
    dred[threadIdx.x] = sum;
    __syncthreads();
    for (int w = MLA_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) dred[threadIdx.x] += dred[threadIdx.x + w];
        __syncthreads();
    }
    const float inv = (float)(1.0 / dred[0]);
    for (int64_t u = threadIdx.x; u < len; u += MLA_THREADS) sc[u] = sc[u] * inv;
    __syncthreads();
    for (int i = threadIdx.x; i < d.kv_lora; i += MLA_THREADS) {
        float acc = 0.0f;
        for (int64_t u = 0; u < len; u++) acc = fmaf(sc[u], cache[u * C + i], acc);
        y[i] = acc;
    }
}

static int mla_check(const em_gpu_mla_dims *d, em_err *err) {
    EMC_CHECK(d && d->n_head >= 1 && d->n_head <= 65535 && d->kv_lora >= 1 && d->rope >= 0 && d->nope >= 0 &&
                  d->kv_lora + d->rope <= MLA_MAX_C && d->nope + d->rope > 0 && d->capacity >= 1 &&
                  d->capacity <= ((int64_t)1 << 31),
              "GPU mla: dims (heads %d, kv_lora %d, rope %d, nope %d, capacity %lld) unusable (row at most %d floats)",
              d ? d->n_head : 0, d ? d->kv_lora : 0, d ? d->rope : 0, d ? d->nope : 0, d ? (long long)d->capacity : 0LL,
              MLA_MAX_C);
    return EM_OK;
}

extern "C" uint64_t em_gpu_mla_scratch_floats(const em_gpu_mla_dims *d, int n) {
    if (mla_check(d, NULL) || n < 1 || n > EM_GPU_MAX_ROWS) return 0;
    return (uint64_t)n * (uint64_t)d->n_head * (uint64_t)d->capacity;
}

extern "C" int em_gpu_mla_append(em_gpu *g, const em_gpu_mla_dims *d, float *d_cache, const int32_t *d_pos, int n,
                                 const float *d_lat, int64_t ldl, const float *d_norm_w, float eps, em_err *err) {
    int rc = mla_check(d, err);
    if (rc) return rc;
    EMC_CHECK(d_cache && d_pos && (n == 0 || d_lat) && n >= 0 && n <= EM_GPU_MAX_ROWS && ldl >= d->kv_lora + d->rope,
              "GPU mla append: %d rows (ldl %lld) or a missing buffer", n, (long long)ldl);
    if ((rc = emc_use(g, err)) || n == 0) return rc;
    k_mla_append<<<n, MLA_THREADS, 0, g->stream>>>(*d, d_cache, d_pos, d_lat, ldl, d_norm_w, eps);
    return emc_launched(err, "k_mla_append");
}

extern "C" int em_gpu_mla_attend(em_gpu *g, const em_gpu_mla_dims *d, const float *d_cache, const int32_t *d_pos, int n,
                                 const float *d_qa, int64_t ldq, float *d_scratch, float *d_ctx, int64_t ldc, em_err *err) {
    int rc = mla_check(d, err);
    if (rc) return rc;
    const int64_t C = d->kv_lora + d->rope;
    EMC_CHECK(d_cache && d_pos && d_scratch && (n == 0 || (d_qa && d_ctx)) && n >= 0 && n <= EM_GPU_MAX_ROWS &&
                  ldq >= d->n_head * C && ldc >= (int64_t)d->n_head * d->kv_lora,
              "GPU mla attend: %d rows (ldq %lld, ldc %lld) or a missing buffer", n, (long long)ldq, (long long)ldc);
    if ((rc = emc_use(g, err)) || n == 0) return rc;
    k_mla_attend<<<dim3((unsigned)n, (unsigned)d->n_head), MLA_THREADS, 0, g->stream>>>(*d, d_cache, d_pos, d_qa, ldq,
                                                                                         d_scratch, d_ctx, ldc);
    return emc_launched(err, "k_mla_attend");
}
