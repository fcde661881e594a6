/* convert/hfconfig: Hugging Face config.json files parsed into typed structs.
 *
 * Two kinds are understood:
 *   - target models: model_type "kimi_linear" (Moonshot remote code and transformers-5
 *     spellings) and "kimi_k3" (a wrapper whose text_config is a kimi_linear config with
 *     the K3 extensions); parsed into em_hf_kimi with a per-layer table;
 *   - DFlash/DSpark drafters in four flavours (z-lab DFlash, DeepSpec DSpark, SpecForge
 *     DSpark, vLLM speculators), detected from the config's fields; parsed into em_hf_draft.
 * Anything else is an error naming its model_type.
 *
 * Rules: a value the checkpoint must state is required (an error names the missing field);
 * defaults exist only where the reference notes document them or where transformers' own
 * KimiLinearConfig has no such field and its modeling code behaves one way (sigmoid router,
 * grouped top-k, NoPE MLA in the transformers-5 dialect), and each is marked in hfconfig.c. JSON null counts as absent. Aliases (n_routed_experts for num_experts, ...)
 * are accepted; two spellings present with different values are an error naming both.
 * Duplicate JSON keys are an error. Field names in messages are as written in the file,
 * with "text_config." or "dflash_config." prefixes where they live there. */
#ifndef EM_CONVERT_HFCONFIG_H
#define EM_CONVERT_HFCONFIG_H

#include "base/base.h"
#include "format/safetensors.h"

#define EM_HF_MAX_LAYERS 1024
#define EM_HF_MAX_TAPS 16
#define EM_HF_MAX_EOS 8
#define EM_HF_NAME 64

/* ---- RoPE (rope_theta + rope_scaling, or transformers-5 rope_parameters) ---------------- */

enum em_hf_rope_type {
    EM_HF_ROPE_DEFAULT = 0, /* plain RoPE (rope_scaling null, or rope_type "default") */
    EM_HF_ROPE_LINEAR,
    EM_HF_ROPE_DYNAMIC,
    EM_HF_ROPE_YARN,
    EM_HF_ROPE_LLAMA3,
};

typedef struct em_hf_rope {
    enum em_hf_rope_type type;
    double theta;                             /* 0 when the config has none */
    double factor;                            /* 1 for DEFAULT */
    int64_t original_max_position_embeddings; /* 0 when absent */
    double beta_fast, beta_slow;   /* YaRN: absent -> 32 and 1 (HF defaults, dspark.md §1.5) */
    double mscale, mscale_all_dim; /* DeepSeek-style YaRN; 0 when absent */
    double attention_factor;       /* 0 when absent (then YaRN scales by 0.1*ln(factor)+1) */
    double low_freq_factor, high_freq_factor; /* LLAMA3; 0 when absent */
} em_hf_rope;

const char *em_hf_rope_type_name(enum em_hf_rope_type t);

/* ---- Kimi Linear / Kimi-K3 -------------------------------------------------------------- */

enum em_hf_attn_kind { EM_HF_ATTN_KDA = 0, EM_HF_ATTN_MLA = 1 };
enum em_hf_mlp_kind { EM_HF_MLP_DENSE = 0, EM_HF_MLP_MOE = 1 };

typedef struct em_hf_kimi {
    bool is_k3; /* model_type kimi_k3 (fields below come from text_config) */
    int64_t vocab_size, hidden_size, num_hidden_layers, intermediate_size;
    int64_t num_attention_heads, num_key_value_heads;
    int64_t head_dim; /* as written (0 when absent); unused by Kimi (reference §1) */
    /* MLA */
    bool has_q_lora;     /* q_lora_rank non-null: q_a_proj/q_a_layernorm/q_b_proj */
    int64_t q_lora_rank; /* 0 when null */
    int64_t kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    bool mla_use_nope;   /* absent: true in the transformers-5 dialect, else required */
    em_hf_rope rope;
    /* KDA (linear_attn_config, or transformers-5 linear_num_heads/...) */
    int64_t kda_num_heads, kda_head_dim, kda_short_conv_kernel_size;
    /* MoE; num_experts == 0 when the config has none (every layer dense) */
    int64_t num_experts, num_experts_per_token, moe_intermediate_size, num_shared_experts;
    int64_t first_k_dense_replace, moe_layer_freq; /* fkdr: from mlp_layer_types when unstated */
    char moe_router_activation_func[16];           /* "sigmoid" (absent) or "softmax" */
    bool moe_renormalize;
    double routed_scaling_factor;
    int64_t num_expert_group, topk_group;
    bool use_grouped_topk; /* absent: true */
    /* misc */
    double rms_norm_eps;
    bool tie_word_embeddings;
    char hidden_act[16];      /* "silu" (Kimi Linear) or "situ" (K3) */
    int64_t model_max_length; /* or max_position_embeddings; 0 when absent */
    int64_t num_nextn_predict_layers;
    bool has_bos, has_pad;
    int64_t bos_token_id, pad_token_id;
    int n_eos; /* eos_token_id may be an int or a list */
    int64_t eos_token_ids[EM_HF_MAX_EOS];
    /* K3 extensions (absent in Kimi Linear: the feature is off; kimi-linear.md §9) */
    bool mla_use_output_gate;
    bool kda_use_full_rank_gate;
    bool kda_has_gate_lower_bound;
    double kda_gate_lower_bound;
    int64_t routed_expert_hidden_size; /* latent MoE width; 0 = not latent */
    bool latent_moe_use_norm;
    int64_t attn_res_block_size; /* 0 = no block attention residuals */
    int64_t dense_ffn_hidden;    /* 0 when absent (then intermediate_size) */
    double activation_situ_beta, activation_situ_linear_beta; /* 0 unless hidden_act situ */
    char quant_method[EM_HF_NAME], quant_format[EM_HF_NAME];  /* quantization_config, "" */
    /* per-layer table, 0-indexed */
    int n_layers;
    uint8_t attn[EM_HF_MAX_LAYERS]; /* enum em_hf_attn_kind */
    uint8_t mlp[EM_HF_MAX_LAYERS];  /* enum em_hf_mlp_kind */
    int n_kda, n_mla, n_dense, n_moe;
} em_hf_kimi;

/* ---- DFlash / DSpark drafters ----------------------------------------------------------- */

enum em_hf_draft_flavour {
    EM_HF_DRAFT_ZLAB = 0,    /* z-lab DFlash (DFlashDraftModel; SpecForge DFlash mirrors it) */
    EM_HF_DRAFT_DEEPSPEC,    /* deepseek-ai DeepSpec DSpark (Qwen3DSparkModel) */
    EM_HF_DRAFT_SPECFORGE,   /* SpecForge / RadixArk DSpark (DSparkDraftModel, dflash_config) */
    EM_HF_DRAFT_SPECULATORS, /* vLLM speculators (speculators_model_type) */
};

enum em_hf_markov {
    EM_HF_MARKOV_NONE = 0,
    EM_HF_MARKOV_VANILLA,
    EM_HF_MARKOV_GATED,
    EM_HF_MARKOV_RNN
};

typedef struct em_hf_draft {
    enum em_hf_draft_flavour flavour;
    char backbone_model_type[EM_HF_NAME]; /* "qwen3" (transformer_layer_config for speculators) */
    int64_t block_size;                   /* the trained B; see n_drafts for its meaning */
    /* Taps in the HF convention: id l is the OUTPUT of target layer l = hidden_states[l+1];
     * -1 is the embedding output. speculators' aux_hidden_state_layer_ids (l+1) are
     * converted to this. llama.cpp's GGUF key dflash.target_layers stores l+1
     * (em_hf_draft_gguf_target_layer). */
    int n_taps;
    int32_t target_layer_ids[EM_HF_MAX_TAPS];
    int64_t num_target_layers; /* target depth; 0 when the config does not say */
    int64_t mask_token_id;
    /* backbone (Qwen3-style) */
    int64_t num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim;
    int64_t intermediate_size;
    double rms_norm_eps;
    em_hf_rope rope;
    int64_t max_position_embeddings; /* 0 when absent */
    int64_t vocab_size;
    int64_t draft_vocab_size; /* == vocab_size unless a reduced draft vocabulary is stated */
    bool attention_bias;      /* absent -> false (dspark.md §1.1: no biases unless stated) */
    bool causal;              /* absent -> false (dspark.md §1.4: in-block attention non-causal) */
    bool tie_word_embeddings;
    char attention_mode[16];        /* SpecForge dflash_config.attention_mode ("gqa"), else "" */
    char projector_type[16];        /* SpecForge dflash_config.projector_type, else "" */
    double final_logit_softcapping; /* 0 = none */
    double input_embedding_scale;   /* 1 when absent */
    double output_multiplier;       /* 1 when absent */
    /* slot convention (dspark.md §1.6): true = slot k predicts start+k+1 (B drafts);
     * false = slot 0 is the anchor (B-1 drafts). Absent: z-lab false, DeepSpec and
     * SpecForge DSpark true, speculators by speculators_model_type. */
    bool sample_from_anchor;
    bool sample_from_anchor_stated;
    /* Markov head (dspark.md §2.2); rank 0 = none */
    enum em_hf_markov markov;
    int64_t markov_rank;
    bool markov_rank_stated; /* false: rank unknown until em_hf_draft_check_tensors */
    /* confidence head (dspark.md §2.4) */
    bool confidence_head;
    bool confidence_with_markov; /* input [h ; W1[prev]] (absent -> true, the documented default) */
    double confidence_head_alpha; /* training loss weight; 0 when absent */
    /* Which of embed_tokens / lm_head the checkpoint carries (else borrowed from the target).
     * From the flavour (dspark.md §1.7, §3): z-lab and SpecForge neither, DeepSpec both,
     * speculators both. em_hf_draft_check_tensors replaces them with what the tensors say. */
    bool has_embed_tokens, has_lm_head;
    bool tensors_checked;
    int64_t bos_token_id, eos_token_id, pad_token_id; /* -1 when absent */
} em_hf_draft;

const char *em_hf_draft_flavour_name(enum em_hf_draft_flavour f);
const char *em_hf_markov_name(enum em_hf_markov m);
/* Drafted tokens per step: B when sample_from_anchor, else B-1. Verify width is this + 1. */
int64_t em_hf_draft_n_drafts(const em_hf_draft *d);
/* Tap i in llama.cpp's convention for the GGUF key dflash.target_layers: HF id + 1. */
int32_t em_hf_draft_gguf_target_layer(const em_hf_draft *d, int i);
/* Confronts the config with a drafter checkpoint: sets has_embed_tokens / has_lm_head from
 * the tensors present (names with or without a "model." prefix), takes the Markov rank from
 * markov_head.markov_w1.weight when the config does not state it, and fails (naming the
 * tensor) when the config says a Markov or confidence head exists and its tensors are
 * missing, when such tensors exist that the config does not describe, or when
 * fc.weight / markov shapes disagree with hidden_size, taps, vocab or rank. */
int em_hf_draft_check_tensors(em_hf_draft *d, const em_safetensors *st, em_err *err);

/* ---- the whole file --------------------------------------------------------------------- */

enum em_hf_kind { EM_HF_KIMI = 1, EM_HF_DRAFT = 2 };

typedef struct em_hf_config {
    enum em_hf_kind kind;
    char model_type[EM_HF_NAME];   /* top-level model_type as written ("" when absent) */
    char architecture[EM_HF_NAME]; /* architectures[0] ("" when absent) */
    em_hf_kimi kimi;               /* valid when kind == EM_HF_KIMI */
    em_hf_draft draft;             /* valid when kind == EM_HF_DRAFT */
} em_hf_config;

/* path: a config.json file, or a folder holding one. */
int em_hf_config_load(em_hf_config *out, const char *path, em_err *err);
/* Parses config text of len bytes; name is used in messages. */
int em_hf_config_parse(em_hf_config *out, const char *json, size_t len, const char *name,
                       em_err *err);

const char *em_hf_attn_kind_name(enum em_hf_attn_kind k); /* "kda", "mla" */
const char *em_hf_mlp_kind_name(enum em_hf_mlp_kind k);   /* "dense", "moe" */

#endif
