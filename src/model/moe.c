/* The feed-forward half of a kimi-linear layer: dense SwiGLU, or the MoE block
 *   s = sigmoid(x W_r^T) in fp32;  choice = s + bias
 *   [groups: keep the n_group_used groups with the largest sum of their top-2 choices]
 *   ids = top-k(choice);  weights = s[ids] (unbiased) [/ sum] * expert_weights_scale
 *   y = sum_e weights_e * W2_e(silu(W1_e x) * W3_e x) + shared(x)
 * as transformers computes it (its router always applies the group limit). Experts run once
 * over all rows routed to them (rows gathered, products on the pool). Rows are routed
 * independently, so the result for a row never depends on the other rows of the batch.
 * Ties in top-k go to the lower index. */
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
static int swiglu_mlp(const em_mat *gate, const em_mat *up, const em_mat *down, const float *x,
                      int64_t ldx, int n, float *y, int64_t ldy, em_pool *pool, em_arena *arena,
                      em_err *err) {
    const int64_t F = gate->rows;
    float *g = kimi_falloc(arena, (uint64_t)n * F, "MLP gate rows", err);
    float *u = kimi_falloc(arena, (uint64_t)n * F, "MLP up rows", err);
    if (!g || !u) return EM_ENOMEM;
    kimi_acts xa;
    kimi_acts_init(&xa, x, ldx, gate->cols, n);
    int rc = kimi_mm(&xa, gate, g, F, pool, arena, err);
    if (!rc) rc = kimi_mm(&xa, up, u, F, pool, arena, err);
    if (rc) return rc;
    em_swiglu(g, u, (int64_t)n * F, g);
    kimi_acts ga;
    kimi_acts_init(&ga, g, F, F, n);
    return kimi_mm(&ga, down, y, ldy, pool, arena, err);
}

static int moe_forward(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                       const kimi_route_out *ro, em_pool *pool, em_arena *arena, em_err *err) {
    const int X = hp->n_expert, K = hp->n_expert_used, E = hp->n_embd, F = hp->n_ff_exp;
    float *logits = kimi_falloc(arena, (uint64_t)n * X, "router logits", err);
    float *scratch = kimi_falloc(arena, 3u * (uint64_t)X + (uint64_t)hp->n_group, "router scratch", err);
    float *wts = kimi_falloc(arena, (uint64_t)n * K, "expert weights", err);
    int *ids = em_arena_alloc(arena, (size_t)n * (size_t)K * sizeof(int));
    int *count = em_arena_alloc(arena, (size_t)X * sizeof(int));
    int *rows = em_arena_alloc(arena, (size_t)n * sizeof(int));
    float *rw = kimi_falloc(arena, (uint64_t)n, "expert row weights", err);
    float *xg = kimi_falloc(arena, (uint64_t)n * E, "expert input rows", err);
    float *yg = kimi_falloc(arena, (uint64_t)n * E, "expert output rows", err);
    if (!logits || !scratch || !wts || !ids || !count || !rows || !rw || !xg || !yg)
        return em_err_set(err, EM_ENOMEM, "out of memory for MoE scratch (%d rows)", n);

    kimi_acts xa;
    kimi_acts_init(&xa, h, E, E, n);
    int rc = kimi_mm(&xa, &w->router, logits, X, pool, arena, err);
    if (rc) return rc;
    memset(count, 0, (size_t)X * sizeof(int));
    for (int t = 0; t < n; t++) {
        float margin;
        kimi_route(hp, logits + (int64_t)t * X, w->router_bias, ids + t * K, wts + t * K, &margin, scratch);
        for (int i = 0; i < K; i++) count[ids[t * K + i]]++;
        if (ro && ro->ids)
            for (int i = 0; i < K; i++) ro->ids[t * ro->ld_ids + i] = ids[t * K + i];
        if (ro && ro->margins) ro->margins[t * ro->ld_margins] = margin;
    }

    memset(y, 0, (size_t)n * (size_t)E * sizeof(float));
    for (int e = 0; e < X; e++) { /* each chosen expert once, over all its rows */
        if (count[e] == 0) continue;
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < K; i++)
                if (ids[t * K + i] == e) {
                    rows[m] = t;
                    rw[m] = wts[t * K + i];
                    memcpy(xg + (int64_t)m * E, h + (int64_t)t * E, (size_t)E * sizeof(float));
                    m++;
                }
        em_mat gate = em_mat_rows(&w->gate_exps, (int64_t)e * F, F);
        em_mat up = em_mat_rows(&w->up_exps, (int64_t)e * F, F);
        em_mat down = em_mat_rows(&w->down_exps, (int64_t)e * E, E);
        rc = swiglu_mlp(&gate, &up, &down, xg, E, m, yg, E, pool, arena, err);
        if (rc) return em_err_prefix(err, "expert %d", e);
        for (int j = 0; j < m; j++) em_axpy(rw[j], yg + (int64_t)j * E, E, y + (int64_t)rows[j] * E);
    }
    if (w->gate_sh.rows > 0) {
        rc = swiglu_mlp(&w->gate_sh, &w->up_sh, &w->down_sh, h, E, n, yg, E, pool, arena, err);
        if (rc) return em_err_prefix(err, "shared expert");
        for (int64_t i = 0; i < (int64_t)n * E; i++) y[i] += yg[i];
    }
    return EM_OK;
}

int kimi_ffn_forward(const kimi_hparams *hp, const kimi_ffn_w *w, int n, const float *h, float *y,
                     const kimi_route_out *ro, em_pool *pool, em_arena *arena, em_err *err) {
    if (w->moe) return moe_forward(hp, w, n, h, y, ro, pool, arena, err);
    return swiglu_mlp(&w->gate, &w->up, &w->down, h, hp->n_embd, n, y, hp->n_embd, pool, arena, err);
}
