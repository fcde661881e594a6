/* sample/sample.c: greedy and filtered-temperature sampling over a logits row (order and
 * rules in sample.h), with a xoshiro256** generator seeded through splitmix64.
 *
 * Invariants: the sampler's random state changes only in em_sampler_draw/_uniform/_reseed;
 * the scratch arrays hold n_vocab entries and are overwritten by every em_sampler_dist;
 * sums are taken in double, stored probabilities in float; no allocation after create.
 * Results depend only on the rank order (higher logit, then lower id: a total order, so the
 * sorting method cannot change them) and on summation orders, which are kept fixed: top-p's
 * normaliser in id order, or in the order of the size-k heap that the ids are pushed into.
 * Work per row: one compare per id for top-k (plus O(log k) per heap update), exp per
 * candidate for top-p's normaliser, an LSD radix sort (O(n)) of what min-p leaves, cut short
 * to the leading ranks top-p can reach, and exp per kept id for the temperature. */
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
    cand *c;          /* scratch [n_vocab]: candidates */
    cand *tmp;        /* scratch [n_vocab]: the radix sort's second buffer */
    double *term;     /* scratch [n_vocab]: exp terms, by id for top-p, then by rank */
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
    s->tmp = s->c ? em_malloc((size_t)n_vocab * sizeof *s->tmp, "sampler scratch", err) : NULL;
    s->term = s->tmp ? em_malloc((size_t)n_vocab * sizeof *s->term, "sampler scratch", err) : NULL;
    if (!s->term || em_sample_dist_init(&s->d, n_vocab, err)) {
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
    free(s->tmp);
    free(s->term);
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

/* a ranks before b: higher logit, then lower id. A strict total order (ids are distinct), so
 * every correct sort of a set gives the same sequence: the sorting method is free. */
static inline bool better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* ---- top-k: a size-k heap whose root is the worst kept -------------------------------------- */

/* c[0..i) is a heap; adds c[i] to it. */
static void heap_push(cand *c, int32_t i) {
    cand x = c[i];
    int32_t j = i;
    while (j > 0) {
        int32_t up = (j - 1) / 2;
        if (!better(&c[up], &x)) break;
        c[j] = c[up];
        j = up;
    }
    c[j] = x;
}

/* c[0..k) is a full heap and x ranks before its root: x replaces the root. */
static void heap_replace_root(cand *c, int32_t k, cand x) {
    int32_t j = 0;
    for (;;) {
        int32_t l = 2 * j + 1, w = j;
        const cand *worst = &x;
        if (l < k && better(worst, &c[l])) w = l, worst = &c[l];
        if (l + 1 < k && better(worst, &c[l + 1])) w = l + 1;
        if (w == j) break;
        c[j] = c[w];
        j = w;
    }
    c[j] = x;
}

/* Keeps the k best of c[0..n) in c[0..k) (heap order, k < n). */
static void keep_top_k(cand *c, int32_t n, int32_t k) {
    for (int32_t i = 0; i < k; i++) heap_push(c, i);
    for (int32_t i = k; i < n; i++)
        if (better(&c[i], &c[0])) heap_replace_root(c, k, c[i]);
}

/* ---- candidates ----------------------------------------------------------------------------- */

/* Every usable id in id order: those whose logit is +inf (as logit 0) when there is one, else
 * every id whose logit is not NaN or -inf. Returns how many. */
static int32_t collect_all(const float *logits, int32_t n_vocab, cand *c) {
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (l == INFINITY) goto pinf;
        if (!(isnan(l) || l == -INFINITY)) c[n++] = (cand){ l, i };
    }
    return n;
pinf:
    n = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (logits[i] == INFINITY) c[n++] = (cand){ 0.0f, i };
    return n;
}

/* The candidates after top-k (k > 0) into c: the same sequence of heap operations as
 * collect_all then keep_top_k (ids in order: the first k pushed, each later one replacing
 * the root when it ranks before it), fused with the scan so that most ids cost one compare.
 * A later id ranks before the root only with a strictly higher logit (its id is higher).
 * Returns the count; *heaped says c is in heap order (else id order: at most k usable). */
static int32_t collect_top_k(const float *logits, int32_t n_vocab, int32_t k, cand *c, bool *heaped) {
    *heaped = false;
    int32_t n = 0, i = 0;
    for (; i < n_vocab && n < k; i++) {
        float l = logits[i];
        if (l == INFINITY) goto pinf;
        if (!(isnan(l) || l == -INFINITY)) c[n++] = (cand){ l, i };
    }
    for (; i < n_vocab; i++) { /* the (k+1)-th usable id, if any, turns c into a heap */
        float l = logits[i];
        if (l == INFINITY) goto pinf;
        if (isnan(l) || l == -INFINITY) continue;
        for (int32_t j = 0; j < k; j++) heap_push(c, j);
        *heaped = true;
        if (l > c[0].logit) heap_replace_root(c, k, (cand){ l, i });
        i++;
        break;
    }
    if (!*heaped) return n;
    float root = c[0].logit; /* finite: NaN and -inf never pass the compare, +inf leaves */
    for (; i < n_vocab; i++) {
        float l = logits[i];
        if (!(l > root)) continue;
        if (l == INFINITY) goto pinf;
        heap_replace_root(c, k, (cand){ l, i });
        root = c[0].logit;
    }
    return k;
pinf:
    n = collect_all(logits, n_vocab, c);
    if (k < n) {
        keep_top_k(c, n, k);
        *heaped = true;
        n = k;
    }
    return n;
}

/* ---- sorting into rank order ---------------------------------------------------------------- */

/* Unsigned key that orders finite floats from highest to lowest (-0 as +0, they compare equal). */
static inline uint32_t rank_key(float l) {
    uint32_t u;
    memcpy(&u, &l, sizeof u);
    if (u == 0x80000000u) u = 0;
    uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~ascending;
}

enum { RADIX_BITS = 11, RADIX = 1 << RADIX_BITS, SMALL_SORT = 48 };

/* One stable counting pass of src into dst by the digit at shift of key(c) (id or rank key). */
static void radix_pass(const cand *src, cand *dst, int32_t n, int shift, bool by_id, uint32_t *count) {
    uint32_t start = 0;
    for (int b = 0; b < RADIX; b++) {
        uint32_t cnt = count[b];
        count[b] = start;
        start += cnt;
    }
    for (int32_t i = 0; i < n; i++) {
        uint32_t key = by_id ? (uint32_t)src[i].id : rank_key(src[i].logit);
        dst[count[(key >> shift) & (RADIX - 1)]++] = src[i];
    }
}

static void insertion_sort(cand *c, int32_t n) {
    for (int32_t i = 1; i < n; i++) {
        cand x = c[i];
        int32_t j = i;
        for (; j > 0 && better(&x, &c[j - 1]); j--) c[j] = c[j - 1];
        c[j] = x;
    }
}

/* Sorts c[0..n) into rank order (best first) with tmp[n] as the second buffer: LSD radix
 * sort, by id first unless c is already in id order (then stability keeps ties by id), then
 * by rank key; passes whose digit is the same for every entry are skipped. */
static void sort_ranked(cand *c, cand *tmp, int32_t n, bool id_order) {
    if (n <= SMALL_SORT) {
        insertion_sort(c, n);
        return;
    }
    static const int shifts[3] = { 0, RADIX_BITS, 2 * RADIX_BITS };
    uint32_t count[3][RADIX];
    cand *src = c, *dst = tmp;
    for (int by_id = id_order ? 0 : 1; by_id >= 0; by_id--) {
        memset(count, 0, sizeof count);
        for (int32_t i = 0; i < n; i++) {
            uint32_t key = by_id ? (uint32_t)src[i].id : rank_key(src[i].logit);
            count[0][key & (RADIX - 1)]++;
            count[1][(key >> RADIX_BITS) & (RADIX - 1)]++;
            count[2][key >> (2 * RADIX_BITS)]++;
        }
        uint32_t first = by_id ? (uint32_t)src[0].id : rank_key(src[0].logit);
        for (int d = 0; d < 3; d++) {
            if (count[d][(first >> shifts[d]) & (RADIX - 1)] == (uint32_t)n) continue; /* one digit */
            radix_pass(src, dst, n, shifts[d], by_id, count[d]);
            cand *t = src;
            src = dst, dst = t;
        }
    }
    if (src != c) memcpy(c, src, (size_t)n * sizeof *c);
}

/* ---- top-p ------------------------------------------------------------------------------------ */

/* The shortest prefix of ranked c[0..n) whose share (term by id over z) reaches p; -1 if none. */
static int32_t top_p_cut(const cand *c, int32_t n, const double *term, double z, float p) {
    double cum = 0;
    for (int32_t i = 0; i < n; i++) {
        cum += term[c[i].id] / z;
        if (cum >= p) return i + 1;
    }
    return -1;
}

static int32_t top_p_sorted_all(cand *c, cand *tmp, int32_t n, bool id_order, const double *term, double z, float p) {
    sort_ranked(c, tmp, n, id_order);
    int32_t cut = top_p_cut(c, n, term, z, p);
    return cut < 0 ? n : cut;
}

enum { LAZY_TOP_P = 512, TOP_SHIFT = 32 - RADIX_BITS };

/* Ranks c[0..n) as far as top-p needs and returns its cut. The top digit of the rank key
 * (sign, exponent, two mantissa bits) is a coarser key of the same order, so the entries
 * whose digit is at most b are exactly the first ranks of the full order. b is the first
 * digit whose cumulative mass (summed in any order) clears p with a margin; only those are
 * sorted, and the cut is taken over them. Should rounding leave the cut unreached there, the
 * rest (kept behind them) is sorted too and the cut taken over all: the same ranks and the
 * same sums in the same order as a full sort, so the same result. */
static int32_t top_p_sorted(cand *c, cand *tmp, int32_t n, bool id_order, const double *term, double z, float p) {
    if (n < LAZY_TOP_P) return top_p_sorted_all(c, tmp, n, id_order, term, z, p);
    uint32_t count[RADIX] = { 0 };
    double mass[RADIX] = { 0 };
    for (int32_t i = 0; i < n; i++) {
        uint32_t digit = rank_key(c[i].logit) >> TOP_SHIFT;
        count[digit]++;
        mass[digit] += term[c[i].id];
    }
    double want = z * ((double)p + 1e-6), have = 0;
    int32_t m = 0;
    uint32_t b = 0;
    for (;; b++) {
        have += mass[b];
        m += (int32_t)count[b];
        if (have >= want || b == RADIX - 1) break;
    }
    if (m >= n) return top_p_sorted_all(c, tmp, n, id_order, term, z, p);
    int32_t head = 0, tail = m; /* stable partition: digits <= b first */
    for (int32_t i = 0; i < n; i++) tmp[(rank_key(c[i].logit) >> TOP_SHIFT) <= b ? head++ : tail++] = c[i];
    memcpy(c, tmp, (size_t)n * sizeof *c);
    sort_ranked(c, tmp, m, id_order);
    int32_t cut = top_p_cut(c, m, term, z, p);
    if (cut >= 0) return cut;
    sort_ranked(c + m, tmp, n - m, id_order);
    cut = top_p_cut(c, n, term, z, p);
    return cut < 0 ? n : cut;
}

/* ---- the filtered distribution -------------------------------------------------------------- */

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

    /* 1-2. candidates (+inf logits take everything), top-k */
    cand *c = s->c;
    bool heaped = false;
    int32_t n = p->top_k > 0 ? collect_top_k(logits, s->n_vocab, p->top_k, c, &heaped)
                             : collect_all(logits, s->n_vocab, c);
    if (n == 0)
        return em_err_set(err, EM_EINVAL, "sampler: no usable logit (all NaN or -inf) in a row of %d", s->n_vocab);
    float max = c[0].logit;
    for (int32_t i = 1; i < n; i++) max = c[i].logit > max ? c[i].logit : max;

    /* softmax normaliser over the top-k set, for top-p, summed in this (id or heap) order;
     * each term kept by id for the cut below */
    double *term = s->term, z = 0;
    if (p->top_p < 1)
        for (int32_t i = 0; i < n; i++) z += term[c[i].id] = exp((double)c[i].logit - max);

    /* 4 before 3: min-p keeps a prefix of the sorted order, so applying it first only
     * shortens the sort; top-p still measures against z of the whole top-k set. */
    if (p->min_p > 0 && n > 1) {
        double floor = (double)max + log((double)p->min_p);
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if ((double)c[i].logit >= floor) c[m++] = c[i];
        n = m; /* the max itself always stays */
    }
    /* 3. top-p, sorting only as far as it needs */
    if (p->top_p < 1) n = top_p_sorted(c, s->tmp, n, !heaped, term, z, p->top_p);
    else sort_ranked(c, s->tmp, n, !heaped);

    /* 5. temperature over what is kept (terms now by rank) */
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += term[i] = exp(((double)c[i].logit - max) / p->temperature);
    for (int32_t i = 0; i < n; i++) {
        d->ids[i] = c[i].id;
        d->probs[i] = (float)(term[i] / sum);
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
