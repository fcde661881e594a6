/* spec/loop.c: the ONE decode loop behind spec.h. A generate call resets the target, prefills
 * the prompt (last row's logits only), takes the first token from that row, then runs steps
 *
 *     draft -> choose width -> verify -> accept -> commit -> emit
 *
 * until end of generation, n_max tokens, a full context or a stop from the callback. Each
 * step verifies the root (the last emitted token, not yet in the target's state) followed by
 * the drafted tokens; accept decides how many drafts stand and samples the token after them
 * from the target's own row; commit folds root + accepted drafts into the state. There is no
 * drafter yet (issue 6 plugs DSpark in at draft_block/choose_width/accept_rows), so every step
 * drafts nothing, verifies one row and commits one: plain decoding is the width-1 case of
 * this loop, not a separate path.
 *
 * Invariants: every buffer is sized at create from the target's info (no allocation per
 * token; the sampler is made once per generate call because its parameters come with the
 * call). The target holds exactly the prompt and the emitted tokens before the root.
 * End-of-generation tokens (unless ignore_eog) end the call: they are not committed, not
 * passed to the callback and not counted in n_gen. Bytes the stream still holds back at the
 * end (a UTF-8 sequence the tokens left unfinished) come in one last callback with token -1.
 *
 * Timing: prompt_seconds is the prefill; gen_seconds runs from there to the end, so it covers
 * the n_gen - 1 tokens after the first (the first comes from the prefill's row).
 *
 * Must not: know any architecture (only model.h), or keep state between generate calls
 * beyond its buffers. */
#include "spec/spec.h"

#include <stdlib.h>
#include <string.h>

struct em_spec {
    em_target *target;
    const em_tok *tok;     /* NULL: no end-of-generation ids, no text */
    em_tok_stream *stream; /* NULL without tok */
    int max_width;         /* rows a verify may take (1 while there is no drafter) */
    int32_t n_vocab;
    float *logits;         /* [max_width][n_vocab]: rows of the last prefill/verify */
    int32_t *rows;         /* [max_width]: the verified tokens, root first */
    int32_t *out;          /* [max_width]: the tokens a step emits (accepted drafts, then next) */
};

/* One generate call's state. */
typedef struct gen {
    em_spec *s;
    em_sampler *sampler;
    const em_spec_params *p;
    em_spec_on_token on_token;
    void *ud;
    em_spec_result *res;
    bool done;
} gen;

int em_spec_create(em_spec **out, em_target *target, const em_spec_opts *opts, em_err *err) {
    *out = NULL;
    if (!target) return em_err_set(err, EM_EINVAL, "spec: no target");
    em_spec_opts o = opts ? *opts : (em_spec_opts){ 0 };
    if (o.verify_width < 0) return em_err_set(err, EM_EINVAL, "spec: verify width %d is negative", o.verify_width);
    if (o.verify_width > 1)
        return em_err_set(err, EM_EUNSUPPORTED,
                          "spec: a verify width of %d needs a drafter, and there is none yet "
                          "(plain decoding verifies 1 row)", o.verify_width);
    const em_target_info *info = em_target_get_info(target);
    if (info->n_vocab < 1) return em_err_set(err, EM_EINVAL, "spec: the target has no vocabulary");

    em_spec *s = em_calloc(1, sizeof *s, "decode loop", err);
    if (!s) return EM_ENOMEM;
    s->target = target;
    s->tok = o.tok;
    s->max_width = 1;
    s->n_vocab = info->n_vocab;
    uint64_t n_logits;
    int rc = EM_OK;
    if (em_mul_overflow((uint64_t)s->max_width, (uint64_t)s->n_vocab, &n_logits) ||
        n_logits > SIZE_MAX / sizeof(float))
        rc = em_err_set(err, EM_EOVERFLOW, "spec: %d rows of %d logits do not fit in memory", s->max_width,
                        s->n_vocab);
    if (!rc && !(s->logits = em_malloc((size_t)n_logits * sizeof *s->logits, "decode loop logits", err)))
        rc = EM_ENOMEM;
    if (!rc && !(s->rows = em_malloc((size_t)s->max_width * sizeof *s->rows, "decode loop rows", err)))
        rc = EM_ENOMEM;
    if (!rc && !(s->out = em_malloc((size_t)s->max_width * sizeof *s->out, "decode loop tokens", err)))
        rc = EM_ENOMEM;
    if (!rc && s->tok) rc = em_tok_stream_create(&s->stream, s->tok, EM_TOK_STREAM_SKIP_SPECIAL, err);
    if (rc) {
        em_spec_free(s);
        return rc;
    }
    *out = s;
    return EM_OK;
}

void em_spec_free(em_spec *s) {
    if (!s) return;
    em_tok_stream_free(s->stream);
    free(s->logits);
    free(s->rows);
    free(s->out);
    free(s);
}

static int check_call(const em_spec *s, const int32_t *prompt, int n_prompt, const em_spec_params *p,
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

/* ---- the step's parts (issue 6 fills in the drafter) ----------------------------------- */

/* Proposes up to max tokens to follow root into drafts; returns how many. No drafter: none. */
static int draft_block(gen *g, int32_t root, int32_t *drafts, int max) {
    (void)g, (void)root, (void)drafts, (void)max;
    return 0;
}

/* Rows to verify: the root and as many drafts as are worth their cost and fit the context. */
static int choose_width(const gen *g, int n_draft) {
    const em_target *t = g->s->target;
    int64_t room = (int64_t)em_target_get_info(t)->n_ctx - em_target_position(t);
    int64_t width = 1 + (int64_t)n_draft;
    if (width > g->s->max_width) width = g->s->max_width;
    return (int)(width < room ? width : room);
}

/* Given the verified rows (root + width-1 drafts) and their logits, decides how many drafts
 * stand and samples the target's token after them into *next; returns the drafts accepted.
 * Width 1: nothing to accept, the next token is sampled from the root's row. */
static int accept_rows(gen *g, int width, int32_t *next, em_err *err) {
    int n_acc = 0; /* greedy/rejection-sampling acceptance of rows 1..width-1 goes here */
    (void)width;
    int rc = em_sampler_sample(g->sampler, g->s->logits + (size_t)n_acc * (size_t)g->s->n_vocab, next, err);
    return rc ? rc : n_acc;
}

/* Hands one token to the caller; ends the call on end of generation, n_max or a stop. */
static int emit(gen *g, int32_t id, em_err *err) {
    em_spec *s = g->s;
    if (s->tok && !g->p->ignore_eog && em_tok_is_eog(s->tok, id)) {
        g->res->finish = EM_SPEC_EOG;
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
        g->res->finish = EM_SPEC_STOPPED;
        g->done = true;
    } else if (g->res->n_gen >= g->p->n_max) {
        g->res->finish = EM_SPEC_LENGTH;
        g->done = true;
    }
    return EM_OK;
}

/* One pass of the target: root (+ drafts) in, the accepted tokens and the next root out. */
static int step(gen *g, int32_t *root, em_err *err) {
    em_spec *s = g->s;
    int n_draft = draft_block(g, *root, s->rows + 1, s->max_width - 1);
    int width = choose_width(g, n_draft);
    if (width < 1) { /* the context is full: nothing more can be verified */
        g->res->finish = EM_SPEC_LENGTH;
        g->done = true;
        return EM_OK;
    }
    s->rows[0] = *root;
    em_rows rows = { .logits = s->logits };
    int rc = em_target_verify(s->target, s->rows, width, &rows, err);
    if (rc) return rc;
    int32_t next;
    int n_acc = accept_rows(g, width, &next, err);
    if (n_acc < 0) return n_acc;
    rc = em_target_commit(s->target, 1 + n_acc, err);
    if (rc) return rc;
    g->res->drafted += (uint64_t)(width - 1);
    g->res->accepted += (uint64_t)n_acc;
    memcpy(s->out, s->rows + 1, (size_t)n_acc * sizeof *s->out);
    s->out[n_acc] = next;
    for (int i = 0; i <= n_acc && !g->done; i++) {
        rc = emit(g, s->out[i], err);
        if (rc) return rc;
    }
    *root = next;
    return EM_OK;
}

static int run(gen *g, const int32_t *prompt, int n_prompt, em_err *err) {
    em_spec *s = g->s;
    double t0 = em_time_now();
    em_rows last = { .logits = s->logits, .last_only = true };
    int rc = em_target_prefill(s->target, prompt, n_prompt, &last, err);
    double t1 = em_time_now();
    g->res->prompt_seconds = t1 - t0;
    if (rc) return rc;
    int32_t root;
    rc = em_sampler_sample(g->sampler, s->logits, &root, err);
    if (!rc) rc = emit(g, root, err);
    while (!rc && !g->done) rc = step(g, &root, err);
    g->res->gen_seconds = em_time_now() - t1;
    return rc;
}

int em_spec_generate(em_spec *s, const int32_t *prompt, int n_prompt, const em_spec_params *p,
                     em_spec_on_token on_token, void *ud, em_spec_result *res, em_err *err) {
    em_spec_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    int rc = check_call(s, prompt, n_prompt, p, err);
    if (rc) return rc;
    gen g = { .s = s, .p = p, .on_token = on_token, .ud = ud, .res = res };
    rc = em_sampler_create(&g.sampler, &p->sampling, s->n_vocab, err);
    if (rc) return em_err_prefix(err, "generate");

    const char *bytes;
    size_t n;
    if (s->stream) em_tok_stream_flush(s->stream, &bytes, &n); /* drop what an aborted call left */
    em_target_reset(s->target);
    em_target_stats before = s->target->stats;

    rc = run(&g, prompt, n_prompt, err);

    const em_target_stats *after = &s->target->stats;
    res->passes = after->verifies - before.verifies;
    res->fast_commits = after->fast_commits - before.fast_commits;
    res->full_replays = after->full_replays - before.full_replays;
    res->failed_fallbacks = after->failed_fallbacks - before.failed_fallbacks;
    if (!rc && s->stream) {
        em_tok_stream_flush(s->stream, &bytes, &n);
        if (n && on_token) on_token(ud, -1, bytes, n);
    }
    em_sampler_free(g.sampler);
    return rc;
}
