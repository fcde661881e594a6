/* spec/schedule.c: how many drafts one target pass verifies (DSpark's confidence scheduling,
 * dspark.md §2.6, for one request). The drafter's confidence head gives, per slot, the chance
 * that the slot's draft is accepted given that all earlier ones were; their running product is
 * the survival a_j of draft j. Verifying j drafts commits E(j) = 1 + a_1 + .. + a_j tokens in
 * expectation (the 1: the target's own token after the accepted prefix) for the target's
 * cost(j + 1 rows). The width maximizes tokens per second walking upward and stops at the first
 * draft that does not raise E/cost: the decision to verify draft j then depends only on drafts
 * before j (a_j is built from the confidences of slots < j, each of which saw only the tokens
 * before it), which is what keeps rejection sampling lossless (the paper's App. A shows a
 * global argmax over all j is not). The walk is also offered one draft at a time
 * (em_spec_sched_*), so the loop can stop a drafter before it makes slots nobody verifies.
 * No state beyond the caller's em_spec_sched, no allocation. */
#include "spec/spec_impl.h"

#include <math.h>

static double sigmoid(float z) {
    if (isnan(z)) return 0.0;
    return 1.0 / (1.0 + exp(-(double)z));
}

static bool usable(double c) { return isfinite(c) && c > 0; }

void em_spec_sched_start(em_spec_sched *st, em_spec_cost_fn cost, void *ud) {
    *st = (em_spec_sched){ .cost = cost, .ud = ud, .expected = 1.0, .survival = 1.0 };
    double c1 = cost ? cost(ud, 1) : 0.0;
    st->all = !usable(c1); /* no cost curve to weigh against: every draft */
    st->best = st->all ? 0.0 : st->expected / c1;
}

bool em_spec_sched_keep(em_spec_sched *st, float z) {
    if (st->stopped) return false;
    if (st->all) return ++st->width, true;
    st->survival *= sigmoid(z);
    double c = st->cost(st->ud, st->width + 2); /* the anchor and drafts 1 .. width + 1 */
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

int em_spec_schedule(const float *z, int n, em_spec_cost_fn cost, void *ud) {
    if (n <= 0) return 0;
    if (!z || !cost) return n;
    em_spec_sched st;
    em_spec_sched_start(&st, cost, ud);
    int width = 0;
    while (width < n && em_spec_sched_keep(&st, z[width])) width++;
    return width;
}
