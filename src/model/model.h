/* model/: target models behind one small interface, the seam that keeps speculative decoding
 * model-neutral. A target holds weights (mapped from a GGUF file, used in place), the
 * committed sequence state (recurrent states, attention caches) and scratch. Rows are tokens
 * at consecutive positions after the committed ones.
 *
 *   verify(tok, n)  run n rows on top of the committed state, fill what em_rows asks for
 *                   (logits or argmaxes of chosen rows, captured features [n][n_feat], routes);
 *                   the committed state is NOT modified
 *   commit(k)       make the first k rows of the last verify permanent (k <= n): recurrent
 *                   layers fold in only k transitions (ReplaySSM), attention layers keep
 *                   positions < pos + k (their rows past that are scratch)
 *   prefill(tok, n) verify(n) + commit(n) fused, for prompts: any n, state updated in place
 *   cost(n)         what a verify of n rows would cost now
 *
 * Plain decoding is verify(1) + commit(1). A verify of more than max_verify rows still works:
 * its commit then replays the accepted tokens (counted in stats.full_replays).
 *
 * Errors: bad arguments (token id out of range, rows past the context, commit without a
 * verify or of more rows than verified) are EM_EINVAL with a message and leave the target as it
 * was. A failure inside a computation (out of memory) leaves the committed state undefined
 * only for prefill/commit; call reset then.
 *
 * Not thread-safe: one call at a time per target. */
#ifndef EM_MODEL_H
#define EM_MODEL_H

#include "base/base.h"

typedef struct em_target em_target;
typedef struct em_target_shared em_target_shared;

/* Where a verify/prefill puts its results (caller memory), and which rows' results are wanted,
 * so that a target computes (and on a device, copies back) only those: a greedy loop asks for
 * argmaxes, a sampling one for logits, a prompt for the last row only.
 *
 * Rows are indexed 0 .. n-1 in the order of tok. For row i:
 *   logits:  wanted when logits != NULL and (last_only ? i == n-1 : !logit_rows || logit_rows[i]);
 *            written to logits + i * n_vocab (last_only: to logits itself).
 *   argmax:  wanted when argmax != NULL and (last_only ? i == n-1 : !argmax_rows || argmax_rows[i]);
 *            written to argmax[i] (last_only: argmax[0]): the index of the row's largest logit,
 *            the lowest on ties, NaN skipped (em_argmax of sample/sample.h, the sampler's greedy
 *            choice, computed from exactly the floats the row's logits would be), or -1 when the
 *            row has no usable logit (every logit NaN or -inf).
 * Slots of rows that are not wanted are left untouched. The LM head runs only for rows whose
 * logits or argmax are wanted. A row's values do not depend on which other rows were asked
 * for (nor on n: verify rows are bit-identical to one-row steps).
 * Invalid (EM_EINVAL, nothing computed): a row mask without its output buffer, or a row mask
 * together with last_only. */
typedef struct em_rows {
    float *logits;     /* [n][n_vocab] ([n_vocab] with last_only); NULL: no logits */
    const bool *logit_rows;  /* [n]: the rows whose logits are wanted; NULL: every row */
    int32_t *argmax;   /* [n] ([1] with last_only); NULL: no argmaxes */
    const bool *argmax_rows; /* [n]: the rows whose argmax is wanted; NULL: every row */
    bool last_only;    /* only the last row's logits/argmax, packed (see above) */
    float *features;   /* [n][n_feat] (residual stream after the feature layers, concatenated
                          in the order given at open); NULL: not captured */
    bool device_features; /* instead: the features stay on the target's device, row i at
                          em_target_shared's d_features + i * n_feat, for a drafter there (n at
                          most its feature_rows; a target that lends no d_features refuses it) */
    int32_t *routes;   /* [n][n_route]: per MoE layer (in layer order) the experts chosen for
                          the row, best first; NULL: not reported */
    float *route_margins; /* [n][n_moe_layers]: per MoE layer the selection score of the last
                          chosen expert minus the best one left out (how near a tie the choice
                          was); NULL: not reported */
} em_rows;

/* An estimate of one verify: seconds (calibrated by the verifies timed so far), bytes it would
 * read from storage (0 when every weight is resident), and nominal_seconds: the same estimate
 * at the fixed rates of compute.h's nominal machine, which depends on nothing timed (the cache's
 * content aside), so decisions made on it are reproducible. weight_bytes: the weight bytes the
 * verify streams through the processor wherever they live (the expected distinct experts of
 * n rows; exact for one row), the figure a decode step's memory rate is measured by. */
typedef struct em_cost {
    double seconds;
    uint64_t bytes_read;
    double nominal_seconds;
    uint64_t weight_bytes;
} em_cost;

/* One phase of a target's forward steps (em_target_phases): wall-clock seconds, laps (times
 * it ran), the weight bytes it streamed and the pool hand-offs it made, summed since enabled. */
typedef struct em_target_phase {
    const char *name;
    double seconds;
    uint64_t laps, bytes, pool_runs;
} em_target_phase;

/* Routed-expert storage counters (em_target_expert_stats). In resident mode every expert use
 * counts as a hit and nothing is read. An expert use is one (forward step, MoE layer, distinct
 * expert among the step's rows): hits + misses = uses. */
typedef struct em_target_expert_counts {
    uint64_t bytes_read;     /* bytes transferred from storage (reads widened to 4 KiB) */
    uint64_t reads;          /* read requests issued (three per missed expert) */
    uint64_t hits, misses;
    double read_seconds;     /* time waiting for reads (hits computed meanwhile not counted) */
    uint64_t prefetched;     /* experts read ahead (their bytes and reads are counted above) */
    uint64_t prefetch_used;  /* of those, used before being evicted */
    uint64_t cache_bytes;    /* bytes the expert cache holds now (0 when resident) */
    uint64_t cache_budget;   /* its budget (0 when resident) */
    uint64_t slot_bytes;     /* the most one expert takes in the cache (0 when resident) */
    uint64_t n_experts;      /* routed experts in the model (all MoE layers) */
    uint64_t resident_bytes; /* tensor bytes kept in memory (mapped) */
    uint64_t file_bytes;     /* routed-expert bytes read from the file on demand (0: resident) */
    int storage;             /* EM_MOE_RESIDENT or EM_MOE_SSD */
} em_target_expert_counts;

typedef struct em_target_ops {
    int (*verify)(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err);
    int (*commit)(em_target *t, int k, em_err *err);
    int (*prefill)(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err);
    em_cost (*cost)(const em_target *t, int n);
    void (*reset)(em_target *t);
    void (*close)(em_target *t);
    /* optional (NULL: shares nothing): fills what the target lends a drafter */
    int (*shared_weights)(const em_target *t, em_target_shared *out, em_err *err);
    /* optional (NULL: no routed experts): counters of one layer (-1: all) */
    int (*expert_stats)(const em_target *t, int layer, em_target_expert_counts *out, em_err *err);
    /* optional (NULL: no breakdown): the target's phase timer (base.h em_phases) */
    em_phases *(*phases)(em_target *t);
    /* optional (NULL: nothing to read ahead): the next verify's first tokens are tok[0..n);
     * start reading what it will likely need (experts from storage) */
    int (*prefetch)(em_target *t, const int32_t *tok, int n, em_err *err);
} em_target_ops;

typedef struct em_target_info {
    const char *arch;    /* general.architecture */
    const char *device;  /* where it runs: "cpu", or "cuda:N (device name)" */
    int n_vocab, n_embd, n_layer;
    int n_ctx;           /* positions the target holds */
    int max_verify;      /* verify widths with a fast (logged) commit */
    int n_feat;          /* floats per row of em_rows.features (0: no feature layers) */
    int n_moe_layers;    /* layers with routed experts */
    int n_route;         /* ids per row of em_rows.routes (n_moe_layers * experts per token) */
} em_target_info;

typedef struct em_target_stats {
    uint64_t verifies, rows_verified, prefills, rows_prefilled;
    uint64_t fast_commits;     /* commits from the transition log */
    uint64_t full_replays;     /* commits that re-ran the accepted tokens */
    uint64_t failed_fallbacks; /* replays that failed (state reset) */
} em_target_stats;

/* The common part of every target; architectures embed it first. Read-only for callers. */
struct em_target {
    const em_target_ops *ops;
    em_target_info info;
    int64_t pos;       /* committed positions */
    int pending;       /* rows of the last verify that commit may still take; -1: none */
    em_target_stats stats;
    struct em_experts *experts; /* its routed experts' provider (experts/experts.h), NULL: none;
                                   tests reach its fault shim through it (em_experts_fault_arm) */
    char missing_data[256]; /* non-empty: the file lacks tensor data (cut short); verify and
                               prefill fail with this message, nothing reads the data */
};

#define EM_MODEL_DEFAULT_CTX 4096
#define EM_MODEL_DEFAULT_MAX_VERIFY 16
#define EM_MODEL_DEFAULT_UBATCH 128
#define EM_MODEL_MAX_FEATURE_LAYERS 16

/* Where routed experts live. RESIDENT: in the mapped file, like every other weight. SSD: read
 * on demand through a byte-budgeted cache (experts/); everything else stays mapped. AUTO:
 * resident when all tensors fit in the memory available at open (MemAvailable), else SSD. */
enum em_moe_storage { EM_MOE_AUTO = 0, EM_MOE_RESIDENT = 1, EM_MOE_SSD = 2 };

/* Where a target runs. AUTO: on cuda:0 when this ember has CUDA, a usable GPU is there, the
 * experts are not asked to stay on SSD and the model fits in its memory; else on the CPU
 * (the reason is logged at INFO). */
enum em_device_kind { EM_DEVICE_AUTO = 0, EM_DEVICE_CPU = 1, EM_DEVICE_CUDA = 2 };

typedef struct em_model_opts {
    int device;         /* enum em_device_kind */
    int cuda_index;     /* EM_DEVICE_CUDA: the device (cuda:N) */
    const int *cuda_devices; /* with n_cuda_devices >= 1: the routed experts spread over these
                                devices (`--devices`; cuda_devices[0] holds the rest of the model
                                and is cuda_index), EM_GPU_MAX_SHARES at most */
    int n_cuda_devices;
    int n_threads;      /* 0: em_cpu_count() */
    int n_ctx;          /* 0: the file's context length, at most EM_MODEL_DEFAULT_CTX */
    int max_verify;     /* 0: EM_MODEL_DEFAULT_MAX_VERIFY */
    int ubatch;         /* rows per step of a prefill; 0: EM_MODEL_DEFAULT_UBATCH */
    const int *feature_layers; /* capture the residual stream after these layers (0-based) */
    int n_feature_layers;
    int moe_storage;    /* enum em_moe_storage */
    uint64_t expert_cache_bytes; /* SSD: the expert cache budget; 0: half the memory available
                                    after the resident weights (at least one expert, at most all) */
    bool expert_no_prefetch;     /* SSD: no read-ahead of the experts tokens were last routed to */
} em_model_opts;

/* Opens the model at path (a GGUF file; split shards are found from any shard's name) as a
 * target, choosing the architecture from general.architecture (kimi-linear, kimi-k3). opts may be NULL.
 * Errors name the file and the key or tensor: a missing or misshapen tensor, a key of the wrong
 * type, an unsupported architecture or tensor type. */
int em_model_open(em_target **out, const char *path, const em_model_opts *opts, em_err *err);
void em_target_close(em_target *t); /* NULL-safe */

/* The operations, with their arguments checked (see the top of this file). */
int em_target_verify(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err);
int em_target_commit(em_target *t, int k, em_err *err);
int em_target_prefill(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err);
em_cost em_target_cost(const em_target *t, int n);
/* A hint that the next verify starts with tok[0..n): the target may start reading what it will
 * need (a no-op for targets without storage). Never changes any result. */
int em_target_prefetch(em_target *t, const int32_t *tok, int n, em_err *err);
/* Back to an empty sequence. */
void em_target_reset(em_target *t);
int64_t em_target_position(const em_target *t);
const em_target_info *em_target_get_info(const em_target *t);
/* What a target lends the model that drafts for it (draft/draft.h em_draft_open): its shape
 * and its own token embedding and LM head, so that one copy of each exists (on a device, one
 * device copy). Every pointer points into the target: valid until em_target_close, so the
 * target must outlive whatever borrows from it (close the drafter first). */
struct em_target_shared {
    const char *path;                /* the target's file, for messages */
    const char *arch;                /* general.architecture */
    int n_embd, n_layer, n_vocab;
    const struct em_mat *token_embd; /* [n_vocab] rows of n_embd, readable as values; NULL: none */
    const struct em_mat *output;     /* the LM head, [n_vocab] rows of n_embd; NULL: none */
    /* a target on a CUDA device: its device copies of the two (backend/gpu.h), which a drafter
     * on the same device uses instead of uploading its own; cuda_index -1 (and NULLs): none */
    int cuda_index;
    const struct em_gpu_mat *d_token_embd, *d_output;
    /* its device handle (backend/gpu.h em_gpu): a drafter there issues its work on it, so that
     * the two are ordered without host syncs; and its device feature rows (em_rows'
     * device_features): [feature_rows][n_feat] F32, valid until the next call */
    struct em_gpu *gpu;
    const float *d_features;
    int feature_rows;
};
/* Fills out. EM_EUNSUPPORTED when the target lends nothing, EM_EFORMAT when its file lacks
 * tensor data (cut short: nothing may read it). */
int em_target_shared_weights(const em_target *t, em_target_shared *out, em_err *err);
/* Routed-expert counters since open, for one layer (a model layer index) or all (-1); a
 * target without routed experts gives zeros. */
int em_target_expert_stats(const em_target *t, int layer, em_target_expert_counts *out, em_err *err);
/* Per-phase timing of forward steps and commits (ember bench's breakdown): on clears the sums
 * and starts timing (a clock read per phase, about twenty per layer), off stops it.
 * EM_EUNSUPPORTED for a target without a breakdown. */
int em_target_phases_enable(em_target *t, bool on, em_err *err);
/* The phases' sums since enabled, at most max of them into out, in the target's order;
 * returns how many (0: no breakdown). */
int em_target_phases(em_target *t, em_target_phase *out, int max);
/* Whether the model files of every open target (and drafter) are still what was mapped:
 * EM_EIO "model file PATH changed on disk while mapped (N bytes now, M mapped): restart to
 * reload" once one lost pages under a forward (truncated: the reads gave zeros instead of
 * SIGBUS) or, with check_files, changed size or modification time since it was opened. The
 * target calls enforce this: prefill checks the files first, and every verify, commit and
 * prefill fails with this error when a file was damaged before or during it. Permanent: a
 * damaged model must be opened again. */
int em_model_files_check(bool check_files, em_err *err);

#endif
