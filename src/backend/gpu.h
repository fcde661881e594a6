/* backend/gpu.h: the GPU op layer, in plain C (no CUDA types): a device context with one
 * stream, device memory, CUDA graph capture and replay, weights uploaded in device layouts,
 * and the model-shaped ops the Kimi forward needs, on device buffers. Kernels live only in
 * backend/cuda/ (.cu files); a build without CUDA compiles backend/gpu_none.c instead, which answers
 * every entry point with EM_EUNSUPPORTED "this ember was built without CUDA".
 *
 * Conventions (docs/cuda.md says why):
 * - Pointers named d_* or documented "device" are device addresses from em_gpu_alloc; host
 *   pointers are named host or h_*. Every op is asynchronous on the context's stream and never
 *   synchronizes with the host; only em_gpu_download and em_gpu_sync wait.
 * - Ops never allocate: scratch comes from the caller, so a pass can be captured as a graph.
 * - Multi-row ops take n rows, 1 <= n <= EM_GPU_MAX_ROWS, and compute each row with the same
 *   arithmetic in the same order whatever n is (width invariance): row j of an n-row call is
 *   bit-identical to a one-row call on that row alone. Those a wide prefill pass runs over all
 *   its rows (activations, products, the residual norm, routed experts) take up to
 *   EM_GPU_WIDE_MAX_ROWS, with the same guarantee.
 * - Errors are argument checks done on the host before the launch (EM_EINVAL naming the
 *   argument), and CUDA errors, which name the CUDA call and the CUDA error string.
 * A device error inside a stream (a faulting kernel) is sticky in CUDA: the context is then
 * unusable and every later call returns EM_EIO. */
#ifndef EM_GPU_H
#define EM_GPU_H

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EM_GPU_MAX_ROWS 16
#define EM_GPU_WIDE_MAX_ROWS 1024

/* ---- devices (gpu_common.c; device counting in the backend) --------------------------- */

/* Whether this ember was built with the CUDA backend. */
bool em_gpu_built(void);
/* Parses a device name: "cuda" (= cuda:0) or "cuda:N" with N a decimal index < 1024.
 * EM_EINVAL names the text when it is anything else ("cpu" is the caller's business). */
int em_gpu_parse_device(const char *spec, int *index, em_err *err);
/* Number of CUDA devices. Errors: EM_EUNSUPPORTED without CUDA or without a usable driver
 * (the message says which), EM_EIO for other CUDA failures. */
int em_gpu_device_count(int *n, em_err *err);

typedef struct em_gpu_info {
    char name[256];
    int index;
    int cc_major, cc_minor;  /* compute capability; the backend needs 9.0 or later */
    int sm_count;
    uint64_t total_bytes;    /* device memory */
    uint64_t l2_bytes;
    int driver_version;      /* e.g. 13000 for CUDA 13.0 */
} em_gpu_info;

typedef struct em_gpu em_gpu;

/* Opens device index with one non-blocking stream. Errors (EM_EUNSUPPORTED unless noted):
 * built without CUDA; no driver / driver too old for this runtime; no device N (EM_ENOTFOUND,
 * naming how many there are); compute capability below 9.0 (naming the device and its
 * capability). */
int em_gpu_open(int index, em_gpu **out, em_err *err);
void em_gpu_close(em_gpu *g);
const em_gpu_info *em_gpu_get_info(const em_gpu *g);
/* Free and total device memory now. */
int em_gpu_mem(em_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes, em_err *err);

/* ---- memory ----------------------------------------------------------------------------- */

/* Device memory of bytes (> 0), 256-byte aligned. When it does not fit: EM_ENOMEM naming
 * what (a label for the message), the bytes asked for and the bytes free. */
int em_gpu_alloc(em_gpu *g, uint64_t bytes, const char *what, void **d_out, em_err *err);
void em_gpu_free(em_gpu *g, void *d_ptr); /* NULL is fine */
/* Host to device; returns when host may be reused (ordered after earlier work on the stream). */
int em_gpu_upload(em_gpu *g, void *d_dst, const void *host, uint64_t bytes, em_err *err);
/* Device to host; waits for the stream's earlier work, then returns with host filled. */
int em_gpu_download(em_gpu *g, void *host, const void *d_src, uint64_t bytes, em_err *err);
/* Fills bytes of device memory with byte value v (asynchronous, on the stream). */
int em_gpu_memset(em_gpu *g, void *d_dst, int v, uint64_t bytes, em_err *err);
/* Sets n floats of device memory to v (asynchronous, on the stream). */
int em_gpu_fill(em_gpu *g, float *d_x, float v, uint64_t n, em_err *err);
/* Device to device (asynchronous, on the stream). */
int em_gpu_copy(em_gpu *g, void *d_dst, const void *d_src, uint64_t bytes, em_err *err);
/* rows rows of width bytes, device to device: row i from d_src + i * spitch to d_dst + i *
 * dpitch (asynchronous; a strided gather such as the rope slices of every head). */
int em_gpu_copy_2d(em_gpu *g, void *d_dst, uint64_t dpitch, const void *d_src, uint64_t spitch, uint64_t width,
                   uint64_t rows, em_err *err);
/* Waits for everything queued on the stream; reports an error a kernel raised. */
int em_gpu_sync(em_gpu *g, em_err *err);

/* ---- concurrent branches ---------------------------------------------------------------- */

/* Independent work of a pass side by side (graph branches when captured): fork makes n side
 * streams (1..4) wait for everything queued so far; branch(b) sends later ops to side stream b
 * (1..n), or back to the main stream (0); join makes the main stream wait for every branch
 * and sends later ops to it. Downloads, syncs, uploads and capture_end need all branches
 * joined (EM_EINVAL otherwise). Results do not depend on the branches: each op computes what
 * it would alone; the caller keeps branches from sharing a buffer they write. A side stream's
 * kernels run at a higher priority than the main stream's (unless EMBER_GPU_PRIORITY=0): a
 * branch is meant to be short and done by the join. */
int em_gpu_fork(em_gpu *g, int n, em_err *err);
int em_gpu_branch(em_gpu *g, int b, em_err *err);
int em_gpu_join(em_gpu *g, em_err *err);

/* ---- launch overlap --------------------------------------------------------------------- */

/* Whether a kernel may start while the kernel before it finishes (programmatic dependent
 * launch: it prefetches its weights, then waits on the device for the earlier kernels'
 * results; docs/cuda.md "Fewer, fuller launches"). Results are bit-identical either way. On at open
 * unless the environment has EMBER_GPU_PDL=0; a graph keeps the setting it was captured with. */
void em_gpu_set_overlap(em_gpu *g, bool on);

/* ---- graphs and timing ------------------------------------------------------------------ */

typedef struct em_gpu_graph em_gpu_graph;
/* Between begin and end, ops on g are recorded, not run (no download, sync or alloc in
 * between). end instantiates the recording; launch replays it on the stream. */
int em_gpu_capture_begin(em_gpu *g, em_err *err);
int em_gpu_capture_end(em_gpu *g, em_gpu_graph **out, em_err *err);
int em_gpu_graph_launch(em_gpu *g, const em_gpu_graph *gr, em_err *err);
void em_gpu_graph_free(em_gpu_graph *gr);

/* Milliseconds the stream spent between two points: mark(0) ... mark(1), then elapsed
 * (which waits for the second mark). Two marks per context. */
int em_gpu_mark(em_gpu *g, int which, em_err *err);
int em_gpu_elapsed_ms(em_gpu *g, float *ms, em_err *err);

/* ---- weight matrices in device layouts -------------------------------------------------- */

/* ---- weight types (wt-cuda3: Q4_K, Q6_K, MXFP4 products; every other type as F32) ------- */

/* A weight matrix of rows x cols values (a torch Linear [out, in]: rows = out) as the
 * kernels read it, repacked at upload into device layouts that keep the GGUF's bytes and
 * numbers (docs/cuda.md, "Weight upload"):
 * - F32, F16, BF16: the GGUF rows as they are (data).
 * - Q8_0: int8 quants of row r at data + r * cols; fp16 block scales at scales + r * (cols/32).
 * - Q4_K: the 128 quant bytes of each 256-value super-block, row r at data + r * cols/2
 *   (64-value chunk c at + 32 c: byte i holds value 64c + i low, 64c + 32 + i high); each
 *   super-block's first 16 GGUF bytes (fp16 d, fp16 dmin, 12 packed 6-bit scales and mins)
 *   at scales + (r * cols/256 + s) * 16.
 * - Q6_K: low nibbles at data + r * cols/2 (chunk c at + 32 c: byte i holds value 64c + i low,
 *   64c + 32 + i high); in scales: the high 2-bit pieces [rows][cols/4] (chunk c at + 16 c:
 *   bits 2t..2t+1 of byte i belong to value 64c + i + 16t), then the int8 scales of 16 values
 *   [rows][cols/16], then the fp16 d [rows][cols/256].
 * - MXFP4: the 16 quant bytes of each 32-value block at data + (r * cols/32 + b) * 16 (byte i:
 *   value i low, value 16 + i high), the e8m0 exponents at scales + r * cols/32 + b.
 * Every other type Ember reads (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q8_K, the IQ types,
 * F64, I8..I64) is dequantized on the host with quant/'s em_dequantize at upload and held as
 * F32 (exact: the same floats the CPU computes with; 32 bits a value on the device), with a
 * log line naming the tensor and its type. */
typedef struct em_gpu_mat {
    int type;              /* the device layout: EM_TYPE_F32, F16, BF16, Q8_0, Q4_K, Q6_K, MXFP4 */
    int src_type;          /* the GGUF type uploaded (differs from type when converted to F32) */
    int64_t rows, cols;
    void *data;            /* device: the values (quantized types: the quants) */
    void *scales;          /* device: the block scales (above); NULL for float types */
    uint64_t bytes;        /* device bytes held */
} em_gpu_mat;

/* Whether the matrix ops have kernels for a device layout of this type. */
bool em_gpu_mat_type_ok(int type);
/* The device layout a GGUF tensor of type gets at upload: type itself when the GPU runs it,
 * EM_TYPE_F32 when it is converted, -1 when Ember cannot read the type at all. */
int em_gpu_mat_dev_type(int type);
/* The activation type em_gpu_act_prepare makes for weights of device type wtype: EM_TYPE_Q8_0
 * for Q8_0, Q4_K, Q6_K, MXFP4 (integer kernels), EM_TYPE_F32 for float weights; -1 otherwise. */
int em_gpu_act_type(int wtype);
/* Device bytes a rows x cols matrix of GGUF type takes once uploaded (the GGUF bytes for the
 * types the GPU runs, rows * cols * 4 for converted ones). EM_EUNSUPPORTED names the type when
 * Ember cannot read it; EM_EFORMAT when cols is not a multiple of its block. */
int em_gpu_mat_bytes(int type, int64_t rows, int64_t cols, uint64_t *bytes, em_err *err);
/* Uploads a matrix from its GGUF bytes (host: rows rows of em_type_row_bytes each, as mapped),
 * repacking into the device layout on the device (through a staging buffer), or converting
 * it to F32 on the host (logged at INFO, naming the tensor). name labels errors and the log
 * (the tensor's name). Allocates out->data / out->scales. */
int em_gpu_mat_upload(em_gpu *g, int type, int64_t rows, int64_t cols, const void *host, const char *name,
                      em_gpu_mat *out, em_err *err);
void em_gpu_mat_free(em_gpu *g, em_gpu_mat *m);

/* ---- end of weight types ---------------------------------------------------------------- */

/* ---- activations ------------------------------------------------------------------------ */

/* Activation rows prepared for one kind of weight: F32 (for F32/F16/BF16 weights: the rows as
 * they are, x + j * ldx) or Q8_0 (for Q8_0, Q4_K, Q6_K, MXFP4 weights: every 32 values quantized exactly as
 * quant/'s em_quant_q8_0 does, quants of row j at qs + j * cols, scales at d + j * cols/32,
 * as floats holding the fp16-rounded scale). */
typedef struct em_gpu_act {
    int type;              /* EM_TYPE_F32 or EM_TYPE_Q8_0 */
    int n;                 /* rows, 1..EM_GPU_MAX_ROWS (..EM_GPU_WIDE_MAX_ROWS for em_gpu_matmul(_multi)) */
    int64_t cols;
    const float *x;        /* F32 */
    int64_t ldx;
    const int8_t *qs;      /* Q8_0 (NULL with in_block) */
    const float *d;
    /* in_block (em_gpu_act_in_block): each block of the product quantizes the rows itself,
     * from x, or from glu(x, up) (up: row j at up + j * ldx) when up is set */
    bool in_block;
    const float *up;
    int glu;                        /* EM_GPU_ACT_SWIGLU or EM_GPU_ACT_SITU */
    float situ_beta, situ_lin_beta;
} em_gpu_act;

#define EM_GPU_ACT_SWIGLU 0 /* silu(gate) * up (Kimi-Linear) */
#define EM_GPU_ACT_SITU 1   /* em_gpu_situ's SiTU (kimi-k3) */

/* The most values (n * cols) em_gpu_act_in_block takes: every block of the product quantizes
 * all of them again, which pays only for small inputs. */
#define EM_GPU_IN_BLOCK_MAX 4096
/* Q8_0 activations that em_gpu_matmul makes inside its blocks instead of in a launch of their
 * own: the n rows of d_x, or with d_up the rows glu(x, up) (act EM_GPU_ACT_SWIGLU, or
 * EM_GPU_ACT_SITU with beta and lin_beta: em_gpu_swiglu's / em_gpu_situ's arithmetic), each
 * quantized as em_gpu_act_prepare quantizes, so the product's bits are the same. Returns false
 * (out untouched) where they do not apply: weights that take F32 activations, cols not a
 * multiple of 32, or n * cols above EM_GPU_IN_BLOCK_MAX; the caller prepares them then. Only
 * em_gpu_matmul and em_gpu_matmul_multi (one weight type) take them. */
bool em_gpu_act_in_block(int wtype, const float *d_x, const float *d_up, int64_t ldx, int64_t cols, int n, int act,
                         float beta, float lin_beta, em_gpu_act *out);

/* Scratch bytes em_gpu_act_prepare needs for n rows of cols values meeting weights of type
 * wtype (0 for float weights). */
uint64_t em_gpu_act_bytes(int wtype, int64_t cols, int n);
/* Prepares n rows (1..EM_GPU_WIDE_MAX_ROWS) of cols floats (device, row j at d_x + j * ldx) for
 * weights of type wtype, quantizing into d_scratch (em_gpu_act_bytes, 16-byte aligned) when
 * em_gpu_act_type(wtype) is Q8_0. */
int em_gpu_act_prepare(em_gpu *g, int wtype, const float *d_x, int64_t ldx, int64_t cols, int n,
                       void *d_scratch, em_gpu_act *out, em_err *err);
/* em_gpu_act_prepare of the rows glu(gate, up) (act EM_GPU_ACT_SWIGLU, or EM_GPU_ACT_SITU with
 * beta and lin_beta: em_gpu_swiglu's / em_gpu_situ's arithmetic), quantized in the launch that
 * makes them, bit-identical to the activation's launch followed by em_gpu_act_prepare. Only for
 * weights whose activations are Q8_0 (the rows exist only quantized: out->x is NULL). */
int em_gpu_act_prepare_glu(em_gpu *g, int wtype, const float *d_gate, const float *d_up, int64_t ldx, int64_t cols,
                           int n, int act, float beta, float lin_beta, void *d_scratch, em_gpu_act *out, em_err *err);

/* ---- matrix products -------------------------------------------------------------------- */

/* y[j][r] = W[r, :] . act[j] for j < act->n, r < w->rows; row j of y at d_y + j * ldy. Each
 * weight byte is read once for all rows; fp32 accumulation; row j's result does not depend on
 * act->n (same per-thread order, same fixed warp reduction). Above EM_GPU_MAX_ROWS rows (up to
 * EM_GPU_WIDE_MAX_ROWS, activations not made in block), Q8_0 weights run on the tensor cores and
 * F32 weights a thread an output and row, both with the same bits, other types in calls of
 * EM_GPU_MAX_ROWS rows. */
int em_gpu_matmul(em_gpu *g, const em_gpu_mat *w, const em_gpu_act *act, float *d_y, int64_t ldy, em_err *err);

/* Several products of the same activations in one launch (the projections of one input):
 * out[i].d_y = out[i].w . act, each output bit-identical to em_gpu_matmul of its matrix (the
 * same warp bodies; a block belongs to one product). All matrices of one device layout and
 * act->cols columns; 1..EM_GPU_MULTI_MAX of them. */
#define EM_GPU_MULTI_MAX 8
typedef struct em_gpu_mm_out {
    const em_gpu_mat *w;
    float *d_y;
    int64_t ldy;
} em_gpu_mm_out;
int em_gpu_matmul_multi(em_gpu *g, const em_gpu_mm_out *out, int count, const em_gpu_act *act, em_err *err);

/* Per-head products, all heads in one launch (two with the Q8_0 quantization): for head
 * h < n_heads and row j < n, y[j * ldy + h * y_head_stride + r] = W[h * head_rows + r, :] .
 * x[j * ldx + h * x_head_stride + 0..cols) for r < head_rows (w->rows == n_heads * head_rows,
 * w->cols == cols); MLA's absorbed query (attn_k_b: head_rows kv_lora, cols nope) and value
 * up-projection (attn_v_b: head_rows v_head, cols kv_lora). The activations are prepared as
 * em_gpu_act_prepare prepares them (Q8_0 into d_scratch for integer weight layouts, 16-byte
 * aligned, em_gpu_matmul_heads_scratch_bytes; F32 as they are for float weights, then d_x, ldx
 * and x_head_stride 16-byte aligned), and each (head, row) result is bit-identical to
 * em_gpu_matmul of that head's rows on that row (the same warp bodies): width-invariant. n is
 * 1..EM_GPU_WIDE_MAX_ROWS (past EM_GPU_MAX_ROWS, groups of EM_GPU_MAX_ROWS rows in one launch). */
uint64_t em_gpu_matmul_heads_scratch_bytes(int wtype, int n_heads, int64_t cols, int n);
int em_gpu_matmul_heads(em_gpu *g, const em_gpu_mat *w, int n_heads, int64_t head_rows, const float *d_x,
                        int64_t ldx, int64_t x_head_stride, int64_t cols, int n, void *d_scratch, float *d_y,
                        int64_t ldy, int64_t y_head_stride, em_err *err);

/* ---- row ops (fp32; device pointers) ------------------------------------------------------ */

/* y = x * rsqrt(mean(x^2) + eps) * w over rows rows of n values (w NULL: no weight); sums of
 * squares in double, the scale rounded to fp32 once, as compute/'s em_rmsnorm. y may be x. */
int em_gpu_rmsnorm_rows(em_gpu *g, const float *d_x, int64_t ldx, const float *d_w, float eps, int rows,
                        int64_t n, float *d_y, int64_t ldy, em_err *err);
/* The residual step and the norm after it in one launch: x += y (+ y2): when d_y is not NULL,
 * t = y (+ y2 when d_y2 is not NULL, rounded first), x = x + t written back (em_gpu_add's
 * rounding, two adds as two em_gpu_add calls would make them; y and y2 rows ldy apart); then
 * h = em_gpu_rmsnorm_rows of x with weight w (NULL: none), and when q is not NULL also h's
 * Q8_0 activations, exactly as em_gpu_act_prepare makes them, into d_scratch
 * (em_gpu_act_bytes(EM_TYPE_Q8_0, n, rows), 16-byte aligned; n a multiple of 32), described in
 * *q. rows 1..EM_GPU_WIDE_MAX_ROWS (a block a row: each row's arithmetic is its own). */
int em_gpu_add_rmsnorm(em_gpu *g, float *d_x, int64_t ldx, const float *d_y, const float *d_y2, int64_t ldy,
                       const float *d_w, float eps, int rows, int64_t n, float *d_h, int64_t ldh, void *d_scratch,
                       em_gpu_act *q, em_err *err);
/* y = silu(gate) * up over count values. y may alias gate or up. */
int em_gpu_swiglu(em_gpu *g, const float *d_gate, const float *d_up, int64_t count, float *d_y, em_err *err);
/* y = SiTU(gate, up) over count values, compute/'s em_situ (kimi-k3's MLP activation):
 * a = beta * tanh(gate * (1/beta)) * sigmoid(gate), u = lin_beta > 0 ? lin_beta * tanh(up *
 * (1/lin_beta)) : up, y = a * u, the reciprocals rounded to fp32 first as there. beta > 0.
 * y may alias gate or up. */
int em_gpu_situ(em_gpu *g, const float *d_gate, const float *d_up, int64_t count, float beta, float lin_beta, float *d_y,
                em_err *err);
/* x[i] *= sigmoid(gate[i]) over count values (compute/'s em_sigmoidf: 1 / (1 + exp(-g))); the
 * output gate of K3's gated MLA (model/mla.c). */
int em_gpu_sigmoid_mul(em_gpu *g, float *d_x, const float *d_gate, int64_t count, em_err *err);
/* y = a + b over count values. y may alias a or b. */
int em_gpu_add(em_gpu *g, const float *d_a, const float *d_b, int64_t count, float *d_y, em_err *err);
/* Row j of y (d_y + j * ldy) = row tok[j] of the table, as floats, for j < n (device token
 * ids). A token id outside [0, rows) gives a row of NaN, never a read out of bounds. */
int em_gpu_embed(em_gpu *g, const em_gpu_mat *table, const int32_t *d_tok, int n, float *d_y, int64_t ldy,
                 em_err *err);
/* out[j] = the index of the largest value of row j (d_x + j * ldx, n values), NaN skipped,
 * the lowest index on ties, -1 when the row is all NaN: sample/'s em_argmax exactly. */
int em_gpu_argmax_rows(em_gpu *g, const float *d_x, int64_t ldx, int rows, int64_t n, int32_t *d_out,
                       em_err *err);
/* HF rotate-half RoPE as compute/'s em_rope_apply with em_rope_cos_sin: for row j (at
 * d_x + j * ldx), the first dims values of n_heads heads (head h at + h * head_stride) turn
 * by position d_pos[j] (device) times inv_freq (device doubles, dims/2 of them: em_rope's
 * table), cos and sin computed in double and scaled by attn_factor, then rounded to fp32. */
int em_gpu_rope_rows(em_gpu *g, float *d_x, int64_t ldx, int rows, int n_heads, int64_t head_stride, int dims,
                     const int32_t *d_pos, const double *d_inv_freq, double attn_factor, em_err *err);

/* K3's block attention residuals (AttnRes), model/attnres.c's kimi_res_input: for each row
 * t < rows, over the n_bank banked rows r_j (bank j's row t at d_bank + j * ld_bank + t * E,
 * E = n_embd) and the stream x (d_x + t * ldx), E values each (w: [E]):
 *   p = softmax(score(r_0), ..., score(r_{n_bank-1}), score(x)),
 *   score(r) = (float)(sum_d r_d w_d * (float)(1 / sqrt(sum_d r_d^2 / E + eps))) (sums in double,
 *   a fixed tree), softmax as em_softmax (max subtracted, exp of each rounded to fp32, their
 *   sum in double, times (float)(1 / sum)),
 *   out[d] = (sum_j p_j r_j[d], float, j ascending) + p_x x[d]   (d_out + t * ldo).
 * n_bank 0..255; with n_bank 0 out is a copy of x (the CPU returns x itself) and d_w may be
 * NULL. out may be x itself (ldo == ldx); it must not overlap the bank. */
int em_gpu_res_mix(em_gpu *g, const float *d_bank, int n_bank, int64_t ld_bank, const float *d_x, int64_t ldx,
                   const float *d_w, int64_t n_embd, float eps, int rows, float *d_out, int64_t ldo, em_err *err);

/* ---- MoE router ------------------------------------------------------------------------ */

/* The router of model/moe.c (kimi_moe_route) over rows rows of n_expert logits (d_logits + j * ldl):
 * s = sigmoid(logit), choice = s + bias; with n_group > 1 only the n_group_used groups with
 * the largest sums of their two best choices stay; ids = top-k of choice (lowest index on
 * ties); weights = s[ids], divided by their sum (+1e-20) when norm, times scale. Row j's ids
 * at d_ids + j * k, weights at d_wts + j * k. n_expert <= 1024, k <= 32. */
typedef struct em_gpu_router {
    int n_expert, k, n_group, n_group_used;
    bool norm;
    float scale;
} em_gpu_router;
int em_gpu_route(em_gpu *g, const em_gpu_router *r, const float *d_logits, int64_t ldl, const float *d_bias,
                 int rows, int32_t *d_ids, float *d_wts, em_err *err);

/* ---- routed experts (moe.cu) ------------------------------------------------------------ */

/* One MoE layer's routed experts as GGUF stacks them, of any device layout the products run
 * (em_gpu_mat_type_ok; gate, up and down may differ): gate and up hold n_expert * ffn rows of
 * cols values (expert e: rows [e * ffn, (e + 1) * ffn)), down holds n_expert * cols rows of
 * ffn values. act picks the MLP activation between the products. */
typedef struct em_gpu_experts {
    const em_gpu_mat *gate, *up, *down;
    int n_expert, ffn;
    int act;                       /* EM_GPU_ACT_SWIGLU (0) or EM_GPU_ACT_SITU */
    float situ_beta, situ_lin_beta; /* SiTU's beta (> 0) and lin_beta (<= 0: up as is) */
} em_gpu_experts;

/* Scratch bytes em_gpu_moe needs for n rows of cols values routed to k experts each (for
 * experts of any types). */
uint64_t em_gpu_moe_scratch_bytes(int n_expert, int k, int ffn, int64_t cols, int n);
/* y[j] = sum over the k experts of row j, in ascending expert order, of
 * wts[j][i] * down_e(act(gate_e x_j, up_e x_j)), for rows j < n (1..16) of x (d_x + j * ldx),
 * into d_y + j * ldy (overwritten); act is SwiGLU or SiTU (x->act). d_ids / d_wts: [n][k] on
 * the device, as em_gpu_route writes them (k distinct ids in [0, n_expert) per row). The union
 * of the rows' experts is built on the device; each expert of the union runs once over the
 * rows routed to it (gate and up in one launch, or one each when their types differ; down in
 * another), with the warp bodies of em_gpu_matmul, so each row gets exactly the arithmetic of
 * the dense product of its expert's matrices (activations as em_gpu_act_prepare makes them for
 * each matrix's type: Q8_0 for integer layouts, the F32 rows for float ones); row j does not
 * depend on the other rows (width invariance). Launch shapes depend only on n, k and the
 * types; no host sync (graph-capturable). Float gate/up need d_x 16-byte aligned and ldx a
 * multiple of 4. The CPU twin is model/moe.c's routed_experts (y = 0; y += w * out per expert,
 * in ascending order; quant/'s products, em_swiglu or em_situ). */
int em_gpu_moe(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n, const int32_t *d_ids,
               const float *d_wts, int k, void *d_scratch, float *d_y, int64_t ldy, em_err *err);

/* em_gpu_moe on inputs the caller already made into Q8_0 activations (x_act: em_gpu_act_prepare
 * of the n rows of d_x; used where gate or up take Q8_0), which saves their quantization here.
 * Bit-identical to em_gpu_moe. */
int em_gpu_moe_prepared(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n,
                        const em_gpu_act *x_act, const int32_t *d_ids, const float *d_wts, int k, void *d_scratch,
                        float *d_y, int64_t ldy, em_err *err);

/* ---- wide passes: a prompt's rows (prefill) --------------------------------------------
 * em_gpu_moe over up to EM_GPU_WIDE_MAX_ROWS rows (n * k <= EM_GPU_WIDE_MAX_PAIRS: any k up to
 * 32), for a prefill's wide passes: the union is built over all n rows, an expert chosen by
 * more rows than a slot holds taking several union slots (up to 8 rows of Q8_0 experts on the
 * tensor cores, up to 4 of other types: those measured fastest), so that each expert runs once
 * per call, its slots side by side in one launch, rather than once per 16 rows. Every slot
 * gives each row em_gpu_moe's arithmetic and the sum is its sum, so row j's output is
 * bit-identical to em_gpu_moe's for that row (in any chunk of rows: width invariance still
 * holds). The inputs are quantized here (as em_gpu_act_prepare would). d_scratch:
 * em_gpu_moe_wide_scratch_bytes. */
#define EM_GPU_WIDE_MAX_PAIRS (EM_GPU_WIDE_MAX_ROWS * 32)
uint64_t em_gpu_moe_wide_scratch_bytes(int n_expert, int k, int ffn, int64_t cols, int n);
int em_gpu_moe_wide(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n, const int32_t *d_ids,
                    const float *d_wts, int k, void *d_scratch, float *d_y, int64_t ldy, em_err *err);

/* ---- experts in shares (expert parallelism; docs/cuda.md "Several GPUs") -----------------
 * A MoE layer's experts split into contiguous shares, each held by one device: share r holds
 * experts first[r] .. first[r + 1] - 1. em_gpu_moe_share runs the experts a share holds over
 * the rows routed to them (ids are the whole layer's), with em_gpu_moe's kernels, and leaves
 * each slot's unweighted down output at row (j k + t) of d_slots [n * k][cols] (slots of
 * experts it does not hold are not written); em_gpu_moe_combine then makes y from every
 * share's slots with em_gpu_moe's sum (ascending expert order, each product rounded, then the
 * add). So y is bit-identical to em_gpu_moe over the whole stack, however the experts are
 * split. */
#define EM_GPU_MAX_SHARES 8

typedef struct em_gpu_moe_parts {
    const float *out[EM_GPU_MAX_SHARES];  /* each share's d_slots, on the combining device */
    int first[EM_GPU_MAX_SHARES + 1];     /* share r: experts first[r] .. first[r + 1] - 1 */
    int n;                                /* shares, 1..EM_GPU_MAX_SHARES */
} em_gpu_moe_parts;

/* share: the share's stacks (share->n_expert experts, the first being expert first_expert of
 * the layer); x_act as em_gpu_moe_prepared's (or NULL); d_scratch of
 * em_gpu_moe_scratch_bytes(share->n_expert, k, ffn, cols, n) bytes. */
int em_gpu_moe_share(em_gpu *g, const em_gpu_experts *share, int first_expert, const float *d_x, int64_t ldx, int n,
                     const em_gpu_act *x_act, const int32_t *d_ids, int k, void *d_scratch, float *d_slots,
                     em_err *err);
int em_gpu_moe_combine(em_gpu *g, const em_gpu_moe_parts *parts, const int32_t *d_ids, const float *d_wts, int n,
                       int k, int64_t cols, float *d_y, int64_t ldy, em_err *err);

/* The exchanges between the devices of one host that hold shares (ep.cu): a communicator over
 * gpus[0..n-1] (distinct devices, 1..EM_GPU_MAX_SHARES; device 0 routes and combines), NCCL
 * underneath for two or more (libnccl.so.2, loaded then; NCCL_NVLS_ENABLE=0 unless the
 * environment sets it). Each exchange is queued on every device's current stream, no host
 * sync; with one device both are no-ops. */
typedef struct em_gpu_ep em_gpu_ep;
int em_gpu_ep_open(em_gpu *const *gpus, int n, em_gpu_ep **out, em_err *err);
void em_gpu_ep_close(em_gpu_ep *ep); /* NULL-safe */
int em_gpu_ep_devices(const em_gpu_ep *ep);
/* bytes at bufs[0] (device 0) into bufs[r] of every device r >= 1. */
int em_gpu_ep_broadcast(em_gpu_ep *ep, void *const *bufs, uint64_t bytes, em_err *err);
/* bytes at src[r] (device r >= 1) into dst[r] on device 0 (src[0], dst[0] unused). */
int em_gpu_ep_gather(em_gpu_ep *ep, const void *const *src, void *const *dst, uint64_t bytes, em_err *err);

/* ==== sequence state: KDA and MLA (kda.cu, mla.cu) ===================================== */

/* ---- KDA (model/kda.c's twin; docs/cuda.md "Sequence state on the device") --------------
 * A KDA layer's recurrent core on rows already projected, as model/kda.h describes: short
 * causal conv + SiLU over q/k/v with its window, q/k L2 norms, decay gate (softplus or
 * bounded), beta = sigmoid(b), the delta rule per head in fp32, the gated RMSNorm of the
 * output. ReplaySSM: em_gpu_kda_forward runs n rows on top of the committed state without
 * writing it and logs each row's transition; em_gpu_kda_commit folds the first k logged rows
 * into the committed state with the same per-column arithmetic, so verify(n) + commit(k)
 * leaves the bits k one-row forward + commit(1) calls leave. head_dim is 32, 64 or 128 (a
 * thread keeps one column of a head's state in registers). */
typedef struct em_gpu_kda_dims {
    int n_head, head_dim, d_conv; /* d_conv 1..16 */
    float norm_eps, l2_eps;       /* as em_kda_dims */
    bool bounded_gate;            /* K3's form; else Kimi-Linear's softplus form */
    float gate_lower_bound;
} em_gpu_kda_dims;

/* Device f32 weights, layouts as em_kda_params. */
typedef struct em_gpu_kda_params {
    const float *conv_q, *conv_k, *conv_v; /* [d_inner][d_conv], tap d_conv-1 = current row */
    const float *ssm_a;                    /* [n_head] */
    const float *dt_bias;                  /* [d_inner] */
    const float *o_norm;                   /* [head_dim] */
} em_gpu_kda_params;

/* Device state: conv [3][d_conv-1][d_inner] (oldest first, as em_kda_state) and S
 * [n_head][head_dim][head_dim] fp32, caller memory (em_gpu_kda_state_floats in all). */
typedef struct em_gpu_kda_state {
    float *conv, *S;
} em_gpu_kda_state;

/* The device transition log of the last forward: per row post-conv normed k, v, decay g
 * ([rows][d_inner] each), beta ([rows][n_head]), the pre-conv q|k|v rows ([rows][3 d_inner]);
 * and the forward's scratch (normed q, k.q, pre-norm outputs). Laid out by em_gpu_kda_log_init
 * in caller device memory of em_gpu_kda_log_bytes. n and consumed are host-side bookkeeping. */
typedef struct em_gpu_kda_log {
    int max_rows, n;
    bool consumed;
    float *k, *v, *g, *beta, *pre, *q, *kq, *o;
} em_gpu_kda_log;

/* EM_EINVAL naming the field (EM_EUNSUPPORTED for a head_dim the kernels lack). */
int em_gpu_kda_dims_check(const em_gpu_kda_dims *d, em_err *err);
uint64_t em_gpu_kda_state_floats(const em_gpu_kda_dims *d); /* 0 when dims are bad */
/* A log of max_rows rows, 1..EM_GPU_WIDE_MAX_ROWS (above EM_GPU_MAX_ROWS: a prefill's wide pass,
 * whose committing forward runs all its rows in one call); 0 when bad. */
uint64_t em_gpu_kda_log_bytes(const em_gpu_kda_dims *d, int max_rows);
/* Lays the log out in d_mem (em_gpu_kda_log_bytes, 256-byte aligned: em_gpu_alloc's). */
int em_gpu_kda_log_init(const em_gpu_kda_dims *d, int max_rows, void *d_mem, em_gpu_kda_log *out, em_err *err);
/* n rows (0..log->max_rows): qkv [n][3 d_inner] pre-conv, f [n][d_inner] before dt_bias, b
 * [n][n_head] before sigmoid, g2 [n][d_inner] before sigmoid; out [n][d_inner] (device, all
 * contiguous). committed is read, never written. Row j does not depend on n (up to 4 rows run
 * in one launch, more in three: the same arithmetic). With q8 not NULL, out's Q8_0 activations
 * are made in the same launch, bit-identical to em_gpu_act_prepare's (into d_q8:
 * em_gpu_act_bytes(EM_TYPE_Q8_0, d_inner, n), 16-byte aligned), and described in *q8 (the
 * output projection's input). */
int em_gpu_kda_forward(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p,
                       const em_gpu_kda_state *committed, int n, const float *d_qkv, const float *d_f,
                       const float *d_b, const float *d_g2, float *d_out, void *d_q8, em_gpu_act *q8,
                       em_gpu_kda_log *log, em_err *err);
/* em_gpu_kda_forward of n rows, then em_gpu_kda_commit of all n into st (the committed state
 * the forward reads): the same bits, with a launch fewer where n > 4 (the recurrence writes
 * the state back as it ends). For prefill, which commits every row. The log is left consumed. */
int em_gpu_kda_forward_commit(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p, em_gpu_kda_state *st,
                              int n, const float *d_qkv, const float *d_f, const float *d_b, const float *d_g2,
                              float *d_out, void *d_q8, em_gpu_act *q8, em_gpu_kda_log *log, em_err *err);
/* Folds the first k (0..log->n) logged rows into st (the forward's committed state,
 * unchanged since): conv window advanced, S replayed in place. The log is consumed: a second
 * commit before the next forward is EM_EINVAL. */
int em_gpu_kda_commit(em_gpu *g, const em_gpu_kda_dims *d, em_gpu_kda_state *st, em_gpu_kda_log *log, int k,
                      em_err *err);
/* em_gpu_kda_commit of k rows for `layers` layers of the same dims at once (st[i] with
 * log[i]): the layers are independent, so they go in one launch (per 24 layers), each
 * bit-identical to its own em_gpu_kda_commit. Every log is checked before any is consumed. */
int em_gpu_kda_commit_layers(em_gpu *g, const em_gpu_kda_dims *d, em_gpu_kda_state *st, em_gpu_kda_log *log,
                             int layers, int k, em_err *err);

/* ---- MLA absorbed attention over the latent cache (model/mla.c's twin) ------------------
 * The cache holds per position [c | k_pe] (kv_lora + rope floats): c = RMSNorm(latent)
 * (weight, eps), k_pe as is. Rollback is by position: the caller's length moves back, later
 * appends overwrite the rows past it. Positions are read on the device (d_pos: one int32, the
 * first row's position), so a captured graph serves every position. */
typedef struct em_gpu_mla_dims {
    int n_head, kv_lora, rope; /* cache row = kv_lora + rope floats */
    int nope;                  /* the score scale is 1 / sqrt(nope + rope) */
    int64_t capacity;          /* cache rows allocated */
} em_gpu_mla_dims;

/* Cache rows [*d_pos, *d_pos + n) = [RMSNorm(lat[j][0:kv_lora]) * w | lat[j][kv_lora:]], from
 * n rows of lat (d_lat + j * ldl); em_rmsnorm's arithmetic. Rows past capacity are not written. */
int em_gpu_mla_append(em_gpu *g, const em_gpu_mla_dims *d, float *d_cache, const int32_t *d_pos, int n,
                      const float *d_lat, int64_t ldl, const float *d_norm_w, float eps, em_err *err);
/* Scratch floats em_gpu_mla_attend needs for n rows: each row's and head's partial sums over up
 * to 64 splits of its positions (64 x (kv_lora + 2) floats, fewer for a capacity under 2048
 * rows); 8-byte aligned. */
uint64_t em_gpu_mla_scratch_floats(const em_gpu_mla_dims *d, int n);
/* For query row t < n at position *d_pos + t and head h: qa = d_qa + t * ldq + h * (kv_lora +
 * rope) (the absorbed query); s(u) = (cache[u] . qa) / sqrt(nope + rope) for u <= pos + t,
 * p = softmax(s) (exp by em_expf_poly), ctx = sum_u p(u) c_u into d_ctx + t * ldc + h *
 * kv_lora, as model/mla.c computes them up to rounding: the positions are cut into tiles of 32
 * over up to 64 splits, each an online softmax, then merged (the exact order: mla.cu). A
 * position past capacity gives NaN rows. Row t does not depend on n. Two launches (the splits,
 * their merge). */
int em_gpu_mla_attend(em_gpu *g, const em_gpu_mla_dims *d, const float *d_cache, const int32_t *d_pos, int n,
                      const float *d_qa, int64_t ldq, float *d_scratch, float *d_ctx, int64_t ldc, em_err *err);

/* ---- the drafter (draft/dspark_cuda.c; draft/dspark.c is the reference) -------------------- */

/* Grouped-query attention of n block rows (draft/dspark.c's attn_task): for row i and query
 * head h (kv head h / (n_head / n_kv)), out = softmax(q . K / sqrt(hd)) V over the cache rows
 * 0 .. *d_n_ctx - 1 (d_kc / d_vc: capacity rows of n_kv * hd) followed by the block rows 0 ..
 * nb - 1 (d_k / d_v: n rows of n_kv * hd; nb = n, or i + 1 when causal). q and out: n rows of
 * n_head * hd. The context length is read on the device, so a captured graph serves every
 * length; past capacity it is clamped. Scores in fp32 (each a fixed order of fma chains and
 * adds over its columns), the softmax's sum in double, p V summed over spans of positions
 * added in a fixed order: close to the CPU's, not bit-identical, the same bits every launch (a
 * drafter's numbers only steer which tokens it proposes; the target decides). d_scratch:
 * em_gpu_gqa_scratch_floats floats. */
typedef struct em_gpu_gqa_dims {
    int n_head, n_kv, hd;  /* hd <= 256, n_head a multiple of n_kv */
    int64_t capacity;
    bool causal;
} em_gpu_gqa_dims;
/* rope (may be NULL): the heads' norms and RoPE that em_gpu_head_norm_rope would apply to q and
 * k first (weights wq, wk, NULL for none; RoPE over 2 half values at pos[row]), applied inside
 * the attention instead, with that op's arithmetic (so the same values): each block normalizes
 * and rotates its query and its kv head's block rows in shared memory; d_q and d_k are only
 * read. The cache rows are taken as they are. */
typedef struct em_gpu_gqa_rope {
    const float *wq, *wk;
    float eps;
    int half;
    const int32_t *pos;
    const double *inv_freq;
    double attn_factor;
} em_gpu_gqa_rope;
uint64_t em_gpu_gqa_scratch_floats(const em_gpu_gqa_dims *d, int n);
int em_gpu_gqa_attend(em_gpu *g, const em_gpu_gqa_dims *d, const float *d_q, const float *d_kc, const float *d_vc,
                      const int64_t *d_n_ctx, const float *d_k, const float *d_v, int n, const em_gpu_gqa_rope *rope,
                      float *d_scratch, float *d_out, em_err *err);
/* Qwen3 attention's head norms and RoPE in one launch: for every row j < rows, each of the n_qh
 * heads of q (row j at d_q + j * ldq, heads hd apart) and the n_kh heads of k (d_k: NULL for
 * none) is normed over its hd values with its weight (d_wq / d_wk, NULL: none) and then rotated
 * at position pos[j] as em_gpu_rope_rows does (its first dims values). One warp a head: the
 * sum of squares meets in another order than em_gpu_rmsnorm_rows' (the same up to rounding).
 * hd <= 256, dims <= hd. */
int em_gpu_head_norm_rope(em_gpu *g, float *d_q, int64_t ldq, int n_qh, const float *d_wq, float *d_k, int64_t ldk,
                          int n_kh, const float *d_wk, int rows, int hd, float eps, int dims, const int32_t *d_pos,
                          const double *d_inv_freq, double attn_factor, em_err *err);
/* Rows rounded through a feature ring's storage type (decode/ring.c), y = to_float(from_float(x))
 * bit for bit as quant/ does it for finite values: F16 and BF16 to nearest even, Q8_0 in
 * 32-value blocks from each row's start (a last partial block padded with zeros, as the ring
 * pads its rows); F32 copies. rows rows of n values, row j at d_x + j * n and d_y + j * n. */
int em_gpu_round_rows(em_gpu *g, int type, const float *d_x, int64_t n, int rows, float *d_y, em_err *err);
/* x[j][i] += b[i] for rows rows of n values (row j at d_x + j * ldx). */
int em_gpu_add_bias(em_gpu *g, float *d_x, int64_t ldx, int rows, int64_t n, const float *d_b, em_err *err);

/* The slot chain of one propose on the device (draft.h's em_draft_chain for greedy picks,
 * schedule.c's keep test), without a host round trip per slot: the host uploads one
 * em_gpu_draft_io before the block and downloads it after. The walk's fields are schedule.c's
 * em_draft_sched, in the same doubles. */
#define EM_GPU_DRAFT_MAX_BLOCK 16
#define EM_GPU_DRAFT_TOPK 64 /* candidates a sampled slot keeps at most */
typedef struct em_gpu_draft_io {
    /* in: the block's tokens and positions, the context length, the chain */
    int32_t block_tok[EM_GPU_DRAFT_MAX_BLOCK];
    int32_t pos[EM_GPU_DRAFT_MAX_BLOCK];
    int64_t n_ctx;
    int32_t n_max;       /* slots to make at most */
    int32_t may_stop;    /* run the keep test (schedule parameters given) */
    int32_t n_cost;
    int32_t all, stopped, width; /* the walk (em_draft_sched) */
    double expected, survival, best;
    double cost[EM_GPU_DRAFT_MAX_BLOCK + 1];
    /* sampling (em_gpu_draft_sample): the sampler's filters and the key of this block's draws */
    float temperature, top_p, min_p;
    int32_t top_k;       /* 1..EM_GPU_DRAFT_TOPK; larger or off (0) counts as EM_GPU_DRAFT_TOPK */
    uint64_t key;
    /* out: toks[0] is the anchor (in); toks[k + 1] the pick of slot k */
    int32_t alive;       /* 1 while the chain goes on (in: 1) */
    int32_t n;           /* slots made (in: 0) */
    int32_t toks[EM_GPU_DRAFT_MAX_BLOCK + 1];
    float conf[EM_GPU_DRAFT_MAX_BLOCK];
    int32_t n_q[EM_GPU_DRAFT_MAX_BLOCK]; /* sampling: candidates of slot k's distribution */
} em_gpu_draft_io;

/* The distribution a sampled slot's draft was drawn from: ids (target ids) in rank order and
 * their probabilities (io->n_q[k] of them). */
typedef struct em_gpu_draft_q {
    int32_t id[EM_GPU_DRAFT_TOPK];
    float p[EM_GPU_DRAFT_TOPK];
} em_gpu_draft_q;

/* The start of slot k (draft/dspark.c's propose loop before the bias): with a Markov head,
 * e = W1[io->toks[k]], the previous pick's row (rank values as em_gpu_embed makes them; NaN for
 * an id outside W1), into d_e, and when d_e_qs is given also e's Q8_0 activations as
 * em_gpu_act_prepare makes them (quants at d_e_qs, scales at d_e_qd; rank a multiple of 32);
 * then with a confidence head z = (b + w . [h ; e when conf_markov]) / t[k] (h: slot k's final
 * row, d_h + (slot0 + k) * d; d_conf_t NULL: no temperatures), summed in double (a fixed
 * order across one warp), into io->conf[k], and with io->may_stop the keep test (schedule.c's
 * em_draft_sched_keep), which clears io->alive at the first slot it would not verify. Nothing
 * happens once io->alive is 0. */
#define EM_GPU_DRAFT_MAX_RANK 1024
typedef struct em_gpu_draft_slot {
    int w1_type;              /* W1 as uploaded (em_gpu_mat's type, data, scales, rows) */
    const void *w1_data;      /* NULL: no Markov head */
    const void *w1_scales;
    int64_t w1_rows;
    int rank;                 /* 1..EM_GPU_DRAFT_MAX_RANK with a Markov head */
    float *d_e;
    int8_t *d_e_qs;           /* NULL: no activations */
    float *d_e_qd;
    const float *d_h;
    int d, slot0;
    const float *d_conf_w;    /* NULL: no confidence head */
    float conf_b;
    const float *d_conf_t;
    int conf_markov;
} em_gpu_draft_slot;
int em_gpu_draft_slot_begin(em_gpu *g, em_gpu_draft_io *d_io, int k, const em_gpu_draft_slot *slot, em_err *err);
/* The gated and rnn Markov heads around their product (draft/dspark.c markov_bias), with e =
 * W1[prev] and h the slot's final hidden row. em_gpu_draft_markov_in writes the product's input:
 * [h ; e] (gated, d + rank values) or [state ; e ; h] (rnn, 2 rank + d). em_gpu_draft_markov_out
 * takes the product z (rank values, or 3 rank: a, c, o) and its bias b and writes W2's input:
 * sigmoid(z + b) * e (gated), or, for rnn, g = sigmoid(a + b_a), state = g state + (1 - g)
 * tanh(c + b_c), and tanh(o + b_o). One block each; the arithmetic is the CPU's, in floats. */
enum { EM_GPU_MARKOV_GATED = 1, EM_GPU_MARKOV_RNN = 2 };
int em_gpu_draft_markov_in(em_gpu *g, int kind, const float *d_h, int d, const float *d_e, const float *d_state, int rank,
                           float *d_zin, em_err *err);
int em_gpu_draft_markov_out(em_gpu *g, int kind, const float *d_z, const float *d_b, const float *d_e, float *d_state,
                            int rank, float *d_out, em_err *err);
/* Slot k's pick: the argmax of v_i = cap(base[i]) + bias[i] over the dvocab draft ids (cap:
 * c tanh(x / c) when softcap > 0; d_bias NULL: none), the target id of draft id i being
 * d2t[i] (d_d2t NULL: i), NaN skipped, the lowest target id on ties (em_argmax over the target
 * logits, where ids d2t cannot reach are -inf). Sets io->toks[k + 1] and io->n = k + 1, or
 * clears io->alive when no value is usable (or when k + 1 reaches io->n_max, after the pick).
 * d_logits (may be NULL): the row of vocab target logits is written there (-inf where d2t
 * does not reach). Nothing happens once io->alive is 0. next (may be NULL): then the same launch
 * goes on with em_gpu_draft_slot_begin of slot k + 1 (one launch where there were two). */
int em_gpu_draft_pick(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_base, const float *d_bias, int dvocab,
                      float softcap, const int32_t *d_d2t, float *d_logits, int vocab, const em_gpu_draft_slot *next,
                      em_err *err);
/* A greedy chain of the vanilla Markov head in one launch: em_gpu_draft_slot_begin of slot 0,
 * then for each slot k < n_slots (while io->alive and k < io->n_max) the bias W2 e, W2 the
 * uploaded Q8_0 matrix [dvocab][rank] (w2_data int8 rows, w2_scales fp16) and e the previous
 * pick's Markov row (each bias value exactly em_gpu_matmul's on e's Q8_0 activations), and
 * em_gpu_draft_pick of slot k on d_base + k * dvocab with d_logits + k * vocab (the draft
 * ids' values only: the caller fills the rows with -inf first (em_gpu_fill) when d2t does
 * not reach every id), going on with slot k + 1's start. The io and d_e end as that sequence
 * of launches leaves them (slot's d_e_qs / d_e_qd are not written: the launch keeps e's
 * activations to itself). */
int em_gpu_draft_markov_chain(em_gpu *g, em_gpu_draft_io *d_io, int n_slots, const float *d_base, const void *w2_data,
                              const void *w2_scales, int dvocab, int rank, float softcap, const int32_t *d_d2t,
                              float *d_logits, int vocab, const em_gpu_draft_slot *slot, em_err *err);
/* Slot k's draw when sampling, into d_q[k] and io->toks[k + 1] (io->n = k + 1; io->alive
 * cleared when no value is usable, or after the pick when k + 1 reaches io->n_max): over the
 * corrected logits v of em_gpu_draft_pick, sample/'s em_sampler_dist with io's filters on the
 * top_k (at most EM_GPU_DRAFT_TOPK) best ids in its rank order (larger v first, then the lower
 * target id; NaN and -inf never, +inf alone when there is one): min-p against the best,
 * top-p on the softmax of the top-k set, then the temperature; the draw is a counter-based
 * uniform of (io->key, k) against the cumulative probabilities in rank order. With top_k in
 * 1..EM_GPU_DRAFT_TOPK this is the CPU sampler's distribution up to rounding; wider top-k
 * (or none) keeps the best EM_GPU_DRAFT_TOPK. Either way the draft is drawn from exactly the
 * distribution written to d_q, which is what rejection sampling needs. */
int em_gpu_draft_sample(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_base, const float *d_bias, int dvocab,
                        float softcap, const int32_t *d_d2t, em_gpu_draft_q *d_q, em_err *err);

#ifdef __cplusplus
}
#endif

#endif
