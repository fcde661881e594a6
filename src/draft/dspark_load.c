/* draft/dspark_load.c: opening a `dflash` GGUF (written by `ember convert`, names and keys as
 * convert/map_dflash.c writes them) for an opened target. Owns: reading the hyperparameters
 * (RMS epsilon, RoPE schedule, block convention, Markov and confidence heads: always from the
 * file's keys), the checks against the target (hidden size, vocabulary, tapped layers: each
 * failure names both files and what differs), every tensor's presence, shape and type
 * (through the shared loader, model/weights.h), the borrowing of the target's token_embd /
 * output when the drafter has none (the target's own matrices, model.h em_target_shared: one
 * copy exists, and the target outlives the drafter), sizing the context cache and all
 * scratch, so the forward pass never allocates, and warming: the weights a block reads whole
 * are read once and the fixed scratch written once at open, so the first blocks do not pay a
 * page fault per page (the context cache and the Markov bias cache fill as they are used and
 * are left alone: a short run touches a fraction of them).
 *
 * Must not: keep pointers into a file it closes, open the target's file (its weights come
 * from the target), or trust a count before checking it. */
#include "draft/dspark_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARCH "dflash"
#define MAX_DIM EM_WLOAD_MAX_DIM
#define MAX_VOCAB EM_WLOAD_MAX_VOCAB
#define MAX_LAYERS EM_WLOAD_MAX_LAYERS
#define KEY_TEMPS ARCH ".confidence_temperatures"
#define NAME EM_WLOAD_NAME

typedef struct loader {
    dspark *s;
    em_wload wl;                /* the drafter's file (path, keys, tensors, s->store) */
    const em_gguf *g;           /* wl.g */
    const char *path;           /* wl.path */
    const em_target_shared *t;  /* the target */
} loader;

/* ---- hyperparameters ------------------------------------------------------------------ */

/* general.architecture must be the drafter's. */
static int check_arch(const em_wload *W, em_err *err) {
    char arch[64];
    int rc = em_gguf_get_cstr(W->g, "general.architecture", arch, sizeof arch, err);
    if (rc) return em_err_prefix(err, "%s: not a drafter", W->path);
    if (strcmp(arch, ARCH) != 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: architecture '%s' is not a drafter (want '" ARCH "')", W->path, arch);
    return EM_OK;
}

static int read_rope(loader *L, em_err *err) {
    em_wload *W = &L->wl;
    dsp_hparams *hp = &L->s->hp;
    char type[32];
    double theta, factor, orig, bf, bs, attn, logm;
    int rc;
    if ((rc = em_wload_int(W, ARCH ".rope.dimension_count", false, hp->hd, 2, hp->hd, &hp->rope_dims, err)) ||
        (rc = em_wload_float(W, ARCH ".rope.freq_base", true, 0, &theta, err)) ||
        (rc = em_wload_str(W, ARCH ".rope.scaling.type", type, sizeof type, err)))
        return rc;
    em_rope_params p = { .dims = hp->rope_dims, .theta = theta, .scaling = EM_ROPE_NONE };
    if (strcmp(type, "linear") == 0 || strcmp(type, "yarn") == 0) {
        p.scaling = type[0] == 'l' ? EM_ROPE_LINEAR : EM_ROPE_YARN;
        if ((rc = em_wload_float(W, ARCH ".rope.scaling.factor", true, 0, &factor, err))) return rc;
        p.factor = factor;
    } else if (type[0] && strcmp(type, "none") != 0) {
        return em_err_set(err, EM_EUNSUPPORTED, "%s: key " ARCH ".rope.scaling.type = '%s' (Ember knows none, linear, yarn)",
                          L->path, type);
    }
    if (p.scaling == EM_ROPE_YARN) {
        int orig_i = 0;
        if ((rc = em_wload_int(W, ARCH ".rope.scaling.original_context_length", true, 0, 1, INT32_MAX, &orig_i, err)) ||
            (rc = em_wload_float(W, ARCH ".rope.scaling.yarn_beta_fast", false, 32.0, &bf, err)) ||
            (rc = em_wload_float(W, ARCH ".rope.scaling.yarn_beta_slow", false, 1.0, &bs, err)) ||
            (rc = em_wload_float(W, ARCH ".rope.scaling.yarn_attn_factor", false, 0.0, &attn, err)) ||
            (rc = em_wload_float(W, ARCH ".rope.scaling.yarn_log_multiplier", false, 0.0, &logm, err)))
            return rc;
        orig = orig_i;
        /* HF derives that factor from mscale and mscale_all_dim together; the file has only one */
        if (logm != 0.0)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: key " ARCH ".rope.scaling.yarn_log_multiplier (DeepSeek-style "
                              "YaRN mscale) is not supported by the drafter", L->path);
        p.orig_ctx = orig;
        p.beta_fast = bf;
        p.beta_slow = bs;
        p.attn_factor = attn;
    }
    rc = em_rope_init(&L->s->rope, &p, err);
    return rc ? em_err_prefix(err, "%s", L->path) : EM_OK;
}

static int read_markov(loader *L, em_err *err) {
    em_wload *W = &L->wl;
    dsp_hparams *hp = &L->s->hp;
    char type[32];
    int rc;
    const em_gguf_tensor *w1 = em_gguf_find_tensor(L->g, "markov_w1.weight");
    int def_rank = w1 ? (int)(w1->ne[0] > 0 && w1->ne[0] <= MAX_DIM ? w1->ne[0] : 0) : 0;
    if ((rc = em_wload_int(W, ARCH ".markov_rank", false, def_rank, 0, MAX_DIM, &hp->rank, err)) ||
        (rc = em_wload_str(W, ARCH ".markov_head_type", type, sizeof type, err)))
        return rc;
    if (hp->rank == 0) {
        hp->markov = DSP_MARKOV_NONE;
        return EM_OK;
    }
    if (!type[0] || strcmp(type, "vanilla") == 0) hp->markov = DSP_MARKOV_VANILLA;
    else if (strcmp(type, "gated") == 0) hp->markov = DSP_MARKOV_GATED;
    else if (strcmp(type, "rnn") == 0) hp->markov = DSP_MARKOV_RNN;
    else
        return em_err_set(err, EM_EUNSUPPORTED, "%s: key " ARCH ".markov_head_type = '%s' (Ember knows vanilla, gated, rnn)",
                          L->path, type);
    return EM_OK;
}

static int read_hparams(loader *L, em_err *err) {
    em_wload *W = &L->wl;
    dsp_hparams *hp = &L->s->hp;
    double eps, cap, scale;
    bool anchor_first, conf;
    int rc;
    if ((rc = check_arch(W, err))) return rc;
    if ((rc = em_wload_int(W, ARCH ".embedding_length", true, 0, 1, MAX_DIM, &hp->d, err)) ||
        (rc = em_wload_int(W, ARCH ".block_count", true, 0, 1, MAX_LAYERS, &hp->n_layer, err)) ||
        (rc = em_wload_int(W, ARCH ".feed_forward_length", true, 0, 1, MAX_DIM, &hp->ff, err)) ||
        (rc = em_wload_int(W, ARCH ".attention.head_count", true, 0, 1, MAX_DIM, &hp->n_head, err)) ||
        (rc = em_wload_int(W, ARCH ".attention.head_count_kv", false, hp->n_head, 1, hp->n_head, &hp->n_kv, err)) ||
        (rc = em_wload_int(W, ARCH ".attention.key_length", false, hp->d / hp->n_head, 2, EM_ROPE_MAX_DIMS, &hp->hd, err)) ||
        (rc = em_wload_int(W, ARCH ".vocab_size", true, 0, 1, MAX_VOCAB, &hp->vocab, err)) ||
        (rc = em_wload_int(W, ARCH ".block_size", true, 0, 1, EM_DRAFT_MAX_BLOCK, &hp->block, err)) ||
        (rc = em_wload_float(W, ARCH ".attention.layer_norm_rms_epsilon", true, 0, &eps, err)) ||
        (rc = em_wload_float(W, ARCH ".final_logit_softcapping", false, 0, &cap, err)) ||
        (rc = em_wload_float(W, ARCH ".logit_scale", false, 1, &scale, err)) ||
        (rc = em_wload_bool(W, ARCH ".attention.causal", false, &hp->causal, err)))
        return rc;
    int vlen;
    if ((rc = em_wload_int(W, ARCH ".attention.value_length", false, hp->hd, 1, MAX_DIM, &vlen, err))) return rc;
    if (vlen != hp->hd)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: value_length %d differs from key_length %d", L->path, vlen, hp->hd);
    if (hp->n_head % hp->n_kv != 0)
        return em_err_set(err, EM_EFORMAT, "%s: %d query heads do not share %d KV heads evenly", L->path, hp->n_head, hp->n_kv);
    if ((int64_t)hp->n_head * hp->hd > MAX_DIM)
        return em_err_set(err, EM_EFORMAT, "%s: %d heads of %d values are too wide", L->path, hp->n_head, hp->hd);
    if (!(eps >= 0 && eps < 1))
        return em_err_set(err, EM_EFORMAT, "%s: key " ARCH ".attention.layer_norm_rms_epsilon = %g is out of range", L->path, eps);
    if (cap < 0) return em_err_set(err, EM_EFORMAT, "%s: final_logit_softcapping %g is negative", L->path, cap);
    if (scale != 1.0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: key " ARCH ".logit_scale = %g (not 1) is not supported by the drafter",
                          L->path, scale);
    hp->eps = (float)eps;
    hp->softcap = (float)cap;
    int mask;
    if ((rc = em_wload_int(W, "tokenizer.ggml.mask_token_id", true, 0, 0, hp->vocab - 1, &mask, err))) return rc;
    hp->mask_id = mask;
    if ((rc = read_markov(L, err))) return rc;
    /* the converter always states the convention; a file without it follows its mode */
    if ((rc = em_wload_bool(W, ARCH ".sample_from_anchor", hp->rank > 0, &anchor_first, err)) ||
        (rc = em_wload_bool(W, ARCH ".has_confidence_head", em_wload_has(W, "conf_proj.weight"), &conf, err)) ||
        (rc = em_wload_bool(W, ARCH ".confidence_head_with_markov", hp->rank > 0, &hp->conf_markov, err)))
        return rc;
    hp->slot0 = anchor_first ? 0 : 1;
    hp->conf = conf;
    if (hp->conf_markov && hp->rank == 0) hp->conf_markov = false; /* nothing to feed it */
    if (hp->block - hp->slot0 < 1)
        return em_err_set(err, EM_EFORMAT, "%s: block_size %d leaves no draft slot (DFlash convention: slot 0 is the anchor)",
                          L->path, hp->block);
    return read_rope(L, err);
}

/* ---- the target ----------------------------------------------------------------------- */

/* The checks that the drafter fits the target (its shape, as it states it). */
static int check_target(loader *L, em_err *err) {
    dspark *s = L->s;
    dsp_hparams *hp = &s->hp;
    const em_target_shared *T = L->t;
    const char *arch = T->arch ? T->arch : "unknown";
    if (strcmp(arch, ARCH) == 0)
        return em_err_set(err, EM_EINVAL, "drafter %s: target %s is itself a drafter", L->path, T->path);
    hp->target_embd = T->n_embd;
    hp->target_layers = T->n_layer;
    if (hp->d != hp->target_embd)
        return em_err_set(err, EM_EINVAL, "drafter %s does not fit target %s: hidden size %d (" ARCH ".embedding_length) "
                          "differs from the target's %d (%s.embedding_length)",
                          L->path, T->path, hp->d, hp->target_embd, arch);
    if (hp->vocab != T->n_vocab)
        return em_err_set(err, EM_EINVAL, "drafter %s does not fit target %s: vocabulary %d (" ARCH ".vocab_size) "
                          "differs from the target's %d", L->path, T->path, hp->vocab, T->n_vocab);
    em_draft_info *info = &s->base.info;
    for (int i = 0; i < info->n_taps; i++) {
        int t = info->taps[i];
        if (t >= hp->target_layers)
            return em_err_set(err, EM_EINVAL, "drafter %s does not fit target %s: tap %d is layer %d, but the target has "
                              "%d layers (0..%d)", L->path, T->path, i, t, hp->target_layers, hp->target_layers - 1);
        if (t == hp->target_layers - 1)
            return em_err_set(err, EM_EINVAL, "drafter %s does not fit target %s: tap %d is layer %d, the target's last "
                              "layer (drafters tap residual streams before the final norm, never the last layer)",
                              L->path, T->path, i, t);
    }
    return EM_OK;
}

/* target_layers holds llama.cpp's l + 1 (the input of layer l + 1 = the output of layer l). */
static int read_taps(const em_wload *W, em_draft_info *info, em_err *err) {
    const em_gguf_arr *a;
    int rc = em_gguf_get_arr(W->g, ARCH ".target_layers", &a, err);
    if (rc == EM_ENOTFOUND) return em_err_set(err, EM_ENOTFOUND, "%s: key " ARCH ".target_layers is missing", W->path);
    if (rc) return rc; /* the reader names the file and key */
    uint64_t n = em_gguf_arr_count(a);
    if (n < 1 || n > EM_DRAFT_MAX_TAPS)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: key " ARCH ".target_layers has %llu entries (Ember takes 1..%d)",
                          W->path, (unsigned long long)n, EM_DRAFT_MAX_TAPS);
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        if ((rc = em_gguf_arr_get_int(a, i, &v, err))) return em_err_prefix(err, "%s", W->path);
        if (v < 1 || v > MAX_LAYERS)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: key " ARCH ".target_layers[%llu] = %lld: Ember taps layer outputs "
                              "(values 1..%d; 0, the embedding, is not supported)", W->path, (unsigned long long)i,
                              (long long)v, MAX_LAYERS);
        info->taps[i] = (int)v - 1;
    }
    info->n_taps = (int)n;
    return EM_OK;
}

int em_dspark_read_taps(const char *draft_path, int *taps, int *n_taps, em_err *err) {
    em_gguf *g;
    int rc = em_gguf_open(&g, draft_path, err);
    if (rc) return rc;
    em_wload W;
    em_draft_info info = { 0 };
    em_wload_init(&W, g, NULL, NULL);
    if (!(rc = check_arch(&W, err)) && !(rc = read_taps(&W, &info, err))) {
        memcpy(taps, info.taps, (size_t)info.n_taps * sizeof *taps);
        *n_taps = info.n_taps;
    }
    em_gguf_close(g);
    return rc;
}

/* ---- weights -------------------------------------------------------------------------- */

static int load_layer(loader *L, int l, dsp_layer *y, em_err *err) {
    em_wload *W = &L->wl;
    const dsp_hparams *hp = &L->s->hp;
    const int64_t d = hp->d, qw = (int64_t)hp->n_head * hp->hd, kw = (int64_t)hp->n_kv * hp->hd;
    char n[96];
    int rc;
    if ((rc = em_wload_vec(W, NAME(n, "blk.%d.attn_norm.weight", l), d, 0, &y->attn_norm, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.ffn_norm.weight", l), d, 0, &y->ffn_norm, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.attn_q_norm.weight", l), hp->hd, 0, &y->q_norm, err)) ||
        (rc = em_wload_vec(W, NAME(n, "blk.%d.attn_k_norm.weight", l), hp->hd, 0, &y->k_norm, err)) ||
        (rc = em_wload_vec_opt(W, NAME(n, "blk.%d.attn_q.bias", l), qw, &y->bq, err)) ||
        (rc = em_wload_vec_opt(W, NAME(n, "blk.%d.attn_k.bias", l), kw, &y->bk, err)) ||
        (rc = em_wload_vec_opt(W, NAME(n, "blk.%d.attn_v.bias", l), kw, &y->bv, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_q.weight", l), d, qw, 1, &y->wq, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_k.weight", l), d, kw, 1, &y->wk, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_v.weight", l), d, kw, 1, &y->wv, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.attn_output.weight", l), qw, d, 1, &y->wo, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_gate.weight", l), d, hp->ff, 1, &y->gate, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_up.weight", l), d, hp->ff, 1, &y->up, err)) ||
        (rc = em_wload_mat(W, NAME(n, "blk.%d.ffn_down.weight", l), hp->ff, d, 1, &y->down, err)))
        return rc;
    return EM_OK;
}

/* The LM head's row count, from the first tensor that states it. */
static int draft_vocab(loader *L, em_err *err) {
    em_wload *W = &L->wl;
    dsp_hparams *hp = &L->s->hp;
    const char *names[] = { "output.weight", "markov_w2.weight", "d2t" };
    hp->dvocab = hp->vocab;
    for (int i = 0; i < 3; i++) {
        const em_gguf_tensor *t = em_gguf_find_tensor(L->g, names[i]);
        if (!t) continue;
        int64_t rows = i == 2 ? t->ne[0] : t->ne[1];
        if (rows < 1 || rows > hp->vocab)
            return em_err_set(err, EM_EFORMAT, "%s: tensor %s gives a draft vocabulary of %lld (want 1..%d)", L->path,
                              names[i], (long long)rows, hp->vocab);
        hp->dvocab = (int)rows;
        break;
    }
    if (hp->dvocab != hp->vocab && !em_wload_has(W, "d2t"))
        return em_err_set(err, EM_EFORMAT, "%s: draft vocabulary %d differs from the vocabulary %d but there is no d2t table",
                          L->path, hp->dvocab, hp->vocab);
    return EM_OK;
}

static int load_d2t(loader *L, em_err *err) {
    dspark *s = L->s;
    const dsp_hparams *hp = &s->hp;
    const em_gguf_tensor *t = em_gguf_find_tensor(L->g, "d2t");
    if (!t) return EM_OK;
    if (t->type != EM_TYPE_I64 || t->n_elements != (uint64_t)hp->dvocab || t->bytes != (uint64_t)hp->dvocab * 8)
        return em_err_set(err, EM_EFORMAT, "%s: tensor d2t must be %d I64 values (type %s, %llu values)", L->path,
                          hp->dvocab, em_type_name(t->type), (unsigned long long)t->n_elements);
    s->d2t = em_arena_alloc(s->store, (size_t)hp->dvocab * sizeof *s->d2t);
    if (!s->d2t) return em_err_set(err, EM_ENOMEM, "out of memory loading d2t");
    for (int i = 0; i < hp->dvocab; i++) {
        int64_t v;
        memcpy(&v, (const uint8_t *)t->data + (size_t)i * 8, 8);
        if (v < 0 || v >= hp->vocab)
            return em_err_set(err, EM_EFORMAT, "%s: tensor d2t[%d] = %lld is outside the vocabulary [0, %d)", L->path, i,
                              (long long)v, hp->vocab);
        s->d2t[i] = (int32_t)v;
    }
    return EM_OK;
}

/* One of the target's matrices, as it lends it (model.h em_target_shared): the same view, so
 * the drafter reads the target's copy and no second one exists. */
static int borrow(loader *L, const em_mat *m, const char *name, int64_t rows, em_mat *out, em_err *err) {
    const dsp_hparams *hp = &L->s->hp;
    if (!m)
        return em_err_set(err, EM_ENOTFOUND, "drafter %s has no %s of its own, and target %s shares none", L->path,
                          name, L->t->path);
    if (m->cols != hp->d || m->rows != rows)
        return em_err_set(err, EM_EFORMAT, "drafter %s borrows %s from target %s: it has %lld rows of %lld values, "
                          "the drafter wants %lld of %d", L->path, name, L->t->path, (long long)m->rows,
                          (long long)m->cols, (long long)rows, hp->d);
    *out = *m;
    return EM_OK;
}

/* Embedding and LM head: the drafter's own, else the target's. */
static int load_embd_head(loader *L, em_err *err) {
    dspark *s = L->s;
    em_wload *W = &L->wl;
    const dsp_hparams *hp = &s->hp;
    const char *tpath = L->t->path;
    int rc;
    if (em_wload_has(W, "token_embd.weight")) {
        if ((rc = em_wload_mat(W, "token_embd.weight", hp->d, hp->vocab, 1, &s->embd, err)) ||
            (rc = em_wload_readable(W, "token_embd.weight", s->embd.type, err))) /* rows are read as values */
            return rc;
    } else {
        if ((rc = borrow(L, L->t->token_embd, "token_embd.weight", hp->vocab, &s->embd, err))) return rc;
        const em_type_info *ti = em_type_get(s->embd.type);
        if (!ti || !ti->to_float)
            return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor token_embd.weight has type %s, which Ember cannot read",
                              tpath, em_type_name(s->embd.type));
    }
    if (em_wload_has(W, "output.weight")) return em_wload_mat(W, "output.weight", hp->d, hp->dvocab, 1, &s->head, err);
    if (hp->dvocab != hp->vocab)
        return em_err_set(err, EM_EFORMAT, "%s: a reduced draft vocabulary (%d of %d) needs the drafter's own output.weight",
                          L->path, hp->dvocab, hp->vocab);
    return borrow(L, L->t->output, "output.weight", hp->vocab, &s->head, err);
}

/* Per-position calibration temperatures (STS, dspark.md §2.5): an optional f32 array with
 * one positive value per draft slot; absent means identity. */
static int load_temps(loader *L, em_err *err) {
    dspark *s = L->s;
    const int n = s->base.info.n_drafts;
    const em_gguf_arr *a;
    int rc = em_gguf_get_arr(L->g, KEY_TEMPS, &a, err);
    if (rc == EM_ENOTFOUND) return EM_OK;
    if (rc) return rc; /* the reader names the file and key */
    if (em_gguf_arr_type(a) != EM_GGUF_F32 || em_gguf_arr_count(a) != (uint64_t)n)
        return em_err_set(err, EM_EFORMAT, "%s: key " KEY_TEMPS " must hold %d f32 values (one per draft), it holds %llu %s",
                          L->path, n, (unsigned long long)em_gguf_arr_count(a), em_gguf_type_name(em_gguf_arr_type(a)));
    float *t = em_arena_alloc(s->store, (size_t)n * sizeof *t);
    if (!t) return em_err_set(err, EM_ENOMEM, "out of memory loading " KEY_TEMPS);
    for (int i = 0; i < n; i++) {
        t[i] = em_gguf_arr_at(a, (uint64_t)i).f32;
        if (!(t[i] > 0.0f && t[i] < 1e30f))
            return em_err_set(err, EM_EFORMAT, "%s: key " KEY_TEMPS "[%d] = %g is not a positive temperature", L->path, i,
                              (double)t[i]);
    }
    s->conf_t = t;
    return EM_OK;
}

static int load_heads(loader *L, em_err *err) {
    em_wload *W = &L->wl;
    dspark *s = L->s;
    dsp_hparams *hp = &s->hp;
    const int64_t r = hp->rank, d = hp->d;
    int rc;
    if (hp->rank > 0) {
        if ((rc = em_wload_mat(W, "markov_w1.weight", r, hp->vocab, 1, &s->w1, err)) ||
            (rc = em_wload_mat(W, "markov_w2.weight", r, hp->dvocab, 1, &s->w2, err)))
            return rc;
        if ((rc = em_wload_readable(W, "markov_w1.weight", s->w1.type, err))) return rc; /* read by rows */
    }
    if (hp->markov == DSP_MARKOV_GATED &&
        ((rc = em_wload_mat(W, "markov_gate.weight", d + r, r, 1, &s->gate_w, err)) ||
         (rc = em_wload_vec(W, "markov_gate.bias", r, 0, &s->gate_b, err))))
        return rc;
    if (hp->markov == DSP_MARKOV_RNN &&
        ((rc = em_wload_mat(W, "markov_joint.weight", 2 * r + d, 3 * r, 1, &s->joint_w, err)) ||
         (rc = em_wload_vec(W, "markov_joint.bias", 3 * r, 0, &s->joint_b, err))))
        return rc;
    if (hp->conf) {
        const float *b;
        if ((rc = em_wload_vec(W, "conf_proj.weight", d + (hp->conf_markov ? r : 0), 0, &s->conf_w, err)) ||
            (rc = em_wload_vec(W, "conf_proj.bias", 1, 0, &b, err)))
            return rc;
        s->conf_b = b[0];
        if ((rc = load_temps(L, err))) return rc;
    }
    return EM_OK;
}

/* ---- cache and scratch ---------------------------------------------------------------- */

/* Grows *bytes to what em_matmul needs for n rows against m. */
static int need_act(const em_mat *m, int64_t n, uint64_t *bytes, em_err *err) {
    uint64_t b;
    int rc = em_act_bytes(m->type, m->cols, n, &b, err);
    if (!rc && b > *bytes) *bytes = b;
    return rc;
}

static int size_act(dspark *s, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int64_t R = hp->block > DSP_CHUNK ? hp->block : DSP_CHUNK, B = hp->block;
    uint64_t b = 0;
    int rc = need_act(&s->fc, R, &b, err);
    for (int l = 0; !rc && l < hp->n_layer; l++) {
        const dsp_layer *y = &s->layers[l];
        if ((rc = need_act(&y->wq, B, &b, err)) || (rc = need_act(&y->wk, R, &b, err)) ||
            (rc = need_act(&y->wv, R, &b, err)) || (rc = need_act(&y->wo, B, &b, err)) ||
            (rc = need_act(&y->gate, B, &b, err)) || (rc = need_act(&y->up, B, &b, err)) ||
            (rc = need_act(&y->down, B, &b, err)))
            break;
    }
    if (!rc) rc = need_act(&s->head, B, &b, err);
    if (!rc && hp->rank > 0) rc = need_act(&s->w2, 1, &b, err);
    if (!rc && hp->markov == DSP_MARKOV_GATED) rc = need_act(&s->gate_w, 1, &b, err);
    if (!rc && hp->markov == DSP_MARKOV_RNN) rc = need_act(&s->joint_w, 1, &b, err);
    if (rc) return rc;
    /* a group of products converts its input for at most two quantized activation types */
    const size_t cap = 2 * (size_t)em_align_up(b, 64);
    if ((rc = em_arena_create(&s->scratch, cap, err))) return rc;
    void *p = cap > 0 ? em_arena_alloc(s->scratch, cap) : NULL;
    if (cap > 0 && !p) return em_err_set(err, EM_ENOMEM, "out of memory for %zu bytes of drafter activation scratch", cap);
    if (p) memset(p, 0, cap); /* its pages now, not in the first block (alloc_touched) */
    em_arena_reset(s->scratch);
    return EM_OK;
}

/* count floats from the store (64-byte aligned), the product checked. */
static int alloc_f(dspark *s, float **out, uint64_t a, uint64_t b, const char *what, em_err *err) {
    uint64_t n, bytes;
    if (em_mul_overflow(a, b, &n) || em_mul_overflow(n, sizeof(float), &bytes) || bytes > (uint64_t)PTRDIFF_MAX)
        return em_err_set(err, EM_EOVERFLOW, "drafter %s: %llu x %llu floats overflow", what, (unsigned long long)a,
                          (unsigned long long)b);
    *out = em_arena_alloc(s->store, (size_t)(bytes ? bytes : sizeof(float)));
    if (!*out) return em_err_set(err, EM_ENOMEM, "out of memory for the drafter's %s (%llu bytes)", what,
                                 (unsigned long long)bytes);
    return EM_OK;
}

/* alloc_f, then the floats zeroed: written once here, so a buffer's pages are the process's
 * before the first block (a first write to a fresh page is a fault, several microseconds
 * each on virtual machines; a decode step should not pay them). */
static int alloc_touched(dspark *s, float **out, uint64_t a, uint64_t b, const char *what, em_err *err) {
    int rc = alloc_f(s, out, a, b, what, err);
    if (!rc) memset(*out, 0, (size_t)(a * b * sizeof(float)));
    return rc;
}

/* The vanilla Markov bias cache: as many rows of dvocab floats as fit its byte budget. */
static int alloc_bias_cache(dspark *s, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    s->slots_avg = (float)s->base.info.n_drafts;
    uint64_t row = (uint64_t)hp->dvocab * sizeof(float), n = row ? DSP_BIAS_CACHE_BYTES / row : 0;
    if (hp->markov != DSP_MARKOV_VANILLA || hp->rank <= 0 || n < 2) return EM_OK;
    if (n > DSP_BIAS_CACHE_MAX) n = DSP_BIAS_CACHE_MAX;
    s->bias_tok = em_arena_alloc(s->store, (size_t)n * sizeof *s->bias_tok);
    s->bias_used = em_arena_alloc(s->store, (size_t)n * sizeof *s->bias_used);
    int rc = s->bias_tok && s->bias_used ? alloc_f(s, &s->bias_rows, n, (uint64_t)hp->dvocab, "Markov bias cache", err)
                                         : em_err_set(err, EM_ENOMEM, "out of memory for the drafter's Markov bias cache");
    if (rc) return rc;
    for (uint64_t i = 0; i < n; i++) s->bias_tok[i] = -1, s->bias_used[i] = 0;
    s->n_bias = (int)n;
    return EM_OK;
}

static int alloc_scratch(dspark *s, const em_draft_opts *o, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const uint64_t R = (uint64_t)(hp->block > DSP_CHUNK ? hp->block : DSP_CHUNK), B = (uint64_t)hp->block;
    const uint64_t d = (uint64_t)hp->d, qw = (uint64_t)hp->n_head * hp->hd, kw = (uint64_t)hp->n_kv * hp->hd;
    const uint64_t r = (uint64_t)hp->rank, half = (uint64_t)hp->rope_dims / 2;
    uint64_t cache_rows;
    s->cap = o->n_ctx;
    if (em_mul_overflow((uint64_t)s->cap, (uint64_t)hp->n_layer, &cache_rows))
        return em_err_set(err, EM_EOVERFLOW, "drafter context cache: %lld rows overflow", (long long)s->cap);
    int rc;
    if ((rc = alloc_f(s, &s->kc, cache_rows, kw, "context K cache", err)) ||
        (rc = alloc_f(s, &s->vc, cache_rows, kw, "context V cache", err)) ||
        (rc = alloc_touched(s, &s->h, R, d, "hidden rows", err)) ||
        (rc = alloc_touched(s, &s->xn, R, d, "normed rows", err)) ||
        (rc = alloc_touched(s, &s->q, B, qw, "queries", err)) || (rc = alloc_touched(s, &s->k, R, kw, "keys", err)) ||
        (rc = alloc_touched(s, &s->v, R, kw, "values", err)) ||
        (rc = alloc_touched(s, &s->att, B, qw, "attention", err)) ||
        (rc = alloc_touched(s, &s->fg, B, (uint64_t)hp->ff, "ffn gate", err)) ||
        (rc = alloc_touched(s, &s->fu, B, (uint64_t)hp->ff, "ffn up", err)) ||
        (rc = alloc_touched(s, &s->o, B, d, "outputs", err)) ||
        (rc = alloc_touched(s, &s->base_logits, B, (uint64_t)hp->dvocab, "base logits", err)) ||
        (rc = alloc_touched(s, &s->bias, 1, (uint64_t)hp->dvocab, "Markov bias", err)) ||
        (rc = alloc_touched(s, &s->row, 1, (uint64_t)hp->vocab, "logit row", err)) ||
        (rc = alloc_touched(s, &s->cs, R, half, "rope cos", err)) ||
        (rc = alloc_touched(s, &s->sn, R, half, "rope sin", err)) ||
        (rc = alloc_touched(s, &s->scores, (uint64_t)em_pool_threads(s->pool) * (uint64_t)dsp_attn_rows(s),
                            (uint64_t)s->cap + B, "attention scores", err)) ||
        (rc = alloc_touched(s, &s->e, 1, r + 1, "Markov embedding", err)) ||
        (rc = alloc_touched(s, &s->state, 1, r + 1, "Markov state", err)) ||
        (rc = alloc_touched(s, &s->zin, 1, 2 * r + d, "head input", err)) ||
        (rc = alloc_touched(s, &s->zout, 1, 3 * r + 1, "head output", err)) ||
        (rc = alloc_touched(s, &s->tmp, 1, r + 1, "Markov scratch", err)))
        return rc;
    if ((rc = alloc_bias_cache(s, err))) return rc;
    return size_act(s, err);
}

/* ---- cost ------------------------------------------------------------------------------ */

static double mat_bytes(const em_mat *m) { return m->data ? (double)m->row_bytes * (double)m->rows : 0.0; }
static double mat_params(const em_mat *m) { return m->data ? (double)m->rows * (double)m->cols : 0.0; }

/* The fixed part of one propose, and the context rows a pass adds (about one per committed
 * token, through fc and each layer's K/V), at the nominal rates of compute.h: the B block rows
 * through every layer, and the LM head and Markov up-projection read once. Attention over the
 * context is left out (small next to the weights at the contexts a drafter serves). */
static double block_seconds(const dspark *s) {
    const dsp_hparams *hp = &s->hp;
    double bytes = mat_bytes(&s->fc) + mat_bytes(&s->head) + mat_bytes(&s->w2);
    double flops = 2.0 * mat_params(&s->fc);
    for (int l = 0; l < hp->n_layer; l++) {
        const dsp_layer *y = &s->layers[l];
        const em_mat *m[] = { &y->wq, &y->wk, &y->wv, &y->wo, &y->gate, &y->up, &y->down };
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
            bytes += mat_bytes(m[i]);
            flops += 2.0 * hp->block * mat_params(m[i]);
        }
        flops += 2.0 * (mat_params(&y->wk) + mat_params(&y->wv)); /* one context row */
    }
    const em_device_costs dev = em_device_costs_cpu(em_pool_threads(s->pool));
    return em_device_seconds(&dev, &(em_work){ .bytes = bytes, .flops = { [EM_WORK_WEIGHTS] = flops } });
}

/* What one more draft slot adds: propose makes a slot's LM head row and Markov bias only
 * once the caller keeps it (em_draft_out.keep), so slots past the verified ones cost nothing.
 * The bias is charged every slot as if the per-token cache missed (a fixed estimate that
 * depends on nothing timed or seen). */
static double slot_seconds(const dspark *s) {
    const em_device_costs dev = em_device_costs_cpu(em_pool_threads(s->pool));
    const double flops = 2.0 * (mat_params(&s->head) + mat_params(&s->w2));
    return em_device_seconds(&dev, &(em_work){ .flops = { [EM_WORK_WEIGHTS] = flops } });
}

/* ---- warming -------------------------------------------------------------------------- */

/* Reads one byte of every page of a mapped matrix, so the mapping's page-table entries exist
 * before the first block (each first read of a file page is a fault). */
static uint8_t touch_mat(const em_mat *m) {
    const volatile uint8_t *p = m->data;
    const uint64_t bytes = m->data ? m->row_bytes * (uint64_t)m->rows : 0;
    uint8_t x = 0;
    for (uint64_t o = 0; o < bytes; o += 4096) x ^= p[o];
    return bytes ? x ^ p[bytes - 1] : x;
}

/* The weights every block or context row reads whole (not the embedding or Markov W1, of
 * which a block reads a few rows): touched at open, so the first passes do not pay a fault per
 * page (about 2 us each on virtual machines) on top of their work. Values are not changed. */
static void warm_weights(const dspark *s) {
    uint8_t x = touch_mat(&s->fc) ^ touch_mat(&s->head) ^ touch_mat(&s->w2) ^ touch_mat(&s->gate_w) ^
                touch_mat(&s->joint_w);
    for (int l = 0; l < s->hp.n_layer; l++) {
        const dsp_layer *y = &s->layers[l];
        const em_mat *m[] = { &y->wq, &y->wk, &y->wv, &y->wo, &y->gate, &y->up, &y->down };
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) x ^= touch_mat(m[i]);
    }
    (void)x;
}

/* ---- open / close --------------------------------------------------------------------- */

static int load_all(loader *L, const em_draft_opts *o, em_err *err) {
    em_wload *W = &L->wl;
    dspark *s = L->s;
    dsp_hparams *hp = &s->hp;
    em_draft_info *info = &s->base.info;
    int rc;
    if ((rc = read_hparams(L, err)) || (rc = read_taps(W, info, err))) return rc;
    info->device = "cpu";
    info->block_size = hp->block;
    info->n_drafts = hp->block - hp->slot0;
    info->n_vocab = hp->vocab;
    info->has_confidence = hp->conf;
    if ((rc = check_target(L, err))) return rc;
    info->n_feat = info->n_taps * hp->target_embd;
    if ((rc = draft_vocab(L, err)) ||
        (rc = em_wload_mat(W, "fc.weight", info->n_feat, hp->d, 1, &s->fc, err)) ||
        (rc = em_wload_vec(W, "enc.output_norm.weight", hp->d, 0, &s->hidden_norm, err)) ||
        (rc = em_wload_vec(W, "output_norm.weight", hp->d, 0, &s->out_norm, err)))
        return rc;
    s->layers = em_calloc((size_t)hp->n_layer, sizeof *s->layers, "drafter layers", err);
    if (!s->layers) return EM_ENOMEM;
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = load_layer(L, l, &s->layers[l], err))) return rc;
    if ((rc = load_embd_head(L, err)) || (rc = load_d2t(L, err)) || (rc = load_heads(L, err))) return rc;
    if ((rc = em_pool_create(&s->pool, o->n_threads, err))) return rc;
    info->block_seconds = block_seconds(s);
    info->slot_seconds = slot_seconds(s);
    warm_weights(s);
    return alloc_scratch(s, o, err);
}

int dsp_load(dspark *s, const char *draft_path, const em_target_shared *target, const em_draft_opts *o,
             em_err *err) {
    int rc;
    if (!(s->path = em_strdup(draft_path, err))) return EM_ENOMEM;
    if ((rc = em_arena_create(&s->store, 1u << 20, err))) return rc;
    if ((rc = em_gguf_open_ex(&s->g, draft_path, &(em_gguf_open_opts){ .guard_mapping = true }, err))) return rc;
    loader L = { .s = s, .t = target };
    em_wload_init(&L.wl, s->g, s->store, NULL);
    if (!o->device || !strncmp(o->device, "cpu", 3)) /* a device drafter uploads the rows as stored */
        L.wl.pack_budget = em_mat_pack_budget();
    L.g = L.wl.g, L.path = L.wl.path;
    return load_all(&L, o, err);
}

void dsp_unload(dspark *s) {
    if (s->pool) em_pool_free(s->pool);
    if (s->scratch) em_arena_free(s->scratch);
    free(s->layers);
    if (s->store) em_arena_free(s->store);
    if (s->g) em_gguf_close(s->g);
    free(s->path);
}
