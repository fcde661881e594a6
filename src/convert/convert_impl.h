/* Internal to convert/: the shape of a mapping table and of the model description the
 * engine (convert.c) works from. An architecture is data: a table of tensor rules (source
 * name pattern, GGUF name pattern, the layers it applies to, expected source shape, GGUF
 * shape, transform, type class) and a table of metadata keys; plus one setup function that
 * turns config.json into symbolic dimensions, condition flags and key values. The engine
 * knows no model: it instantiates the rules, checks every source tensor against them, and
 * streams the data. */
#ifndef EM_CONVERT_IMPL_H
#define EM_CONVERT_IMPL_H

#include "convert/convert.h"
#include "format/gguf.h"
#include "convert/hfconfig.h"
#include "format/safetensors.h"

/* ---- symbolic dimensions (values come from config.json through the setup function) ---- */

enum cv_dim {
    CV_D_ONE = 0, /* always 1 */
    CV_D_EMBD,    /* hidden_size */
    CV_D_VOCAB,   /* vocab_size */
    CV_D_FF,      /* intermediate_size (dense FFN) */
    /* Kimi MoE */
    CV_D_FF_EXP,  /* moe_intermediate_size */
    CV_D_SHEXP,   /* moe_intermediate_size * num_shared_experts */
    CV_D_NEXP,    /* num_experts */
    /* Kimi KDA */
    CV_D_KDA_HEADS, CV_D_KDA_HD, CV_D_KDA_INNER, CV_D_CONV,
    /* Kimi MLA */
    CV_D_HEADS,   /* num_attention_heads */
    CV_D_Q_OUT,   /* heads * (nope + rope) */
    CV_D_NOPE, CV_D_V, CV_D_KV_LORA,
    CV_D_KV_A,    /* kv_lora + rope */
    CV_D_KV_B,    /* heads * (nope + v) */
    CV_D_O_IN,    /* heads * v */
    CV_D_Q_LORA,
    /* Kimi-K3 */
    CV_D_LAT,     /* routed-expert width: routed_expert_hidden_size (latent MoE), else hidden */
    /* drafter (Qwen3 backbone, heads) */
    CV_D_DVOCAB,  /* draft_vocab_size */
    CV_D_HEAD_DIM,
    CV_D_QH_OUT,  /* heads * head_dim */
    CV_D_KV_OUT,  /* kv_heads * head_dim */
    CV_D_FC_IN,   /* taps * hidden_size */
    CV_D_RANK,    /* markov_rank */
    CV_D_RANK3,   /* 3 * markov_rank (rnn joint_proj rows) */
    CV_D_CONF_IN, /* hidden (+ rank when the confidence head reads the Markov embedding) */
    CV_D_GATE_IN, /* hidden + rank */
    CV_D_JOINT_IN, /* 2 * rank + hidden */
    CV_D_COUNT
};

/* ---- conditions: a rule applies where all of its condition bits hold ------------------- */

enum {
    CV_C_KDA = 1u << 0,     /* layer: Kimi Delta Attention */
    CV_C_MLA = 1u << 1,     /* layer: multi-head latent attention */
    CV_C_DENSE = 1u << 2,   /* layer: dense FFN */
    CV_C_MOE = 1u << 3,     /* layer: routed experts */
    CV_C_QLORA = 1u << 4,   /* model: q_lora_rank set */
    CV_C_NOQLORA = 1u << 5, /* model: direct q_proj */
    CV_C_SHEXP = 1u << 6,   /* model: shared experts */
    CV_C_TIED = 1u << 7,    /* model: lm head tied to the embedding */
    CV_C_UNTIED = 1u << 8,
    CV_C_MARKOV = 1u << 9,  /* drafter: Markov head (DSpark) */
    CV_C_GATED = 1u << 10,  /* drafter: gated Markov head */
    CV_C_RNN = 1u << 11,    /* drafter: rnn Markov head */
    CV_C_CONF = 1u << 12,   /* drafter: confidence head */
    CV_C_BIAS = 1u << 13,   /* drafter: attention_bias */
    CV_C_MXFP4 = 1u << 14,  /* K3: routed experts in compressed-tensors MXFP4 */
    CV_C_DENSEXP = 1u << 15, /* routed experts as plain float weights (Kimi-Linear; K3 unless MXFP4) */
    CV_C_LATENT = 1u << 16, /* K3: latent MoE (routed_expert_down/up_proj) */
    CV_C_LATNORM = 1u << 17, /* K3: routed_expert_norm (latent_moe_use_norm) */
    CV_C_ATTNRES = 1u << 18, /* K3: block attention residuals (attn_res_block_size > 0) */
    CV_C_MLAGATE = 1u << 19, /* K3: MLA sigmoid output gate (mla_use_output_gate) */
};

/* ---- tensor rules ---------------------------------------------------------------------- */

/* Where a rule's tensor goes: before the layers, in each layer, after the layers. */
enum cv_scope { CV_PRE = 0, CV_LAYER = 1, CV_POST = 2 };

enum cv_need {
    CV_REQUIRED = 0, /* missing source: the conversion fails naming it */
    CV_OPTIONAL = 1, /* written when the source exists */
    CV_DROP = 2,     /* a known training-only tensor: consumed, not written */
};

enum cv_xf {
    CV_X_COPY = 0, /* same elements, same order (ggml ne = reversed torch shape) */
    CV_X_NEG_EXP,  /* y = -exp(x) (A_log -> ssm_a) */
    CV_X_STACK,    /* NEXP sources ({E} = 0..NEXP-1) [out, in] -> ne [in, out, NEXP] */
    CV_X_KV_B_K,   /* kv_b [heads, nope+v, kv_lora]: the k part, transposed -> [nope, kv_lora, heads] */
    CV_X_KV_B_V,   /* the v part -> ne [kv_lora, v, heads] */
    CV_X_D2T,      /* draft->target offsets (int) -> absolute target ids, I64 */
    CV_X_NEG_EXP_HEAD, /* y = -exp(x) over the first KDA_HEADS values of a 1-D source that may
                        * be longer (K3's A_log is padded) */
    CV_X_FUSE_MUL, /* y = src * alt elementwise in f32 (K3 res_norm x res_proj -> res score) */
    CV_X_MXFP4,    /* NEXP pairs (src = weight_packed U8 [out, in/2], alt = weight_scale U8
                    * [out, in/32]) -> ggml MXFP4 ne [in, out, NEXP], repacked losslessly */
};

/* Type classes of the policy (em_convert_policy). */
enum cv_class {
    CV_K_MATRIX = 0, /* weight matrix: the requested type (q8_0 when rows are a multiple of 32) */
    CV_K_F32,        /* norms, biases, ssm_a, dt bias, conv weights, confidence head */
    CV_K_ROUTER,     /* MoE router weights: F32 (selection is sensitive to near ties) */
    CV_K_I64,        /* integer maps (d2t) */
    CV_K_MXFP4,      /* already MXFP4 in the source: kept MXFP4 whatever --type says */
};

typedef struct cv_rule {
    uint8_t scope;     /* enum cv_scope */
    uint8_t need;      /* enum cv_need */
    uint8_t xf;        /* enum cv_xf */
    uint8_t cls;       /* enum cv_class */
    uint32_t when;     /* CV_C_* bits that must all hold */
    const char *src;   /* source name; "{L}" layer, "{E}" expert */
    const char *alt;   /* another spelling of the source, or NULL; FUSE_MUL: the second factor;
                        * MXFP4: the scale tensor ("{E}") */
    const char *dst;   /* GGUF name; "{L}" layer (NULL for CV_DROP) */
    uint8_t src_n;     /* expected source shape, outermost first (one expert for STACK) */
    uint8_t src_dims[4];
    uint8_t dst_n;     /* GGUF ne, fastest first */
    uint8_t dst_ne[4];
} cv_rule;

/* Shapes in rules: D2(a, b) is "2 dimensions, CV_D_a then CV_D_b" (src_n/src_dims, dst_n/dst_ne). */
#define D1(a) 1, { CV_D_##a }
#define D2(a, b) 2, { CV_D_##a, CV_D_##b }
#define D3(a, b, c) 3, { CV_D_##a, CV_D_##b, CV_D_##c }
#define D4(a, b, c, d) 4, { CV_D_##a, CV_D_##b, CV_D_##c, CV_D_##d }

/* A piece of a rule table. An architecture's table is a list of pieces, so that one can reuse
 * another's (K3 = Kimi-Linear's pieces plus its own); within a scope (before, per layer,
 * after) rules apply in list order, which is the GGUF's tensor order. */
typedef struct cv_rules {
    const cv_rule *rules;
    size_t n;
} cv_rules;

#define CV_TABLE(arr) { arr, sizeof arr / sizeof arr[0] }

/* ---- metadata keys --------------------------------------------------------------------- */

enum cv_ktype {
    CV_T_U32 = 0,
    CV_T_F32,
    CV_T_BOOL,
    CV_T_STR,
    CV_T_ARR_I32,
};

/* Values the setup function provides; a key is written only when its value is set. */
enum cv_vid {
    CV_V_CTX = 0, CV_V_EMBD, CV_V_BLOCKS, CV_V_FF, CV_V_HEADS, CV_V_HEADS_KV, CV_V_HEADS_KV_ARR,
    CV_V_ROPE_BASE, CV_V_RMS_EPS, CV_V_N_EXPERT, CV_V_N_EXPERT_USED, CV_V_EXPERT_GROUPS,
    CV_V_EXPERT_GROUPS_USED, CV_V_GATING, CV_V_KEY_LEN, CV_V_VALUE_LEN, CV_V_VOCAB,
    CV_V_CONV_KERNEL, CV_V_KDA_HEAD_DIM, CV_V_Q_LORA, CV_V_KV_LORA, CV_V_ROPE_DIMS,
    CV_V_KEY_LEN_MLA, CV_V_VALUE_LEN_MLA, CV_V_FF_EXP, CV_V_SHARED, CV_V_DENSE_LEAD,
    CV_V_EXPERT_SCALE, CV_V_EXPERT_NORM,
    /* Kimi-K3 */
    CV_V_GATE_LB, CV_V_LATENT, CV_V_ATTN_RES_BLOCK, CV_V_SITU_BETA, CV_V_SITU_LIN_BETA,
    /* RoPE scaling */
    CV_V_ROPE_SCALING, CV_V_ROPE_FACTOR, CV_V_ROPE_ORIG_CTX, CV_V_YARN_BETA_FAST,
    CV_V_YARN_BETA_SLOW, CV_V_YARN_ATTN_FACTOR, CV_V_YARN_LOG_MUL,
    /* drafters */
    CV_V_CAUSAL, CV_V_TARGET_LAYERS, CV_V_BLOCK_SIZE, CV_V_SAMPLE_FROM_ANCHOR, CV_V_HAS_CONF,
    CV_V_MARKOV_RANK, CV_V_MARKOV_TYPE, CV_V_CONF_WITH_MARKOV, CV_V_MASK_TOKEN,
    CV_V_SOFTCAP, CV_V_LOGIT_SCALE,
    CV_V_COUNT
};

typedef struct cv_key {
    const char *key; /* "{A}" = the architecture name */
    uint8_t type;    /* enum cv_ktype */
    uint8_t val;     /* enum cv_vid */
} cv_key;

/* A piece of a key table (as cv_rules: keys are written in list order). */
typedef struct cv_keys {
    const cv_key *keys;
    size_t n;
} cv_keys;

typedef struct cv_val {
    bool set;
    uint64_t u;
    double f;
    bool b;
    char s[32];
    int32_t *arr; /* CV_T_ARR_I32: n_arr elements, owned by the model */
    int n_arr;
} cv_val;

/* ---- the model as the engine sees it ------------------------------------------------------ */

typedef struct cv_model {
    em_hf_config *cfg; /* the setup may complete it (drafters: em_hf_draft_check_tensors) */
    const em_safetensors *st;
    const char *cfg_path;
    int64_t dims[CV_D_COUNT];
    uint32_t flags;                      /* model-wide CV_C_* bits */
    int n_layers;
    uint32_t layer_flags[EM_HF_MAX_LAYERS]; /* per layer, ORed with flags */
    cv_val vals[CV_V_COUNT];
    char mode[16], layout[32], markov[16];
    const char *vocab_arch;              /* the arch the tokenizer loader is told */
    int file_type;                       /* general.file_type override; -1: from --type */
    char note[160];                      /* a line for the report (K3: MXFP4 experts kept) */
} cv_model;

typedef struct cv_arch {
    const char *name;            /* general.architecture */
    struct {
        const cv_rules *const *list; /* the pieces of the tensor table, in order */
        size_t n;
    } rules;
    struct {
        const cv_keys *const *list; /* the pieces of the key table, in order */
        size_t n;
    } keys;
    const char *optional_prefix; /* a source may also carry this prefix ("model.") */
    const char *const *skip_prefixes; /* NULL-terminated: sources consumed and not written
                                       * (K3's vision tower), counted in the report */
    int (*setup)(cv_model *m, em_err *err);
} cv_arch;

extern const cv_arch em_cv_arch_kimi_linear;
extern const cv_arch em_cv_arch_dflash;
extern const cv_arch em_cv_arch_kimi_k3;

/* Kimi-Linear's table pieces that Kimi-K3's table reuses (map_kimi.c). */
extern const cv_rules em_cv_kimi_lead, em_cv_kimi_kda_in, em_cv_kimi_kda_gates,
    em_cv_kimi_kda_out_mla_in, em_cv_kimi_mla_out_ffn, em_cv_kimi_experts, em_cv_kimi_shexp,
    em_cv_kimi_post;
extern const cv_keys em_cv_kimi_keys_dims, em_cv_kimi_keys_gating, em_cv_kimi_keys_cache,
    em_cv_kimi_keys_kda, em_cv_kimi_keys_lora, em_cv_kimi_keys_moe;

/* Shared by the Kimi-Linear and Kimi-K3 setups (map_kimi.c): the common dimensions; the
 * dimensions again with the model and per-layer conditions both have (q-LoRA, shared experts,
 * tying; KDA/MLA and dense/MoE per layer) and the report's layout name; the common key values
 * (lead = leading dense layers); and the checks both architectures make, the activation (act)
 * included (quantization is the caller's). */
void em_cv_kimi_dims(cv_model *m, const em_hf_kimi *k);
void em_cv_kimi_layers(cv_model *m, const em_hf_kimi *k, const char *layout);
int em_cv_kimi_values(cv_model *m, const em_hf_kimi *k, int64_t lead, em_err *err);
int em_cv_kimi_common_check(const cv_model *m, const em_hf_kimi *k, const char *arch,
                            const char *act, int64_t *lead, em_err *err);
/* EM_EUNSUPPORTED: "CONFIG: what" (the mappings' refusals). */
int em_cv_unsupported(const cv_model *m, em_err *err, const char *what);

/* The architecture of a parsed config; EM_EUNSUPPORTED for what the converter cannot write. */
int em_cv_arch_for(const em_hf_config *cfg, const char *cfg_path, const cv_arch **out,
                   em_err *err);

/* Sets a key value (helpers for the setup functions). */
void em_cv_set_u(cv_model *m, enum cv_vid v, uint64_t u);
void em_cv_set_f(cv_model *m, enum cv_vid v, double f);
void em_cv_set_b(cv_model *m, enum cv_vid v, bool b);
void em_cv_set_s(cv_model *m, enum cv_vid v, const char *s);
/* Takes ownership of arr (malloc'ed). */
void em_cv_set_arr(cv_model *m, enum cv_vid v, int32_t *arr, int n);

/* ---- outputs (outputs.c) ----------------------------------------------------------------- */

/* Refuses (EM_EINVAL, naming both paths) any of outs[0..n_outs) or o->report_path that is the
 * same file as another of them or as an input (st's shards, the files read from src_dir and
 * tokenizer_dir). st may be NULL (then only the files beside it are compared). */
int em_cv_check_outputs(const em_convert_opts *o, const em_safetensors *st, const char *const *outs,
                        int n_outs, em_err *err);
/* The staging name of output path out (malloc'ed): STEM.staged-PID.gguf for STEM.gguf; the
 * writer derives shard names from it as from out. */
char *em_cv_stage_path(const char *out, em_err *err);
/* The final name of staged (a name the writer derived from em_cv_stage_path(out)). */
char *em_cv_final_path(const char *out, const char *staged, em_err *err);
/* Checks the final names (rep->shards[i].path) against the report and the inputs, writes the
 * report (o->report_path, if any) to a temporary name, then renames the report and every
 * staged[i] into place; on failure nothing new stays at a final name (the staged files left
 * are the caller's to remove). */
int em_cv_commit(const em_convert_opts *o, const em_safetensors *st, const char *const *staged,
                 em_convert_report *rep, em_err *err);
/* The JSON report written and fsynced to a temporary name next to path (*tmp, malloc'ed). */
int em_cv_report_stage(const em_convert_report *rep, const char *path, char **tmp, em_err *err);

/* ---- tokenizer keys (vocab.c) ------------------------------------------------------------ */

/* Ember's Kimi-K3 chat template (k3_template.c), embedded when a K3 checkpoint has none. */
extern const char em_cv_k3_chat_template[];

/* Writes the tokenizer.* keys: from the tokenizer files in dir (NULL or a folder without
 * them: tokenizer.ggml.model = "none"), padded to vocab_size; tokenizer.chat_template from
 * those files, else (Kimi-K3 rules) em_cv_k3_chat_template. Fills the report's tokenizer
 * fields. */
int em_cv_write_vocab(em_gguf_writer *w, const char *dir, int64_t vocab_size, const char *arch,
                      const cv_model *m, em_convert_report *rep, em_err *err);

#endif
