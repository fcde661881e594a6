/* convert/map_dflash.c: DFlash / DSpark drafters as data (llamacpp-formats.md §2.1-§2.2,
 * dspark.md §2-§3). Owns the tensor table (Qwen3-style layers, fc, hidden_norm, norm,
 * optional embed_tokens / lm_head, the Markov head with its gated and rnn extras, the
 * confidence head, d2t), the key table, and the setup that reads a parsed drafter config
 * (z-lab, DeepSpec, SpecForge or speculators layout) after confronting it with the tensors.
 *
 * Names the prebuilt llama.cpp knows are used as it spells them (markov_w1, markov_w2,
 * conf_proj, enc.output_norm, fc, d2t). The gated and rnn Markov extras have no llama.cpp
 * name; they are written as markov_gate.* / markov_joint.* for Ember, and llama.cpp, which
 * implements only the vanilla head, then refuses the file (it counts tensors) rather than
 * running it wrongly. */
#include "convert/convert_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D1(a) 1, { CV_D_##a }
#define D2(a, b) 2, { CV_D_##a, CV_D_##b }
#define D3(a, b, c) 3, { CV_D_##a, CV_D_##b, CV_D_##c }

#define L "layers.{L}."
#define A "layers.{L}.self_attn."
#define B "blk.{L}."
/* An attention projection [OUT x n_embd] and its bias [OUT] (optional: Qwen3 drafters have
 * attention biases only when attention_bias is set). */
#define PROJ_WITH_BIAS(hf, gg, OUT)                                                                \
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, A hf ".weight", NULL, B gg ".weight",      \
      D2(OUT, EMBD), D2(EMBD, OUT) },                                                              \
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_BIAS, A hf ".bias", NULL, B gg ".bias",     \
      D1(OUT), D1(OUT) }

/* Source names without the optional "model." prefix (cv_arch.optional_prefix). */
static const cv_rule dflash_rules[] = {
    { CV_PRE, CV_OPTIONAL, CV_X_COPY, CV_K_MATRIX, 0, "embed_tokens.weight", NULL,
      "token_embd.weight", D2(VOCAB, EMBD), D2(EMBD, VOCAB) },
    { CV_PRE, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, "fc.weight", NULL, "fc.weight",
      D2(EMBD, FC_IN), D2(FC_IN, EMBD) },
    { CV_PRE, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, "hidden_norm.weight", NULL,
      "enc.output_norm.weight", D1(EMBD), D1(EMBD) },

    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, L "input_layernorm.weight", NULL,
      B "attn_norm.weight", D1(EMBD), D1(EMBD) },
    PROJ_WITH_BIAS("q_proj", "attn_q", QH_OUT),
    PROJ_WITH_BIAS("k_proj", "attn_k", KV_OUT),
    PROJ_WITH_BIAS("v_proj", "attn_v", KV_OUT),
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, A "o_proj.weight", NULL,
      B "attn_output.weight", D2(EMBD, QH_OUT), D2(QH_OUT, EMBD) },
    /* q/k norms are stored raw: no +1 shift (the DFlash converter subclasses Qwen3) */
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, A "q_norm.weight", NULL,
      B "attn_q_norm.weight", D1(HEAD_DIM), D1(HEAD_DIM) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, A "k_norm.weight", NULL,
      B "attn_k_norm.weight", D1(HEAD_DIM), D1(HEAD_DIM) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, L "post_attention_layernorm.weight", NULL,
      B "ffn_norm.weight", D1(EMBD), D1(EMBD) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, L "mlp.gate_proj.weight", NULL,
      B "ffn_gate.weight", D2(FF, EMBD), D2(EMBD, FF) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, L "mlp.up_proj.weight", NULL,
      B "ffn_up.weight", D2(FF, EMBD), D2(EMBD, FF) },
    { CV_LAYER, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, 0, L "mlp.down_proj.weight", NULL,
      B "ffn_down.weight", D2(EMBD, FF), D2(FF, EMBD) },

    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_F32, 0, "norm.weight", NULL, "output_norm.weight",
      D1(EMBD), D1(EMBD) },
    { CV_POST, CV_OPTIONAL, CV_X_COPY, CV_K_MATRIX, 0, "lm_head.weight", NULL, "output.weight",
      D2(DVOCAB, EMBD), D2(EMBD, DVOCAB) },
    /* Markov head: W1 an embedding [vocab, rank], W2 a Linear rank -> draft vocab */
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MARKOV, "markov_head.markov_w1.weight",
      NULL, "markov_w1.weight", D2(VOCAB, RANK), D2(RANK, VOCAB) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MARKOV, "markov_head.markov_w2.weight",
      NULL, "markov_w2.weight", D2(DVOCAB, RANK), D2(RANK, DVOCAB) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MARKOV | CV_C_GATED,
      "markov_head.gate_proj.weight", NULL, "markov_gate.weight", D2(RANK, GATE_IN),
      D2(GATE_IN, RANK) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MARKOV | CV_C_GATED,
      "markov_head.gate_proj.bias", NULL, "markov_gate.bias", D1(RANK), D1(RANK) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_MATRIX, CV_C_MARKOV | CV_C_RNN,
      "markov_head.joint_proj.weight", NULL, "markov_joint.weight", D2(RANK3, JOINT_IN),
      D2(JOINT_IN, RANK3) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_MARKOV | CV_C_RNN,
      "markov_head.joint_proj.bias", NULL, "markov_joint.bias", D1(RANK3), D1(RANK3) },
    /* confidence head: Linear(hidden [+ rank] -> 1) with bias, kept F32 */
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_CONF, "confidence_head.proj.weight", NULL,
      "conf_proj.weight", D2(ONE, CONF_IN), D2(CONF_IN, ONE) },
    { CV_POST, CV_REQUIRED, CV_X_COPY, CV_K_F32, CV_C_CONF, "confidence_head.proj.bias", NULL,
      "conf_proj.bias", D1(ONE), D1(ONE) },
    /* reduced draft vocabulary: d2t offsets -> absolute target ids; t2d is training-only */
    { CV_POST, CV_OPTIONAL, CV_X_D2T, CV_K_I64, 0, "d2t", NULL, "d2t", D1(DVOCAB), D1(DVOCAB) },
    { CV_POST, CV_DROP, CV_X_COPY, CV_K_F32, 0, "t2d", NULL, NULL, 0, { 0 }, 0, { 0 } },
};

#undef L
#undef A
#undef B
#undef PROJ_WITH_BIAS

static const cv_key dflash_keys[] = {
    { "{A}.context_length", CV_T_U32, CV_V_CTX },
    { "{A}.embedding_length", CV_T_U32, CV_V_EMBD },
    { "{A}.block_count", CV_T_U32, CV_V_BLOCKS },
    { "{A}.feed_forward_length", CV_T_U32, CV_V_FF },
    { "{A}.attention.head_count", CV_T_U32, CV_V_HEADS },
    { "{A}.attention.head_count_kv", CV_T_U32, CV_V_HEADS_KV },
    { "{A}.attention.key_length", CV_T_U32, CV_V_KEY_LEN },
    { "{A}.attention.value_length", CV_T_U32, CV_V_VALUE_LEN },
    { "{A}.rope.freq_base", CV_T_F32, CV_V_ROPE_BASE },
    { "{A}.rope.dimension_count", CV_T_U32, CV_V_ROPE_DIMS },
    { "{A}.rope.scaling.type", CV_T_STR, CV_V_ROPE_SCALING },
    { "{A}.rope.scaling.factor", CV_T_F32, CV_V_ROPE_FACTOR },
    { "{A}.rope.scaling.original_context_length", CV_T_U32, CV_V_ROPE_ORIG_CTX },
    { "{A}.rope.scaling.yarn_beta_fast", CV_T_F32, CV_V_YARN_BETA_FAST },
    { "{A}.rope.scaling.yarn_beta_slow", CV_T_F32, CV_V_YARN_BETA_SLOW },
    { "{A}.rope.scaling.yarn_attn_factor", CV_T_F32, CV_V_YARN_ATTN_FACTOR },
    { "{A}.rope.scaling.yarn_log_multiplier", CV_T_F32, CV_V_YARN_LOG_MUL },
    { "{A}.attention.layer_norm_rms_epsilon", CV_T_F32, CV_V_RMS_EPS },
    { "{A}.final_logit_softcapping", CV_T_F32, CV_V_SOFTCAP },
    { "{A}.logit_scale", CV_T_F32, CV_V_LOGIT_SCALE },
    { "{A}.vocab_size", CV_T_U32, CV_V_VOCAB },
    { "{A}.attention.causal", CV_T_BOOL, CV_V_CAUSAL },
    { "{A}.target_layers", CV_T_ARR_I32, CV_V_TARGET_LAYERS },
    { "{A}.block_size", CV_T_U32, CV_V_BLOCK_SIZE },
    { "{A}.sample_from_anchor", CV_T_BOOL, CV_V_SAMPLE_FROM_ANCHOR },
    { "{A}.has_confidence_head", CV_T_BOOL, CV_V_HAS_CONF },
    /* Ember's own keys (the prebuilt llama.cpp reads the rank from markov_w1's shape and
     * knows only the vanilla head) */
    { "{A}.markov_rank", CV_T_U32, CV_V_MARKOV_RANK },
    { "{A}.markov_head_type", CV_T_STR, CV_V_MARKOV_TYPE },
    { "{A}.confidence_head_with_markov", CV_T_BOOL, CV_V_CONF_WITH_MARKOV },
    { "tokenizer.ggml.mask_token_id", CV_T_U32, CV_V_MASK_TOKEN },
};

static int unsupported(const cv_model *m, em_err *err, const char *what) {
    return em_err_set(err, EM_EUNSUPPORTED, "%s: %s", m->cfg_path, what);
}

static int dflash_check(const cv_model *m, const em_hf_draft *d, em_err *err) {
    char what[256];
    if (strcmp(d->backbone_model_type, "qwen3") != 0) {
        snprintf(what, sizeof what, "drafter backbone '%s': only Qwen3-style drafters are "
                 "converted", d->backbone_model_type);
        return unsupported(m, err, what);
    }
    if (d->input_embedding_scale != 1)
        return unsupported(m, err, "input embedding scale other than 1 has no dflash GGUF key");
    if (d->rope.type == EM_HF_ROPE_DYNAMIC || d->rope.type == EM_HF_ROPE_LLAMA3) {
        snprintf(what, sizeof what, "rope type '%s' has no dflash GGUF form",
                 em_hf_rope_type_name(d->rope.type));
        return unsupported(m, err, what);
    }
    if (d->max_position_embeddings <= 0)
        return em_err_set(err, EM_EFORMAT, "%s: max_position_embeddings is missing",
                          m->cfg_path);
    if (d->rope.theta <= 0)
        return em_err_set(err, EM_EFORMAT, "%s: rope_theta is missing", m->cfg_path);
    return EM_OK;
}

static void dflash_dims(cv_model *m, const em_hf_draft *d) {
    int64_t *x = m->dims;
    x[CV_D_EMBD] = d->hidden_size;
    x[CV_D_VOCAB] = d->vocab_size;
    x[CV_D_DVOCAB] = d->draft_vocab_size;
    x[CV_D_FF] = d->intermediate_size;
    x[CV_D_HEADS] = d->num_attention_heads;
    x[CV_D_HEAD_DIM] = d->head_dim;
    x[CV_D_QH_OUT] = d->num_attention_heads * d->head_dim;
    x[CV_D_KV_OUT] = d->num_key_value_heads * d->head_dim;
    /* llama.cpp: n_embd_inp = taps * n_embd, so the target's hidden size must be ours */
    x[CV_D_FC_IN] = (int64_t)d->n_taps * d->hidden_size;
    x[CV_D_RANK] = d->markov_rank;
    x[CV_D_RANK3] = 3 * d->markov_rank;
    x[CV_D_CONF_IN] = d->hidden_size + (d->confidence_with_markov ? d->markov_rank : 0);
    x[CV_D_GATE_IN] = d->hidden_size + d->markov_rank;
    x[CV_D_JOINT_IN] = 2 * d->markov_rank + d->hidden_size;
}

static void dflash_rope(cv_model *m, const em_hf_rope *r) {
    em_cv_set_f(m, CV_V_ROPE_BASE, r->theta);
    if (r->type == EM_HF_ROPE_LINEAR) {
        em_cv_set_s(m, CV_V_ROPE_SCALING, "linear");
        em_cv_set_f(m, CV_V_ROPE_FACTOR, r->factor);
    } else if (r->type == EM_HF_ROPE_YARN) {
        em_cv_set_s(m, CV_V_ROPE_SCALING, "yarn");
        em_cv_set_f(m, CV_V_ROPE_FACTOR, r->factor);
        em_cv_set_u(m, CV_V_ROPE_ORIG_CTX, (uint64_t)r->original_max_position_embeddings);
        em_cv_set_f(m, CV_V_YARN_BETA_FAST, r->beta_fast);
        em_cv_set_f(m, CV_V_YARN_BETA_SLOW, r->beta_slow);
        if (r->attention_factor > 0) em_cv_set_f(m, CV_V_YARN_ATTN_FACTOR, r->attention_factor);
        /* DeepSeek-style YaRN: llama.cpp's yarn_log_multiplier is 0.1 * mscale_all_dim */
        if (r->mscale_all_dim > 0) em_cv_set_f(m, CV_V_YARN_LOG_MUL, 0.1 * r->mscale_all_dim);
    }
}

static int dflash_values(cv_model *m, const em_hf_draft *d, em_err *err) {
    em_cv_set_u(m, CV_V_CTX, (uint64_t)d->max_position_embeddings);
    em_cv_set_u(m, CV_V_EMBD, (uint64_t)d->hidden_size);
    em_cv_set_u(m, CV_V_BLOCKS, (uint64_t)d->num_hidden_layers);
    em_cv_set_u(m, CV_V_FF, (uint64_t)d->intermediate_size);
    em_cv_set_u(m, CV_V_HEADS, (uint64_t)d->num_attention_heads);
    em_cv_set_u(m, CV_V_HEADS_KV, (uint64_t)d->num_key_value_heads);
    em_cv_set_u(m, CV_V_KEY_LEN, (uint64_t)d->head_dim);
    em_cv_set_u(m, CV_V_VALUE_LEN, (uint64_t)d->head_dim);
    em_cv_set_u(m, CV_V_ROPE_DIMS, (uint64_t)d->head_dim);
    dflash_rope(m, &d->rope);
    em_cv_set_f(m, CV_V_RMS_EPS, d->rms_norm_eps);
    if (d->final_logit_softcapping > 0) em_cv_set_f(m, CV_V_SOFTCAP, d->final_logit_softcapping);
    if (d->output_multiplier != 1) em_cv_set_f(m, CV_V_LOGIT_SCALE, d->output_multiplier);
    em_cv_set_u(m, CV_V_VOCAB, (uint64_t)d->vocab_size);
    em_cv_set_b(m, CV_V_CAUSAL, d->causal);
    int32_t *taps = em_malloc((size_t)d->n_taps * sizeof *taps, "target_layers", err);
    if (!taps) return EM_ENOMEM;
    /* llama.cpp taps the INPUT of layer id: HF hidden_states[l + 1] is layer l's output */
    for (int i = 0; i < d->n_taps; i++) taps[i] = em_hf_draft_gguf_target_layer(d, i);
    em_cv_set_arr(m, CV_V_TARGET_LAYERS, taps, d->n_taps);
    em_cv_set_u(m, CV_V_BLOCK_SIZE, (uint64_t)d->block_size);
    em_cv_set_b(m, CV_V_SAMPLE_FROM_ANCHOR, d->sample_from_anchor);
    em_cv_set_b(m, CV_V_HAS_CONF, d->confidence_head);
    if (d->markov_rank > 0) {
        em_cv_set_u(m, CV_V_MARKOV_RANK, (uint64_t)d->markov_rank);
        em_cv_set_s(m, CV_V_MARKOV_TYPE, em_hf_markov_name(d->markov));
    }
    if (d->confidence_head) em_cv_set_b(m, CV_V_CONF_WITH_MARKOV, d->confidence_with_markov);
    em_cv_set_u(m, CV_V_MASK_TOKEN, (uint64_t)d->mask_token_id);
    return EM_OK;
}

static int dflash_setup(cv_model *m, em_err *err) {
    em_hf_draft *d = &m->cfg->draft;
    int rc = em_hf_draft_check_tensors(d, m->st, err);
    if (!rc) rc = dflash_check(m, d, err);
    if (rc) return rc;
    dflash_dims(m, d);
    m->flags = (d->markov_rank > 0 ? CV_C_MARKOV : 0) |
               (d->markov == EM_HF_MARKOV_GATED ? CV_C_GATED : 0) |
               (d->markov == EM_HF_MARKOV_RNN ? CV_C_RNN : 0) |
               (d->confidence_head ? CV_C_CONF : 0) | (d->attention_bias ? CV_C_BIAS : 0);
    m->n_layers = (int)d->num_hidden_layers;
    snprintf(m->mode, sizeof m->mode, "%s", d->markov_rank > 0 ? "dspark" : "dflash");
    snprintf(m->layout, sizeof m->layout, "%s", em_hf_draft_flavour_name(d->flavour));
    snprintf(m->markov, sizeof m->markov, "%s",
             d->markov_rank > 0 ? em_hf_markov_name(d->markov) : "none");
    m->vocab_arch = "dflash";
    return dflash_values(m, d, err);
}

static const cv_rules dflash_rules_t = CV_TABLE(dflash_rules);
static const cv_rules *const dflash_tables[] = { &dflash_rules_t };
static const cv_keys dflash_keys_t = CV_TABLE(dflash_keys);
static const cv_keys *const dflash_key_tables[] = { &dflash_keys_t };

const cv_arch em_cv_arch_dflash = {
    .name = "dflash", .setup = dflash_setup,
    .rules = CV_TABLE(dflash_tables), .keys = CV_TABLE(dflash_key_tables),
    .optional_prefix = "model.",
};
