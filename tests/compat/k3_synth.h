/* tests/compat/k3_synth.h: writes small random kimi-k3 GGUFs in llama.cpp's layout (keys and
 * tensor names of the reference notes llamacpp-formats.md §1, written out here independently
 * of model/), all tensors F32, with a byte-level GPT-2 style vocabulary so that llama.cpp's
 * loader accepts the file. Shared by tests/compat/synth_k3.c (the CLI the llama.cpp comparison
 * uses) and tests/test_k3.c; header-only (static functions), test code.
 *
 * Every K3 feature can be switched on: q-LoRA MLA with the sigmoid output gate, KDA with the
 * full-rank output gate and the lower-bound decay gate, SiTU, latent MoE with or without the
 * routed norm, shared experts, AttnRes, dense leading layer 0. Layer il is MLA when
 * il % 4 == 3 or it is the last layer (as K3: 0-indexed 3, 7, ..., 91 and 92), else KDA.
 * Values are uniform pseudo-random (xorshift64*, seeded by the tensor name and the seed),
 * scaled like trained weights (projections ~ 1/sqrt(fan_in), norms ~ 1, A_log in (0, 2)).
 * Routed experts may instead be stored quantized (IQ types, MXFP4, ...): random bytes in every
 * block, with the block scales set so the dequantized values have the RMS of the F32 fill
 * (no quantizer needed: every byte pattern of those formats is a valid block once the scale
 * is a finite fp16 / sane e8m0). */
#ifndef EM_TESTS_K3_SYNTH_H
#define EM_TESTS_K3_SYNTH_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "format/gguf.h"
#include "quant/quant.h"

typedef struct k3_synth_opts {
    int n_embd, n_layer, n_head, kda_head_dim, d_conv;
    int q_lora, kv_lora, nope, rope, v_head;
    int n_ff, n_expert, n_used, n_ff_exp, n_shared, n_latent, n_vocab;
    int res_block;         /* attn_res.block_size (0: written as 0, no score tensors) */
    bool routed_norm, mla_gate;
    float gate_lb;         /* 0: key absent (kimi-linear's softplus gate) */
    float situ_beta, situ_lin_beta;
    float expert_scale;
    bool expert_norm;
    uint64_t seed;
    /* routed-expert storage: MoE layer il (1-based) uses exp_types[(il - 1) % n_exp_sets] as
     * {gate, up, down}; n_exp_sets 0: all F32. Quantized experts are random valid blocks
     * (k3_quant_blocks), row lengths must be multiples of the type's block. */
    int exp_types[4][3];
    int n_exp_sets;
    /* bad-input variants */
    const char *skip_key;       /* leave this key out */
    const char *reshape_tensor; /* write this 1-D tensor with reshape_len values instead */
    int64_t reshape_len;
} k3_synth_opts;

/* The default small model: 8 layers (MLA at 3 and 7), AttnRes blocks of 3 (banks at 0, 3, 6),
 * every feature on. */
static inline k3_synth_opts k3_synth_defaults(void) {
    return (k3_synth_opts){
        .n_embd = 64, .n_layer = 8, .n_head = 4, .kda_head_dim = 16, .d_conv = 4,
        .q_lora = 32, .kv_lora = 32, .nope = 16, .rope = 8, .v_head = 16,
        .n_ff = 96, .n_expert = 8, .n_used = 3, .n_ff_exp = 32, .n_shared = 1, .n_latent = 32, .n_vocab = 320,
        .res_block = 3, .routed_norm = true, .mla_gate = true, .gate_lb = -5.0f,
        .situ_beta = 4.0f, .situ_lin_beta = 25.0f, .expert_scale = 2.5f, .expert_norm = true, .seed = 1,
    };
}

static inline bool k3_synth_is_mla(const k3_synth_opts *o, int il) {
    return il % 4 == 3 || il == o->n_layer - 1;
}

/* ---- vocabulary: 256 GPT-2 byte tokens, one merge ("h e"), then control tokens ---------- */

static inline bool k3_byte_direct(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

/* GPT-2's spelling of byte b as UTF-8 into buf (at least 3 bytes). */
static inline void k3_byte_token(int b, char *buf) {
    uint32_t cp = (uint32_t)b;
    if (!k3_byte_direct(b)) {
        cp = 256;
        for (int c = 0; c < b; c++) cp += !k3_byte_direct(c);
    }
    if (cp < 0x80) {
        buf[0] = (char)cp, buf[1] = 0;
    } else {
        buf[0] = (char)(0xC0 | (cp >> 6)), buf[1] = (char)(0x80 | (cp & 0x3F)), buf[2] = 0;
    }
}

static inline int k3_write_vocab(em_gguf_writer *w, int V, em_err *err) {
    if (V < 258) return em_err_set(err, EM_EINVAL, "k3_synth: vocabulary of %d tokens (at least 258)", V);
    char (*store)[16] = calloc((size_t)V, 16);
    const char **tok = calloc((size_t)V, sizeof *tok);
    int32_t *type = calloc((size_t)V, sizeof *type);
    int rc = store && tok && type ? 0 : em_err_set(err, EM_ENOMEM, "k3_synth: vocabulary");
    for (int i = 0; !rc && i < V; i++) {
        if (i < 256) k3_byte_token(i, store[i]), type[i] = 1;
        else if (i == 256) snprintf(store[i], 16, "he"), type[i] = 1;
        else snprintf(store[i], 16, "<|c%d|>", i), type[i] = 3; /* CONTROL */
        tok[i] = store[i];
    }
    const char *merges[1] = { "h e" };
    const uint32_t eos = (uint32_t)V - 1;
    if (!rc) rc = em_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", err);
    if (!rc) rc = em_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2", err);
    if (!rc) rc = em_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tok, (uint64_t)V, err);
    if (!rc) rc = em_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", EM_GGUF_I32, type, (uint64_t)V, err);
    if (!rc) rc = em_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1, err);
    if (!rc) rc = em_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", eos, err);
    if (!rc) rc = em_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", eos, err);
    if (!rc) rc = em_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false, err);
    free(store);
    free(tok);
    free(type);
    return rc;
}

/* ---- metadata ------------------------------------------------------------------------------ */

#define K3_KEY(suffix) "kimi-k3." suffix

static inline bool k3_keep(const k3_synth_opts *o, const char *key) { return !o->skip_key || strcmp(o->skip_key, key); }

static inline int k3_u32(em_gguf_writer *w, const k3_synth_opts *o, const char *key, uint32_t v, em_err *err) {
    return k3_keep(o, key) ? em_gguf_writer_set_u32(w, key, v, err) : 0;
}
static inline int k3_f32(em_gguf_writer *w, const k3_synth_opts *o, const char *key, float v, em_err *err) {
    return k3_keep(o, key) ? em_gguf_writer_set_f32(w, key, v, err) : 0;
}

static inline int k3_write_keys(em_gguf_writer *w, const k3_synth_opts *o, em_err *err) {
    int32_t kv[512];
    if (o->n_layer > 512) return em_err_set(err, EM_EINVAL, "k3_synth: too many layers");
    for (int il = 0; il < o->n_layer; il++) kv[il] = k3_synth_is_mla(o, il) ? 1 : 0;
    int rc = em_gguf_writer_set_str(w, "general.architecture", "kimi-k3", err);
    if (!rc) rc = em_gguf_writer_set_str(w, "general.name", "ember synthetic kimi-k3 (random weights)", err);
    if (!rc) rc = em_gguf_writer_set_u32(w, "general.file_type", 0, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("context_length"), 4096, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("embedding_length"), (uint32_t)o->n_embd, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("block_count"), (uint32_t)o->n_layer, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("feed_forward_length"), (uint32_t)o->n_ff, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("attention.head_count"), (uint32_t)o->n_head, err);
    if (!rc && k3_keep(o, K3_KEY("attention.head_count_kv")))
        rc = em_gguf_writer_set_arr(w, K3_KEY("attention.head_count_kv"), EM_GGUF_I32, kv, (uint64_t)o->n_layer, err);
    if (!rc) rc = k3_f32(w, o, K3_KEY("attention.layer_norm_rms_epsilon"), 1e-5f, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("attention.key_length_mla"), (uint32_t)(o->nope + o->rope), err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("attention.value_length_mla"), (uint32_t)o->v_head, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("attention.key_length"), (uint32_t)(o->kv_lora + o->rope), err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("attention.value_length"), (uint32_t)o->kv_lora, err);
    if (!rc && o->q_lora > 0) rc = k3_u32(w, o, K3_KEY("attention.q_lora_rank"), (uint32_t)o->q_lora, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("attention.kv_lora_rank"), (uint32_t)o->kv_lora, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("rope.dimension_count"), (uint32_t)o->rope, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("ssm.conv_kernel"), (uint32_t)o->d_conv, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("kda.head_dim"), (uint32_t)o->kda_head_dim, err);
    if (!rc && o->gate_lb != 0.0f) rc = k3_f32(w, o, K3_KEY("kda.gate_lower_bound"), o->gate_lb, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("expert_count"), (uint32_t)o->n_expert, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("expert_used_count"), (uint32_t)o->n_used, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("expert_feed_forward_length"), (uint32_t)o->n_ff_exp, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("expert_shared_count"), (uint32_t)o->n_shared, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("leading_dense_block_count"), 1, err);
    if (!rc) rc = k3_f32(w, o, K3_KEY("expert_weights_scale"), o->expert_scale, err);
    if (!rc && k3_keep(o, K3_KEY("expert_weights_norm")))
        rc = em_gguf_writer_set_bool(w, K3_KEY("expert_weights_norm"), o->expert_norm, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("expert_gating_func"), 2, err);
    if (!rc && o->n_latent > 0) rc = k3_u32(w, o, K3_KEY("expert_latent_length"), (uint32_t)o->n_latent, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("attn_res.block_size"), (uint32_t)o->res_block, err);
    if (!rc) rc = k3_f32(w, o, K3_KEY("activation.situ_beta"), o->situ_beta, err);
    if (!rc) rc = k3_f32(w, o, K3_KEY("activation.situ_linear_beta"), o->situ_lin_beta, err);
    if (!rc) rc = k3_u32(w, o, K3_KEY("vocab_size"), (uint32_t)o->n_vocab, err);
    if (!rc) rc = k3_write_vocab(w, o->n_vocab, err);
    return rc;
}

/* ---- tensors ------------------------------------------------------------------------------- */

enum { K3_W, K3_NORM, K3_ALOG, K3_BIAS, K3_EMBD, K3_SCORE };

typedef struct k3_tensor {
    char name[64];
    int n_dims, kind;
    int64_t ne[4];
    float scale; /* K3_W: the fan-in scale */
} k3_tensor;

typedef struct k3_list {
    k3_tensor *t;
    int n, cap;
} k3_list;

static inline int k3_add(k3_list *l, int kind, int n_dims, int64_t a, int64_t b, int64_t c, const char *fmt, int il) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 128;
        k3_tensor *t = realloc(l->t, (size_t)l->cap * sizeof *t);
        if (!t) return EM_ENOMEM;
        l->t = t;
    }
    k3_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, il);
    t->kind = kind;
    t->n_dims = n_dims;
    t->ne[0] = a, t->ne[1] = b, t->ne[2] = c, t->ne[3] = 1;
    if (n_dims < 3) t->ne[2] = 1;
    if (n_dims < 2) t->ne[1] = 1;
    t->scale = kind == K3_W ? 1.7f / sqrtf((float)a) : 1.0f;
    return EM_OK;
}

static inline int k3_list_tensors(const k3_synth_opts *o, k3_list *l) {
    const int64_t NE = o->n_embd, H = o->n_head, hd = o->kda_head_dim, D = H * hd, V = o->n_vocab;
    const int64_t qk = o->nope + o->rope, Lx = o->n_latent > 0 ? o->n_latent : NE, Fe = o->n_ff_exp;
    int rc = 0;
#define ADD(kind, nd, a, b, c, name) (rc = rc ? rc : k3_add(l, kind, nd, a, b, c, name, il))
    int il = 0;
    ADD(K3_EMBD, 2, NE, V, 0, "token_embd.weight");
    ADD(K3_NORM, 1, NE, 0, 0, "output_norm.weight");
    ADD(K3_W, 2, NE, V, 0, "output.weight");
    if (o->res_block > 0) ADD(K3_SCORE, 1, NE, 0, 0, "output_res_score.weight");
    for (il = 0; il < o->n_layer; il++) {
        ADD(K3_NORM, 1, NE, 0, 0, "blk.%d.attn_norm.weight");
        ADD(K3_NORM, 1, NE, 0, 0, "blk.%d.ffn_norm.weight");
        if (o->res_block > 0) {
            ADD(K3_SCORE, 1, NE, 0, 0, "blk.%d.attn_res_score.weight");
            ADD(K3_SCORE, 1, NE, 0, 0, "blk.%d.ffn_res_score.weight");
        }
        if (!k3_synth_is_mla(o, il)) {
            ADD(K3_W, 3, o->d_conv, 1, D, "blk.%d.ssm_conv1d_q.weight");
            ADD(K3_W, 3, o->d_conv, 1, D, "blk.%d.ssm_conv1d_k.weight");
            ADD(K3_W, 3, o->d_conv, 1, D, "blk.%d.ssm_conv1d_v.weight");
            ADD(K3_W, 2, NE, D, 0, "blk.%d.attn_q.weight");
            ADD(K3_W, 2, NE, D, 0, "blk.%d.attn_k.weight");
            ADD(K3_W, 2, NE, D, 0, "blk.%d.attn_v.weight");
            ADD(K3_W, 2, NE, hd, 0, "blk.%d.ssm_f_a.weight");
            ADD(K3_W, 2, hd, D, 0, "blk.%d.ssm_f_b.weight");
            ADD(K3_W, 2, NE, H, 0, "blk.%d.ssm_beta.weight");
            ADD(K3_ALOG, 1, H, 0, 0, "blk.%d.ssm_a");
            ADD(K3_BIAS, 1, D, 0, 0, "blk.%d.ssm_dt.bias");
            ADD(K3_W, 2, NE, D, 0, "blk.%d.ssm_g.weight");
            ADD(K3_NORM, 1, hd, 0, 0, "blk.%d.ssm_norm.weight");
            ADD(K3_W, 2, D, NE, 0, "blk.%d.attn_output.weight");
        } else {
            if (o->q_lora > 0) {
                ADD(K3_W, 2, NE, o->q_lora, 0, "blk.%d.attn_q_a.weight");
                ADD(K3_NORM, 1, o->q_lora, 0, 0, "blk.%d.attn_q_a_norm.weight");
                ADD(K3_W, 2, o->q_lora, H * qk, 0, "blk.%d.attn_q_b.weight");
            } else {
                ADD(K3_W, 2, NE, H * qk, 0, "blk.%d.attn_q.weight");
            }
            ADD(K3_W, 2, NE, o->kv_lora + o->rope, 0, "blk.%d.attn_kv_a_mqa.weight");
            ADD(K3_NORM, 1, o->kv_lora, 0, 0, "blk.%d.attn_kv_a_norm.weight");
            ADD(K3_W, 3, o->nope, o->kv_lora, H, "blk.%d.attn_k_b.weight");
            ADD(K3_W, 3, o->kv_lora, o->v_head, H, "blk.%d.attn_v_b.weight");
            if (o->mla_gate) ADD(K3_W, 2, NE, H * o->v_head, 0, "blk.%d.attn_gate.weight");
            ADD(K3_W, 2, H * o->v_head, NE, 0, "blk.%d.attn_output.weight");
        }
        if (il == 0) {
            ADD(K3_W, 2, NE, o->n_ff, 0, "blk.%d.ffn_gate.weight");
            ADD(K3_W, 2, NE, o->n_ff, 0, "blk.%d.ffn_up.weight");
            ADD(K3_W, 2, o->n_ff, NE, 0, "blk.%d.ffn_down.weight");
            continue;
        }
        ADD(K3_W, 2, NE, o->n_expert, 0, "blk.%d.ffn_gate_inp.weight");
        ADD(K3_BIAS, 1, o->n_expert, 0, 0, "blk.%d.exp_probs_b.bias");
        ADD(K3_W, 3, Lx, Fe, o->n_expert, "blk.%d.ffn_gate_exps.weight");
        ADD(K3_W, 3, Lx, Fe, o->n_expert, "blk.%d.ffn_up_exps.weight");
        ADD(K3_W, 3, Fe, Lx, o->n_expert, "blk.%d.ffn_down_exps.weight");
        if (o->n_latent > 0) {
            ADD(K3_W, 2, NE, Lx, 0, "blk.%d.ffn_routed_down.weight");
            ADD(K3_W, 2, Lx, NE, 0, "blk.%d.ffn_routed_up.weight");
            if (o->routed_norm) ADD(K3_NORM, 1, Lx, 0, 0, "blk.%d.ffn_routed_norm.weight");
        }
        if (o->n_shared > 0) {
            ADD(K3_W, 2, NE, Fe * o->n_shared, 0, "blk.%d.ffn_gate_shexp.weight");
            ADD(K3_W, 2, NE, Fe * o->n_shared, 0, "blk.%d.ffn_up_shexp.weight");
            ADD(K3_W, 2, Fe * o->n_shared, NE, 0, "blk.%d.ffn_down_shexp.weight");
        }
    }
#undef ADD
    return rc;
}

static inline float k3_rand(uint64_t *s) { /* uniform in [-1, 1) */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((double)((*s * 2685821657736338717ull) >> 40) / 8388608.0 - 1.0);
}

static inline void k3_fill(const k3_tensor *t, uint64_t seed, float *v, int64_t n) {
    uint64_t s = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
    for (const unsigned char *p = (const unsigned char *)t->name; *p; p++) s = (s ^ *p) * 1099511628211ull;
    s |= 1;
    for (int64_t i = 0; i < n; i++) {
        float u = k3_rand(&s);
        switch (t->kind) {
        case K3_W: v[i] = u * t->scale; break;
        case K3_NORM: v[i] = 1.0f + 0.2f * u; break;
        case K3_ALOG: v[i] = -expf(1.0f + u); break; /* ssm_a = -exp(A_log), A_log in (0, 2) */
        case K3_BIAS: v[i] = 0.3f * u; break;
        case K3_EMBD: v[i] = u; break;
        case K3_SCORE: v[i] = 0.3f * u; break;
        }
    }
}

/* The storage type of tensor t under o (F32 unless it is a routed expert of a quantized set). */
static inline int k3_synth_type(const k3_synth_opts *o, const k3_tensor *t) {
    int il = -1, part = -1;
    if (o->n_exp_sets <= 0 || sscanf(t->name, "blk.%d.", &il) != 1 || il < 1) return EM_TYPE_F32;
    if (strstr(t->name, ".ffn_gate_exps.")) part = 0;
    else if (strstr(t->name, ".ffn_up_exps.")) part = 1;
    else if (strstr(t->name, ".ffn_down_exps.")) part = 2;
    return part < 0 ? EM_TYPE_F32 : o->exp_types[(il - 1) % o->n_exp_sets][part];
}

/* Sets every block's scale of a type-`type` buffer of nb blocks to the value s (fp16 d, IQ1_M's
 * nibble-spread fp16, MXFP4's e8m0 exponent rounded to a power of two). EM_EUNSUPPORTED for a
 * type whose scale layout is not known here. */
static inline int k3_set_scales(int type, uint8_t *q, int64_t nb, int bb, float s) {
    uint16_t h = em_fp32_to_fp16(s);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = q + b * bb;
        switch (type) {
        case EM_TYPE_IQ2_XXS: case EM_TYPE_IQ2_XS: case EM_TYPE_IQ2_S: case EM_TYPE_IQ3_XXS:
        case EM_TYPE_IQ3_S: case EM_TYPE_IQ1_S: case EM_TYPE_IQ4_NL: case EM_TYPE_IQ4_XS:
        case EM_TYPE_Q8_0: case EM_TYPE_Q4_0:
            memcpy(p, &h, 2);
            break;
        case EM_TYPE_IQ1_M: { /* scales[8] at byte 48: the top nibble of each u16 word */
            uint16_t sc[4];
            memcpy(sc, p + 48, 8);
            sc[0] = (uint16_t)((sc[0] & 0x0fff) | ((h & 0x000f) << 12));
            sc[1] = (uint16_t)((sc[1] & 0x0fff) | ((h & 0x00f0) << 8));
            sc[2] = (uint16_t)((sc[2] & 0x0fff) | ((h & 0x0f00) << 4));
            sc[3] = (uint16_t)((sc[3] & 0x0fff) | (h & 0xf000));
            memcpy(p + 48, sc, 8);
            break;
        }
        case EM_TYPE_MXFP4: { /* e8m0: the value 2^(e - 127) scales the block */
            int e = 127 + (int)lrintf(log2f(s));
            p[0] = (uint8_t)(e < 1 ? 1 : e > 254 ? 254 : e);
            break;
        }
        default: return EM_EUNSUPPORTED;
        }
    }
    return EM_OK;
}

#define K3_RMS_ROWS 64

/* Random valid blocks of `type` for tensor t (n values) whose dequantized RMS is that of the
 * F32 fill (uniform in +-scale: scale / sqrt 3). Works through Ember's own dequantization only
 * to measure the RMS at scale 1 (dequantization is linear in the block scale). */
static inline int k3_quant_blocks(const k3_tensor *t, int type, uint64_t seed, uint8_t *q, float *tmp,
                                  int64_t n, uint64_t bytes, em_err *err) {
    const em_type_info *ti = em_type_get(type);
    if (!ti || !ti->to_float) return em_err_set(err, EM_EUNSUPPORTED, "k3_synth: type %d for %s", type, t->name);
    uint64_t s = 0x243F6A8885A308D3ull ^ (seed * 0x9E3779B97F4A7C15ull);
    for (const unsigned char *p = (const unsigned char *)t->name; *p; p++) s = (s ^ *p) * 1099511628211ull;
    s |= 1;
    for (uint64_t i = 0; i < bytes; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        q[i] = (uint8_t)((s * 2685821657736338717ull) >> 56);
    }
    const int64_t nb = n / ti->block_elems, m = n < K3_RMS_ROWS * t->ne[0] ? n : K3_RMS_ROWS * t->ne[0];
    int rc = k3_set_scales(type, q, nb, ti->block_bytes, 1.0f);
    if (!rc) rc = em_dequantize(type, q, tmp, m, err); /* the first rows give the RMS */
    if (rc) return rc == EM_EUNSUPPORTED ? em_err_set(err, rc, "k3_synth: no scale layout for %s", ti->name) : rc;
    double ss = 0;
    for (int64_t i = 0; i < m; i++) ss += (double)tmp[i] * tmp[i];
    const double rms = sqrt(ss / (double)m), want = t->scale / sqrt(3.0);
    return k3_set_scales(type, q, nb, ti->block_bytes, rms > 0 ? (float)(want / rms) : 1.0f);
}

/* Writes the model to path. */
static inline int k3_synth_write(const char *path, const k3_synth_opts *o, em_err *err) {
    k3_list l = { 0 };
    em_gguf_writer *w = NULL;
    float *buf = NULL;
    int rc = k3_list_tensors(o, &l);
    if (rc) return em_err_set(err, rc, "k3_synth: out of memory");
    rc = em_gguf_writer_create(&w, path, NULL, err);
    if (!rc) rc = k3_write_keys(w, o, err);
    int64_t most = 0;
    uint64_t most_q = 0;
    for (int i = 0; i < l.n; i++) {
        k3_tensor *t = &l.t[i];
        if (o->reshape_tensor && !strcmp(t->name, o->reshape_tensor)) {
            t->n_dims = 1;
            t->ne[0] = o->reshape_len, t->ne[1] = t->ne[2] = t->ne[3] = 1;
        }
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        uint64_t qb = 0;
        if (k3_synth_type(o, t) == EM_TYPE_F32) {
            if (n > most) most = n;
        } else {
            if (K3_RMS_ROWS * t->ne[0] > most) most = K3_RMS_ROWS * t->ne[0];
            if (!rc) rc = em_type_row_bytes(k3_synth_type(o, t), (uint64_t)n, &qb, err);
            if (qb > most_q) most_q = qb;
        }
        if (!rc) rc = em_gguf_writer_add_tensor(w, t->name, k3_synth_type(o, t), t->n_dims, t->ne, err);
    }
    buf = malloc((size_t)most * sizeof(float));
    uint8_t *qbuf = malloc((size_t)most_q + 1);
    if (!rc && (!buf || !qbuf)) rc = em_err_set(err, EM_ENOMEM, "k3_synth: out of memory");
    for (int i = 0; !rc && i < l.n; i++) {
        const k3_tensor *t = &l.t[i];
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        const int type = k3_synth_type(o, t);
        uint64_t qb = 0;
        if (type == EM_TYPE_F32) {
            k3_fill(t, o->seed, buf, n);
            rc = em_gguf_writer_write_tensor(w, t->name, buf, (uint64_t)n * sizeof(float), err);
        } else if (!(rc = em_type_row_bytes(type, (uint64_t)n, &qb, err)) &&
                   !(rc = k3_quant_blocks(t, type, o->seed, qbuf, buf, n, qb, err))) {
            rc = em_gguf_writer_write_tensor(w, t->name, qbuf, qb, err);
        }
    }
    free(qbuf);
    if (!rc) rc = em_gguf_writer_finish(w, err);
    em_gguf_writer_free(w);
    free(buf);
    free(l.t);
    return rc;
}

#endif
