/* decode/: the ONE decode loop (draft -> schedule -> verify -> accept -> commit) over any target
 * behind model/model.h and any drafter behind draft/draft.h. Plain decoding is the same loop
 * with no drafter (verify width 1). The feature ring (the target's captured features for the
 * drafter's context), confidence/cost scheduling, greedy acceptance and lossless speculative
 * rejection sampling live in decode/ (decode_impl.h); callers (ember run, ember serve) see only
 * this header.
 *
 * A session owns one target's sequence (and borrows the drafter's context): each
 * em_decode_generate call starts from an empty sequence (target, drafter and ring reset), feeds
 * the prompt (prefill), then generates until an end-of-generation token, n_max tokens, a stop
 * request from the callback, a full context, or an error. A pass may commit several tokens;
 * the callback still sees them one by one and nothing past the token that ends the call.
 * Greedy speculative output is token-identical to plain greedy output; sampled output has
 * exactly the target's (filtered) distribution, reproducible per seed (with a timed spec
 * policy: per seed and per the passes' timings, see em_decode_spec_policy). */
#ifndef EM_DECODE_H
#define EM_DECODE_H

#include "base/base.h"
#include "draft/draft.h"
#include "model/model.h"
#include "sample/sample.h"
#include "text/text.h"

typedef struct em_decode em_decode;

/* When a pass drafts (decode/govern.c): speculation is used only while it pays. */
enum em_decode_spec_policy {
    EM_DECODE_SPEC_ALWAYS = 0, /* every pass drafts (the default of a zeroed em_decode_opts) */
    EM_DECODE_SPEC_TIMED,      /* passes are timed; while speculative passes commit fewer tokens a
                                  second than plain ones, decode plainly and probe again later.
                                  What it learnt carries over to the session's next call of the
                                  same kind (greedy or sampled). Greedy output is unchanged and
                                  sampling stays exact, but a seeded sampled run depends on the
                                  timings (which passes drafted) */
    EM_DECODE_SPEC_NOMINAL,    /* the same decision from the nominal costs of the target and
                                  drafter: a seeded run is reproducible */
};

typedef struct em_decode_opts {
    const em_tok *tok;    /* for end-of-generation ids and streamed text; may be NULL */
    em_drafter *drafter;  /* borrowed; NULL: plain decoding (verify width 1). Its vocabulary
                             and n_feat must equal the target's (the target opened with the
                             drafter's taps as feature layers) */
    int feature_type;     /* storage of the feature ring: EM_TYPE_F32 (0, the default),
                             EM_TYPE_F16, EM_TYPE_BF16 or EM_TYPE_Q8_0 (quant/quant.h) */
    int verify_width;     /* rows per target pass, the anchor plus width-1 drafts: 0 chooses
                             per pass (confidence scheduling with the target's cost; the whole
                             block without a confidence head); 1..n_drafts+1 (and at most the
                             target's max_verify) fixes it; > 1 needs a drafter */
    int spec_policy;      /* enum em_decode_spec_policy (with a drafter) */
} em_decode_opts;

/* The policy for a --spec-policy name (always, auto = timed, nominal); -1 when unknown. */
int em_decode_spec_policy(const char *name);

/* The feature type for a --feature-dtype name (f32, f16, bf16, q8_0); -1 when unknown. */
int em_decode_feature_type(const char *name);

typedef struct em_decode_params {
    em_sampler_params sampling;
    int n_max;            /* tokens to generate at most (>= 1) */
    bool ignore_eog;      /* keep going past end-of-generation tokens */
} em_decode_params;

/* Called for every committed token, in order. bytes/len: the text it completes (UTF-8, held
 * back across incomplete sequences; may be empty). Return nonzero to stop generating (a client
 * that went away): generation then ends within this step with finish EM_DECODE_STOPPED.
 * The end-of-generation token that ends a call (EM_DECODE_EOG) is not passed (nor counted in
 * n_gen). Bytes still held back at the end (a UTF-8 sequence the tokens left unfinished) come
 * in one last call with token -1 (its return value is ignored). Text skips control tokens. */
typedef int (*em_decode_on_token)(void *ud, int32_t token, const char *bytes, size_t len);

enum em_decode_finish { EM_DECODE_EOG = 0, EM_DECODE_LENGTH, EM_DECODE_STOPPED };

#define EM_DECODE_MAX_WIDTH (EM_DRAFT_MAX_BLOCK + 1) /* rows one verify may take */

typedef struct em_decode_result {
    int n_prompt, n_gen;
    enum em_decode_finish finish;
    double prompt_seconds, gen_seconds;
    /* speculation counters (zero drafted while plain) */
    uint64_t passes, drafted, accepted;  /* target verifies; drafts verified; drafts accepted */
    uint64_t plain_passes;               /* passes that did not draft though a drafter was there */
    uint64_t fast_commits, full_replays, failed_fallbacks;
    uint64_t accept_hist[EM_DECODE_MAX_WIDTH]; /* [i]: passes that accepted i drafts */
    double mean_verify_width;  /* rows per verify (1 while plain; 0 without a pass) */
    double draft_seconds;      /* in the drafter (context extension + proposals), part of the
                                  prompt and generation times */
    double target_seconds;     /* in the target's verify and commit calls after the prompt, part
                                  of the generation time (the rest of it: the loop's own work) */
    uint64_t gen_bytes_read;   /* routed-expert bytes the target read from storage after the
                                  prompt (em_target_expert_stats; 0 with resident experts): over
                                  passes + accepted, the bytes a committed token cost */
} em_decode_result;

int em_decode_create(em_decode **out, em_target *target, const em_decode_opts *opts, em_err *err);
void em_decode_free(em_decode *s);
int em_decode_generate(em_decode *s, const int32_t *prompt, int n_prompt, const em_decode_params *p,
                     em_decode_on_token on_token, void *ud, em_decode_result *res, em_err *err);

/* What the timed policy's governors learnt (whether speculation pays on this machine: averaged
 * pass costs and tokens, where the pacing stands), as numbers a caller may keep between
 * processes (ember run --spec-memory): EM_DECODE_LEARNT_VALUES / 2 for greedy calls, then as
 * many for sampled ones. get fills out and returns which are known (bit 0 greedy, bit 1
 * sampled). set takes them back for the kinds in known and forgets the others; a value out of
 * its range (a damaged file) is EM_EINVAL naming it, and s is left as it was. Only the timed
 * policy reads them: the nominal one starts over every call. */
#define EM_DECODE_LEARNT_VALUES 20
unsigned em_decode_learnt_get(const em_decode *s, double out[EM_DECODE_LEARNT_VALUES]);
int em_decode_learnt_set(em_decode *s, unsigned known, const double in[EM_DECODE_LEARNT_VALUES], em_err *err);

#endif
