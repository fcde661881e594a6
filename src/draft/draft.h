/* draft/: block drafters behind one small interface, the proposer side of speculation
 * (decode/ drives it; model/ never sees it). The DSpark/DFlash drafter (dspark.md) loads a
 * `dflash` GGUF written by `ember convert`; tests plug in their own proposers (an oracle that
 * replays a known continuation) through the same ops table.
 *
 * A drafter owns a context cache: one row per committed target position 0 .. n_ctx-1, built
 * from the target's captured features (the taps, concatenated, [n_feat] floats per row).
 * Context rows only ever come from committed positions, so the cache never rolls back except
 * by reset. A block is proposed for the anchor, the last committed token, at position n_ctx
 * (its own features are not known yet: the target has not run it).
 *
 *   add_context(feats, n)  append rows for positions n_ctx .. n_ctx+n-1
 *   propose(anchor, chain) fill up to info.n_drafts proposals for positions n_ctx+1 ..,
 *                          left to right, the whole Markov chain inside the drafter: slot k's
 *                          token is picked from the slot's corrected logits (Markov bias of
 *                          the token picked at k-1) as the chain says (greedy, or a draw from
 *                          the caller's seeded sampler) before slot k+1 is computed, and a
 *                          drafter with a confidence head first runs the schedule's keep test
 *                          on the slot (plain data, schedule.c), ending the block at the first
 *                          slot it would not verify. The block never enters the cache.
 *
 * The chain (em_draft_chain) is a description, not a conversation: nothing calls back into
 * the caller per slot, so a drafter on a device runs the chain there and returns only tokens
 * (and, for rejection sampling, the distributions the drafts were drawn from). Test oracles
 * may still steer each slot through host callbacks (choose / keep), which cost nothing on the
 * CPU; a device drafter may refuse them.
 *
 * Token ids are always the target's (a reduced draft vocabulary is mapped through d2t;
 * ids it cannot produce get -INFINITY logits). Not thread-safe: one call at a time. */
#ifndef EM_DRAFT_H
#define EM_DRAFT_H

#include "base/base.h"
#include "sample/sample.h"

typedef struct em_drafter em_drafter;
/* What a target lends its drafter (model/model.h, em_target_shared_weights). */
typedef struct em_target_shared em_target_shared;

#define EM_DRAFT_MAX_TAPS 16
#define EM_DRAFT_MAX_BLOCK 32

typedef struct em_draft_info {
    int n_drafts;        /* proposals per block: B (DSpark, anchor-as-first) or B-1 (DFlash) */
    int block_size;      /* B: query slots of one block pass */
    int n_vocab;         /* the target vocabulary the proposals and logits index */
    int n_feat;          /* floats per context row: n_taps * target n_embd */
    int n_taps;
    int taps[EM_DRAFT_MAX_TAPS]; /* target layers (0-based) whose outputs are the features */
    bool has_confidence; /* propose fills conf_logits */
    double block_seconds; /* one propose at the nominal rates of compute.h (0: negligible), to
                             weigh against a target's em_cost.nominal_seconds: the part every
                             block pays (context rows, the backbone over all B slots) */
    double slot_seconds;  /* what each draft slot made adds to it (its LM head row and Markov
                             bias), at the same rates: a block stopped after k slots costs
                             block_seconds + k * slot_seconds */
    int64_t n_ctx;       /* context rows held (read-only for callers) */
    const char *device;  /* where it runs: "cpu", or "cuda:N (device name)"; owned by the drafter */
    bool target_features; /* it runs on its target's device and reads the features the target
                             keeps there (em_draft_add_context_target) */
} em_draft_info;

/* ---- the schedule's keep test (schedule.c), as plain data ------------------------------------
 * How many drafts one target pass verifies (DSpark's confidence scheduling, dspark.md §2.6). A
 * slot's confidence logit z gives sigma(z), the chance that its draft stands given that the
 * drafts before it did; the running product is the survival a_j of draft j. Verifying j drafts
 * commits E(j) = 1 + a_1 + .. + a_j tokens on average for cost[j] (a pass of j + 1 rows). The
 * walk keeps draft j only while E(j)/cost[j] beats the best so far and stops at the first that
 * does not: whether draft j is verified depends only on the drafts before it (non-anticipating,
 * so rejection sampling stays lossless). No usable cost[0] (<= 0, non-finite, or n_cost 0):
 * every draft; a cost that turns unusable later: every draft from there on. NaN z counts as 0. */
typedef struct em_draft_sched_params {
    int n_cost;                          /* entries of cost used (0 .. EM_DRAFT_MAX_BLOCK + 1) */
    double cost[EM_DRAFT_MAX_BLOCK + 1]; /* cost[n - 1]: seconds of a pass of n rows (the anchor
                                            and n - 1 drafts); a walk over m drafts reads cost[0
                                            .. m] at most, entries past n_cost count as unknown */
} em_draft_sched_params;

/* One walk's state: start, then keep(z) for slots 0, 1, .. in order; true while draft k is
 * verified, false from the first that is not (and every call after). After keep returned true
 * for k drafts and false for the next, em_draft_schedule over those k logits returns k. */
typedef struct em_draft_sched {
    const em_draft_sched_params *p;
    double expected, survival, best;
    int width;    /* drafts kept so far */
    bool all;     /* no usable cost: keep every draft */
    bool stopped;
} em_draft_sched;

void em_draft_sched_start(em_draft_sched *st, const em_draft_sched_params *p);
bool em_draft_sched_keep(em_draft_sched *st, float z);
/* The whole walk over n drafts' logits z; z NULL (no confidence head) or p NULL: all n. */
int em_draft_schedule(const em_draft_sched_params *p, const float *z, int n);

/* ---- the chain: how a propose picks tokens and where it stops ------------------------------- */

/* Test oracles only (see the top): picks slot k's token from its corrected logits [n_vocab], or
 * -1 to stop the block early (propose then reports k proposals). */
typedef int32_t (*em_draft_choose)(void *ud, int k, const float *logits);
/* Test oracles only: whether slot k is wanted, from its confidence logit (as conf_logits[k]),
 * asked before the slot's logits are made; false ends the block with k proposals. */
typedef bool (*em_draft_keep)(void *ud, int k, float conf_logit);

/* What a propose does per slot k, in this order (the same on every drafter):
 *   keep:  a drafter with a confidence head computes z_k; with `sched` it runs the keep test
 *          (em_draft_sched_keep, one walk per propose) and ends the block at the first false,
 *          before the slot's LM head row, Markov bias or pick. Without sched (or a keep
 *          oracle) every slot up to n_max is made.
 *   pick:  greedy (sampler NULL or its temperature <= 0): the argmax of the slot's corrected
 *          logits, the lowest id on ties (em_argmax); a row of all NaN ends the block.
 *          Sampling: em_sampler_dist of the row with `sampler` into dists[k] (em_sampler_sample
 *          when dists is NULL), then one em_sampler_draw: one draw per made slot, in slot
 *          order, from the caller's stream (so a seeded run is reproducible and a loop that
 *          drew the same way gets the same tokens); a row with no usable logit ends the block.
 * A drafter on a device (dspark_cuda.c) draws differently, still from exactly the dists it
 * reports: one draw of the caller's stream keys a counter-based generator for the whole block,
 * and its distributions keep at most the 64 best ids (the sampler's own when top-k is 1..64).
 * Invariants: dists[k] is written only for made slots while sampling; the sampler's stream
 * advances only by those draws (a device drafter: by one per propose). Invalid (EM_EINVAL):
 * choose with a sampler, keep with sched, dists without a sampler or holding fewer than n_vocab
 * ids, n_cost out of range. */
typedef struct em_draft_chain {
    em_sampler *sampler;      /* NULL: greedy; else the caller's seeded sampler (its filters,
                                 temperature and random stream), borrowed for the call */
    em_sample_dist *dists;    /* [min(n_max, info.n_drafts)] sampling: the distribution each draft was drawn from (for
                                 rejection sampling); NULL: not kept */
    const em_draft_sched_params *sched; /* the keep test; NULL: every slot */
    em_draft_choose choose;   /* test oracle replacing the pick (NULL: as above) */
    void *choose_ud;
    em_draft_keep keep;       /* test oracle replacing the keep test (NULL: as above) */
    void *keep_ud;
} em_draft_chain;

/* The chain's per-slot rules above, for implementations on the CPU (and as the reference a
 * device implementation is tested against). begin starts one propose's walk. */
bool em_draft_chain_may_stop(const em_draft_chain *c); /* keep test or oracle present */
void em_draft_chain_begin(const em_draft_chain *c, em_draft_sched *st);
bool em_draft_chain_keep(const em_draft_chain *c, em_draft_sched *st, int k, float conf_logit);
/* Slot k's token from its corrected logits [n_vocab]; -1 ends the block. */
int32_t em_draft_chain_pick(const em_draft_chain *c, int k, const float *logits, int32_t n_vocab);

typedef struct em_draft_out {
    int n;              /* proposals made (<= info.n_drafts, <= n_max) */
    int32_t *tokens;    /* [n_max] caller memory */
    float *logits;      /* [n_max][n_vocab] corrected logits per slot (the draft distribution
                           before temperature); caller memory, may be NULL */
    float *conf_logits; /* [n_max] z_k, already divided by the per-position calibration
                           temperature when the file has one (sigma(z_k) = P(slot k accepted |
                           slots < k accepted)); caller memory, may be NULL */
} em_draft_out;

typedef struct em_drafter_ops {
    int (*add_context)(em_drafter *d, const float *feats, int n, em_err *err);
    /* NULL unless info.target_features */
    int (*add_context_target)(em_drafter *d, int row0, int n, int type, em_err *err);
    int (*propose)(em_drafter *d, int32_t anchor, int n_max, const em_draft_chain *chain,
                   em_draft_out *out, em_err *err);
    void (*reset)(em_drafter *d);
    void (*close)(em_drafter *d);
} em_drafter_ops;

/* The common part of every drafter; implementations embed it first. */
struct em_drafter {
    const em_drafter_ops *ops;
    em_draft_info info;
};

typedef struct em_draft_opts {
    int n_threads;        /* 0: em_cpu_count() */
    int n_ctx;            /* context rows the cache holds at most; 0: 4096 */
    const char *device;   /* where it runs: NULL or "cpu", or "cuda" / "cuda:N" (greedy drafting,
                             the vanilla Markov head: draft/dspark_cuda.c) */
} em_draft_opts;

/* The target layers (0-based) a drafter file taps, read from its keys alone: what the target
 * must capture (em_model_opts.feature_layers), so that the target can be opened first and its
 * weights lent to em_draft_open. taps holds EM_DRAFT_MAX_TAPS ints. Fails, naming the file,
 * when it is not a drafter or its taps are unusable. */
int em_draft_read_taps(const char *draft_path, int *taps, int *n_taps, em_err *err);

/* Opens a dflash-architecture GGUF at draft_path for an opened target, given by what it lends
 * (em_target_shared_weights of model/model.h): its shape, and its own token_embd / output
 * matrices, used in place when the drafter carries no embedding or LM head of its own, so
 * one copy of each exists (the target's file is not opened again). The drafter keeps
 * pointers into the target: close the drafter before the target. Fails, naming both files
 * and the mismatch, when the drafter's hidden size, vocabulary or target layers do not fit
 * the target. opts may be NULL. */
int em_draft_open(em_drafter **out, const char *draft_path, const em_target_shared *target,
                  const em_draft_opts *opts, em_err *err);

/* The operations, with their arguments checked. */
int em_draft_add_context(em_drafter *d, const float *feats, int n, em_err *err);
/* The same from the feature rows row0 .. row0 + n - 1 its target left on the device by its last
 * call (em_rows.device_features; em_target_shared.d_features), each first rounded through the
 * storage type a feature ring of that type would give (EM_TYPE_F32, F16, BF16 or Q8_0, as
 * quant/ does), so the drafter sees what em_draft_add_context of the ring's rows would give it.
 * Stream-ordered after the target's work: no host sync. EM_EUNSUPPORTED unless
 * info.target_features. */
int em_draft_add_context_target(em_drafter *d, int row0, int n, int type, em_err *err);
int em_draft_propose(em_drafter *d, int32_t anchor, int n_max, const em_draft_chain *chain,
                     em_draft_out *out, em_err *err);
void em_draft_reset(em_drafter *d);
void em_draft_close(em_drafter *d); /* NULL-safe */
const em_draft_info *em_draft_get_info(const em_drafter *d);

#endif
