/* tests/draft_oldpath.h: the decode loop's per-slot path as it was before drafters ran the
 * chain themselves, as a drafter wrapper for tests (test_decode, test_default_pair). The wrapper
 * takes the loop's chain (em_draft_chain: sampler, dists, schedule) and hands the wrapped
 * drafter test-oracle callbacks that do what the loop's callbacks did:
 *   choose: greedy em_argmax, else em_sampler_dist into the loop's dists[k] + em_sampler_draw;
 *   keep:   the schedule's walk written out here with a cost function asked lazily per width
 *           (the drafter's nominal block + slots, plus em_target_cost(n).nominal_seconds), the
 *           way the loop's walk asked it, independent of draft/schedule.c's table.
 * Running the loop with a drafter and with oldpath_wrap(drafter) must give the same tokens,
 * widths and accepted counts: the in-drafter chain against the old callbacks. */
#ifndef EM_TEST_DRAFT_OLDPATH_H
#define EM_TEST_DRAFT_OLDPATH_H

#include <math.h>
#include <stdlib.h>

#include "draft/draft.h"
#include "model/model.h"
#include "sample/sample.h"

typedef struct oldpath {
    em_drafter base;
    em_drafter *in;
    const em_target *target;
    const em_draft_chain *chain; /* the loop's, during a propose */
    double expected, survival, best; /* the old walk */
    int width;
    bool all, stopped;
    uint64_t picks, keeps; /* callbacks made */
} oldpath;

static inline double oldpath_cost(const oldpath *o, int n) {
    const em_draft_info *di = &o->in->info;
    return di->block_seconds + (double)(n - 1) * di->slot_seconds + em_target_cost(o->target, n).nominal_seconds;
}

static inline bool oldpath_usable(double c) { return isfinite(c) && c > 0; }

static inline int32_t oldpath_choose(void *ud, int k, const float *logits) {
    oldpath *o = ud;
    o->picks++;
    const em_draft_chain *c = o->chain;
    if (!c->sampler) return em_argmax(logits, o->base.info.n_vocab);
    em_err ignored = { 0 };
    if (em_sampler_dist(c->sampler, logits, &c->dists[k], &ignored)) return -1;
    return em_sampler_draw(c->sampler, &c->dists[k]);
}

static inline bool oldpath_keep(void *ud, int k, float z) {
    (void)k;
    oldpath *o = ud;
    o->keeps++;
    if (o->stopped) return false;
    if (o->all) return ++o->width, true;
    o->survival *= isnan(z) ? 0.0 : 1.0 / (1.0 + exp(-(double)z));
    double c = oldpath_cost(o, o->width + 2);
    if (!oldpath_usable(c)) {
        o->all = true;
        return ++o->width, true;
    }
    double gain = (o->expected + o->survival) / c;
    if (!(gain > o->best)) {
        o->stopped = true;
        return false;
    }
    o->expected += o->survival;
    o->best = gain;
    return ++o->width, true;
}

static inline int oldpath_propose(em_drafter *d, int32_t anchor, int n_max, const em_draft_chain *chain,
                                  em_draft_out *out, em_err *err) {
    oldpath *o = (oldpath *)d;
    o->chain = chain;
    em_draft_chain cb = { .choose = oldpath_choose, .choose_ud = o };
    if (chain->sched) { /* the loop scheduled: the old walk, started as the loop started it */
        double c1 = oldpath_cost(o, 1);
        o->expected = o->survival = 1.0, o->width = 0, o->stopped = false;
        o->all = !oldpath_usable(c1);
        o->best = o->all ? 0.0 : 1.0 / c1;
        cb.keep = oldpath_keep, cb.keep_ud = o;
    }
    return em_draft_propose(o->in, anchor, n_max, &cb, out, err);
}

static inline int oldpath_add_context(em_drafter *d, const float *feats, int n, em_err *err) {
    oldpath *o = (oldpath *)d;
    int rc = em_draft_add_context(o->in, feats, n, err);
    o->base.info.n_ctx = o->in->info.n_ctx;
    return rc;
}

static inline void oldpath_reset(em_drafter *d) {
    oldpath *o = (oldpath *)d;
    em_draft_reset(o->in);
    o->base.info.n_ctx = o->in->info.n_ctx;
}

static inline void oldpath_close(em_drafter *d) { (void)d; } /* the wrapped drafter is borrowed */

static const em_drafter_ops oldpath_ops = { .add_context = oldpath_add_context, .propose = oldpath_propose,
                                            .reset = oldpath_reset, .close = oldpath_close };

/* Wraps in (borrowed) for a loop over target. */
static inline void oldpath_wrap(oldpath *o, em_drafter *in, const em_target *target) {
    *o = (oldpath){ .base = { .ops = &oldpath_ops, .info = in->info }, .in = in, .target = target };
}

#endif
