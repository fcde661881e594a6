/* draft/dspark_cuda.c: the DSpark / DFlash drafter on a CUDA device (docs/cuda.md, "The drafter
 * on the device"), a second em_drafter_ops over backend/gpu.h; draft/dspark.c is the reference
 * it is tested against (tests/cuda/test_gpu_draft.c).
 *
 * The file is loaded by dspark_load.c as for the CPU (hparams, host views of every matrix, the
 * RoPE table); each weight is then uploaded once, except an embedding or LM head borrowed from
 * a target on the same device, whose device copy it uses (em_target_shared.d_*). add_context
 * uploads the feature rows and writes each layer's K (k_norm, RoPE at the row's position) and
 * V into a context cache on the device. propose uploads one em_gpu_draft_io (the block's
 * tokens and positions, the context length and the keep test's walk), replays one CUDA graph
 * that runs the block forward, the LM head of every draft slot and, slot by slot, the Markov
 * embedding of the previous pick, the confidence and keep test, the Markov bias (vanilla,
 * gated or rnn, the rnn state zeroed per block) and the pick or the seeded draw, all reading
 * the chain's state on the device, then downloads the io: one upload and one download per
 * block, no host round trip per slot.
 *
 * Scope (refused with EM_EUNSUPPORTED, naming the file): test callbacks (a host call per slot)
 * and the corrected logits rows of sampled drafts; blocks of at most EM_GPU_DRAFT_MAX_BLOCK
 * slots, heads of at most 256 values, Markov ranks of at most EM_GPU_DRAFT_MAX_RANK.
 * Invariants: the context cache holds rows 0 .. n_ctx - 1 only; every device buffer is
 * allocated at open, so a propose allocates nothing and its graph never changes shape. */
#include "backend/gpu.h"
#include "draft/dspark_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Context rows one upload carries (the products take at most EM_GPU_MAX_ROWS rows). */
#define GD_CHUNK EM_GPU_MAX_ROWS
/* The nominal device for block_seconds / slot_seconds (model/kimi_cuda.c's). */
#define GD_NOMINAL_BPS 4.6e12
#define GD_NOMINAL_KERNEL_S 1.0e-6

/* What a propose's graph does per slot: a greedy pick, the same writing the corrected logits
 * rows, or a sampled draw. */
enum { GD_GREEDY, GD_GREEDY_LOGITS, GD_SAMPLED, GD_MODES };

typedef struct gd_layer {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv;
    em_gpu_mat wq, wk, wv, wo, gate, up, down;
} gd_layer;

typedef struct gdspark {
    em_drafter base;
    dspark *cpu; /* the loaded file: hparams, host views, RoPE; its own cache stays unused */
    em_gpu *g;
    char device[288]; /* "cuda:N (name)" */
    gd_layer *layers;
    em_gpu_mat fc, embd, head, w1, w2, gate_w, joint_w; /* gate_w: gated head, joint_w: rnn */
    bool head_is_embd;   /* one upload when the file (or the target) ties them */
    bool lent_embd, lent_head; /* the target's device copies (same device): not ours to free */
    float *hidden_norm, *out_norm, *conf_w, *conf_t, *gate_b, *joint_b;
    int32_t *d2t;
    double *inv_freq;
    int64_t cap;
    float *kc, *vc;                      /* [n_layer][cap][n_kv * hd] */
    float *feat;                         /* [GD_CHUNK][n_feat] */
    int32_t *iota;                       /* [cap]: position p at p, for the context rows' RoPE */
    bool lent_gpu;                       /* s->g is the target's handle (same device): one stream */
    const float *t_feat;                 /* the target's device feature rows (same device), or NULL */
    int t_feat_rows;
    float *h;                            /* [max(block, GD_CHUNK)][d]: a block's rows, or a context chunk's */
    float *xn, *q, *k, *v, *att, *o, *fg, *fu; /* block rows */
    float *base_logits;                  /* [n_drafts][dvocab] */
    float *e, *bias;                     /* [rank], [dvocab] */
    int8_t *e_qs;                        /* [rank]: e's Q8_0 activations for W2 (vanilla head, Q8_0 W2) */
    float *e_qd;                         /* [rank / 32] */
    bool chain1;                         /* a greedy chain in one launch: vanilla head, Q8_0 W2 */
    float *zin, *zout, *state, *mix;     /* gated / rnn heads: [2 rank + d], [3 rank], [rank], [rank] */
    float *logits;                       /* [n_drafts][vocab]: corrected rows, when asked */
    float *scores;
    void *act;                           /* activation scratch of the largest product */
    em_gpu_draft_io *io;                 /* device */
    em_gpu_draft_q *dists;               /* [n_drafts]: sampled slots' distributions */
    em_gpu_graph *graph[GD_MODES];       /* one propose graph per mode */
} gdspark;

/* ---- upload ------------------------------------------------------------------------------ */

static int up_mat(gdspark *s, const em_mat *m, const char *name, em_gpu_mat *out, em_err *err) {
    memset(out, 0, sizeof *out);
    if (!m->data) return EM_OK;
    return em_gpu_mat_upload(s->g, m->type, m->rows, m->cols, m->data, name, out, err);
}

static int up_vec(gdspark *s, const float *v, int64_t n, const char *what, float **out, em_err *err) {
    *out = NULL;
    if (!v) return EM_OK;
    int rc = em_gpu_alloc(s->g, (uint64_t)n * sizeof(float), what, (void **)out, err);
    return rc ? rc : em_gpu_upload(s->g, *out, v, (uint64_t)n * sizeof(float), err);
}

static int alloc_f(gdspark *s, uint64_t n, const char *what, float **out, em_err *err) {
    return em_gpu_alloc(s->g, (n ? n : 1) * sizeof(float), what, (void **)out, err);
}

static int upload_layer(gdspark *s, int l, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const dsp_layer *y = &s->cpu->layers[l];
    gd_layer *d = &s->layers[l];
    const int64_t qw = (int64_t)hp->n_head * hp->hd, kw = (int64_t)hp->n_kv * hp->hd;
    char name[64];
    int rc;
    const struct {
        const em_mat *m;
        em_gpu_mat *out;
        const char *what;
    } mats[] = { { &y->wq, &d->wq, "attn_q" },      { &y->wk, &d->wk, "attn_k" },     { &y->wv, &d->wv, "attn_v" },
                 { &y->wo, &d->wo, "attn_output" }, { &y->gate, &d->gate, "ffn_gate" }, { &y->up, &d->up, "ffn_up" },
                 { &y->down, &d->down, "ffn_down" } };
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, mats[i].what);
        if ((rc = up_mat(s, mats[i].m, name, mats[i].out, err))) return rc;
    }
    if ((rc = up_vec(s, y->attn_norm, hp->d, "drafter norms", &d->attn_norm, err)) ||
        (rc = up_vec(s, y->ffn_norm, hp->d, "drafter norms", &d->ffn_norm, err)) ||
        (rc = up_vec(s, y->q_norm, hp->hd, "drafter norms", &d->q_norm, err)) ||
        (rc = up_vec(s, y->k_norm, hp->hd, "drafter norms", &d->k_norm, err)) ||
        (rc = up_vec(s, y->bq, qw, "drafter biases", &d->bq, err)) ||
        (rc = up_vec(s, y->bk, kw, "drafter biases", &d->bk, err)) ||
        (rc = up_vec(s, y->bv, kw, "drafter biases", &d->bv, err)))
        return rc;
    return EM_OK;
}

/* The target's device copy of m when the drafter borrowed m from a target on this device. */
static const em_gpu_mat *lent(const em_target_shared *t, int index, const em_mat *m) {
    if (!t || t->cuda_index != index || !m->data) return NULL;
    if (t->d_token_embd && t->token_embd && m->data == t->token_embd->data) return t->d_token_embd;
    if (t->d_output && t->output && m->data == t->output->data) return t->d_output;
    return NULL;
}

/* The embedding and the LM head: the target's device copies when it lends them, else ours. */
static int embd_head(gdspark *s, const em_target_shared *t, int index, em_err *err) {
    const dspark *c = s->cpu;
    const em_gpu_mat *de = lent(t, index, &c->embd), *dh = lent(t, index, &c->head);
    int rc = EM_OK;
    s->head_is_embd = c->head.data == c->embd.data && c->head.type == c->embd.type;
    if ((s->lent_embd = de != NULL)) s->embd = *de;
    else rc = up_mat(s, &c->embd, "token_embd", &s->embd, err);
    if (rc || s->head_is_embd) {
        s->head = s->embd, s->lent_head = s->lent_embd;
        return rc;
    }
    if ((s->lent_head = dh != NULL)) s->head = *dh;
    else rc = up_mat(s, &c->head, "output", &s->head, err);
    return rc;
}

static int upload_weights(gdspark *s, const em_target_shared *t, int index, em_err *err) {
    const dspark *c = s->cpu;
    const dsp_hparams *hp = &c->hp;
    int rc;
    s->layers = em_calloc((size_t)hp->n_layer, sizeof *s->layers, "drafter layers", err);
    if (!s->layers) return EM_ENOMEM;
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = upload_layer(s, l, err))) return rc;
    if ((rc = up_mat(s, &c->fc, "fc.weight", &s->fc, err)) || (rc = embd_head(s, t, index, err)) ||
        (rc = up_mat(s, &c->w1, "markov W1", &s->w1, err)) || (rc = up_mat(s, &c->w2, "markov W2", &s->w2, err)) ||
        (rc = up_mat(s, &c->gate_w, "markov gate", &s->gate_w, err)) ||
        (rc = up_mat(s, &c->joint_w, "markov joint", &s->joint_w, err)) ||
        (rc = up_vec(s, c->gate_b, c->gate_w.data ? hp->rank : 0, "markov gate bias", &s->gate_b, err)) ||
        (rc = up_vec(s, c->joint_b, c->joint_w.data ? 3 * (int64_t)hp->rank : 0, "markov joint bias", &s->joint_b, err)) ||
        (rc = up_vec(s, c->hidden_norm, hp->d, "drafter norms", &s->hidden_norm, err)) ||
        (rc = up_vec(s, c->out_norm, hp->d, "drafter norms", &s->out_norm, err)) ||
        (rc = up_vec(s, c->conf_w, hp->conf ? hp->d + (hp->conf_markov ? hp->rank : 0) : 0, "confidence head",
                     &s->conf_w, err)) ||
        (rc = up_vec(s, c->conf_t, s->base.info.n_drafts, "confidence temperatures", &s->conf_t, err)))
        return rc;
    if (c->d2t) {
        if ((rc = em_gpu_alloc(s->g, (uint64_t)hp->dvocab * sizeof(int32_t), "d2t", (void **)&s->d2t, err)) ||
            (rc = em_gpu_upload(s->g, s->d2t, c->d2t, (uint64_t)hp->dvocab * sizeof(int32_t), err)))
            return rc;
    }
    const int half = c->rope.dims / 2;
    if ((rc = em_gpu_alloc(s->g, (uint64_t)(half ? half : 1) * sizeof(double), "RoPE table", (void **)&s->inv_freq, err)))
        return rc;
    return em_gpu_upload(s->g, s->inv_freq, c->rope.inv_freq, (uint64_t)half * sizeof(double), err);
}

/* The largest activation scratch a product of the drafter needs (n rows of its input). */
static uint64_t act_bytes(const gdspark *s) {
    const dsp_hparams *hp = &s->cpu->hp;
    const int64_t cols[] = { s->base.info.n_feat, hp->d, (int64_t)hp->n_head * hp->hd, hp->ff, hp->rank > 0 ? hp->rank : 32,
                             hp->d + 2 * (int64_t)hp->rank };
    uint64_t most = 0;
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
        uint64_t b = em_gpu_act_bytes(EM_TYPE_Q8_0, cols[i], EM_GPU_MAX_ROWS);
        if (b > most) most = b;
    }
    return most;
}

static int alloc_buffers(gdspark *s, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const uint64_t B = (uint64_t)hp->block, d = (uint64_t)hp->d, qw = (uint64_t)hp->n_head * hp->hd;
    const uint64_t kw = (uint64_t)hp->n_kv * hp->hd, nd = (uint64_t)s->base.info.n_drafts;
    const uint64_t r = (uint64_t)(hp->rank > 0 ? hp->rank : 1);
    const bool e_q8 = hp->markov == DSP_MARKOV_VANILLA && hp->rank % 32 == 0 && em_gpu_act_type(s->w2.type) == EM_TYPE_Q8_0;
    s->chain1 = e_q8 && s->w2.type == EM_TYPE_Q8_0; /* em_gpu_draft_markov_chain's case */
    const em_gpu_gqa_dims gd = { hp->n_head, hp->n_kv, hp->hd, s->cap, hp->causal };
    int rc;
    if ((rc = alloc_f(s, (uint64_t)hp->n_layer * (uint64_t)s->cap * kw, "drafter context cache (K)", &s->kc, err)) ||
        (rc = alloc_f(s, (uint64_t)hp->n_layer * (uint64_t)s->cap * kw, "drafter context cache (V)", &s->vc, err)) ||
        (rc = alloc_f(s, GD_CHUNK * (uint64_t)s->base.info.n_feat, "drafter features", &s->feat, err)) ||
        (rc = em_gpu_alloc(s->g, (uint64_t)s->cap * sizeof(int32_t), "drafter positions", (void **)&s->iota, err)) ||
        (rc = alloc_f(s, (B > GD_CHUNK ? B : GD_CHUNK) * d, "drafter rows", &s->h, err)) || /* add_rows' too */
        (rc = alloc_f(s, B * d, "drafter rows", &s->xn, err)) ||
        (rc = alloc_f(s, B * qw, "drafter rows", &s->q, err)) || (rc = alloc_f(s, B * kw, "drafter rows", &s->k, err)) ||
        (rc = alloc_f(s, B * kw, "drafter rows", &s->v, err)) || (rc = alloc_f(s, B * qw, "drafter rows", &s->att, err)) ||
        (rc = alloc_f(s, B * d, "drafter rows", &s->o, err)) ||
        (rc = alloc_f(s, B * (uint64_t)hp->ff, "drafter rows", &s->fg, err)) ||
        (rc = alloc_f(s, B * (uint64_t)hp->ff, "drafter rows", &s->fu, err)) ||
        (rc = alloc_f(s, nd * (uint64_t)hp->dvocab, "drafter logits", &s->base_logits, err)) ||
        (rc = alloc_f(s, nd * (uint64_t)hp->vocab, "drafter logits", &s->logits, err)) ||
        (rc = alloc_f(s, (uint64_t)(hp->rank > 0 ? hp->rank : 1), "markov row", &s->e, err)) ||
        (rc = alloc_f(s, (uint64_t)hp->dvocab, "markov bias", &s->bias, err)) ||
        (rc = alloc_f(s, 2 * r + d, "markov input", &s->zin, err)) ||
        (rc = alloc_f(s, 3 * r, "markov product", &s->zout, err)) ||
        (rc = alloc_f(s, r, "markov state", &s->state, err)) || (rc = alloc_f(s, r, "markov mix", &s->mix, err)) ||
        (e_q8 && (rc = em_gpu_alloc(s->g, r, "markov activations", (void **)&s->e_qs, err))) ||
        (e_q8 && (rc = alloc_f(s, r / 32, "markov activations", &s->e_qd, err))) ||
        (rc = alloc_f(s, em_gpu_gqa_scratch_floats(&gd, hp->block), "drafter attention scores", &s->scores, err)) ||
        (rc = em_gpu_alloc(s->g, act_bytes(s), "drafter activations", &s->act, err)) ||
        (rc = em_gpu_alloc(s->g, sizeof(em_gpu_draft_io), "drafter chain", (void **)&s->io, err)) ||
        (rc = em_gpu_alloc(s->g, nd * sizeof(em_gpu_draft_q), "drafter distributions", (void **)&s->dists, err)) ||
        /* a slot writes only its candidates; the download takes whole entries */
        (rc = em_gpu_memset(s->g, s->dists, 0, nd * sizeof(em_gpu_draft_q), err)))
        return rc;
    return EM_OK;
}

/* ---- products ---------------------------------------------------------------------------- */

/* y = W x over n rows (n <= EM_GPU_MAX_ROWS). */
static int mm(gdspark *s, const em_gpu_mat *w, const float *x, int64_t ldx, int n, float *y, int64_t ldy, em_err *err) {
    em_gpu_act a;
    int rc = em_gpu_act_prepare(s->g, w->type, x, ldx, w->cols, n, s->act, &a, err);
    return rc ? rc : em_gpu_matmul(s->g, w, &a, y, ldy, err);
}

/* Two or three products of the same rows: one launch when their layouts agree. */
static int mm_same(gdspark *s, const em_gpu_mm_out *o, int count, const float *x, int64_t ldx, int n, em_err *err) {
    bool same = true;
    for (int i = 1; i < count; i++) same &= o[i].w->type == o[0].w->type;
    if (!same) {
        for (int i = 0; i < count; i++) {
            int rc = mm(s, o[i].w, x, ldx, n, o[i].d_y, o[i].ldy, err);
            if (rc) return rc;
        }
        return EM_OK;
    }
    em_gpu_act a;
    int rc = em_gpu_act_prepare(s->g, o[0].w->type, x, ldx, o[0].w->cols, n, s->act, &a, err);
    return rc ? rc : em_gpu_matmul_multi(s->g, o, count, &a, err);
}

/* ---- context ----------------------------------------------------------------------------- */

/* Context rows n_ctx .. n_ctx + n - 1 (n <= GD_CHUNK) from feature rows on the device (n_feat
 * floats apart): fc, hidden_norm, then every layer's K (k_norm, RoPE) and V into the cache. */
static int add_rows(gdspark *s, const float *d_feats, int n, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const int64_t d = hp->d, kw = (int64_t)hp->n_kv * hp->hd, p0 = s->base.info.n_ctx, nf = s->base.info.n_feat;
    int rc;
    if ((rc = mm(s, &s->fc, d_feats, nf, n, s->h, d, err)) ||
        (rc = em_gpu_rmsnorm_rows(s->g, s->h, d, s->hidden_norm, hp->eps, n, d, s->h, d, err)))
        return rc;
    /* every layer's K and V are products of the same rows: as many in one launch as it takes */
    em_gpu_mm_out kv[EM_GPU_MULTI_MAX];
    for (int l = 0, m = 0; l < hp->n_layer; l++) {
        const gd_layer *y = &s->layers[l];
        kv[m++] = (em_gpu_mm_out){ &y->wk, s->kc + ((int64_t)l * s->cap + p0) * kw, kw };
        kv[m++] = (em_gpu_mm_out){ &y->wv, s->vc + ((int64_t)l * s->cap + p0) * kw, kw };
        const bool full = m + 2 > EM_GPU_MULTI_MAX;
        if ((full || l + 1 == hp->n_layer) && (rc = mm_same(s, kv, m, s->h, d, n, err))) return rc;
        if (full) m = 0;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        const gd_layer *y = &s->layers[l];
        float *kc = s->kc + ((int64_t)l * s->cap + p0) * kw, *vc = s->vc + ((int64_t)l * s->cap + p0) * kw;
        if ((y->bk && (rc = em_gpu_add_bias(s->g, kc, kw, n, kw, y->bk, err))) ||
            (y->bv && (rc = em_gpu_add_bias(s->g, vc, kw, n, kw, y->bv, err))) ||
            (rc = em_gpu_head_norm_rope(s->g, NULL, 0, 0, NULL, kc, kw, hp->n_kv, y->k_norm, n, hp->hd, hp->eps,
                                        hp->rope_dims, s->iota + p0, s->inv_freq, s->cpu->rope.attn_factor, err)))
            return rc;
    }
    s->base.info.n_ctx += n;
    return EM_OK;
}

static int fits(const gdspark *s, int n, em_err *err) {
    if ((int64_t)n <= s->cap - s->base.info.n_ctx) return EM_OK;
    return em_err_set(err, EM_EOVERFLOW, "drafter %s on %s: %d context rows do not fit (%lld of %lld held; open with a "
                      "larger n_ctx)", s->cpu->path, s->device, n, (long long)s->base.info.n_ctx, (long long)s->cap);
}

static int gd_add_context(em_drafter *d, const float *feats, int n, em_err *err) {
    gdspark *s = (gdspark *)d;
    const int64_t nf = s->base.info.n_feat;
    int rc = fits(s, n, err);
    for (int done = 0; !rc && done < n;) {
        const int c = n - done < GD_CHUNK ? n - done : GD_CHUNK;
        rc = em_gpu_upload(s->g, s->feat, feats + done * nf, (uint64_t)c * (uint64_t)nf * sizeof(float), err);
        if (!rc) rc = add_rows(s, s->feat, c, err);
        done += c;
    }
    return rc;
}

/* The same from the rows the target left on this device (draft.h em_draft_add_context_target):
 * nothing crosses to the host, nothing waits for it. */
static int gd_add_context_target(em_drafter *d, int row0, int n, int type, em_err *err) {
    gdspark *s = (gdspark *)d;
    const int64_t nf = s->base.info.n_feat;
    if (row0 > s->t_feat_rows - n)
        return em_err_set(err, EM_EINVAL, "drafter %s on %s: target feature rows %d .. %d asked, it keeps %d", s->cpu->path,
                          s->device, row0, row0 + n - 1, s->t_feat_rows);
    int rc = fits(s, n, err);
    for (int done = 0; !rc && done < n;) {
        const int c = n - done < GD_CHUNK ? n - done : GD_CHUNK;
        const float *src = s->t_feat + (int64_t)(row0 + done) * nf;
        if (type != EM_TYPE_F32) { /* what a ring of this type would have handed over */
            rc = em_gpu_round_rows(s->g, type, src, nf, c, s->feat, err);
            src = s->feat;
        }
        if (!rc) rc = add_rows(s, src, c, err);
        done += c;
    }
    return rc;
}

/* ---- the block and the chain ---------------------------------------------------------------- */

/* h += y (y NULL: nothing pending), xn = norm(h) with weight w over the block's rows, and xn's
 * activations for weights of type wtype in *a: Q8_0 ones quantized in the same launch. */
static int norm_act(gdspark *s, const float *y, const float *w, int wtype, em_gpu_act *a, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const int64_t d = hp->d;
    const bool q8 = em_gpu_act_type(wtype) == EM_TYPE_Q8_0 && d % 32 == 0;
    int rc = em_gpu_add_rmsnorm(s->g, s->h, d, y, NULL, d, w, hp->eps, hp->block, d, s->xn, d, q8 ? s->act : NULL,
                                q8 ? a : NULL, err);
    return rc || q8 ? rc : em_gpu_act_prepare(s->g, wtype, s->xn, d, d, hp->block, s->act, a, err);
}

/* Products of the normed rows xn whose activations a holds: one launch when every weight takes
 * a's type, else each from xn on its own. */
static int mm_act(gdspark *s, const em_gpu_mm_out *o, int count, const em_gpu_act *a, em_err *err) {
    bool same = true;
    for (int i = 0; i < count; i++) same &= em_gpu_act_type(o[i].w->type) == a->type;
    return same ? em_gpu_matmul_multi(s->g, o, count, a, err) : mm_same(s, o, count, s->xn, s->cpu->hp.d, a->n, err);
}

/* Rows r0 .. r0 + n - 1 of prepared activations. */
static em_gpu_act act_rows(const em_gpu_act *a, int r0, int n) {
    em_gpu_act b = *a;
    b.n = n;
    if (b.x) b.x += (int64_t)r0 * b.ldx;
    if (b.qs) b.qs += (int64_t)r0 * b.cols, b.d += (int64_t)r0 * (b.cols / 32);
    return b;
}

/* Layer l of the block; its last product (down) is left in s->o for the next norm to add. */
static int block_layer(gdspark *s, int l, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const gd_layer *y = &s->layers[l];
    const int B = hp->block;
    const int64_t d = hp->d, qw = (int64_t)hp->n_head * hp->hd, kw = (int64_t)hp->n_kv * hp->hd;
    const em_gpu_gqa_dims gd = { hp->n_head, hp->n_kv, hp->hd, s->cap, hp->causal };
    /* q_norm, k_norm and RoPE of the block rows inside the attention */
    const em_gpu_gqa_rope rope = { y->q_norm, y->k_norm, hp->eps, hp->rope_dims / 2, s->io->pos, s->inv_freq,
                                   s->cpu->rope.attn_factor };
    const em_gpu_mm_out qkv[] = { { &y->wq, s->q, qw }, { &y->wk, s->k, kw }, { &y->wv, s->v, kw } };
    const em_gpu_mm_out gu[] = { { &y->gate, s->fg, hp->ff }, { &y->up, s->fu, hp->ff } };
    em_gpu *g = s->g;
    em_gpu_act a;
    int rc;
    if ((rc = norm_act(s, l > 0 ? s->o : NULL, y->attn_norm, y->wq.type, &a, err)) || (rc = mm_act(s, qkv, 3, &a, err)) ||
        (y->bq && (rc = em_gpu_add_bias(g, s->q, qw, B, qw, y->bq, err))) ||
        (y->bk && (rc = em_gpu_add_bias(g, s->k, kw, B, kw, y->bk, err))) ||
        (y->bv && (rc = em_gpu_add_bias(g, s->v, kw, B, kw, y->bv, err))) ||
        (rc = em_gpu_gqa_attend(g, &gd, s->q, s->kc + (int64_t)l * s->cap * kw, s->vc + (int64_t)l * s->cap * kw,
                                &s->io->n_ctx, s->k, s->v, B, &rope, s->scores, s->att, err)) ||
        (rc = mm(s, &y->wo, s->att, qw, B, s->o, d, err)) ||
        (rc = norm_act(s, s->o, y->ffn_norm, y->gate.type, &a, err)) || (rc = mm_act(s, gu, 2, &a, err)))
        return rc;
    if (em_gpu_act_type(y->down.type) == EM_TYPE_Q8_0 && hp->ff % 32 == 0) { /* SwiGLU and Q8_0 in one launch */
        rc = em_gpu_act_prepare_glu(g, y->down.type, s->fg, s->fu, hp->ff, hp->ff, B, EM_GPU_ACT_SWIGLU, 0, 0, s->act, &a,
                                    err);
        return rc ? rc : em_gpu_matmul(g, &y->down, &a, s->o, d, err);
    }
    rc = em_gpu_swiglu(g, s->fg, s->fu, (int64_t)B * hp->ff, s->fg, err);
    return rc ? rc : mm(s, &y->down, s->fg, hp->ff, B, s->o, d, err);
}

/* s->mix = W2's input for the gated or rnn head at a slot whose final row is hk (e = W1[prev]
 * in s->e; the rnn state in s->state, zeroed at the start of the chain): draft/dspark.c's
 * markov_bias. */
static int markov_mix(gdspark *s, const float *hk, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const int r = hp->rank, d = hp->d;
    const bool gated = hp->markov == DSP_MARKOV_GATED;
    const int kind = gated ? EM_GPU_MARKOV_GATED : EM_GPU_MARKOV_RNN;
    const em_gpu_mat *w = gated ? &s->gate_w : &s->joint_w;
    int rc;
    if ((rc = em_gpu_draft_markov_in(s->g, kind, hk, d, s->e, s->state, r, s->zin, err)) ||
        (rc = mm(s, w, s->zin, w->cols, 1, s->zout, gated ? r : 3 * r, err)))
        return rc;
    return em_gpu_draft_markov_out(s->g, kind, s->zout, gated ? s->gate_b : s->joint_b, s->e, s->state, r, s->mix, err);
}

/* What a slot's start reads and writes (em_gpu_draft_slot_begin). */
static em_gpu_draft_slot slot_args(const gdspark *s) {
    const dspark *c = s->cpu;
    const dsp_hparams *hp = &c->hp;
    em_gpu_draft_slot a = { .d_h = s->xn, .d = hp->d, .slot0 = hp->slot0 };
    if (hp->rank > 0) {
        a.w1_type = s->w1.type, a.w1_data = s->w1.data, a.w1_scales = s->w1.scales, a.w1_rows = s->w1.rows;
        a.rank = hp->rank, a.d_e = s->e, a.d_e_qs = s->e_qs, a.d_e_qd = s->e_qd;
    }
    if (hp->conf) a.d_conf_w = s->conf_w, a.conf_b = c->conf_b, a.d_conf_t = s->conf_t, a.conf_markov = hp->conf_markov;
    return a;
}

/* Slot k of the chain: the previous pick's Markov row, the confidence and keep test (for a
 * greedy chain made by the previous slot's pick, except the first), the Markov bias, the pick
 * or the draw (draft/dspark.c's propose loop, on the io). */
static int chain_slot(gdspark *s, int k, int mode, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const float *hk = s->xn + (int64_t)(hp->slot0 + k) * hp->d;
    const bool markov = hp->markov != DSP_MARKOV_NONE && hp->rank > 0, starts = hp->rank > 0 || hp->conf;
    const bool picks = mode != GD_SAMPLED; /* a pick begins the next slot in its own launch */
    const em_gpu_draft_slot slot = slot_args(s);
    int rc;
    if (starts && (k == 0 || !picks) && (rc = em_gpu_draft_slot_begin(s->g, s->io, k, &slot, err))) return rc;
    if (markov && hp->markov != DSP_MARKOV_VANILLA) {
        if ((rc = markov_mix(s, hk, err)) || (rc = mm(s, &s->w2, s->mix, hp->rank, 1, s->bias, hp->dvocab, err))) return rc;
    } else if (markov && s->e_qs) { /* e's activations came with it */
        const em_gpu_act a = { .type = EM_TYPE_Q8_0, .n = 1, .cols = hp->rank, .qs = s->e_qs, .d = s->e_qd };
        if ((rc = em_gpu_matmul(s->g, &s->w2, &a, s->bias, hp->dvocab, err))) return rc;
    } else if (markov && (rc = mm(s, &s->w2, s->e, hp->rank, 1, s->bias, hp->dvocab, err))) {
        return rc;
    }
    const float *base = s->base_logits + (int64_t)k * hp->dvocab, *bias = markov ? s->bias : NULL;
    if (!picks) return em_gpu_draft_sample(s->g, s->io, k, base, bias, hp->dvocab, hp->softcap, s->d2t, s->dists, err);
    const bool next = starts && k + 1 < s->base.info.n_drafts;
    return em_gpu_draft_pick(s->g, s->io, k, base, bias, hp->dvocab, hp->softcap, s->d2t,
                             mode == GD_GREEDY_LOGITS ? s->logits + (int64_t)k * hp->vocab : NULL, hp->vocab,
                             next ? &slot : NULL, err);
}

/* The whole propose after the io's upload: block forward, the slots' LM head, the chain. */
static int propose_pass(gdspark *s, int mode, em_err *err) {
    const dsp_hparams *hp = &s->cpu->hp;
    const int64_t d = hp->d;
    const int nd = s->base.info.n_drafts;
    em_gpu_act a;
    int rc = em_gpu_embed(s->g, &s->embd, s->io->block_tok, hp->block, s->h, d, err);
    for (int l = 0; !rc && l < hp->n_layer; l++) rc = block_layer(s, l, err);
    if (!rc) rc = norm_act(s, hp->n_layer > 0 ? s->o : NULL, s->out_norm, s->head.type, &a, err);
    if (!rc) {
        const em_gpu_act ah = act_rows(&a, hp->slot0, nd); /* the draft slots' rows */
        rc = em_gpu_matmul(s->g, &s->head, &ah, s->base_logits, hp->dvocab, err);
    }
    if (!rc && hp->markov == DSP_MARKOV_RNN) rc = em_gpu_memset(s->g, s->state, 0, (uint64_t)hp->rank * sizeof(float), err);
    const bool chain1 = s->chain1 && mode != GD_SAMPLED;
    /* em_gpu_draft_markov_chain writes the draft ids' logits only */
    if (!rc && mode == GD_GREEDY_LOGITS && chain1 && s->d2t)
        rc = em_gpu_fill(s->g, s->logits, -INFINITY, (uint64_t)nd * (uint64_t)hp->vocab, err);
    if (!rc && chain1) {
        const em_gpu_draft_slot slot = slot_args(s);
        return em_gpu_draft_markov_chain(s->g, s->io, nd, s->base_logits, s->w2.data, s->w2.scales, hp->dvocab, hp->rank,
                                         hp->softcap, s->d2t, mode == GD_GREEDY_LOGITS ? s->logits : NULL, hp->vocab,
                                         &slot, err);
    }
    for (int k = 0; !rc && k < nd; k++) rc = chain_slot(s, k, mode, err);
    return rc;
}

/* Replays the propose graph (captured the first time: everything it reads sits on the
 * device, so one graph serves every block). */
static int run_propose(gdspark *s, int mode, em_err *err) {
    em_gpu_graph **gr = &s->graph[mode];
    if (!*gr) {
        int rc = em_gpu_capture_begin(s->g, err);
        if (rc) return rc;
        rc = propose_pass(s, mode, err);
        em_err cerr = { 0 };
        int rc2 = em_gpu_capture_end(s->g, gr, rc ? &cerr : err);
        if (rc || rc2) { /* never replay a half-captured pass */
            em_gpu_graph_free(*gr);
            *gr = NULL;
            return rc ? rc : rc2;
        }
    }
    return em_gpu_graph_launch(s->g, *gr, err);
}

/* The mode of a chain the device runs: greedy picks or seeded draws, the drafter's own keep
 * test; test callbacks (a host call per slot) and corrected logits rows while sampling are
 * refused. */
static int chain_mode(const gdspark *s, const em_draft_chain *chain, const em_draft_out *out, int *mode, em_err *err) {
    const bool sampling = chain->sampler && em_sampler_params_of(chain->sampler)->temperature > 0;
    if (chain->choose || chain->keep || (sampling && out->logits))
        return em_err_set(err, EM_EUNSUPPORTED, "drafter %s on %s: %s do not run on the device; use --draft-device cpu",
                          s->cpu->path, s->device, sampling ? "the logits rows of sampled drafts" : "test callbacks");
    *mode = sampling ? GD_SAMPLED : out->logits ? GD_GREEDY_LOGITS : GD_GREEDY;
    return EM_OK;
}

static void io_begin(const gdspark *s, int32_t anchor, int n_max, const em_draft_chain *chain, em_gpu_draft_io *io) {
    const dsp_hparams *hp = &s->cpu->hp;
    memset(io, 0, sizeof *io);
    for (int i = 0; i < hp->block; i++) {
        io->block_tok[i] = i == 0 ? anchor : hp->mask_id;
        io->pos[i] = (int32_t)(s->base.info.n_ctx + i);
    }
    io->n_ctx = s->base.info.n_ctx;
    io->n_max = n_max < s->base.info.n_drafts ? n_max : s->base.info.n_drafts;
    io->may_stop = hp->conf && chain->sched;
    em_draft_sched st;
    em_draft_sched_start(&st, chain->sched);
    io->all = st.all, io->stopped = st.stopped, io->width = st.width;
    io->expected = st.expected, io->survival = st.survival, io->best = st.best;
    if (chain->sched) {
        io->n_cost = chain->sched->n_cost < EM_GPU_DRAFT_MAX_BLOCK + 1 ? chain->sched->n_cost : EM_GPU_DRAFT_MAX_BLOCK + 1;
        memcpy(io->cost, chain->sched->cost, (size_t)io->n_cost * sizeof(double));
    }
    if (chain->sampler && em_sampler_params_of(chain->sampler)->temperature > 0) {
        /* the sampler's filters, and this block's key: one draw of the caller's stream */
        const em_sampler_params *sp = em_sampler_params_of(chain->sampler);
        io->temperature = sp->temperature, io->top_p = sp->top_p, io->min_p = sp->min_p, io->top_k = sp->top_k;
        io->key = (uint64_t)(em_sampler_uniform(chain->sampler) * 9007199254740992.0);
    }
    io->alive = 1;
    for (int i = 0; i <= EM_GPU_DRAFT_MAX_BLOCK; i++) io->toks[i] = -1;
    io->toks[0] = anchor;
    for (int i = 0; i < EM_GPU_DRAFT_MAX_BLOCK; i++) io->conf[i] = NAN;
}

/* The distributions the made slots were drawn from, into the chain's dists. */
static int download_dists(gdspark *s, const em_gpu_draft_io *io, int made, em_sample_dist *dists, em_err *err) {
    em_gpu_draft_q q[EM_GPU_DRAFT_MAX_BLOCK];
    int rc = em_gpu_download(s->g, q, s->dists, (uint64_t)made * sizeof q[0], err);
    for (int k = 0; !rc && k < made; k++) {
        const int n = io->n_q[k];
        if (n < 1 || n > EM_GPU_DRAFT_TOPK || n > dists[k].cap)
            return em_err_set(err, EM_EIO, "drafter %s on %s: slot %d came back with %d candidates", s->cpu->path,
                              s->device, k, n);
        memcpy(dists[k].ids, q[k].id, (size_t)n * sizeof(int32_t));
        memcpy(dists[k].probs, q[k].p, (size_t)n * sizeof(float));
        dists[k].n = n;
    }
    return rc;
}

static int gd_propose(em_drafter *d, int32_t anchor, int n_max, const em_draft_chain *chain, em_draft_out *out,
                      em_err *err) {
    gdspark *s = (gdspark *)d;
    const dsp_hparams *hp = &s->cpu->hp;
    int mode = GD_GREEDY, rc = chain_mode(s, chain, out, &mode, err);
    if (rc) return rc;
    em_gpu_draft_io io;
    io_begin(s, anchor, n_max, chain, &io);
    if ((rc = em_gpu_upload(s->g, s->io, &io, sizeof io, err)) || (rc = run_propose(s, mode, err)) ||
        (rc = em_gpu_download(s->g, &io, s->io, sizeof io, err)))
        return rc;
    const int made = io.n < io.n_max ? io.n : io.n_max;
    for (int k = 0; k < made; k++) out->tokens[k] = io.toks[k + 1];
    out->n = made;
    if (out->conf_logits) /* the slots whose confidence was computed: the made ones and the one that stopped */
        for (int k = 0; k < io.n_max && k <= made; k++)
            if (!isnan(io.conf[k])) out->conf_logits[k] = io.conf[k];
    if (mode == GD_GREEDY_LOGITS && made > 0)
        rc = em_gpu_download(s->g, out->logits, s->logits, (uint64_t)made * (uint64_t)hp->vocab * sizeof(float), err);
    if (mode == GD_SAMPLED && made > 0 && chain->dists) rc = download_dists(s, &io, made, chain->dists, err);
    return rc;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

static void gd_reset(em_drafter *d) { d->info.n_ctx = 0; }

static void gd_close(em_drafter *d) {
    gdspark *s = (gdspark *)d;
    if (s->g) {
        for (int i = 0; i < GD_MODES; i++) em_gpu_graph_free(s->graph[i]);
        for (int l = 0; s->layers && l < s->cpu->hp.n_layer; l++) {
            gd_layer *y = &s->layers[l];
            em_gpu_mat *m[] = { &y->wq, &y->wk, &y->wv, &y->wo, &y->gate, &y->up, &y->down };
            for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) em_gpu_mat_free(s->g, m[i]);
            float *v[] = { y->attn_norm, y->ffn_norm, y->q_norm, y->k_norm, y->bq, y->bk, y->bv };
            for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) em_gpu_free(s->g, v[i]);
        }
        em_gpu_mat *m[] = { &s->fc, s->lent_embd ? NULL : &s->embd, s->head_is_embd || s->lent_head ? NULL : &s->head,
                            &s->w1, &s->w2, &s->gate_w, &s->joint_w };
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
            if (m[i]) em_gpu_mat_free(s->g, m[i]);
        void *v[] = { s->hidden_norm, s->out_norm, s->conf_w, s->conf_t, s->d2t, s->inv_freq, s->kc, s->vc, s->feat,
                      s->iota, s->h, s->xn, s->q, s->k, s->v, s->att, s->o, s->fg, s->fu, s->base_logits, s->e,
                      s->bias, s->zin, s->zout, s->state, s->mix, s->e_qs, s->e_qd,
                      s->gate_b, s->joint_b, s->logits, s->scores, s->act, s->io, s->dists };
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) em_gpu_free(s->g, v[i]);
        if (!s->lent_gpu) em_gpu_close(s->g);
    }
    free(s->layers);
    if (s->cpu) s->cpu->base.ops->close(&s->cpu->base);
    free(s);
}

static const em_drafter_ops gd_ops = {
    .add_context = gd_add_context,
    .add_context_target = gd_add_context_target,
    .propose = gd_propose,
    .reset = gd_reset,
    .close = gd_close,
};

/* What the device drafter does not run yet, before anything is uploaded. */
static int check_scope(const dspark *c, em_err *err) {
    const dsp_hparams *hp = &c->hp;
    if (hp->block > EM_GPU_DRAFT_MAX_BLOCK)
        return em_err_set(err, EM_EUNSUPPORTED, "drafter %s: blocks of %d slots (a GPU drafter takes at most %d)", c->path,
                          hp->block, EM_GPU_DRAFT_MAX_BLOCK);
    if (hp->hd > 256) return em_err_set(err, EM_EUNSUPPORTED, "drafter %s: heads of %d values (at most 256 on a GPU)", c->path, hp->hd);
    if (hp->rank > EM_GPU_DRAFT_MAX_RANK)
        return em_err_set(err, EM_EUNSUPPORTED, "drafter %s: a Markov rank of %d (at most %d on a GPU)", c->path, hp->rank,
                          EM_GPU_DRAFT_MAX_RANK);
    return EM_OK;
}

/* s->iota[p] = p over the cache's positions (uploaded once, in pieces). */
static int fill_iota(gdspark *s, em_err *err) {
    enum { PIECE = 65536 };
    int32_t *h = em_malloc(PIECE * sizeof *h, "drafter positions", err);
    if (!h) return EM_ENOMEM;
    int rc = EM_OK;
    for (int64_t p0 = 0; !rc && p0 < s->cap; p0 += PIECE) {
        const int64_t n = s->cap - p0 < PIECE ? s->cap - p0 : PIECE;
        for (int64_t i = 0; i < n; i++) h[i] = (int32_t)(p0 + i);
        rc = em_gpu_upload(s->g, s->iota + p0, h, (uint64_t)n * sizeof *h, err);
    }
    free(h);
    return rc;
}

/* Nominal costs on the device: weight bytes at GD_NOMINAL_BPS plus a microsecond a kernel. */
static void set_costs(gdspark *s) {
    const dsp_hparams *hp = &s->cpu->hp;
    double bytes = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const gd_layer *y = &s->layers[l];
        const em_gpu_mat *m[] = { &y->wq, &y->wk, &y->wv, &y->wo, &y->gate, &y->up, &y->down };
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) bytes += (double)m[i]->bytes;
    }
    const double kernels = 16.0 * hp->n_layer + 6.0;
    s->base.info.block_seconds = bytes / GD_NOMINAL_BPS + kernels * GD_NOMINAL_KERNEL_S;
    const double mix = (double)s->gate_w.bytes + (double)s->joint_w.bytes; /* at most one of them */
    s->base.info.slot_seconds = ((double)s->head.bytes / s->base.info.n_drafts + (double)s->w2.bytes + mix) /
                                    GD_NOMINAL_BPS + (mix > 0 ? 9.0 : 5.0) * GD_NOMINAL_KERNEL_S;
}

int em_dspark_cuda_open(em_drafter **out, const char *draft_path, const em_target_shared *target,
                        const em_draft_opts *opts, int cuda_index, em_err *err) {
    gdspark *s = em_calloc(1, sizeof *s, "GPU drafter", err);
    if (!s) return EM_ENOMEM;
    s->base.ops = &gd_ops;
    em_draft_opts co = *opts;
    co.n_threads = 1, co.device = NULL; /* the CPU side only loads */
    int rc = em_dspark_open((em_drafter **)&s->cpu, draft_path, target, &co, err);
    if (!rc) rc = check_scope(s->cpu, err);
    /* on its target's device: the target's stream (ordered with its work, no syncs between
     * them) and the features it keeps there */
    const bool same = !rc && target && target->gpu && target->cuda_index == cuda_index;
    if (same) s->g = target->gpu, s->lent_gpu = true;
    else if (!rc) rc = em_gpu_open(cuda_index, &s->g, err);
    if (rc) {
        gd_close(&s->base);
        return rc;
    }
    const em_gpu_info *gi = em_gpu_get_info(s->g);
    snprintf(s->device, sizeof s->device, "cuda:%d (%s)", cuda_index, gi ? gi->name : "?");
    s->base.info = s->cpu->base.info;
    s->base.info.n_ctx = 0;
    s->base.info.device = s->device;
    s->cap = s->cpu->cap;
    if (same && target->d_features && target->feature_rows > 0) {
        s->t_feat = target->d_features, s->t_feat_rows = target->feature_rows;
        s->base.info.target_features = true;
    }
    if ((rc = upload_weights(s, target, cuda_index, err)) || (rc = alloc_buffers(s, err)) || (rc = fill_iota(s, err))) {
        gd_close(&s->base);
        return rc;
    }
    set_costs(s);
    *out = &s->base;
    return EM_OK;
}
