/* sample/sample.c: greedy and filtered-temperature sampling over a logits row (order and
 * rules in sample.h), with a xoshiro256** generator seeded through splitmix64.
 *
 * Invariants: the sampler's random state changes only in em_sampler_draw/_uniform/_reseed;
 * the scratch arrays hold n_vocab entries and are overwritten by every em_sampler_dist;
 * sums are taken in double, stored probabilities in float. Work per row: O(V) to scan, plus
 * O(V log k) for top-k or a sort of the ids that survive min-p (all of them otherwise). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample.h"

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct em_sampler {
    em_sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    cand *c;          /* scratch: candidates */
    em_sample_dist d; /* scratch: em_sampler_sample's distribution */
};

em_sampler_params em_sampler_default_params(void) {
    return (em_sampler_params){ .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 0 };
}

/* ---- random numbers -------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

void em_sampler_reseed(em_sampler *s, uint64_t seed) {
    s->p.seed = seed;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x); /* never all zero */
}

double em_sampler_uniform(em_sampler *s) { return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53; }

/* ---- distributions ---------------------------------------------------------------------- */

int em_sample_dist_init(em_sample_dist *d, int32_t n_vocab, em_err *err) {
    memset(d, 0, sizeof *d);
    if (n_vocab <= 0) return em_err_set(err, EM_EINVAL, "sampler: vocabulary of %d ids", n_vocab);
    d->ids = em_malloc((size_t)n_vocab * sizeof *d->ids, "sampling distribution", err);
    d->probs = d->ids ? em_malloc((size_t)n_vocab * sizeof *d->probs, "sampling distribution", err) : NULL;
    if (!d->probs) {
        em_sample_dist_free(d);
        return EM_ENOMEM;
    }
    d->cap = n_vocab;
    return EM_OK;
}

void em_sample_dist_free(em_sample_dist *d) {
    free(d->ids);
    free(d->probs);
    memset(d, 0, sizeof *d);
}

float em_sample_dist_prob(const em_sample_dist *d, int32_t id) {
    for (int32_t i = 0; i < d->n; i++)
        if (d->ids[i] == id) return d->probs[i];
    return 0.0f;
}

/* ---- the sampler ------------------------------------------------------------------------ */

static int check_params(const em_sampler_params *p, em_err *err) {
    if (isnan(p->temperature) || isinf(p->temperature))
        return em_err_set(err, EM_EINVAL, "sampler: temperature %g is not a finite number", (double)p->temperature);
    if (isnan(p->top_p) || p->top_p < 0)
        return em_err_set(err, EM_EINVAL, "sampler: top-p %g is not in [0, 1]", (double)p->top_p);
    if (isnan(p->min_p) || p->min_p > 1)
        return em_err_set(err, EM_EINVAL, "sampler: min-p %g is not in [0, 1]", (double)p->min_p);
    return EM_OK;
}

int em_sampler_create(em_sampler **out, const em_sampler_params *p, int32_t n_vocab, em_err *err) {
    *out = NULL;
    if (n_vocab <= 0) return em_err_set(err, EM_EINVAL, "sampler: vocabulary of %d ids", n_vocab);
    int rc = check_params(p, err);
    if (rc) return rc;
    em_sampler *s = em_calloc(1, sizeof *s, "sampler", err);
    if (!s) return EM_ENOMEM;
    s->c = em_malloc((size_t)n_vocab * sizeof *s->c, "sampler scratch", err);
    if (!s->c || em_sample_dist_init(&s->d, n_vocab, err)) {
        em_sampler_free(s);
        return EM_ENOMEM;
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    em_sampler_reseed(s, p->seed);
    *out = s;
    return EM_OK;
}

void em_sampler_free(em_sampler *s) {
    if (!s) return;
    free(s->c);
    em_sample_dist_free(&s->d);
    free(s);
}

const em_sampler_params *em_sampler_params_of(const em_sampler *s) { return &s->p; }

int32_t em_argmax(const float *logits, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best;
}

/* a ranks before b: higher logit, then lower id */
static bool better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *x, const void *y) {
    const cand *a = x, *b = y;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Keeps the k best of c[0..n) in c[0..k) (unordered): a heap whose root is the worst kept. */
static void keep_top_k(cand *c, int32_t n, int32_t k) {
    for (int32_t i = 0; i < n; i++) {
        cand x = c[i];
        int32_t size = i < k ? i : k;
        if (i >= k) {
            if (!better(&x, &c[0])) continue;
            /* replace the root, sift down */
            int32_t j = 0;
            for (;;) {
                int32_t l = 2 * j + 1, w = j;
                cand *worst = &x;
                if (l < size && better(worst, &c[l])) w = l, worst = &c[l];
                if (l + 1 < size && better(worst, &c[l + 1])) w = l + 1;
                if (w == j) break;
                c[j] = c[w];
                j = w;
            }
            c[j] = x;
        } else {
            /* push, sift up */
            int32_t j = size;
            while (j > 0) {
                int32_t up = (j - 1) / 2;
                if (!better(&c[up], &x)) break;
                c[j] = c[up];
                j = up;
            }
            c[j] = x;
        }
    }
}

static void dist_greedy(em_sample_dist *d, int32_t id) {
    d->n = 1;
    d->ids[0] = id;
    d->probs[0] = 1.0f;
}

int em_sampler_dist(em_sampler *s, const float *logits, em_sample_dist *d, em_err *err) {
    const em_sampler_params *p = &s->p;
    d->n = 0;
    if (d->cap < s->n_vocab)
        return em_err_set(err, EM_EINVAL, "sampler: distribution holds %d ids, the vocabulary has %d", d->cap, s->n_vocab);
    if (p->temperature <= 0) {
        int32_t id = em_argmax(logits, s->n_vocab);
        if (id < 0 || logits[id] == -INFINITY)
            return em_err_set(err, EM_EINVAL, "sampler: no usable logit (all NaN or -inf) in a row of %d", s->n_vocab);
        dist_greedy(d, id);
        return EM_OK;
    }

    /* 1. candidates; +inf logits take everything */
    cand *c = s->c;
    int32_t n = 0;
    bool has_pinf = false;
    for (int32_t i = 0; i < s->n_vocab; i++) has_pinf |= logits[i] == INFINITY;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float l = logits[i];
        if (has_pinf ? l == INFINITY : !(isnan(l) || l == -INFINITY)) c[n++] = (cand){ has_pinf ? 0.0f : l, i };
    }
    if (n == 0)
        return em_err_set(err, EM_EINVAL, "sampler: no usable logit (all NaN or -inf) in a row of %d", s->n_vocab);

    /* 2. top-k */
    if (p->top_k > 0 && p->top_k < n) {
        keep_top_k(c, n, p->top_k);
        n = p->top_k;
    }
    float max = c[0].logit;
    for (int32_t i = 1; i < n; i++) max = c[i].logit > max ? c[i].logit : max;
    double z = 0; /* softmax normaliser over the top-k set, for top-p */
    for (int32_t i = 0; i < n; i++) z += exp((double)c[i].logit - max);

    /* 4 before 3: min-p keeps a prefix of the sorted order, so applying it first only
     * shortens the sort; top-p still measures against z of the whole top-k set. */
    if (p->min_p > 0 && n > 1) {
        double floor = (double)max + log((double)p->min_p);
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if ((double)c[i].logit >= floor) c[m++] = c[i];
        n = m; /* the max itself always stays */
    }
    qsort(c, (size_t)n, sizeof *c, cand_cmp);

    /* 3. top-p */
    if (p->top_p < 1) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - max) / z;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }

    /* 5. temperature over what is kept */
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp(((double)c[i].logit - max) / p->temperature);
    for (int32_t i = 0; i < n; i++) {
        d->ids[i] = c[i].id;
        d->probs[i] = (float)(exp(((double)c[i].logit - max) / p->temperature) / sum);
    }
    d->n = n;
    return EM_OK;
}

int32_t em_sampler_draw(em_sampler *s, const em_sample_dist *d) {
    if (d->n <= 1) return d->n == 1 ? d->ids[0] : -1;
    double total = 0;
    for (int32_t i = 0; i < d->n; i++) total += d->probs[i];
    double u = em_sampler_uniform(s) * total, cum = 0;
    for (int32_t i = 0; i < d->n; i++) {
        cum += d->probs[i];
        if (u < cum) return d->ids[i];
    }
    return d->ids[d->n - 1]; /* u within rounding of total */
}

int em_sampler_sample(em_sampler *s, const float *logits, int32_t *id, em_err *err) {
    *id = -1;
    if (s->p.temperature <= 0) {
        int32_t best = em_argmax(logits, s->n_vocab);
        if (best < 0 || logits[best] == -INFINITY)
            return em_err_set(err, EM_EINVAL, "sampler: no usable logit (all NaN or -inf) in a row of %d", s->n_vocab);
        *id = best;
        return EM_OK;
    }
    int rc = em_sampler_dist(s, logits, &s->d, err);
    if (!rc) *id = em_sampler_draw(s, &s->d);
    return rc;
}
