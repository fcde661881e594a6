/* draft/dspark.c: the DSpark / DFlash drafter's forward pass (dspark.md §1.3-§1.6, §2.2-§2.5).
 *
 *  add_context: Hctx = hidden_norm(fc(taps)) per committed position p; each layer keeps
 *               k_norm(Wk Hctx [+ bk]) roped at p and Wv Hctx [+ bv] in its context cache.
 *  propose:     the block [anchor, mask x (B-1)] at positions n_ctx .. n_ctx+B-1 runs the
 *               Qwen3 layers, attending over [context cache ; block] (non-causal unless the
 *               file says causal); final norm; then, left to right over the draft slots
 *               (all B for DSpark, slots 1..B-1 for DFlash): the confidence logit (and the
 *               keep test, which may end the block there), the slot's LM head row
 *               (computed in pieces of several slots), the Markov bias of the previously
 *               chosen token (the anchor for the first draft; vanilla biases are cached by
 *               token, they depend on nothing else), and the pick; the keep test and the
 *               pick follow the caller's chain (draft.h) through draft.c's rules, so the
 *               whole chain runs here without a call into the caller per slot.
 *               Attention runs one pool task per (block row, query head) on compute's
 *               fixed-order score / softmax / weighted-row helpers (those MLA uses); the FFN's
 *               gate and up products and their SwiGLU share one pool run (tasks by ff rows).
 *
 * Invariants: the cache holds context rows only (the block never enters it), rows < n_ctx
 * are valid; every buffer was sized at open, so nothing here allocates. Logits handed out are
 * in the target's vocabulary (a d2t table scatters draft ids; ids it cannot reach are -inf). */
#include "draft/dspark_impl.h"

#include <assert.h>
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

/* cos/sin of positions pos0 .. pos0+n_rows-1 into s->cs / s->sn (row i at i * rope_dims/2),
 * once per block or chunk: every layer and both q and k rotate by the same angles. */
static void rope_table(dspark *s, int64_t n_rows, int64_t pos0) {
    const int64_t half = s->hp.rope_dims / 2;
    for (int64_t i = 0; i < n_rows; i++) em_rope_cos_sin(&s->rope, pos0 + i, s->cs + i * half, s->sn + i * half);
}

/* Rotates n_rows rows of n_heads heads by the angles of rope_table. */
static void rope_rows(const dspark *s, float *x, int64_t n_rows, int n_heads) {
    const int hd = s->hp.hd;
    const int64_t half = s->hp.rope_dims / 2;
    for (int64_t i = 0; i < n_rows; i++)
        em_rope_apply(x + i * (int64_t)n_heads * hd, n_heads, hd, s->hp.rope_dims, s->cs + i * half, s->sn + i * half);
}

/* y = W x over n rows, through compute's activation cache (scratch reset per product group:
 * sized at open for the conversions of one group, so nothing here allocates). */
static int mm(dspark *s, const em_mat *w, const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy,
              em_err *err) {
    em_arena_reset(s->scratch);
    em_acts a;
    em_acts_init(&a, x, ldx, w->cols, n);
    return em_mm(&a, w, y, ldy, s->pool, s->scratch, err);
}

#define DSP_SAME_INPUT_MAX 8

/* y_i = W_i x for several matrices (at most DSP_SAME_INPUT_MAX) over the same n rows x, in
 * one pool run, the rows converted once per activation type (em_mm_many). Each output is
 * exactly what mm would give. */
static int mm_same_input(dspark *s, const em_mat *const *w, float *const *y, const int64_t *ldy, int n_w,
                         const float *x, int64_t ldx, int64_t n, em_err *err) {
    em_arena_reset(s->scratch);
    em_acts a;
    em_acts_init(&a, x, ldx, w[0]->cols, n);
    em_mm_out out[DSP_SAME_INPUT_MAX];
    assert(n_w <= DSP_SAME_INPUT_MAX);
    for (int i = 0; i < n_w; i++) out[i] = (em_mm_out){ .x = &a, .w = w[i], .y = y[i], .ldy = ldy[i] };
    return em_mm_many(out, n_w, s->pool, s->scratch, err);
}

/* ---- context -------------------------------------------------------------------------- */

static int add_chunk(dspark *s, const float *feats, int n, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int64_t d = hp->d, kw = (int64_t)hp->n_kv * hp->hd, p0 = s->base.info.n_ctx;
    int rc = mm(s, &s->fc, feats, s->base.info.n_feat, n, s->h, d, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) em_rmsnorm(s->h + i * d, s->hidden_norm, hp->eps, d, s->h + i * d);
    rope_table(s, n, p0);
    /* every layer's K and V read the same rows: their products go out together, a few layers
     * per pool run */
    const int per_run = DSP_SAME_INPUT_MAX / 2;
    for (int l0 = 0; l0 < hp->n_layer; l0 += per_run) {
        const int nl = hp->n_layer - l0 < per_run ? hp->n_layer - l0 : per_run;
        const em_mat *w[DSP_SAME_INPUT_MAX];
        float *out[DSP_SAME_INPUT_MAX];
        int64_t ld[DSP_SAME_INPUT_MAX];
        for (int i = 0; i < nl; i++) {
            const dsp_layer *y = &s->layers[l0 + i];
            w[2 * i] = &y->wk, w[2 * i + 1] = &y->wv;
            out[2 * i] = s->kc + ((int64_t)(l0 + i) * s->cap + p0) * kw;
            out[2 * i + 1] = s->vc + ((int64_t)(l0 + i) * s->cap + p0) * kw;
            ld[2 * i] = ld[2 * i + 1] = kw;
        }
        if ((rc = mm_same_input(s, w, out, ld, 2 * nl, s->h, d, n, err))) return rc;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        const dsp_layer *y = &s->layers[l];
        float *kc = s->kc + ((int64_t)l * s->cap + p0) * kw, *vc = s->vc + ((int64_t)l * s->cap + p0) * kw;
        add_bias(kc, y->bk, n, kw);
        add_bias(vc, y->bv, n, kw);
        norm_heads(kc, n, hp->n_kv, hp->hd, y->k_norm, hp->eps);
        rope_rows(s, kc, n, hp->n_kv);
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
    int rows; /* block rows a task takes (dsp_attn_rows) */
} attn_job;

/* Block rows i0 .. i0 + rows - 1 of one query head h: softmax(q . K / sqrt(hd)) V over [cache ;
 * block] for each. The rows' queries pass over the head's cache rows together (em_dot_rows_multi,
 * em_weighted_rows_multi: the cache read once for all of them, not once per row), each score
 * and each output value in the one-query order, so the floats do not depend on the grouping. */
static void attn_task(void *ctx, int task, int thread) {
    const attn_job *job = ctx;
    dspark *s = job->s;
    const dsp_hparams *hp = &s->hp;
    const int B = hp->block, hd = hp->hd, groups = (B + job->rows - 1) / job->rows;
    const int h = task / groups, i0 = task % groups * job->rows;
    const int nq = B - i0 < job->rows ? B - i0 : job->rows, g = h / (hp->n_head / hp->n_kv);
    const int64_t kw = (int64_t)hp->n_kv * hd, qw = (int64_t)hp->n_head * hd, n_ctx = s->base.info.n_ctx;
    const int64_t lds = s->cap + B;
    const float *q = s->q + i0 * qw + (int64_t)h * hd;
    const float *kc = s->kc + (int64_t)job->layer * s->cap * kw + (int64_t)g * hd;
    const float *vc = s->vc + (int64_t)job->layer * s->cap * kw + (int64_t)g * hd;
    float *sc = s->scores + (int64_t)thread * job->rows * lds;
    const float scale = 1.0f / sqrtf((float)hd);
    int64_t m[EM_DRAFT_MAX_BLOCK];
    em_dot_rows_multi(kc, kw, n_ctx, q, qw, nq, hd, scale, sc, lds);
    em_dot_rows_multi(s->k + (int64_t)g * hd, kw, B, q, qw, nq, hd, scale, sc + n_ctx, lds); /* causal: the
                                                                     rows past a query's are not used */
    for (int t = 0; t < nq; t++) {
        m[t] = n_ctx;
        em_softmax_poly(sc + t * lds, n_ctx + (hp->causal ? i0 + t + 1 : B));
    }
    float *out = s->att + i0 * qw + (int64_t)h * hd;
    em_weighted_rows_multi(sc, lds, m, nq, vc, kw, hd, out, qw); /* zeros when n_ctx is 0 */
    for (int t = 0; t < nq; t++) {
        const int n_blk = hp->causal ? i0 + t + 1 : B;
        for (int j = 0; j < n_blk; j++)
            em_axpy(sc[t * lds + n_ctx + j], s->v + (int64_t)j * kw + (int64_t)g * hd, hd, out + t * qw);
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

/* ---- the feed-forward's first half ----------------------------------------------------- */

/* FFN_TASK_ROWS rows of gate and up per task: each task makes its columns of both products for
 * every block row, then their SwiGLU, so the activation runs on all threads inside the
 * products' own pool run instead of on the caller after it. */
#define FFN_TASK_ROWS 64

typedef struct ffn_job {
    dspark *s;
    const dsp_layer *y;
    const em_act *act; /* the normed block rows, prepared for gate/up */
    int64_t per;       /* ff rows per task */
} ffn_job;

static void ffn_task(void *ctx, int task, int thread) {
    (void)thread;
    const ffn_job *job = ctx;
    dspark *s = job->s;
    const int64_t ff = job->s->hp.ff, B = s->hp.block, r0 = task * job->per;
    const int64_t n = ff - r0 < job->per ? ff - r0 : job->per;
    const em_mat g = em_mat_rows(&job->y->gate, r0, n), u = em_mat_rows(&job->y->up, r0, n);
    /* shapes were checked at open (size_act): a slice of a valid product cannot fail; with
     * no pool it runs right here, on this task's thread */
    int rc = em_matmul_act(NULL, &g, job->act, s->fg + r0, ff, NULL);
    if (!rc) rc = em_matmul_act(NULL, &u, job->act, s->fu + r0, ff, NULL);
    assert(rc == EM_OK);
    (void)rc;
    for (int64_t i = 0; i < B; i++) em_swiglu(s->fg + i * ff + r0, s->fu + i * ff + r0, n, s->fg + i * ff + r0);
}

/* s->fg = swiglu(gate xn, up xn) over the block rows: the same floats as the two products then
 * em_swiglu over the whole rows (a product's outputs do not depend on how its weight rows are
 * split, and SwiGLU is element by element). */
static int gate_up(dspark *s, const dsp_layer *y, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int64_t B = hp->block, d = hp->d;
    if (em_dot_act_type(y->gate.type) != em_dot_act_type(y->up.type)) { /* one act per task needs one type */
        const em_mat *wgu[] = { &y->gate, &y->up };
        float *const gu[] = { s->fg, s->fu };
        const int64_t ld_gu[] = { hp->ff, hp->ff };
        int rc = mm_same_input(s, wgu, gu, ld_gu, 2, s->xn, d, B, err);
        if (!rc) em_swiglu(s->fg, s->fu, B * hp->ff, s->fg);
        return rc;
    }
    em_arena_reset(s->scratch);
    em_acts a;
    em_acts_init(&a, s->xn, d, d, B);
    const em_act *act;
    int rc = em_acts_for(&a, y->gate.type, s->pool, s->scratch, &act, err);
    if (rc) return rc;
    ffn_job job = { .s = s, .y = y, .act = act, .per = FFN_TASK_ROWS };
    em_pool_run(s->pool, (int)((hp->ff + job.per - 1) / job.per), ffn_task, &job);
    return EM_OK;
}

static int run_layer(dspark *s, int l, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const dsp_layer *y = &s->layers[l];
    const int64_t B = hp->block, d = hp->d, qw = (int64_t)hp->n_head * hp->hd, kw = (int64_t)hp->n_kv * hp->hd;
    int rc;
    for (int64_t i = 0; i < B; i++) em_rmsnorm(s->h + i * d, y->attn_norm, hp->eps, d, s->xn + i * d);
    const em_mat *wqkv[] = { &y->wq, &y->wk, &y->wv };
    float *const qkv[] = { s->q, s->k, s->v };
    const int64_t ld_qkv[] = { qw, kw, kw };
    if ((rc = mm_same_input(s, wqkv, qkv, ld_qkv, 3, s->xn, d, B, err))) return rc;
    add_bias(s->q, y->bq, B, qw);
    add_bias(s->k, y->bk, B, kw);
    add_bias(s->v, y->bv, B, kw);
    norm_heads(s->q, B, hp->n_head, hp->hd, y->q_norm, hp->eps);
    norm_heads(s->k, B, hp->n_kv, hp->hd, y->k_norm, hp->eps);
    rope_rows(s, s->q, B, hp->n_head);
    rope_rows(s, s->k, B, hp->n_kv);
    attn_job job = { .s = s, .layer = l, .rows = dsp_attn_rows(s) };
    em_pool_run(s->pool, hp->n_head * (int)((B + job.rows - 1) / job.rows), attn_task, &job);
    if ((rc = mm(s, &y->wo, s->att, qw, B, s->o, d, err))) return rc;
    for (int64_t i = 0; i < B * d; i++) s->h[i] += s->o[i];
    for (int64_t i = 0; i < B; i++) em_rmsnorm(s->h + i * d, y->ffn_norm, hp->eps, d, s->xn + i * d);
    if ((rc = gate_up(s, y, err))) return rc;
    if ((rc = mm(s, &y->down, s->fg, hp->ff, B, s->o, d, err))) return rc;
    for (int64_t i = 0; i < B * d; i++) s->h[i] += s->o[i];
    return EM_OK;
}

/* Backbone and final norm (into s->xn) of the block after anchor. */
static int run_block(dspark *s, int32_t anchor, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int64_t d = hp->d;
    embed_block(s, anchor);
    rope_table(s, hp->block, s->base.info.n_ctx);
    for (int l = 0; l < hp->n_layer; l++) {
        int rc = run_layer(s, l, err);
        if (rc) return rc;
    }
    for (int i = 0; i < hp->block; i++) em_rmsnorm(s->h + i * d, s->out_norm, hp->eps, d, s->xn + i * d);
    return EM_OK;
}

/* Base logits (LM head, softcap) of draft slots [k0, k1) into s->base_logits. Rows are
 * independent, so computing them in pieces gives the same floats as all at once. */
static int head_rows(dspark *s, int k0, int k1, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int64_t d = hp->d;
    float *y = s->base_logits + (int64_t)k0 * hp->dvocab;
    int rc = mm(s, &s->head, s->xn + (int64_t)(hp->slot0 + k0) * d, d, k1 - k0, y, hp->dvocab, err);
    if (rc) return rc;
    if (hp->softcap > 0) {
        const float c = hp->softcap;
        for (int64_t i = 0; i < (int64_t)(k1 - k0) * hp->dvocab; i++) y[i] = c * tanhf(y[i] / c);
    }
    return EM_OK;
}

/* LM head rows to compute at slot k (the first one without base logits) of n: everything
 * when no caller stops blocks early; else, for the first piece, about as many slots as
 * recent blocks used (a multi-row product is cheaper per row than several small ones, and
 * rows past the stop are wasted), the rest when a block goes further. */
static int head_piece(const dspark *s, int k, int n, bool may_stop) {
    if (!may_stop || k > 0) return n - k;
    int want = (int)ceilf(s->slots_avg + 0.5f);
    return want < 1 ? 1 : want > n ? n : want;
}

/* ---- Markov and confidence heads ------------------------------------------------------ */

/* s->e = W1[prev], the previous token's Markov embedding. */
static void markov_embed(dspark *s, int32_t prev) {
    const em_type_info *ti = em_type_get(s->w1.type);
    ti->to_float((const uint8_t *)s->w1.data + (uint64_t)prev * s->w1.row_bytes, s->e, s->hp.rank);
}

/* The vanilla bias W2 W1[prev] depends on prev alone: a cached row, or NULL (*slot: the entry
 * to fill, least recently used). */
static const float *bias_cached(dspark *s, int32_t prev, int *slot) {
    int lru = 0;
    for (int i = 0; i < s->n_bias; i++) {
        if (s->bias_tok[i] == prev) {
            s->bias_used[i] = ++s->bias_clock;
            return s->bias_rows + (int64_t)i * s->hp.dvocab;
        }
        if (s->bias_used[i] < s->bias_used[lru]) lru = i;
    }
    *slot = lru;
    return NULL;
}

/* *bias = the Markov bias [dvocab] of slot k given the previous token prev, whose embedding
 * is in s->e (markov_embed). */
static int markov_bias(dspark *s, const float *hk, int32_t prev, const float **bias, em_err *err) {
    const dsp_hparams *hp = &s->hp;
    const int r = hp->rank, d = hp->d;
    const float *in = s->e;
    float *dst = s->bias;
    int rc, slot = -1;
    if (hp->markov == DSP_MARKOV_VANILLA && s->n_bias > 0) {
        if ((*bias = bias_cached(s, prev, &slot))) return EM_OK;
        dst = s->bias_rows + (int64_t)slot * hp->dvocab;
        s->bias_tok[slot] = -1; /* overwritten below: tagged again only once complete */
    } else if (hp->markov == DSP_MARKOV_GATED) {
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
    if ((rc = mm(s, &s->w2, in, r, 1, dst, hp->dvocab, err))) return rc;
    if (slot >= 0) {
        s->bias_tok[slot] = prev;
        s->bias_used[slot] = ++s->bias_clock;
    }
    *bias = dst;
    return EM_OK;
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

/* Slot k's corrected logits in the target vocabulary, into dst [vocab] (bias NULL: none). */
static void target_logits(const dspark *s, const float *base, const float *bias, float *dst) {
    const dsp_hparams *hp = &s->hp;
    if (!s->d2t) {
        if (bias)
            for (int i = 0; i < hp->vocab; i++) dst[i] = base[i] + bias[i];
        else
            memcpy(dst, base, (size_t)hp->vocab * sizeof *dst);
        return;
    }
    for (int i = 0; i < hp->vocab; i++) dst[i] = -INFINITY;
    for (int i = 0; i < hp->dvocab; i++) dst[s->d2t[i]] = base[i] + (bias ? bias[i] : 0.0f);
}

static int dsp_propose(em_drafter *d, int32_t anchor, int n_max, const em_draft_chain *chain,
                       em_draft_out *out, em_err *err) {
    dspark *s = (dspark *)d;
    const dsp_hparams *hp = &s->hp;
    const int n = n_max < d->info.n_drafts ? n_max : d->info.n_drafts;
    const bool may_stop = hp->conf && em_draft_chain_may_stop(chain);
    em_draft_sched sched;
    em_draft_chain_begin(chain, &sched);
    int rc = run_block(s, anchor, err);
    if (rc) return rc;
    if (hp->markov == DSP_MARKOV_RNN) memset(s->state, 0, (size_t)hp->rank * sizeof(float));
    int32_t prev = anchor;
    int k = 0, have = 0; /* slots with base logits: [0, have) */
    for (; k < n; k++) {
        const float *hk = s->xn + (int64_t)(hp->slot0 + k) * hp->d;
        if (hp->rank > 0) markov_embed(s, prev);
        if (hp->conf) {
            float z = confidence(s, hk, k);
            if (out->conf_logits) out->conf_logits[k] = z;
            if (may_stop && !em_draft_chain_keep(chain, &sched, k, z)) break;
        }
        if (k >= have) {
            int m = head_piece(s, k, n, may_stop);
            if ((rc = head_rows(s, k, k + m, err))) return rc;
            have = k + m;
        }
        const float *bias = NULL;
        if (hp->rank > 0 && (rc = markov_bias(s, hk, prev, &bias, err))) return rc;
        float *row = out->logits ? out->logits + (int64_t)k * hp->vocab : s->row;
        target_logits(s, s->base_logits + (int64_t)k * hp->dvocab, bias, row);
        int32_t tok = em_draft_chain_pick(chain, k, row, hp->vocab);
        if (tok < 0) break;
        if (tok >= hp->vocab)
            return em_err_set(err, EM_EINVAL, "drafter %s: the chooser picked token %d at slot %d, outside the vocabulary "
                              "[0, %d)", s->path, (int)tok, k, hp->vocab);
        out->tokens[k] = tok;
        out->n = k + 1;
        prev = tok;
    }
    if (may_stop) s->slots_avg += 0.25f * ((float)k - s->slots_avg);
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

int em_dspark_open(em_drafter **out, const char *draft_path, const em_target_shared *target,
                   const em_draft_opts *opts, em_err *err) {
    dspark *s = em_calloc(1, sizeof *s, "drafter", err);
    if (!s) return EM_ENOMEM;
    s->base.ops = &dsp_ops;
    int rc = dsp_load(s, draft_path, target, opts, err);
    if (rc) {
        dsp_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return EM_OK;
}
