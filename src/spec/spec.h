/* spec/: the ONE decode loop (draft -> schedule -> verify -> accept -> commit) over any target
 * behind model/model.h. Plain decoding is the same loop with no drafter (verify width 1).
 * The drafter, scheduler and rejection sampling of DSpark/DFlash plug in here (issue 6);
 * callers (ember run, ember serve) see only this header.
 *
 * A session owns one target's sequence: each em_spec_generate call starts from an empty
 * sequence (target reset), feeds the prompt (prefill), then generates until an
 * end-of-generation token, n_max tokens, a stop request from the callback, or an error. */
#ifndef EM_SPEC_H
#define EM_SPEC_H

#include "base/base.h"
#include "model/model.h"
#include "sample/sample.h"
#include "text/text.h"

typedef struct em_spec em_spec;

typedef struct em_spec_opts {
    const em_tok *tok;    /* for end-of-generation ids and streamed text; may be NULL */
    int verify_width;     /* 0: automatic (1 while there is no drafter) */
} em_spec_opts;

typedef struct em_spec_params {
    em_sampler_params sampling;
    int n_max;            /* tokens to generate at most (>= 1) */
    bool ignore_eog;      /* keep going past end-of-generation tokens */
} em_spec_params;

/* Called for every committed token, in order. bytes/len: the text it completes (UTF-8, held
 * back across incomplete sequences; may be empty). Return nonzero to stop generating (a client
 * that went away): generation then ends within this step with finish EM_SPEC_STOPPED.
 * The end-of-generation token that ends a call (EM_SPEC_EOG) is not passed (nor counted in
 * n_gen). Bytes still held back at the end (a UTF-8 sequence the tokens left unfinished) come
 * in one last call with token -1 (its return value is ignored). Text skips control tokens. */
typedef int (*em_spec_on_token)(void *ud, int32_t token, const char *bytes, size_t len);

enum em_spec_finish { EM_SPEC_EOG = 0, EM_SPEC_LENGTH, EM_SPEC_STOPPED };

typedef struct em_spec_result {
    int n_prompt, n_gen;
    enum em_spec_finish finish;
    double prompt_seconds, gen_seconds;
    /* speculation counters (zero drafted while plain) */
    uint64_t passes, drafted, accepted;
    uint64_t fast_commits, full_replays, failed_fallbacks;
} em_spec_result;

int em_spec_create(em_spec **out, em_target *target, const em_spec_opts *opts, em_err *err);
void em_spec_free(em_spec *s);
int em_spec_generate(em_spec *s, const int32_t *prompt, int n_prompt, const em_spec_params *p,
                     em_spec_on_token on_token, void *ud, em_spec_result *res, em_err *err);

#endif
