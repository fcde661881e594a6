/* The feed-forward half of a kimi-linear layer: dense SwiGLU, or the MoE block
 *   s = sigmoid(x W_r^T) in fp32;  choice = s + bias
 *   [groups: keep the n_group_used groups with the largest sum of their top-2 choices]
 *   ids = top-k(choice);  weights = s[ids] (unbiased) [/ sum] * expert_weights_scale
 *   y = sum_e weights_e * W2_e(silu(W1_e x) * W3_e x) + shared(x)
 * as transformers computes it (its router always applies the group limit). Rows are routed
 * independently, so the result for a row never depends on the other rows of the batch.
 * Ties in top-k go to the lower index. kimi-k3: SiTU in place of SwiGLU in every MLP (glu
 * below), and latent MoE: the router and the shared experts see x, the routed experts work on
 * routed_down x at the latent width, their sum goes through routed_norm and routed_up.
 *
 * Routed experts (the same code for prefill, decoding and verification): the n rows' routes
 * form a union (experts/route); each needed expert runs once over all rows routed to it, the
 * gate/up products of many experts (and of the shared experts) in one pool run and their down
 * products in another. The experts' weights are whatever experts/ hands over for the union
 * (em_experts_run: mapped rows when resident, cached ones for SSD, hits computed while the
 * misses load); this file knows nothing of storage. Each expert writes its own output rows
 * and the weighted sum is taken afterwards in ascending expert order for every row, so the
 * logits do not depend on the storage mode, the cache budget or the order in which experts
 * arrive: resident and SSD are bit-identical. */
#include "model/kimi_impl.h"

#include <string.h>

/* The index of the largest value among v[0..n) not yet taken (lowest index on ties). */
static int take_max(const float *v, float *taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (taken[i] == 0.0f && (best < 0 || v[i] > v[best])) best = i;
    taken[best] = 1.0f;
    return best;
}

/* The router for one row (kimi_impl.h). */
void kimi_moe_route(const kimi_hparams *hp, const float *logits, const float *bias, int *ids,
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

/* The MLP activation of every FFN in place of silu(gate) * up: SiTU for K3, else SwiGLU. */
static void glu(const kimi_hparams *hp, const float *gate, const float *up, int64_t n, float *y) {
    if (hp->situ) em_situ(gate, up, hp->situ_beta, hp->situ_lin_beta, n, y);
    else em_swiglu(gate, up, n, y);
}

/* y = down(silu(gate x) * up x) over n rows of x (ldx), into y (ldy). */
static int swiglu_mlp(const kimi_hparams *hp, const em_mat *gate, const em_mat *up, const em_mat *down, const float *x,
                      int64_t ldx, int n, float *y, int64_t ldy, em_pool *pool, em_arena *arena,
                      em_err *err) {
    const int64_t F = gate->rows;
    float *g = em_falloc(arena, (uint64_t)n * F, "MLP gate rows", err);
    float *u = em_falloc(arena, (uint64_t)n * F, "MLP up rows", err);
    if (!g || !u) return EM_ENOMEM;
    em_acts xa;
    em_acts_init(&xa, x, ldx, gate->cols, n);
    const em_mm_out from_x[] = { { &xa, gate, g, F }, { &xa, up, u, F } };
    int rc = em_mm_many(from_x, 2, pool, arena, err);
    if (rc) return rc;
    glu(hp, g, u, (int64_t)n * F, g); /* SwiGLU, or K3's SiTU */
    em_acts ga;
    em_acts_init(&ga, g, F, F, n);
    return em_mm(&ga, down, y, ldy, pool, arena, err);
}

/* ---- routed experts ------------------------------------------------------------------ */

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
    em_phases *ph;
} expert_job;

static em_act act_rows(const em_act *a, int64_t r0, int64_t m) {
    em_act v = *a;
    v.n = m;
    v.data = (const uint8_t *)a->data + (uint64_t)r0 * a->stride;
    return v;
}

static uint64_t items_bytes(const em_mm_item *items, int n) {
    uint64_t b = 0;
    for (int i = 0; i < n; i++) b += em_mat_bytes(items[i].w);
    return b;
}

/* Runs experts v[0..n) (union indices idx) over their rows: em_experts_fn. */
static int run_experts(void *vctx, const int *idx, const em_expert_view *v, int n, em_err *err) {
    const expert_job *job = vctx;
    const int64_t F = job->hp->n_ff_exp, E = job->w->gate_exps.cols; /* n_embd, or K3's latent width */
    const em_route_union *u = job->u;
    for (int c0 = 0; c0 < n; c0 += EXPERTS_PER_RUN) {
        const int nc = n - c0 < EXPERTS_PER_RUN ? n - c0 : EXPERTS_PER_RUN;
        shared_job *sh = job->sh && job->sh->pending ? job->sh : NULL;
        em_act ag[EXPERTS_PER_RUN], au[EXPERTS_PER_RUN], ad[EXPERTS_PER_RUN];
        em_mm_item items[EM_MATMUL_MULTI_MAX];
        for (int j = 0; j < nc; j++) {
            const int i = idx[c0 + j], r0 = u->start[i], m = u->start[i + 1] - r0;
            const em_mat *mats = v[c0 + j].part;
            ag[j] = act_rows(&job->act_gate, r0, m);
            au[j] = act_rows(&job->act_up, r0, m);
            items[2 * j] = (em_mm_item){ &mats[EM_EXPERT_GATE], &ag[j], job->g + r0 * F, F };
            items[2 * j + 1] = (em_mm_item){ &mats[EM_EXPERT_UP], &au[j], job->up + r0 * F, F };
        }
        int n_items = 2 * nc;
        if (sh) {
            const int64_t Fs = sh->gate->rows;
            items[n_items++] = (em_mm_item){ sh->gate, &sh->act_gate, sh->g, Fs };
            items[n_items++] = (em_mm_item){ sh->up, &sh->act_up, sh->u, Fs };
        }
        int rc = em_matmul_multi(job->pool, items, n_items, err);
        em_phases_lap(job->ph, KP_EXPERT_UP, items_bytes(items, n_items));
        for (int j = 0; !rc && j < nc; j++) {
            const int i = idx[c0 + j], r0 = u->start[i], m = u->start[i + 1] - r0;
            float *g = job->g + r0 * F;
            glu(job->hp, g, job->up + r0 * F, (int64_t)m * F, g);
            void *buf = job->down_buf ? job->down_buf + (uint64_t)r0 * job->down_stride : NULL;
            const em_mat *down = &v[c0 + j].part[EM_EXPERT_DOWN];
            rc = em_act_prepare(job->pool, down->type, g, F, F, m, buf, &ad[j], err);
            items[j] = (em_mm_item){ down, &ad[j], job->out + r0 * E, E };
        }
        n_items = nc;
        if (!rc && sh) {
            const int64_t Fs = sh->gate->rows;
            glu(job->hp, sh->g, sh->u, (int64_t)sh->n * Fs, sh->g);
            rc = em_act_prepare(job->pool, sh->down->type, sh->g, Fs, Fs, sh->n, sh->down_buf, &sh->act_down, err);
            items[n_items++] = (em_mm_item){ sh->down, &sh->act_down, sh->y, sh->ldy };
        }
        if (!rc) rc = em_matmul_multi(job->pool, items, n_items, err);
        if (rc) return em_err_prefix(err, "expert %d", v[c0].expert);
        em_phases_lap(job->ph, KP_EXPERT_DOWN, items_bytes(items, n_items));
        if (sh) sh->pending = false;
    }
    return EM_OK;
}

/* The activations of rows x[0..n) for gate and up (one conversion when they take one type). */
static int gathered_acts(const em_mat *gate, const em_mat *up, const float *x, int64_t cols, int64_t n, em_pool *pool,
                         em_arena *arena, em_act *act_gate, em_act *act_up, em_err *err) {
    em_acts xa;
    em_acts_init(&xa, x, cols, cols, n);
    const em_act *a;
    int rc = em_acts_for(&xa, gate->type, pool, arena, &a, err);
    if (rc) return rc;
    *act_gate = *a;
    if ((rc = em_acts_for(&xa, up->type, pool, arena, &a, err))) return rc;
    *act_up = *a;
    return EM_OK;
}

/* y[n][E] = sum over the routed experts of the rows (ids/wts: n x K); sh (or NULL) rides along. */
static int routed_experts(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, const int *ids,
                          const float *wts, float *y, shared_job *sh, em_pool *pool, em_arena *arena, em_phases *ph,
                          em_err *err) {
    const int K = hp->n_expert_used;
    const int64_t E = w->gate_exps.cols, F = hp->n_ff_exp, nk = (int64_t)n * K;
    em_route_union u;
    int rc = em_route_union_build(&u, ids, wts, n, K, hp->n_expert, arena, err);
    if (rc) return rc;
    expert_job job = { .hp = hp, .w = w, .u = &u, .pool = pool, .sh = sh, .ph = ph };
    float *xg = em_falloc(arena, (uint64_t)nk * E, "expert input rows", err);
    job.g = em_falloc(arena, (uint64_t)nk * F, "expert gate rows", err);
    job.up = em_falloc(arena, (uint64_t)nk * F, "expert up rows", err);
    job.out = em_falloc(arena, (uint64_t)nk * E, "expert output rows", err);
    if (!xg || !job.g || !job.up || !job.out) return EM_ENOMEM;
    for (int64_t j = 0; j < nk; j++) memcpy(xg + j * E, h + (int64_t)u.row[j] * E, (size_t)E * sizeof(float));
    if ((rc = gathered_acts(&w->gate_exps, &w->up_exps, xg, E, nk, pool, arena, &job.act_gate, &job.act_up, err)))
        return rc;
    uint64_t down_bytes;
    if ((rc = em_act_bytes(w->down_exps.type, F, nk, &down_bytes, err))) return rc;
    if (down_bytes) {
        job.down_stride = down_bytes / (uint64_t)nk;
        job.down_buf = em_arena_alloc(arena, (size_t)down_bytes);
        if (!job.down_buf) return em_err_set(err, EM_ENOMEM, "out of memory for %llu activation bytes", (unsigned long long)down_bytes);
    }
    em_phases_lap(ph, KP_EXPERT_PREP, 0);
    rc = em_experts_run(w->xs, w->layer, u.expert, u.n, n, K, run_experts, &job, err);
    if (rc) return em_err_prefix(err, "routed experts");
    em_phases_lap(ph, KP_EXPERT_DOWN, 0); /* waits for storage, if any: reads the gate/up laps do not cover */
    /* the weighted sum: for every row its experts in ascending order, whatever the storage */
    memset(y, 0, (size_t)n * (size_t)E * sizeof(float));
    for (int i = 0; i < u.n; i++)
        for (int j = u.start[i]; j < u.start[i + 1]; j++)
            em_axpy(u.weight[j], job.out + (int64_t)j * E, E, y + (int64_t)u.row[j] * E);
    em_phases_lap(ph, KP_EXPERT_SUM, 0);
    return EM_OK;
}

/* The shared experts' inputs and scratch (their products run with the routed experts'). */
static int shared_setup(const kimi_ffn_w *w, int n, const float *h, int64_t E, float *ys, shared_job *sh,
                        em_pool *pool, em_arena *arena, em_err *err) {
    const int64_t F = w->gate_sh.rows;
    *sh = (shared_job){ .pending = true, .gate = &w->gate_sh, .up = &w->up_sh, .down = &w->down_sh,
                        .y = ys, .ldy = E, .n = n };
    sh->g = em_falloc(arena, (uint64_t)n * F, "shared expert gate rows", err);
    sh->u = em_falloc(arena, (uint64_t)n * F, "shared expert up rows", err);
    if (!sh->g || !sh->u) return EM_ENOMEM;
    int rc = gathered_acts(&w->gate_sh, &w->up_sh, h, E, n, pool, arena, &sh->act_gate, &sh->act_up, err);
    if (rc) return rc;
    uint64_t bytes;
    if ((rc = em_act_bytes(w->down_sh.type, F, n, &bytes, err))) return rc;
    if (bytes && !(sh->down_buf = em_arena_alloc(arena, (size_t)bytes)))
        return em_err_set(err, EM_ENOMEM, "out of memory for %llu activation bytes", (unsigned long long)bytes);
    return EM_OK;
}

/* ---- latent MoE (K3) ----------------------------------------------------------------------
 * in: xr = routed_down h ([n][L], from the arena) and yr (a zeroed [n][L] for the experts'
 * weighted sum), or h and y themselves when the layer has no latent projection.
 * out: y = routed_up RMSNorm(yr) (no-op without latent). */

static int latent_in(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                     const float **xr, float **yr, em_pool *pool, em_arena *arena, em_err *err) {
    if (w->routed_down.rows == 0) {
        *xr = h;
        *yr = y;
        return EM_OK;
    }
    const int64_t lat = w->routed_down.rows;
    float *x = em_falloc(arena, (uint64_t)n * (uint64_t)lat, "latent expert input rows", err);
    float *s = em_falloc(arena, (uint64_t)n * (uint64_t)lat, "latent expert sum rows", err);
    if (!x || !s) return EM_ENOMEM;
    em_acts ha;
    em_acts_init(&ha, h, hp->n_embd, hp->n_embd, n);
    int rc = em_mm(&ha, &w->routed_down, x, lat, pool, arena, err);
    if (rc) return em_err_prefix(err, "routed_down");
    memset(s, 0, (size_t)n * (size_t)lat * sizeof(float));
    *xr = x;
    *yr = s;
    return EM_OK;
}

static int latent_out(const kimi_hparams *hp, const kimi_ffn_w *w, int n, float *yr, float *y,
                      em_pool *pool, em_arena *arena, em_err *err) {
    if (w->routed_down.rows == 0) return EM_OK;
    const int64_t lat = w->routed_down.rows;
    if (w->routed_norm)
        em_rmsnorm_rows(yr, lat, w->routed_norm, hp->rms_eps, n, lat, yr, lat);
    em_acts sa;
    em_acts_init(&sa, yr, lat, lat, n);
    int rc = em_mm(&sa, &w->routed_up, y, hp->n_embd, pool, arena, err);
    return rc ? em_err_prefix(err, "routed_up") : EM_OK;
}

static int moe_forward(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                       const kimi_route_out *ro, em_pool *pool, em_arena *arena, em_phases *ph, em_err *err) {
    const int X = hp->n_expert, K = hp->n_expert_used, E = hp->n_embd;
    float *logits = em_falloc(arena, (uint64_t)n * X, "router logits", err);
    float *scratch = em_falloc(arena, 3u * (uint64_t)X + (uint64_t)hp->n_group, "router scratch", err);
    float *wts = em_falloc(arena, (uint64_t)n * K, "expert weights", err);
    int *ids = em_arena_alloc(arena, (size_t)n * (size_t)K * sizeof(int));
    if (!logits || !scratch || !wts || !ids)
        return em_err_set(err, EM_ENOMEM, "out of memory for MoE scratch (%d rows)", n);

    em_acts xa;
    em_acts_init(&xa, h, E, E, n);
    int rc = em_mm(&xa, &w->router, logits, X, pool, arena, err);
    if (rc) return rc;
    for (int t = 0; t < n; t++) {
        float margin;
        kimi_moe_route(hp, logits + (int64_t)t * X, w->router_bias, ids + t * K, wts + t * K, &margin, scratch);
        if (ro && ro->ids)
            for (int i = 0; i < K; i++) ro->ids[t * ro->ld_ids + i] = ids[t * K + i];
        if (ro && ro->margins) ro->margins[t * ro->ld_margins] = margin;
    }
    if (ro && ro->tokens && (rc = em_experts_note(w->xs, w->layer, ro->tokens, ids, n, K, err))) return rc;
    em_phases_lap(ph, KP_ROUTER, em_mat_bytes(&w->router));
    shared_job sh = { 0 };
    float *ys = NULL;
    if (w->gate_sh.rows > 0) {
        ys = em_falloc(arena, (uint64_t)n * E, "shared expert rows", err);
        if (!ys || (rc = shared_setup(w, n, h, E, ys, &sh, pool, arena, err))) return ys ? rc : EM_ENOMEM;
    }
    const float *xr = NULL; /* K3 latent MoE: the experts' input and sum at the latent width */
    float *yr = NULL;
    if ((rc = latent_in(hp, w, n, h, y, &xr, &yr, pool, arena, err))) return rc;
    em_phases_lap(ph, KP_EXPERT_PREP, em_mat_bytes(&w->routed_down));
    if ((rc = routed_experts(hp, w, n, xr, ids, wts, yr, ys ? &sh : NULL, pool, arena, ph, err)) ||
        (rc = latent_out(hp, w, n, yr, y, pool, arena, err)))
        return rc;
    em_phases_lap(ph, KP_EXPERT_SUM, em_mat_bytes(&w->routed_up));
    if (ys) {
        if (sh.pending) { /* no routed run took it along */
            rc = swiglu_mlp(hp, &w->gate_sh, &w->up_sh, &w->down_sh, h, E, n, ys, E, pool, arena, err);
            if (rc) return em_err_prefix(err, "shared expert");
        }
        for (int64_t i = 0; i < (int64_t)n * E; i++) y[i] += ys[i];
        em_phases_lap(ph, KP_EXPERT_SUM, 0);
    }
    return EM_OK;
}

int kimi_ffn_forward(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                     const kimi_route_out *ro, em_pool *pool, em_arena *arena, em_phases *ph, em_err *err) {
    if (w->moe) return moe_forward(hp, w, n, h, y, ro, pool, arena, ph, err);
    int rc = swiglu_mlp(hp, &w->gate, &w->up, &w->down, h, hp->n_embd, n, y, hp->n_embd, pool, arena, err);
    em_phases_lap(ph, KP_MLP, em_mat_bytes(&w->gate) + em_mat_bytes(&w->up) + em_mat_bytes(&w->down));
    return rc;
}
