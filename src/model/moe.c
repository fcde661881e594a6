/* The feed-forward half of a kimi-linear layer: dense SwiGLU, or the MoE block
 *   s = sigmoid(x W_r^T) in fp32;  choice = s + bias
 *   [groups: keep the n_group_used groups with the largest sum of their top-2 choices]
 *   ids = top-k(choice);  weights = s[ids] (unbiased) [/ sum] * expert_weights_scale
 *   y = sum_e weights_e * W2_e(silu(W1_e x) * W3_e x) + shared(x)
 * as transformers computes it (its router always applies the group limit). Rows are routed
 * independently, so the result for a row never depends on the other rows of the batch.
 * Ties in top-k go to the lower index. kimi-k3 (kimi_k3.c): SiTU in place of SwiGLU in every
 * MLP, and latent MoE: the router and the shared experts see x, the routed experts work on
 * routed_down x at the latent width, their sum goes through routed_norm and routed_up.
 *
 * Routed experts (the same code for prefill, decoding and verification): the n rows' routes
 * form a union (experts/route); each needed expert runs once over all rows routed to it, the
 * gate/up products of many experts (and of the shared experts) in one pool run and their down
 * products in another. The experts' weights come from the mapping (resident) or from the
 * experts/ cache (SSD: hits are computed while the misses load). Each expert writes its own
 * output rows and the weighted sum is taken afterwards in ascending expert order for every
 * row, so the logits do not depend on the storage mode, the cache budget or the order in
 * which experts arrive: resident and SSD are bit-identical.
 *
 * Also owns the storage mode (kimi_experts): its choice at open, the load summary line,
 * statistics and storage cost hints. */
#include "model/kimi_impl.h"

#include "experts/experts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The index of the largest value among v[0..n) not yet taken (lowest index on ties). */
static int take_max(const float *v, float *taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (taken[i] == 0.0f && (best < 0 || v[i] > v[best])) best = i;
    taken[best] = 1.0f;
    return best;
}

void kimi_route(const kimi_hparams *hp, const float *logits, const float *bias, int *ids,
                float *weights, float *margin, float *scratch) {
    const int X = hp->n_expert, G = hp->n_group, per = X / G;
    float *s = scratch, *choice = scratch + X, *gscore = scratch + 2 * X;
    float *taken = scratch + 2 * X + G; /* flags, X (>= G) of them */
    for (int e = 0; e < X; e++) {
        s[e] = em_sigmoidf(logits[e]);
        choice[e] = s[e] + bias[e];
    }
    if (G > 1) {
        for (int gi = 0; gi < G; gi++) { /* a group's score: the sum of its two best choices */
            const float *c = choice + gi * per;
            memset(taken, 0, (size_t)per * sizeof *taken);
            float sc = c[take_max(c, taken, per)];
            if (per > 1) sc += c[take_max(c, taken, per)];
            gscore[gi] = sc;
        }
        memset(taken, 0, (size_t)G * sizeof *taken);
        for (int i = 0; i < hp->n_group_used; i++) take_max(gscore, taken, G);
        for (int gi = 0; gi < G; gi++) /* experts of the losing groups cannot be chosen */
            if (!taken[gi])
                for (int e = gi * per; e < (gi + 1) * per; e++) choice[e] = -INFINITY;
    }
    memset(taken, 0, (size_t)X * sizeof *taken);
    double sum = 0.0;
    for (int i = 0; i < hp->n_expert_used; i++) {
        ids[i] = take_max(choice, taken, X);
        weights[i] = s[ids[i]];
        sum += weights[i];
    }
    const int K = hp->n_expert_used;
    *margin = K < X ? choice[ids[K - 1]] - choice[take_max(choice, taken, X)] : INFINITY;
    for (int i = 0; i < hp->n_expert_used; i++) {
        if (hp->expert_norm) weights[i] = (float)(weights[i] / (sum + 1e-20));
        weights[i] *= hp->expert_scale;
    }
}

/* y = down(silu(gate x) * up x) over n rows of x (ldx), into y (ldy). */
static int swiglu_mlp(const kimi_hparams *hp, const em_mat *gate, const em_mat *up, const em_mat *down, const float *x,
                      int64_t ldx, int n, float *y, int64_t ldy, em_pool *pool, em_arena *arena,
                      em_err *err) {
    const int64_t F = gate->rows;
    float *g = kimi_falloc(arena, (uint64_t)n * F, "MLP gate rows", err);
    float *u = kimi_falloc(arena, (uint64_t)n * F, "MLP up rows", err);
    if (!g || !u) return EM_ENOMEM;
    kimi_acts xa;
    kimi_acts_init(&xa, x, ldx, gate->cols, n);
    const kimi_mm_out from_x[] = { { &xa, gate, g, F }, { &xa, up, u, F } };
    int rc = kimi_mm_many(from_x, 2, pool, arena, err);
    if (rc) return rc;
    kimi_glu(hp, g, u, (int64_t)n * F, g); /* SwiGLU, or K3's SiTU */
    kimi_acts ga;
    kimi_acts_init(&ga, g, F, F, n);
    return kimi_mm(&ga, down, y, ldy, pool, arena, err);
}

/* ---- routed experts ------------------------------------------------------------------ */

struct kimi_experts {
    int storage;              /* EM_MOE_RESIDENT or EM_MOE_SSD */
    int n_layer;
    em_expert_store *store;   /* SSD */
    em_expert_cache *cache;   /* SSD */
    em_expert_stats *uses;    /* [n_layer] resident: expert uses, counted as hits */
    uint64_t resident_bytes, file_bytes;
    uint64_t n_experts;       /* routed experts over all MoE layers */
    /* cost-hint calibration (SSD): decayed sums of the exact bytes each layer's union would
     * read and of what the uniform-routing estimate predicted for it */
    double calib_exact, calib_pred;
};

#define CALIB_DECAY 0.99 /* per MoE layer forward: about the last 100 layer unions count */

#define EXPERTS_PER_RUN (EM_MATMUL_MULTI_MAX / 2 - 1) /* gate + up of each in one pool run, + shared */

/* The shared experts' products, riding along in the first pool runs of the routed experts
 * (fewer hand-offs; every product is computed exactly as on its own). */
typedef struct shared_job {
    bool pending;             /* not yet computed */
    const em_mat *gate, *up, *down;
    em_act act_gate, act_up;  /* the layer's input rows */
    float *g, *u;             /* [n][F] */
    uint8_t *down_buf;        /* activations of g for down (NULL: f32 in place) */
    em_act act_down;
    float *y;                 /* [n][ldy] the shared output */
    int64_t ldy;
    int n;
} shared_job;

/* One layer's expert work: the union's gathered input rows (row j of the union at j), their
 * activations, and per-union-row outputs. */
typedef struct expert_job {
    const kimi_hparams *hp;
    const kimi_ffn_w *w;
    const em_route_union *u;
    em_act act_gate, act_up;  /* the gathered rows, for gate / up */
    float *g, *up;            /* [nK][n_ff_exp] */
    float *out;               /* [nK][n_embd] each expert's output for each of its rows */
    uint8_t *down_buf;        /* activations of g for down (NULL: f32 in place) */
    uint64_t down_stride;
    em_pool *pool;
    shared_job *sh;           /* NULL, or the shared experts to compute along */
} expert_job;

static em_act act_rows(const em_act *a, int64_t r0, int64_t m) {
    em_act v = *a;
    v.n = m;
    v.data = (const uint8_t *)a->data + (uint64_t)r0 * a->stride;
    return v;
}

/* Expert d's matrices: one expert's rows of the stacked tensors, with d's bytes. */
static void expert_mats(const kimi_ffn_w *w, int64_t F, int64_t E, const em_expert_data *d, em_mat m[3]) {
    m[0] = em_mat_rows(&w->gate_exps, 0, F);
    m[1] = em_mat_rows(&w->up_exps, 0, F);
    m[2] = em_mat_rows(&w->down_exps, 0, E);
    for (int p = 0; p < 3; p++) m[p].data = d->part[p];
}

/* Runs experts d[0..n) (union indices idx) over their rows: em_expert_batch_fn. */
static int run_experts(void *vctx, const int *idx, const em_expert_data *d, int n, em_err *err) {
    const expert_job *job = vctx;
    const int64_t F = job->hp->n_ff_exp, E = job->w->gate_exps.cols; /* n_embd, or K3's latent width */
    const em_route_union *u = job->u;
    for (int c0 = 0; c0 < n; c0 += EXPERTS_PER_RUN) {
        const int nc = n - c0 < EXPERTS_PER_RUN ? n - c0 : EXPERTS_PER_RUN;
        shared_job *sh = job->sh && job->sh->pending ? job->sh : NULL;
        em_mat mats[EXPERTS_PER_RUN][3];
        em_act ag[EXPERTS_PER_RUN], au[EXPERTS_PER_RUN], ad[EXPERTS_PER_RUN];
        em_mm_item items[EM_MATMUL_MULTI_MAX];
        for (int j = 0; j < nc; j++) {
            const int i = idx[c0 + j], r0 = u->start[i], m = u->start[i + 1] - r0;
            expert_mats(job->w, F, E, &d[c0 + j], mats[j]);
            ag[j] = act_rows(&job->act_gate, r0, m);
            au[j] = act_rows(&job->act_up, r0, m);
            items[2 * j] = (em_mm_item){ &mats[j][0], &ag[j], job->g + r0 * F, F };
            items[2 * j + 1] = (em_mm_item){ &mats[j][1], &au[j], job->up + r0 * F, F };
        }
        int n_items = 2 * nc;
        if (sh) {
            const int64_t Fs = sh->gate->rows;
            items[n_items++] = (em_mm_item){ sh->gate, &sh->act_gate, sh->g, Fs };
            items[n_items++] = (em_mm_item){ sh->up, &sh->act_up, sh->u, Fs };
        }
        int rc = em_matmul_multi(job->pool, items, n_items, err);
        for (int j = 0; !rc && j < nc; j++) {
            const int i = idx[c0 + j], r0 = u->start[i], m = u->start[i + 1] - r0;
            float *g = job->g + r0 * F;
            kimi_glu(job->hp, g, job->up + r0 * F, (int64_t)m * F, g);
            void *buf = job->down_buf ? job->down_buf + (uint64_t)r0 * job->down_stride : NULL;
            rc = em_act_prepare(job->pool, mats[j][2].type, g, F, F, m, buf, &ad[j], err);
            items[j] = (em_mm_item){ &mats[j][2], &ad[j], job->out + r0 * E, E };
        }
        n_items = nc;
        if (!rc && sh) {
            const int64_t Fs = sh->gate->rows;
            kimi_glu(job->hp, sh->g, sh->u, (int64_t)sh->n * Fs, sh->g);
            rc = em_act_prepare(job->pool, sh->down->type, sh->g, Fs, Fs, sh->n, sh->down_buf, &sh->act_down, err);
            items[n_items++] = (em_mm_item){ sh->down, &sh->act_down, sh->y, sh->ldy };
        }
        if (!rc) rc = em_matmul_multi(job->pool, items, n_items, err);
        if (rc) return em_err_prefix(err, "expert %d", d[c0].expert);
        if (sh) sh->pending = false;
    }
    return EM_OK;
}

/* Activations of rows x[0..n) for weights of type wtype, from the arena. */
static int prepare_acts(int wtype, const float *x, int64_t cols, int64_t n, em_pool *pool, em_arena *arena,
                        em_act *out, em_err *err) {
    uint64_t bytes;
    int rc = em_act_bytes(wtype, cols, n, &bytes, err);
    if (rc) return rc;
    void *buf = bytes ? em_arena_alloc(arena, (size_t)bytes) : NULL;
    if (bytes && !buf) return em_err_set(err, EM_ENOMEM, "out of memory for %llu activation bytes", (unsigned long long)bytes);
    return em_act_prepare(pool, wtype, x, cols, cols, n, buf, out, err);
}

/* Every expert of the union, straight from the mapping. */
static int run_resident(const kimi_hparams *hp, const kimi_ffn_w *w, expert_job *job, em_arena *arena,
                        em_err *err) {
    const int n = job->u->n;
    const int64_t F = hp->n_ff_exp, E = w->gate_exps.cols;
    em_expert_data *d = em_arena_alloc(arena, (size_t)n * sizeof *d);
    int *idx = em_arena_alloc(arena, (size_t)n * sizeof *idx);
    if (!d || !idx) return em_err_set(err, EM_ENOMEM, "out of memory for %d experts", n);
    for (int i = 0; i < n; i++) {
        const int64_t e = job->u->expert[i];
        d[i] = (em_expert_data){ .layer = w->layer, .expert = (int)e };
        d[i].part[EM_EXPERT_GATE] = em_mat_rows(&w->gate_exps, e * F, F).data;
        d[i].part[EM_EXPERT_UP] = em_mat_rows(&w->up_exps, e * F, F).data;
        d[i].part[EM_EXPERT_DOWN] = em_mat_rows(&w->down_exps, e * E, E).data;
        idx[i] = i;
    }
    return run_experts(job, idx, d, n, err);
}

/* y[n][E] = sum over the routed experts of the rows (ids/wts: n x K); sh (or NULL) rides along. */
static int routed_experts(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, const int *ids,
                          const float *wts, float *y, shared_job *sh, em_pool *pool, em_arena *arena, em_err *err) {
    const int K = hp->n_expert_used;
    const int64_t E = w->gate_exps.cols, F = hp->n_ff_exp, nk = (int64_t)n * K;
    em_route_union u;
    int rc = em_route_union_build(&u, ids, wts, n, K, hp->n_expert, arena, err);
    if (rc) return rc;
    expert_job job = { .hp = hp, .w = w, .u = &u, .pool = pool, .sh = sh };
    float *xg = kimi_falloc(arena, (uint64_t)nk * E, "expert input rows", err);
    job.g = kimi_falloc(arena, (uint64_t)nk * F, "expert gate rows", err);
    job.up = kimi_falloc(arena, (uint64_t)nk * F, "expert up rows", err);
    job.out = kimi_falloc(arena, (uint64_t)nk * E, "expert output rows", err);
    if (!xg || !job.g || !job.up || !job.out) return EM_ENOMEM;
    for (int64_t j = 0; j < nk; j++) memcpy(xg + j * E, h + (int64_t)u.row[j] * E, (size_t)E * sizeof(float));
    if ((rc = prepare_acts(w->gate_exps.type, xg, E, nk, pool, arena, &job.act_gate, err))) return rc;
    if (em_dot_act_type(w->up_exps.type) == em_dot_act_type(w->gate_exps.type)) job.act_up = job.act_gate;
    else if ((rc = prepare_acts(w->up_exps.type, xg, E, nk, pool, arena, &job.act_up, err))) return rc;
    uint64_t down_bytes;
    if ((rc = em_act_bytes(w->down_exps.type, F, nk, &down_bytes, err))) return rc;
    if (down_bytes) {
        job.down_stride = down_bytes / (uint64_t)nk;
        job.down_buf = em_arena_alloc(arena, (size_t)down_bytes);
        if (!job.down_buf) return em_err_set(err, EM_ENOMEM, "out of memory for %llu activation bytes", (unsigned long long)down_bytes);
    }
    kimi_experts *xs = w->xs;
    if (xs && xs->cache) {
        xs->calib_exact = CALIB_DECAY * xs->calib_exact +
                          (double)em_expert_cache_miss_bytes(xs->cache, w->layer, u.expert, u.n);
        xs->calib_pred = CALIB_DECAY * xs->calib_pred +
                         (double)em_expert_cache_estimate_layer(xs->cache, w->layer, n, K);
        rc = em_expert_cache_run_batch(xs->cache, w->layer, u.expert, u.n, run_experts, &job, err);
    } else {
        rc = run_resident(hp, w, &job, arena, err);
        if (!rc && xs) xs->uses[w->layer].hits += (uint64_t)u.n;
    }
    if (rc) return em_err_prefix(err, "routed experts");
    /* the weighted sum: for every row its experts in ascending order, whatever the storage */
    memset(y, 0, (size_t)n * (size_t)E * sizeof(float));
    for (int i = 0; i < u.n; i++)
        for (int j = u.start[i]; j < u.start[i + 1]; j++)
            em_axpy(u.weight[j], job.out + (int64_t)j * E, E, y + (int64_t)u.row[j] * E);
    return EM_OK;
}

/* The shared experts' inputs and scratch (their products run with the routed experts'). */
static int shared_setup(const kimi_ffn_w *w, int n, const float *h, int64_t E, float *ys, shared_job *sh,
                        em_pool *pool, em_arena *arena, em_err *err) {
    const int64_t F = w->gate_sh.rows;
    *sh = (shared_job){ .pending = true, .gate = &w->gate_sh, .up = &w->up_sh, .down = &w->down_sh,
                        .y = ys, .ldy = E, .n = n };
    sh->g = kimi_falloc(arena, (uint64_t)n * F, "shared expert gate rows", err);
    sh->u = kimi_falloc(arena, (uint64_t)n * F, "shared expert up rows", err);
    if (!sh->g || !sh->u) return EM_ENOMEM;
    int rc = prepare_acts(w->gate_sh.type, h, E, n, pool, arena, &sh->act_gate, err);
    if (rc) return rc;
    if (em_dot_act_type(w->up_sh.type) == em_dot_act_type(w->gate_sh.type)) sh->act_up = sh->act_gate;
    else if ((rc = prepare_acts(w->up_sh.type, h, E, n, pool, arena, &sh->act_up, err))) return rc;
    uint64_t bytes;
    if ((rc = em_act_bytes(w->down_sh.type, F, n, &bytes, err))) return rc;
    if (bytes && !(sh->down_buf = em_arena_alloc(arena, (size_t)bytes)))
        return em_err_set(err, EM_ENOMEM, "out of memory for %llu activation bytes", (unsigned long long)bytes);
    return EM_OK;
}

static int moe_forward(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                       const kimi_route_out *ro, em_pool *pool, em_arena *arena, em_err *err) {
    const int X = hp->n_expert, K = hp->n_expert_used, E = hp->n_embd;
    float *logits = kimi_falloc(arena, (uint64_t)n * X, "router logits", err);
    float *scratch = kimi_falloc(arena, 3u * (uint64_t)X + (uint64_t)hp->n_group, "router scratch", err);
    float *wts = kimi_falloc(arena, (uint64_t)n * K, "expert weights", err);
    int *ids = em_arena_alloc(arena, (size_t)n * (size_t)K * sizeof(int));
    if (!logits || !scratch || !wts || !ids)
        return em_err_set(err, EM_ENOMEM, "out of memory for MoE scratch (%d rows)", n);

    kimi_acts xa;
    kimi_acts_init(&xa, h, E, E, n);
    int rc = kimi_mm(&xa, &w->router, logits, X, pool, arena, err);
    if (rc) return rc;
    for (int t = 0; t < n; t++) {
        float margin;
        kimi_route(hp, logits + (int64_t)t * X, w->router_bias, ids + t * K, wts + t * K, &margin, scratch);
        if (ro && ro->ids)
            for (int i = 0; i < K; i++) ro->ids[t * ro->ld_ids + i] = ids[t * K + i];
        if (ro && ro->margins) ro->margins[t * ro->ld_margins] = margin;
    }
    shared_job sh = { 0 };
    float *ys = NULL;
    if (w->gate_sh.rows > 0) {
        ys = kimi_falloc(arena, (uint64_t)n * E, "shared expert rows", err);
        if (!ys || (rc = shared_setup(w, n, h, E, ys, &sh, pool, arena, err))) return ys ? rc : EM_ENOMEM;
    }
    const float *xr; /* K3 latent MoE: the experts' input and sum at the latent width */
    float *yr;
    if ((rc = kimi_latent_in(hp, w, n, h, y, &xr, &yr, pool, arena, err)) ||
        (rc = routed_experts(hp, w, n, xr, ids, wts, yr, ys ? &sh : NULL, pool, arena, err)) ||
        (rc = kimi_latent_out(hp, w, n, yr, y, pool, arena, err)))
        return rc;
    if (ys) {
        if (sh.pending) { /* no routed run took it along */
            rc = swiglu_mlp(hp, &w->gate_sh, &w->up_sh, &w->down_sh, h, E, n, ys, E, pool, arena, err);
            if (rc) return em_err_prefix(err, "shared expert");
        }
        for (int64_t i = 0; i < (int64_t)n * E; i++) y[i] += ys[i];
    }
    return EM_OK;
}

int kimi_ffn_forward(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                     const kimi_route_out *ro, em_pool *pool, em_arena *arena, em_err *err) {
    if (w->moe) return moe_forward(hp, w, n, h, y, ro, pool, arena, err);
    return swiglu_mlp(hp, &w->gate, &w->up, &w->down, h, hp->n_embd, n, y, hp->n_embd, pool, arena, err);
}

/* ---- storage mode, summary, statistics, cost ------------------------------------------- */

#define AUTO_FIT_FRACTION 0.9   /* auto: resident when all tensors fit in this much MemAvailable */
#define DEFAULT_CACHE_FRACTION 0.5 /* default budget: this much of what the resident part leaves */

static uint64_t routed_bytes(const kimi_ffn_w *f) {
    return f->gate_exps.row_bytes * (uint64_t)f->gate_exps.rows + f->up_exps.row_bytes * (uint64_t)f->up_exps.rows +
           f->down_exps.row_bytes * (uint64_t)f->down_exps.rows;
}

/* An upper bound of one expert's cache slot of layer l (parts widened to the alignment). */
static uint64_t slot_bound(const em_expert_layer *L) {
    uint64_t b = 0;
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) b += em_align_up(L->part_bytes[p], EM_DIRECT_ALIGN) + EM_DIRECT_ALIGN;
    return b;
}

/* The default budget: half the memory left after the resident weights, at least the largest
 * slot, at most every slot. */
static uint64_t default_budget(const em_expert_store *s, uint64_t resident, uint64_t avail) {
    uint64_t largest = 0, all = 0;
    for (int l = 0; l < em_expert_store_n_layers(s); l++) {
        const em_expert_layer *L = em_expert_store_layer(s, l);
        if (L->n_expert == 0) continue;
        uint64_t b = slot_bound(L);
        if (b > largest) largest = b;
        all += b * (uint64_t)L->n_expert;
    }
    uint64_t want = avail > resident ? (uint64_t)((double)(avail - resident) * DEFAULT_CACHE_FRACTION) : 0;
    if (want < largest) want = largest;
    return want < all ? want : all;
}

static int open_ssd(kimi_experts *x, em_gguf *g, const em_model_opts *opts, uint64_t avail, em_err *err) {
    int rc = em_expert_store_open(&x->store, g, err);
    if (rc) return rc;
    em_expert_cache_opts co = {
        .budget = opts->expert_cache_bytes ? opts->expert_cache_bytes : default_budget(x->store, x->resident_bytes, avail),
    };
    return em_expert_cache_create(&x->cache, x->store, &co, err);
}

static void log_summary(const kimi_experts *x, const char *path, uint64_t routed) {
    char r[32], f[32], b[32];
    em_format_size(x->resident_bytes, r, sizeof r);
    if (!x->cache) {
        em_log(EM_LOG_INFO, "%s: experts resident: %s resident (routed experts %s of it), 0 B file-backed, no expert cache",
               path, r, em_format_size(routed, f, sizeof f));
        return;
    }
    bool uring, direct;
    em_expert_cache_io_info(x->cache, &uring, &direct);
    uint64_t budget = em_expert_cache_budget(x->cache);
    char pct[32];
    double share = (double)budget / (double)x->file_bytes;
    snprintf(pct, sizeof pct, share < 1.0 ? "%.0f%% of them" : "all fit", 100.0 * share);
    em_log(EM_LOG_INFO, "%s: experts ssd: %s resident, %s of routed experts file-backed, expert cache %s (%s; %s, %s)",
           path, r, em_format_size(x->file_bytes, f, sizeof f), em_format_size(budget, b, sizeof b), pct,
           uring ? "io_uring" : "pread", direct ? "O_DIRECT" : "buffered");
}

int kimi_experts_open(em_gguf *g, const kimi_hparams *hp, kimi_weights *w, const em_model_opts *opts,
                      em_err *err) {
    kimi_experts *x = em_calloc(1, sizeof *x, "expert storage", err);
    if (!x) return EM_ENOMEM;
    x->n_layer = hp->n_layer;
    x->uses = em_calloc((size_t)hp->n_layer, sizeof *x->uses, "expert statistics", err);
    if (!x->uses) {
        free(x);
        return EM_ENOMEM;
    }
    w->experts = x;
    uint64_t all = 0, routed = 0;
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) all += em_gguf_tensor_at(g, i)->bytes;
    for (int l = 0; l < hp->n_layer; l++) {
        kimi_ffn_w *f = &w->layers[l].ffn;
        f->layer = l;
        f->xs = x;
        if (f->moe) {
            routed += routed_bytes(f);
            x->n_experts += (uint64_t)hp->n_expert;
        }
    }
    uint64_t avail = em_experts_mem_available();
    int mode = opts->moe_storage;
    if (mode == EM_MOE_AUTO)
        mode = avail == 0 || (double)all <= AUTO_FIT_FRACTION * (double)avail ? EM_MOE_RESIDENT : EM_MOE_SSD;
    if (routed == 0) mode = EM_MOE_RESIDENT; /* nothing to stream */
    x->storage = mode;
    x->resident_bytes = mode == EM_MOE_SSD ? all - routed : all;
    x->file_bytes = mode == EM_MOE_SSD ? routed : 0;
    if (mode == EM_MOE_SSD) {
        int rc = open_ssd(x, g, opts, avail, err);
        if (rc) return em_err_prefix(err, "%s: --moe-storage ssd", em_gguf_path(g)); /* kimi_unload frees x */
    }
    if (mode == EM_MOE_RESIDENT && opts->expert_cache_bytes && routed > 0)
        em_log(EM_LOG_WARN, "%s: experts are resident%s: the expert cache budget is not used", em_gguf_path(g),
               opts->moe_storage == EM_MOE_AUTO ? " (the model fits in memory)" : "");
    log_summary(x, em_gguf_path(g), routed);
    return EM_OK;
}

void kimi_experts_close(kimi_experts *x) {
    if (!x) return;
    em_expert_cache_free(x->cache);
    em_expert_store_close(x->store);
    free(x->uses);
    free(x);
}

uint64_t kimi_experts_cost(const kimi_experts *x, int n, int k_used, double *seconds) {
    *seconds = 0.0;
    if (!x || !x->cache) return 0;
    uint64_t bytes = em_expert_cache_estimate(x->cache, n, k_used);
    /* routing is not uniform (the cache keeps the popular experts): scale by what the real
     * unions read against what the estimate said for them */
    if (x->calib_pred > 0) bytes = (uint64_t)((double)bytes * (x->calib_exact / x->calib_pred) + 0.5);
    em_expert_stats s;
    em_expert_cache_stats(x->cache, -1, &s);
    /* the rate measured so far once it means something, else a typical NVMe rate */
    double bps = s.read_seconds > 1e-3 && s.bytes_read > 0 ? (double)s.bytes_read / s.read_seconds : EM_NOMINAL_DISK_BPS;
    *seconds = (double)bytes / bps;
    return bytes;
}

int kimi_experts_stats(const kimi_experts *x, int layer, em_target_expert_counts *out, em_err *err) {
    (void)err;
    *out = (em_target_expert_counts){ .storage = x->storage, .resident_bytes = x->resident_bytes,
                                     .file_bytes = x->file_bytes, .n_experts = x->n_experts };
    em_expert_stats s = { 0 };
    if (x->cache) {
        em_expert_cache_stats(x->cache, layer, &s);
        out->cache_bytes = em_expert_cache_used(x->cache);
        out->cache_budget = em_expert_cache_budget(x->cache);
        for (int l = 0; l < x->n_layer; l++)
            if (em_expert_cache_slot_bytes(x->cache, l) > out->slot_bytes)
                out->slot_bytes = em_expert_cache_slot_bytes(x->cache, l);
    } else {
        for (int l = 0; l < x->n_layer; l++)
            if (layer < 0 || l == layer) s.hits += x->uses[l].hits;
    }
    out->bytes_read = s.bytes_read;
    out->reads = s.reads;
    out->hits = s.hits;
    out->misses = s.misses;
    out->read_seconds = s.read_seconds;
    return EM_OK;
}

int kimi_experts_fault(kimi_experts *x, int kind, uint64_t after_n_reads, em_err *err) {
    if (!x || !x->cache)
        return em_err_set(err, EM_EUNSUPPORTED, "expert fault: experts are resident, nothing is read from storage");
    if (kind != EM_EXPERT_FAULT_EIO && kind != EM_EXPERT_FAULT_SHORT)
        return em_err_set(err, EM_EINVAL, "expert fault: kind %d is not EIO or SHORT", kind);
    em_expert_cache_fault_arm(x->cache, kind, after_n_reads);
    return EM_OK;
}
