/* convert/map_kimi.c: the Kimi-Linear mapping as data (llamacpp-formats.md §1.1, §1.3, §1.5).
 * Owns the tensor table (Moonshot names as transformers 5.17 save_pretrained writes them back,
 * plus its `block_sparse_moe.{gate,up,down}_proj` spelling of the dense MLP), the key table and
 * the setup that turns a parsed kimi_linear config into dimensions, per-layer conditions and key
 * values. Both tables are kept in pieces, in order: Kimi-K3's (map_k3.c) are these pieces with
 * its own inserted and two of them replaced, so a rule both architectures share is written once.
 * Refuses what llama.cpp's kimi-linear cannot express (a layer pattern other than "first k
 * dense, then MoE", KDA and MLA head counts that differ). */
#include "convert/convert_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define L "model.layers.{L}."
#define A "model.layers.{L}.self_attn."
#define M "model.layers.{L}.block_sparse_moe."
#define B "blk.{L}."

/* Source shapes are torch shapes (outermost first); GGUF shapes are ggml ne (fastest first):
 * a Linear [out, in] becomes ne [in, out] with the same bytes. */
/* the embedding and the layer input norm */
static const cv_rule kimi_lead[] = {
    { CV_PRE, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, "model.embed_tokens.weight", NULL,
      "token_embd.weight", D2(VOCAB, EMBD), D2(EMBD, VOCAB) },

    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, L "input_layernorm.weight", NULL,
      B "attn_norm.weight", D1(EMBD), D1(EMBD) },
};

/* KDA q/k/v projections and their short convolutions */
static const cv_rule kimi_kda_in[] = {
    /* KDA */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "q_proj.weight", NULL,
      B "attn_q.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "k_proj.weight", NULL,
      B "attn_k.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "v_proj.weight", NULL,
      B "attn_v.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
    /* conv: HF [d_inner, 1, d_conv] or [d_inner, d_conv]; ne [d_conv, 1, d_inner, 1], a pure
     * reshape (the conv tap is fastest in both) */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "q_conv1d.weight", NULL,
      B "ssm_conv1d_q.weight", D3(KDA_INNER, ONE, CONV), D4(CONV, ONE, KDA_INNER, ONE) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "k_conv1d.weight", NULL,
      B "ssm_conv1d_k.weight", D3(KDA_INNER, ONE, CONV), D4(CONV, ONE, KDA_INNER, ONE) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "v_conv1d.weight", NULL,
      B "ssm_conv1d_v.weight", D3(KDA_INNER, ONE, CONV), D4(CONV, ONE, KDA_INNER, ONE) },
};

/* KDA decay (Kimi-Linear: A_log [1, 1, heads, 1]) */
static const cv_rule kimi_a_log[] = {
    /* A_log [1, 1, heads, 1] -> ssm_a = -exp(A_log), ne [1, heads, 1, 1], no ".weight" */
    { CV_LAYER, CV_REQUIRED, CV_X_NEG_EXP, CV_K_F32, CV_C_KDA, A "A_log", NULL, B "ssm_a",
      D4(ONE, ONE, KDA_HEADS, ONE), D4(ONE, KDA_HEADS, ONE, ONE) },
};

/* KDA dt bias, forget gate (low rank) and beta */
static const cv_rule kimi_kda_gates[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "dt_bias", NULL, B "ssm_dt.bias",
      D1(KDA_INNER), D1(KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "f_a_proj.weight", NULL,
      B "ssm_f_a.weight", D2(KDA_HD, EMBD), D2(EMBD, KDA_HD) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "f_b_proj.weight", NULL,
      B "ssm_f_b.weight", D2(KDA_INNER, KDA_HD), D2(KDA_HD, KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "b_proj.weight", NULL,
      B "ssm_beta.weight", D2(KDA_HEADS, EMBD), D2(EMBD, KDA_HEADS) },
};

/* KDA output gate, low rank (Kimi-Linear) */
static const cv_rule kimi_g_lowrank[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "g_a_proj.weight", NULL,
      B "ssm_g_a.weight", D2(KDA_HD, EMBD), D2(EMBD, KDA_HD) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "g_b_proj.weight", NULL,
      B "ssm_g_b.weight", D2(KDA_INNER, KDA_HD), D2(KDA_HD, KDA_INNER) },
};

/* KDA output; MLA up to its value projection */
static const cv_rule kimi_kda_out_mla_in[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "o_norm.weight", NULL,
      B "ssm_norm.weight", D1(KDA_HD), D1(KDA_HD) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "o_proj.weight", NULL,
      B "attn_output.weight", D2(EMBD, KDA_INNER), D2(KDA_INNER, EMBD) },
    /* MLA (NoPE) */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA | CV_C_NOQLORA, A "q_proj.weight",
      NULL, B "attn_q.weight", D2(Q_OUT, EMBD), D2(EMBD, Q_OUT) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA | CV_C_QLORA, A "q_a_proj.weight",
      NULL, B "attn_q_a.weight", D2(Q_LORA, EMBD), D2(EMBD, Q_LORA) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MLA | CV_C_QLORA,
      A "q_a_layernorm.weight", NULL, B "attn_q_a_norm.weight", D1(Q_LORA), D1(Q_LORA) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA | CV_C_QLORA, A "q_b_proj.weight",
      NULL, B "attn_q_b.weight", D2(Q_OUT, Q_LORA), D2(Q_LORA, Q_OUT) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA, A "kv_a_proj_with_mqa.weight",
      NULL, B "attn_kv_a_mqa.weight", D2(KV_A, EMBD), D2(EMBD, KV_A) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MLA, A "kv_a_layernorm.weight", NULL,
      B "attn_kv_a_norm.weight", D1(KV_LORA), D1(KV_LORA) },
    /* kv_b_proj [heads*(nope+v), kv_lora], viewed [heads, nope+v, kv_lora], split in two */
    { CV_LAYER, CV_REQUIRED, CV_X_KV_B_K, CV_K_MATRIX, CV_C_MLA, A "kv_b_proj.weight", NULL,
      B "attn_k_b.weight", D2(KV_B, KV_LORA), D3(NOPE, KV_LORA, HEADS) },
    { CV_LAYER, CV_REQUIRED, CV_X_KV_B_V, CV_K_MATRIX, CV_C_MLA, A "kv_b_proj.weight", NULL,
      B "attn_v_b.weight", D2(KV_B, KV_LORA), D3(KV_LORA, V, HEADS) },
};

/* MLA output; the FFN norm, dense MLP and MoE router */
static const cv_rule kimi_mla_out_ffn[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA, A "o_proj.weight", NULL,
      B "attn_output.weight", D2(EMBD, O_IN), D2(O_IN, EMBD) },

    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, L "post_attention_layernorm.weight", NULL,
      B "ffn_norm.weight", D1(EMBD), D1(EMBD) },
    /* dense MLP: Moonshot `mlp.*`, transformers 5.17 save_pretrained `block_sparse_moe.*` */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_DENSE, L "mlp.gate_proj.weight",
      M "gate_proj.weight", B "ffn_gate.weight", D2(FF, EMBD), D2(EMBD, FF) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_DENSE, L "mlp.up_proj.weight",
      M "up_proj.weight", B "ffn_up.weight", D2(FF, EMBD), D2(EMBD, FF) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_DENSE, L "mlp.down_proj.weight",
      M "down_proj.weight", B "ffn_down.weight", D2(EMBD, FF), D2(FF, EMBD) },
    /* MoE */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_ROUTER, CV_C_MOE, M "gate.weight", NULL,
      B "ffn_gate_inp.weight", D2(NEXP, EMBD), D2(EMBD, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MOE, M "gate.e_score_correction_bias",
      NULL, B "exp_probs_b.bias", D1(NEXP), D1(NEXP) },
};

static const cv_rule kimi_experts[] = {
    /* routed experts as plain float weights, at the routed width (LAT: the hidden size, or K3's
     * latent width); MXFP4 experts are K3's own rules */
    { CV_LAYER, CV_REQUIRED, CV_X_STACK, CV_K_MATRIX, CV_C_MOE | CV_C_DENSEXP,
      M "experts.{E}.w1.weight", NULL, B "ffn_gate_exps.weight", D2(FF_EXP, LAT),
      D3(LAT, FF_EXP, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_STACK, CV_K_MATRIX, CV_C_MOE | CV_C_DENSEXP,
      M "experts.{E}.w3.weight", NULL, B "ffn_up_exps.weight", D2(FF_EXP, LAT),
      D3(LAT, FF_EXP, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_STACK, CV_K_MATRIX, CV_C_MOE | CV_C_DENSEXP,
      M "experts.{E}.w2.weight", NULL, B "ffn_down_exps.weight", D2(LAT, FF_EXP),
      D3(FF_EXP, LAT, NEXP) },
};

/* shared experts (full width) */
static const cv_rule kimi_shexp[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_SHEXP,
      M "shared_experts.gate_proj.weight", NULL, B "ffn_gate_shexp.weight", D2(SHEXP, EMBD),
      D2(EMBD, SHEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_SHEXP,
      M "shared_experts.up_proj.weight", NULL, B "ffn_up_shexp.weight", D2(SHEXP, EMBD),
      D2(EMBD, SHEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_SHEXP,
      M "shared_experts.down_proj.weight", NULL, B "ffn_down_shexp.weight", D2(EMBD, SHEXP),
      D2(SHEXP, EMBD) },
};

/* after the layers */
static const cv_rule kimi_post[] = {
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, "model.norm.weight", NULL,
      "output_norm.weight", D1(EMBD), D1(EMBD) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_UNTIED, "lm_head.weight", NULL,
      "output.weight", D2(VOCAB, EMBD), D2(EMBD, VOCAB) },
    /* tied: llama.cpp's kimi-linear needs output.weight; a checkpoint that still carries
     * lm_head gives it, else the embedding does */
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_TIED, "lm_head.weight",
      "model.embed_tokens.weight", "output.weight", D2(VOCAB, EMBD), D2(EMBD, VOCAB) },
};

/* The pieces K3's table reuses (map_k3.c), and Kimi-Linear's table: all of them, in order. */
const cv_rules em_cv_kimi_lead = CV_TABLE(kimi_lead);
const cv_rules em_cv_kimi_kda_in = CV_TABLE(kimi_kda_in);
const cv_rules em_cv_kimi_kda_gates = CV_TABLE(kimi_kda_gates);
const cv_rules em_cv_kimi_kda_out_mla_in = CV_TABLE(kimi_kda_out_mla_in);
const cv_rules em_cv_kimi_mla_out_ffn = CV_TABLE(kimi_mla_out_ffn);
const cv_rules em_cv_kimi_experts = CV_TABLE(kimi_experts);
const cv_rules em_cv_kimi_shexp = CV_TABLE(kimi_shexp);
const cv_rules em_cv_kimi_post = CV_TABLE(kimi_post);
static const cv_rules kimi_a_log_rules = CV_TABLE(kimi_a_log);
static const cv_rules kimi_g_lowrank_rules = CV_TABLE(kimi_g_lowrank);

static const cv_rules *const kimi_tables[] = {
    &em_cv_kimi_lead,      &em_cv_kimi_kda_in,          &kimi_a_log_rules,
    &em_cv_kimi_kda_gates, &kimi_g_lowrank_rules,       &em_cv_kimi_kda_out_mla_in,
    &em_cv_kimi_mla_out_ffn, &em_cv_kimi_experts,       &em_cv_kimi_shexp,
    &em_cv_kimi_post,
};

#undef L
#undef A
#undef M
#undef B

/* Keys of the Kimi family, written in table order (general.* and tokenizer.* keys come from the
 * engine) and only when the setup sets their value: Kimi-Linear never sets K3's. K3 writes the
 * same pieces in another order (map_k3.c). */
/* sizes, heads, RoPE base, norm epsilon, expert counts and groups */
static const cv_key kimi_keys_dims[] = {
    { "{A}.context_length", CV_T_U32, CV_V_CTX },
    { "{A}.embedding_length", CV_T_U32, CV_V_EMBD },
    { "{A}.block_count", CV_T_U32, CV_V_BLOCKS },
    { "{A}.feed_forward_length", CV_T_U32, CV_V_FF },
    { "{A}.attention.head_count", CV_T_U32, CV_V_HEADS },
    { "{A}.attention.head_count_kv", CV_T_ARR_I32, CV_V_HEADS_KV_ARR },
    { "{A}.rope.freq_base", CV_T_F32, CV_V_ROPE_BASE },
    { "{A}.attention.layer_norm_rms_epsilon", CV_T_F32, CV_V_RMS_EPS },
    { "{A}.expert_count", CV_T_U32, CV_V_N_EXPERT },
    { "{A}.expert_used_count", CV_T_U32, CV_V_N_EXPERT_USED },
    { "{A}.expert_group_count", CV_T_U32, CV_V_EXPERT_GROUPS },
    { "{A}.expert_group_used_count", CV_T_U32, CV_V_EXPERT_GROUPS_USED },
};

/* the router function, and K3's extensions */
static const cv_key kimi_keys_gating[] = {
    { "{A}.expert_gating_func", CV_T_U32, CV_V_GATING },
    /* K3 sets these (after the router function, where llama.cpp's kimi_k3 writer puts them) */
    { "{A}.expert_latent_length", CV_T_U32, CV_V_LATENT },
    { "{A}.activation.situ_beta", CV_T_F32, CV_V_SITU_BETA },
    { "{A}.activation.situ_linear_beta", CV_T_F32, CV_V_SITU_LIN_BETA },
    { "{A}.attn_res.block_size", CV_T_U32, CV_V_ATTN_RES_BLOCK },
};

/* the MLA cache width (MQA view) */
static const cv_key kimi_keys_cache[] = {
    { "{A}.attention.key_length", CV_T_U32, CV_V_KEY_LEN },
    { "{A}.attention.value_length", CV_T_U32, CV_V_VALUE_LEN },
};

/* vocabulary, KDA convolution, head width and (K3) gate lower bound */
static const cv_key kimi_keys_kda[] = {
    { "{A}.vocab_size", CV_T_U32, CV_V_VOCAB },
    { "{A}.ssm.conv_kernel", CV_T_U32, CV_V_CONV_KERNEL },
    { "{A}.kda.head_dim", CV_T_U32, CV_V_KDA_HEAD_DIM },
    { "{A}.kda.gate_lower_bound", CV_T_F32, CV_V_GATE_LB }, /* K3 sets it */
};

/* MLA ranks and the rope slice */
static const cv_key kimi_keys_lora[] = {
    { "{A}.attention.q_lora_rank", CV_T_U32, CV_V_Q_LORA },
    { "{A}.attention.kv_lora_rank", CV_T_U32, CV_V_KV_LORA },
    { "{A}.rope.dimension_count", CV_T_U32, CV_V_ROPE_DIMS },
};

/* MLA head widths, expert widths and weighting */
static const cv_key kimi_keys_moe[] = {
    { "{A}.attention.key_length_mla", CV_T_U32, CV_V_KEY_LEN_MLA },
    { "{A}.attention.value_length_mla", CV_T_U32, CV_V_VALUE_LEN_MLA },
    { "{A}.expert_feed_forward_length", CV_T_U32, CV_V_FF_EXP },
    { "{A}.expert_shared_count", CV_T_U32, CV_V_SHARED },
    { "{A}.leading_dense_block_count", CV_T_U32, CV_V_DENSE_LEAD },
    { "{A}.expert_weights_scale", CV_T_F32, CV_V_EXPERT_SCALE },
    { "{A}.expert_weights_norm", CV_T_BOOL, CV_V_EXPERT_NORM },
};

const cv_keys em_cv_kimi_keys_dims = CV_TABLE(kimi_keys_dims);
const cv_keys em_cv_kimi_keys_gating = CV_TABLE(kimi_keys_gating);
const cv_keys em_cv_kimi_keys_cache = CV_TABLE(kimi_keys_cache);
const cv_keys em_cv_kimi_keys_kda = CV_TABLE(kimi_keys_kda);
const cv_keys em_cv_kimi_keys_lora = CV_TABLE(kimi_keys_lora);
const cv_keys em_cv_kimi_keys_moe = CV_TABLE(kimi_keys_moe);

static const cv_keys *const kimi_key_tables[] = {
    &em_cv_kimi_keys_dims, &em_cv_kimi_keys_gating, &em_cv_kimi_keys_cache,
    &em_cv_kimi_keys_kda,  &em_cv_kimi_keys_lora,   &em_cv_kimi_keys_moe,
};

int em_cv_unsupported(const cv_model *m, em_err *err, const char *what) {
    return em_err_set(err, EM_EUNSUPPORTED, "%s: %s", m->cfg_path, what);
}
#define unsupported em_cv_unsupported

/* What both Kimi architectures need from a config (llama.cpp's kimi-linear and kimi-k3 share
 * the layer skeleton): their activation, NoPE MLA, one head count, a context length, "first k
 * dense, then MoE". *lead gets the number of leading dense layers. */
int em_cv_kimi_common_check(const cv_model *m, const em_hf_kimi *k, const char *arch,
                            const char *act, int64_t *lead, em_err *err) {
    char what[256];
    if (strcmp(k->hidden_act, act) != 0) {
        snprintf(what, sizeof what, "hidden_act '%s': %s uses %s", k->hidden_act, arch, act);
        return unsupported(m, err, what);
    }
    if (!k->mla_use_nope)
        return unsupported(m, err, "mla_use_nope is false: llama.cpp's Kimi MLA is NoPE");
    if (k->n_kda && k->kda_num_heads != k->num_attention_heads) {
        snprintf(what, sizeof what, "KDA heads (%lld) differ from num_attention_heads (%lld): "
                 "llama.cpp's Kimi models have one head count", (long long)k->kda_num_heads,
                 (long long)k->num_attention_heads);
        return unsupported(m, err, what);
    }
    if (k->model_max_length <= 0)
        return em_err_set(err, EM_EFORMAT, "%s: no context length (model_max_length or "
                          "max_position_embeddings)", m->cfg_path);
    int64_t n = 0;
    while (n < k->n_layers && k->mlp[n] == EM_HF_MLP_DENSE) n++;
    for (int l = (int)n; l < k->n_layers; l++)
        if (k->mlp[l] != EM_HF_MLP_MOE) {
            snprintf(what, sizeof what, "layer %d is dense after MoE layers: GGUF expresses only "
                     "'first k layers dense' (leading_dense_block_count)", l);
            return unsupported(m, err, what);
        }
    *lead = n;
    return EM_OK;
}

/* What llama.cpp's kimi-linear can express; everything else is refused by name. */
static int kimi_check(const cv_model *m, const em_hf_kimi *k, int64_t *lead, em_err *err) {
    char what[256];
    if (k->is_k3) /* em_cv_arch_for sends K3 to map_k3.c; a direct caller gets told */
        return unsupported(m, err, "model_type kimi_k3 is converted as kimi-k3, not kimi-linear");
    if (k->quant_method[0]) {
        snprintf(what, sizeof what, "quantization_config.quant_method '%s': only unquantized "
                 "(F32/F16/BF16) checkpoints are converted", k->quant_method);
        return unsupported(m, err, what);
    }
    return em_cv_kimi_common_check(m, k, "kimi-linear", "silu", lead, err);
}

void em_cv_kimi_dims(cv_model *m, const em_hf_kimi *k) {
    int64_t *d = m->dims;
    d[CV_D_EMBD] = k->hidden_size;
    d[CV_D_VOCAB] = k->vocab_size;
    d[CV_D_FF] = k->intermediate_size;
    d[CV_D_FF_EXP] = k->moe_intermediate_size;
    d[CV_D_SHEXP] = k->moe_intermediate_size * k->num_shared_experts;
    d[CV_D_NEXP] = k->num_experts;
    d[CV_D_KDA_HEADS] = k->kda_num_heads;
    d[CV_D_KDA_HD] = k->kda_head_dim;
    d[CV_D_KDA_INNER] = k->kda_num_heads * k->kda_head_dim;
    d[CV_D_CONV] = k->kda_short_conv_kernel_size;
    d[CV_D_HEADS] = k->num_attention_heads;
    d[CV_D_Q_OUT] = k->num_attention_heads * (k->qk_nope_head_dim + k->qk_rope_head_dim);
    d[CV_D_NOPE] = k->qk_nope_head_dim;
    d[CV_D_V] = k->v_head_dim;
    d[CV_D_KV_LORA] = k->kv_lora_rank;
    d[CV_D_KV_A] = k->kv_lora_rank + k->qk_rope_head_dim;
    d[CV_D_KV_B] = k->num_attention_heads * (k->qk_nope_head_dim + k->v_head_dim);
    d[CV_D_O_IN] = k->num_attention_heads * k->v_head_dim;
    d[CV_D_Q_LORA] = k->q_lora_rank;
    d[CV_D_LAT] = k->routed_expert_hidden_size > 0 ? k->routed_expert_hidden_size : k->hidden_size;
}

int em_cv_kimi_values(cv_model *m, const em_hf_kimi *k, int64_t lead, em_err *err) {
    em_cv_set_u(m, CV_V_CTX, (uint64_t)k->model_max_length);
    em_cv_set_u(m, CV_V_EMBD, (uint64_t)k->hidden_size);
    em_cv_set_u(m, CV_V_BLOCKS, (uint64_t)k->num_hidden_layers);
    em_cv_set_u(m, CV_V_FF, (uint64_t)k->intermediate_size);
    em_cv_set_u(m, CV_V_HEADS, (uint64_t)k->num_attention_heads);
    /* 1 on MLA layers (MQA with one latent head), 0 on KDA: the only place the GGUF holds the
     * layer pattern (is_recr = head_count_kv == 0) */
    int32_t *kv = em_malloc((size_t)k->n_layers * sizeof *kv, "head_count_kv", err);
    if (!kv) return EM_ENOMEM;
    for (int l = 0; l < k->n_layers; l++) kv[l] = k->attn[l] == EM_HF_ATTN_MLA ? 1 : 0;
    em_cv_set_arr(m, CV_V_HEADS_KV_ARR, kv, k->n_layers);
    if (k->rope.theta > 0) em_cv_set_f(m, CV_V_ROPE_BASE, k->rope.theta);
    em_cv_set_f(m, CV_V_RMS_EPS, k->rms_norm_eps);
    if (k->num_experts > 0) {
        em_cv_set_u(m, CV_V_N_EXPERT, (uint64_t)k->num_experts);
        em_cv_set_u(m, CV_V_N_EXPERT_USED, (uint64_t)k->num_experts_per_token);
        if (k->num_expert_group > 0) {
            em_cv_set_u(m, CV_V_EXPERT_GROUPS, (uint64_t)k->num_expert_group);
            em_cv_set_u(m, CV_V_EXPERT_GROUPS_USED, (uint64_t)k->topk_group);
        }
        /* llama_expert_gating_func_type: 1 softmax, 2 sigmoid */
        em_cv_set_u(m, CV_V_GATING,
                    strcmp(k->moe_router_activation_func, "softmax") == 0 ? 1 : 2);
        em_cv_set_u(m, CV_V_FF_EXP, (uint64_t)k->moe_intermediate_size);
        em_cv_set_u(m, CV_V_SHARED, (uint64_t)k->num_shared_experts);
        em_cv_set_f(m, CV_V_EXPERT_SCALE, k->routed_scaling_factor);
        em_cv_set_b(m, CV_V_EXPERT_NORM, k->moe_renormalize);
    }
    /* the MLA cache holds [c ; k_pe]: key kv_lora + rope wide, value kv_lora wide */
    em_cv_set_u(m, CV_V_KEY_LEN, (uint64_t)(k->kv_lora_rank + k->qk_rope_head_dim));
    em_cv_set_u(m, CV_V_VALUE_LEN, (uint64_t)k->kv_lora_rank);
    em_cv_set_u(m, CV_V_VOCAB, (uint64_t)k->vocab_size);
    em_cv_set_u(m, CV_V_CONV_KERNEL, (uint64_t)k->kda_short_conv_kernel_size);
    em_cv_set_u(m, CV_V_KDA_HEAD_DIM, (uint64_t)k->kda_head_dim);
    if (k->has_q_lora) em_cv_set_u(m, CV_V_Q_LORA, (uint64_t)k->q_lora_rank);
    em_cv_set_u(m, CV_V_KV_LORA, (uint64_t)k->kv_lora_rank);
    em_cv_set_u(m, CV_V_ROPE_DIMS, (uint64_t)k->qk_rope_head_dim);
    em_cv_set_u(m, CV_V_KEY_LEN_MLA, (uint64_t)(k->qk_nope_head_dim + k->qk_rope_head_dim));
    em_cv_set_u(m, CV_V_VALUE_LEN_MLA, (uint64_t)k->v_head_dim);
    em_cv_set_u(m, CV_V_DENSE_LEAD, (uint64_t)lead);
    return EM_OK;
}

void em_cv_kimi_layers(cv_model *m, const em_hf_kimi *k, const char *layout) {
    em_cv_kimi_dims(m, k);
    m->flags = (k->has_q_lora ? CV_C_QLORA : CV_C_NOQLORA) |
               (k->num_shared_experts > 0 ? CV_C_SHEXP : 0) |
               (k->tie_word_embeddings ? CV_C_TIED : CV_C_UNTIED);
    m->n_layers = k->n_layers;
    for (int l = 0; l < k->n_layers; l++)
        m->layer_flags[l] = (k->attn[l] == EM_HF_ATTN_MLA ? CV_C_MLA : CV_C_KDA) |
                            (k->mlp[l] == EM_HF_MLP_MOE ? CV_C_MOE : CV_C_DENSE);
    snprintf(m->mode, sizeof m->mode, "%s", "");
    snprintf(m->layout, sizeof m->layout, "%s", layout);
    snprintf(m->markov, sizeof m->markov, "%s", "");
}

static int kimi_setup(cv_model *m, em_err *err) {
    const em_hf_kimi *k = &m->cfg->kimi;
    int64_t lead = 0;
    int rc = kimi_check(m, k, &lead, err);
    if (rc) return rc;
    /* Moonshot tensor names; transformers 5.17 writes them back (dense MLP aside, see above) */
    em_cv_kimi_layers(m, k, "moonshot");
    m->flags |= CV_C_DENSEXP; /* Kimi-Linear's experts are always plain float weights */
    m->vocab_arch = "kimi-linear";
    return em_cv_kimi_values(m, k, lead, err);
}

const cv_arch em_cv_arch_kimi_linear = {
    .name = "kimi-linear", .setup = kimi_setup,
    .rules = CV_TABLE(kimi_tables), .keys = CV_TABLE(kimi_key_tables),
};
