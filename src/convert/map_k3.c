/* convert/map_k3.c: the Kimi-K3 mapping as data (llamacpp-formats.md §1.1, §1.3, §1.5;
 * kimi-linear.md §9), mirroring llama.cpp's conversion/kimi_k3.py. Owns the K3 tensor table,
 * its key table and the setup that turns a kimi_k3 config (a kimi_linear text_config with the
 * K3 extensions) into dimensions, per-layer conditions and key values.
 *
 * What differs from Kimi-Linear, all expressed as rules:
 *   - sources carry the `language_model.` prefix (KimiK3ForConditionalGeneration); the
 *     vision tower and projector (`vision_tower.*`, `mm_projector.*`) are consumed, not
 *     written, and counted in the report (text only, as llama.cpp);
 *   - q-LoRA MLA; `self_attn.g_proj` is the full-rank output gate `ssm_g` on KDA layers and the
 *     sigmoid output gate `attn_gate` on MLA layers (one HF name, two GGUF names: the layer
 *     condition decides);
 *   - A_log may be padded past the head count: the first heads values give ssm_a = -exp(A_log)
 *     as a 1-D [heads] tensor;
 *   - latent MoE: routed_expert_down_proj / routed_expert_norm / routed_expert_up_proj, the
 *     experts at the latent width; shared experts at full width;
 *   - routed experts either plain (stacked and quantized by policy) or compressed-tensors
 *     MXFP4 (`weight_packed` + `weight_scale`), repacked byte for byte into ggml MXFP4 and
 *     never requantized, whatever --type says;
 *   - the block attention residual pairs <x>_res_norm ⊙ <x>_res_proj fused into one f32
 *     score vector (attn_res_score, ffn_res_score, output_res_score).
 * Refused by name: hidden_act other than situ, a softmax router, a quantization other than
 * compressed-tensors mxfp4-pack-quantized, and what kimi-linear also refuses (common check). */
#include "convert/convert_impl.h"

#include <stdio.h>
#include <string.h>

#define D1(a) 1, { CV_D_##a }
#define D2(a, b) 2, { CV_D_##a, CV_D_##b }
#define D3(a, b, c) 3, { CV_D_##a, CV_D_##b, CV_D_##c }
#define D4(a, b, c, d) 4, { CV_D_##a, CV_D_##b, CV_D_##c, CV_D_##d }

/* Sources without the `language_model.` prefix (the arch's optional prefix adds it). */
#define L "model.layers.{L}."
#define A "model.layers.{L}.self_attn."
#define M "model.layers.{L}.block_sparse_moe."
#define B "blk.{L}."

static const cv_rule k3_rules[] = {
    { CV_PRE, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, "model.embed_tokens.weight", NULL,
      "token_embd.weight", D2(VOCAB, EMBD), D2(EMBD, VOCAB) },

    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, L "input_layernorm.weight", NULL,
      B "attn_norm.weight", D1(EMBD), D1(EMBD) },
    /* block attention residuals: norm (src) x proj (alt; may be a [1, hidden] pseudo-query) */
    { CV_LAYER, CV_REQUIRED, CV_X_FUSE_MUL, CV_K_F32, CV_C_ATTNRES,
      L "self_attention_res_norm.weight", L "self_attention_res_proj.weight",
      B "attn_res_score.weight", D1(EMBD), D1(EMBD) },
    { CV_LAYER, CV_REQUIRED, CV_X_FUSE_MUL, CV_K_F32, CV_C_ATTNRES, L "mlp_res_norm.weight",
      L "mlp_res_proj.weight", B "ffn_res_score.weight", D1(EMBD), D1(EMBD) },
    /* KDA */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "q_proj.weight", NULL,
      B "attn_q.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "k_proj.weight", NULL,
      B "attn_k.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "v_proj.weight", NULL,
      B "attn_v.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "q_conv1d.weight", NULL,
      B "ssm_conv1d_q.weight", D3(KDA_INNER, ONE, CONV), D4(CONV, ONE, KDA_INNER, ONE) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "k_conv1d.weight", NULL,
      B "ssm_conv1d_k.weight", D3(KDA_INNER, ONE, CONV), D4(CONV, ONE, KDA_INNER, ONE) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "v_conv1d.weight", NULL,
      B "ssm_conv1d_v.weight", D3(KDA_INNER, ONE, CONV), D4(CONV, ONE, KDA_INNER, ONE) },
    /* A_log (K3: F32[128] padded past the heads) -> ssm_a = -exp(A_log[:heads]), ne [heads] */
    { CV_LAYER, CV_REQUIRED, CV_X_NEG_EXP_HEAD, CV_K_F32, CV_C_KDA, A "A_log", NULL, B "ssm_a",
      D1(KDA_HEADS), D1(KDA_HEADS) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_KDA, A "dt_bias", NULL, B "ssm_dt.bias",
      D1(KDA_INNER), D1(KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "f_a_proj.weight", NULL,
      B "ssm_f_a.weight", D2(KDA_HD, EMBD), D2(EMBD, KDA_HD) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "f_b_proj.weight", NULL,
      B "ssm_f_b.weight", D2(KDA_INNER, KDA_HD), D2(KDA_HD, KDA_INNER) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "b_proj.weight", NULL,
      B "ssm_beta.weight", D2(KDA_HEADS, EMBD), D2(EMBD, KDA_HEADS) },
    /* g_proj on a KDA layer: the full-rank output gate */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "g_proj.weight", NULL,
      B "ssm_g.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
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
    { CV_LAYER, CV_REQUIRED, CV_X_KV_B_K, CV_K_MATRIX, CV_C_MLA, A "kv_b_proj.weight", NULL,
      B "attn_k_b.weight", D2(KV_B, KV_LORA), D3(NOPE, KV_LORA, HEADS) },
    { CV_LAYER, CV_REQUIRED, CV_X_KV_B_V, CV_K_MATRIX, CV_C_MLA, A "kv_b_proj.weight", NULL,
      B "attn_v_b.weight", D2(KV_B, KV_LORA), D3(KV_LORA, V, HEADS) },
    /* g_proj on an MLA layer: the sigmoid output gate */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA | CV_C_MLAGATE, A "g_proj.weight",
      NULL, B "attn_gate.weight", D2(O_IN, EMBD), D2(EMBD, O_IN) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA, A "o_proj.weight", NULL,
      B "attn_output.weight", D2(EMBD, O_IN), D2(O_IN, EMBD) },

    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, L "post_attention_layernorm.weight", NULL,
      B "ffn_norm.weight", D1(EMBD), D1(EMBD) },
    /* dense MLP (layer 0) */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_DENSE, L "mlp.gate_proj.weight",
      M "gate_proj.weight", B "ffn_gate.weight", D2(FF, EMBD), D2(EMBD, FF) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_DENSE, L "mlp.up_proj.weight",
      M "up_proj.weight", B "ffn_up.weight", D2(FF, EMBD), D2(EMBD, FF) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_DENSE, L "mlp.down_proj.weight",
      M "down_proj.weight", B "ffn_down.weight", D2(EMBD, FF), D2(FF, EMBD) },
    /* MoE: the router sees the full-width hidden state */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_ROUTER, CV_C_MOE, M "gate.weight", NULL,
      B "ffn_gate_inp.weight", D2(NEXP, EMBD), D2(EMBD, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MOE, M "gate.e_score_correction_bias",
      NULL, B "exp_probs_b.bias", D1(NEXP), D1(NEXP) },
    /* routed experts at the latent width: compressed-tensors MXFP4 (alt: the scales) ... */
    { CV_LAYER, CV_REQUIRED, CV_X_MXFP4, CV_K_MXFP4, CV_C_MOE | CV_C_MXFP4,
      M "experts.{E}.w1.weight_packed",
      M "experts.{E}.w1.weight_scale", B "ffn_gate_exps.weight", D2(FF_EXP, LAT),
      D3(LAT, FF_EXP, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_MXFP4, CV_K_MXFP4, CV_C_MOE | CV_C_MXFP4,
      M "experts.{E}.w3.weight_packed",
      M "experts.{E}.w3.weight_scale", B "ffn_up_exps.weight", D2(FF_EXP, LAT),
      D3(LAT, FF_EXP, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_MXFP4, CV_K_MXFP4, CV_C_MOE | CV_C_MXFP4,
      M "experts.{E}.w2.weight_packed",
      M "experts.{E}.w2.weight_scale", B "ffn_down_exps.weight", D2(LAT, FF_EXP),
      D3(FF_EXP, LAT, NEXP) },
    /* ... or plain float weights */
    { CV_LAYER, CV_REQUIRED, CV_X_STACK, CV_K_MATRIX, CV_C_MOE | CV_C_DENSEXP,
      M "experts.{E}.w1.weight", NULL, B "ffn_gate_exps.weight", D2(FF_EXP, LAT),
      D3(LAT, FF_EXP, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_STACK, CV_K_MATRIX, CV_C_MOE | CV_C_DENSEXP,
      M "experts.{E}.w3.weight", NULL, B "ffn_up_exps.weight", D2(FF_EXP, LAT),
      D3(LAT, FF_EXP, NEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_STACK, CV_K_MATRIX, CV_C_MOE | CV_C_DENSEXP,
      M "experts.{E}.w2.weight", NULL, B "ffn_down_exps.weight", D2(LAT, FF_EXP),
      D3(FF_EXP, LAT, NEXP) },
    /* latent MoE projections around the experts */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_LATENT,
      M "routed_expert_down_proj.weight", NULL, B "ffn_routed_down.weight", D2(LAT, EMBD),
      D2(EMBD, LAT) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MOE | CV_C_LATENT | CV_C_LATNORM,
      M "routed_expert_norm.weight", NULL, B "ffn_routed_norm.weight", D1(LAT), D1(LAT) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_LATENT,
      M "routed_expert_up_proj.weight", NULL, B "ffn_routed_up.weight", D2(EMBD, LAT),
      D2(LAT, EMBD) },
    /* shared experts: full width, never latent */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_SHEXP,
      M "shared_experts.gate_proj.weight", NULL, B "ffn_gate_shexp.weight", D2(SHEXP, EMBD),
      D2(EMBD, SHEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_SHEXP,
      M "shared_experts.up_proj.weight", NULL, B "ffn_up_shexp.weight", D2(SHEXP, EMBD),
      D2(EMBD, SHEXP) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_SHEXP,
      M "shared_experts.down_proj.weight", NULL, B "ffn_down_shexp.weight", D2(EMBD, SHEXP),
      D2(SHEXP, EMBD) },

    { CV_POST, CV_REQUIRED, CV_X_FUSE_MUL, CV_K_F32, CV_C_ATTNRES,
      "model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight",
      "output_res_score.weight", D1(EMBD), D1(EMBD) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, "model.norm.weight", NULL,
      "output_norm.weight", D1(EMBD), D1(EMBD) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_UNTIED, "lm_head.weight", NULL,
      "output.weight", D2(VOCAB, EMBD), D2(EMBD, VOCAB) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_TIED, "lm_head.weight",
      "model.embed_tokens.weight", "output.weight", D2(VOCAB, EMBD), D2(EMBD, VOCAB) },
};

#undef L
#undef A
#undef M
#undef B

/* The keys llama.cpp's kimi_k3 writer emits, with the types its typed getters require. */
static const cv_key k3_keys[] = {
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
    { "{A}.vocab_size", CV_T_U32, CV_V_VOCAB },
    { "{A}.ssm.conv_kernel", CV_T_U32, CV_V_CONV_KERNEL },
    { "{A}.kda.head_dim", CV_T_U32, CV_V_KDA_HEAD_DIM },
    { "{A}.kda.gate_lower_bound", CV_T_F32, CV_V_GATE_LB },
    { "{A}.attention.q_lora_rank", CV_T_U32, CV_V_Q_LORA },
    { "{A}.attention.kv_lora_rank", CV_T_U32, CV_V_KV_LORA },
    { "{A}.rope.dimension_count", CV_T_U32, CV_V_ROPE_DIMS },
    { "{A}.attention.key_length", CV_T_U32, CV_V_KEY_LEN },
    { "{A}.attention.value_length", CV_T_U32, CV_V_VALUE_LEN },
    { "{A}.attention.key_length_mla", CV_T_U32, CV_V_KEY_LEN_MLA },
    { "{A}.attention.value_length_mla", CV_T_U32, CV_V_VALUE_LEN_MLA },
    { "{A}.expert_feed_forward_length", CV_T_U32, CV_V_FF_EXP },
    { "{A}.expert_shared_count", CV_T_U32, CV_V_SHARED },
    { "{A}.leading_dense_block_count", CV_T_U32, CV_V_DENSE_LEAD },
    { "{A}.expert_weights_scale", CV_T_F32, CV_V_EXPERT_SCALE },
    { "{A}.expert_weights_norm", CV_T_BOOL, CV_V_EXPERT_NORM },
    { "{A}.expert_gating_func", CV_T_U32, CV_V_GATING },
    { "{A}.expert_latent_length", CV_T_U32, CV_V_LATENT },
    { "{A}.activation.situ_beta", CV_T_F32, CV_V_SITU_BETA },
    { "{A}.activation.situ_linear_beta", CV_T_F32, CV_V_SITU_LIN_BETA },
    { "{A}.attn_res.block_size", CV_T_U32, CV_V_ATTN_RES_BLOCK },
};

static const char *const k3_skip[] = { "vision_tower.", "mm_projector.", NULL };

static int unsupported(const cv_model *m, em_err *err, const char *what) {
    return em_err_set(err, EM_EUNSUPPORTED, "%s: %s", m->cfg_path, what);
}

/* compressed-tensors with format mxfp4-pack-quantized: the only quantized K3 release layout
 * with a lossless path (llama.cpp's converter has the same one). */
static bool is_mxfp4_packed(const em_hf_kimi *k) {
    return !strcmp(k->quant_method, "compressed-tensors") &&
           !strcmp(k->quant_format, "mxfp4-pack-quantized");
}

static int k3_check(const cv_model *m, const em_hf_kimi *k, int64_t *lead, em_err *err) {
    char what[256];
    if (strcmp(k->hidden_act, "situ") != 0) {
        snprintf(what, sizeof what, "hidden_act '%s': kimi-k3 uses situ", k->hidden_act);
        return unsupported(m, err, what);
    }
    if (k->num_experts > 0 && strcmp(k->moe_router_activation_func, "sigmoid") != 0)
        return unsupported(m, err, "moe_router_activation_func is not sigmoid: llama.cpp's "
                                   "kimi-k3 routes with sigmoid");
    if ((k->quant_method[0] || k->quant_format[0]) && !is_mxfp4_packed(k)) {
        snprintf(what, sizeof what, "quantization_config '%s' / '%s': only unquantized "
                 "checkpoints and compressed-tensors mxfp4-pack-quantized experts are converted",
                 k->quant_method, k->quant_format);
        return unsupported(m, err, what);
    }
    return em_cv_kimi_common_check(m, k, lead, err);
}

static int k3_setup(cv_model *m, em_err *err) {
    const em_hf_kimi *k = &m->cfg->kimi;
    int64_t lead = 0;
    int rc = k3_check(m, k, &lead, err);
    if (rc) return rc;
    em_cv_kimi_dims(m, k);
    int64_t ff = k->dense_ffn_hidden > 0 ? k->dense_ffn_hidden : k->intermediate_size;
    m->dims[CV_D_FF] = ff;
    bool mxfp4 = is_mxfp4_packed(k);
    m->flags = (k->has_q_lora ? CV_C_QLORA : CV_C_NOQLORA) |
               (k->num_shared_experts > 0 ? CV_C_SHEXP : 0) |
               (k->tie_word_embeddings ? CV_C_TIED : CV_C_UNTIED) |
               (mxfp4 ? CV_C_MXFP4 : CV_C_DENSEXP) |
               (k->routed_expert_hidden_size > 0 ? CV_C_LATENT : 0) |
               (k->routed_expert_hidden_size > 0 && k->latent_moe_use_norm ? CV_C_LATNORM : 0) |
               (k->attn_res_block_size > 0 ? CV_C_ATTNRES : 0) |
               (k->mla_use_output_gate ? CV_C_MLAGATE : 0);
    m->n_layers = k->n_layers;
    for (int l = 0; l < k->n_layers; l++)
        m->layer_flags[l] = (k->attn[l] == EM_HF_ATTN_MLA ? CV_C_MLA : CV_C_KDA) |
                            (k->mlp[l] == EM_HF_MLP_MOE ? CV_C_MOE : CV_C_DENSE);
    snprintf(m->mode, sizeof m->mode, "%s", "");
    snprintf(m->layout, sizeof m->layout, "%s", mxfp4 ? "moonshot-k3-mxfp4" : "moonshot-k3");
    snprintf(m->markov, sizeof m->markov, "%s", "");
    m->vocab_arch = "kimi-k3";
    if (mxfp4 && k->num_experts > 0) {
        /* llama.cpp labels such a file MOSTLY_MXFP4_MOE, whatever the other tensors are */
        m->file_type = 38;
        snprintf(m->note, sizeof m->note, "routed experts: compressed-tensors MXFP4 repacked "
                 "losslessly to ggml MXFP4 (never requantized, whatever --type says)");
    }
    rc = em_cv_kimi_values(m, k, lead, err);
    if (rc) return rc;
    em_cv_set_u(m, CV_V_FF, (uint64_t)ff);
    if (k->kda_has_gate_lower_bound) em_cv_set_f(m, CV_V_GATE_LB, k->kda_gate_lower_bound);
    if (k->routed_expert_hidden_size > 0)
        em_cv_set_u(m, CV_V_LATENT, (uint64_t)k->routed_expert_hidden_size);
    em_cv_set_f(m, CV_V_SITU_BETA, k->activation_situ_beta);
    em_cv_set_f(m, CV_V_SITU_LIN_BETA, k->activation_situ_linear_beta);
    em_cv_set_u(m, CV_V_ATTN_RES_BLOCK, (uint64_t)k->attn_res_block_size);
    return EM_OK;
}

const cv_arch em_cv_arch_kimi_k3 = {
    .name = "kimi-k3",
    .rules = k3_rules,
    .n_rules = sizeof k3_rules / sizeof k3_rules[0],
    .keys = k3_keys,
    .n_keys = sizeof k3_keys / sizeof k3_keys[0],
    .optional_prefix = "language_model.",
    .skip_prefixes = k3_skip,
    .setup = k3_setup,
};
