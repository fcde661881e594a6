/* MLA attention of kimi-linear (NoPE: the rope slice is never rotated), in the absorbed form
 * over a latent cache. Per token the cache keeps [c | k_pe]: c = RMSNorm(kv_a(x)[0:kv_lora])
 * (eps 1e-6) and the shared k_pe. Per head h and query row t at position p:
 *   qa_h  = [W_UK_h^T q_nope_h | q_pe_h]                        (attn_k_b, width kv_lora+rope)
 *   s(u)  = qa_h . cache[u] / sqrt(nope + rope)    for u <= p   (causal)
 *   ctx_h = sum_u softmax(s)(u) c_u;   o_h = W_UV_h ctx_h        (attn_v_b)
 *   y     = W_o [o_0 | ... | o_{H-1}]
 * which equals the expanded form (k = [W_UK c | k_pe], v = W_UV c) of transformers.
 * kimi-k3 gates the head outputs before W_o: o <- o * sigmoid(W_gate x) (x: the normed input).
 * Attention runs on the pool in steps: absorbed queries per head; then per group of
 * QUERY_GROUP query rows the scores and softmax of a few heads a task (the cache read once a
 * task for all of its heads) and the context sums split by latent columns (each cache row's
 * slice read once for every head: they share the cache, as MQA's heads do); then W_UV per
 * head. Every score and context value is compute's multi-query form, bit for bit its one-row
 * form, and every task writes only its own outputs, so a row's result depends neither on the
 * rows it is verified with nor on the thread count. Writes only cache rows [pos, pos + n). */
#include "model/kimi_impl.h"

#include <string.h>

/* Query rows whose scores and context sums go over the cache together. */
#define QUERY_GROUP 8
/* Context columns per task (the ctx step splits the latent width): at most CTX_COLS, fewer
 * (down to CTX_COLS_MIN) when that leaves a thread without a task. A column's sum is the same
 * fma chain whichever task makes it. */
#define CTX_COLS 128
#define CTX_COLS_MIN 32

typedef struct head_job {
    const kimi_hparams *hp;
    const kimi_mla_w *w;
    const float *cache;
    int64_t pos;
    int n;
    const float *q; /* [n][H * (nope + rope)] */
    float *o;       /* [n][H * v_head] */
    float scale;
    float *qa;      /* [H][n][C] absorbed queries */
    float *ctx;     /* [H][n][R] */
    float *scores;  /* [H][nq][ld] the current row group's */
    int t0, nq;     /* the current row group: rows t0 .. t0 + nq - 1 */
    int64_t ld;     /* scores per query row: pos + t0 + nq */
    int64_t *len;   /* [H][nq] positions query row t of a head sees: pos + t0 + t + 1 */
    int heads_per_task;
    int64_t ctx_cols; /* context columns a task */
    uint8_t *act_q, *act_c; /* per head */
    uint64_t act_q_bytes, act_c_bytes;
    int rc[]; /* per head status */
} head_job;

/* Absorbed queries of head h: W_UK_h^T q_nope (rows h*R.. of attn_k_b), then the unrotated q_pe. */
static void query_task(void *vctx, int h, int thread) {
    (void)thread;
    head_job *job = vctx;
    const kimi_hparams *hp = job->hp;
    const int n = job->n, R = hp->kv_lora, C = hp->kv_lora + hp->rope, qk = hp->nope + hp->rope;
    const int64_t ldq = (int64_t)hp->mla_heads * qk;
    float *qa = job->qa + (int64_t)h * n * C;
    em_mat kb = em_mat_rows(&job->w->k_b, (int64_t)h * R, R);
    job->rc[h] = em_matmul(NULL, &kb, job->q + (int64_t)h * qk, ldq, n, qa, C,
                           job->act_q + (uint64_t)h * job->act_q_bytes, NULL);
    for (int t = 0; t < n; t++)
        memcpy(qa + (int64_t)t * C + R, job->q + t * ldq + (int64_t)h * qk + hp->nope, (size_t)hp->rope * sizeof(float));
}

/* Heads [h0, h0 + nh) of the group: their queries, scores and context rows lie one stride
 * apart from the first head's when the group is every row (decoding, narrow verifies); then
 * one multi-query call covers all of them (the cache read once), else one call per head. */
static int span_calls(const head_job *job, int nh) { return job->nq == job->n ? 1 : nh; }

/* Scores of the task's heads for the group's rows, then their softmax. Row t sees positions
 * < pos + t + 1; its scores past those are made and ignored. */
static void score_task(void *vctx, int task, int thread) {
    (void)thread;
    const head_job *job = vctx;
    const int H = job->hp->mla_heads, C = job->hp->kv_lora + job->hp->rope, n = job->n, nq = job->nq;
    const int h0 = task * job->heads_per_task, nh = H - h0 < job->heads_per_task ? H - h0 : job->heads_per_task;
    const int calls = span_calls(job, nh), per = nh / calls * nq;
    for (int c = 0; c < calls; c++) {
        const int h = h0 + c * (nh / calls);
        em_dot_rows_multi(job->cache, C, job->ld, job->qa + ((int64_t)h * n + job->t0) * C, C, per, C, job->scale,
                          job->scores + (int64_t)h * nq * job->ld, job->ld);
    }
    for (int i = h0 * nq; i < (h0 + nh) * nq; i++) em_softmax_poly(job->scores + i * job->ld, job->len[i]);
}

/* Context columns [i0, i0 + ctx_cols) of every head's rows of the group: each cache row's
 * slice is read once for all of them (they share the cache, as MQA's heads do). */
static void context_task(void *vctx, int task, int thread) {
    (void)thread;
    const head_job *job = vctx;
    const int H = job->hp->mla_heads, R = job->hp->kv_lora, C = R + job->hp->rope, n = job->n, nq = job->nq;
    const int64_t i0 = (int64_t)task * job->ctx_cols, cols = R - i0 < job->ctx_cols ? R - i0 : job->ctx_cols;
    const int calls = span_calls(job, H), per = H / calls * nq;
    for (int c = 0; c < calls; c++) {
        const int h = c * (H / calls);
        em_weighted_rows_multi(job->scores + (int64_t)h * nq * job->ld, job->ld, job->len + h * nq, per, job->cache + i0, C,
                               cols, job->ctx + ((int64_t)h * n + job->t0) * R + i0, R);
    }
}

/* Head h's outputs W_UV_h ctx_h, every row. */
static void output_task(void *vctx, int h, int thread) {
    (void)thread;
    head_job *job = vctx;
    const kimi_hparams *hp = job->hp;
    const int R = hp->kv_lora;
    em_mat vb = em_mat_rows(&job->w->v_b, (int64_t)h * hp->v_head, hp->v_head);
    int rc = em_matmul(NULL, &vb, job->ctx + (int64_t)h * job->n * R, R, job->n, job->o + (int64_t)h * hp->v_head,
                       (int64_t)hp->mla_heads * hp->v_head, job->act_c + (uint64_t)h * job->act_c_bytes, NULL);
    if (!job->rc[h]) job->rc[h] = rc;
}

/* q [n][H*(nope+rope)] from the normed input, directly or through the q LoRA. */
static int mla_query(const kimi_hparams *hp, const kimi_mla_w *w, em_acts *xa, int n, float *q,
                     em_pool *pool, em_arena *arena, em_err *err) {
    const int64_t ldq = (int64_t)hp->mla_heads * (hp->nope + hp->rope);
    if (hp->q_lora == 0) return em_mm(xa, &w->q, q, ldq, pool, arena, err);
    float *qa = em_falloc(arena, (uint64_t)n * hp->q_lora, "MLA q LoRA rows", err);
    if (!qa) return EM_ENOMEM;
    int rc = em_mm(xa, &w->q_a, qa, hp->q_lora, pool, arena, err);
    if (rc) return rc;
    em_rmsnorm_rows(qa, hp->q_lora, w->q_a_norm, KIMI_MLA_NORM_EPS, n, hp->q_lora, qa, hp->q_lora);
    em_acts qacts;
    em_acts_init(&qacts, qa, hp->q_lora, hp->q_lora, n);
    return em_mm(&qacts, &w->q_b, q, ldq, pool, arena, err);
}

int kimi_mla_forward(const kimi_hparams *hp, const kimi_mla_w *w, float *cache, int64_t pos, int n,
                     const float *h, float *y, em_pool *pool, em_arena *arena, em_phases *ph, em_err *err) {
    const int H = hp->mla_heads, R = hp->kv_lora, C = hp->kv_lora + hp->rope;
    const int64_t ldq = (int64_t)H * (hp->nope + hp->rope), ldo = (int64_t)H * hp->v_head;
    em_acts xa;
    em_acts_init(&xa, h, hp->n_embd, hp->n_embd, n);

    float *q = em_falloc(arena, (uint64_t)n * ldq, "MLA queries", err);
    float *kv = em_falloc(arena, (uint64_t)n * C, "MLA latents", err);
    float *o = em_falloc(arena, (uint64_t)n * ldo, "MLA head outputs", err);
    if (!q || !kv || !o) return EM_ENOMEM;
    int rc;
    if (hp->q_lora == 0) { /* q and the latents from x in one pool run */
        const em_mm_out from_x[] = { { &xa, &w->q, q, ldq }, { &xa, &w->kv_a, kv, C } };
        rc = em_mm_many(from_x, 2, pool, arena, err);
    } else {
        rc = mla_query(hp, w, &xa, n, q, pool, arena, err);
        if (!rc) rc = em_mm(&xa, &w->kv_a, kv, C, pool, arena, err);
    }
    if (rc) return rc;
    em_phases_lap(ph, KP_MLA_PROJ, em_mat_bytes(&w->q) + em_mat_bytes(&w->q_a) + em_mat_bytes(&w->q_b) +
                                       em_mat_bytes(&w->kv_a));
    /* the new rows of the latent cache */
    em_rmsnorm_rows(kv, C, w->kv_a_norm, KIMI_MLA_NORM_EPS, n, R, cache + pos * C, C);
    for (int t = 0; t < n; t++)
        memcpy(cache + (pos + t) * C + R, kv + (int64_t)t * C + R, (size_t)hp->rope * sizeof(float));

    uint64_t act_q_bytes, act_c_bytes;
    if ((rc = em_act_bytes(w->k_b.type, hp->nope, n, &act_q_bytes, err)) ||
        (rc = em_act_bytes(w->v_b.type, R, n, &act_c_bytes, err)))
        return rc;
    act_q_bytes = em_align_up(act_q_bytes, 64);
    act_c_bytes = em_align_up(act_c_bytes, 64);
    head_job *job = em_arena_alloc(arena, sizeof *job + (size_t)H * sizeof(int));
    float *qa = em_falloc(arena, (uint64_t)H * n * C, "MLA absorbed queries", err);
    float *ctx = em_falloc(arena, (uint64_t)H * n * R, "MLA contexts", err);
    float *scores = em_falloc(arena, (uint64_t)H * QUERY_GROUP * (uint64_t)(pos + n), "MLA scores", err);
    uint8_t *act_q = em_arena_alloc(arena, (size_t)(H * act_q_bytes));
    uint8_t *act_c = em_arena_alloc(arena, (size_t)(H * act_c_bytes));
    int64_t *len = em_arena_alloc(arena, (size_t)H * QUERY_GROUP * sizeof(int64_t));
    if (!job || !qa || !ctx || !scores || !act_q || !act_c || !len)
        return em_err_set(err, EM_ENOMEM, "out of memory for MLA attention scratch (%d rows)", n);
    *job = (head_job){
        .hp = hp, .w = w, .cache = cache, .pos = pos, .n = n, .q = q, .o = o,
        .scale = (float)(1.0 / sqrt((double)(hp->nope + hp->rope))),
        .qa = qa, .ctx = ctx, .scores = scores, .len = len, .act_q = act_q, .act_c = act_c,
        .act_q_bytes = act_q_bytes, .act_c_bytes = act_c_bytes,
    };
    memset(job->rc, 0, (size_t)H * sizeof(int));
    em_pool_run(pool, H, query_task, job);
    /* scoring reads the whole cache once a task: a task a thread, a power of two of heads */
    const int threads = pool ? em_pool_threads(pool) : 1;
    job->heads_per_task = H;
    while (job->heads_per_task > 1 && job->heads_per_task % 2 == 0 && H / job->heads_per_task < threads)
        job->heads_per_task /= 2;
    job->ctx_cols = CTX_COLS;
    while (job->ctx_cols > CTX_COLS_MIN && (R + job->ctx_cols - 1) / job->ctx_cols < threads) job->ctx_cols /= 2;
    for (job->t0 = 0; job->t0 < n; job->t0 += QUERY_GROUP) {
        job->nq = n - job->t0 < QUERY_GROUP ? n - job->t0 : QUERY_GROUP;
        job->ld = pos + job->t0 + job->nq;
        for (int i = 0; i < H * job->nq; i++) len[i] = pos + job->t0 + i % job->nq + 1;
        em_pool_run(pool, (H + job->heads_per_task - 1) / job->heads_per_task, score_task, job);
        em_pool_run(pool, (int)((R + job->ctx_cols - 1) / job->ctx_cols), context_task, job);
    }
    em_pool_run(pool, H, output_task, job);
    for (int i = 0; i < H; i++)
        if (job->rc[i]) return em_err_set(err, job->rc[i], "MLA head %d failed", i);
    em_phases_lap(ph, KP_MLA_ATTN, em_mat_bytes(&w->k_b) + em_mat_bytes(&w->v_b));

    if (w->gate.rows > 0) { /* K3 output gate */
        float *g = em_falloc(arena, (uint64_t)n * ldo, "MLA output gate rows", err);
        if (!g) return EM_ENOMEM;
        if ((rc = em_mm(&xa, &w->gate, g, ldo, pool, arena, err))) return rc;
        for (int64_t i = 0; i < (int64_t)n * ldo; i++) o[i] *= em_sigmoidf(g[i]);
    }
    em_acts oa;
    em_acts_init(&oa, o, ldo, ldo, n);
    rc = em_mm(&oa, &w->out, y, hp->n_embd, pool, arena, err);
    em_phases_lap(ph, KP_MLA_OUT, em_mat_bytes(&w->out) + em_mat_bytes(&w->gate));
    return rc;
}
