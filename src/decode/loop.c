/* decode/loop.c: the ONE decode loop behind decode.h. A generate call resets the target (and the
 * drafter and feature ring), prefills the prompt in chunks (features of every prompt row into
 * the ring when there is a drafter), takes the first token from the last row, then runs steps
 *
 *     drafter context += new committed rows (from the ring)
 *     -> propose a block after the anchor: the drafter runs the whole chain itself from a
 *        plain-data description (greedy, or draws from the call's sampler; the schedule's
 *        keep test with this pass's costs, so it makes no slot that will not be verified)
 *     -> schedule (the same walk over the block's confidences, for drafters without one)
 *     -> verify [anchor, d_1..d_K], asking the target only for what acceptance reads: the
 *        rows' argmaxes when greedy, their logits when sampling
 *     -> accept -> commit(1 + accepted) -> ring += their features
 *     -> emit
 *
 * until end of generation, n_max tokens, a full context or a stop from the callback. The
 * anchor is the last emitted token, not yet in the target's state. Plain decoding is this loop
 * with no drafter: K = 0, width 1, no features; so is a call, or the rest of one, whose
 * governor stretch of plain passes outlasts it (the drafter parked: drafter_parks).
 *
 * A drafter on its target's device (info.target_features) skips the ring: the target keeps each
 * call's features on the device (em_rows.device_features) and the drafter takes them into its
 * context right after the call, rounded through the ring's type, with no host round trip.
 *
 * Invariants: every buffer is sized at create from the target's and drafter's info (nothing
 * is allocated per step; the sampler is made once per generate call because its parameters
 * come with the call). Before each step the target holds exactly the prompt and the emitted
 * tokens before the anchor, the ring holds the features of the rows committed since the
 * drafter last caught up (it catches up after every prefill chunk and every commit), and the
 * drafter's context reaches the target's position once synced; once parked, neither is kept
 * for the rest of the call, and the drafter makes no proposal in it. Each pass verifies at
 * most min(max width, context room, tokens still wanted) rows, so nothing past n_max is
 * computed; end-of-generation tokens (unless ignore_eog) end the call inside a block: they and
 * anything after them are not passed to the callback nor counted. Bytes the stream still holds
 * back at the end come in one last callback with token -1.
 *
 * Sampling is lossless: drafts are drawn, slot by slot (inside the drafter, from this call's
 * sampler, in slot order), from the drafter's corrected logits through the same sampler
 * (filters, temperature) as the target's rows, and accept.c applies
 * speculative rejection sampling against exactly those distributions; the width schedule is
 * non-anticipating (draft/schedule.c). All randomness comes from the call's seeded sampler.
 *
 * Timing: prompt_seconds is the prefill (with the drafter's prompt context); gen_seconds runs
 * from there to the end; draft_seconds is the drafter's share of both.
 *
 * Must not: know any architecture (only model.h and draft.h), or keep state between generate
 * calls beyond its buffers and, under the timed spec policy, what the governor learnt (one
 * governor for greedy calls, one for sampled ones: a server's next request starts from what
 * the last ones showed instead of probing afresh; the nominal policy starts over every call,
 * so that a seeded call does not depend on the calls before it). */
#include "decode/decode.h"
#include "decode/decode_impl.h"

#include "quant/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PREFILL_CHUNK 128 /* prompt rows per prefill call (and per drafter context extension) */

struct em_decode {
    em_target *target;
    em_drafter *drafter;   /* NULL: plain decoding */
    const em_tok *tok;     /* NULL: no end-of-generation ids, no text */
    em_tok_stream *stream; /* NULL without tok */
    int fixed_width;       /* 0: scheduled per pass */
    int spec_policy;       /* enum em_decode_spec_policy */
    em_decode_govern_params govern; /* its pacing */
    em_decode_govern learnt[2];     /* timed policy: the governor after the last greedy [0] and
                                       sampled [1] call */
    bool have_learnt[2];
    int max_width;         /* rows a verify may take */
    int32_t n_vocab;
    int n_feat;            /* 0 without a drafter */
    int feat_rows;         /* rows of feats */
    float *logits;         /* [max_width][n_vocab]: rows of the last prefill/verify (sampling) */
    int32_t *argmax;       /* [max_width]: their argmaxes (greedy) */
    float *feats;          /* [feat_rows][n_feat]: captured features, and ring rows read back */
    int32_t *rows;         /* [max_width]: the verified tokens, anchor first, then the drafts */
    int32_t *out;          /* [max_width]: the tokens a step emits (accepted drafts, then next) */
    float *conf;           /* [max_width - 1]: confidence logits of the proposed slots */
    em_sample_dist *dists; /* [max_width - 1]: the distribution each draft was drawn from */
    em_decode_ring *ring;
    em_decode_accept *accept;
    bool device_feats;     /* the drafter reads the features its target keeps on their device:
                              added to its context right after each call, the ring unused */
    int feature_type;      /* the ring's storage type (the rounding the drafter's rows get) */
};

/* One generate call's state. */
typedef struct gen {
    em_decode *s;
    em_sampler *sampler;
    bool greedy;
    const em_decode_params *p;
    em_decode_on_token on_token;
    void *ud;
    em_decode_result *res;
    uint64_t rows_verified;
    em_decode_govern gov;
    bool no_draft; /* the drafter refused this request's chain (EM_EUNSUPPORTED for a sampled
                      one): plain passes for the rest of it */
    bool parked;   /* the governor's plain stretch outlasts the call: the drafter sits the rest of
                      it out (no features kept, its context left behind; drafter_parks) */
    bool done;
} gen;

int em_decode_feature_type(const char *name) {
    static const struct { const char *name; int type; } types[] = {
        { "f32", EM_TYPE_F32 }, { "f16", EM_TYPE_F16 }, { "bf16", EM_TYPE_BF16 }, { "q8_0", EM_TYPE_Q8_0 },
    };
    for (size_t i = 0; name && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(name, types[i].name)) return types[i].type;
    return -1;
}

int em_decode_spec_policy(const char *name) {
    static const struct { const char *name; int policy; } policies[] = {
        { "always", EM_DECODE_SPEC_ALWAYS }, { "auto", EM_DECODE_SPEC_TIMED }, { "nominal", EM_DECODE_SPEC_NOMINAL },
    };
    for (size_t i = 0; name && i < sizeof policies / sizeof policies[0]; i++)
        if (!strcmp(name, policies[i].name)) return policies[i].policy;
    return -1;
}

void em_decode_set_govern(em_decode *s, const em_decode_govern_params *p) {
    s->govern = *p;
    s->have_learnt[0] = s->have_learnt[1] = false;
}

_Static_assert(EM_DECODE_LEARNT_VALUES == 2 * EM_DECODE_GOVERN_VALUES, "a greedy and a sampled governor");

unsigned em_decode_learnt_get(const em_decode *s, double out[EM_DECODE_LEARNT_VALUES]) {
    unsigned known = 0;
    for (int k = 0; k < 2; k++) {
        double *v = out + k * EM_DECODE_GOVERN_VALUES;
        if (s->have_learnt[k]) em_decode_govern_pack(&s->learnt[k], v), known |= 1u << k;
        else memset(v, 0, EM_DECODE_GOVERN_VALUES * sizeof *v);
    }
    return known;
}

int em_decode_learnt_set(em_decode *s, unsigned known, const double in[EM_DECODE_LEARNT_VALUES], em_err *err) {
    em_decode_govern g[2];
    for (int k = 0; k < 2; k++) {
        if (!(known >> k & 1)) continue;
        int rc = em_decode_govern_unpack(&g[k], s->spec_policy, &s->govern, in + k * EM_DECODE_GOVERN_VALUES, err);
        if (rc) return em_err_prefix(err, "what the %s calls' governor learnt", k ? "sampled" : "greedy");
    }
    for (int k = 0; k < 2; k++) {
        s->have_learnt[k] = known >> k & 1;
        if (s->have_learnt[k]) s->learnt[k] = g[k];
    }
    return EM_OK;
}

/* ---- create ------------------------------------------------------------------------------- */

/* The drafter fits the target: same vocabulary, features of the same width. */
static int check_drafter(const em_target_info *ti, const em_draft_info *di, em_err *err) {
    if (di->n_vocab != ti->n_vocab)
        return em_err_set(err, EM_EINVAL, "spec: the drafter's vocabulary has %d ids, the target's %d", di->n_vocab,
                          ti->n_vocab);
    if (ti->n_feat == 0)
        return em_err_set(err, EM_EINVAL, "spec: the target captures no features (open it with the drafter's %d tap "
                          "layers as feature layers)", di->n_taps);
    if (di->n_feat != ti->n_feat)
        return em_err_set(err, EM_EINVAL, "spec: the drafter reads %d features per row (%d taps), the target "
                          "captures %d (n_embd %d): the drafter does not fit this target", di->n_feat, di->n_taps,
                          ti->n_feat, ti->n_embd);
    if (di->n_drafts < 1 || di->n_drafts > EM_DRAFT_MAX_BLOCK)
        return em_err_set(err, EM_EINVAL, "spec: the drafter proposes %d tokens per block (1..%d)", di->n_drafts,
                          EM_DRAFT_MAX_BLOCK);
    return EM_OK;
}

/* Rows per verify: the fixed width when given (checked), else the drafter's block. */
static int resolve_width(const em_decode_opts *o, const em_target_info *ti, int *fixed, int *max_width, em_err *err) {
    int w = o->verify_width;
    if (w < 0) return em_err_set(err, EM_EINVAL, "spec: verify width %d is negative", w);
    if (!o->drafter) {
        if (w > 1)
            return em_err_set(err, EM_EINVAL, "spec: a verify width of %d needs a drafter, and there is none "
                              "(plain decoding verifies 1 row)", w);
        *fixed = 1, *max_width = 1;
        return EM_OK;
    }
    int block = o->drafter->info.n_drafts + 1;
    if (w > block)
        return em_err_set(err, EM_EINVAL, "spec: verify width %d is more than the drafter's block allows (%d drafts "
                          "+ the anchor = %d rows)", w, block - 1, block);
    if (w > ti->max_verify)
        return em_err_set(err, EM_EINVAL, "spec: verify width %d is more than the target's %d rows with a fast "
                          "commit", w, ti->max_verify);
    *fixed = w;
    *max_width = w ? w : (block < ti->max_verify ? block : ti->max_verify);
    return EM_OK;
}

static int alloc_array(void **p, uint64_t count, size_t size, const char *what, em_err *err) {
    uint64_t bytes;
    if (em_mul_overflow(count, (uint64_t)size, &bytes) || bytes > SIZE_MAX)
        return em_err_set(err, EM_EOVERFLOW, "spec: %s of %llu items does not fit in memory", what,
                          (unsigned long long)count);
    *p = em_malloc(bytes ? (size_t)bytes : 1, what, err);
    return *p ? EM_OK : EM_ENOMEM;
}

static int alloc_buffers(em_decode *s, const em_decode_opts *o, em_err *err) {
    int n_slots = s->max_width - 1;
    int rc = alloc_array((void **)&s->logits, (uint64_t)s->max_width * (uint64_t)s->n_vocab, sizeof(float),
                         "decode loop logits", err);
    /* every row is written within the first passes: fault its pages in now, not in a pass */
    if (!rc) memset(s->logits, 0, (size_t)s->max_width * (size_t)s->n_vocab * sizeof(float));
    if (!rc) rc = alloc_array((void **)&s->argmax, (uint64_t)s->max_width, sizeof(int32_t), "decode loop argmaxes", err);
    if (!rc) rc = alloc_array((void **)&s->rows, (uint64_t)s->max_width, sizeof(int32_t), "decode loop rows", err);
    if (!rc) rc = alloc_array((void **)&s->out, (uint64_t)s->max_width, sizeof(int32_t), "decode loop tokens", err);
    if (rc || !s->drafter) return rc;
    s->feat_rows = s->max_width > PREFILL_CHUNK ? s->max_width : PREFILL_CHUNK;
    rc = alloc_array((void **)&s->feats, (uint64_t)s->feat_rows * (uint64_t)s->n_feat, sizeof(float),
                     "decode loop features", err);
    if (!rc) rc = alloc_array((void **)&s->conf, (uint64_t)n_slots, sizeof(float), "draft confidences", err);
    if (!rc && !(s->dists = em_calloc((size_t)n_slots, sizeof *s->dists, "draft distributions", err))) rc = EM_ENOMEM;
    for (int k = 0; !rc && k < n_slots; k++) rc = em_sample_dist_init(&s->dists[k], s->n_vocab, err);
    /* the drafter catches up after every prefill chunk and every commit, so the ring needs to
     * hold only one of either (not the context: 190 MB of F32 for a real Kimi drafter) */
    if (!rc) rc = em_decode_ring_create(&s->ring, s->n_feat, s->feat_rows, o->feature_type, err);
    if (!rc) rc = em_decode_accept_create(&s->accept, s->n_vocab, err);
    return rc;
}

/* Whether the drafter can take its context from the feature rows the target keeps on their
 * device: every call of the loop (a prefill chunk, a verify) fits in them. */
static bool device_features(const em_target *target, const em_drafter *d, int max_width) {
    em_target_shared sh;
    em_err ignored = { 0 };
    if (!d->info.target_features || em_target_shared_weights(target, &sh, &ignored)) return false;
    return sh.d_features && sh.feature_rows >= PREFILL_CHUNK && sh.feature_rows >= max_width;
}

int em_decode_create(em_decode **out, em_target *target, const em_decode_opts *opts, em_err *err) {
    *out = NULL;
    if (!target) return em_err_set(err, EM_EINVAL, "spec: no target");
    em_decode_opts o = opts ? *opts : (em_decode_opts){ 0 };
    const em_target_info *info = em_target_get_info(target);
    if (info->n_vocab < 1) return em_err_set(err, EM_EINVAL, "spec: the target has no vocabulary");
    int t = o.feature_type;
    if (t != EM_TYPE_F32 && t != EM_TYPE_F16 && t != EM_TYPE_BF16 && t != EM_TYPE_Q8_0)
        return em_err_set(err, EM_EINVAL, "spec: feature type %s is not f32, f16, bf16 or q8_0", em_type_name(t));
    if (o.spec_policy < EM_DECODE_SPEC_ALWAYS || o.spec_policy > EM_DECODE_SPEC_NOMINAL)
        return em_err_set(err, EM_EINVAL, "spec: policy %d is not always, timed or nominal", o.spec_policy);
    int rc = o.drafter ? check_drafter(info, &o.drafter->info, err) : EM_OK;
    int fixed = 0, max_width = 1;
    if (!rc) rc = resolve_width(&o, info, &fixed, &max_width, err);
    if (rc) return rc;

    em_decode *s = em_calloc(1, sizeof *s, "decode loop", err);
    if (!s) return EM_ENOMEM;
    s->target = target;
    s->drafter = max_width > 1 ? o.drafter : NULL; /* width 1 never drafts */
    s->tok = o.tok;
    s->fixed_width = fixed;
    s->spec_policy = o.spec_policy;
    s->govern = em_decode_govern_defaults;
    s->max_width = max_width;
    s->n_vocab = info->n_vocab;
    s->n_feat = s->drafter ? info->n_feat : 0;
    s->feature_type = o.feature_type;
    s->device_feats = s->drafter && device_features(target, s->drafter, max_width);
    rc = alloc_buffers(s, &o, err);
    if (!rc && s->tok) rc = em_tok_stream_create(&s->stream, s->tok, EM_TOK_STREAM_SKIP_SPECIAL, err);
    if (rc) {
        em_decode_free(s);
        return rc;
    }
    *out = s;
    return EM_OK;
}

void em_decode_free(em_decode *s) {
    if (!s) return;
    em_tok_stream_free(s->stream);
    for (int k = 0; s->dists && k < s->max_width - 1; k++) em_sample_dist_free(&s->dists[k]);
    free(s->dists);
    em_decode_ring_free(s->ring);
    em_decode_accept_free(s->accept);
    free(s->logits);
    free(s->argmax);
    free(s->feats);
    free(s->rows);
    free(s->out);
    free(s->conf);
    free(s);
}

static int check_call(const em_decode *s, const int32_t *prompt, int n_prompt, const em_decode_params *p,
                      em_err *err) {
    if (!s || !p) return em_err_set(err, EM_EINVAL, "generate: no %s", s ? "parameters" : "session");
    if (p->n_max < 1) return em_err_set(err, EM_EINVAL, "generate: n_max is %d; it must be at least 1", p->n_max);
    if (n_prompt < 1 || !prompt)
        return em_err_set(err, EM_EINVAL, "generate: the prompt is empty (at least one token is needed)");
    const em_target_info *info = em_target_get_info(s->target);
    if (n_prompt > info->n_ctx)
        return em_err_set(err, EM_EINVAL,
                          "generate: the prompt of %d tokens does not fit in the context of %d positions",
                          n_prompt, info->n_ctx);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= info->n_vocab)
            return em_err_set(err, EM_EINVAL, "generate: prompt token %d (at %d) is out of range [0, %d)",
                              prompt[i], i, info->n_vocab);
    return EM_OK;
}

/* ---- the drafter's side -------------------------------------------------------------------- */

/* Parks the drafter for the rest of the call when the governor's plain stretch outlasts every
 * pass the call can still make (passes_left: each pass emits at least one token): it would not
 * draft again before the call ends, so keeping its context in step (the target's features
 * per row, the drafter's context per row, about 2% of a plain token on a 2-core CPU) buys
 * nothing. The governor still hears of every pass, so the stretch counts down as before. */
static void drafter_parks(gen *g, int64_t passes_left) {
    if (g->s->drafter && em_decode_govern_plain_ahead(&g->gov) >= passes_left) g->parked = true;
}

/* Extends the drafter's context with the ring's rows up to the target's position. */
static int sync_drafter(gen *g, em_err *err) {
    em_decode *s = g->s;
    em_drafter *d = s->drafter;
    int64_t want = em_target_position(s->target);
    while (d->info.n_ctx < want) {
        int64_t have = d->info.n_ctx;
        int n = want - have < s->feat_rows ? (int)(want - have) : s->feat_rows;
        int rc = em_decode_ring_read(s->ring, have, n, s->feats, err);
        if (!rc) rc = em_draft_add_context(d, s->feats, n, err);
        if (rc) return em_err_prefix(err, "drafter context at position %lld", (long long)have);
        if (d->info.n_ctx != have + n)
            return em_err_set(err, EM_EINVAL, "drafter context: %d rows added at %lld, but it now holds %lld", n,
                              (long long)have, (long long)d->info.n_ctx);
    }
    if (d->info.n_ctx != want)
        return em_err_set(err, EM_EINVAL, "drafter context holds %lld rows, the target %lld",
                          (long long)d->info.n_ctx, (long long)want);
    return EM_OK;
}

/* A pass of n rows costs the drafter's block with its n - 1 draft slots (slots past the
 * verified ones are never made) plus the target's verify, both at the nominal rates of
 * compute.h: weighing only the verify would make drafting look free and keep widths narrow
 * when it is not, and timed costs would make a seeded run's widths, and so its random stream,
 * depend on the machine's load. */
typedef struct pass_cost {
    const em_target *target;
    double block_seconds, slot_seconds;
} pass_cost;

static double pass_seconds(const pass_cost *c, int n) {
    return c->block_seconds + (double)(n - 1) * c->slot_seconds + em_target_cost(c->target, n).nominal_seconds;
}

/* The keep test's parameters for a block of up to `want` drafts: every pass width it may
 * weigh, priced now (the cost depends only on the target's state, which proposing does not
 * change, so a table made up front gives the walk exactly the costs it would ask for). */
static void sched_params(const pass_cost *c, int want, em_draft_sched_params *p) {
    p->n_cost = want + 1;
    for (int n = 1; n <= p->n_cost; n++) p->cost[n - 1] = pass_seconds(c, n);
}

/* Drafts (into rows 1..) and chooses how many to verify (<= limit - 1); returns K. */
static int draft_block(gen *g, int32_t anchor, int limit, em_err *err) {
    em_decode *s = g->s;
    em_drafter *d = s->drafter;
    double t0 = em_time_now();
    int rc = sync_drafter(g, err);
    int want = (s->fixed_width ? s->fixed_width : s->max_width) - 1;
    if (want > limit - 1) want = limit - 1;
    pass_cost cost = { s->target, d->info.block_seconds, d->info.slot_seconds };
    em_draft_sched_params sp;
    em_draft_out o = { .tokens = s->rows + 1, .conf_logits = d->info.has_confidence ? s->conf : NULL };
    em_draft_chain chain = { .sampler = g->greedy ? NULL : g->sampler, .dists = g->greedy ? NULL : s->dists };
    if (!s->fixed_width && o.conf_logits) {
        sched_params(&cost, want, &sp);
        chain.sched = &sp;
    }
    if (!rc && (rc = em_draft_propose(d, anchor, want, &chain, &o, err)) == EM_EUNSUPPORTED && !g->greedy) {
        static atomic_bool warned; /* once a process: a server would repeat it every request */
        em_log(atomic_exchange(&warned, true) ? EM_LOG_DEBUG : EM_LOG_WARN, "%s: decoding sampled requests plainly",
               err ? err->msg : "the drafter refused the chain");
        if (err) *err = (em_err){ 0 };
        g->no_draft = true;
        rc = EM_OK, o.n = 0;
    }
    g->res->draft_seconds += em_time_now() - t0;
    if (rc) return em_err_prefix(err, "drafter: block after token %d", anchor);
    if (o.n < 0 || o.n > want)
        return em_err_set(err, EM_EINVAL, "drafter: %d proposals where at most %d were asked", o.n, want);
    if (s->fixed_width) return o.n;
    /* a drafter that ran the keep test stopped where this walk stops (it returns o.n then) */
    return em_draft_schedule(chain.sched, o.conf_logits, o.n);
}

/* ---- the step ------------------------------------------------------------------------------ */

/* How many drafts stand and the token after them (*next), from the verified rows. */
static int accept_rows(gen *g, int K, int32_t *next, em_err *err) {
    em_decode *s = g->s;
    if (!g->greedy) {
        if (K == 0) {
            int rc = em_sampler_sample(g->sampler, s->logits, next, err);
            return rc ? rc : 0;
        }
        return em_decode_accept_sample(s->accept, g->sampler, s->logits, s->rows + 1, s->dists, K, next, err);
    }
    int acc = em_decode_accept_greedy(s->argmax, s->rows + 1, K, next);
    if (*next < 0)
        return em_err_set(err, EM_EINVAL, "decode: verified row %d has no usable logit (all NaN or -inf)", acc);
    return acc;
}

/* Hands one token to the caller; ends the call on end of generation, n_max or a stop. */
static int emit(gen *g, int32_t id, em_err *err) {
    em_decode *s = g->s;
    if (s->tok && !g->p->ignore_eog && em_tok_is_eog(s->tok, id)) {
        g->res->finish = EM_DECODE_EOG;
        g->done = true;
        return EM_OK;
    }
    const char *bytes = NULL;
    size_t n = 0;
    if (s->stream) {
        int rc = em_tok_stream_push(s->stream, id, &bytes, &n, err);
        if (rc) return em_err_prefix(err, "generate: token %d", id);
    }
    g->res->n_gen++;
    if (g->on_token && g->on_token(g->ud, id, bytes, n)) {
        g->res->finish = EM_DECODE_STOPPED;
        g->done = true;
    } else if (g->res->n_gen >= g->p->n_max) {
        g->res->finish = EM_DECODE_LENGTH;
        g->done = true;
    }
    return EM_OK;
}

/* The drafter's context += the first n rows the target's last call kept on the device. */
static int add_device_features(gen *g, int n, em_err *err) {
    double t0 = em_time_now();
    int rc = em_draft_add_context_target(g->s->drafter, 0, n, g->s->feature_type, err);
    g->res->draft_seconds += em_time_now() - t0;
    return rc ? em_err_prefix(err, "drafter context at position %lld", (long long)g->s->drafter->info.n_ctx) : EM_OK;
}

/* A plain pass with a drafter: the drafter's context catches up before the ring (which holds
 * feat_rows rows) would drop rows it has not read, in one batch of context. */
static int keep_drafter_near(gen *g, em_err *err) {
    em_decode *s = g->s;
    if (em_target_position(s->target) - s->drafter->info.n_ctx <= s->feat_rows - s->max_width) return EM_OK;
    double t0 = em_time_now();
    int rc = sync_drafter(g, err);
    g->res->draft_seconds += em_time_now() - t0;
    return rc;
}

/* What a pass of K drafts cost, for the governor: the clock's seconds since t0, or the
 * nominal cost of the drafter's block and the target's verify (a plain pass: the verify). */
static double pass_cost_seconds(const gen *g, bool drafted, int K, double t0) {
    const em_decode *s = g->s;
    if (s->spec_policy == EM_DECODE_SPEC_TIMED) return em_time_now() - t0;
    if (!drafted) return em_target_cost(s->target, 1).nominal_seconds;
    const pass_cost c = { s->target, s->drafter->info.block_seconds, s->drafter->info.slot_seconds };
    return pass_seconds(&c, K + 1);
}

/* One pass of the target: anchor (+ drafts) in, the accepted tokens and the next anchor out. */
static int step(gen *g, int32_t *anchor, em_err *err) {
    em_decode *s = g->s;
    int64_t pos = em_target_position(s->target);
    int64_t limit = (int64_t)em_target_get_info(s->target)->n_ctx - pos; /* rows that fit */
    if (limit < 1) { /* the context is full: nothing more can be verified */
        g->res->finish = EM_DECODE_LENGTH;
        g->done = true;
        return EM_OK;
    }
    int64_t wanted = (int64_t)g->p->n_max - g->res->n_gen; /* a pass emits at most its width */
    if (limit > wanted) limit = wanted;
    if (limit > s->max_width) limit = s->max_width;
    drafter_parks(g, wanted);
    const bool can_draft = s->drafter && limit > 1 && !g->no_draft;
    const bool drafts = can_draft && !g->parked && em_decode_govern_draft(&g->gov);
    const bool feeds = s->drafter && !g->parked; /* the drafter reads this pass's features */
    const double t0 = em_time_now();
    /* the verify's first row is known: its reads go on while the drafter works */
    int rc = drafts ? em_target_prefetch(s->target, anchor, 1, err) : EM_OK;
    if (rc) return rc;
    int K = drafts ? draft_block(g, *anchor, (int)limit, err) : 0;
    if (K < 0) return K;

    s->rows[0] = *anchor;
    em_rows rows = { .logits = g->greedy ? NULL : s->logits, .argmax = g->greedy ? s->argmax : NULL,
                     .features = feeds && !s->device_feats ? s->feats : NULL,
                     .device_features = feeds && s->device_feats };
    double tt = em_time_now();
    rc = em_target_verify(s->target, s->rows, K + 1, &rows, err);
    g->res->target_seconds += em_time_now() - tt;
    if (rc) return rc;
    int32_t next;
    int n_acc = accept_rows(g, K, &next, err);
    if (n_acc < 0) return n_acc;
    tt = em_time_now();
    rc = em_target_commit(s->target, 1 + n_acc, err);
    g->res->target_seconds += em_time_now() - tt;
    if (!rc && feeds && s->device_feats) rc = add_device_features(g, 1 + n_acc, err);
    else if (!rc && feeds) rc = em_decode_ring_push(s->ring, pos, s->feats, 1 + n_acc, err);
    if (!rc && feeds && !drafts) rc = keep_drafter_near(g, err);
    if (rc) return rc;
    if (can_draft) {
        em_decode_govern_report(&g->gov, drafts, 1 + n_acc, pass_cost_seconds(g, drafts, K, t0));
        g->res->plain_passes += !drafts;
    }

    g->rows_verified += (uint64_t)(K + 1);
    g->res->drafted += (uint64_t)K;
    g->res->accepted += (uint64_t)n_acc;
    g->res->accept_hist[n_acc]++;
    memcpy(s->out, s->rows + 1, (size_t)n_acc * sizeof *s->out);
    s->out[n_acc] = next;
    for (int i = 0; i <= n_acc && !g->done; i++) {
        rc = emit(g, s->out[i], err);
        if (rc) return rc;
    }
    *anchor = next;
    return EM_OK;
}

/* The prompt, in chunks of PREFILL_CHUNK rows while a drafter takes their features (else in
 * one call: a target runs it in passes of its own, and a GPU target's wide passes read each
 * routed expert once per up to 256 rows): the last row's argmax when greedy, else its logits. */
static int prefill(gen *g, const int32_t *prompt, int n_prompt, em_err *err) {
    em_decode *s = g->s;
    drafter_parks(g, (int64_t)g->p->n_max - 1); /* the first token comes from the prompt */
    const bool feeds = s->drafter && !g->parked;
    const int chunk = feeds ? PREFILL_CHUNK : n_prompt;
    for (int r0 = 0; r0 < n_prompt; r0 += chunk) {
        int m = n_prompt - r0 < chunk ? n_prompt - r0 : chunk;
        const bool last = r0 + m == n_prompt;
        em_rows rows = { .logits = last && !g->greedy ? s->logits : NULL, .argmax = last && g->greedy ? s->argmax : NULL,
                         .last_only = true, .features = feeds && !s->device_feats ? s->feats : NULL,
                         .device_features = feeds && s->device_feats };
        int rc = em_target_prefill(s->target, prompt + r0, m, &rows, err);
        if (!rc && feeds && s->device_feats) rc = add_device_features(g, m, err);
        else if (!rc && feeds) rc = em_decode_ring_push(s->ring, r0, s->feats, m, err);
        if (!rc && feeds && !s->device_feats) {
            double t0 = em_time_now();
            rc = sync_drafter(g, err);
            g->res->draft_seconds += em_time_now() - t0;
        }
        if (rc) return rc;
    }
    return EM_OK;
}

/* Routed-expert bytes the target has read from storage so far (0 when it cannot say). */
static uint64_t expert_bytes(const em_target *t) {
    em_target_expert_counts c;
    return em_target_expert_stats(t, -1, &c, NULL) ? 0 : c.bytes_read;
}

static int run(gen *g, const int32_t *prompt, int n_prompt, em_err *err) {
    em_decode *s = g->s;
    double t0 = em_time_now();
    int rc = prefill(g, prompt, n_prompt, err);
    double t1 = em_time_now();
    g->res->prompt_seconds = t1 - t0;
    if (rc) return rc;
    const uint64_t bytes0 = expert_bytes(s->target);
    int32_t anchor = s->argmax[0];
    if (!g->greedy) rc = em_sampler_sample(g->sampler, s->logits, &anchor, err);
    else if (anchor < 0) /* as the sampler says it */
        rc = em_err_set(err, EM_EINVAL, "sampler: no usable logit (all NaN or -inf) in a row of %d", s->n_vocab);
    if (!rc) rc = emit(g, anchor, err);
    while (!rc && !g->done) rc = step(g, &anchor, err);
    g->res->gen_seconds = em_time_now() - t1;
    const uint64_t bytes1 = expert_bytes(s->target);
    g->res->gen_bytes_read = bytes1 > bytes0 ? bytes1 - bytes0 : 0;
    return rc;
}

int em_decode_generate(em_decode *s, const int32_t *prompt, int n_prompt, const em_decode_params *p,
                     em_decode_on_token on_token, void *ud, em_decode_result *res, em_err *err) {
    em_decode_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    int rc = check_call(s, prompt, n_prompt, p, err);
    if (rc) return rc;
    gen g = { .s = s, .p = p, .on_token = on_token, .ud = ud, .res = res, .greedy = p->sampling.temperature <= 0 };
    const int kind = g.greedy ? 0 : 1;
    if (s->spec_policy == EM_DECODE_SPEC_TIMED && s->have_learnt[kind]) g.gov = s->learnt[kind];
    else em_decode_govern_reset(&g.gov, s->spec_policy, &s->govern);
    rc = em_sampler_create(&g.sampler, &p->sampling, s->n_vocab, err);
    if (rc) return em_err_prefix(err, "generate");

    const char *bytes;
    size_t n;
    if (s->stream) em_tok_stream_flush(s->stream, &bytes, &n); /* drop what an aborted call left */
    em_target_reset(s->target);
    if (s->drafter) {
        em_draft_reset(s->drafter);
        em_decode_ring_reset(s->ring);
    }
    em_target_stats before = s->target->stats;

    rc = run(&g, prompt, n_prompt, err);
    if (!rc && s->spec_policy == EM_DECODE_SPEC_TIMED) {
        s->learnt[kind] = g.gov;
        s->have_learnt[kind] = true;
    }

    const em_target_stats *after = &s->target->stats;
    res->passes = after->verifies - before.verifies;
    res->fast_commits = after->fast_commits - before.fast_commits;
    res->full_replays = after->full_replays - before.full_replays;
    res->failed_fallbacks = after->failed_fallbacks - before.failed_fallbacks;
    res->mean_verify_width = res->passes ? (double)g.rows_verified / (double)res->passes : 0.0;
    if (!rc && s->stream) {
        em_tok_stream_flush(s->stream, &bytes, &n);
        if (n && on_token) on_token(ud, -1, bytes, n);
    }
    em_sampler_free(g.sampler);
    return rc;
}
