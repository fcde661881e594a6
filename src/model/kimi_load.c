/* Loading a kimi-linear or kimi-k3 GGUF (llama.cpp's layout): hyperparameters from the
 * `ARCH.*` keys (ARCH = general.architecture) and every tensor of every layer, each checked
 * for presence, shape and type before use, so a bad file ends here with a message naming the file and the key or tensor, never later in
 * the forward pass. Matrices stay in the mapping (em_mat views); vectors are dequantized to
 * f32 into w->store. Layer kinds come from attention.head_count_kv (0 = KDA, else MLA), dense
 * vs MoE from leading_dense_block_count, as llama.cpp reads them. kimi-k3 adds (each checked
 * the same way) q-LoRA MLA with an output gate, the full-rank KDA output gate and the bounded
 * decay gate, SiTU, latent MoE and the AttnRes score vectors (kimi_impl.h).
 *
 * Must not: read past a tensor's bytes (the GGUF reader bounds them, shapes are checked
 * against the sizes derived here) or keep pointers into the file past em_gguf_close. */
#include "model/kimi_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM (1 << 20)      /* any single size (heads, widths) */
#define MAX_VOCAB (1 << 24)
#define MAX_LAYERS 4096
#define MAX_EXPERTS 65536

typedef struct loader {
    em_gguf *g;
    const char *path;
    const char *arch;  /* the key prefix: kimi-linear or kimi-k3 */
    kimi_hparams *hp;
    kimi_weights *w;
} loader;

/* ---- metadata ------------------------------------------------------------------------- */

static int key_int(loader *L, const char *suffix, bool required, int64_t def, int64_t lo,
                   int64_t hi, int *out, em_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    int64_t v;
    int rc = em_gguf_get_int(L->g, key, &v, err);
    if (rc == EM_ENOTFOUND && !required) {
        *out = (int)def;
        return EM_OK;
    }
    if (rc) return rc; /* the reader's message names the file and the key */
    if (v < lo || v > hi)
        return em_err_set(err, EM_EFORMAT, "%s: key %s = %lld is out of range [%lld, %lld]", L->path, key,
                          (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return EM_OK;
}

static int key_float(loader *L, const char *suffix, bool required, double def, float *out,
                     em_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    double v;
    int rc = em_gguf_get_float(L->g, key, &v, err);
    if (rc == EM_ENOTFOUND && !required) {
        *out = (float)def;
        return EM_OK;
    }
    if (rc) return rc;
    if (!(v == v) || v > 1e30 || v < -1e30)
        return em_err_set(err, EM_EFORMAT, "%s: key %s = %g is not a usable number", L->path, key, v);
    *out = (float)v;
    return EM_OK;
}

static int key_bool(loader *L, const char *suffix, bool def, bool *out, em_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    int rc = em_gguf_get_bool(L->g, key, out, err);
    if (rc == EM_ENOTFOUND) {
        *out = def;
        return EM_OK;
    }
    return rc;
}

/* expert_feed_forward_length: one integer, or one per layer (llama.cpp's get_key_or_arr); the
 * per-layer form must give every MoE layer the same width. */
static int read_ff_exp(loader *L, em_err *err) {
    kimi_hparams *hp = L->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_feed_forward_length", L->arch);
    int64_t i = em_gguf_find_key(L->g, key);
    if (i < 0 || em_gguf_value_at(L->g, i).type != EM_GGUF_ARRAY)
        return key_int(L, "expert_feed_forward_length", true, 0, 1, MAX_DIM, &hp->n_ff_exp, err);
    em_gguf_value v = em_gguf_value_at(L->g, i);
    if (em_gguf_arr_count(v.arr) != (uint64_t)hp->n_layer)
        return em_err_set(err, EM_EFORMAT, "%s: key %s has %llu entries, want %d (block_count)", L->path, key,
                          (unsigned long long)em_gguf_arr_count(v.arr), hp->n_layer);
    for (int l = hp->n_lead_dense; l < hp->n_layer; l++) {
        int64_t f;
        int rc = em_gguf_arr_get_int(v.arr, (uint64_t)l, &f, err);
        if (rc) return em_err_prefix(err, "%s: key %s", L->path, key);
        if (f < 1 || f > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: key %s[%d] = %lld is out of range [1, %d]", L->path, key, l,
                              (long long)f, MAX_DIM);
        if (l > hp->n_lead_dense && f != hp->n_ff_exp)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: key %s: MoE layers of different expert widths (%d, %lld)",
                              L->path, key, hp->n_ff_exp, (long long)f);
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
        return em_err_set(err, EM_EFORMAT, "%s: key %s.activation.situ_beta = %g must be positive", L->path, L->arch,
                          hp->situ_beta);
    hp->situ = true;
    if (lb > -INFINITY) {
        if (!(lb < 0.0f))
            return em_err_set(err, EM_EFORMAT, "%s: key %s.kda.gate_lower_bound = %g must be negative", L->path,
                              L->arch, lb);
        hp->gate_bounded = true;
        hp->gate_lb = lb;
    }
    return EM_OK;
}

/* attention.head_count_kv: one integer per layer (or one for all); 0 marks a KDA layer. */
static int read_layer_kinds(loader *L, em_err *err) {
    kimi_hparams *hp = L->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", L->arch);
    hp->kind = em_calloc((size_t)hp->n_layer, sizeof *hp->kind, "layer kinds", err);
    if (!hp->kind) return EM_ENOMEM;
    int64_t i = em_gguf_find_key(L->g, key);
    if (i < 0) return em_err_set(err, EM_ENOTFOUND, "%s: key %s is missing (it tells KDA from MLA layers)", L->path, key);
    em_gguf_value v = em_gguf_value_at(L->g, i);
    for (int l = 0; l < hp->n_layer; l++) {
        int64_t kv;
        if (v.type == EM_GGUF_ARRAY) {
            if (em_gguf_arr_count(v.arr) != (uint64_t)hp->n_layer)
                return em_err_set(err, EM_EFORMAT, "%s: key %s has %llu entries, want %d (block_count)", L->path,
                                  key, (unsigned long long)em_gguf_arr_count(v.arr), hp->n_layer);
            int rc = em_gguf_arr_get_int(v.arr, (uint64_t)l, &kv, err);
            if (rc) return em_err_prefix(err, "%s", L->path);
        } else {
            int rc = em_gguf_get_int(L->g, key, &kv, err);
            if (rc) return rc;
        }
        if (kv < 0) return em_err_set(err, EM_EFORMAT, "%s: key %s[%d] = %lld is negative", L->path, key, l, (long long)kv);
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
                          L->path, L->arch, hp->rms_eps);
    if ((rc = read_layer_kinds(L, err))) return rc;
    if (hp->n_kda > 0) {
        if ((rc = key_int(L, "kda.head_dim", true, 0, 1, MAX_DIM, &hp->kda_head_dim, err)) ||
            (rc = key_int(L, "ssm.conv_kernel", true, 0, 1, EM_KDA_MAX_CONV, &hp->d_conv, err)))
            return rc;
        hp->kda_heads = hp->mla_heads;
        if ((int64_t)hp->kda_heads * hp->kda_head_dim > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: KDA width %d x %d is too large", L->path, hp->kda_heads,
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
                              L->path, hp->rope, key_mla);
        hp->nope = key_mla - hp->rope;
        if ((int64_t)hp->mla_heads * (key_mla + hp->kv_lora + hp->v_head) > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: MLA sizes are too large", L->path);
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
                              L->path, L->arch, gating, L->arch);
        if (hp->n_expert % hp->n_group != 0)
            return em_err_set(err, EM_EFORMAT, "%s: %d experts do not split into %d groups", L->path, hp->n_expert,
                              hp->n_group);
        int per_group = hp->n_expert / hp->n_group;
        if ((int64_t)hp->n_group_used * per_group < hp->n_expert_used)
            return em_err_set(err, EM_EFORMAT, "%s: %d groups of %d experts cannot hold %d chosen experts", L->path,
                              hp->n_group_used, per_group, hp->n_expert_used);
        if ((int64_t)hp->n_shared * hp->n_ff_exp > MAX_DIM)
            return em_err_set(err, EM_EFORMAT, "%s: shared expert width too large", L->path);
    }
    if (hp->k3 && (rc = read_k3_hparams(L, err))) return rc;
    return EM_OK;
}

/* ---- tensors -------------------------------------------------------------------------- */

static const char *shape_str(const int64_t *ne, int nd, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < nd && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

/* The tensor `name` with exactly the shape ne[0..nd) (missing trailing dims are 1). */
static int find_shaped(loader *L, const char *name, int nd, const int64_t *ne,
                       const em_gguf_tensor **out, em_err *err) {
    const em_gguf_tensor *t = em_gguf_find_tensor(L->g, name);
    if (!t) return em_err_set(err, EM_ENOTFOUND, "%s: tensor %s is missing", L->path, name);
    bool ok = true;
    for (int i = 0; i < EM_GGUF_MAX_DIMS; i++)
        if (t->ne[i] != (i < nd ? ne[i] : 1)) ok = false;
    if (!ok) {
        char want[96], got[96];
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s has shape %s, want %s", L->path, name,
                          shape_str(t->ne, t->n_dims > 0 ? t->n_dims : 1, got, sizeof got),
                          shape_str(ne, nd, want, sizeof want));
    }
    *out = t;
    return EM_OK;
}

/* A matrix of `rows` rows of `cols` (ne [cols, rows, extra]); rows*extra rows in all. */
static int get_mat(loader *L, const char *name, int64_t cols, int64_t rows, int64_t extra,
                   em_mat *m, em_err *err) {
    const int64_t ne[3] = { cols, rows, extra };
    const em_gguf_tensor *t = NULL;
    int rc = find_shaped(L, name, extra > 1 ? 3 : 2, ne, &t, err);
    if (rc) return rc;
    int blk = em_dot_block_elems(t->type);
    if (blk == 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor %s has type %s, which Ember cannot multiply with",
                          L->path, name, em_type_name(t->type));
    if (cols % blk != 0)
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s: %lld columns are not a multiple of the %s block (%d)",
                          L->path, name, (long long)cols, em_type_name(t->type), blk);
    rc = em_mat_init(m, t->type, rows * extra, cols, t->data, err);
    if (rc) return em_err_prefix(err, "%s: tensor %s", L->path, name);
    if (m->row_bytes * (uint64_t)m->rows != t->bytes)
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s holds %llu bytes, its shape needs %llu", L->path, name,
                          (unsigned long long)t->bytes, (unsigned long long)(m->row_bytes * (uint64_t)m->rows));
    return EM_OK;
}

/* n values of a tensor as f32 in w->store: the tensor must hold exactly n values, all in one
 * dimension (others 1), unless lead > 0: then ne[0] must be lead (conv taps). */
static int get_f32(loader *L, const char *name, int64_t n, int64_t lead, const float **out, em_err *err) {
    const em_gguf_tensor *t = em_gguf_find_tensor(L->g, name);
    if (!t) return em_err_set(err, EM_ENOTFOUND, "%s: tensor %s is missing", L->path, name);
    int big = 0;
    for (int i = 0; i < EM_GGUF_MAX_DIMS; i++) big += t->ne[i] != 1;
    bool ok = t->n_elements == (uint64_t)n && (lead > 0 ? t->ne[0] == lead : big <= 1);
    if (!ok) {
        char got[96];
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s has shape %s, want %lld values%s", L->path, name,
                          shape_str(t->ne, t->n_dims > 0 ? t->n_dims : 1, got, sizeof got), (long long)n,
                          lead > 0 ? " with the conv taps first" : " in one dimension");
    }
    const em_type_info *ti = em_type_get(t->type);
    if (!ti || !ti->to_float)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor %s has type %s, which Ember cannot read", L->path, name,
                          em_type_name(t->type));
    float *dst = em_arena_alloc(L->w->store, (size_t)n * sizeof(float));
    if (!dst) return em_err_set(err, EM_ENOMEM, "out of memory loading tensor %s", name);
    if (t->missing) { /* a file cut short: zeros, and no forward will run (target.c) */
        memset(dst, 0, (size_t)n * sizeof(float));
        *out = dst;
        return EM_OK;
    }
    int rc = em_dequantize(t->type, t->data, dst, n, err);
    if (rc) return em_err_prefix(err, "%s: tensor %s", L->path, name);
    *out = dst;
    return EM_OK;
}

#define NAME(buf, fmt, ...) (snprintf(buf, sizeof buf, fmt, __VA_ARGS__), buf)

static int load_kda(loader *L, int l, kimi_kda_w *k, em_err *err) {
    const kimi_hparams *hp = L->hp;
    const int64_t E = hp->n_embd, D = hp->d_inner, hd = hp->kda_head_dim;
    char n[96];
    const float *cq, *ck, *cv, *a, *dt, *on;
    int rc;
    if ((rc = get_mat(L, NAME(n, "blk.%d.attn_q.weight", l), E, D, 1, &k->q, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.attn_k.weight", l), E, D, 1, &k->k, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.attn_v.weight", l), E, D, 1, &k->v, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.ssm_f_a.weight", l), E, hd, 1, &k->f_a, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.ssm_f_b.weight", l), hd, D, 1, &k->f_b, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.ssm_beta.weight", l), E, hp->kda_heads, 1, &k->beta, err)) ||
        (rc = hp->k3 ? get_mat(L, NAME(n, "blk.%d.ssm_g.weight", l), E, D, 1, &k->g, err)
                     : get_mat(L, NAME(n, "blk.%d.ssm_g_a.weight", l), E, hd, 1, &k->g_a, err)) ||
        (rc = hp->k3 ? 0 : get_mat(L, NAME(n, "blk.%d.ssm_g_b.weight", l), hd, D, 1, &k->g_b, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.attn_output.weight", l), D, E, 1, &k->out, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.ssm_conv1d_q.weight", l), D * hp->d_conv, hp->d_conv, &cq, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.ssm_conv1d_k.weight", l), D * hp->d_conv, hp->d_conv, &ck, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.ssm_conv1d_v.weight", l), D * hp->d_conv, hp->d_conv, &cv, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.ssm_a", l), hp->kda_heads, 0, &a, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.ssm_dt.bias", l), D, 0, &dt, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.ssm_norm.weight", l), hd, 0, &on, err)))
        return rc;
    k->p = (em_kda_params){ .conv_q = cq, .conv_k = ck, .conv_v = cv, .ssm_a = a, .dt_bias = dt, .o_norm = on };
    return EM_OK;
}

static int load_mla(loader *L, int l, kimi_mla_w *m, em_err *err) {
    const kimi_hparams *hp = L->hp;
    const int64_t E = hp->n_embd, H = hp->mla_heads, qk = hp->nope + hp->rope;
    char n[96];
    int rc;
    if (hp->q_lora > 0) {
        if ((rc = get_mat(L, NAME(n, "blk.%d.attn_q_a.weight", l), E, hp->q_lora, 1, &m->q_a, err)) ||
            (rc = get_f32(L, NAME(n, "blk.%d.attn_q_a_norm.weight", l), hp->q_lora, 0, &m->q_a_norm, err)) ||
            (rc = get_mat(L, NAME(n, "blk.%d.attn_q_b.weight", l), hp->q_lora, H * qk, 1, &m->q_b, err)))
            return rc;
    } else if ((rc = get_mat(L, NAME(n, "blk.%d.attn_q.weight", l), E, H * qk, 1, &m->q, err))) {
        return rc;
    }
    if ((rc = get_mat(L, NAME(n, "blk.%d.attn_kv_a_mqa.weight", l), E, hp->kv_lora + hp->rope, 1, &m->kv_a, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.attn_kv_a_norm.weight", l), hp->kv_lora, 0, &m->kv_a_norm, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.attn_k_b.weight", l), hp->nope, hp->kv_lora, H, &m->k_b, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.attn_v_b.weight", l), hp->kv_lora, hp->v_head, H, &m->v_b, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.attn_output.weight", l), H * hp->v_head, E, 1, &m->out, err)))
        return rc;
    if (hp->k3 && em_gguf_find_tensor(L->g, NAME(n, "blk.%d.attn_gate.weight", l)) &&
        (rc = get_mat(L, n, E, H * hp->v_head, 1, &m->gate, err)))
        return rc;
    return EM_OK;
}

/* The router in f32 when stored in a quantized type, so its dots are exact fp32 as in the
 * reference (float types are used in place: their dots take f32 activations). */
static int router_as_float(loader *L, const char *name, em_mat *r, em_err *err) {
    if (r->type == EM_TYPE_F32 || r->type == EM_TYPE_F16 || r->type == EM_TYPE_BF16) return EM_OK;
    if (!r->data) return EM_OK; /* missing (a file cut short): no forward will run */
    uint64_t count = (uint64_t)r->rows * (uint64_t)r->cols;
    float *dst = em_arena_alloc(L->w->store, count * sizeof(float));
    if (!dst) return em_err_set(err, EM_ENOMEM, "out of memory converting router %s to f32", name);
    int rc = em_dequantize(r->type, r->data, dst, (int64_t)count, err);
    if (rc) return em_err_prefix(err, "%s: tensor %s", L->path, name);
    return em_mat_init(r, EM_TYPE_F32, r->rows, r->cols, dst, err);
}

/* K3's latent projections around the routed experts (experts at width lat). */
static int load_latent(loader *L, int l, int64_t lat, kimi_ffn_w *f, em_err *err) {
    const int64_t E = L->hp->n_embd;
    char n[96];
    int rc;
    if ((rc = get_mat(L, NAME(n, "blk.%d.ffn_routed_down.weight", l), E, lat, 1, &f->routed_down, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.ffn_routed_up.weight", l), lat, E, 1, &f->routed_up, err)))
        return rc;
    if (em_gguf_find_tensor(L->g, NAME(n, "blk.%d.ffn_routed_norm.weight", l)) &&
        (rc = get_f32(L, n, lat, 0, &f->routed_norm, err)))
        return rc;
    return EM_OK;
}

static int load_ffn(loader *L, int l, kimi_ffn_w *f, em_err *err) {
    const kimi_hparams *hp = L->hp;
    const int64_t X = hp->n_expert, F = hp->n_ff_exp;
    const int64_t E = hp->n_embd, Lx = hp->n_latent > 0 ? hp->n_latent : E; /* expert width */
    char n[96];
    int rc;
    f->moe = l >= hp->n_lead_dense;
    if (!f->moe) {
        if ((rc = get_mat(L, NAME(n, "blk.%d.ffn_gate.weight", l), E, hp->n_ff, 1, &f->gate, err)) ||
            (rc = get_mat(L, NAME(n, "blk.%d.ffn_up.weight", l), E, hp->n_ff, 1, &f->up, err)) ||
            (rc = get_mat(L, NAME(n, "blk.%d.ffn_down.weight", l), hp->n_ff, E, 1, &f->down, err)))
            return rc;
        return EM_OK;
    }
    if ((rc = get_mat(L, NAME(n, "blk.%d.ffn_gate_inp.weight", l), E, X, 1, &f->router, err)) ||
        (rc = router_as_float(L, n, &f->router, err)) ||
        (rc = get_f32(L, NAME(n, "blk.%d.exp_probs_b.bias", l), X, 0, &f->router_bias, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.ffn_gate_exps.weight", l), Lx, F, X, &f->gate_exps, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.ffn_up_exps.weight", l), Lx, F, X, &f->up_exps, err)) ||
        (rc = get_mat(L, NAME(n, "blk.%d.ffn_down_exps.weight", l), F, Lx, X, &f->down_exps, err)) ||
        (rc = hp->n_latent > 0 ? load_latent(L, l, Lx, f, err) : 0))
        return rc;
    if (hp->n_shared > 0) {
        const int64_t S = (int64_t)hp->n_shared * F;
        if ((rc = get_mat(L, NAME(n, "blk.%d.ffn_gate_shexp.weight", l), E, S, 1, &f->gate_sh, err)) ||
            (rc = get_mat(L, NAME(n, "blk.%d.ffn_up_shexp.weight", l), E, S, 1, &f->up_sh, err)) ||
            (rc = get_mat(L, NAME(n, "blk.%d.ffn_down_shexp.weight", l), S, E, 1, &f->down_sh, err)))
            return rc;
    }
    return EM_OK;
}

static int load_globals(loader *L, em_err *err) {
    kimi_hparams *hp = L->hp;
    kimi_weights *w = L->w;
    const em_gguf_tensor *t = em_gguf_find_tensor(L->g, "token_embd.weight");
    if (!t) return em_err_set(err, EM_ENOTFOUND, "%s: tensor token_embd.weight is missing", L->path);
    if (hp->n_vocab == 0) {
        if (t->ne[1] < 1 || t->ne[1] > MAX_VOCAB)
            return em_err_set(err, EM_EFORMAT, "%s: tensor token_embd.weight has %lld rows", L->path, (long long)t->ne[1]);
        hp->n_vocab = (int)t->ne[1];
    }
    int rc;
    if ((rc = get_mat(L, "token_embd.weight", hp->n_embd, hp->n_vocab, 1, &w->tok_embd, err)) ||
        (rc = get_f32(L, "output_norm.weight", hp->n_embd, 0, &w->output_norm, err)) ||
        (rc = get_mat(L, "output.weight", hp->n_embd, hp->n_vocab, 1, &w->output, err)) ||
        (rc = hp->res_block > 0 ? get_f32(L, "output_res_score.weight", hp->n_embd, 0, &w->output_res, err) : 0))
        return rc;
    const em_type_info *ti = em_type_get(w->tok_embd.type);
    if (!ti || !ti->to_float)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: token_embd.weight has type %s, which Ember cannot read", L->path,
                          em_type_name(w->tok_embd.type));
    return EM_OK;
}

/* K3 AttnRes: the fused score vectors of both layer halves. */
static int load_res_scores(loader *L, int l, kimi_layer *ly, em_err *err) {
    if (L->hp->res_block <= 0) return EM_OK;
    char n[96];
    int rc = get_f32(L, NAME(n, "blk.%d.attn_res_score.weight", l), L->hp->n_embd, 0, &ly->attn_res, err);
    return rc ? rc : get_f32(L, NAME(n, "blk.%d.ffn_res_score.weight", l), L->hp->n_embd, 0, &ly->ffn_res, err);
}

static int load_layers(loader *L, em_err *err) {
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
        if ((rc = get_f32(L, NAME(n, "blk.%d.attn_norm.weight", l), hp->n_embd, 0, &ly->attn_norm, err)) ||
            (rc = get_f32(L, NAME(n, "blk.%d.ffn_norm.weight", l), hp->n_embd, 0, &ly->ffn_norm, err)) ||
            (rc = load_res_scores(L, l, ly, err)) ||
            (rc = ly->kind == KIMI_KDA ? load_kda(L, l, &ly->kda, err) : load_mla(L, l, &ly->mla, err)) ||
            (rc = load_ffn(L, l, &ly->ffn, err)))
            return rc;
    }
    return EM_OK;
}

int kimi_load(em_gguf *g, kimi_hparams *hp, kimi_weights *w, em_err *err) {
    *hp = (kimi_hparams){ 0 };
    *w = (kimi_weights){ 0 };
    loader L = { .g = g, .path = em_gguf_path(g), .hp = hp, .w = w };
    char arch[32];
    int rc = em_gguf_get_cstr(g, "general.architecture", arch, sizeof arch, err);
    if (rc) return rc;
    if (strcmp(arch, "kimi-linear") && strcmp(arch, "kimi-k3"))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: architecture '%s' is not a Kimi model", L.path, arch);
    hp->k3 = !strcmp(arch, "kimi-k3");
    L.arch = hp->k3 ? "kimi-k3" : "kimi-linear";
    rc = em_arena_create(&w->store, 1u << 20, err);
    if (!rc) rc = read_hparams(&L, err);
    if (!rc) rc = load_globals(&L, err);
    if (!rc) rc = load_layers(&L, err);
    if (rc) kimi_unload(hp, w);
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
