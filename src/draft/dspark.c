/* draft/dspark.c: the DSpark / DFlash drafter's forward pass (dspark.md §1.3-§1.6, §2.2-§2.5).
 *
 *  add_context: Hctx = hidden_norm(fc(taps)) per committed position p; each layer keeps
 *               k_norm(Wk Hctx [+ bk]) roped at p and Wv Hctx [+ bv] in its context cache.
 *  propose:     the block [anchor, mask x (B-1)] at positions n_ctx .. n_ctx+B-1 runs the
 *               Qwen3 layers, attending over [context cache ; block] (non-causal unless the
 *               file says causal); final norm; LM head for the draft slots only (all B for
 *               DSpark, slots 1..B-1 for DFlash); then, left to right, the Markov bias of the
 *               previously chosen token (the anchor for the first draft), the confidence
 *               logit, and the caller's choice.
 *
 * Invariants: the cache holds context rows only (the block never enters it), rows < n_ctx
 * are valid; every buffer was sized at open, so nothing here allocates. Logits handed out are
 * in the target's vocabulary (a d2t table scatters draft ids; ids it cannot reach are -inf). */
#include "draft/dspark_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- small row helpers ---------------------------------------------------------------- */

static void add_bias(float *y, const float *b, int64_t n_rows, int64_t w) {
    if (!b) return;
    for (int64_t i = 0; i < n_rows; i++)
        for (int64_t j = 0; j < w; j++) y[i * w + j] += b[j];
}

/* RMSNorm of every head of every row (head h of row i at x + i*w + h*hd), in place. */
static void norm_heads(float *x, int64_t n_rows, int n_heads, int hd, const float *wt, float eps) {
    for (int64_t i = 0; i < n_rows * n_heads; i++) em_rmsnorm(x + i * hd, wt, eps, hd, x + i * hd);
}

static void rope_rows(const dspark *s, float *x, int64_t n_rows, int n_heads, int64_t pos0) {
    const int hd = s->hp.hd;
    for (int64_t i = 0; i < n_rows; i++) {
        em_rope_cos_sin(&s->rope, pos0 + i, s->cs, s->sn);
        em_rope_apply(x + i * (int64_t)n_heads * hd, n_heads, hd, s->hp.rope_dims, s->cs, s->sn);
    }
}

static int mm(dspark *s, const em_mat *w, const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy,
              em_err *err) {
    return em_matmul(s->pool, w, x, ldx, n, y, ldy, s->act, err);
}

/* ---- context -------------------------------------------------------------------------- */

static int add_chunk(dspark *s, const float *feats, int n, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int64_t d = hp->d, kw = (int64_t)hp->n_kv * hp->hd, p0 = s->base.info.n_ctx;
    int rc = mm(s, &s->fc, feats, s->base.info.n_feat, n, s->h, d, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) em_rmsnorm(s->h + i * d, s->hidden_norm, hp->eps, d, s->h + i * d);
    for (int l = 0; l < hp->n_layer; l++) {
        const dsp_layer *y = &s->layers[l];
        float *kc = s->kc + ((int64_t)l * s->cap + p0) * kw, *vc = s->vc + ((int64_t)l * s->cap + p0) * kw;
        if ((rc = mm(s, &y->wk, s->h, d, n, kc, kw, err)) || (rc = mm(s, &y->wv, s->h, d, n, vc, kw, err))) return rc;
        add_bias(kc, y->bk, n, kw);
        add_bias(vc, y->bv, n, kw);
        norm_heads(kc, n, hp->n_kv, hp->hd, y->k_norm, hp->eps);
        rope_rows(s, kc, n, hp->n_kv, p0);
    }
    s->base.info.n_ctx += n;
    return EM_OK;
}

static int dsp_add_context(em_drafter *d, const float *feats, int n, em_err *err) {
    dspark *s = (dspark *)d;
    if ((int64_t)n > s->cap - s->base.info.n_ctx)
        return em_err_set(err, EM_EOVERFLOW, "drafter %s: %d context rows do not fit (%lld of %lld held; open with a "
                          "larger n_ctx)", s->path, n, (long long)s->base.info.n_ctx, (long long)s->cap);
    for (int done = 0; done < n;) {
        int c = n - done < DSP_CHUNK ? n - done : DSP_CHUNK;
        int rc = add_chunk(s, feats + (int64_t)done * s->base.info.n_feat, c, err);
        if (rc) return rc;
        done += c;
    }
    return EM_OK;
}

/* ---- block attention ------------------------------------------------------------------ */

typedef struct attn_job {
    dspark *s;
    int layer;
    em_dot_fn dot; /* the F32 x F32 dot kernel (SIMD where the CPU has it) */
} attn_job;

/* One (block row, query head) pair: softmax(q . K / sqrt(hd)) V over [cache ; block]. */
static void attn_task(void *ctx, int task, int thread) {
    const attn_job *job = ctx;
    dspark *s = job->s;
    const dsp_hparams *hp = &s->hp;
    const int B = hp->block, hd = hp->hd, i = task / hp->n_head, h = task % hp->n_head;
    const int g = h / (hp->n_head / hp->n_kv);
    const int64_t kw = (int64_t)hp->n_kv * hd, qw = (int64_t)hp->n_head * hd, n_ctx = s->base.info.n_ctx;
    const int n_blk = hp->causal ? i + 1 : B;
    const float *q = s->q + i * qw + (int64_t)h * hd;
    const float *kc = s->kc + (int64_t)job->layer * s->cap * kw + (int64_t)g * hd;
    const float *vc = s->vc + (int64_t)job->layer * s->cap * kw + (int64_t)g * hd;
    float *sc = s->scores + (int64_t)thread * (s->cap + B);
    const float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int64_t j = 0; j < n_ctx + n_blk; j++) {
        const float *k = j < n_ctx ? kc + j * kw : s->k + (j - n_ctx) * kw + (int64_t)g * hd;
        sc[j] = job->dot(k, q, hd) * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n_ctx + n_blk; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    const float inv = (float)(1.0 / sum);
    float *out = s->att + i * qw + (int64_t)h * hd;
    memset(out, 0, (size_t)hd * sizeof *out);
    for (int64_t j = 0; j < n_ctx + n_blk; j++) {
        const float *v = j < n_ctx ? vc + j * kw : s->v + (j - n_ctx) * kw + (int64_t)g * hd;
        em_axpy(sc[j] * inv, v, hd, out);
    }
}

/* ---- the block ------------------------------------------------------------------------ */

static void embed_block(dspark *s, int32_t anchor) {
    const dsp_hparams *hp = &s->hp;
    const em_type_info *ti = em_type_get(s->embd.type);
    for (int i = 0; i < hp->block; i++) {
        int32_t tok = i == 0 ? anchor : hp->mask_id;
        ti->to_float((const uint8_t *)s->embd.data + (uint64_t)tok * s->embd.row_bytes, s->h + (int64_t)i * hp->d, hp->d);
    }
}

static int run_layer(dspark *s, int l, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const dsp_layer *y = &s->layers[l];
    const int64_t B = hp->block, d = hp->d, qw = (int64_t)hp->n_head * hp->hd, kw = (int64_t)hp->n_kv * hp->hd;
    const int64_t pos0 = s->base.info.n_ctx;
    int rc;
    for (int64_t i = 0; i < B; i++) em_rmsnorm(s->h + i * d, y->attn_norm, hp->eps, d, s->xn + i * d);
    if ((rc = mm(s, &y->wq, s->xn, d, B, s->q, qw, err)) || (rc = mm(s, &y->wk, s->xn, d, B, s->k, kw, err)) ||
        (rc = mm(s, &y->wv, s->xn, d, B, s->v, kw, err)))
        return rc;
    add_bias(s->q, y->bq, B, qw);
    add_bias(s->k, y->bk, B, kw);
    add_bias(s->v, y->bv, B, kw);
    norm_heads(s->q, B, hp->n_head, hp->hd, y->q_norm, hp->eps);
    norm_heads(s->k, B, hp->n_kv, hp->hd, y->k_norm, hp->eps);
    rope_rows(s, s->q, B, hp->n_head, pos0);
    rope_rows(s, s->k, B, hp->n_kv, pos0);
    attn_job job = { .s = s, .layer = l, .dot = em_dot_get(EM_TYPE_F32) };
    em_pool_run(s->pool, (int)B * hp->n_head, attn_task, &job);
    if ((rc = mm(s, &y->wo, s->att, qw, B, s->o, d, err))) return rc;
    for (int64_t i = 0; i < B * d; i++) s->h[i] += s->o[i];
    for (int64_t i = 0; i < B; i++) em_rmsnorm(s->h + i * d, y->ffn_norm, hp->eps, d, s->xn + i * d);
    if ((rc = mm(s, &y->gate, s->xn, d, B, s->fg, hp->ff, err)) || (rc = mm(s, &y->up, s->xn, d, B, s->fu, hp->ff, err)))
        return rc;
    em_swiglu(s->fg, s->fu, B * hp->ff, s->fg);
    if ((rc = mm(s, &y->down, s->fg, hp->ff, B, s->o, d, err))) return rc;
    for (int64_t i = 0; i < B * d; i++) s->h[i] += s->o[i];
    return EM_OK;
}

/* Backbone, final norm (into s->xn) and base logits of the draft slots. */
static int run_block(dspark *s, int32_t anchor, int n_slots, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int64_t d = hp->d;
    embed_block(s, anchor);
    for (int l = 0; l < hp->n_layer; l++) {
        int rc = run_layer(s, l, err);
        if (rc) return rc;
    }
    for (int i = 0; i < hp->block; i++) em_rmsnorm(s->h + i * d, s->out_norm, hp->eps, d, s->xn + i * d);
    int rc = mm(s, &s->head, s->xn + (int64_t)hp->slot0 * d, d, n_slots, s->base_logits, hp->dvocab, err);
    if (rc) return rc;
    if (hp->softcap > 0) {
        const float c = hp->softcap;
        for (int64_t i = 0; i < (int64_t)n_slots * hp->dvocab; i++) s->base_logits[i] = c * tanhf(s->base_logits[i] / c);
    }
    return EM_OK;
}

/* ---- Markov and confidence heads ------------------------------------------------------ */

/* s->bias = the Markov bias of slot k given the previous token; s->e = W1[prev]. */
static int markov_bias(dspark *s, const float *hk, int32_t prev, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int r = hp->rank, d = hp->d;
    const em_type_info *ti = em_type_get(s->w1.type);
    ti->to_float((const uint8_t *)s->w1.data + (uint64_t)prev * s->w1.row_bytes, s->e, r);
    const float *in = s->e;
    int rc;
    if (hp->markov == DSP_MARKOV_GATED) {
        /* g = sigmoid(gate([h ; e])), bias = W2 (g * e) */
        memcpy(s->zin, hk, (size_t)d * sizeof(float));
        memcpy(s->zin + d, s->e, (size_t)r * sizeof(float));
        if ((rc = mm(s, &s->gate_w, s->zin, d + r, 1, s->zout, r, err))) return rc;
        for (int i = 0; i < r; i++) s->tmp[i] = em_sigmoidf(s->zout[i] + s->gate_b[i]) * s->e[i];
        in = s->tmp;
    } else if (hp->markov == DSP_MARKOV_RNN) {
        /* z = [s ; e ; h]; (a, c, o) = joint(z); g = sigmoid(a); s = g s + (1-g) tanh(c);
         * bias = W2 tanh(o) */
        memcpy(s->zin, s->state, (size_t)r * sizeof(float));
        memcpy(s->zin + r, s->e, (size_t)r * sizeof(float));
        memcpy(s->zin + 2 * r, hk, (size_t)d * sizeof(float));
        if ((rc = mm(s, &s->joint_w, s->zin, 2 * r + d, 1, s->zout, 3 * r, err))) return rc;
        for (int i = 0; i < r; i++) {
            float a = s->zout[i] + s->joint_b[i], c = s->zout[r + i] + s->joint_b[r + i];
            float o = s->zout[2 * r + i] + s->joint_b[2 * r + i];
            float g = em_sigmoidf(a);
            s->state[i] = g * s->state[i] + (1.0f - g) * tanhf(c);
            s->tmp[i] = tanhf(o);
        }
        in = s->tmp;
    }
    return mm(s, &s->w2, in, r, 1, s->bias, hp->dvocab, err);
}

/* z_k = w . [h ; W1[prev]] + b, over the calibration temperature of draft k when present. */
static float confidence(const dspark *s, const float *hk, int k) {
    const dsp_hparams *hp = &s->hp;
    double z = s->conf_b;
    for (int i = 0; i < hp->d; i++) z += (double)s->conf_w[i] * hk[i];
    if (hp->conf_markov)
        for (int i = 0; i < hp->rank; i++) z += (double)s->conf_w[hp->d + i] * s->e[i];
    if (s->conf_t) z /= s->conf_t[k];
    return (float)z;
}

/* Slot k's corrected logits in the target vocabulary, into dst [vocab]. */
static void target_logits(const dspark *s, const float *base, bool with_bias, float *dst) {
    const dsp_hparams *hp = &s->hp;
    if (!s->d2t) {
        for (int i = 0; i < hp->vocab; i++) dst[i] = base[i] + (with_bias ? s->bias[i] : 0.0f);
        return;
    }
    for (int i = 0; i < hp->vocab; i++) dst[i] = -INFINITY;
    for (int i = 0; i < hp->dvocab; i++) dst[s->d2t[i]] = base[i] + (with_bias ? s->bias[i] : 0.0f);
}

static int dsp_propose(em_drafter *d, int32_t anchor, int n_max, em_draft_choose choose, void *ud,
                       em_draft_out *out, em_err *err) {
    dspark *s = (dspark *)d;
    const dsp_hparams *hp = &s->hp;
    const int n = n_max < d->info.n_drafts ? n_max : d->info.n_drafts;
    int rc = run_block(s, anchor, n, err);
    if (rc) return rc;
    if (hp->markov == DSP_MARKOV_RNN) memset(s->state, 0, (size_t)hp->rank * sizeof(float));
    int32_t prev = anchor;
    for (int k = 0; k < n; k++) {
        const float *hk = s->xn + (int64_t)(hp->slot0 + k) * hp->d;
        if (hp->rank > 0 && (rc = markov_bias(s, hk, prev, err))) return rc;
        float *row = out->logits ? out->logits + (int64_t)k * hp->vocab : s->row;
        target_logits(s, s->base_logits + (int64_t)k * hp->dvocab, hp->rank > 0, row);
        if (hp->conf && out->conf_logits) out->conf_logits[k] = confidence(s, hk, k);
        int32_t tok = choose(ud, k, row);
        if (tok < 0) break;
        if (tok >= hp->vocab)
            return em_err_set(err, EM_EINVAL, "drafter %s: the chooser picked token %d at slot %d, outside the vocabulary "
                              "[0, %d)", s->path, (int)tok, k, hp->vocab);
        out->tokens[k] = tok;
        out->n = k + 1;
        prev = tok;
    }
    return EM_OK;
}

/* ---- lifetime ------------------------------------------------------------------------- */

static void dsp_reset(em_drafter *d) { d->info.n_ctx = 0; }

static void dsp_close(em_drafter *d) {
    dspark *s = (dspark *)d;
    dsp_unload(s);
    free(s);
}

static const em_drafter_ops dsp_ops = {
    .add_context = dsp_add_context,
    .propose = dsp_propose,
    .reset = dsp_reset,
    .close = dsp_close,
};

int em_dspark_open(em_drafter **out, const char *draft_path, const char *target_path,
                   const em_draft_opts *opts, em_err *err) {
    dspark *s = em_calloc(1, sizeof *s, "drafter", err);
    if (!s) return EM_ENOMEM;
    s->base.ops = &dsp_ops;
    int rc = dsp_load(s, draft_path, target_path, opts, err);
    if (rc) {
        dsp_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return EM_OK;
}
