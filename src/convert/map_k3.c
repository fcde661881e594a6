/* convert/map_k3.c: the Kimi-K3 mapping as data (llamacpp-formats.md §1.1, §1.3, §1.5;
 * kimi-linear.md §9), mirroring llama.cpp's conversion/kimi_k3.py. Owns the K3 tensor table,
 * its key table and the setup that turns a kimi_k3 config (a kimi_linear text_config with the
 * K3 extensions) into dimensions, per-layer conditions and key values. The tensor table is
 * Kimi-Linear's pieces (map_kimi.c) with K3's own rules inserted (and Kimi-Linear's A_log and
 * low-rank output gate left out); the key table is the Kimi family's pieces in K3's order.
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

/* Sources without the `language_model.` prefix (the arch's optional prefix adds it). */
#define L "model.layers.{L}."
#define A "model.layers.{L}.self_attn."
#define M "model.layers.{L}.block_sparse_moe."
#define B "blk.{L}."

/* block attention residuals: norm (src) x proj (alt; may be a [1, hidden] pseudo-query) */
static const cv_rule k3_attnres[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_FUSE_MUL, CV_K_F32, CV_C_ATTNRES,
      L "self_attention_res_norm.weight", L "self_attention_res_proj.weight",
      B "attn_res_score.weight", D1(EMBD), D1(EMBD) },
    { CV_LAYER, CV_REQUIRED, CV_X_FUSE_MUL, CV_K_F32, CV_C_ATTNRES, L "mlp_res_norm.weight",
      L "mlp_res_proj.weight", B "ffn_res_score.weight", D1(EMBD), D1(EMBD) },
};
static const cv_rules k3_attnres_rules = CV_TABLE(k3_attnres);

/* A_log (K3: F32[128] padded past the heads) -> ssm_a = -exp(A_log[:heads]), ne [heads] */
static const cv_rule k3_a_log[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_NEG_EXP_HEAD, CV_K_F32, CV_C_KDA, A "A_log", NULL, B "ssm_a",
      D1(KDA_HEADS), D1(KDA_HEADS) },
};
static const cv_rules k3_a_log_rules = CV_TABLE(k3_a_log);

/* g_proj on a KDA layer: the full-rank output gate */
static const cv_rule k3_g_full[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_KDA, A "g_proj.weight", NULL,
      B "ssm_g.weight", D2(KDA_INNER, EMBD), D2(EMBD, KDA_INNER) },
};
static const cv_rules k3_g_full_rules = CV_TABLE(k3_g_full);

/* g_proj on an MLA layer: the sigmoid output gate */
static const cv_rule k3_mla_gate[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MLA | CV_C_MLAGATE, A "g_proj.weight",
      NULL, B "attn_gate.weight", D2(O_IN, EMBD), D2(EMBD, O_IN) },
};
static const cv_rules k3_mla_gate_rules = CV_TABLE(k3_mla_gate);

/* routed experts at the latent width in compressed-tensors MXFP4 (alt: the scales); plain
 * float experts are Kimi-Linear's rules (em_cv_kimi_experts, at the same width) */
static const cv_rule k3_mxfp4[] = {
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
};
static const cv_rules k3_mxfp4_rules = CV_TABLE(k3_mxfp4);

/* latent MoE projections around the experts */
static const cv_rule k3_latent[] = {
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_LATENT,
      M "routed_expert_down_proj.weight", NULL, B "ffn_routed_down.weight", D2(LAT, EMBD),
      D2(EMBD, LAT) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MOE | CV_C_LATENT | CV_C_LATNORM,
      M "routed_expert_norm.weight", NULL, B "ffn_routed_norm.weight", D1(LAT), D1(LAT) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MOE | CV_C_LATENT,
      M "routed_expert_up_proj.weight", NULL, B "ffn_routed_up.weight", D2(EMBD, LAT),
      D2(LAT, EMBD) },
};
static const cv_rules k3_latent_rules = CV_TABLE(k3_latent);

/* the final block attention residual mix */
static const cv_rule k3_output_res[] = {
    { CV_POST, CV_REQUIRED, CV_X_FUSE_MUL, CV_K_F32, CV_C_ATTNRES,
      "model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight",
      "output_res_score.weight", D1(EMBD), D1(EMBD) },
};
static const cv_rules k3_output_res_rules = CV_TABLE(k3_output_res);

/* Kimi-Linear's pieces (map_kimi.c) with K3's inserted; its A_log and low-rank output gate are
 * replaced by k3_a_log and k3_g_full. Within a scope, the order is the GGUF's tensor order. */
static const cv_rules *const k3_tables[] = {
    &em_cv_kimi_lead,       &k3_attnres_rules,       &em_cv_kimi_kda_in,
    &k3_a_log_rules,        &em_cv_kimi_kda_gates,   &k3_g_full_rules,
    &em_cv_kimi_kda_out_mla_in, &k3_mla_gate_rules,  &em_cv_kimi_mla_out_ffn,
    &k3_mxfp4_rules,        &em_cv_kimi_experts,     &k3_latent_rules,
    &em_cv_kimi_shexp,      &k3_output_res_rules,    &em_cv_kimi_post,
};

/* The keys llama.cpp's kimi_k3 writer emits, in its order, with the types its typed getters
 * require: the Kimi family's pieces (map_kimi.c), ordered as K3 writes them. */
static const cv_keys *const k3_key_tables[] = {
    &em_cv_kimi_keys_dims,  &em_cv_kimi_keys_kda,   &em_cv_kimi_keys_lora,
    &em_cv_kimi_keys_cache, &em_cv_kimi_keys_moe,   &em_cv_kimi_keys_gating,
};

static const char *const k3_skip[] = { "vision_tower.", "mm_projector.", NULL };

#define unsupported em_cv_unsupported

/* compressed-tensors with format mxfp4-pack-quantized: the only quantized K3 release layout
 * with a lossless path (llama.cpp's converter has the same one). */
static bool is_mxfp4_packed(const em_hf_kimi *k) {
    return !strcmp(k->quant_method, "compressed-tensors") &&
           !strcmp(k->quant_format, "mxfp4-pack-quantized");
}

static int k3_check(const cv_model *m, const em_hf_kimi *k, int64_t *lead, em_err *err) {
    char what[256];
    if (k->num_experts > 0 && strcmp(k->moe_router_activation_func, "sigmoid") != 0)
        return unsupported(m, err, "moe_router_activation_func is not sigmoid: llama.cpp's "
                                   "kimi-k3 routes with sigmoid");
    if ((k->quant_method[0] || k->quant_format[0]) && !is_mxfp4_packed(k)) {
        snprintf(what, sizeof what, "quantization_config '%s' / '%s': only unquantized "
                 "checkpoints and compressed-tensors mxfp4-pack-quantized experts are converted",
                 k->quant_method, k->quant_format);
        return unsupported(m, err, what);
    }
    return em_cv_kimi_common_check(m, k, "kimi-k3", "situ", lead, err);
}

static int k3_setup(cv_model *m, em_err *err) {
    const em_hf_kimi *k = &m->cfg->kimi;
    bool mxfp4 = is_mxfp4_packed(k);
    int64_t lead = 0, ff = k->dense_ffn_hidden > 0 ? k->dense_ffn_hidden : k->intermediate_size;
    int rc = k3_check(m, k, &lead, err);
    if (rc) return rc;
    em_cv_kimi_layers(m, k, mxfp4 ? "moonshot-k3-mxfp4" : "moonshot-k3");
    m->dims[CV_D_FF] = ff;
    m->flags |= (mxfp4 ? CV_C_MXFP4 : CV_C_DENSEXP) |
                (k->routed_expert_hidden_size > 0 ? CV_C_LATENT : 0) |
                (k->routed_expert_hidden_size > 0 && k->latent_moe_use_norm ? CV_C_LATNORM : 0) |
                (k->attn_res_block_size > 0 ? CV_C_ATTNRES : 0) |
                (k->mla_use_output_gate ? CV_C_MLAGATE : 0);
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
    .name = "kimi-k3", .setup = k3_setup,
    .rules = CV_TABLE(k3_tables), .keys = CV_TABLE(k3_key_tables),
    .optional_prefix = "language_model.", .skip_prefixes = k3_skip,
};
