/* draft/draft.c: the drafter interface's front door. Owns the argument checks every
 * operation gets before it reaches an implementation (so implementations may assume sane
 * pointers, counts, token ids and chains), the dispatch of em_draft_open to the DSpark/DFlash
 * loader, and the chain's per-slot rules (pick, keep) on the CPU, so every CPU drafter picks
 * and stops exactly alike. Must not know any implementation's internals. */
#include "backend/gpu.h"
#include "draft/draft_impl.h"
#include "model/model.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int em_draft_read_taps(const char *draft_path, int *taps, int *n_taps, em_err *err) {
    if (!taps || !n_taps) return em_err_set(err, EM_EINVAL, "em_draft_read_taps: taps or n_taps is NULL");
    *n_taps = 0;
    if (!draft_path || !*draft_path) return em_err_set(err, EM_EINVAL, "em_draft_read_taps: no drafter file given");
    return em_dspark_read_taps(draft_path, taps, n_taps, err);
}

int em_draft_open(em_drafter **out, const char *draft_path, const em_target_shared *target,
                  const em_draft_opts *opts, em_err *err) {
    if (!out) return em_err_set(err, EM_EINVAL, "em_draft_open: out is NULL");
    *out = NULL;
    if (!draft_path || !*draft_path)
        return em_err_set(err, EM_EINVAL, "em_draft_open: no drafter file given");
    if (!target || !target->path || !*target->path)
        return em_err_set(err, EM_EINVAL, "em_draft_open: drafter %s: no target given", draft_path);
    em_draft_opts o = opts ? *opts : (em_draft_opts){ 0 };
    if (o.n_threads < 0 || o.n_threads > 1024)
        return em_err_set(err, EM_EINVAL, "em_draft_open: %d threads (want 0..1024)", o.n_threads);
    if (o.n_ctx < 0)
        return em_err_set(err, EM_EINVAL, "em_draft_open: context size %d is negative", o.n_ctx);
    if (o.n_threads == 0) o.n_threads = em_cpu_count();
    if (o.n_ctx == 0) o.n_ctx = EM_DRAFT_DEFAULT_CTX;
    if (!o.device || !strcmp(o.device, "cpu")) return em_dspark_open(out, draft_path, target, &o, err);
    int index, rc = em_gpu_parse_device(o.device, &index, err);
    if (rc) return rc;
    return em_dspark_cuda_open(out, draft_path, target, &o, index, err);
}

int em_draft_add_context(em_drafter *d, const float *feats, int n, em_err *err) {
    if (!d) return em_err_set(err, EM_EINVAL, "em_draft_add_context: drafter is NULL");
    if (n < 0) return em_err_set(err, EM_EINVAL, "em_draft_add_context: %d rows is negative", n);
    if (n == 0) return EM_OK;
    if (!feats) return em_err_set(err, EM_EINVAL, "em_draft_add_context: %d rows but no features", n);
    /* a NaN or infinity would spread through fc into every later block without a trace */
    const int64_t total = (int64_t)n * d->info.n_feat;
    for (int64_t i = 0; i < total; i++)
        if (!isfinite(feats[i]))
            return em_err_set(err, EM_EINVAL, "em_draft_add_context: row %lld value %lld is not finite (%g)",
                              (long long)(i / d->info.n_feat), (long long)(i % d->info.n_feat),
                              (double)feats[i]);
    return d->ops->add_context(d, feats, n, err);
}

int em_draft_add_context_target(em_drafter *d, int row0, int n, int type, em_err *err) {
    if (!d) return em_err_set(err, EM_EINVAL, "em_draft_add_context_target: drafter is NULL");
    if (!d->info.target_features || !d->ops->add_context_target)
        return em_err_set(err, EM_EUNSUPPORTED, "em_draft_add_context_target: the drafter on %s does not read its "
                          "target's device features", d->info.device ? d->info.device : "cpu");
    if (row0 < 0 || n < 0) return em_err_set(err, EM_EINVAL, "em_draft_add_context_target: rows %d + %d", row0, n);
    if (type != EM_TYPE_F32 && type != EM_TYPE_F16 && type != EM_TYPE_BF16 && type != EM_TYPE_Q8_0)
        return em_err_set(err, EM_EINVAL, "em_draft_add_context_target: type %s is not f32, f16, bf16 or q8_0",
                          em_type_name(type));
    return n ? d->ops->add_context_target(d, row0, n, type, err) : EM_OK;
}

/* The chain's combinations that make sense (draft.h), for n_max slots of n_vocab ids. */
static int check_chain(const em_draft_chain *c, int n_max, int32_t n_vocab, em_err *err) {
    if (!c) return em_err_set(err, EM_EINVAL, "em_draft_propose: no chain given (how to pick tokens)");
    if (c->choose && c->sampler)
        return em_err_set(err, EM_EINVAL, "em_draft_propose: chain has both a chooser and a sampler");
    if (c->keep && c->sched)
        return em_err_set(err, EM_EINVAL, "em_draft_propose: chain has both a keep callback and schedule parameters");
    if (c->dists && !c->sampler)
        return em_err_set(err, EM_EINVAL, "em_draft_propose: chain asks for draft distributions without a sampler");
    for (int k = 0; c->dists && k < n_max; k++) /* n_max here: at most info.n_drafts */
        if (c->dists[k].cap < n_vocab)
            return em_err_set(err, EM_EINVAL, "em_draft_propose: chain dists[%d] holds %d ids, the vocabulary has %d", k,
                              c->dists[k].cap, n_vocab);
    if (c->sched && (c->sched->n_cost < 0 || c->sched->n_cost > EM_DRAFT_MAX_BLOCK + 1))
        return em_err_set(err, EM_EINVAL, "em_draft_propose: schedule n_cost %d (want 0..%d)", c->sched->n_cost,
                          EM_DRAFT_MAX_BLOCK + 1);
    return EM_OK;
}

bool em_draft_chain_may_stop(const em_draft_chain *c) { return c->keep || c->sched; }

void em_draft_chain_begin(const em_draft_chain *c, em_draft_sched *st) { em_draft_sched_start(st, c->sched); }

bool em_draft_chain_keep(const em_draft_chain *c, em_draft_sched *st, int k, float conf_logit) {
    if (c->keep) return c->keep(c->keep_ud, k, conf_logit);
    return c->sched ? em_draft_sched_keep(st, conf_logit) : true;
}

int32_t em_draft_chain_pick(const em_draft_chain *c, int k, const float *logits, int32_t n_vocab) {
    if (c->choose) return c->choose(c->choose_ud, k, logits);
    if (!c->sampler || em_sampler_params_of(c->sampler)->temperature <= 0) return em_argmax(logits, n_vocab);
    em_err ignored = { 0 };
    int32_t id = -1;
    if (!c->dists) return em_sampler_sample(c->sampler, logits, &id, &ignored) ? -1 : id;
    if (em_sampler_dist(c->sampler, logits, &c->dists[k], &ignored)) return -1;
    return em_sampler_draw(c->sampler, &c->dists[k]);
}

int em_draft_propose(em_drafter *d, int32_t anchor, int n_max, const em_draft_chain *chain,
                     em_draft_out *out, em_err *err) {
    if (!d) return em_err_set(err, EM_EINVAL, "em_draft_propose: drafter is NULL");
    if (!out) return em_err_set(err, EM_EINVAL, "em_draft_propose: out is NULL");
    out->n = 0;
    if (!out->tokens) return em_err_set(err, EM_EINVAL, "em_draft_propose: out->tokens is NULL");
    if (n_max < 1)
        return em_err_set(err, EM_EINVAL, "em_draft_propose: n_max %d (want >= 1)", n_max);
    if (anchor < 0 || anchor >= d->info.n_vocab)
        return em_err_set(err, EM_EINVAL, "em_draft_propose: anchor token %d is outside the vocabulary [0, %d)",
                          (int)anchor, d->info.n_vocab);
    int rc = check_chain(chain, n_max < d->info.n_drafts ? n_max : d->info.n_drafts, d->info.n_vocab, err);
    if (rc) return rc;
    return d->ops->propose(d, anchor, n_max, chain, out, err);
}

void em_draft_reset(em_drafter *d) {
    if (d) d->ops->reset(d);
}

void em_draft_close(em_drafter *d) {
    if (d) d->ops->close(d);
}

const em_draft_info *em_draft_get_info(const em_drafter *d) { return d ? &d->info : NULL; }
