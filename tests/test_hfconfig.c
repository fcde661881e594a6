/* Tests for convert/hfconfig: every fixture in tests/data/hfconfig/ parses to the values the
 * file states (and, for Kimi, the per-layer table the reference spells out 0-indexed); the
 * transformers-5 spelling yields the same model as the Moonshot spelling; each bad config
 * fails with its status and a message naming the field; drafter configs are confronted
 * with small checkpoints written here. */
#include "testutil.h"

#include "convert/hfconfig.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void load_ok(const char *rel, em_hf_config *c) {
    em_err err = { 0 };
    int rc = em_hf_config_load(c, em_test_src(rel), &err);
    if (rc) fail_msg("%s: %s", rel, err.msg);
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1, fabs(b)); }

/* ---- Kimi Linear 48B (reference §1) ----------------------------------------------------- */

/* The layer map the reference states 0-indexed: MLA at 3, 7, 11, 15, 19, 23, 26; layer 0
 * dense; every other layer MoE. */
static void check_kimi48_layers(const em_hf_kimi *k) {
    static const int mla[] = { 3, 7, 11, 15, 19, 23, 26 };
    assert_int_equal(k->n_layers, 27);
    for (int l = 0; l < 27; l++) {
        bool is_mla = false;
        for (size_t i = 0; i < sizeof mla / sizeof mla[0]; i++) is_mla |= mla[i] == l;
        assert_int_equal(k->attn[l], is_mla ? EM_HF_ATTN_MLA : EM_HF_ATTN_KDA);
        assert_int_equal(k->mlp[l], l == 0 ? EM_HF_MLP_DENSE : EM_HF_MLP_MOE);
    }
    assert_int_equal(k->n_kda, 20);
    assert_int_equal(k->n_mla, 7);
    assert_int_equal(k->n_dense, 1);
    assert_int_equal(k->n_moe, 26);
}

static void check_kimi48_fields(const em_hf_kimi *k) {
    assert_false(k->is_k3);
    assert_int_equal(k->vocab_size, 163840);
    assert_int_equal(k->hidden_size, 2304);
    assert_int_equal(k->num_hidden_layers, 27);
    assert_int_equal(k->intermediate_size, 9216);
    assert_int_equal(k->num_attention_heads, 32);
    assert_int_equal(k->num_key_value_heads, 32);
    assert_false(k->has_q_lora);
    assert_int_equal(k->q_lora_rank, 0);
    assert_int_equal(k->kv_lora_rank, 512);
    assert_int_equal(k->qk_nope_head_dim, 128);
    assert_int_equal(k->qk_rope_head_dim, 64);
    assert_int_equal(k->v_head_dim, 128);
    assert_true(k->mla_use_nope);
    assert_int_equal(k->rope.type, EM_HF_ROPE_DEFAULT);
    assert_true(k->rope.theta == 10000.0);
    assert_int_equal(k->kda_num_heads, 32);
    assert_int_equal(k->kda_head_dim, 128);
    assert_int_equal(k->kda_short_conv_kernel_size, 4);
    assert_int_equal(k->num_experts, 256);
    assert_int_equal(k->num_experts_per_token, 8);
    assert_int_equal(k->moe_intermediate_size, 1024);
    assert_int_equal(k->num_shared_experts, 1);
    assert_int_equal(k->first_k_dense_replace, 1);
    assert_int_equal(k->moe_layer_freq, 1);
    assert_string_equal(k->moe_router_activation_func, "sigmoid");
    assert_true(k->moe_renormalize);
    assert_true(near(k->routed_scaling_factor, 2.446));
    assert_int_equal(k->num_expert_group, 1);
    assert_int_equal(k->topk_group, 1);
    assert_true(k->use_grouped_topk);
    assert_true(near(k->rms_norm_eps, 1e-5));
    assert_false(k->tie_word_embeddings);
    assert_string_equal(k->hidden_act, "silu");
    assert_int_equal(k->model_max_length, 1048576);
    assert_int_equal(k->num_nextn_predict_layers, 0);
    assert_true(k->has_bos && k->has_pad);
    assert_int_equal(k->bos_token_id, 163584);
    assert_int_equal(k->n_eos, 1);
    assert_int_equal(k->eos_token_ids[0], 163586);
    assert_int_equal(k->pad_token_id, 163839);
    assert_false(k->mla_use_output_gate || k->kda_use_full_rank_gate ||
                 k->kda_has_gate_lower_bound);
    assert_int_equal(k->routed_expert_hidden_size, 0);
    assert_int_equal(k->attn_res_block_size, 0);
    check_kimi48_layers(k);
}

static void test_kimi_linear_48b(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/kimi-linear-48b-a3b-instruct.json", &c);
    assert_int_equal(c.kind, EM_HF_KIMI);
    assert_string_equal(c.model_type, "kimi_linear");
    assert_string_equal(c.architecture, "KimiLinearForCausalLM");
    check_kimi48_fields(&c.kimi);
    assert_int_equal(c.kimi.head_dim, 72);
}

/* The transformers-5 save (attribute names, layer_types/mlp_layer_types, rope_parameters, no
 * linear_attn_config) describes the same model. */
static void test_kimi_linear_tf5(void **state) {
    (void)state;
    em_hf_config a, b;
    load_ok("tests/data/hfconfig/kimi-linear-48b-a3b-instruct.json", &a);
    load_ok("tests/data/hfconfig/kimi-linear-48b-a3b-tf5.json", &b);
    assert_int_equal(b.kind, EM_HF_KIMI);
    check_kimi48_fields(&b.kimi);
    assert_int_equal(b.kimi.dense_ffn_hidden, 9216);
    assert_memory_equal(a.kimi.attn, b.kimi.attn, sizeof a.kimi.attn);
    assert_memory_equal(a.kimi.mlp, b.kimi.mlp, sizeof a.kimi.mlp);
    assert_true(memcmp(&a.kimi.rope, &b.kimi.rope, sizeof a.kimi.rope) == 0);
}

static void test_kimi_linear_small_both(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/kimi-linear-small-both.json", &c);
    const em_hf_kimi *k = &c.kimi;
    static const uint8_t attn[6] = { 0, 0, 1, 0, 0, 1 };
    /* first_k_dense_replace 1, moe_layer_freq 2: MoE at l >= 1 with l % 2 == 0 */
    static const uint8_t mlp[6] = { 0, 0, 1, 0, 1, 0 };
    assert_int_equal(k->n_layers, 6);
    assert_memory_equal(k->attn, attn, 6);
    assert_memory_equal(k->mlp, mlp, 6);
    assert_int_equal(k->moe_layer_freq, 2);
    assert_true(k->has_q_lora);
    assert_int_equal(k->q_lora_rank, 32);
    assert_int_equal(k->n_eos, 2);
    assert_int_equal(k->eos_token_ids[0], 2);
    assert_int_equal(k->eos_token_ids[1], 3);
    assert_string_equal(k->moe_router_activation_func, "softmax");
    assert_false(k->moe_renormalize);
    assert_int_equal(k->num_expert_group, 2);
    assert_true(k->tie_word_embeddings);
    assert_true(near(k->rms_norm_eps, 1e-6));
    assert_int_equal(k->model_max_length, 0);
}

static void test_kimi_linear_tiny(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/kimi-linear-tiny.json", &c);
    const em_hf_kimi *k = &c.kimi;
    static const uint8_t attn[5] = { 0, 0, 0, 1, 0 };
    static const uint8_t mlp[5] = { 0, 1, 1, 1, 1 };
    assert_memory_equal(k->attn, attn, 5);
    assert_memory_equal(k->mlp, mlp, 5);
    assert_int_equal(k->hidden_size, 512);
    assert_int_equal(k->kda_num_heads, 8);
    assert_int_equal(k->kda_head_dim, 64);
    assert_int_equal(k->num_experts, 4);
    assert_int_equal(k->num_experts_per_token, 2);
    assert_int_equal(k->model_max_length, 8192);
    assert_string_equal(em_hf_attn_kind_name(k->attn[3]), "mla");
    assert_string_equal(em_hf_mlp_kind_name(k->mlp[0]), "dense");
}

/* Kimi-K3 (reference §9). */
static void test_kimi_k3(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/kimi-k3.json", &c);
    assert_int_equal(c.kind, EM_HF_KIMI);
    assert_string_equal(c.model_type, "kimi_k3");
    assert_string_equal(c.architecture, "KimiK3ForConditionalGeneration");
    const em_hf_kimi *k = &c.kimi;
    assert_true(k->is_k3);
    assert_int_equal(k->n_layers, 93);
    for (int l = 0; l < 93; l++) {
        bool mla = (l + 1) % 4 == 0 || l == 92; /* 1-indexed 4, 8, ..., 92 and 93 */
        assert_int_equal(k->attn[l], mla ? EM_HF_ATTN_MLA : EM_HF_ATTN_KDA);
        assert_int_equal(k->mlp[l], l == 0 ? EM_HF_MLP_DENSE : EM_HF_MLP_MOE);
    }
    assert_int_equal(k->n_mla, 24);
    assert_int_equal(k->n_kda, 69);
    assert_int_equal(k->hidden_size, 7168);
    assert_int_equal(k->num_attention_heads, 96);
    assert_true(k->has_q_lora);
    assert_int_equal(k->q_lora_rank, 1536);
    assert_int_equal(k->kv_lora_rank, 512);
    assert_int_equal(k->kda_num_heads, 96);
    assert_int_equal(k->intermediate_size, 33792);
    assert_int_equal(k->num_experts, 896);
    assert_int_equal(k->num_experts_per_token, 16);
    assert_int_equal(k->num_shared_experts, 2);
    assert_int_equal(k->moe_intermediate_size, 3072);
    assert_int_equal(k->routed_expert_hidden_size, 3584);
    assert_true(k->latent_moe_use_norm);
    assert_int_equal(k->attn_res_block_size, 12);
    assert_string_equal(k->hidden_act, "situ");
    assert_true(k->activation_situ_beta == 4.0 && k->activation_situ_linear_beta == 25.0);
    assert_true(k->routed_scaling_factor == 1.0);
    assert_true(k->kda_has_gate_lower_bound && k->kda_gate_lower_bound == -5.0);
    assert_true(k->kda_use_full_rank_gate);
    assert_true(k->mla_use_output_gate);
    assert_true(k->mla_use_nope);
    assert_string_equal(k->quant_format, "mxfp4-pack-quantized");
    assert_string_equal(k->quant_method, "compressed-tensors");
    assert_int_equal(k->eos_token_ids[0], 163586);
}

/* ---- drafters (dspark.md §3) ------------------------------------------------------------ */

static void check_qwen3_8b_backbone(const em_hf_draft *d) {
    assert_int_equal(d->num_hidden_layers, 5);
    assert_int_equal(d->hidden_size, 4096);
    assert_int_equal(d->num_attention_heads, 32);
    assert_int_equal(d->num_key_value_heads, 8);
    assert_int_equal(d->head_dim, 128);
    assert_int_equal(d->intermediate_size, 12288);
    assert_true(near(d->rms_norm_eps, 1e-6));
    assert_int_equal(d->rope.type, EM_HF_ROPE_DEFAULT);
    assert_true(d->rope.theta == 1e6);
    assert_int_equal(d->vocab_size, 151936);
    assert_string_equal(d->backbone_model_type, "qwen3");
    static const int32_t taps[5] = { 1, 9, 17, 25, 33 };
    assert_int_equal(d->n_taps, 5);
    assert_memory_equal(d->target_layer_ids, taps, sizeof taps);
    assert_int_equal(d->mask_token_id, 151669);
    assert_false(d->causal);
    assert_false(d->attention_bias);
}

static void test_draft_zlab(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/draft-zlab-qwen3-8b-dflash-b16.json", &c);
    assert_int_equal(c.kind, EM_HF_DRAFT);
    const em_hf_draft *d = &c.draft;
    assert_int_equal(d->flavour, EM_HF_DRAFT_ZLAB);
    check_qwen3_8b_backbone(d);
    assert_int_equal(d->block_size, 16);
    assert_false(d->sample_from_anchor);
    assert_false(d->sample_from_anchor_stated);
    assert_int_equal(em_hf_draft_n_drafts(d), 15);
    assert_int_equal(d->num_target_layers, 36);
    assert_int_equal(d->markov, EM_HF_MARKOV_NONE);
    assert_false(d->confidence_head);
    assert_false(d->has_embed_tokens || d->has_lm_head);
    assert_int_equal(d->draft_vocab_size, 151936);
    /* llama.cpp's dflash.target_layers for this drafter is [2, 10, 18, 26, 34] */
    static const int32_t gguf[5] = { 2, 10, 18, 26, 34 };
    for (int i = 0; i < 5; i++) assert_int_equal(em_hf_draft_gguf_target_layer(d, i), gguf[i]);
    assert_int_equal(em_hf_draft_gguf_target_layer(d, 5), -1);
    assert_string_equal(em_hf_draft_flavour_name(d->flavour), "z-lab DFlash");
}

static void test_draft_deepspec(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/draft-deepspec-qwen3-8b-dspark-block7.json", &c);
    const em_hf_draft *d = &c.draft;
    assert_int_equal(d->flavour, EM_HF_DRAFT_DEEPSPEC);
    check_qwen3_8b_backbone(d);
    assert_int_equal(d->block_size, 7);
    assert_true(d->sample_from_anchor); /* absent; DeepSpec is anchor-as-first-prediction */
    assert_int_equal(em_hf_draft_n_drafts(d), 7);
    assert_int_equal(d->markov, EM_HF_MARKOV_VANILLA);
    assert_int_equal(d->markov_rank, 256);
    assert_true(d->confidence_head && d->confidence_with_markov);
    assert_true(d->has_embed_tokens && d->has_lm_head);
    assert_int_equal(d->eos_token_id, 151645);
}

static void test_draft_specforge(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/draft-specforge-kimi-k3-dspark.json", &c);
    const em_hf_draft *d = &c.draft;
    assert_int_equal(d->flavour, EM_HF_DRAFT_SPECFORGE);
    assert_int_equal(d->hidden_size, 7168);
    assert_int_equal(d->intermediate_size, 14336);
    assert_int_equal(d->num_attention_heads, 64);
    assert_int_equal(d->num_key_value_heads, 16);
    assert_int_equal(d->head_dim, 64);
    assert_int_equal(d->num_target_layers, 93);
    static const int32_t taps[5] = { 7, 23, 51, 67, 83 };
    assert_memory_equal(d->target_layer_ids, taps, sizeof taps);
    assert_int_equal(d->mask_token_id, 163824);
    assert_int_equal(d->block_size, 7);
    assert_true(d->sample_from_anchor);
    assert_int_equal(d->rope.type, EM_HF_ROPE_YARN);
    assert_true(d->rope.factor == 16 && d->rope.theta == 10000);
    assert_int_equal(d->rope.original_max_position_embeddings, 4096);
    assert_true(d->rope.beta_fast == 32 && d->rope.beta_slow == 1); /* HF defaults */
    assert_int_equal(d->max_position_embeddings, 65536);
    assert_int_equal(d->markov, EM_HF_MARKOV_VANILLA);
    assert_int_equal(d->markov_rank, 256);
    assert_true(d->confidence_head && d->confidence_with_markov);
    assert_true(d->confidence_head_alpha == 1.0);
    assert_string_equal(d->attention_mode, "gqa");
    assert_string_equal(d->projector_type, "dspark");
    assert_false(d->has_embed_tokens || d->has_lm_head);
    assert_int_equal(d->vocab_size, 163840);
    assert_true(near(d->rms_norm_eps, 1e-5));
}

static void test_draft_speculators(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/draft-speculators-qwen3-8b-dspark.json", &c);
    const em_hf_draft *d = &c.draft;
    assert_int_equal(d->flavour, EM_HF_DRAFT_SPECULATORS);
    /* aux_hidden_state_layer_ids [2, 10, 18, 26, 34] are l + 1 */
    check_qwen3_8b_backbone(d);
    assert_int_equal(d->draft_vocab_size, 32000);
    assert_true(d->sample_from_anchor && d->sample_from_anchor_stated);
    assert_int_equal(d->markov_rank, 256);
    assert_int_equal(em_hf_draft_gguf_target_layer(d, 0), 2);
}

static void test_draft_deepspec_baseline(void **state) {
    (void)state;
    em_hf_config c;
    load_ok("tests/data/hfconfig/draft-deepspec-tiny-dflash-baseline.json", &c);
    const em_hf_draft *d = &c.draft;
    assert_int_equal(d->flavour, EM_HF_DRAFT_DEEPSPEC);
    assert_int_equal(d->markov, EM_HF_MARKOV_NONE);
    assert_true(d->markov_rank_stated);
    assert_int_equal(d->markov_rank, 0);
    assert_false(d->confidence_head);
    assert_int_equal(d->n_taps, 3);
    assert_int_equal(d->target_layer_ids[0], -1); /* the embedding output */
    assert_int_equal(em_hf_draft_gguf_target_layer(d, 0), 0);
    assert_true(d->sample_from_anchor);
    assert_int_equal(em_hf_draft_n_drafts(d), 4);
}

/* ---- bad configs ------------------------------------------------------------------------ */

typedef struct bad_cfg {
    const char *file;
    int code;
    const char *field; /* must appear in the message */
} bad_cfg;

static const bad_cfg k_bad[] = {
    { "kimi-lists-overlap.json", EM_EFORMAT,
      "'linear_attn_config.full_attn_layers': layer 4 is also in kda_layers" },
    { "kimi-list-out-of-range.json", EM_EFORMAT,
      "'linear_attn_config.full_attn_layers': layer 28 is outside [1, 27]" },
    { "kimi-list-gap.json", EM_EFORMAT,
      "'linear_attn_config': layer 13 (1-indexed) is in neither" },
    { "kimi-list-zero-indexed.json", EM_EFORMAT, "'linear_attn_config.kda_layers': layer 0" },
    { "kimi-list-missing-full.json", EM_EFORMAT, "'linear_attn_config.full_attn_layers': missing" },
    { "kimi-no-layer-kinds.json", EM_EFORMAT, "'linear_attn_config.kda_layers': missing" },
    { "kimi-layer-types-disagree.json", EM_EFORMAT,
      "'layer_types': entry 3 says linear_attention" },
    { "kimi-layer-types-bad-value.json", EM_EFORMAT, "'layer_types': entry 5" },
    { "kimi-layer-types-length.json", EM_EFORMAT, "'layer_types': has 26 entries for 27 layers" },
    { "kimi-mlp-types-disagree.json", EM_EFORMAT, "'mlp_layer_types': entry 0 says sparse" },
    { "kimi-mlp-sparse-no-experts.json", EM_EFORMAT, "'mlp_layer_types'" },
    { "kimi-topk-gt-experts.json", EM_EFORMAT, "'num_experts_per_token': 5 is outside [1, 4]" },
    { "kimi-alias-conflict.json", EM_EFORMAT,
      "'num_experts' (256) and 'n_routed_experts' (128) disagree" },
    { "kimi-negative-hidden.json", EM_EFORMAT, "'hidden_size': must be positive" },
    { "kimi-missing-kv-lora.json", EM_EFORMAT, "'kv_lora_rank': missing" },
    { "kimi-hidden-size-string.json", EM_EFORMAT, "'hidden_size': not an integer" },
    { "kimi-missing-fkdr.json", EM_EFORMAT, "'first_k_dense_replace': missing" },
    { "kimi-groups-not-divide.json", EM_EFORMAT, "'num_expert_group'" },
    { "kimi-eos-out-of-range.json", EM_EFORMAT, "'eos_token_id': 163840 is outside" },
    { "kimi-kda-heads-zero.json", EM_EFORMAT, "'linear_attn_config.num_heads': must be positive" },
    { "kimi-tf5-kda-conflict.json", EM_EFORMAT,
      "'linear_attn_config.num_heads' (8) and 'linear_num_heads' (16)" },
    { "kimi-router-func.json", EM_EUNSUPPORTED, "'moe_router_activation_func'" },
    { "kimi-unknown-rope.json", EM_EUNSUPPORTED, "'rope_scaling.type': rope type 'longrope'" },
    { "kimi-too-many-layers.json", EM_EFORMAT, "'num_hidden_layers': 5000" },
    { "unknown-model-type.json", EM_EUNSUPPORTED, "unknown model_type 'llama'" },
    { "kimi-k3-no-text-config.json", EM_EFORMAT, "'text_config': missing" },
    { "kimi-k3-text-model-type.json", EM_EUNSUPPORTED, "'text_config.model_type'" },
    { "kimi-k3-situ-no-beta.json", EM_EFORMAT, "'text_config.activation_situ_beta': missing" },
    { "draft-missing-mask.json", EM_EFORMAT, "'mask_token_id': missing" },
    { "draft-tap-last-layer.json", EM_EFORMAT, "'target_layer_ids': layer 35 is outside [-1, 34]" },
    { "draft-tap-duplicate.json", EM_EFORMAT,
      "'dflash_config.target_layer_ids': layer 9 is listed twice" },
    { "draft-markov-type.json", EM_EUNSUPPORTED, "'markov_head_type'" },
    { "draft-conf-no-markov.json", EM_EFORMAT, "'confidence_head_with_markov'" },
    { "draft-block-size-zero.json", EM_EFORMAT, "'block_size': 0 is outside" },
    { "draft-dflash-block-one.json", EM_EFORMAT, "'block_size': must be at least 2" },
    { "draft-sliding.json", EM_EUNSUPPORTED, "'layer_types': entry 2 is \"sliding_attention\"" },
    { "draft-field-conflict.json", EM_EFORMAT,
      "'dflash_config.mask_token_id' and 'mask_token_id' disagree" },
    { "draft-mask-out-of-vocab.json", EM_EFORMAT,
      "'dflash_config.mask_token_id': 163840 is outside" },
    { "draft-attention-mla.json", EM_EUNSUPPORTED, "'dflash_config.attention_mode'" },
    { "draft-gqa-heads.json", EM_EFORMAT, "'num_key_value_heads': does not divide" },
    { "draft-yarn-no-original.json", EM_EFORMAT,
      "'rope_parameters.original_max_position_embeddings': missing" },
    { "draft-speculators-no-layer-config.json", EM_EFORMAT, "'transformer_layer_config'" },
    { "draft-dflash2.json", EM_EUNSUPPORTED, "'selector_rank'" },
    { "draft-unknown-arch.json", EM_EUNSUPPORTED, "drafter architecture 'DominoDraftModel'" },
    { "duplicate-key.json", EM_EFORMAT, "duplicate object key" },
    { "truncated.json", EM_EFORMAT, "line 4" },
    { "not-object.json", EM_EFORMAT, "not a JSON object" },
};

static void test_bad_configs(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/hfconfig/bad/%s", k_bad[i].file);
        em_hf_config c;
        em_err err = { 0 };
        int rc = em_hf_config_load(&c, em_test_src(rel), &err);
        if (rc != k_bad[i].code)
            fail_msg("%s: status %d (%s), want %d", k_bad[i].file, rc, err.msg, k_bad[i].code);
        if (!strstr(err.msg, k_bad[i].field) || !strstr(err.msg, k_bad[i].file))
            fail_msg("%s: message \"%s\" lacks \"%s\" or the file name", k_bad[i].file, err.msg,
                     k_bad[i].field);
        /* the same failure with err == NULL: status only, no crash */
        assert_int_equal(em_hf_config_load(&c, em_test_src(rel), NULL), k_bad[i].code);
    }
}

/* Every bad fixture on disk is in the table (a new file cannot go untested). */
static void test_bad_table_complete(void **state) {
    (void)state;
    assert_int_equal(em_test_sh(1, "ls '%s' | wc -l", em_test_src("tests/data/hfconfig/bad")), 0);
    size_t n;
    char *out = em_test_read(em_test_path("out.txt"), &n);
    assert_int_equal(atoi(out), (int)(sizeof k_bad / sizeof k_bad[0]));
    free(out);
}

static void test_load_folder_and_text(void **state) {
    (void)state;
    const char *dir = em_test_path("model");
    assert_int_equal(mkdir(dir, 0755), 0);
    size_t n;
    char *text = em_test_read(em_test_src("tests/data/hfconfig/kimi-linear-tiny.json"), &n);
    char path[800];
    snprintf(path, sizeof path, "%s/config.json", dir);
    em_test_write(path, text, n);
    em_hf_config a, b;
    em_err err = { 0 };
    assert_int_equal(em_hf_config_load(&a, dir, &err), EM_OK);
    assert_int_equal(em_hf_config_parse(&b, text, n, "inline", &err), EM_OK);
    assert_int_equal(a.kimi.n_layers, 5);
    assert_memory_equal(a.kimi.attn, b.kimi.attn, 5);
    free(text);
    assert_int_equal(em_hf_config_load(&a, em_test_path("nothing-here"), &err), EM_EIO);
    assert_int_equal(em_hf_config_parse(&a, "{\"model_type\":1}", 16, "x", &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "'model_type'"));
    assert_int_equal(em_hf_config_parse(&a, "{}", 2, "x", &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "'model_type': missing"));
}

/* ---- drafter config vs tensors ---------------------------------------------------------- */

/* Writes a safetensors file of zero-filled BF16 tensors with the given names and 2-D shapes. */
static void write_zero_st(const char *path, const char *const *names, const int64_t (*shapes)[2],
                          int n) {
    char header[4096];
    size_t used = (size_t)snprintf(header, sizeof header, "{");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)(shapes[i][0] * shapes[i][1]) * 2;
        used += (size_t)snprintf(
            header + used, sizeof header - used,
            "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
            i ? "," : "", names[i], (long long)shapes[i][0], (long long)shapes[i][1],
            (unsigned long long)at, (unsigned long long)(at + bytes));
        at += bytes;
    }
    snprintf(header + used, sizeof header - used, "}");
    size_t h = strlen(header), total = 8 + h + (size_t)at;
    uint8_t *b = calloc(1, total);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    em_test_write(path, b, total);
    free(b);
}

static const char *k_tiny_dspark =
    "{\"architectures\":[\"Qwen3DSparkModel\"],\"model_type\":\"qwen3\",\"hidden_size\":8,"
    "\"intermediate_size\":16,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"head_dim\":4,\"rms_norm_eps\":1e-6,\"rope_theta\":10000,"
    "\"vocab_size\":16,\"num_target_layers\":4,\"block_size\":3,\"mask_token_id\":15,"
    "\"target_layer_ids\":[0,1,2],\"enable_confidence_head\":true,%s"
    "\"confidence_head_with_markov\":true}";

static void test_draft_check_tensors(void **state) {
    (void)state;
    char json[1024];
    snprintf(json, sizeof json, k_tiny_dspark,
             "\"markov_rank\":4,\"markov_head_type\":\"vanilla\",");
    em_hf_config c;
    em_err err = { 0 };
    assert_int_equal(em_hf_config_parse(&c, json, strlen(json), "tiny", &err), EM_OK);

    const char *names[] = { "fc.weight",
                            "markov_head.markov_w1.weight",
                            "markov_head.markov_w2.weight",
                            "confidence_head.proj.weight",
                            "confidence_head.proj.bias",
                            "embed_tokens.weight",
                            "lm_head.weight" };
    int64_t shapes[7][2] = { { 8, 24 }, { 16, 4 }, { 16, 4 }, { 1, 12 },
                             { 1, 1 },  { 16, 8 }, { 16, 8 } };
    const char *path = em_test_path("draft.safetensors");
    write_zero_st(path, names, (const int64_t(*)[2])shapes, 7);
    em_safetensors *st;
    assert_int_equal(em_safetensors_open(&st, path, &err), EM_OK);
    c.draft.has_embed_tokens = false;
    assert_int_equal(em_hf_draft_check_tensors(&c.draft, st, &err), EM_OK);
    assert_true(c.draft.tensors_checked && c.draft.has_embed_tokens && c.draft.has_lm_head);
    em_safetensors_close(st);

    /* rank not in the config: taken from markov_w1 */
    snprintf(json, sizeof json, k_tiny_dspark, "");
    assert_int_equal(em_hf_config_parse(&c, json, strlen(json), "tiny", &err), EM_OK);
    assert_false(c.draft.markov_rank_stated);
    assert_int_equal(c.draft.markov, EM_HF_MARKOV_NONE);
    assert_int_equal(em_safetensors_open(&st, path, &err), EM_OK);
    assert_int_equal(em_hf_draft_check_tensors(&c.draft, st, &err), EM_OK);
    assert_int_equal(c.draft.markov_rank, 4);
    assert_int_equal(c.draft.markov, EM_HF_MARKOV_VANILLA);
    em_safetensors_close(st);

    /* no embed/lm_head, "model." prefixes, confidence bias missing */
    const char *pref[] = { "model.fc.weight", "model.markov_head.markov_w1.weight",
                           "model.markov_head.markov_w2.weight",
                           "model.confidence_head.proj.weight" };
    write_zero_st(path, pref, (const int64_t(*)[2])shapes, 4);
    snprintf(json, sizeof json, k_tiny_dspark, "\"markov_rank\":4,");
    assert_int_equal(em_hf_config_parse(&c, json, strlen(json), "tiny", &err), EM_OK);
    assert_int_equal(em_safetensors_open(&st, path, &err), EM_OK);
    assert_int_equal(em_hf_draft_check_tensors(&c.draft, st, &err), EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, "confidence_head.proj.bias"));
    em_safetensors_close(st);

    /* rank in the config disagrees with the tensors */
    write_zero_st(path, names, (const int64_t(*)[2])shapes, 7);
    snprintf(json, sizeof json, k_tiny_dspark, "\"markov_rank\":8,");
    assert_int_equal(em_hf_config_parse(&c, json, strlen(json), "tiny", &err), EM_OK);
    assert_int_equal(em_safetensors_open(&st, path, &err), EM_OK);
    assert_int_equal(em_hf_draft_check_tensors(&c.draft, st, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "markov_head.markov_w1.weight"));
    em_safetensors_close(st);

    /* Markov tensors the config does not describe */
    const char *no_conf =
        "{\"architectures\":[\"Qwen3DSparkModel\"],\"hidden_size\":8,\"intermediate_size\":16,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":"
        "4,"
        "\"rms_norm_eps\":1e-6,\"rope_theta\":10000,\"vocab_size\":16,\"block_size\":3,"
        "\"mask_token_id\":15,\"target_layer_ids\":[0,1,2],\"markov_rank\":0}";
    assert_int_equal(em_hf_config_parse(&c, no_conf, strlen(no_conf), "tiny", &err), EM_OK);
    assert_int_equal(em_safetensors_open(&st, path, &err), EM_OK);
    assert_int_equal(em_hf_draft_check_tensors(&c.draft, st, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "no Markov head"));
    em_safetensors_close(st);

    /* fc.weight width not a multiple of the taps */
    int64_t bad_fc[1][2] = { { 8, 20 } };
    const char *fc_only[] = { "fc.weight" };
    write_zero_st(path, fc_only, (const int64_t(*)[2])bad_fc, 1);
    assert_int_equal(em_safetensors_open(&st, path, &err), EM_OK);
    assert_int_equal(em_hf_draft_check_tensors(&c.draft, st, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "fc.weight"));
    em_safetensors_close(st);
}

/* ---- transformers 5.17's own save (tests/fixtures/kimi_tf5) ------------------------------
 * Its KimiLinearConfig has no moe_router_activation_func, mla_use_nope, use_grouped_topk,
 * first_k_dense_replace, moe_layer_freq, rope_theta or linear_attn_config: each absent field
 * takes the value transformers' modeling code runs with; a stated value still wins. */

/* The fixture's config.json, edited: set (a JSON value, or NULL to delete) up to 3 fields. */
static int parse_tf5(em_hf_config *c, em_err *err, const char *k1, json_t *v1, const char *k2,
                     json_t *v2, const char *k3, json_t *v3) {
    json_error_t je;
    json_t *root = json_load_file(em_test_src("tests/fixtures/kimi_tf5/config.json"), 0, &je);
    if (!root) fail_msg("kimi_tf5/config.json: %s", je.text);
    const char *keys[3] = { k1, k2, k3 };
    json_t *vals[3] = { v1, v2, v3 };
    for (int i = 0; i < 3; i++) {
        if (!keys[i]) continue;
        if (vals[i]) json_object_set_new(root, keys[i], vals[i]);
        else json_object_del(root, keys[i]);
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    assert_non_null(text);
    int rc = em_hf_config_parse(c, text, strlen(text), "tf5.json", err);
    free(text);
    return rc;
}

#define TF5_OK(c, ...)                                                   \
    do {                                                                 \
        em_err e_ = { 0 };                                               \
        if (parse_tf5(c, &e_, __VA_ARGS__)) fail_msg("tf5: %s", e_.msg); \
    } while (0)

/* The fixture as saved: the fields it leaves out are defaulted as transformers runs. */
static void test_tf5_saved(void **state) {
    (void)state;
    size_t n;
    char *text = em_test_read(em_test_src("tests/fixtures/kimi_tf5/config.json"), &n);
    static const char *const absent[] = { "moe_router_activation_func", "mla_use_nope",
                                          "use_grouped_topk", "first_k_dense_replace",
                                          "moe_layer_freq", "rope_theta", "rope_parameters",
                                          "rope_scaling", "linear_attn_config" };
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        if (strstr(text, absent[i])) fail_msg("kimi_tf5/config.json states %s", absent[i]);
    free(text);
    em_hf_config c;
    TF5_OK(&c, NULL, NULL, NULL, NULL, NULL, NULL);
    const em_hf_kimi *k = &c.kimi;
    assert_string_equal(k->moe_router_activation_func, "sigmoid");
    assert_true(k->mla_use_nope);
    assert_true(k->use_grouped_topk);
    assert_int_equal(k->first_k_dense_replace, 1); /* from mlp_layer_types */
    assert_int_equal(k->moe_layer_freq, 1);
    assert_true(k->rope.theta == 0); /* NoPE: no RoPE base needed */
    assert_int_equal(k->kda_num_heads, 4);
    assert_int_equal(k->kda_head_dim, 32);
    assert_int_equal(k->kda_short_conv_kernel_size, 4);
    static const uint8_t attn[4] = { EM_HF_ATTN_KDA, EM_HF_ATTN_MLA, EM_HF_ATTN_KDA, EM_HF_ATTN_MLA };
    static const uint8_t mlp[4] = { EM_HF_MLP_DENSE, EM_HF_MLP_MOE, EM_HF_MLP_MOE, EM_HF_MLP_MOE };
    assert_memory_equal(k->attn, attn, 4);
    assert_memory_equal(k->mlp, mlp, 4);
    assert_int_equal(k->num_experts, 8);
    assert_int_equal(k->num_experts_per_token, 2);
    assert_int_equal(k->num_shared_experts, 1);
    assert_true(k->moe_renormalize);
    assert_int_equal(k->num_expert_group, 1);
}

/* Router function: absent -> sigmoid; stated values are kept (and checked). */
static void test_tf5_router(void **state) {
    (void)state;
    em_hf_config c;
    TF5_OK(&c, "moe_router_activation_func", json_string("softmax"), NULL, NULL, NULL, NULL);
    assert_string_equal(c.kimi.moe_router_activation_func, "softmax");
    TF5_OK(&c, "moe_router_activation_func", json_string("sigmoid"), NULL, NULL, NULL, NULL);
    assert_string_equal(c.kimi.moe_router_activation_func, "sigmoid");
    em_err err = { 0 };
    assert_int_equal(parse_tf5(&c, &err, "moe_router_activation_func", json_string("relu"), NULL,
                               NULL, NULL, NULL),
                     EM_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "'moe_router_activation_func'"));
    /* no experts at all: dense everywhere, no router to default */
    TF5_OK(&c, "num_experts", NULL, "mlp_layer_types",
           json_pack("[s,s,s,s]", "dense", "dense", "dense", "dense"), NULL, NULL);
    assert_int_equal(c.kimi.num_experts, 0);
    assert_string_equal(c.kimi.moe_router_activation_func, "");
}

/* mla_use_nope: absent -> true in the transformers-5 dialect; stated false means RoPE, which
 * then needs its base; in the Moonshot dialect (linear_attn_config) it must be stated. */
static void test_tf5_nope(void **state) {
    (void)state;
    em_hf_config c;
    TF5_OK(&c, "mla_use_nope", json_true(), NULL, NULL, NULL, NULL);
    assert_true(c.kimi.mla_use_nope);
    em_err err = { 0 };
    assert_int_equal(parse_tf5(&c, &err, "mla_use_nope", json_false(), NULL, NULL, NULL, NULL),
                     EM_EFORMAT);
    assert_non_null(strstr(err.msg, "'rope_theta': missing"));
    TF5_OK(&c, "mla_use_nope", json_false(), "rope_theta", json_real(50000.0), NULL, NULL);
    assert_false(c.kimi.mla_use_nope);
    assert_true(c.kimi.rope.theta == 50000.0);
    json_t *lac = json_pack("{s:[i,i],s:[i,i],s:i,s:i,s:i}", "kda_layers", 1, 3, "full_attn_layers",
                            2, 4, "num_heads", 4, "head_dim", 32, "short_conv_kernel_size", 4);
    assert_int_equal(parse_tf5(&c, &err, "linear_attn_config", lac, NULL, NULL, NULL, NULL),
                     EM_EFORMAT);
    assert_non_null(strstr(err.msg, "'mla_use_nope': missing"));
    lac = json_pack("{s:[i,i],s:[i,i],s:i,s:i,s:i}", "kda_layers", 1, 3, "full_attn_layers", 2, 4,
                    "num_heads", 4, "head_dim", 32, "short_conv_kernel_size", 4);
    TF5_OK(&c, "linear_attn_config", lac, "mla_use_nope", json_true(), NULL, NULL);
    assert_true(c.kimi.mla_use_nope);
}

/* use_grouped_topk: absent -> true (transformers always runs the group-limited top-k). */
static void test_tf5_grouped_topk(void **state) {
    (void)state;
    em_hf_config c;
    TF5_OK(&c, "use_grouped_topk", json_false(), NULL, NULL, NULL, NULL);
    assert_false(c.kimi.use_grouped_topk);
    TF5_OK(&c, "use_grouped_topk", json_true(), NULL, NULL, NULL, NULL);
    assert_true(c.kimi.use_grouped_topk);
}

/* first_k_dense_replace / moe_layer_freq: absent -> the dense prefix mlp_layer_types shows,
 * and 1; stated values must agree with mlp_layer_types. */
static void test_tf5_dense_prefix(void **state) {
    (void)state;
    em_hf_config c;
    TF5_OK(&c, "first_k_dense_replace", json_integer(1), "moe_layer_freq", json_integer(1), NULL,
           NULL);
    assert_int_equal(c.kimi.first_k_dense_replace, 1);
    assert_int_equal(c.kimi.moe_layer_freq, 1);
    TF5_OK(&c, "mlp_layer_types", json_pack("[s,s,s,s]", "dense", "dense", "sparse", "sparse"),
           NULL, NULL, NULL, NULL);
    assert_int_equal(c.kimi.first_k_dense_replace, 2);
    assert_int_equal(c.kimi.n_dense, 2);
    em_err err = { 0 };
    assert_int_equal(parse_tf5(&c, &err, "first_k_dense_replace", json_integer(2), NULL, NULL,
                               NULL, NULL),
                     EM_EFORMAT);
    assert_non_null(strstr(err.msg, "'mlp_layer_types': entry 1 says sparse"));
    /* neither stated: transformers and Moonshot's code disagree (1 vs 0): refused by name */
    assert_int_equal(parse_tf5(&c, &err, "mlp_layer_types", NULL, NULL, NULL, NULL, NULL),
                     EM_EFORMAT);
    assert_non_null(strstr(err.msg, "'first_k_dense_replace': missing"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kimi_linear_48b),
        cmocka_unit_test(test_kimi_linear_tf5),
        cmocka_unit_test(test_kimi_linear_small_both),
        cmocka_unit_test(test_kimi_linear_tiny),
        cmocka_unit_test(test_kimi_k3),
        cmocka_unit_test(test_draft_zlab),
        cmocka_unit_test(test_draft_deepspec),
        cmocka_unit_test(test_draft_specforge),
        cmocka_unit_test(test_draft_speculators),
        cmocka_unit_test(test_draft_deepspec_baseline),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_bad_table_complete),
        cmocka_unit_test(test_load_folder_and_text),
        cmocka_unit_test(test_draft_check_tensors),
        cmocka_unit_test(test_tf5_saved),
        cmocka_unit_test(test_tf5_router),
        cmocka_unit_test(test_tf5_nope),
        cmocka_unit_test(test_tf5_grouped_topk),
        cmocka_unit_test(test_tf5_dense_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
