/* backend/cuda/matmul.cu: weight matrices in device layouts (upload, Q8_0 repack), activation
 * preparation (Q8_0 quantization exactly as quant/'s em_quant_q8_0), and the multi-row
 * matrix-vector products y[j][r] = W[r, :] . x[j] for j < n <= 16.
 *
 * Invariants (docs/cuda.md, "width invariance"):
 * - one warp computes one output r for all n rows; lane l owns the same column pieces
 *   (l, l + 32, ...) whatever n is; per lane every row's sum is its own chain of explicitly
 *   rounded operations (__fmul_rn, __fadd_rn, __fmaf_rn: nothing left for the compiler to
 *   contract differently in another instantiation); the 32 lane sums meet in one fixed
 *   butterfly (xor 16, 8, 4, 2, 1). So row j's result is the same bits for every n.
 * - each weight byte is read once per call, by one lane, in 16-byte loads that bypass L1
 *   (ld.global.nc: weights are read-only while a pass runs); activations are re-read per
 *   warp and come from L1/L2.
 * - the kernels are instantiated for N in {1, 2, 4, 8, 16} rows; a call of n rows uses the
 *   smallest N >= n, and rows j >= n are skipped (not computed, not written). */
#include "backend/cuda/cuda_impl.cuh"

#include <string.h>

#define MM_WARPS 8 /* warps (outputs) per block of 256 threads */

/* ---- upload and repack ------------------------------------------------------------------ */

/* GGUF Q8_0 blocks (fp16 d, 32 int8 quants; 34 bytes, 2-byte aligned) of `rows` rows into
 * quants [rows][cols] and scales [rows][cols/32]. One thread per block. */
__global__ void k_repack_q8_0(const uint8_t *src, int64_t n_blocks, int64_t blocks_per_row, int8_t *qs, __half *d) {
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint16_t *s = (const uint16_t *)(src + b * 34);
    uint16_t h = s[0];
    uint32_t w[8];
    for (int i = 0; i < 8; i++) w[i] = (uint32_t)s[1 + 2 * i] | ((uint32_t)s[2 + 2 * i] << 16);
    int4 *q = (int4 *)(qs + b * 32);
    q[0] = make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
    q[1] = make_int4((int)w[4], (int)w[5], (int)w[6], (int)w[7]);
    d[b] = __ushort_as_half(h);
    (void)blocks_per_row;
}

extern "C" int em_gpu_mat_upload(em_gpu *g, int type, int64_t rows, int64_t cols, const void *host,
                                 const char *name, em_gpu_mat *out, em_err *err) {
    memset(out, 0, sizeof *out);
    const char *nm = name ? name : "matrix";
    uint64_t bytes = 0;
    int rc = em_gpu_mat_bytes(type, rows, cols, &bytes, err);
    if (rc) return em_err_prefix(err, "%s", nm);
    if (!host) return em_err_set(err, EM_EINVAL, "%s: no host data", nm);
    if ((type == EM_TYPE_F32 && cols % 4) || ((type == EM_TYPE_F16 || type == EM_TYPE_BF16) && cols % 8))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: %lld columns of %s; the GPU products need 16-byte rows", nm,
                          (long long)cols, em_type_name(type));
    out->type = type;
    out->rows = rows;
    out->cols = cols;
    if (type != EM_TYPE_Q8_0) {
        if ((rc = em_gpu_alloc(g, bytes, nm, &out->data, err))) return rc;
        if ((rc = em_gpu_upload(g, out->data, host, bytes, err))) {
            em_gpu_mat_free(g, out);
            return em_err_prefix(err, "%s", nm);
        }
        out->bytes = bytes;
        return 0;
    }
    const int64_t bpr = cols / 32;
    if ((rc = em_gpu_alloc(g, (uint64_t)rows * (uint64_t)cols, nm, &out->data, err)) ||
        (rc = em_gpu_alloc(g, (uint64_t)rows * (uint64_t)bpr * 2, nm, &out->scales, err))) {
        em_gpu_mat_free(g, out);
        return rc;
    }
    out->bytes = bytes;
    /* staging: whole rows, at most 64 MiB at a time (at least one row) */
    const uint64_t row_bytes = (uint64_t)bpr * 34;
    int64_t chunk = (int64_t)((64ull << 20) / row_bytes);
    if (chunk < 1) chunk = 1;
    if (chunk > rows) chunk = rows;
    void *stage = NULL;
    if ((rc = em_gpu_alloc(g, (uint64_t)chunk * row_bytes, "upload staging buffer", &stage, err))) {
        em_gpu_mat_free(g, out);
        return em_err_prefix(err, "%s", nm);
    }
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += chunk) {
        const int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        rc = em_gpu_upload(g, stage, (const uint8_t *)host + (uint64_t)r0 * row_bytes, (uint64_t)nr * row_bytes, err);
        if (rc) break;
        const int64_t nb = nr * bpr;
        k_repack_q8_0<<<emc_blocks(nb, 256), 256, 0, g->stream>>>((const uint8_t *)stage, nb, bpr,
                                                                  (int8_t *)out->data + r0 * cols,
                                                                  (__half *)out->scales + r0 * bpr);
        rc = emc_launched(err, "k_repack_q8_0");
        /* the next upload into stage is ordered after the kernel (same stream, and the upload syncs) */
    }
    if (!rc) rc = em_gpu_sync(g, err);
    em_gpu_free(g, stage);
    if (rc) {
        em_gpu_mat_free(g, out);
        return em_err_prefix(err, "%s", nm);
    }
    return 0;
}

extern "C" void em_gpu_mat_free(em_gpu *g, em_gpu_mat *m) {
    if (!m) return;
    em_gpu_free(g, m->data);
    em_gpu_free(g, m->scales);
    memset(m, 0, sizeof *m);
}

/* ---- activations ---------------------------------------------------------------------- */

/* One warp per 32-value block; lane l quantizes value l. em_quant_q8_0: amax, d = amax / 127,
 * id = 1 / d (0 when d is 0), q = trunc(roundf(x * id)), the fp16-rounded d kept (as float). */
__global__ void k_quant_q8_0(const float *x, int64_t ldx, int64_t cols, int n, int8_t *qs, float *d) {
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t bpr = cols / 32;
    if (warp >= (int64_t)n * bpr) return;
    const int64_t j = warp / bpr, b = warp % bpr;
    const float v = x[j * ldx + b * 32 + lane];
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float dd = __fdiv_rn(amax, 127.0f);
    const float id = dd != 0.0f ? __fdiv_rn(1.0f, dd) : 0.0f;
    const float r = roundf(__fmul_rn(v, id));
    qs[j * cols + b * 32 + lane] = (int8_t)(r > -2147483904.0f && r < 2147483648.0f ? (int32_t)r : INT32_MIN);
    if (lane == 0) d[j * bpr + b] = __half2float(__float2half_rn(dd));
}

extern "C" int em_gpu_act_prepare(em_gpu *g, int wtype, const float *d_x, int64_t ldx, int64_t cols, int n,
                                  void *d_scratch, em_gpu_act *out, em_err *err) {
    memset(out, 0, sizeof *out);
    EMC_CHECK(n >= 1 && n <= EM_GPU_MAX_ROWS, "GPU activations: %d rows (1..%d)", n, EM_GPU_MAX_ROWS);
    EMC_CHECK(cols > 0 && ldx >= cols && d_x, "GPU activations: %lld columns, ldx %lld", (long long)cols, (long long)ldx);
    EMC_CHECK(em_gpu_mat_type_ok(wtype), "GPU activations for weights of type %s", em_type_name(wtype));
    out->n = n;
    out->cols = cols;
    out->x = d_x;
    out->ldx = ldx;
    if (wtype != EM_TYPE_Q8_0) {
        out->type = EM_TYPE_F32;
        return 0;
    }
    EMC_CHECK(cols % 32 == 0, "GPU Q8_0 activations: %lld columns, not a multiple of 32", (long long)cols);
    EMC_CHECK(d_scratch && ((uintptr_t)d_scratch & 15) == 0, "GPU Q8_0 activations: scratch missing or not 16-byte aligned");
    int rc = emc_use(g, err);
    if (rc) return rc;
    const uint64_t qbytes = ((uint64_t)n * (uint64_t)cols + 15) & ~(uint64_t)15;
    out->type = EM_TYPE_Q8_0;
    out->qs = (const int8_t *)d_scratch;
    out->d = (const float *)((uint8_t *)d_scratch + qbytes);
    const int64_t warps = (int64_t)n * (cols / 32);
    k_quant_q8_0<<<emc_blocks(warps * 32, 256), 256, 0, g->stream>>>(d_x, ldx, cols, n, (int8_t *)out->qs,
                                                                     (float *)out->d);
    return emc_launched(err, "k_quant_q8_0");
}

/* ---- products ---------------------------------------------------------------------------- */

__device__ __forceinline__ int4 ld_nc16(const void *p) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* The fixed butterfly: every lane ends with the same sum, in the same order for every row. */
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int N>
__device__ __forceinline__ void store_rows(const float (&acc)[N], int n, int lane, float *y, int64_t ldy, int64_t r) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        if (j >= n) break;
        const float s = warp_sum(acc[j]);
        if (lane == 0) y[j * ldy + r] = s;
    }
}

/* Q8_0 weights x Q8_0 activations: lane l takes blocks l, l + 32, ...; per block an exact
 * integer dot (dp4a), then sum += (d_w * d_a) * isum, as quant/'s scalar kernel. */
template <int N>
__global__ void __launch_bounds__(MM_WARPS * 32) k_mm_q8_0(const int8_t *wq, const __half *wd, int64_t rows, int64_t cols,
                                                          const int8_t *xq, const float *xd, int n, float *y,
                                                          int64_t ldy) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int64_t bpr = cols / 32;
    const int8_t *w = wq + r * cols;
    const __half *dw = wd + r * bpr;
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++) acc[j] = 0.0f;
    int64_t b = lane;
    /* two blocks per lane per step: four 16-byte loads in flight before their first use */
    for (; b + 32 < bpr; b += 64) {
        const int4 w0 = ld_nc16(w + b * 32), w1 = ld_nc16(w + b * 32 + 16);
        const int4 w2 = ld_nc16(w + (b + 32) * 32), w3 = ld_nc16(w + (b + 32) * 32 + 16);
        const float s0 = __half2float(dw[b]), s1 = __half2float(dw[b + 32]);
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            const int4 *xa = (const int4 *)(xq + j * cols + b * 32);
            const int4 *xb = (const int4 *)(xq + j * cols + (b + 32) * 32);
            const int4 a0 = xa[0], a1 = xa[1], c0 = xb[0], c1 = xb[1];
            int i0 = __dp4a(w0.x, a0.x, 0);
            i0 = __dp4a(w0.y, a0.y, i0); i0 = __dp4a(w0.z, a0.z, i0); i0 = __dp4a(w0.w, a0.w, i0);
            i0 = __dp4a(w1.x, a1.x, i0); i0 = __dp4a(w1.y, a1.y, i0); i0 = __dp4a(w1.z, a1.z, i0); i0 = __dp4a(w1.w, a1.w, i0);
            int i1 = __dp4a(w2.x, c0.x, 0);
            i1 = __dp4a(w2.y, c0.y, i1); i1 = __dp4a(w2.z, c0.z, i1); i1 = __dp4a(w2.w, c0.w, i1);
            i1 = __dp4a(w3.x, c1.x, i1); i1 = __dp4a(w3.y, c1.y, i1); i1 = __dp4a(w3.z, c1.z, i1); i1 = __dp4a(w3.w, c1.w, i1);
            acc[j] = __fadd_rn(acc[j], __fmul_rn(__fmul_rn(s0, xd[j * bpr + b]), (float)i0));
            acc[j] = __fadd_rn(acc[j], __fmul_rn(__fmul_rn(s1, xd[j * bpr + b + 32]), (float)i1));
        }
    }
    for (; b < bpr; b += 32) {
        const int4 w0 = ld_nc16(w + b * 32), w1 = ld_nc16(w + b * 32 + 16);
        const float s0 = __half2float(dw[b]);
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            const int4 *xa = (const int4 *)(xq + j * cols + b * 32);
            const int4 a0 = xa[0], a1 = xa[1];
            int i0 = __dp4a(w0.x, a0.x, 0);
            i0 = __dp4a(w0.y, a0.y, i0); i0 = __dp4a(w0.z, a0.z, i0); i0 = __dp4a(w0.w, a0.w, i0);
            i0 = __dp4a(w1.x, a1.x, i0); i0 = __dp4a(w1.y, a1.y, i0); i0 = __dp4a(w1.z, a1.z, i0); i0 = __dp4a(w1.w, a1.w, i0);
            acc[j] = __fadd_rn(acc[j], __fmul_rn(__fmul_rn(s0, xd[j * bpr + b]), (float)i0));
        }
    }
    store_rows<N>(acc, n, lane, y, ldy, r);
}

/* 16 bytes of weights as floats: 4 F32, or 8 F16 / BF16 values. */
template <int T> struct wpiece;
template <> struct wpiece<EM_TYPE_F32> {
    static constexpr int V = 4;
    static __device__ __forceinline__ void get(int4 p, float (&f)[8]) {
        f[0] = __int_as_float(p.x), f[1] = __int_as_float(p.y), f[2] = __int_as_float(p.z), f[3] = __int_as_float(p.w);
    }
};
template <> struct wpiece<EM_TYPE_F16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ void get(int4 p, float (&f)[8]) {
        const uint32_t u[4] = { (uint32_t)p.x, (uint32_t)p.y, (uint32_t)p.z, (uint32_t)p.w };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __half2float(__ushort_as_half((unsigned short)(u[i] & 0xffffu)));
            f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(u[i] >> 16)));
        }
    }
};
template <> struct wpiece<EM_TYPE_BF16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ void get(int4 p, float (&f)[8]) {
        const uint32_t u[4] = { (uint32_t)p.x, (uint32_t)p.y, (uint32_t)p.z, (uint32_t)p.w };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};

/* V activation floats (16-byte aligned) in 16-byte loads. */
template <int V>
__device__ __forceinline__ void load_x(const float *p, float (&v)[8]) {
#pragma unroll
    for (int i = 0; i < V / 4; i++) {
        const float4 t = ((const float4 *)p)[i];
        v[4 * i] = t.x, v[4 * i + 1] = t.y, v[4 * i + 2] = t.z, v[4 * i + 3] = t.w;
    }
}

/* Float weights x F32 activations: lane l takes 16-byte pieces l, l + 32, ...; per piece one
 * fma chain over its values in order. */
template <int T, int N>
__global__ void __launch_bounds__(MM_WARPS * 32) k_mm_float(const uint8_t *wdata, int64_t rows, int64_t cols,
                                                           const float *x, int64_t ldx, int n, float *y, int64_t ldy) {
    constexpr int V = wpiece<T>::V;
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int64_t pieces = cols / V;
    const uint8_t *w = wdata + r * cols * (16 / V);
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++) acc[j] = 0.0f;
    int64_t p = lane;
    for (; p + 32 < pieces; p += 64) {
        const int4 q0 = ld_nc16(w + p * 16), q1 = ld_nc16(w + (p + 32) * 16);
        float f0[8], f1[8];
        wpiece<T>::get(q0, f0);
        wpiece<T>::get(q1, f1);
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            float xa[8], xb[8];
            load_x<V>(x + j * ldx + p * V, xa);
            load_x<V>(x + j * ldx + (p + 32) * V, xb);
            float a = acc[j];
#pragma unroll
            for (int i = 0; i < V; i++) a = __fmaf_rn(f0[i], xa[i], a);
#pragma unroll
            for (int i = 0; i < V; i++) a = __fmaf_rn(f1[i], xb[i], a);
            acc[j] = a;
        }
    }
    for (; p < pieces; p += 32) {
        const int4 q0 = ld_nc16(w + p * 16);
        float f0[8];
        wpiece<T>::get(q0, f0);
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            float xa[8];
            load_x<V>(x + j * ldx + p * V, xa);
            float a = acc[j];
#pragma unroll
            for (int i = 0; i < V; i++) a = __fmaf_rn(f0[i], xa[i], a);
            acc[j] = a;
        }
    }
    store_rows<N>(acc, n, lane, y, ldy, r);
}

template <int N>
static void launch_mm(const em_gpu_mat *w, const em_gpu_act *a, float *y, int64_t ldy, cudaStream_t s) {
    const unsigned grid = emc_blocks(w->rows, MM_WARPS);
    const int th = MM_WARPS * 32;
    switch (w->type) {
    case EM_TYPE_Q8_0:
        k_mm_q8_0<N><<<grid, th, 0, s>>>((const int8_t *)w->data, (const __half *)w->scales, w->rows, w->cols, a->qs,
                                         a->d, a->n, y, ldy);
        break;
    case EM_TYPE_F32:
        k_mm_float<EM_TYPE_F32, N><<<grid, th, 0, s>>>((const uint8_t *)w->data, w->rows, w->cols, a->x, a->ldx, a->n, y, ldy);
        break;
    case EM_TYPE_F16:
        k_mm_float<EM_TYPE_F16, N><<<grid, th, 0, s>>>((const uint8_t *)w->data, w->rows, w->cols, a->x, a->ldx, a->n, y, ldy);
        break;
    case EM_TYPE_BF16:
        k_mm_float<EM_TYPE_BF16, N><<<grid, th, 0, s>>>((const uint8_t *)w->data, w->rows, w->cols, a->x, a->ldx, a->n, y,
                                                        ldy);
        break;
    }
}

extern "C" int em_gpu_matmul(em_gpu *g, const em_gpu_mat *w, const em_gpu_act *act, float *d_y, int64_t ldy,
                             em_err *err) {
    EMC_CHECK(w && w->data && em_gpu_mat_type_ok(w->type), "GPU matmul: no matrix, or one of an unsupported type");
    EMC_CHECK(act && act->n >= 1 && act->n <= EM_GPU_MAX_ROWS, "GPU matmul: activations of %d rows (1..%d)",
              act ? act->n : 0, EM_GPU_MAX_ROWS);
    EMC_CHECK(act->cols == w->cols, "GPU matmul: activations of %lld columns for a matrix of %lld",
              (long long)act->cols, (long long)w->cols);
    const int want = w->type == EM_TYPE_Q8_0 ? EM_TYPE_Q8_0 : EM_TYPE_F32;
    EMC_CHECK(act->type == want, "GPU matmul: %s activations for %s weights (prepare them for this type)",
              em_type_name(act->type), em_type_name(w->type));
    EMC_CHECK(d_y && ldy >= w->rows, "GPU matmul: output missing or ldy %lld < %lld rows", (long long)ldy,
              (long long)w->rows);
    if (want == EM_TYPE_F32)
        EMC_CHECK(((uintptr_t)act->x & 15) == 0 && act->ldx % 4 == 0,
                  "GPU matmul: F32 activations must be 16-byte aligned with ldx a multiple of 4");
    int rc = emc_use(g, err);
    if (rc) return rc;
    const int n = act->n;
    if (n <= 1) launch_mm<1>(w, act, d_y, ldy, g->stream);
    else if (n <= 2) launch_mm<2>(w, act, d_y, ldy, g->stream);
    else if (n <= 4) launch_mm<4>(w, act, d_y, ldy, g->stream);
    else if (n <= 8) launch_mm<8>(w, act, d_y, ldy, g->stream);
    else launch_mm<16>(w, act, d_y, ldy, g->stream);
    return emc_launched(err, "em_gpu_matmul");
}
