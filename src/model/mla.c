/* MLA attention of kimi-linear (NoPE: the rope slice is never rotated), in the absorbed form
 * over a latent cache. Per token the cache keeps [c | k_pe]: c = RMSNorm(kv_a(x)[0:kv_lora])
 * (eps 1e-6) and the shared k_pe. Per head h and query row t at position p:
 *   qa_h  = [W_UK_h^T q_nope_h | q_pe_h]                        (attn_k_b, width kv_lora+rope)
 *   s(u)  = qa_h . cache[u] / sqrt(nope + rope)    for u <= p   (causal)
 *   ctx_h = sum_u softmax(s)(u) c_u;   o_h = W_UV_h ctx_h        (attn_v_b)
 *   y     = W_o [o_0 | ... | o_{H-1}]
 * which equals the expanded form (k = [W_UK c | k_pe], v = W_UV c) of transformers.
 * kimi-k3 gates the head outputs before W_o: o <- o * sigmoid(W_gate x) (x: the normed input).
 * Heads run in parallel on the pool; each head has its own scratch, so the result does not
 * depend on the thread count. A head's query rows read the cache in groups (compute's
 * multi-query score and context rows, bit for bit the one-row forms), so a row's result does
 * not depend on the rows it is verified with. Writes only cache rows [pos, pos + n). */
#include "model/kimi_impl.h"

#include <string.h>

/* Query rows whose scores and context sums go over the cache together. */
#define QUERY_GROUP 8

typedef struct head_job {
    const kimi_hparams *hp;
    const kimi_mla_w *w;
    const float *cache;
    int64_t pos;
    int n;
    const float *q; /* [n][H * (nope + rope)] */
    float *o;       /* [n][H * v_head] */
    float scale;
    /* per head scratch, laid out head after head */
    float *qa, *ctx, *scores;
    uint8_t *act_q, *act_c;
    uint64_t act_q_bytes, act_c_bytes;
    int rc[]; /* per head status */
} head_job;

static void head_task(void *vctx, int h, int thread) {
    (void)thread;
    head_job *job = vctx;
    const kimi_hparams *hp = job->hp;
    const int n = job->n, R = hp->kv_lora, C = hp->kv_lora + hp->rope, qk = hp->nope + hp->rope;
    const int64_t ldq = (int64_t)hp->mla_heads * qk;
    float *qa = job->qa + (int64_t)h * n * C;
    float *ctx = job->ctx + (int64_t)h * n * R;
    float *scores = job->scores + (int64_t)h * QUERY_GROUP * (job->pos + n);

    /* absorbed query: W_UK_h^T q_nope (rows h*R.. of attn_k_b), then the unrotated q_pe */
    em_mat kb = em_mat_rows(&job->w->k_b, (int64_t)h * R, R);
    int rc = em_matmul(NULL, &kb, job->q + (int64_t)h * qk, ldq, n, qa, C,
                       job->act_q + (uint64_t)h * job->act_q_bytes, NULL);
    for (int t = 0; t < n && !rc; t++)
        memcpy(qa + (int64_t)t * C + R, job->q + t * ldq + (int64_t)h * qk + hp->nope, (size_t)hp->rope * sizeof(float));

    /* QUERY_GROUP rows at a time over the cache (each read once for the group); row t sees
     * positions < pos + t + 1, its scores past those are made and ignored */
    for (int t0 = 0; t0 < n && !rc; t0 += QUERY_GROUP) {
        const int nq = n - t0 < QUERY_GROUP ? n - t0 : QUERY_GROUP;
        const int64_t ld = job->pos + t0 + nq;
        int64_t len[QUERY_GROUP];
        em_dot_rows_multi(job->cache, C, ld, qa + (int64_t)t0 * C, C, nq, C, job->scale, scores, ld);
        for (int i = 0; i < nq; i++) {
            len[i] = job->pos + t0 + i + 1;
            em_softmax_poly(scores + i * ld, len[i]);
        }
        em_weighted_rows_multi(scores, ld, len, nq, job->cache, C, R, ctx + (int64_t)t0 * R, R);
    }

    em_mat vb = em_mat_rows(&job->w->v_b, (int64_t)h * hp->v_head, hp->v_head);
    if (!rc)
        rc = em_matmul(NULL, &vb, ctx, R, n, job->o + (int64_t)h * hp->v_head, (int64_t)hp->mla_heads * hp->v_head,
                       job->act_c + (uint64_t)h * job->act_c_bytes, NULL);
    job->rc[h] = rc;
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
    if (!job || !qa || !ctx || !scores || !act_q || !act_c)
        return em_err_set(err, EM_ENOMEM, "out of memory for MLA attention scratch (%d rows)", n);
    *job = (head_job){
        .hp = hp, .w = w, .cache = cache, .pos = pos, .n = n, .q = q, .o = o,
        .scale = (float)(1.0 / sqrt((double)(hp->nope + hp->rope))),
        .qa = qa, .ctx = ctx, .scores = scores, .act_q = act_q, .act_c = act_c,
        .act_q_bytes = act_q_bytes, .act_c_bytes = act_c_bytes,
    };
    em_pool_run(pool, H, head_task, job);
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
