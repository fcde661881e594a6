/* decode/accept.c: which drafts of a verified block stand, and the target's token after them.
 *
 * Greedy: the longest prefix of drafts equal to the target's argmax at their positions, then
 * the argmax of the row after it (token-identical to plain greedy decoding); the argmaxes
 * come from the target (em_rows.argmax), so greedy needs no logits at all.
 * Sampling: standard speculative sampling (Leviathan et al.; dspark.md §2.7). Draft d_k was
 * drawn from p_d (the drafter's Markov-corrected logits through the session sampler's
 * filters and temperature); p_t is the target's row k-1 through the same filters. d_k stands
 * with probability min(1, p_t(d_k) / p_d(d_k)); the first rejected slot is replaced by a draw
 * from normalize(max(0, p_t - p_d)); all standing, the bonus comes from row K. Each emitted
 * token is then distributed exactly as the target's filtered distribution.
 *
 * Invariants: `dense` is all zeros between calls (a rejection scatters p_d into it and clears
 * exactly those entries). Allocation only at create. Randomness only from the caller's
 * sampler (reproducible per seed). */
#include "decode/decode_impl.h"

#include <stdlib.h>

struct em_decode_accept {
    int32_t n_vocab;
    em_sample_dist target; /* p_t of the row being checked */
    float *dense;          /* [n_vocab] p_d scattered by id during a residual draw; else zeros */
};

int em_decode_accept_greedy(const int32_t *argmax, const int32_t *drafts, int K, int32_t *next) {
    int acc = 0;
    while (acc < K && drafts[acc] == argmax[acc]) acc++;
    *next = argmax[acc];
    return acc;
}

int em_decode_accept_create(em_decode_accept **out, int32_t n_vocab, em_err *err) {
    *out = NULL;
    if (n_vocab < 1) return em_err_set(err, EM_EINVAL, "acceptance: vocabulary of %d ids", n_vocab);
    em_decode_accept *a = em_calloc(1, sizeof *a, "acceptance", err);
    if (!a) return EM_ENOMEM;
    a->n_vocab = n_vocab;
    int rc = em_sample_dist_init(&a->target, n_vocab, err);
    if (!rc && !(a->dense = em_calloc((size_t)n_vocab, sizeof *a->dense, "acceptance scratch", err))) rc = EM_ENOMEM;
    if (rc) {
        em_decode_accept_free(a);
        return rc;
    }
    *out = a;
    return EM_OK;
}

void em_decode_accept_free(em_decode_accept *a) {
    if (!a) return;
    em_sample_dist_free(&a->target);
    free(a->dense);
    free(a);
}

/* A draw from normalize(max(0, p_t - p_d)), p_t = a->target; p_t itself when that is empty. */
static int32_t draw_residual(em_decode_accept *a, em_sampler *s, const em_sample_dist *pd) {
    for (int32_t i = 0; i < pd->n; i++) a->dense[pd->ids[i]] = pd->probs[i];
    const em_sample_dist *pt = &a->target;
    double total = 0;
    for (int32_t i = 0; i < pt->n; i++) {
        float r = pt->probs[i] - a->dense[pt->ids[i]];
        if (r > 0) total += r;
    }
    int32_t id = -1;
    if (total > 0) {
        double u = em_sampler_uniform(s) * total, run = 0;
        for (int32_t i = 0; i < pt->n && id < 0; i++) {
            float r = pt->probs[i] - a->dense[pt->ids[i]];
            if (r <= 0) continue;
            run += r;
            if (u < run) id = pt->ids[i];
        }
        for (int32_t i = pt->n - 1; id < 0 && i >= 0; i--) /* rounding left u at the very top */
            if (pt->probs[i] - a->dense[pt->ids[i]] > 0) id = pt->ids[i];
    }
    for (int32_t i = 0; i < pd->n; i++) a->dense[pd->ids[i]] = 0;
    return id >= 0 ? id : em_sampler_draw(s, pt);
}

int em_decode_accept_sample(em_decode_accept *a, em_sampler *s, const float *logits, const int32_t *drafts,
                          const em_sample_dist *draft_dist, int K, int32_t *next, em_err *err) {
    for (int k = 1; k <= K; k++) {
        const float *row = logits + (size_t)(k - 1) * (size_t)a->n_vocab;
        int rc = em_sampler_dist(s, row, &a->target, err);
        if (rc) return em_err_prefix(err, "acceptance: verified row %d", k - 1);
        float pt = em_sample_dist_prob(&a->target, drafts[k - 1]);
        float pd = em_sample_dist_prob(&draft_dist[k - 1], drafts[k - 1]);
        /* pd > 0: the draft was drawn from draft_dist (a 0 would mean it was not: reject) */
        if (pd > 0 && em_sampler_uniform(s) * (double)pd < (double)pt) continue;
        *next = draw_residual(a, s, &draft_dist[k - 1]);
        return k - 1;
    }
    int rc = em_sampler_sample(s, logits + (size_t)K * (size_t)a->n_vocab, next, err);
    if (rc) return em_err_prefix(err, "acceptance: verified row %d", K);
    return K;
}
