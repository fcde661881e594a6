/* spec/schedule.c: how many drafts one target pass verifies (DSpark's confidence scheduling,
 * dspark.md §2.6, for one request). The drafter's confidence head gives, per slot, the chance
 * that the slot's draft is accepted given that all earlier ones were; their running product is
 * the survival a_j of draft j. Verifying j drafts commits E(j) = 1 + a_1 + .. + a_j tokens in
 * expectation (the 1: the target's own token after the accepted prefix) for the target's
 * cost(j + 1 rows). The width maximizes tokens per second walking upward and stops at the first
 * draft that does not raise E/cost: the decision to verify draft j then depends only on drafts
 * before j (a_j is built from the confidences of slots < j, each of which saw only the tokens
 * before it), which is what keeps rejection sampling lossless (the paper's App. A shows a
 * global argmax over all j is not). Pure function: no state, no allocation. */
#include "spec/spec_impl.h"

#include <math.h>

static double sigmoid(float z) {
    if (isnan(z)) return 0.0;
    return 1.0 / (1.0 + exp(-(double)z));
}

static bool usable(double c) { return isfinite(c) && c > 0; }

int em_spec_schedule(const float *z, int n, em_spec_cost_fn cost, void *ud) {
    if (n <= 0) return 0;
    if (!z || !cost) return n;
    double c1 = cost(ud, 1);
    if (!usable(c1)) return n;
    double expected = 1.0, survival = 1.0, best = expected / c1;
    int width = 0;
    for (int j = 1; j <= n; j++) {
        survival *= sigmoid(z[j - 1]);
        double c = cost(ud, j + 1);
        if (!usable(c)) return n;
        double gain = (expected + survival) / c;
        if (!(gain > best)) break; /* widening stopped paying: stop here (non-anticipating) */
        expected += survival;
        best = gain;
        width = j;
    }
    return width;
}
