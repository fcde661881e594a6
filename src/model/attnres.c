/* Block attention residuals (AttnRes, kimi-k3), used by the forward of kimi.c when the
 * file sets attn_res.block_size (kimi-linear leaves it 0 and every layer input is x), as
 * llama.cpp's kimi-k3 graph computes them: the raw residual stream entering layer l is banked
 * when l % block == 0 (after that layer's attention input was mixed), and then the stream
 * restarts from the attention output alone; every layer half (and the output) reads
 *     mix = sum_j p_j r_j + p_x x,  p = softmax_j(sum_d RMSNorm(r_j)_d w_d)   (r_j raw)
 * over the banked r_j and the current stream x (x itself while the bank is empty).
 * Invariants: the bank lives in the step arena and holds rows of one step only (AttnRes mixes
 * across layers, never across positions, so nothing of it is sequence state); each row is
 * mixed on its own, so results never depend on the other rows of a batch. */
#include "model/kimi_impl.h"

#include <math.h>
#include <string.h>

int kimi_res_init(kimi_resbank *b, const kimi_hparams *hp, int n, em_arena *arena, em_err *err) {
    *b = (kimi_resbank){ .block = hp->res_block, .n = n, .E = hp->n_embd, .eps = hp->rms_eps };
    if (hp->res_block <= 0) return EM_OK;
    const uint64_t max_banks = ((uint64_t)hp->n_layer + (uint64_t)hp->res_block - 1) / (uint64_t)hp->res_block;
    b->rows = em_falloc(arena, max_banks * (uint64_t)n * (uint64_t)b->E, "AttnRes bank", err);
    b->mix = em_falloc(arena, (uint64_t)n * (uint64_t)b->E, "AttnRes mixed rows", err);
    b->p = em_falloc(arena, max_banks + 1, "AttnRes weights", err);
    return b->rows && b->mix && b->p ? EM_OK : EM_ENOMEM;
}

/* sum_d RMSNorm(r)_d w_d: the norm's scale rounded to fp32 once (as the normed row would
 * carry it), the dot in double. */
static float res_score(const float *r, const float *w, int64_t E, float eps) {
    double ss = 0.0, dot = 0.0;
    for (int64_t d = 0; d < E; d++) {
        ss += (double)r[d] * r[d];
        dot += (double)r[d] * w[d];
    }
    const float scale = (float)(1.0 / sqrt(ss / (double)E + (double)eps));
    return (float)(dot * scale);
}

const float *kimi_res_input(kimi_resbank *b, const float *x, const float *w, int r0, int m) {
    const int64_t E = b->E;
    if (b->block <= 0 || b->n_bank == 0 || !w) return x + (int64_t)r0 * E;
    const int nb = b->n_bank;
    const int64_t ld = (int64_t)b->n * E; /* floats between banks */
    for (int t = r0; t < r0 + m; t++) {
        const float *cur = x + (int64_t)t * E;
        for (int j = 0; j < nb; j++) b->p[j] = res_score(b->rows + j * ld + (int64_t)t * E, w, E, b->eps);
        b->p[nb] = res_score(cur, w, E, b->eps);
        em_softmax(b->p, nb + 1);
        float *out = b->mix + (int64_t)t * E;
        for (int64_t d = 0; d < E; d++) {
            float acc = 0.0f;
            for (int j = 0; j < nb; j++) acc += b->p[j] * b->rows[j * ld + (int64_t)t * E + d];
            out[d] = acc + b->p[nb] * cur[d];
        }
    }
    return b->mix + (int64_t)r0 * E;
}

bool kimi_res_push(kimi_resbank *b, int l, const float *x) {
    if (b->block <= 0 || l % b->block != 0) return false;
    memcpy(b->rows + (int64_t)b->n_bank * b->n * b->E, x, (size_t)b->n * (size_t)b->E * sizeof(float));
    b->n_bank++;
    return true;
}
