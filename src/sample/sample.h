/* sample/: choosing the next token from a row of logits. Greedy, or temperature with top-k,
 * top-p and min-p filters, drawn from a seeded generator held in the sampler (no global
 * state: two samplers with the same seed and the same logits give the same tokens).
 *
 * The filters run in llama.cpp's default order (common/sampling: top-k, top-p, min-p, then
 * temperature), so the filters see the model's own distribution (temperature 1) and the
 * temperature only reshapes what they kept:
 *   1. candidates: every id whose logit is not NaN or -inf (+inf logits, if any, share all
 *      the probability equally);
 *   2. top-k (k > 0): the k highest logits, ties to the lower id;
 *   3. top-p (p < 1): the shortest run of the rest, most probable first, whose probability
 *      (softmax over the top-k set) reaches p; at least one id;
 *   4. min-p (m > 0): ids whose probability is at least m times the largest one
 *      (logit >= max + ln m);
 *   5. temperature T: probabilities proportional to exp(logit / T) over the kept ids.
 * Temperature <= 0 is greedy: the argmax, the lowest id on ties, probability 1 (filters do
 * not matter then). (HF transformers and vLLM apply the temperature first; results differ
 * from those only when a filter is on and T != 1.)
 *
 * The filtered distribution is exposed (em_sampler_dist) because speculative decoding's
 * rejection sampling must compare draft and target under the same filters. */
#ifndef EM_SAMPLE_H
#define EM_SAMPLE_H

#include "base/base.h"

typedef struct em_sampler_params {
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;
} em_sampler_params;

/* llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, seed 0. */
em_sampler_params em_sampler_default_params(void);

/* A distribution over the kept ids: ids sorted by probability, highest first (ties: lower
 * id first), probs summing to 1. Storage for n_vocab entries. */
typedef struct em_sample_dist {
    int32_t n;
    int32_t cap;
    int32_t *ids;
    float *probs;
} em_sample_dist;

int em_sample_dist_init(em_sample_dist *d, int32_t n_vocab, em_err *err);
void em_sample_dist_free(em_sample_dist *d);
/* Probability of id under d; 0 when id was filtered out. O(n). */
float em_sample_dist_prob(const em_sample_dist *d, int32_t id);

typedef struct em_sampler em_sampler;

/* Parameters are checked: NaN, infinite or negative values (other than the "off" ones above)
 * are EM_EINVAL naming the parameter. */
int em_sampler_create(em_sampler **out, const em_sampler_params *p, int32_t n_vocab, em_err *err);
void em_sampler_free(em_sampler *s);
const em_sampler_params *em_sampler_params_of(const em_sampler *s);
/* Restarts the random stream as if created with seed. */
void em_sampler_reseed(em_sampler *s, uint64_t seed);

/* The filtered distribution of one row of n_vocab logits into d (d->cap >= n_vocab).
 * EM_EINVAL when no logit is usable (all NaN or -inf). Uses no randomness. */
int em_sampler_dist(em_sampler *s, const float *logits, em_sample_dist *d, em_err *err);
/* One draw from d (d->n >= 1) with the sampler's generator. */
int32_t em_sampler_draw(em_sampler *s, const em_sample_dist *d);
/* em_sampler_dist, then (unless greedy) em_sampler_draw. Greedy draws no random number. */
int em_sampler_sample(em_sampler *s, const float *logits, int32_t *id, em_err *err);
/* The next uniform number in [0, 1) of the sampler's stream (53 random bits), for
 * acceptance tests that must stay on the same reproducible stream. */
double em_sampler_uniform(em_sampler *s);

/* Index of the largest of n logits, the lowest on ties, NaN skipped; -1 when all are NaN
 * (or n <= 0). */
int32_t em_argmax(const float *logits, int32_t n);

#endif
