/* backend/cuda/mla.cu: MLA's latent cache and absorbed attention on the device (gpu.h, "MLA"),
 * model/mla.c's twin for what happens between the absorbed queries and the contexts (the
 * W_UK / W_UV products are em_gpu_matmul_heads'). Attention is two kernels of flash-decoding's
 * shape: the positions of a row are cut into tiles of 32 and spread over up to 64 blocks a head
 * group ("splits"), each running an online softmax over its tiles with the tile and its heads'
 * queries in shared memory; then a block per row and head merges them (rescaled and summed;
 * the order is written out below, and tests/cuda/test_gpu_seq.c's twin repeats it on the CPU).
 * It replaced three kernels (scores, softmax, a context chain as long as the context,
 * model/mla.c's exact order) whose one-row call took 27 us at context 512 and 94 us at 4096
 * (run 7): one chain per column left most of the GPU idle.
 * Every score, sum and chain is a fixed sequence of IEEE operations that depends only on its
 * query, its length and the cache, never on n: width invariance by construction. Positions are
 * read on the device; launch shapes depend only on n and the dims (graph capture). */
#include "backend/cuda/cuda_impl.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- attention: splits of the positions, then their merge ------------------------------
 *
 * Split s of row t takes the tiles s, s + S, s + 2S, ... (MA_U positions each, below the row's
 * length) for MA_HG heads; per tile:
 * - scores: lane l is position u0 + l, warp w the slice of float4 steps [w KS, (w + 1) KS) of
 *   the (zero-padded) row, one fma chain per head over its slice; the slices meet in ascending
 *   w (from slice 0), then times the scale;
 * - the tile's max by a warp butterfly (exact in any order), m' = max(m, tile max), the
 *   running sums rescaled by a = exp(m - m') (em_expf_poly), p(u) = exp(s(u) - m') (0 past the
 *   length), l = l a + (the tile's p summed by a warp butterfly);
 * - context: acc[i] = acc[i] a, then fma of p(u) c_u[i] for the tile's MA_U positions in
 *   ascending order (positions past the length: p = 0 and a zero row, so acc is unchanged).
 * The merge of row t, head h: M = the max of the splits' m (ascending), w_s = exp(m_s - M),
 * L = fma chain of w_s l_s, ctx[i] = (fma chain of w_s acc_s[i]) / L, s ascending.
 * S = min(MA_SPLITS, tiles of the capacity): where the capacity has fewer tiles than
 * MA_SPLITS each split takes at most one tile either way, so results never depend on the
 * capacity, only on the row's length, its query and the cache. */

#define MA_U 32       /* positions per tile: a lane each */
#define MA_HG 8       /* heads per block: a warp each (scores' slices, the softmax) */
#define MA_THREADS (32 * MA_HG)
#define MA_SPLITS 64  /* blocks over a row's positions, per head group */
#define MA_MAX_J 4    /* context columns per thread: kv_lora <= MA_MAX_J * MA_THREADS */
#define MA_CLUSTER 4  /* head groups sharing a tile's copy in a prompt's chunks (below) */

/* The launch's fixed numbers, made on the host from the dims. */
struct ma_shape {
    int S;      /* splits */
    int Cp;     /* a cache row (and a query) padded with zeros to a multiple of 4 floats */
    int Cs;     /* shared stride of a cache row: Cp, or Cp + 4 so that Cs / 4 is odd (the
                 * 16-byte loads of 8 lanes on 8 rows hit disjoint banks) */
    int KS;     /* float4 steps per warp's slice of a row */
    int64_t ldp; /* floats per (row, head) of the partial sums: S x kv_lora */
};

static ma_shape ma_shape_of(const em_gpu_mla_dims *d) {
    ma_shape m;
    const int64_t tiles = (d->capacity + MA_U - 1) / MA_U;
    m.S = (int)(tiles < MA_SPLITS ? tiles : MA_SPLITS);
    m.Cp = (d->kv_lora + d->rope + 3) & ~3;
    m.Cs = (m.Cp / 4) % 2 ? m.Cp : m.Cp + 4;
    m.KS = (m.Cp / 4 + MA_HG - 1) / MA_HG;
    m.ldp = (int64_t)m.S * d->kv_lora;
    return m;
}

/* Shared bytes of a split block: the heads' queries, the tile, the slices' partial scores
 * (reused for p), the rescale factors (floats); then, in clusters, the tile's mbarrier. */
__host__ __device__ __forceinline__ int ma_bar_offset(const ma_shape &m) {
    return ((MA_HG * m.Cp + MA_U * m.Cs + MA_HG * MA_HG * MA_U + MA_HG) * 4 + 7) & ~7;
}
static int ma_smem_bytes(const ma_shape &m, int cluster) { return ma_bar_offset(m) + (cluster > 1 ? 8 : 0); }

/* ---- the tile multicast to a cluster of head groups (sm_90) ----------------------------------
 * The CL blocks of a cluster are the head groups blockIdx.y = CL c .. CL c + CL - 1 of one split
 * and row: the same tiles. Each tile's rows are copied from global memory once, by bulk copies
 * that land in every block of the cluster (rank r copies rows r, r + CL, ...), and each block's
 * mbarrier counts the bytes in. Rows past the length are zeroed by each block itself, as
 * cp_quad zeroes them. A cluster barrier before each tile's copies keeps them off a tile some
 * block still reads. The values in shared memory are the same as with the per-block copies,
 * so the arithmetic after them is unchanged. */
__device__ __forceinline__ unsigned ma_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned ma_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void ma_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void ma_bar_init(uint64_t *b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;" ::"r"(ma_smem_addr(b))
                 : "memory");
}
__device__ __forceinline__ void ma_bar_expect(uint64_t *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ma_smem_addr(b)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void ma_bar_wait(uint64_t *b, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(ma_smem_addr(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* bytes (a multiple of 16) from g to s in every block of the cluster whose bit is in mask. */
__device__ __forceinline__ void ma_copy_multicast(float *s, const float *g, unsigned bytes, uint64_t *b,
                                                  unsigned short mask) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, "
                 "[%3], %4;" ::"r"(ma_smem_addr(s)),
                 "l"(g), "r"(bytes), "r"(ma_smem_addr(b)), "h"(mask)
                 : "memory");
}

/* Grid (S, head groups, n). Split s of row t, heads h0 .. h0 + MA_HG - 1: its m and l into
 * ml[(t H + h) S + s], its acc into part + (t H + h) ldp + s kv_lora. Splits past the row's
 * tiles write nothing (the merge reads min(S, tiles) of them). CL > 1: in clusters of CL head
 * groups sharing each tile's copy (above; vec_c, C a multiple of 4). */
template <int J, int CL>
__global__ void __launch_bounds__(MA_THREADS)
    k_mla_split(em_gpu_mla_dims d, ma_shape m, const float *cache, const int32_t *pos, const float *qa, int64_t ldq,
                float *part, float2 *ml, bool vec_c, bool vec_q) {
    emc_kernel_begin();
    extern __shared__ __align__(16) float smem[];
    float *qs = smem, *cs = qs + MA_HG * m.Cp, *red = cs + MA_U * m.Cs, *al = red + MA_HG * MA_HG * MA_U;
    const int s = blockIdx.x, h0 = blockIdx.y * MA_HG, t = blockIdx.z;
    const int64_t len = mla_len(d, pos, t), tiles = (len + MA_U - 1) / MA_U;
    if (s >= tiles) return;
    const int C = d.kv_lora + d.rope, q4 = m.Cp / 4, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float scale = (float)(1.0 / sqrt((double)(d.nope + d.rope))), ninf = -__int_as_float(0x7f800000);
    for (int idx = threadIdx.x; idx < MA_HG * q4; idx += MA_THREADS) {
        const int r = idx / q4, i = (idx % q4) * 4, h = h0 + r;
        cp_quad(qs + r * m.Cp + i, qa + (int64_t)t * ldq + (int64_t)h * C + i, h < d.n_head ? C - i : 0, vec_q);
    }
    float mx = ninf, l = 0.0f, acc[J][MA_HG];
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int h = 0; h < MA_HG; h++) acc[j][h] = 0.0f;
    const int k0 = warp * m.KS, k1 = k0 + m.KS < q4 ? k0 + m.KS : q4;
    uint64_t *bar = (uint64_t *)((char *)smem + ma_bar_offset(m));
    unsigned parity = 0;
    if (CL > 1) {
        cp_commit(); /* the queries' copies (the per-block tiles' wait takes them too) */
        cp_wait<0>();
        if (threadIdx.x == 0) ma_bar_init(bar);
        ma_cluster_sync(); /* every block's mbarrier is there before any copy counts into it */
    }
    for (int64_t tile = s; tile < tiles; tile += m.S) {
        const int64_t u0 = tile * MA_U;
        if (CL > 1) {
            const int nv = (int)(len - u0 < MA_U ? len - u0 : MA_U);
            if (threadIdx.x == 0) ma_bar_expect(bar, (unsigned)(nv * C * 4));
            ma_cluster_sync(); /* the cluster's last tile and p are read; every block expects this one */
            const int r = (int)ma_cluster_rank() + CL * (int)threadIdx.x;
            const unsigned short all = (unsigned short)((1u << CL) - 1);
            if ((int)threadIdx.x < MA_U / CL && r < nv)
                ma_copy_multicast(cs + r * m.Cs, cache + (u0 + r) * C, (unsigned)(C * 4), bar, all);
            for (int idx = nv * q4 + (int)threadIdx.x; idx < MA_U * q4; idx += MA_THREADS)
                *(float4 *)(cs + idx / q4 * m.Cs + idx % q4 * 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ma_bar_wait(bar, parity);
            parity ^= 1;
        } else {
            __syncthreads(); /* the last tile's rows and p are read */
            for (int idx = threadIdx.x; idx < MA_U * q4; idx += MA_THREADS) {
                const int r = idx / q4, i = (idx % q4) * 4;
                const int64_t u = u0 + r;
                cp_quad(cs + r * m.Cs + i, cache + u * C + i, u < len ? C - i : 0, vec_c);
            }
            cp_commit();
            cp_wait<0>();
        }
        __syncthreads();
        /* scores: this warp's slice of position u0 + lane for every head */
        float sl[MA_HG];
#pragma unroll
        for (int h = 0; h < MA_HG; h++) sl[h] = 0.0f;
        const float4 *crow = (const float4 *)(cs + lane * m.Cs);
        for (int k = k0; k < k1; k++) {
            const float4 c = crow[k];
#pragma unroll
            for (int h = 0; h < MA_HG; h++) {
                const float4 q = ((const float4 *)(qs + h * m.Cp))[k];
                float a = sl[h];
                a = fmaf(q.x, c.x, a);
                a = fmaf(q.y, c.y, a);
                a = fmaf(q.z, c.z, a);
                a = fmaf(q.w, c.w, a);
                sl[h] = a;
            }
        }
#pragma unroll
        for (int h = 0; h < MA_HG; h++) red[(warp * MA_HG + h) * MA_U + lane] = sl[h];
        __syncthreads();
        /* warp w now takes head h0 + w: its score at lane's position, the online softmax */
        float dot = red[warp * MA_U + lane];
        for (int w = 1; w < MA_HG; w++) dot = __fadd_rn(dot, red[(w * MA_HG + warp) * MA_U + lane]);
        const bool valid = h0 + warp < d.n_head && u0 + lane < len;
        const float sc = valid ? __fmul_rn(dot, scale) : ninf;
        float tm = sc;
        for (int o = 16; o > 0; o >>= 1) {
            const float b = __shfl_xor_sync(0xffffffffu, tm, o);
            tm = b > tm ? b : tm;
        }
        const float mn = tm > mx ? tm : mx;
        const float a = mla_expf_poly(mx - mn), p = valid ? mla_expf_poly(sc - mn) : 0.0f;
        float ts = p;
        for (int o = 16; o > 0; o >>= 1) ts = __fadd_rn(ts, __shfl_xor_sync(0xffffffffu, ts, o));
        l = __fadd_rn(__fmul_rn(l, a), ts);
        mx = mn;
        __syncthreads(); /* every slice read before p overwrites them */
        red[warp * MA_U + lane] = p;
        if (lane == 0) al[warp] = a;
        __syncthreads();
        /* context: columns threadIdx.x + j MA_THREADS of every head */
#pragma unroll
        for (int h = 0; h < MA_HG; h++) {
            const float ah = al[h];
#pragma unroll
            for (int j = 0; j < J; j++) acc[j][h] = __fmul_rn(acc[j][h], ah);
        }
        for (int u = 0; u < MA_U; u += 4) {
            float cv[J][4];
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int col = (int)threadIdx.x + j * MA_THREADS, cc = col < d.kv_lora ? col : 0;
#pragma unroll
                for (int e = 0; e < 4; e++) cv[j][e] = cs[(u + e) * m.Cs + cc];
            }
#pragma unroll
            for (int h = 0; h < MA_HG; h++) {
                const float4 pv = *(const float4 *)(red + h * MA_U + u);
#pragma unroll
                for (int j = 0; j < J; j++) {
                    float x = acc[j][h];
                    x = fmaf(pv.x, cv[j][0], x);
                    x = fmaf(pv.y, cv[j][1], x);
                    x = fmaf(pv.z, cv[j][2], x);
                    x = fmaf(pv.w, cv[j][3], x);
                    acc[j][h] = x;
                }
            }
        }
    }
    if (CL > 1) ma_cluster_sync(); /* no block leaves while copies into the others may fly */
    const int64_t row = (int64_t)t * d.n_head;
    if (lane == 0 && h0 + warp < d.n_head) ml[(row + h0 + warp) * m.S + s] = make_float2(mx, l);
#pragma unroll
    for (int h = 0; h < MA_HG; h++) {
        if (h0 + h >= d.n_head) break;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int col = (int)threadIdx.x + j * MA_THREADS;
            if (col < d.kv_lora) part[(row + h0 + h) * m.ldp + (int64_t)s * d.kv_lora + col] = acc[j][h];
        }
    }
}

/* Grid (heads, n): row t, head h from its splits' partial sums (a position past the capacity:
 * a NaN row). */
__global__ void __launch_bounds__(MA_THREADS)
    k_mla_merge(em_gpu_mla_dims d, ma_shape m, const int32_t *pos, const float *part, const float2 *ml, float *ctx,
                int64_t ldc) {
    emc_kernel_begin();
    __shared__ float ms[MA_SPLITS], ws[MA_SPLITS];
    const int h = blockIdx.x, t = blockIdx.y;
    const int64_t len = mla_len(d, pos, t), row = (int64_t)t * d.n_head + h;
    float *y = ctx + (int64_t)t * ldc + (int64_t)h * d.kv_lora;
    if (len == 0) {
        for (int i = threadIdx.x; i < d.kv_lora; i += MA_THREADS) y[i] = __int_as_float(0x7fc00000);
        return;
    }
    const int64_t tiles = (len + MA_U - 1) / MA_U;
    const int ns = (int)(tiles < m.S ? tiles : m.S);
    if ((int)threadIdx.x < ns) ms[threadIdx.x] = ml[row * m.S + threadIdx.x].x;
    __syncthreads();
    float M = ms[0];
    for (int s = 1; s < ns; s++) M = ms[s] > M ? ms[s] : M;
    if ((int)threadIdx.x < ns) ws[threadIdx.x] = mla_expf_poly(ms[threadIdx.x] - M);
    __syncthreads();
    float L = 0.0f;
    for (int s = 0; s < ns; s++) L = fmaf(ws[s], ml[row * m.S + s].y, L);
    const float *pr = part + row * m.ldp;
    for (int i = threadIdx.x; i < d.kv_lora; i += MA_THREADS) {
        float c = 0.0f;
#pragma unroll 8
        for (int s = 0; s < ns; s++) c = fmaf(ws[s], pr[(int64_t)s * d.kv_lora + i], c);
        y[i] = __fdiv_rn(c, L);
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

extern "C" uint64_t em_gpu_mla_scratch_floats(const em_gpu_mla_dims *d, int n) {
    if (mla_check(d, NULL) || n < 1 || n > EM_GPU_MAX_ROWS) return 0;
    const ma_shape m = ma_shape_of(d);
    return (uint64_t)n * (uint64_t)d->n_head * ((uint64_t)m.ldp + 2 * (uint64_t)m.S);
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

template <int J, int CL>
static int mla_launch_split(em_gpu *g, const em_gpu_mla_dims *d, const ma_shape &m, const float *d_cache,
                            const int32_t *d_pos, int n, const float *d_qa, int64_t ldq, float *part, float2 *ml,
                            bool vec_c, bool vec_q, em_err *err) {
    static int optin[64];
    const int bytes = ma_smem_bytes(m, CL);
    int rc = emc_smem_optin(g, k_mla_split<J, CL>, bytes, optin, err);
    if (rc) return rc;
    const dim3 grid((unsigned)m.S, emc_blocks(d->n_head, MA_HG), (unsigned)n);
    emc_launch_clusters(g, CL, k_mla_split<J, CL>, grid, MA_THREADS, bytes, *d, m, d_cache, d_pos, d_qa, ldq, part, ml,
                        vec_c, vec_q);
    return emc_launched(err, "k_mla_split");
}

/* Whether the split blocks run in clusters of MA_CLUSTER head groups sharing each tile's copy:
 * for calls of EM_GPU_MAX_ROWS rows (a prompt's chunks), when MA_CLUSTER divides the head groups
 * and the cache rows allow bulk copies (vec_c: C a multiple of 4, the cache 16-byte aligned).
 * The bits are the same either way; the choice is speed (run 84, H100, the 48B shape: prefill
 * of 32k +8%, but a one-row decode at 32k -8%, where the cluster's barrier a tile costs more
 * than the three copies it saves). EMBER_GPU_MLA_CLUSTER=0: never (measurements). */
static bool mla_clustered(const em_gpu_mla_dims *d, int n, bool vec_c) {
    static int off = -1;
    if (off < 0) {
        const char *v = getenv("EMBER_GPU_MLA_CLUSTER");
        off = v && !strcmp(v, "0");
    }
    return !off && vec_c && n == EM_GPU_MAX_ROWS && emc_blocks(d->n_head, MA_HG) % MA_CLUSTER == 0;
}

template <int J>
static int mla_launch_split_cl(em_gpu *g, const em_gpu_mla_dims *d, const ma_shape &m, const float *d_cache,
                               const int32_t *d_pos, int n, const float *d_qa, int64_t ldq, float *part, float2 *ml,
                               bool vec_c, bool vec_q, em_err *err) {
    if (mla_clustered(d, n, vec_c))
        return mla_launch_split<J, MA_CLUSTER>(g, d, m, d_cache, d_pos, n, d_qa, ldq, part, ml, vec_c, vec_q, err);
    return mla_launch_split<J, 1>(g, d, m, d_cache, d_pos, n, d_qa, ldq, part, ml, vec_c, vec_q, err);
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
    const ma_shape m = ma_shape_of(d);
    EMC_CHECK(((uintptr_t)d_scratch & 7) == 0, "GPU mla attend: scratch not 8-byte aligned");
    float2 *ml = (float2 *)d_scratch; /* [n][n_head][S] (m, l), then the partial sums */
    float *part = d_scratch + (int64_t)n * d->n_head * m.S * 2;
    const bool vec_c = C % 4 == 0 && aligned16(d_cache), vec_q = C % 4 == 0 && ldq % 4 == 0 && aligned16(d_qa);
    const int J = (d->kv_lora + MA_THREADS - 1) / MA_THREADS;
    if (J == 1) rc = mla_launch_split_cl<1>(g, d, m, d_cache, d_pos, n, d_qa, ldq, part, ml, vec_c, vec_q, err);
    else if (J == 2) rc = mla_launch_split_cl<2>(g, d, m, d_cache, d_pos, n, d_qa, ldq, part, ml, vec_c, vec_q, err);
    else rc = mla_launch_split_cl<MA_MAX_J>(g, d, m, d_cache, d_pos, n, d_qa, ldq, part, ml, vec_c, vec_q, err);
    if (rc) return rc;
    emc_launch(g, k_mla_merge, dim3((unsigned)d->n_head, (unsigned)n), MA_THREADS, 0, *d, m, d_pos, (const float *)part,
               (const float2 *)ml, d_ctx, ldc);
    return emc_launched(err, "k_mla_merge");
}
