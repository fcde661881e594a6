/* backend/gpu_none.c: the GPU op layer of a build without CUDA (cmake/cuda.cmake compiles it
 * instead of backend/cuda/ when EMBER_CUDA is off or no CUDA compiler was found). Every entry
 * point fails with EM_EUNSUPPORTED and the same message, so `--device cuda:N` says why it cannot
 * run instead of crashing; the free/close functions accept what they are given and do nothing. */
#include "backend/gpu.h"

#include <string.h>

#define NONE(err) em_err_set(err, EM_EUNSUPPORTED, "this ember was built without CUDA (rebuild with nvcc on PATH or -DEMBER_CUDA=ON)")

bool em_gpu_built(void) { return false; }
int em_gpu_device_count(int *n, em_err *err) {
    if (n) *n = 0;
    return NONE(err);
}
int em_gpu_open(int index, em_gpu **out, em_err *err) {
    (void)index;
    if (out) *out = NULL;
    return NONE(err);
}
void em_gpu_close(em_gpu *g) { (void)g; }
void em_gpu_set_overlap(em_gpu *g, bool on) { (void)g, (void)on; }
const em_gpu_info *em_gpu_get_info(const em_gpu *g) {
    (void)g;
    return NULL;
}
int em_gpu_mem(em_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes, em_err *err) {
    (void)g, (void)free_bytes, (void)total_bytes;
    return NONE(err);
}
int em_gpu_alloc(em_gpu *g, uint64_t bytes, const char *what, void **d_out, em_err *err) {
    (void)g, (void)bytes, (void)what;
    if (d_out) *d_out = NULL;
    return NONE(err);
}
void em_gpu_free(em_gpu *g, void *d_ptr) { (void)g, (void)d_ptr; }
int em_gpu_upload(em_gpu *g, void *d_dst, const void *host, uint64_t bytes, em_err *err) {
    (void)g, (void)d_dst, (void)host, (void)bytes;
    return NONE(err);
}
int em_gpu_download(em_gpu *g, void *host, const void *d_src, uint64_t bytes, em_err *err) {
    (void)g, (void)host, (void)d_src, (void)bytes;
    return NONE(err);
}
int em_gpu_memset(em_gpu *g, void *d_dst, int v, uint64_t bytes, em_err *err) {
    (void)g, (void)d_dst, (void)v, (void)bytes;
    return NONE(err);
}
int em_gpu_fill(em_gpu *g, float *d_x, float v, uint64_t n, em_err *err) {
    (void)g, (void)d_x, (void)v, (void)n;
    return NONE(err);
}
int em_gpu_copy(em_gpu *g, void *d_dst, const void *d_src, uint64_t bytes, em_err *err) {
    (void)g, (void)d_dst, (void)d_src, (void)bytes;
    return NONE(err);
}
int em_gpu_copy_2d(em_gpu *g, void *d_dst, uint64_t dpitch, const void *d_src, uint64_t spitch, uint64_t width,
                   uint64_t rows, em_err *err) {
    (void)g, (void)d_dst, (void)dpitch, (void)d_src, (void)spitch, (void)width, (void)rows;
    return NONE(err);
}
int em_gpu_fork(em_gpu *g, int n, em_err *err) {
    (void)g, (void)n;
    return NONE(err);
}
int em_gpu_branch(em_gpu *g, int b, em_err *err) {
    (void)g, (void)b;
    return NONE(err);
}
int em_gpu_join(em_gpu *g, em_err *err) {
    (void)g;
    return NONE(err);
}
int em_gpu_sync(em_gpu *g, em_err *err) {
    (void)g;
    return NONE(err);
}
int em_gpu_capture_begin(em_gpu *g, em_err *err) {
    (void)g;
    return NONE(err);
}
int em_gpu_capture_end(em_gpu *g, em_gpu_graph **out, em_err *err) {
    (void)g;
    if (out) *out = NULL;
    return NONE(err);
}
int em_gpu_graph_launch(em_gpu *g, const em_gpu_graph *gr, em_err *err) {
    (void)g, (void)gr;
    return NONE(err);
}
void em_gpu_graph_free(em_gpu_graph *gr) { (void)gr; }
int em_gpu_mark(em_gpu *g, int which, em_err *err) {
    (void)g, (void)which;
    return NONE(err);
}
int em_gpu_elapsed_ms(em_gpu *g, float *ms, em_err *err) {
    (void)g, (void)ms;
    return NONE(err);
}
int em_gpu_mat_upload(em_gpu *g, int type, int64_t rows, int64_t cols, const void *host, const char *name,
                      em_gpu_mat *out, em_err *err) {
    (void)g, (void)type, (void)rows, (void)cols, (void)host, (void)name;
    if (out) memset(out, 0, sizeof *out);
    return NONE(err);
}
void em_gpu_mat_free(em_gpu *g, em_gpu_mat *m) { (void)g, (void)m; }
int em_gpu_act_prepare(em_gpu *g, int wtype, const float *d_x, int64_t ldx, int64_t cols, int n,
                       void *d_scratch, em_gpu_act *out, em_err *err) {
    (void)g, (void)wtype, (void)d_x, (void)ldx, (void)cols, (void)n, (void)d_scratch, (void)out;
    return NONE(err);
}
int em_gpu_act_prepare_glu(em_gpu *g, int wtype, const float *d_gate, const float *d_up, int64_t ldx, int64_t cols,
                           int n, int act, float beta, float lin_beta, void *d_scratch, em_gpu_act *out, em_err *err) {
    (void)g, (void)wtype, (void)d_gate, (void)d_up, (void)ldx, (void)cols, (void)n, (void)act, (void)beta, (void)lin_beta,
        (void)d_scratch, (void)out;
    return NONE(err);
}
int em_gpu_matmul(em_gpu *g, const em_gpu_mat *w, const em_gpu_act *act, float *d_y, int64_t ldy, em_err *err) {
    (void)g, (void)w, (void)act, (void)d_y, (void)ldy;
    return NONE(err);
}
int em_gpu_matmul_multi(em_gpu *g, const em_gpu_mm_out *out, int count, const em_gpu_act *act, em_err *err) {
    (void)g, (void)out, (void)count, (void)act;
    return NONE(err);
}
uint64_t em_gpu_matmul_heads_scratch_bytes(int wtype, int n_heads, int64_t cols, int n) {
    (void)wtype, (void)n_heads, (void)cols, (void)n;
    return 0;
}
int em_gpu_matmul_heads(em_gpu *g, const em_gpu_mat *w, int n_heads, int64_t head_rows, const float *d_x,
                        int64_t ldx, int64_t x_head_stride, int64_t cols, int n, void *d_scratch, float *d_y,
                        int64_t ldy, int64_t y_head_stride, em_err *err) {
    (void)g, (void)w, (void)n_heads, (void)head_rows, (void)d_x, (void)ldx, (void)x_head_stride, (void)cols, (void)n;
    (void)d_scratch, (void)d_y, (void)ldy, (void)y_head_stride;
    return NONE(err);
}
int em_gpu_rmsnorm_rows(em_gpu *g, const float *d_x, int64_t ldx, const float *d_w, float eps, int rows,
                        int64_t n, float *d_y, int64_t ldy, em_err *err) {
    (void)g, (void)d_x, (void)ldx, (void)d_w, (void)eps, (void)rows, (void)n, (void)d_y, (void)ldy;
    return NONE(err);
}
int em_gpu_swiglu(em_gpu *g, const float *d_gate, const float *d_up, int64_t count, float *d_y, em_err *err) {
    (void)g, (void)d_gate, (void)d_up, (void)count, (void)d_y;
    return NONE(err);
}
int em_gpu_situ(em_gpu *g, const float *d_gate, const float *d_up, int64_t count, float beta, float lin_beta, float *d_y,
                em_err *err) {
    (void)g, (void)d_gate, (void)d_up, (void)count, (void)beta, (void)lin_beta, (void)d_y;
    return NONE(err);
}
int em_gpu_sigmoid_mul(em_gpu *g, float *d_x, const float *d_gate, int64_t count, em_err *err) {
    (void)g, (void)d_x, (void)d_gate, (void)count;
    return NONE(err);
}
int em_gpu_res_mix(em_gpu *g, const float *d_bank, int n_bank, int64_t ld_bank, const float *d_x, int64_t ldx,
                   const float *d_w, int64_t E, float eps, int rows, float *d_out, int64_t ldo, em_err *err) {
    (void)g, (void)d_bank, (void)n_bank, (void)ld_bank, (void)d_x, (void)ldx, (void)d_w, (void)E, (void)eps, (void)rows;
    (void)d_out, (void)ldo;
    return NONE(err);
}
int em_gpu_add(em_gpu *g, const float *d_a, const float *d_b, int64_t count, float *d_y, em_err *err) {
    (void)g, (void)d_a, (void)d_b, (void)count, (void)d_y;
    return NONE(err);
}
int em_gpu_embed(em_gpu *g, const em_gpu_mat *table, const int32_t *d_tok, int n, float *d_y, int64_t ldy,
                 em_err *err) {
    (void)g, (void)table, (void)d_tok, (void)n, (void)d_y, (void)ldy;
    return NONE(err);
}
int em_gpu_argmax_rows(em_gpu *g, const float *d_x, int64_t ldx, int rows, int64_t n, int32_t *d_out,
                       em_err *err) {
    (void)g, (void)d_x, (void)ldx, (void)rows, (void)n, (void)d_out;
    return NONE(err);
}
int em_gpu_rope_rows(em_gpu *g, float *d_x, int64_t ldx, int rows, int n_heads, int64_t head_stride, int dims,
                     const int32_t *d_pos, const double *d_inv_freq, double attn_factor, em_err *err) {
    (void)g, (void)d_x, (void)ldx, (void)rows, (void)n_heads, (void)head_stride, (void)dims, (void)d_pos,
        (void)d_inv_freq, (void)attn_factor;
    return NONE(err);
}
int em_gpu_route(em_gpu *g, const em_gpu_router *r, const float *d_logits, int64_t ldl, const float *d_bias,
                 int rows, int32_t *d_ids, float *d_wts, em_err *err) {
    (void)g, (void)r, (void)d_logits, (void)ldl, (void)d_bias, (void)rows, (void)d_ids, (void)d_wts;
    return NONE(err);
}
uint64_t em_gpu_moe_scratch_bytes(int n_expert, int k, int ffn, int64_t cols, int n) {
    (void)n_expert, (void)k, (void)ffn, (void)cols, (void)n;
    return 0;
}
int em_gpu_moe_prepared(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n,
                        const em_gpu_act *x_act, const int32_t *d_ids, const float *d_wts, int k, void *d_scratch,
                        float *d_y, int64_t ldy, em_err *err) {
    (void)g, (void)x, (void)d_x, (void)ldx, (void)n, (void)x_act, (void)d_ids, (void)d_wts, (void)k, (void)d_scratch;
    (void)d_y, (void)ldy;
    return NONE(err);
}
uint64_t em_gpu_moe_wide_scratch_bytes(int n_expert, int k, int ffn, int64_t cols, int n) {
    (void)n_expert, (void)k, (void)ffn, (void)cols, (void)n;
    return 0;
}
int em_gpu_moe_wide(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n, const int32_t *d_ids,
                    const float *d_wts, int k, void *d_scratch, float *d_y, int64_t ldy, em_err *err) {
    (void)g, (void)x, (void)d_x, (void)ldx, (void)n, (void)d_ids, (void)d_wts, (void)k, (void)d_scratch, (void)d_y, (void)ldy;
    return NONE(err);
}
int em_gpu_add_rmsnorm(em_gpu *g, float *d_x, int64_t ldx, const float *d_y, const float *d_y2, int64_t ldy,
                       const float *d_w, float eps, int rows, int64_t n, float *d_h, int64_t ldh, void *d_scratch,
                       em_gpu_act *q, em_err *err) {
    (void)g, (void)d_x, (void)ldx, (void)d_y, (void)d_y2, (void)ldy, (void)d_w, (void)eps, (void)rows, (void)n;
    (void)d_h, (void)ldh, (void)d_scratch, (void)q;
    return NONE(err);
}
int em_gpu_moe(em_gpu *g, const em_gpu_experts *x, const float *d_x, int64_t ldx, int n, const int32_t *d_ids,
               const float *d_wts, int k, void *d_scratch, float *d_y, int64_t ldy, em_err *err) {
    (void)g, (void)x, (void)d_x, (void)ldx, (void)n, (void)d_ids, (void)d_wts, (void)k, (void)d_scratch, (void)d_y, (void)ldy;
    return NONE(err);
}

/* ==== sequence state: KDA and MLA ========================================================= */

int em_gpu_kda_dims_check(const em_gpu_kda_dims *d, em_err *err) {
    (void)d;
    return NONE(err);
}
uint64_t em_gpu_kda_state_floats(const em_gpu_kda_dims *d) {
    (void)d;
    return 0;
}
uint64_t em_gpu_kda_log_bytes(const em_gpu_kda_dims *d, int max_rows) {
    (void)d, (void)max_rows;
    return 0;
}
int em_gpu_kda_log_init(const em_gpu_kda_dims *d, int max_rows, void *d_mem, em_gpu_kda_log *out, em_err *err) {
    (void)d, (void)max_rows, (void)d_mem;
    if (out) memset(out, 0, sizeof *out);
    return NONE(err);
}
int em_gpu_kda_forward(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p,
                       const em_gpu_kda_state *committed, int n, const float *d_qkv, const float *d_f,
                       const float *d_b, const float *d_g2, float *d_out, void *d_q8, em_gpu_act *q8,
                       em_gpu_kda_log *log, em_err *err) {
    (void)g, (void)d, (void)p, (void)committed, (void)n, (void)d_qkv, (void)d_f, (void)d_b, (void)d_g2, (void)d_out;
    (void)d_q8, (void)q8, (void)log;
    return NONE(err);
}
int em_gpu_kda_forward_commit(em_gpu *g, const em_gpu_kda_dims *d, const em_gpu_kda_params *p, em_gpu_kda_state *st,
                              int n, const float *d_qkv, const float *d_f, const float *d_b, const float *d_g2,
                              float *d_out, void *d_q8, em_gpu_act *q8, em_gpu_kda_log *log, em_err *err) {
    (void)g, (void)d, (void)p, (void)st, (void)n, (void)d_qkv, (void)d_f, (void)d_b, (void)d_g2, (void)d_out;
    (void)d_q8, (void)q8, (void)log;
    return NONE(err);
}
int em_gpu_kda_commit(em_gpu *g, const em_gpu_kda_dims *d, em_gpu_kda_state *st, em_gpu_kda_log *log, int k,
                      em_err *err) {
    (void)g, (void)d, (void)st, (void)log, (void)k;
    return NONE(err);
}
int em_gpu_kda_commit_layers(em_gpu *g, const em_gpu_kda_dims *d, em_gpu_kda_state *st, em_gpu_kda_log *log,
                             int layers, int k, em_err *err) {
    (void)g, (void)d, (void)st, (void)log, (void)layers, (void)k;
    return NONE(err);
}
int em_gpu_mla_append(em_gpu *g, const em_gpu_mla_dims *d, float *d_cache, const int32_t *d_pos, int n,
                      const float *d_lat, int64_t ldl, const float *d_norm_w, float eps, em_err *err) {
    (void)g, (void)d, (void)d_cache, (void)d_pos, (void)n, (void)d_lat, (void)ldl, (void)d_norm_w, (void)eps;
    return NONE(err);
}
uint64_t em_gpu_mla_scratch_floats(const em_gpu_mla_dims *d, int n) {
    (void)d, (void)n;
    return 0;
}
int em_gpu_mla_attend(em_gpu *g, const em_gpu_mla_dims *d, const float *d_cache, const int32_t *d_pos, int n,
                      const float *d_qa, int64_t ldq, float *d_scratch, float *d_ctx, int64_t ldc, em_err *err) {
    (void)g, (void)d, (void)d_cache, (void)d_pos, (void)n, (void)d_qa, (void)ldq, (void)d_scratch, (void)d_ctx, (void)ldc;
    return NONE(err);
}
uint64_t em_gpu_gqa_scratch_floats(const em_gpu_gqa_dims *d, int n) {
    (void)d, (void)n;
    return 0;
}
int em_gpu_gqa_attend(em_gpu *g, const em_gpu_gqa_dims *d, const float *d_q, const float *d_kc, const float *d_vc,
                      const int64_t *d_n_ctx, const float *d_k, const float *d_v, int n, const em_gpu_gqa_rope *rope,
                      float *d_scratch, float *d_out, em_err *err) {
    (void)g, (void)d, (void)d_q, (void)d_kc, (void)d_vc, (void)d_n_ctx, (void)d_k, (void)d_v, (void)n, (void)rope,
        (void)d_scratch, (void)d_out;
    return NONE(err);
}
int em_gpu_head_norm_rope(em_gpu *g, float *d_q, int64_t ldq, int n_qh, const float *d_wq, float *d_k, int64_t ldk,
                          int n_kh, const float *d_wk, int rows, int hd, float eps, int dims, const int32_t *d_pos,
                          const double *d_inv_freq, double attn_factor, em_err *err) {
    (void)g, (void)d_q, (void)ldq, (void)n_qh, (void)d_wq, (void)d_k, (void)ldk, (void)n_kh, (void)d_wk, (void)rows,
        (void)hd, (void)eps, (void)dims, (void)d_pos, (void)d_inv_freq, (void)attn_factor;
    return NONE(err);
}
int em_gpu_round_rows(em_gpu *g, int type, const float *d_x, int64_t n, int rows, float *d_y, em_err *err) {
    (void)g, (void)type, (void)d_x, (void)n, (void)rows, (void)d_y;
    return NONE(err);
}
int em_gpu_add_bias(em_gpu *g, float *d_x, int64_t ldx, int rows, int64_t n, const float *d_b, em_err *err) {
    (void)g, (void)d_x, (void)ldx, (void)rows, (void)n, (void)d_b;
    return NONE(err);
}
int em_gpu_draft_slot_begin(em_gpu *g, em_gpu_draft_io *d_io, int k, const em_gpu_draft_slot *slot, em_err *err) {
    (void)g, (void)d_io, (void)k, (void)slot;
    return NONE(err);
}
int em_gpu_draft_markov_in(em_gpu *g, int kind, const float *d_h, int d, const float *d_e, const float *d_state, int rank,
                           float *d_zin, em_err *err) {
    (void)g, (void)kind, (void)d_h, (void)d, (void)d_e, (void)d_state, (void)rank, (void)d_zin;
    return NONE(err);
}
int em_gpu_draft_markov_out(em_gpu *g, int kind, const float *d_z, const float *d_b, const float *d_e, float *d_state,
                            int rank, float *d_out, em_err *err) {
    (void)g, (void)kind, (void)d_z, (void)d_b, (void)d_e, (void)d_state, (void)rank, (void)d_out;
    return NONE(err);
}
int em_gpu_draft_pick(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_base, const float *d_bias, int dvocab,
                      float softcap, const int32_t *d_d2t, float *d_logits, int vocab, const em_gpu_draft_slot *next,
                      em_err *err) {
    (void)g, (void)d_io, (void)k, (void)d_base, (void)d_bias, (void)dvocab, (void)softcap, (void)d_d2t, (void)d_logits,
        (void)vocab, (void)next;
    return NONE(err);
}
int em_gpu_draft_sample(em_gpu *g, em_gpu_draft_io *d_io, int k, const float *d_base, const float *d_bias, int dvocab,
                        float softcap, const int32_t *d_d2t, em_gpu_draft_q *d_q, em_err *err) {
    (void)g, (void)d_io, (void)k, (void)d_base, (void)d_bias, (void)dvocab, (void)softcap, (void)d_d2t, (void)d_q;
    return NONE(err);
}
int em_gpu_draft_markov_chain(em_gpu *g, em_gpu_draft_io *d_io, int n_slots, const float *d_base, const void *w2_data,
                              const void *w2_scales, int dvocab, int rank, float softcap, const int32_t *d_d2t,
                              float *d_logits, int vocab, const em_gpu_draft_slot *slot, em_err *err) {
    (void)g, (void)d_io, (void)n_slots, (void)d_base, (void)w2_data, (void)w2_scales, (void)dvocab, (void)rank,
        (void)softcap, (void)d_d2t, (void)d_logits, (void)vocab, (void)slot;
    return NONE(err);
}
int em_gpu_moe_share(em_gpu *g, const em_gpu_experts *share, int first_expert, const float *d_x, int64_t ldx, int n,
                     const em_gpu_act *x_act, const int32_t *d_ids, int k, void *d_scratch, float *d_slots,
                     em_err *err) {
    (void)g, (void)share, (void)first_expert, (void)d_x, (void)ldx, (void)n, (void)x_act, (void)d_ids, (void)k;
    (void)d_scratch, (void)d_slots;
    return NONE(err);
}
int em_gpu_moe_combine(em_gpu *g, const em_gpu_moe_parts *parts, const int32_t *d_ids, const float *d_wts, int n,
                       int k, int64_t cols, float *d_y, int64_t ldy, em_err *err) {
    (void)g, (void)parts, (void)d_ids, (void)d_wts, (void)n, (void)k, (void)cols, (void)d_y, (void)ldy;
    return NONE(err);
}
int em_gpu_ep_open(em_gpu *const *gpus, int n, em_gpu_ep **out, em_err *err) {
    (void)gpus, (void)n;
    if (out) *out = NULL;
    return NONE(err);
}
void em_gpu_ep_close(em_gpu_ep *ep) { (void)ep; }
int em_gpu_ep_devices(const em_gpu_ep *ep) {
    (void)ep;
    return 0;
}
int em_gpu_ep_broadcast(em_gpu_ep *ep, void *const *bufs, uint64_t bytes, em_err *err) {
    (void)ep, (void)bufs, (void)bytes;
    return NONE(err);
}
int em_gpu_ep_gather(em_gpu_ep *ep, const void *const *src, void *const *dst, uint64_t bytes, em_err *err) {
    (void)ep, (void)src, (void)dst, (void)bytes;
    return NONE(err);
}
