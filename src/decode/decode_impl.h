/* decode/ internals: the parts the decode loop (loop.c) is built from, each in its own file and
 * unit-tested on its own (tests/test_decode.c):
 *
 *   ring.c      the feature ring: captured target features of committed positions, stored as
 *               F32 / F16 / BF16 / Q8_0, read back as f32 for the drafter's context
 *   accept.c    greedy acceptance and lossless speculative rejection sampling
 *   govern.c    whether a pass drafts: speculation only while it pays (timed or nominal costs)
 *
 * How many drafts to verify (confidence survival against the pass's cost) is the walk of
 * draft/schedule.c (draft.h), which the drafter runs slot by slot from plain data and the
 * loop re-runs over a block's confidences: one implementation for both.
 *
 * Callers outside decode/ use decode.h only. */
#ifndef EM_DECODE_IMPL_H
#define EM_DECODE_IMPL_H

#include "base/base.h"
#include "sample/sample.h"

/* ---- feature ring (ring.c) --------------------------------------------------------------- */

/* Rows of n_feat floats for positions [end - held, end), held <= cap, in slot pos % cap.
 * Rows are appended in position order (push at end) and read back as f32; rows older than
 * cap positions are overwritten. Q8_0 rows are padded with zeros to whole 32-value blocks. */
typedef struct em_decode_ring em_decode_ring;

/* type: EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16 or EM_TYPE_Q8_0 (quant/quant.h). */
int em_decode_ring_create(em_decode_ring **out, int n_feat, int cap, int type, em_err *err);
void em_decode_ring_free(em_decode_ring *r); /* NULL-safe */
/* Empty again, next push at position 0. */
void em_decode_ring_reset(em_decode_ring *r);
/* Position after the last row pushed. */
int64_t em_decode_ring_end(const em_decode_ring *r);
/* Appends n rows (rows [n][n_feat]) for positions end .. end+n-1; pos must equal end.
 * n may exceed cap: only the last cap rows stay. */
int em_decode_ring_push(em_decode_ring *r, int64_t pos, const float *rows, int n, em_err *err);
/* Reads the rows of positions pos .. pos+n-1 (all still held) as f32 into out [n][n_feat]. */
int em_decode_ring_read(em_decode_ring *r, int64_t pos, int n, float *out, em_err *err);
/* Bytes one stored row takes. */
size_t em_decode_ring_row_bytes(const em_decode_ring *r);

/* ---- acceptance (accept.c) --------------------------------------------------------------- */

/* Greedy: argmax holds the K+1 verified rows' argmaxes ([K+1], row i after the i-th verified
 * token: em_rows.argmax of model.h), drafts the K drafts (draft k is checked against row k-1).
 * Returns how many drafts stand (the longest prefix with draft k == argmax[k-1]) and puts
 * argmax[acc] in *next (-1 when that row had no usable logit). */
int em_decode_accept_greedy(const int32_t *argmax, const int32_t *drafts, int K, int32_t *next);

/* Scratch of speculative rejection sampling (sized for a vocabulary at create). */
typedef struct em_decode_accept em_decode_accept;

int em_decode_accept_create(em_decode_accept **out, int32_t n_vocab, em_err *err);
void em_decode_accept_free(em_decode_accept *a); /* NULL-safe */

/* Sampling (temperature > 0): draft k was drawn from draft_dist[k-1], the filtered draft
 * distribution em_sampler_dist gave with the same sampler (so the same temperature and
 * filters as the target's rows). Draft k stands with probability min(1, p_t(d)/p_d(d)),
 * p_t = em_sampler_dist(row k-1); at the first rejection the replacement is drawn from
 * normalize(max(0, p_t - p_d)) (p_t itself if that is empty through rounding); when all K
 * stand the bonus token is drawn from row K. Randomness: the sampler's stream. Returns the
 * drafts accepted (>= 0) with the token after them in *next, or a negative EM_E*. */
int em_decode_accept_sample(em_decode_accept *a, em_sampler *s, const float *logits, const int32_t *drafts,
                          const em_sample_dist *draft_dist, int K, int32_t *next, em_err *err);

/* ---- whether to draft (govern.c) ---------------------------------------------------------- */

/* The governor's pacing, in passes (em_decode_govern_defaults; tests set their own). */
typedef struct em_decode_govern_params {
    int probe;        /* speculative passes that make a probe (>= 1) */
    int plain_first;  /* plain passes timed before the first decision (>= 1) */
    int backoff_min;  /* plain passes after the first probe that does not pay (>= 1) */
    int backoff_max;  /* at most this many in one stretch (the stretch doubles up to it) */
    int refresh;      /* speculative passes between two plain ones that keep the plain figure current */
} em_decode_govern_params;

extern const em_decode_govern_params em_decode_govern_defaults;

typedef struct em_decode_govern {
    int policy;                  /* enum em_decode_spec_policy */
    em_decode_govern_params p;
    double spec_tokens, spec_seconds, plain_seconds; /* averages per pass (govern.c) */
    int n_spec, n_plain;         /* passes in them since a (re)start, up to GOV_SETTLED */
    int probe_left;              /* speculative passes left in the probe */
    int plain_left;              /* plain passes to make before drafting again */
    bool stretch;                /* plain_left is a stretch after a probe that did not pay */
    int backoff;                 /* the next stretch's length */
    int since_refresh;           /* speculative passes since the last plain one */
} em_decode_govern;

/* A governor's state as EM_DECODE_GOVERN_VALUES numbers (em_decode_learnt_get), and back
 * (EM_EINVAL naming a value outside what policy p's pacing can reach; g untouched then). */
#define EM_DECODE_GOVERN_VALUES 10
void em_decode_govern_pack(const em_decode_govern *g, double v[EM_DECODE_GOVERN_VALUES]);
int em_decode_govern_unpack(em_decode_govern *g, int policy, const em_decode_govern_params *p,
                            const double v[EM_DECODE_GOVERN_VALUES], em_err *err);

/* A session's pacing from now on, forgetting what its governors learnt (tests: short probes
 * and stretches). */
typedef struct em_decode em_decode;
void em_decode_set_govern(em_decode *s, const em_decode_govern_params *p);
/* Starts over: a probe first. p NULL: the defaults. */
void em_decode_govern_reset(em_decode_govern *g, int policy, const em_decode_govern_params *p);
/* Whether the next pass drafts. */
bool em_decode_govern_draft(em_decode_govern *g);
/* Passes from now on that will certainly be plain (the rest of a plain stretch). */
int em_decode_govern_plain_ahead(const em_decode_govern *g);
/* The pass just made: whether it drafted, the tokens it committed, what it cost (seconds,
 * timed or nominal as the policy says). */
void em_decode_govern_report(em_decode_govern *g, bool drafted, int committed, double seconds);

#endif
