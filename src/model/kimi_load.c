/* Loading a kimi-linear or kimi-k3 GGUF (llama.cpp's layout): hyperparameters from the
 * `ARCH.*` keys (ARCH = general.architecture) and every tensor of every layer, each checked
 * for presence, shape and type before use (through the shared loader, model/weights.h), so a
 * bad file ends here with a message naming the file and the key or tensor, never later in
 * the forward pass. Matrices stay in the mapping (em_mat views); vectors are dequantized to
 * f32 into w->store; each passes the caller's hook once. Layer kinds come from
 * attention.head_count_kv (0 = KDA, else MLA), dense vs MoE from leading_dense_block_count,
 * as llama.cpp reads them. kimi-k3 adds (each checked the same way) q-LoRA MLA with an output
 * gate, the full-rank KDA output gate and the bounded decay gate, SiTU, latent MoE and the
 * AttnRes score vectors (kimi_impl.h).
 *
 * Must not: read past a tensor's bytes (the GGUF reader bounds them, shapes are checked
 * against the sizes derived here) or keep pointers into the file past em_gguf_close. */
#include "model/kimi_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM EM_WLOAD_MAX_DIM
#define MAX_VOCAB EM_WLOAD_MAX_VOCAB
#define MAX_LAYERS EM_WLOAD_MAX_LAYERS
#define MAX_EXPERTS 65536
#define NAME EM_WLOAD_NAME

typedef struct loader {
    em_wload wl; /* the file, its path and key prefix (kimi-linear or kimi-k3), w->store */
    kimi_hparams *hp;
    kimi_weights *w;
} loader;

/* ---- metadata ------------------------------------------------------------------------- */

/* The `ARCH.suffix` keys, through the shared loader (model/weights.h). */
static int key_int(loader *L, const char *suffix, bool required, int64_t def, int64_t lo,
                   int64_t hi, int *out, em_err *err) {
    return em_wload_int(&L->wl, em_wload_akey(&L->wl, suffix), required, def, lo, hi, out, err);
}

static int key_float(loader *L, const char *suffix, bool required, double def, float *out,
                     em_err *err) {
    return em_wload_f32(&L->wl, em_wload_akey(&L->wl, suffix), required, def, out, err);
}

static int key_bool(loader *L, const char *suffix, bool def, bool *out, em_err *err) {
    return em_wload_bool(&L->wl, em_wload_akey(&L->wl, suffix), def, out, err);
}

/* expert_feed_forward_length: one integer, or one per layer (llama.cpp's get_key_or_arr); the
 * per-layer form must give every MoE layer the same width. */
static int read_ff_exp(loader *L, em_err *err) {
    kimi_hparams *hp = L->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_feed_forward_length", L->wl.arch);
    int64_t i = em_gguf_find_key(L->wl.g, key);
    if (i < 0 || em_gguf_value_at(L->wl.g, i).type != EM_GGUF_ARRAY)
        return key_int(L, "expert_feed_forward_length", true, 0, 1, MAX_DIM, &hp->n_ff_exp, err);
    em_gguf_value v = em_gguf_value_at(L->wl.g, i);
    if (em_gguf_arr_count(v.arr) != (uint64_t)hp->n_layer)
        return em_err_set(err, EM_EFORMAT, "%s: key %s has %llu entries, want %d (block_count)", L->wl.path, key,
                          (unsigned long long)em_gguf_arr_count(v.arr), hp->n_layer);
    for (int l = hp->n_lead_dense; l < hp->n_layer; l++) {
        int64_t f;
        int rc = em_gguf_arr_get_int(v.arr, (uint64_t)l, &f, err);
        if (rc) return em_err_prefix(err, "%s: key %s", L->wl.path, key);
        if (f < 1 || f > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: key %s[%d] = %lld is out of range [1, %d]", L->wl.path, key, l,
                              (long long)f, MAX_DIM);
        if (l > hp->n_lead_dense && f != hp->n_ff_exp)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: key %s: MoE layers of different expert widths (%d, %lld)",
                              L->wl.path, key, hp->n_ff_exp, (long long)f);
        hp->n_ff_exp = (int)f;
    }
    return EM_OK;
}

/* kimi-k3's own keys: the AttnRes block (required), SiTU's betas (required), the latent
 * expert width and the KDA gate's lower bound (optional, as llama.cpp reads them). */
static int read_k3_hparams(loader *L, em_err *err) {
    kimi_hparams *hp = L->hp;
    int rc;
    float lb = 0.0f;
    if ((rc = key_int(L, "attn_res.block_size", true, 0, 0, MAX_LAYERS, &hp->res_block, err)) ||
        (rc = key_float(L, "activation.situ_beta", true, 0, &hp->situ_beta, err)) ||
        (rc = key_float(L, "activation.situ_linear_beta", true, 0, &hp->situ_lin_beta, err)) ||
        (rc = key_int(L, "expert_latent_length", false, 0, 0, MAX_DIM, &hp->n_latent, err)) ||
        (rc = key_float(L, "kda.gate_lower_bound", false, -INFINITY, &lb, err)))
        return rc;
    if (!(hp->situ_beta > 0.0f))
        return em_err_set(err, EM_EFORMAT, "%s: key %s.activation.situ_beta = %g must be positive", L->wl.path, L->wl.arch,
                          hp->situ_beta);
    hp->situ = true;
    if (lb > -INFINITY) {
        if (!(lb < 0.0f))
            return em_err_set(err, EM_EFORMAT, "%s: key %s.kda.gate_lower_bound = %g must be negative", L->wl.path,
                              L->wl.arch, lb);
        hp->gate_bounded = true;
        hp->gate_lb = lb;
    }
    return EM_OK;
}

/* attention.head_count_kv: one integer per layer (or one for all); 0 marks a KDA layer. */
static int read_layer_kinds(loader *L, em_err *err) {
    kimi_hparams *hp = L->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", L->wl.arch);
    hp->kind = em_calloc((size_t)hp->n_layer, sizeof *hp->kind, "layer kinds", err);
    if (!hp->kind) return EM_ENOMEM;
    int64_t i = em_gguf_find_key(L->wl.g, key);
    if (i < 0) return em_err_set(err, EM_ENOTFOUND, "%s: key %s is missing (it tells KDA from MLA layers)", L->wl.path, key);
    em_gguf_value v = em_gguf_value_at(L->wl.g, i);
    for (int l = 0; l < hp->n_layer; l++) {
        int64_t kv;
        if (v.type == EM_GGUF_ARRAY) {
            if (em_gguf_arr_count(v.arr) != (uint64_t)hp->n_layer)
                return em_err_set(err, EM_EFORMAT, "%s: key %s has %llu entries, want %d (block_count)", L->wl.path,
                                  key, (unsigned long long)em_gguf_arr_count(v.arr), hp->n_layer);
            int rc = em_gguf_arr_get_int(v.arr, (uint64_t)l, &kv, err);
            if (rc) return em_err_prefix(err, "%s", L->wl.path);
        } else {
            int rc = em_gguf_get_int(L->wl.g, key, &kv, err);
            if (rc) return rc;
        }
        if (kv < 0) return em_err_set(err, EM_EFORMAT, "%s: key %s[%d] = %lld is negative", L->wl.path, key, l, (long long)kv);
        hp->kind[l] = kv == 0 ? KIMI_KDA : KIMI_MLA;
        if (hp->kind[l] == KIMI_KDA) hp->n_kda++;
        else hp->n_mla++;
    }
    return EM_OK;
}

static int read_hparams(loader *L, em_err *err) {
    kimi_hparams *hp = L->hp;
    int rc, ctx = 0, key_mla = 0;
    if ((rc = key_int(L, "block_count", true, 0, 1, MAX_LAYERS, &hp->n_layer, err)) ||
        (rc = key_int(L, "embedding_length", true, 0, 1, MAX_DIM, &hp->n_embd, err)) ||
        (rc = key_int(L, "vocab_size", false, 0, 0, MAX_VOCAB, &hp->n_vocab, err)) ||
        (rc = key_int(L, "context_length", false, 0, 0, INT32_MAX, &ctx, err)) ||
        (rc = key_float(L, "attention.layer_norm_rms_epsilon", true, 0, &hp->rms_eps, err)) ||
        (rc = key_int(L, "attention.head_count", true, 0, 1, MAX_DIM, &hp->mla_heads, err)))
        return rc;
    hp->n_ctx_train = ctx;
    if (!(hp->rms_eps >= 0.0f && hp->rms_eps < 1.0f))
        return em_err_set(err, EM_EFORMAT, "%s: key %s.attention.layer_norm_rms_epsilon = %g is out of range",
                          L->wl.path, L->wl.arch, hp->rms_eps);
    if ((rc = read_layer_kinds(L, err))) return rc;
    if (hp->n_kda > 0) {
        if ((rc = key_int(L, "kda.head_dim", true, 0, 1, MAX_DIM, &hp->kda_head_dim, err)) ||
            (rc = key_int(L, "ssm.conv_kernel", true, 0, 1, EM_KDA_MAX_CONV, &hp->d_conv, err)))
            return rc;
        hp->kda_heads = hp->mla_heads;
        if ((int64_t)hp->kda_heads * hp->kda_head_dim > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: KDA width %d x %d is too large", L->wl.path, hp->kda_heads,
                              hp->kda_head_dim);
        hp->d_inner = hp->kda_heads * hp->kda_head_dim;
    }
    if (hp->n_mla > 0) {
        if ((rc = key_int(L, "attention.key_length_mla", true, 0, 1, MAX_DIM, &key_mla, err)) ||
            (rc = key_int(L, "attention.value_length_mla", true, 0, 1, MAX_DIM, &hp->v_head, err)) ||
            (rc = key_int(L, "attention.kv_lora_rank", true, 0, 1, MAX_DIM, &hp->kv_lora, err)) ||
            (rc = key_int(L, "rope.dimension_count", true, 0, 0, MAX_DIM, &hp->rope, err)) ||
            (rc = key_int(L, "attention.q_lora_rank", false, 0, 0, MAX_DIM, &hp->q_lora, err)))
            return rc;
        if (hp->rope >= key_mla)
            return em_err_set(err, EM_EFORMAT, "%s: rope.dimension_count %d leaves no room in key_length_mla %d",
                              L->wl.path, hp->rope, key_mla);
        hp->nope = key_mla - hp->rope;
        if ((int64_t)hp->mla_heads * (key_mla + hp->kv_lora + hp->v_head) > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: MLA sizes are too large", L->wl.path);
    }
    if ((rc = key_int(L, "leading_dense_block_count", false, 0, 0, hp->n_layer, &hp->n_lead_dense, err)) ||
        (rc = key_int(L, "expert_count", false, 0, 0, MAX_EXPERTS, &hp->n_expert, err)))
        return rc;
    if (hp->n_expert == 0) hp->n_lead_dense = hp->n_layer;
    if (hp->n_lead_dense > 0 &&
        (rc = key_int(L, "feed_forward_length", true, 0, 1, MAX_DIM * 16, &hp->n_ff, err)))
        return rc;
    if (hp->n_lead_dense < hp->n_layer) {
        int gating = 0;
        if ((rc = key_int(L, "expert_used_count", true, 0, 1, hp->n_expert, &hp->n_expert_used, err)) ||
            (rc = read_ff_exp(L, err)) ||
            (rc = key_int(L, "expert_shared_count", false, 0, 0, 64, &hp->n_shared, err)) ||
            (rc = key_int(L, "expert_gating_func", true, 0, 0, 16, &gating, err)) ||
            (rc = key_int(L, "expert_group_count", false, 1, 1, hp->n_expert, &hp->n_group, err)) ||
            (rc = key_int(L, "expert_group_used_count", false, 1, 1, hp->n_group, &hp->n_group_used, err)) ||
            (rc = key_float(L, "expert_weights_scale", false, 1.0, &hp->expert_scale, err)) ||
            (rc = key_bool(L, "expert_weights_norm", !hp->k3, &hp->expert_norm, err))) /* llama.cpp: k3 default off */
            return rc;
        if (gating != 2)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: key %s.expert_gating_func = %d; %s routes with sigmoid (2)",
                              L->wl.path, L->wl.arch, gating, L->wl.arch);
        if (hp->n_expert % hp->n_group != 0)
            return em_err_set(err, EM_EFORMAT, "%s: %d experts do not split into %d groups", L->wl.path, hp->n_expert,
                              hp->n_group);
        int per_group = hp->n_expert / hp->n_group;
        if ((int64_t)hp->n_group_used * per_group < hp->n_expert_used)
            return em_err_set(err, EM_EFORMAT, "%s: %d groups of %d experts cannot hold %d chosen experts", L->wl.path,
                              hp->n_group_used, per_group, hp->n_expert_used);
        if ((int64_t)hp->n_shared * hp->n_ff_exp > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: shared expert width too large", L->wl.path);
    }
    if (hp->k3 && (rc = read_k3_hparams(L, err))) return rc;
    return EM_OK;
}

/* ---- tensors (through the shared loader, model/weights.h) ---------------------------- */

static int load_kda(loader *L, int l, kimi_kda_w *k, em_err *err) {
    em_wload *W = &L->wl;
    const kimi_hparams *hp = L->hp;
    const int64_t E = hp->n_embd, D = hp->d_inner, hd = hp->kda_head_dim;
    char n[96];
    const float *cq, *ck, *cv, *a, *dt, *on;
    int rc;
    if ((rc = em_wload_mat(W, NAME(n, "blk.%d.attn_q.weight", l), E, D, 1, &k->q, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_k.weight", l), E, D, 1, &k->k, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_v.weight", l), E, D, 1, &k->v, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ssm_f_a.weight", l), E, hd, 1, &k->f_a, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ssm_f_b.weight", l), hd, D, 1, &k->f_b, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ssm_beta.weight", l), E, hp->kda_heads, 1, &k->beta, err)) ||
        (rc = hp->k3 ? em_wload_mat(W, NAME(n, "blk.%d.ssm_g.weight", l), E, D, 1, &k->g, err)
                     : em_wload_mat(W, NAME(n, "blk.%d.ssm_g_a.weight", l), E, hd, 1, &k->g_a, err)) ||
        (rc = hp->k3 ? 0 : em_wload_mat(W, NAME(n, "blk.%d.ssm_g_b.weight", l), hd, D, 1, &k->g_b, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_output.weight", l), D, E, 1, &k->out, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.ssm_conv1d_q.weight", l), D * hp->d_conv, hp->d_conv, &cq, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.ssm_conv1d_k.weight", l), D * hp->d_conv, hp->d_conv, &ck, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.ssm_conv1d_v.weight", l), D * hp->d_conv, hp->d_conv, &cv, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.ssm_a", l), hp->kda_heads, 0, &a, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.ssm_dt.bias", l), D, 0, &dt, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.ssm_norm.weight", l), hd, 0, &on, err)))
        return rc;
    k->p = (em_kda_params){ .conv_q = cq, .conv_k = ck, .conv_v = cv, .ssm_a = a, .dt_bias = dt, .o_norm = on };
    return EM_OK;
}

static int load_mla(loader *L, int l, kimi_mla_w *m, em_err *err) {
    em_wload *W = &L->wl;
    const kimi_hparams *hp = L->hp;
    const int64_t E = hp->n_embd, H = hp->mla_heads, qk = hp->nope + hp->rope;
    char n[96];
    int rc;
    if (hp->q_lora > 0) {
        if ((rc = em_wload_mat(W, NAME(n, "blk.%d.attn_q_a.weight", l), E, hp->q_lora, 1, &m->q_a, err)) ||
            (rc = em_wload_vec(W, NAME(n, "blk.%d.attn_q_a_norm.weight", l), hp->q_lora, 0, &m->q_a_norm, err)) ||
            (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_q_b.weight", l), hp->q_lora, H * qk, 1, &m->q_b, err)))
            return rc;
    } else if ((rc = em_wload_mat(W, NAME(n, "blk.%d.attn_q.weight", l), E, H * qk, 1, &m->q, err))) {
        return rc;
    }
    if ((rc = em_wload_mat(W, NAME(n, "blk.%d.attn_kv_a_mqa.weight", l), E, hp->kv_lora + hp->rope, 1, &m->kv_a, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.attn_kv_a_norm.weight", l), hp->kv_lora, 0, &m->kv_a_norm, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_k_b.weight", l), hp->nope, hp->kv_lora, H, &m->k_b, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_v_b.weight", l), hp->kv_lora, hp->v_head, H, &m->v_b, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_output.weight", l), H * hp->v_head, E, 1, &m->out, err)))
        return rc;
    if (hp->k3 && em_wload_has(W, NAME(n, "blk.%d.attn_gate.weight", l)) &&
        (rc = em_wload_mat(W, n, E, H * hp->v_head, 1, &m->gate, err)))
        return rc;
    return EM_OK;
}

/* K3's latent projections around the routed experts (experts at width lat). */
static int load_latent(loader *L, int l, int64_t lat, kimi_ffn_w *f, em_err *err) {
    em_wload *W = &L->wl;
    const int64_t E = L->hp->n_embd;
    char n[96];
    int rc;
    if ((rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_routed_down.weight", l), E, lat, 1, &f->routed_down, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_routed_up.weight", l), lat, E, 1, &f->routed_up, err)))
        return rc;
    return em_wload_vec_opt(W, NAME(n, "blk.%d.ffn_routed_norm.weight", l), lat, &f->routed_norm, err);
}

static int load_ffn(loader *L, int l, kimi_ffn_w *f, em_err *err) {
    em_wload *W = &L->wl;
    const kimi_hparams *hp = L->hp;
    const int64_t X = hp->n_expert, F = hp->n_ff_exp;
    const int64_t E = hp->n_embd, Lx = hp->n_latent > 0 ? hp->n_latent : E; /* expert width */
    char n[96];
    int rc;
    f->moe = l >= hp->n_lead_dense;
    if (!f->moe) {
        if ((rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_gate.weight", l), E, hp->n_ff, 1, &f->gate, err)) ||
            (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_up.weight", l), E, hp->n_ff, 1, &f->up, err)) ||
            (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_down.weight", l), hp->n_ff, E, 1, &f->down, err)))
            return rc;
        return EM_OK;
    }
    /* the router in f32 when stored quantized, so its dots are exact fp32 as in the reference */
    if ((rc = em_wload_mat_float(W, NAME(n, "blk.%d.ffn_gate_inp.weight", l), E, X, &f->router, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.exp_probs_b.bias", l), X, 0, &f->router_bias, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_gate_exps.weight", l), Lx, F, X, &f->gate_exps, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_up_exps.weight", l), Lx, F, X, &f->up_exps, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_down_exps.weight", l), F, Lx, X, &f->down_exps, err)) ||
        (rc = hp->n_latent > 0 ? load_latent(L, l, Lx, f, err) : 0))
        return rc;
    if (hp->n_shared > 0) {
        const int64_t S = (int64_t)hp->n_shared * F;
        if ((rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_gate_shexp.weight", l), E, S, 1, &f->gate_sh, err)) ||
            (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_up_shexp.weight", l), E, S, 1, &f->up_sh, err)) ||
            (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_down_shexp.weight", l), S, E, 1, &f->down_sh, err)))
            return rc;
    }
    return EM_OK;
}

static int load_globals(loader *L, em_err *err) {
    em_wload *W = &L->wl;
    kimi_hparams *hp = L->hp;
    kimi_weights *w = L->w;
    const em_gguf_tensor *t = em_gguf_find_tensor(W->g, "token_embd.weight");
    if (!t) return em_err_set(err, EM_ENOTFOUND, "%s: tensor token_embd.weight is missing", L->wl.path);
    if (hp->n_vocab == 0) {
        if (t->ne[1] < 1 || t->ne[1] > MAX_VOCAB)
            return em_err_set(err, EM_EFORMAT, "%s: tensor token_embd.weight has %lld rows", L->wl.path, (long long)t->ne[1]);
        hp->n_vocab = (int)t->ne[1];
    }
    int rc;
    if ((rc = em_wload_mat(W, "token_embd.weight", hp->n_embd, hp->n_vocab, 1, &w->tok_embd, err)) ||
        (rc = em_wload_vec(W, "output_norm.weight", hp->n_embd, 0, &w->output_norm, err)) ||
        (rc = em_wload_mat(W, "output.weight", hp->n_embd, hp->n_vocab, 1, &w->output, err)) ||
        (rc = hp->res_block > 0 ? em_wload_vec(W, "output_res_score.weight", hp->n_embd, 0, &w->output_res, err) : 0))
        return rc;
    return em_wload_readable(W, "token_embd.weight", w->tok_embd.type, err); /* rows are read as values */
}

/* K3 AttnRes: the fused score vectors of both layer halves. */
static int load_res_scores(loader *L, int l, kimi_layer *ly, em_err *err) {
    em_wload *W = &L->wl;
    if (L->hp->res_block <= 0) return EM_OK;
    char n[96];
    int rc = em_wload_vec(W, NAME(n, "blk.%d.attn_res_score.weight", l), L->hp->n_embd, 0, &ly->attn_res, err);
    return rc ? rc : em_wload_vec(W, NAME(n, "blk.%d.ffn_res_score.weight", l), L->hp->n_embd, 0, &ly->ffn_res, err);
}

static int load_layers(loader *L, em_err *err) {
    em_wload *W = &L->wl;
    kimi_hparams *hp = L->hp;
    kimi_weights *w = L->w;
    w->layers = em_calloc((size_t)hp->n_layer, sizeof *w->layers, "layers", err);
    if (!w->layers) return EM_ENOMEM;
    int n_kda = 0, n_mla = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        kimi_layer *ly = &w->layers[l];
        char n[96];
        ly->kind = hp->kind[l];
        ly->slot = ly->kind == KIMI_KDA ? n_kda++ : n_mla++;
        int rc;
        if ((rc = em_wload_vec(W, NAME(n, "blk.%d.attn_norm.weight", l), hp->n_embd, 0, &ly->attn_norm, err)) ||
            (rc = em_wload_vec(W, NAME(n, "blk.%d.ffn_norm.weight", l), hp->n_embd, 0, &ly->ffn_norm, err)) ||
            (rc = load_res_scores(L, l, ly, err)) ||
            (rc = ly->kind == KIMI_KDA ? load_kda(L, l, &ly->kda, err) : load_mla(L, l, &ly->mla, err)) ||
            (rc = load_ffn(L, l, &ly->ffn, err)))
            return rc;
    }
    return EM_OK;
}

int kimi_load(em_gguf *g, const em_wload_hook *hook, kimi_hparams *hp, kimi_weights *w, em_err *err) {
    *hp = (kimi_hparams){ 0 };
    *w = (kimi_weights){ 0 };
    loader L = { .hp = hp, .w = w };
    em_wload_init(&L.wl, g, NULL, hook);
    if (!hook) L.wl.pack_budget = em_mat_pack_budget(); /* the CPU target (a device's hook uploads rows as stored) */
    char arch[32];
    int rc = em_gguf_get_cstr(g, "general.architecture", arch, sizeof arch, err);
    if (rc) return rc;
    if (strcmp(arch, "kimi-linear") && strcmp(arch, "kimi-k3"))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: architecture '%s' is not a Kimi model", L.wl.path, arch);
    hp->k3 = !strcmp(arch, "kimi-k3");
    L.wl.arch = hp->k3 ? "kimi-k3" : "kimi-linear";
    rc = em_arena_create(&w->store, 1u << 20, err);
    L.wl.store = w->store;
    if (!rc) rc = read_hparams(&L, err);
    if (!rc) rc = load_globals(&L, err);
    if (!rc) rc = load_layers(&L, err);
    if (rc) kimi_unload(hp, w);
    char b[32];
    if (!rc && L.wl.packed_bytes)
        em_log(EM_LOG_INFO, "%s: %s of single Q8_0 matrices packed for the CPU's products", L.wl.path,
               em_format_size(L.wl.packed_bytes, b, sizeof b));
    return rc;
}

void kimi_unload(kimi_hparams *hp, kimi_weights *w) {
    free(hp->kind);
    hp->kind = NULL;
    free(w->layers);
    w->layers = NULL;
    if (w->store) em_arena_free(w->store);
    w->store = NULL;
}
