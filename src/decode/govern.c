/* decode/govern.c: whether a pass drafts. Speculation pays when the tokens a speculative pass
 * commits, over what the pass costs (the drafter's proposal, the verify, the commit), beat one
 * token over what a plain pass costs. The governor keeps averages of both kinds of pass from
 * the passes the loop reports, and answers, pass by pass, draft or not:
 *
 *   probe (speculative passes; one by default) -> without a plain figure yet, plain passes to get
 *   one -> then after every speculative pass: still paying? stay; else a stretch of plain
 *   passes, twice as long each time the next probe fails too (reset when one pays), then a
 *   fresh probe. While speculating, one plain pass now and then keeps the plain figure current
 *   (its cost grows with the context).
 *
 * What a pass costs is timed by the loop (EM_DECODE_SPEC_TIMED) or its nominal cost
 * (EM_DECODE_SPEC_NOMINAL: decisions then depend on acceptance alone, so a seeded run is
 * reproducible); EM_DECODE_SPEC_ALWAYS drafts every pass.
 *
 * Invariants: a decision depends only on passes already made (non-anticipating), so sampling
 * keeps exactly the target's distribution and greedy output is the same tokens either way;
 * the state is plain numbers, which the timed policy carries from call to call (and a caller
 * between processes: em_decode_govern_pack / _unpack, range-checked). Must not: know the
 * target or the drafter. */
#include "decode/decode.h"
#include "decode/decode_impl.h"

#include <math.h>
#include <string.h>

/* The averages: the mean of the passes since a (re)start, then, from the GOV_SETTLED-th pass on,
 * a decayed one giving the newest pass the weight 1 / GOV_SETTLED. How many tokens a speculative
 * pass commits swings from one to the whole block between neighbouring passes, and a pass from
 * storage costs what its misses cost: with a memory of four passes (the newest weighing 1/4),
 * one poor pass among good ones often ended speculation that paid 10-28% overall (from storage)
 * with a stretch of 32 plain passes or more. The mean's first passes weigh more, so a probe that
 * paid by luck is still corrected by its next passes. */
#define GOV_SETTLED 8

/* A failed probe costs about what its drafter's block costs (two plain tokens of the default
 * pair on a 2-core CPU), so probes are one pass and the first stretch 32 passes: on the
 * 128-prompt eval at T = 0.7, where speculation does not pay, governed decoding went from
 * 0.86-0.90x to 0.92-0.95x of plain with no loss at greedy (models/README.md). */
const em_decode_govern_params em_decode_govern_defaults = {
    .probe = 1, .plain_first = 1, .backoff_min = 32, .backoff_max = 256, .refresh = 64,
};

void em_decode_govern_reset(em_decode_govern *g, int policy, const em_decode_govern_params *p) {
    memset(g, 0, sizeof *g);
    g->policy = policy;
    g->p = p ? *p : em_decode_govern_defaults;
    g->probe_left = g->p.probe;
    g->backoff = g->p.backoff_min;
}

bool em_decode_govern_draft(em_decode_govern *g) {
    if (g->policy == EM_DECODE_SPEC_ALWAYS) return true;
    return g->plain_left == 0;
}

int em_decode_govern_plain_ahead(const em_decode_govern *g) {
    return g->policy == EM_DECODE_SPEC_ALWAYS ? 0 : g->plain_left;
}

/* The count of an average that takes one more pass, and that pass taken in (n: the new count). */
static int counted(int n) { return n < GOV_SETTLED ? n + 1 : n; }
static void average(double *avg, int n, double v) { *avg += (v - *avg) / n; }

/* Speculation pays when its tokens per second are at least plain decoding's. */
static bool spec_pays(const em_decode_govern *g) { return g->spec_tokens * g->plain_seconds >= g->spec_seconds; }

void em_decode_govern_report(em_decode_govern *g, bool drafted, int committed, double seconds) {
    if (g->policy == EM_DECODE_SPEC_ALWAYS) return;
    if (!drafted) {
        g->n_plain = counted(g->n_plain);
        average(&g->plain_seconds, g->n_plain, seconds);
        if (g->plain_left > 0 && --g->plain_left == 0 && g->stretch) { /* a stretch ends: probe afresh */
            g->stretch = false;
            g->n_spec = 0;
            g->probe_left = g->p.probe;
        }
        return;
    }
    g->n_spec = counted(g->n_spec);
    average(&g->spec_tokens, g->n_spec, (double)committed);
    average(&g->spec_seconds, g->n_spec, seconds);
    if (g->probe_left > 0 && --g->probe_left > 0) return;
    if (!g->n_plain) { /* a plain figure first */
        g->plain_left = g->p.plain_first;
        return;
    }
    if (!spec_pays(g)) {
        g->plain_left = g->backoff;
        g->stretch = true;
        g->backoff = g->backoff * 2 > g->p.backoff_max ? g->p.backoff_max : g->backoff * 2;
        g->since_refresh = 0;
        return;
    }
    g->backoff = g->p.backoff_min;
    if (++g->since_refresh >= g->p.refresh) {
        g->since_refresh = 0;
        g->plain_left = 1;
    }
}

/* ---- what a governor learnt, as numbers ------------------------------------------------------ */

void em_decode_govern_pack(const em_decode_govern *g, double v[EM_DECODE_GOVERN_VALUES]) {
    const double x[EM_DECODE_GOVERN_VALUES] = { g->spec_tokens, g->spec_seconds, g->plain_seconds, g->n_spec,
                                                g->n_plain,     g->probe_left,   g->plain_left,    g->stretch,
                                                g->backoff,     g->since_refresh };
    memcpy(v, x, sizeof x);
}

int em_decode_govern_unpack(em_decode_govern *g, int policy, const em_decode_govern_params *p,
                            const double v[EM_DECODE_GOVERN_VALUES], em_err *err) {
    /* a pass commits at most a few hundred tokens and takes at most an hour (a verify of a
     * trillion-parameter target from a slow disk); counters stay within the pacing */
    static const char *const names[EM_DECODE_GOVERN_VALUES] = {
        "tokens per speculative pass", "seconds per speculative pass", "seconds per plain pass",
        "speculative passes averaged", "plain passes averaged", "probe passes left", "plain passes left", "stretch",
        "next stretch", "passes since refresh",
    };
    const double hi[EM_DECODE_GOVERN_VALUES] = { 1024, 3600, 3600, GOV_SETTLED, GOV_SETTLED, p->probe, p->backoff_max,
                                                 1, p->backoff_max, p->refresh };
    const double lo[EM_DECODE_GOVERN_VALUES] = { 0, 0, 0, 0, 0, 0, 0, 0, p->backoff_min, 0 };
    for (int i = 0; i < EM_DECODE_GOVERN_VALUES; i++) {
        const bool whole = i >= 3; /* flags and counters */
        if (!isfinite(v[i]) || v[i] < lo[i] || v[i] > hi[i] || (whole && v[i] != floor(v[i])))
            return em_err_set(err, EM_EINVAL, "governor value %d (%s) is %g: want %s in [%g, %g]", i, names[i], v[i],
                              whole ? "a whole number" : "a number", lo[i], hi[i]);
    }
    em_decode_govern_reset(g, policy, p);
    g->spec_tokens = v[0], g->spec_seconds = v[1], g->plain_seconds = v[2];
    g->n_spec = (int)v[3], g->n_plain = (int)v[4];
    g->probe_left = (int)v[5], g->plain_left = (int)v[6], g->stretch = v[7] != 0;
    g->backoff = (int)v[8], g->since_refresh = (int)v[9];
    return EM_OK;
}
