/* draft/: block drafters behind one small interface, the proposer side of speculation
 * (spec/ drives it; model/ never sees it). The DSpark/DFlash drafter (dspark.md) loads a
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
 *   propose(anchor, ...)   fill up to info.n_drafts proposals for positions n_ctx+1 ..,
 *                          left to right: the chooser picks the token of slot k from the
 *                          slot's corrected logits (Markov bias of the token chosen at k-1)
 *                          before slot k+1 is computed. The block never enters the cache.
 *
 * Token ids are always the target's (a reduced draft vocabulary is mapped through d2t;
 * ids it cannot produce get -INFINITY logits). Not thread-safe: one call at a time. */
#ifndef EM_DRAFT_H
#define EM_DRAFT_H

#include "base/base.h"

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
} em_draft_info;

/* Picks the token of slot k from its corrected logits [n_vocab] (greedy argmax or a sample).
 * Returns the token id, or -1 to stop the block early (propose then reports k proposals). */
typedef int32_t (*em_draft_choose)(void *ud, int k, const float *logits);

/* Whether slot k is wanted at all, from its confidence logit (as conf_logits[k]), asked
 * before the slot's logits are made: false ends the block with k proposals, so a scheduler
 * that would not verify slot k spares its LM head row, Markov bias and choice. */
typedef bool (*em_draft_keep)(void *ud, int k, float conf_logit);

typedef struct em_draft_out {
    int n;              /* proposals made (<= info.n_drafts, <= n_max) */
    int32_t *tokens;    /* [n_max] caller memory */
    float *logits;      /* [n_max][n_vocab] corrected logits per slot (the draft distribution
                           before temperature); caller memory, may be NULL */
    float *conf_logits; /* [n_max] z_k, already divided by the per-position calibration
                           temperature when the file has one (sigma(z_k) = P(slot k accepted |
                           slots < k accepted)); caller memory, may be NULL */
    em_draft_keep keep; /* may be NULL (every slot up to n_max); asked only by drafters with a
                           confidence head, slot by slot, before that slot's choice */
    void *keep_ud;
} em_draft_out;

typedef struct em_drafter_ops {
    int (*add_context)(em_drafter *d, const float *feats, int n, em_err *err);
    int (*propose)(em_drafter *d, int32_t anchor, int n_max, em_draft_choose choose, void *ud,
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
int em_draft_propose(em_drafter *d, int32_t anchor, int n_max, em_draft_choose choose, void *ud,
                     em_draft_out *out, em_err *err);
void em_draft_reset(em_drafter *d);
void em_draft_close(em_drafter *d); /* NULL-safe */
const em_draft_info *em_draft_get_info(const em_drafter *d);

#endif
