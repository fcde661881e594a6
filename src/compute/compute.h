/* compute/: tensor operations over quant types on the CPU: the matrix-vector product y = W x,
 * the multi-row product over quant types (activations converted once per row, and once per
 * input for all the products that read it: em_acts), the row ops the models need (norms,
 * activations, softmax, attention rows, RoPE), and the nominal costs of each device that
 * estimates use (em_device_costs). Knows nothing of files or models. */
#ifndef EM_COMPUTE_H
#define EM_COMPUTE_H

#include "base/base.h"
#include "quant/quant.h"

#include <math.h>

/* y[r] = W[r, :] . act for every row r in [0, n_rows).
 * W: n_rows rows of n_cols values of type wtype, row-major, each row em_type_row_bytes
 * long (rows are consecutive, blocks of a row are consecutive). act: one activation row of
 * n_cols values of type em_dot_act_type(wtype) (see em_dot_quantize_act). y: n_rows floats.
 * n_cols must be a multiple of em_dot_block_elems(wtype).
 * Rows are split into contiguous chunks handed out over the pool's threads (pool may be
 * NULL: the caller's thread does all). No allocation; one call at a time per pool. */
int em_matvec(em_pool *pool, int wtype, const void *w, int64_t n_rows, int64_t n_cols,
              const void *act, float *y, em_err *err);
/* As em_matvec with the dot kernel of a given ISA (em_dot_kernel); EM_EUNSUPPORTED when the
 * CPU cannot run that ISA. */
int em_matvec_isa(em_pool *pool, int isa, int wtype, const void *w, int64_t n_rows,
                  int64_t n_cols, const void *act, float *y, em_err *err);


/* ---- matrices and multi-row products (matmul.c) ------------------------------------------
 * A weight matrix as stored in a GGUF tensor: `rows` rows of `cols` values of `type`, row r at
 * data + r * row_bytes (a torch Linear [out, in] is rows = out, cols = in). Views into a
 * mapped file; nothing is owned. packed: NULL, or the same Q8_0 rows in packed.c's layout
 * (em_mat_pack, memory the packer owns); the products then read only it, with its own
 * (fixed) order of float operations. */
typedef struct em_mat {
    int type;
    int64_t rows, cols;
    uint64_t row_bytes;
    const void *data;
    const void *packed;
} em_mat;

/* ---- packed Q8_0 (packed.c) ---------------------------------------------------------------
 * Q8_0 rows interleaved 16 at a time, for products 3-4x faster on AVX-512 VNNI CPUs. Loaders
 * pack a model's matrices once, at load (model/weights.c), never per call. */
#define EM_PACK_ROWS 16
#define EM_PACK_MAX_BLOCKS 4096                   /* columns up to 131072 */
#define EM_PACK_QUANT_BYTES (8u * 64u)            /* a block's quants of 16 rows */
#define EM_PACK_GROUP_BYTES(nb) ((nb) * (EM_PACK_QUANT_BYTES + 2u * EM_PACK_ROWS)) /* 16 rows of nb blocks */
/* Bytes a model may pack: 0 unless the dispatch ISA (em_isa_default) is AVX-512 and
 * EMBER_PACK is not "off"; else 64 MiB (models that fit the cache: packed.c says why). */
uint64_t em_mat_pack_budget(void);
/* Q8_0 with data, not packed yet, rows a multiple of 16, at most EM_PACK_MAX_BLOCKS blocks a row. */
bool em_mat_packable(const em_mat *m);
/* Bytes em_mat_pack writes for a packable m (the same as its rows' bytes). */
uint64_t em_mat_packed_bytes(const em_mat *m);
/* Writes m's rows packed into dst (em_mat_packed_bytes; 2-byte aligned, 64 best) and sets m->packed. */
void em_mat_pack(em_mat *m, void *dst);
/* Packs m's rows over themselves at data (writable; m's shape; 2-byte aligned), through tmp
 * (16 * m->row_bytes bytes), and sets m->data = m->packed = data: the rows as stored are gone. */
void em_mat_pack_inplace(em_mat *m, void *data, void *tmp);

/* Fills m for rows x cols values of type at data (row_bytes from the type; checked). */
int em_mat_init(em_mat *m, int type, int64_t rows, int64_t cols, const void *data, em_err *err);
/* Rows [r0, r0 + n) of m as a matrix of their own (a slice of stacked experts or heads); of a
 * packed m, packed too when r0 and n are multiples of 16, else unpacked. */
em_mat em_mat_rows(const em_mat *m, int64_t r0, int64_t n);
/* Its bytes (rows x row_bytes; em_mat_init checked that they fit). */
static inline uint64_t em_mat_bytes(const em_mat *m) { return m->row_bytes * (uint64_t)m->rows; }

/* Activation rows prepared for one dot-kernel activation type: n rows of `cols` values of
 * `type` (em_dot_act_type of the weights they meet), row j at data + j * stride. For F32 the
 * rows may be the caller's floats in place (no copy). */
typedef struct em_act {
    int type;
    int64_t n, cols;
    uint64_t stride;
    const void *data;
} em_act;

/* Scratch bytes em_act_prepare needs to convert n rows of cols values for weights of type
 * wtype (0 when the rows are used in place: F32 activations). */
int em_act_bytes(int wtype, int64_t cols, int64_t n, uint64_t *bytes, em_err *err);
/* Converts n rows of cols floats (row j at x + j * ldx, ldx >= cols) to the activation type
 * of wtype, once, so that every matrix of that activation type can use them. buf holds
 * em_act_bytes bytes (may be NULL when that is 0), 64-byte aligned is best. Rows are
 * converted on the pool's threads. */
int em_act_prepare(em_pool *pool, int wtype, const float *x, int64_t ldx, int64_t cols, int64_t n,
                   void *buf, em_act *out, em_err *err);

/* y[j][r] = W[r, :] . act[j] for j in [0, act->n), r in [0, W->rows); row j of y at
 * y + j * ldy (ldy >= W->rows). The act type must be em_dot_act_type(W->type) and
 * act->cols == W->cols. Weight rows are split into contiguous tasks over the pool; each
 * weight row meets all activation rows while it is in cache (in tiles of activation rows).
 * No allocation. With act->n == 1 this is em_matvec. */
int em_matmul_act(em_pool *pool, const em_mat *w, const em_act *act, float *y, int64_t ldy,
                  em_err *err);
/* Several independent products (as em_matmul_act each) in ONE pool run: their tasks are
 * handed out together, so a step that has many small products (the experts of an MoE layer,
 * the projections of one input) pays one hand-off to the threads instead of one per product.
 * Every output is what em_matmul_act would give. Checks every item before running any; an
 * invalid item leaves all outputs unwritten. At most EM_MATMUL_MULTI_MAX items. */
#define EM_MATMUL_MULTI_MAX 64
typedef struct em_mm_item {
    const em_mat *w;
    const em_act *act;
    float *y;
    int64_t ldy;
} em_mm_item;
int em_matmul_multi(em_pool *pool, const em_mm_item *items, int n_items, em_err *err);
/* em_act_prepare into buf, then em_matmul_act. */
int em_matmul(em_pool *pool, const em_mat *w, const float *x, int64_t ldx, int64_t n, float *y,
              int64_t ldy, void *buf, em_err *err);

/* ---- products through an activation cache (acts.c) -----------------------------------------
 * One input's rows, converted on demand at most once per activation type, for every product
 * that reads them (the projections of one normed input may mix weight types). Conversions
 * come from the caller's arena and stay valid until it is reset. */
typedef struct em_acts {
    const float *x;
    int64_t ldx, cols, n;
    em_act act[3];  /* by activation type: F32, Q8_0, Q8_K */
    bool have[3];
} em_acts;

/* n rows of cols floats, row j at x + j * ldx. Nothing is converted yet. */
void em_acts_init(em_acts *a, const float *x, int64_t ldx, int64_t cols, int64_t n);
/* The rows prepared for weights of type wtype (converted now unless done before). */
int em_acts_for(em_acts *a, int wtype, em_pool *pool, em_arena *arena, const em_act **act, em_err *err);
/* y[j][r] = w[r] . x[j] through the cache (em_matmul_act's result). */
int em_mm(em_acts *a, const em_mat *w, float *y, int64_t ldy, em_pool *pool, em_arena *arena, em_err *err);
/* Several products in one pool run (em_matmul_multi): out[i].y = out[i].w . out[i].x, each
 * input converted once per activation type however many products read it. */
typedef struct em_mm_out {
    em_acts *x;
    const em_mat *w;
    float *y;
    int64_t ldy;
} em_mm_out;
int em_mm_many(const em_mm_out *out, int n_out, em_pool *pool, em_arena *arena, em_err *err);
/* count floats from the arena, or NULL with EM_ENOMEM and `what` in the message. */
float *em_falloc(em_arena *arena, uint64_t count, const char *what, em_err *err);

/* ---- element-wise and row ops (ops.c) -----------------------------------------------------
 * fp32 in and out; sums of squares and softmax denominators accumulate in double. Outputs may
 * alias inputs. */

static inline float em_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float em_siluf(float x) { return x / (1.0f + expf(-x)); }
/* log(1 + e^x), and x itself above 20 (torch's and fla's threshold). */
static inline float em_softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* y = x * rsqrt(mean(x^2) + eps) * w (w NULL: no weight), over n values. */
void em_rmsnorm(const float *x, const float *w, float eps, int64_t n, float *y);
/* em_rmsnorm of rows x + r * ldx into y + r * ldy, r < rows, each row bit for bit em_rmsnorm's.
 * y may be x (ldy == ldx); no other overlap. */
void em_rmsnorm_rows(const float *x, int64_t ldx, const float *w, float eps, int64_t rows, int64_t n, float *y,
                     int64_t ldy);
/* y = x * rsqrt(sum(x^2) + eps). */
void em_l2norm(const float *x, float eps, int64_t n, float *y);
void em_sigmoid(const float *x, int64_t n, float *y);
void em_silu(const float *x, int64_t n, float *y);
/* y = silu(gate) * up. */
void em_swiglu(const float *gate, const float *up, int64_t n, float *y);
/* SiTU (Kimi-K3's MLP activation): y = beta tanh(gate / beta) sigmoid(gate) * u, where
 * u = lin_beta tanh(up / lin_beta) when lin_beta > 0, else up. beta > 0. */
void em_situ(const float *gate, const float *up, float beta, float lin_beta, int64_t n, float *y);
/* In place: x = softmax(x) (max-subtracted). n >= 1. */
void em_softmax(float *x, int64_t n);
/* In place: x = softmax(x) as em_softmax, but exp is em_expf_poly (below), vectorized: for
 * long rows (attention scores). n >= 1. */
void em_softmax_poly(float *x, int64_t n);
/* exp(x) from a fixed polynomial (max error about 2 ulp; x below -103 gives 0, above 88.7
 * gives inf): k = nearest(x log2 e), r = x - k ln2 (two-part ln 2, fma), a degree-7 Horner
 * polynomial of r by fma, times 2^k. The same floats on every ISA. */
float em_expf_poly(float x);
/* y += a * x. */
void em_axpy(float a, const float *x, int64_t n, float *y);
/* Attention scores: s[u] = scale * (x[u] . q) for the m rows x + u * ldx of n values each.
 * The sum's order is fixed (16 lanes, lane l = fma chain over x[16k + l] q[16k + l], k
 * ascending, missing values as fma(0, 0, .); then halves added 16 -> 8 -> 4 -> 2 -> 1), the
 * same on every ISA, so a score depends only on its row and q. */
void em_dot_rows(const float *x, int64_t ldx, int64_t m, const float *q, int64_t n, float scale, float *s);
/* y[i] = sum over u ascending of p[u] * x[u][i] (one fused multiply-add per term, from 0),
 * rows x + u * ldx, n values; y is overwritten and must not overlap x or p. */
void em_weighted_rows(const float *p, const float *x, int64_t ldx, int64_t m, int64_t n, float *y);
/* em_dot_rows for nq queries (query t at q + t * ldq) over the same m rows: scores of query t
 * at s + t * lds. Each score is bit for bit em_dot_rows's; the rows are read once per block
 * for all queries instead of once per query (attention over a shared cache). */
void em_dot_rows_multi(const float *x, int64_t ldx, int64_t m, const float *q, int64_t ldq, int nq, int64_t n,
                       float scale, float *s, int64_t lds);
/* em_weighted_rows for nq weight rows (row t at p + t * ldp, over the first m[t] rows of x)
 * into y + t * ldy; each bit for bit em_weighted_rows(p + t * ldp, x, ldx, m[t], n, y + t * ldy). */
void em_weighted_rows_multi(const float *p, int64_t ldp, const int64_t *m, int nq, const float *x, int64_t ldx,
                            int64_t n, float *y, int64_t ldy);

/* ---- the read reference (readrate.c) --------------------------------------------------
 * Seconds for the pool to read the first (bytes / part) * part bytes of data, in tasks of
 * `part` bytes (rounded down to 128) with wide loads, summing them; 0 when there is nothing
 * to read or no memory for the sums. The rate the products' weight streaming is measured by
 * (ember bench, bench_quant). pool may be NULL. */
double em_read_seconds(em_pool *pool, const void *data, uint64_t bytes, uint64_t part);

/* ---- nominal costs per device ------------------------------------------------------------
 * Rates that estimates use when they must not depend on timing: decode/ weighs a drafter's
 * block against a target's verify with them, so a seeded run chooses the same widths every
 * time. Only their ratios matter for such comparisons. Each device states its own table (a
 * target or drafter keeps the one of the device it runs on); the CPU's is below. */
#define EM_NOMINAL_MEM_BPS 20e9          /* CPU: weight bytes streamed from memory per second */
#define EM_NOMINAL_FLOPS_PER_THREAD 20e9 /* CPU: per thread; multiply-adds count 2 */
#define EM_NOMINAL_DISK_BPS 2e9          /* storage reads (a typical NVMe rate) */

/* Kinds of arithmetic a device may run at different rates. */
enum em_work_kind {
    EM_WORK_WEIGHTS = 0, /* products against weight matrices (any weight type) */
    EM_WORK_F32 = 1,     /* fp32 vector work: attention over caches, recurrences, norms */
    EM_WORK_NKINDS
};

typedef struct em_device_costs {
    const char *name;                  /* "cpu", "cuda:0", ... */
    double mem_bps;                    /* bytes streamed from the device's memory per second */
    double flops_per_s[EM_WORK_NKINDS]; /* the whole device (all its threads), by kind */
    double op_seconds;                 /* fixed cost of one op (a kernel launch); 0 on the CPU,
                                          where hand-offs are part of the rates */
    double disk_bps;                   /* storage reads into the device's memory */
} em_device_costs;

/* What one estimate counts: bytes read from memory, flops by kind, ops issued. */
typedef struct em_work {
    double bytes;
    double flops[EM_WORK_NKINDS];
    double ops;
} em_work;

/* The CPU with `threads` threads (0 or less: one): every kind at
 * EM_NOMINAL_FLOPS_PER_THREAD per thread, memory at EM_NOMINAL_MEM_BPS. */
static inline em_device_costs em_device_costs_cpu(int threads) {
    const double f = EM_NOMINAL_FLOPS_PER_THREAD * (threads > 0 ? threads : 1);
    return (em_device_costs){ .name = "cpu", .mem_bps = EM_NOMINAL_MEM_BPS, .flops_per_s = { f, f },
                              .op_seconds = 0.0, .disk_bps = EM_NOMINAL_DISK_BPS };
}

/* Seconds `w` takes on device d at its nominal rates (memory and arithmetic do not overlap:
 * a bound that keeps estimates monotone in both). */
static inline double em_device_seconds(const em_device_costs *d, const em_work *w) {
    double s = w->bytes / d->mem_bps;
    for (int k = 0; k < EM_WORK_NKINDS; k++)
        if (w->flops[k] != 0.0) s += w->flops[k] / d->flops_per_s[k];
    return w->ops != 0.0 ? s + w->ops * d->op_seconds : s;
}

/* ---- rotary position embeddings (rope.c) --------------------------------------------------
 * HF rotate-half (neox) RoPE: value i of a head pairs with value i + dims/2 and turns by
 * pos * inv_freq[i]; values past dims pass unchanged. Schedules: plain, linear (frequencies /
 * factor) and HF YaRN (ramp between interpolated and extrapolated frequencies over the
 * correction range of beta_fast / beta_slow at orig_ctx, truncated to whole dimensions;
 * cos/sin scaled by attn_factor, or 0.1 * ln(factor) + 1 when attn_factor is 0). */
#define EM_ROPE_MAX_DIMS 1024
enum { EM_ROPE_NONE = 0, EM_ROPE_LINEAR = 1, EM_ROPE_YARN = 2 };
typedef struct em_rope_params {
    int dims;           /* rotated values per head, even */
    double theta;       /* base */
    int scaling;        /* EM_ROPE_* */
    double factor;      /* linear / yarn */
    double orig_ctx;    /* yarn: original_max_position_embeddings */
    double beta_fast, beta_slow; /* yarn (HF defaults 32 / 1) */
    double attn_factor; /* yarn: 0 = 0.1 * ln(factor) + 1 */
} em_rope_params;
typedef struct em_rope {
    int dims;
    double attn_factor;
    double inv_freq[EM_ROPE_MAX_DIMS / 2];
} em_rope;
int em_rope_init(em_rope *r, const em_rope_params *p, em_err *err);
/* cos and sin (dims/2 each, times the attention factor) of position pos. */
void em_rope_cos_sin(const em_rope *r, int64_t pos, float *cs, float *sn);
/* Rotates the first dims values of n_heads heads (head h at x + h * head_stride) in place. */
void em_rope_apply(float *x, int n_heads, int64_t head_stride, int dims, const float *cs,
                   const float *sn);

#endif
