/* Internal to model/: the kimi-linear target's hyperparameters, weights and state, shared by
 * kimi_load.c (reading and checking the GGUF), kimi.c (the forward pass, KDA projections and
 * the target ops), mla.c (MLA attention), moe.c (router, experts, dense MLP, K3's SiTU and
 * latent MoE) and attnres.c (K3's block attention residuals). The files form a tree: kimi.c
 * calls the others, they call compute/, experts/ and kda.h, never kimi.c.
 *
 * Weights are views into the mapped GGUF (em_mat), used in place through the dot kernels;
 * vectors (norms, biases, conv taps, ssm_a) and a non-float router are dequantized to f32 at
 * load into w.store. Hyperparameters are checked at load, so the forward code may assume
 * positive, consistent sizes (every product of two of them fits in int64). */
#ifndef EM_MODEL_KIMI_IMPL_H
#define EM_MODEL_KIMI_IMPL_H

#include "compute/compute.h"
#include "experts/experts.h"
#include "format/gguf.h"
#include "model/kda.h"
#include "model/model.h"
#include "model/weights.h"

enum { KIMI_KDA = 0, KIMI_MLA = 1 };

/* eps of the MLA latent norms (kv_a_layernorm, q_a_layernorm): transformers and Moonshot
 * build them without rms_norm_eps, i.e. torch's default 1e-6 (llama.cpp uses rms_norm_eps). */
#define KIMI_MLA_NORM_EPS 1e-6f
/* eps added to the sum of squares in the KDA q/k L2 norm (transformers, fla). */
#define KIMI_L2_EPS 1e-6f

typedef struct kimi_hparams {
    int n_layer, n_embd, n_vocab;
    int64_t n_ctx_train; /* context_length, 0 when absent */
    float rms_eps;
    int *kind;           /* [n_layer] KIMI_KDA / KIMI_MLA */
    int n_kda, n_mla;
    /* KDA */
    int kda_heads, kda_head_dim, d_inner, d_conv;
    /* MLA */
    int mla_heads, nope, rope, v_head, kv_lora, q_lora; /* q_lora 0: direct attn_q */
    /* FFN */
    int n_ff;            /* dense layers */
    int n_lead_dense;    /* layers [0, n_lead_dense) are dense, the rest MoE (if n_expert > 0) */
    int n_expert, n_expert_used, n_ff_exp, n_shared;
    int n_group, n_group_used; /* group-limited routing; 1, 1: off */
    float expert_scale;
    bool expert_norm;    /* renormalize the chosen weights */
    /* kimi-k3 (all zero for kimi-linear) */
    bool k3;
    int n_latent;        /* expert_latent_length: routed experts work at this width; 0: n_embd */
    int res_block;       /* attn_res.block_size: block attention residuals; 0: plain residuals */
    bool situ;           /* SiTU instead of SwiGLU in every MLP (dense, shared, routed) */
    float situ_beta, situ_lin_beta;
    bool gate_bounded;   /* KDA decay g = gate_lb * sigmoid(exp(A_log) (f + dt_bias)) */
    float gate_lb;
} kimi_hparams;

typedef struct kimi_kda_w {
    em_mat q, k, v, f_a, f_b, beta, g_a, g_b, out;
    em_mat g;        /* K3: full-rank output gate (rows 0: low-rank g_a, g_b) */
    em_kda_params p; /* conv taps, ssm_a, dt_bias, o_norm (f32, in w.store) */
} kimi_kda_w;

typedef struct kimi_mla_w {
    em_mat q;                 /* q_lora == 0 */
    em_mat q_a, q_b;          /* q_lora > 0 */
    const float *q_a_norm;
    em_mat kv_a;              /* rows kv_lora + rope */
    const float *kv_a_norm;
    em_mat k_b;               /* [n_head * kv_lora] rows of nope: W_UK^T per head */
    em_mat v_b;               /* [n_head * v_head] rows of kv_lora: W_UV per head */
    em_mat out;
    em_mat gate;              /* K3: sigmoid output gate [n_head * v_head] rows (rows 0: none) */
} kimi_mla_w;

typedef struct kimi_ffn_w {
    bool moe;
    em_mat gate, up, down;            /* dense SwiGLU */
    em_mat router;                    /* [n_expert] rows, f32/f16/bf16 (exact fp32 dots) */
    const float *router_bias;         /* [n_expert] selection bias */
    em_mat gate_exps, up_exps;        /* [n_expert * n_ff_exp] rows of n_embd */
    em_mat down_exps;                 /* [n_expert * n_embd] rows of n_ff_exp */
    em_mat gate_sh, up_sh, down_sh;   /* shared expert (rows == 0: none) */
    /* K3 latent MoE (routed_down.rows == 0: experts at n_embd): experts work on routed_down x
     * ([n_latent] rows of n_embd); their sum is RMSNormed (routed_norm, may be NULL) and mapped
     * back by routed_up ([n_embd] rows of n_latent) */
    em_mat routed_down, routed_up;
    const float *routed_norm;
    int layer;                        /* the model layer (experts/ addresses it so) */
    em_experts *xs;                   /* the routed experts' provider (set at open for MoE layers) */
} kimi_ffn_w;

typedef struct kimi_layer {
    int kind, slot;                   /* slot: index among the KDA or the MLA layers */
    const float *attn_norm, *ffn_norm;
    const float *attn_res, *ffn_res;  /* K3 AttnRes score vectors [n_embd] (NULL: none) */
    kimi_kda_w kda;
    kimi_mla_w mla;
    kimi_ffn_w ffn;
} kimi_layer;

typedef struct kimi_weights {
    em_mat tok_embd;                  /* [n_vocab] rows of n_embd */
    const float *output_norm;
    em_mat output;                    /* [n_vocab] rows of n_embd */
    const float *output_res;          /* K3 AttnRes score before the output norm (NULL: none) */
    kimi_layer *layers;               /* [n_layer] */
    em_arena *store;                  /* f32 vectors made at load */
} kimi_weights;

/* Reads and checks hyperparameters and weights; every matrix and vector passes hook (may be
 * NULL) once (model/weights.h). On failure everything is released. */
int kimi_load(em_gguf *g, const em_wload_hook *hook, kimi_hparams *hp, kimi_weights *w, em_err *err);
void kimi_unload(kimi_hparams *hp, kimi_weights *w);

/* ---- layers --------------------------------------------------------------------------- */

/* The phases of a CPU forward step (ember bench's breakdown; em_phases in base.h): every
 * layer function laps the phase it just finished. Names: kimi_phase_names. */
enum kimi_phase {
    KP_EMBED, KP_NORM, KP_KDA_PROJ, KP_KDA_CORE, KP_KDA_OUT, KP_MLA_PROJ, KP_MLA_ATTN, KP_MLA_OUT,
    KP_ROUTER, KP_EXPERT_PREP, KP_EXPERT_UP, KP_EXPERT_DOWN, KP_EXPERT_SUM, KP_MLP, KP_LM_HEAD,
    KP_KDA_COMMIT, KP_COUNT
};
extern const char *const kimi_phase_names[KP_COUNT];

/* MLA on n rows at positions pos..pos+n-1: h [n][n_embd] normed input; writes the latent cache
 * rows pos..pos+n-1 ([kv_lora normed c | rope k_pe] each) and y [n][n_embd]. */
int kimi_mla_forward(const kimi_hparams *hp, const kimi_mla_w *w, float *cache, int64_t pos, int n,
                     const float *h, float *y, em_pool *pool, em_arena *arena, em_phases *ph, em_err *err);

/* Where an MoE layer reports its choices (all NULL: nowhere): row t's experts at
 * ids + t * ld_ids, its margin at margins + t * ld_margins. */
/* The router for one row of router logits [n_expert]: the chosen experts (best first), their
 * final weights, and the margin (selection score of the last chosen minus the best left out;
 * +inf when nothing is left). scratch: 3 * n_expert + n_group floats. Also the CPU twin the
 * GPU router is tested against (tests/cuda). */
void kimi_moe_route(const kimi_hparams *hp, const float *logits, const float *bias, int *ids,
                    float *weights, float *margin, float *scratch);

typedef struct kimi_route_out {
    int32_t *ids;
    int64_t ld_ids;
    float *margins;
    int64_t ld_margins;
    const int32_t *tokens; /* the rows' tokens: their routes go to the expert provider's memory */
} kimi_route_out;

/* FFN (dense SwiGLU or MoE + shared expert) on n rows: h normed input, y output; ro may be
 * NULL. */
int kimi_ffn_forward(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                     const kimi_route_out *ro, em_pool *pool, em_arena *arena, em_phases *ph, em_err *err);

/* ---- block attention residuals (attnres.c) ------------------------------------------------ */

/* Block attention residuals over one step's rows: a bank of layer inputs (one per block) that
 * every layer half mixes with the current stream x by softmax scores (llama.cpp's res_mix):
 *   s_j = sum_d RMSNorm(r_j)_d w_d over the banked r_j and x;  mix = sum_j softmax(s)_j r_j
 * With res_block == 0 the bank is off and every input is x itself. */
typedef struct kimi_resbank {
    int block;      /* hp->res_block */
    int n_bank, n;  /* banked so far; rows per bank */
    int64_t E;
    float eps;
    float *rows;    /* [max banks][n][E] */
    float *mix;     /* [n][E] */
    float *p;       /* [max banks + 1] scores, then weights, of one row */
} kimi_resbank;
int kimi_res_init(kimi_resbank *b, const kimi_hparams *hp, int n, em_arena *arena, em_err *err);
/* Rows [r0, r0 + m) of a layer half's input: x (no bank) or the mix with score vector w. */
const float *kimi_res_input(kimi_resbank *b, const float *x, const float *w, int r0, int m);
/* At the start of layer l (after its attention input was mixed): banks x when l opens a
 * block; true if it did (the stream then restarts from the attention output). */
bool kimi_res_push(kimi_resbank *b, int l, const float *x);

#endif
