/* The kimi-linear target: the forward pass over a batch of rows (embedding, per layer
 * RMSNorm -> KDA or MLA -> residual -> RMSNorm -> dense MLP or MoE -> residual, final norm,
 * lm head), the KDA layer's projections around the recurrent core of kda.c, and the target
 * ops of model.h (verify / commit / prefill / cost / reset). The same target runs kimi-k3:
 * its extra parts (AttnRes layer inputs, full-rank KDA gate, bounded decay gate; attnres.c,
 * mla.c, moe.c) switch on from the hyperparameters and leave kimi-linear's path unchanged.
 * The top of model/'s tree: it calls mla.c, moe.c, attnres.c, kda.c and kimi_load.c, which
 * never call back; routed experts come from an experts/ provider it opens and closes.
 *
 * State: per KDA layer a committed em_kda_state and a transition log; per MLA layer a latent
 * cache of n_ctx rows, where rows < pos are committed and rows >= pos are scratch that a
 * verify writes and a commit keeps by advancing pos. A verify never writes a committed
 * state or a cache row < pos. Scratch comes from one arena reset per step; it is re-made
 * larger only when a step needed more than any before (no allocation in steady decoding).
 * Weights are only read. The LM head runs only for the rows whose logits or argmax the caller
 * asked for (em_rows); an argmax is em_argmax (sample.h: the sampler's greedy rule) of the very
 * floats the row's logits would be. */
#include "model/kimi_impl.h"
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum step_mode {
    STEP_LOGGED,   /* verify: KDA transitions into the logs, committed state untouched */
    STEP_UNLOGGED, /* verify wider than the logs: commit will replay the tokens */
    STEP_COMMIT,   /* prefill / replay: KDA states updated in place */
};

typedef struct kimi {
    em_target base;
    em_gguf *g;
    kimi_hparams hp;
    kimi_weights w;
    em_pool *pool;
    int ubatch;
    int feature_layer[EM_MODEL_MAX_FEATURE_LAYERS];
    int n_feature_layers;
    em_kda_dims kda_dims;
    em_kda_state *kda_state; /* [n_kda] committed */
    em_kda_log **kda_log;    /* [n_kda] transitions of the last logged verify */
    float **mla_cache;       /* [n_mla][n_ctx][kv_lora + rope] */
    int32_t *replay_tok;     /* [n_ctx] tokens of the last unlogged verify */
    bool replay;             /* the pending verify was unlogged */
    em_arena *arena;
    size_t arena_cap;
    em_experts_src *expert_src; /* [n_layer] the routed-expert tensors, as experts/ sees them */
    em_experts *experts;     /* their provider (storage mode, cache, statistics) */
    em_device_costs dev;     /* nominal rates of the device the target runs on */
    /* cost model: bytes read per verify besides routed experts, per-expert bytes per MoE layer */
    uint64_t dense_bytes, expert_bytes;
    int n_moe;
    double cost_scale;       /* measured / estimated seconds, smoothed */
    em_phases phases;        /* time by phase (off unless em_target_phases_enable) */
} kimi;

const char *const kimi_phase_names[KP_COUNT] = {
    [KP_EMBED] = "embed", [KP_NORM] = "norms+residual", [KP_KDA_PROJ] = "kda.projections",
    [KP_KDA_CORE] = "kda.recurrence", [KP_KDA_OUT] = "kda.output", [KP_MLA_PROJ] = "mla.projections",
    [KP_MLA_ATTN] = "mla.attention", [KP_MLA_OUT] = "mla.output", [KP_ROUTER] = "moe.router",
    [KP_EXPERT_PREP] = "moe.gather", [KP_EXPERT_UP] = "moe.gate_up", [KP_EXPERT_DOWN] = "moe.down",
    [KP_EXPERT_SUM] = "moe.sum", [KP_MLP] = "dense_mlp", [KP_LM_HEAD] = "lm_head",
    [KP_KDA_COMMIT] = "kda.commit",
};

/* ---- step helpers --------------------------------------------------------------------- */

/* Resets the step arena, re-making it in one block when the last step outgrew it. */
static int arena_begin(kimi *k, em_err *err) {
    size_t used = em_arena_used(k->arena);
    if (used <= k->arena_cap) {
        em_arena_reset(k->arena);
        return EM_OK;
    }
    size_t cap = used + used / 4;
    em_arena *a;
    int rc = em_arena_create(&a, cap, err);
    if (rc) return rc;
    em_arena_free(k->arena);
    k->arena = a;
    k->arena_cap = cap;
    return EM_OK;
}

static void rmsnorm_rows(const float *x, const float *w, float eps, int n, int64_t width, float *y) {
    em_rmsnorm_rows(x, width, w, eps, n, width, y, width);
}

/* ---- KDA layer: projections around the recurrent core ---------------------------------- */

static uint64_t kda_proj_bytes(const kimi_kda_w *w) {
    return em_mat_bytes(&w->q) + em_mat_bytes(&w->k) + em_mat_bytes(&w->v) + em_mat_bytes(&w->beta) +
           em_mat_bytes(&w->f_a) + em_mat_bytes(&w->f_b) + em_mat_bytes(&w->g_a) + em_mat_bytes(&w->g_b) +
           em_mat_bytes(&w->g);
}

static int kda_layer(kimi *k, const kimi_layer *ly, int n, int mode, const float *h, float *y,
                     em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const kimi_kda_w *w = &ly->kda;
    const int64_t D = hp->d_inner, hd = hp->kda_head_dim;
    em_arena *a = k->arena;
    em_pool *pool = k->pool;
    float *qkv = em_falloc(a, (uint64_t)n * 3 * D, "KDA q/k/v rows", err);
    float *f = em_falloc(a, (uint64_t)n * D, "KDA gate rows", err);
    float *g2 = em_falloc(a, (uint64_t)n * D, "KDA output gate rows", err);
    float *o = em_falloc(a, (uint64_t)n * D, "KDA output rows", err);
    float *b = em_falloc(a, (uint64_t)n * hp->kda_heads, "KDA beta rows", err);
    float *low_f = em_falloc(a, (uint64_t)n * hd, "KDA gate low-rank rows", err);
    float *low_g = em_falloc(a, (uint64_t)n * hd, "KDA output gate low-rank rows", err);
    if (!qkv || !f || !g2 || !o || !b || !low_f || !low_g) return EM_ENOMEM;
    /* every product of the normed input in one pool run, then the two low-rank ups in one */
    em_acts xa, fa, ga;
    em_acts_init(&xa, h, hp->n_embd, hp->n_embd, n);
    const bool full_gate = w->g.rows > 0; /* K3: g2 = ssm_g x, no low-rank pair */
    const em_mm_out from_x[] = {
        { &xa, &w->q, qkv, 3 * D },         { &xa, &w->k, qkv + D, 3 * D },
        { &xa, &w->v, qkv + 2 * D, 3 * D }, { &xa, &w->beta, b, hp->kda_heads },
        { &xa, &w->f_a, low_f, hd },
        full_gate ? (em_mm_out){ &xa, &w->g, g2, D } : (em_mm_out){ &xa, &w->g_a, low_g, hd },
    };
    int rc = em_mm_many(from_x, 6, pool, a, err);
    if (rc) return rc;
    em_acts_init(&fa, low_f, hd, hd, n);
    em_acts_init(&ga, low_g, hd, hd, n);
    const em_mm_out from_low[] = { { &fa, &w->f_b, f, D }, { &ga, &w->g_b, g2, D } };
    if ((rc = em_mm_many(from_low, full_gate ? 1 : 2, pool, a, err))) return rc;
    em_phases_lap(&k->phases, KP_KDA_PROJ, kda_proj_bytes(w));

    em_kda_state *st = &k->kda_state[ly->slot];
    if (mode == STEP_COMMIT)
        rc = em_kda_forward_commit(&k->kda_dims, &w->p, st, n, qkv, f, b, g2, o, pool, a, err);
    else
        rc = em_kda_forward(&k->kda_dims, &w->p, st, n, qkv, f, b, g2, o,
                            mode == STEP_LOGGED ? k->kda_log[ly->slot] : NULL, pool, a, err);
    if (rc) return rc;
    em_phases_lap(&k->phases, KP_KDA_CORE, 0);
    em_acts oa;
    em_acts_init(&oa, o, D, D, n);
    rc = em_mm(&oa, &w->out, y, hp->n_embd, pool, a, err);
    em_phases_lap(&k->phases, KP_KDA_OUT, em_mat_bytes(&w->out));
    return rc;
}

/* ---- one forward step over n rows at positions pos.. ------------------------------------ */

typedef struct step_out {
    const em_rows *rows; /* logits / argmax requests (NULL: none) of the caller's n_req rows, */
    int r0, n_req;       /* of which this step runs rows r0 .. r0 + n - 1 */
    float *features; /* NULL or [n][n_feat] */
    int32_t *routes; /* NULL or [n][n_route] */
    float *margins;  /* NULL or [n][n_moe_layers] */
} step_out;

/* Where request row r (of n) puts its logits / argmax (em_rows in model.h), or NULL. */
static float *logit_dst(const em_rows *o, int r, int n, int64_t n_vocab) {
    if (!o || !o->logits) return NULL;
    if (o->last_only) return r == n - 1 ? o->logits : NULL;
    return !o->logit_rows || o->logit_rows[r] ? o->logits + (int64_t)r * n_vocab : NULL;
}

static int32_t *argmax_dst(const em_rows *o, int r, int n) {
    if (!o || !o->argmax) return NULL;
    if (o->last_only) return r == n - 1 ? o->argmax : NULL;
    return !o->argmax_rows || o->argmax_rows[r] ? o->argmax + r : NULL;
}

/* The greedy token of a row: em_argmax, -1 when no logit is usable (all NaN or -inf). */
static int32_t row_argmax(const float *row, int32_t n_vocab) {
    int32_t id = em_argmax(row, n_vocab);
    return id >= 0 && row[id] != -INFINITY ? id : -1;
}

#define HEAD_ROWS 32 /* rows per LM head product into scratch (argmax-only or scattered rows) */

/* Final norm and LM head of the step's wanted rows (x: the residual rows, h: scratch [n][E]).
 * When the wanted rows are one run whose logits all go to the caller, the product writes there
 * directly (every prompt and sampled verify); otherwise rows are gathered, HEAD_ROWS at a time,
 * into scratch and copied / reduced to their argmax. Either way each row's floats are those of
 * a one-row product (rows do not interact in the norm or the product). */
static int lm_head(kimi *k, kimi_resbank *bank, const float *x, int n, const step_out *so, float *h,
                   em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    int first = -1, count = 0;
    bool direct = true; /* one run, every row with a logits destination */
    for (int t = 0; t < n; t++) {
        float *lg = logit_dst(so->rows, so->r0 + t, so->n_req, V);
        if (!lg && !argmax_dst(so->rows, so->r0 + t, so->n_req)) continue;
        if (first < 0) first = t;
        if (t != first + count || !lg) direct = false;
        count++;
    }
    if (count == 0) return EM_OK;
    em_acts ha;
    if (direct) {
        rmsnorm_rows(kimi_res_input(bank, x, k->w.output_res, first, count), k->w.output_norm, hp->rms_eps, count, E, h);
        em_acts_init(&ha, h, E, E, count);
        float *y = logit_dst(so->rows, so->r0 + first, so->n_req, V);
        int rc = em_mm(&ha, &k->w.output, y, V, k->pool, k->arena, err);
        for (int j = 0; !rc && j < count; j++) {
            int32_t *am = argmax_dst(so->rows, so->r0 + first + j, so->n_req);
            if (am) *am = row_argmax(y + j * V, (int32_t)V);
        }
        em_phases_lap(&k->phases, KP_LM_HEAD, em_mat_bytes(&k->w.output));
        return rc;
    }
    const int cap = count < HEAD_ROWS ? count : HEAD_ROWS;
    float *y = em_falloc(k->arena, (uint64_t)cap * (uint64_t)V, "LM head rows", err);
    int idx[HEAD_ROWS];
    if (!y) return EM_ENOMEM;
    for (int t = first; t < n;) {
        int m = 0;
        for (; t < n && m < cap; t++) /* the next wanted rows, packed into h */
            if (logit_dst(so->rows, so->r0 + t, so->n_req, V) || argmax_dst(so->rows, so->r0 + t, so->n_req)) {
                rmsnorm_rows(kimi_res_input(bank, x, k->w.output_res, t, 1), k->w.output_norm, hp->rms_eps, 1, E,
                             h + m * E);
                idx[m++] = t;
            }
        if (m == 0) break;
        em_acts_init(&ha, h, E, E, m);
        int rc = em_mm(&ha, &k->w.output, y, V, k->pool, k->arena, err);
        if (rc) return rc;
        for (int j = 0; j < m; j++) {
            const int r = so->r0 + idx[j];
            float *lg = logit_dst(so->rows, r, so->n_req, V);
            int32_t *am = argmax_dst(so->rows, r, so->n_req);
            if (lg) memcpy(lg, y + j * V, (size_t)V * sizeof *lg);
            if (am) *am = row_argmax(y + j * V, (int32_t)V);
        }
    }
    em_phases_lap(&k->phases, KP_LM_HEAD, em_mat_bytes(&k->w.output)); /* counted once, as em_cost counts it */
    return EM_OK;
}

static int step(kimi *k, const int32_t *tok, int n, int64_t pos, int mode, const step_out *so,
                em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const int64_t E = hp->n_embd;
    int rc = arena_begin(k, err);
    if (rc) return rc;
    em_arena *a = k->arena;
    float *x = em_falloc(a, (uint64_t)n * E, "residual rows", err);
    float *h = em_falloc(a, (uint64_t)n * E, "normed rows", err);
    float *y = em_falloc(a, (uint64_t)n * E, "layer output rows", err);
    if (!x || !h || !y) return EM_ENOMEM;
    kimi_resbank bank; /* K3 AttnRes (off for kimi-linear: every layer input is x) */
    if ((rc = kimi_res_init(&bank, hp, n, a, err))) return rc;
    int moe_index = 0;
    em_phases *ph = &k->phases;
    em_phases_start(ph);
    for (int t = 0; t < n; t++) {
        const uint8_t *row = (const uint8_t *)k->w.tok_embd.data + (uint64_t)tok[t] * k->w.tok_embd.row_bytes;
        if ((rc = em_dequantize(k->w.tok_embd.type, row, x + t * E, E, err))) return rc;
    }
    em_phases_lap(ph, KP_EMBED, (uint64_t)n * k->w.tok_embd.row_bytes);
    for (int l = 0; l < hp->n_layer; l++) {
        const kimi_layer *ly = &k->w.layers[l];
        rmsnorm_rows(kimi_res_input(&bank, x, ly->attn_res, 0, n), ly->attn_norm, hp->rms_eps, n, E, h);
        const bool restart = kimi_res_push(&bank, l, x); /* the stream restarts from y */
        em_phases_lap(ph, KP_NORM, 0);
        if (ly->kind == KIMI_KDA)
            rc = kda_layer(k, ly, n, mode, h, y, err);
        else
            rc = kimi_mla_forward(hp, &ly->mla, k->mla_cache[ly->slot], pos, n, h, y, k->pool, a, ph, err);
        if (rc) return em_err_prefix(err, "layer %d (%s)", l, ly->kind == KIMI_KDA ? "KDA" : "MLA");
        if (restart) memcpy(x, y, (size_t)n * (size_t)E * sizeof(float));
        else for (int64_t i = 0; i < n * E; i++) x[i] += y[i];
        rmsnorm_rows(kimi_res_input(&bank, x, ly->ffn_res, 0, n), ly->ffn_norm, hp->rms_eps, n, E, h);
        em_phases_lap(ph, KP_NORM, 0);
        const em_target_info *info = &k->base.info;
        kimi_route_out ro = {
            .ids = so->routes ? so->routes + (int64_t)moe_index * hp->n_expert_used : NULL,
            .ld_ids = info->n_route,
            .margins = so->margins ? so->margins + moe_index : NULL,
            .ld_margins = info->n_moe_layers,
            .tokens = tok,
        };
        if (ly->ffn.moe) moe_index++;
        if ((rc = kimi_ffn_forward(hp, &ly->ffn, n, h, y, &ro, k->pool, a, ph, err)))
            return em_err_prefix(err, "layer %d (%s)", l, ly->ffn.moe ? "MoE" : "MLP");
        for (int64_t i = 0; i < n * E; i++) x[i] += y[i];
        for (int f = 0; f < k->n_feature_layers && so->features; f++)
            if (k->feature_layer[f] == l)
                for (int t = 0; t < n; t++)
                    memcpy(so->features + (int64_t)t * k->base.info.n_feat + f * E, x + t * E, (size_t)E * sizeof(float));
        em_phases_lap(ph, KP_NORM, 0);
    }
    return lm_head(k, &bank, x, n, so, h, err);
}

/* ---- cost model --------------------------------------------------------------------------- */

static double raw_cost(const kimi *k, int n, int64_t pos, uint64_t *bytes_out) {
    const kimi_hparams *hp = &k->hp;
    double experts = 0.0;
    if (k->n_moe > 0) { /* expected distinct experts chosen by n rows */
        double p_miss = 1.0 - (double)hp->n_expert_used / hp->n_expert;
        experts = hp->n_expert * (1.0 - pow(p_miss, n));
    }
    double bytes = (double)k->dense_bytes + experts * k->n_moe * (double)k->expert_bytes;
    /* each weight byte is about one multiply-add per row; MLA attention reads the cache */
    double attn = 2.0 * n * (double)(pos + n) * hp->mla_heads * (2.0 * hp->kv_lora + hp->rope) * hp->n_mla;
    double flops = 2.0 * n * ((double)k->dense_bytes + (double)hp->n_expert_used * k->n_moe * k->expert_bytes) + attn;
    if (bytes_out) *bytes_out = (uint64_t)bytes;
    /* one figure for all of it (weights and attention alike), as the CPU rates were set on */
    const em_work w = { .bytes = bytes, .flops = { [EM_WORK_WEIGHTS] = flops } };
    return em_device_seconds(&k->dev, &w);
}

static em_cost kimi_cost(const em_target *t, int n) {
    const kimi *k = (const kimi *)t;
    uint64_t weights;
    double nominal = raw_cost(k, n, t->pos, &weights);
    double io_s; /* routed experts the cache would miss (experts/; 0 when resident) */
    uint64_t io = em_experts_cost(k->experts, n, k->hp.n_expert_used, &io_s);
    return (em_cost){ .seconds = nominal * k->cost_scale + io_s, .bytes_read = io,
                      .nominal_seconds = nominal + (double)io / k->dev.disk_bps, .weight_bytes = weights };
}

static int kimi_expert_stats(const em_target *t, int layer, em_target_expert_counts *out, em_err *err) {
    (void)err;
    em_experts_counts c;
    em_experts_stats(((const kimi *)t)->experts, layer, &c);
    *out = (em_target_expert_counts){
        .bytes_read = c.bytes_read, .reads = c.reads, .hits = c.hits, .misses = c.misses,
        .read_seconds = c.read_seconds, .prefetched = c.prefetched, .prefetch_used = c.prefetch_used,
        .cache_bytes = c.cache_bytes, .cache_budget = c.cache_budget,
        .slot_bytes = c.slot_bytes, .n_experts = c.n_experts, .resident_bytes = c.resident_bytes,
        .file_bytes = c.file_bytes, .storage = c.storage,
    };
    return EM_OK;
}

static void cost_learn(kimi *k, int n, int64_t pos, double seconds) {
    double est = raw_cost(k, n, pos, NULL);
    if (est > 0 && seconds > 0) k->cost_scale = 0.8 * k->cost_scale + 0.2 * (seconds / est);
}

/* ---- target ops --------------------------------------------------------------------------- */

static void kimi_reset(em_target *t) {
    kimi *k = (kimi *)t;
    for (int i = 0; i < k->hp.n_kda; i++) em_kda_state_reset(&k->kda_state[i], &k->kda_dims);
    t->pos = 0;
    t->pending = -1;
    k->replay = false;
}

static int kimi_verify(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    kimi *k = (kimi *)t;
    bool logged = n <= t->info.max_verify;
    step_out so = {
        .rows = out, .r0 = 0, .n_req = n, .features = out->features, .routes = out->routes,
        .margins = out->route_margins,
    };
    t->pending = -1;
    double t0 = em_time_now();
    int rc = step(k, tok, n, t->pos, logged ? STEP_LOGGED : STEP_UNLOGGED, &so, err);
    if (rc) return em_err_prefix(err, "verify of %d rows at position %lld", n, (long long)t->pos);
    cost_learn(k, n, t->pos, em_time_now() - t0);
    k->replay = !logged;
    if (!logged) memcpy(k->replay_tok, tok, (size_t)n * sizeof *tok);
    t->pending = n;
    t->stats.verifies++;
    t->stats.rows_verified += (uint64_t)n;
    return EM_OK;
}

/* n rows folded into the state in ubatch steps; logits/features of rows as asked. */
static int run_commit(kimi *k, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    em_target *t = &k->base;
    for (int r0 = 0; r0 < n; r0 += k->ubatch) {
        int m = n - r0 < k->ubatch ? n - r0 : k->ubatch;
        step_out so = { .rows = out, .r0 = r0, .n_req = n };
        if (out && out->features) so.features = out->features + (int64_t)r0 * t->info.n_feat;
        if (out && out->routes) so.routes = out->routes + (int64_t)r0 * t->info.n_route;
        if (out && out->route_margins) so.margins = out->route_margins + (int64_t)r0 * t->info.n_moe_layers;
        int rc = step(k, tok + r0, m, t->pos, STEP_COMMIT, &so, err);
        if (rc) return rc;
        t->pos += m;
    }
    return EM_OK;
}

static int kimi_prefill(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    kimi *k = (kimi *)t;
    t->pending = -1;
    int64_t pos0 = t->pos;
    int rc = run_commit(k, tok, n, out, err);
    if (rc) {
        em_err_prefix(err, "prefill of %d rows at position %lld (sequence reset)", n, (long long)pos0);
        kimi_reset(t);
        return rc;
    }
    t->stats.prefills++;
    t->stats.rows_prefilled += (uint64_t)n;
    return EM_OK;
}

static int kimi_commit(em_target *t, int n_keep, em_err *err) {
    kimi *k = (kimi *)t;
    int rc = EM_OK;
    if (k->replay) { /* the verify was wider than the logs: re-run the accepted tokens */
        t->stats.full_replays++;
        rc = run_commit(k, k->replay_tok, n_keep, NULL, err);
        if (rc) {
            t->stats.failed_fallbacks++;
            em_err_prefix(err, "commit of %d rows by replay (sequence reset)", n_keep);
            kimi_reset(t);
            return rc;
        }
    } else {
        em_phases_start(&k->phases);
        for (int i = 0; i < k->hp.n_kda && !rc; i++)
            rc = em_kda_commit(&k->kda_dims, &k->kda_state[i], k->kda_log[i], n_keep, k->pool, err);
        em_phases_lap(&k->phases, KP_KDA_COMMIT, 0);
        if (rc) {
            em_err_prefix(err, "commit of %d rows (sequence reset)", n_keep);
            kimi_reset(t);
            return rc;
        }
        t->pos += n_keep;
        t->stats.fast_commits++;
    }
    t->pending = -1;
    k->replay = false;
    return EM_OK;
}

static void kimi_close(em_target *t) {
    kimi *k = (kimi *)t;
    for (int i = 0; k->kda_state && i < k->hp.n_kda; i++) em_kda_state_free(&k->kda_state[i]);
    for (int i = 0; k->kda_log && i < k->hp.n_kda; i++) em_kda_log_free(k->kda_log[i]);
    for (int i = 0; k->mla_cache && i < k->hp.n_mla; i++) free(k->mla_cache[i]);
    free(k->kda_state);
    free(k->kda_log);
    free(k->mla_cache);
    free(k->replay_tok);
    if (k->arena) em_arena_free(k->arena);
    em_pool_free(k->pool);
    em_experts_close(k->experts);
    free(k->expert_src);
    kimi_unload(&k->hp, &k->w);
    em_gguf_close(k->g);
    free(k);
}

static int kimi_shared_weights(const em_target *t, em_target_shared *out, em_err *err) {
    (void)err;
    const kimi *k = (const kimi *)t;
    *out = (em_target_shared){ .path = em_gguf_path(k->g), .arch = t->info.arch, .n_embd = k->hp.n_embd,
                               .n_layer = k->hp.n_layer, .n_vocab = k->hp.n_vocab, .token_embd = &k->w.tok_embd,
                               .output = &k->w.output, .cuda_index = -1 };
    return EM_OK;
}

static em_phases *kimi_phases(em_target *t) { return &((kimi *)t)->phases; }

static int kimi_prefetch(em_target *t, const int32_t *tok, int n, em_err *err) {
    return em_experts_prefetch(((kimi *)t)->experts, tok, n, err);
}

static const em_target_ops kimi_ops = {
    .verify = kimi_verify,
    .commit = kimi_commit,
    .prefill = kimi_prefill,
    .cost = kimi_cost,
    .reset = kimi_reset,
    .close = kimi_close,
    .shared_weights = kimi_shared_weights,
    .expert_stats = kimi_expert_stats,
    .phases = kimi_phases,
    .prefetch = kimi_prefetch,
};

/* ---- open --------------------------------------------------------------------------------- */

static void cost_setup(kimi *k) {
    const kimi_hparams *hp = &k->hp;
    uint64_t b = em_mat_bytes(&k->w.output);
    for (int l = 0; l < hp->n_layer; l++) {
        const kimi_layer *ly = &k->w.layers[l];
        const kimi_kda_w *d = &ly->kda;
        const kimi_mla_w *m = &ly->mla;
        const kimi_ffn_w *f = &ly->ffn;
        if (ly->kind == KIMI_KDA)
            b += kda_proj_bytes(d) + em_mat_bytes(&d->out);
        else
            b += em_mat_bytes(&m->q) + em_mat_bytes(&m->q_a) + em_mat_bytes(&m->q_b) + em_mat_bytes(&m->kv_a) +
                 em_mat_bytes(&m->k_b) + em_mat_bytes(&m->v_b) + em_mat_bytes(&m->out) + em_mat_bytes(&m->gate);
        if (f->moe) {
            b += em_mat_bytes(&f->router) + em_mat_bytes(&f->gate_sh) + em_mat_bytes(&f->up_sh) +
                 em_mat_bytes(&f->down_sh) + em_mat_bytes(&f->routed_down) + em_mat_bytes(&f->routed_up);
            k->expert_bytes =
                (em_mat_bytes(&f->gate_exps) + em_mat_bytes(&f->up_exps) + em_mat_bytes(&f->down_exps)) /
                (uint64_t)hp->n_expert;
            k->n_moe++;
        } else {
            b += em_mat_bytes(&f->gate) + em_mat_bytes(&f->up) + em_mat_bytes(&f->down);
        }
    }
    k->dense_bytes = b;
    k->cost_scale = 1.0;
}

static int make_state(kimi *k, const em_model_opts *opts, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const char *path = em_gguf_path(k->g);
    int64_t n_ctx = opts->n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < EM_MODEL_DEFAULT_CTX ? hp->n_ctx_train : EM_MODEL_DEFAULT_CTX;
    k->base.info = (em_target_info){
        .arch = hp->k3 ? "kimi-k3" : "kimi-linear", .device = "cpu", .n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .n_layer = hp->n_layer,
        .n_ctx = (int)n_ctx, .max_verify = opts->max_verify, .n_feat = opts->n_feature_layers * hp->n_embd,
    };
    if (opts->max_verify > n_ctx) k->base.info.max_verify = (int)n_ctx;
    for (int l = 0; l < hp->n_layer; l++) k->base.info.n_moe_layers += k->w.layers[l].ffn.moe;
    k->base.info.n_route = k->base.info.n_moe_layers * hp->n_expert_used;
    k->ubatch = opts->ubatch;
    for (int i = 0; i < opts->n_feature_layers; i++) {
        if (opts->feature_layers[i] < 0 || opts->feature_layers[i] >= hp->n_layer)
            return em_err_set(err, EM_EINVAL, "%s: feature layer %d is not a layer of this model (0..%d)", path,
                              opts->feature_layers[i], hp->n_layer - 1);
        k->feature_layer[i] = opts->feature_layers[i];
    }
    k->n_feature_layers = opts->n_feature_layers;
    int rc = em_pool_create(&k->pool, opts->n_threads, err);
    if (rc) return rc;
    k->dev = em_device_costs_cpu(em_pool_threads(k->pool));
    em_phases_init(&k->phases, kimi_phase_names, KP_COUNT, k->pool);

    k->kda_dims = (em_kda_dims){
        .n_head = hp->kda_heads, .head_dim = hp->kda_head_dim, .d_conv = hp->d_conv,
        .norm_eps = hp->rms_eps, .l2_eps = KIMI_L2_EPS,
        .bounded_gate = hp->gate_bounded, .gate_lower_bound = hp->gate_lb,
    };
    k->kda_state = em_calloc((size_t)hp->n_kda + 1, sizeof *k->kda_state, "KDA states", err);
    k->kda_log = em_calloc((size_t)hp->n_kda + 1, sizeof *k->kda_log, "KDA logs", err);
    k->mla_cache = em_calloc((size_t)hp->n_mla + 1, sizeof *k->mla_cache, "MLA caches", err);
    k->replay_tok = em_calloc((size_t)n_ctx, sizeof *k->replay_tok, "replay tokens", err);
    if (!k->kda_state || !k->kda_log || !k->mla_cache || !k->replay_tok) return EM_ENOMEM;
    if (hp->n_kda > 0 && (rc = em_kda_dims_check(&k->kda_dims, err))) return em_err_prefix(err, "%s", path);
    for (int i = 0; i < hp->n_kda; i++) {
        if ((rc = em_kda_state_init(&k->kda_state[i], &k->kda_dims, err)) ||
            (rc = em_kda_log_create(&k->kda_log[i], &k->kda_dims, k->base.info.max_verify, true, err)))
            return rc;
    }
    uint64_t row = (uint64_t)hp->kv_lora + (uint64_t)hp->rope, bytes;
    if (em_mul_overflow(row * sizeof(float), (uint64_t)n_ctx, &bytes) || bytes > SIZE_MAX)
        return em_err_set(err, EM_EOVERFLOW, "MLA cache of %lld positions is too large", (long long)n_ctx);
    for (int i = 0; i < hp->n_mla; i++) {
        /* 64-byte aligned: attention reads whole rows with 64-byte loads, and a load that
         * straddles two cache lines costs about twice as much (measured ~1.7x on the scores) */
        k->mla_cache[i] = em_aligned_alloc(64, (size_t)bytes, "MLA latent cache", err);
        if (!k->mla_cache[i]) return EM_ENOMEM;
    }
    k->arena_cap = 4u << 20;
    return em_arena_create(&k->arena, k->arena_cap, err);
}

_Static_assert((int)EM_MOE_AUTO == (int)EM_EXPERTS_AUTO && (int)EM_MOE_RESIDENT == (int)EM_EXPERTS_RESIDENT &&
                   (int)EM_MOE_SSD == (int)EM_EXPERTS_SSD,
               "model.h's storage modes are experts/'s");

/* The MoE layers' expert tensors handed to an experts/ provider, which every MoE layer then
 * asks for its route unions' weights. */
static int experts_open(kimi *k, const em_model_opts *opts, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    k->expert_src = em_calloc((size_t)hp->n_layer + 1, sizeof *k->expert_src, "expert tensors", err);
    if (!k->expert_src) return EM_ENOMEM;
    for (int l = 0; l < hp->n_layer; l++) {
        const kimi_ffn_w *f = &k->w.layers[l].ffn;
        if (!f->moe) continue;
        k->expert_src[l] = (em_experts_src){ .n_expert = hp->n_expert,
                                             .part = { f->gate_exps, f->up_exps, f->down_exps } };
    }
    const em_experts_opts xo = { .storage = opts->moe_storage, .cache_bytes = opts->expert_cache_bytes,
                                 .no_prefetch = opts->expert_no_prefetch, .pack = true /* this target's products run here */ };
    int rc = em_experts_open(&k->experts, k->g, k->expert_src, hp->n_layer, &xo, err);
    if (rc) return rc;
    k->base.experts = k->experts;
    for (int l = 0; l < hp->n_layer; l++) {
        k->w.layers[l].ffn.layer = l;
        k->w.layers[l].ffn.xs = k->experts;
    }
    return EM_OK;
}

int em_kimi_linear_open(em_target **out, em_gguf *g, const em_model_opts *opts, em_err *err) {
    *out = NULL;
    kimi *k = em_calloc(1, sizeof *k, "kimi-linear target", err);
    if (!k) {
        em_gguf_close(g);
        return EM_ENOMEM;
    }
    k->g = g;
    k->base.ops = &kimi_ops;
    int rc = kimi_load(g, NULL, &k->hp, &k->w, err);
    if (rc) {
        em_gguf_close(g);
        free(k);
        return rc;
    }
    rc = make_state(k, opts, err);
    if (!rc) rc = experts_open(k, opts, err);
    if (rc) {
        kimi_close(&k->base);
        return rc;
    }
    cost_setup(k);
    kimi_reset(&k->base);
    *out = &k->base;
    return EM_OK;
}
