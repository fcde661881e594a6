/* draft/schedule.c: how many drafts one target pass verifies (DSpark's confidence scheduling,
 * dspark.md §2.6, for one request), the one implementation of the walk: the decode loop runs
 * it over a block's confidences, a drafter runs it slot by slot inside its propose (from the
 * plain-data parameters of draft.h, so nothing calls back into the loop per slot).
 *
 * The drafter's confidence head gives, per slot, the chance that the slot's draft is accepted
 * given that all earlier ones were; their running product is the survival a_j of draft j.
 * Verifying j drafts commits E(j) = 1 + a_1 + .. + a_j tokens in expectation (the 1: the
 * target's own token after the accepted prefix) for cost[j] (j + 1 rows). The width maximizes
 * tokens per second walking upward and stops at the first draft that does not raise E/cost:
 * the decision to verify draft j then depends only on drafts before j (a_j is built from the
 * confidences of slots < j, each of which saw only the tokens before it), which is what keeps
 * rejection sampling lossless (the paper's App. A shows a global argmax over all j is not).
 * No state beyond the caller's em_draft_sched, no allocation. */
#include "draft/draft.h"

#include <math.h>

static double sigmoid(float z) {
    if (isnan(z)) return 0.0;
    return 1.0 / (1.0 + exp(-(double)z));
}

static bool usable(double c) { return isfinite(c) && c > 0; }

/* Seconds of a pass of n rows; 0 (unknown) past the table. */
static double cost_of(const em_draft_sched_params *p, int n) {
    return p && n >= 1 && n <= p->n_cost && n <= EM_DRAFT_MAX_BLOCK + 1 ? p->cost[n - 1] : 0.0;
}

void em_draft_sched_start(em_draft_sched *st, const em_draft_sched_params *p) {
    *st = (em_draft_sched){ .p = p, .expected = 1.0, .survival = 1.0 };
    double c1 = cost_of(p, 1);
    st->all = !usable(c1); /* no cost curve to weigh against: every draft */
    st->best = st->all ? 0.0 : st->expected / c1;
}

bool em_draft_sched_keep(em_draft_sched *st, float z) {
    if (st->stopped) return false;
    if (st->all) return ++st->width, true;
    st->survival *= sigmoid(z);
    double c = cost_of(st->p, st->width + 2); /* the anchor and drafts 1 .. width + 1 */
    if (!usable(c)) { /* an unknown cost from here on: every draft, as without a cost */
        st->all = true;
        return ++st->width, true;
    }
    double gain = (st->expected + st->survival) / c;
    if (!(gain > st->best)) { /* widening stopped paying: stop here (non-anticipating) */
        st->stopped = true;
        return false;
    }
    st->expected += st->survival;
    st->best = gain;
    return ++st->width, true;
}

int em_draft_schedule(const em_draft_sched_params *p, const float *z, int n) {
    if (n <= 0) return 0;
    if (!z || !p) return n;
    em_draft_sched st;
    em_draft_sched_start(&st, p);
    int width = 0;
    while (width < n && em_draft_sched_keep(&st, z[width])) width++;
    return width;
}
