/* experts/: routed experts read from the model file through a bounded cache.
 *
 * - store: where each (layer, expert)'s gate / up / down matrices lie inside the stacked GGUF
 *   tensors blk.L.ffn_{gate,up,down}_exps.weight ([n_embd, n_ff, X] and [n_ff, n_embd, X]):
 *   shard file, absolute offset, bytes. Located once at open; O(1) per expert afterwards.
 * - route union: n rows x k (expert id, weight) of one layer -> the distinct experts, each with
 *   the rows and weights routed to it, so each expert is read and computed once.
 * - cache: a byte budget of expert slots (EM_DIRECT_ALIGN-aligned buffers holding the three
 *   parts). em_expert_cache_run serves one layer's union: hits are pinned and computed while
 *   the misses load (cache-first overlap); misses are read in batches (io_uring when the kernel
 *   allows it, else pread; sorted by file offset; O_DIRECT with ranges widened to the alignment
 *   when the file system accepts it, else buffered). An expert in use is never evicted; a
 *   budget smaller than a layer's union works by evicting experts once they have been used.
 *   Policies: LRU, and LFU with exponential aging (frequency history kept for every expert,
 *   resident or not).
 * - statistics per layer and in total; cost hints (bytes a set of routes would read now).
 * - faults: an I/O error, a short read or a file that shrank fail the call with a message
 *   naming the file and the offset; no partial entry is kept and the next call works. A per-
 *   cache fault shim (em_expert_cache_fault_arm, always compiled in: one compare per read)
 *   injects EIO or short reads for tests.
 * - provider (em_experts): a model's routed experts as its MoE forward asks for them. Owns
 *   the storage policy (resident: views into the mapping; ssd: a store and a cache), the
 *   default budget, the cache's life, the load summary, statistics, cost hints and the fault
 *   shim. The forward asks only for the weights of one layer's route union (em_experts_run);
 *   a device cache is meant to be another provider behind the same calls.
 * Single-threaded: one cache is used by one thread at a time (the forward's thread). */
#ifndef EM_EXPERTS_H
#define EM_EXPERTS_H

#include "base/base.h"
#include "compute/compute.h"
#include "format/gguf.h"

enum { EM_EXPERT_GATE = 0, EM_EXPERT_UP = 1, EM_EXPERT_DOWN = 2, EM_EXPERT_NPARTS = 3 };

/* ---- store ------------------------------------------------------------------------------ */

/* One routed-expert layer. Expert e's part p is a matrix of rows[p] x cols[p] values of
 * type[p] (gate/up: n_ff x n_embd, down: n_embd x n_ff), row_bytes[p] per row. */
typedef struct em_expert_layer {
    int n_expert;                 /* 0: the layer has no routed experts */
    int shard[EM_EXPERT_NPARTS];  /* file holding each stacked tensor */
    int type[EM_EXPERT_NPARTS];
    int64_t rows[EM_EXPERT_NPARTS], cols[EM_EXPERT_NPARTS];
    uint64_t row_bytes[EM_EXPERT_NPARTS];
    uint64_t part_bytes[EM_EXPERT_NPARTS];  /* one expert's part: rows * row_bytes */
    uint64_t base[EM_EXPERT_NPARTS];        /* absolute file offset of expert 0's part */
} em_expert_layer;

/* A byte range of one file of the model. */
typedef struct em_expert_range {
    int shard;
    uint64_t offset; /* absolute, in the shard file */
    uint64_t bytes;
} em_expert_range;

typedef struct em_expert_store em_expert_store;

/* Finds every blk.L.ffn_{gate,up,down}_exps.weight of g and checks their shapes against each
 * other (same X; gate/up [E, F, X], down [F, E, X]; all three present or none). The store
 * copies what it needs: it does not reference g after open. A model without routed experts
 * opens with n_layers == 0. */
int em_expert_store_open(em_expert_store **out, const em_gguf *g, em_err *err);
void em_expert_store_close(em_expert_store *s);
int em_expert_store_n_layers(const em_expert_store *s); /* highest layer with experts + 1 */
/* NULL when layer is out of range; n_expert == 0 for layers without experts. */
const em_expert_layer *em_expert_store_layer(const em_expert_store *s, int layer);
int em_expert_store_n_shards(const em_expert_store *s);
const char *em_expert_store_shard_path(const em_expert_store *s, int shard);
/* Where part p of (layer, expert) lies; EM_EINVAL for ids out of range. */
int em_expert_store_range(const em_expert_store *s, int layer, int expert, int part,
                          em_expert_range *out, em_err *err);
uint64_t em_expert_store_total_bytes(const em_expert_store *s); /* all routed-expert bytes */

/* Bytes of memory the system could give now without swapping (/proc/meminfo MemAvailable;
 * 0 when unknown). */
uint64_t em_experts_mem_available(void);

/* ---- route union ------------------------------------------------------------------------ */

/* The experts one layer needs for n rows: expert[i] (ascending) is used by rows
 * row[start[i] .. start[i+1]) with weights weight[same]. Arrays live in the arena. */
typedef struct em_route_union {
    int n;        /* distinct experts */
    int *expert;  /* [n] */
    int *start;   /* [n + 1] */
    int *row;     /* [n_rows * k] */
    float *weight;/* [n_rows * k] (0 when weights was NULL) */
} em_route_union;

/* ids and weights: n_rows x k (row t's at t * k); ids in [0, n_expert) (EM_EINVAL otherwise,
 * naming the row). weights may be NULL. */
int em_route_union_build(em_route_union *u, const int *ids, const float *weights, int n_rows,
                         int k, int n_expert, em_arena *arena, em_err *err);

/* ---- cache ------------------------------------------------------------------------------ */

/* LFU (with aging) is the default: on skewed synthetic traces it beat LRU at every budget
 * tried (tests/test_experts.c prints the numbers), and on the routing trace recorded from
 * 300 decoded tokens of the 1.6 GB synthetic kimi-linear (11 layers x 32 experts, top-8;
 * bench/bench_expert_policy.c) hit rates LRU / LFU(8x) were 0.000 / 0.150 at 10% of the
 * experts, 0.548 / 0.608 at 25%, 0.903 / 0.939 at 50%. (On kimi_c, a 3 x 8 top-2 toy, LRU won
 * at 25%: 0.363 / 0.308; LFU at 50%: 0.566 / 0.650.) */
enum em_expert_policy { EM_EXPERT_LFU = 0, EM_EXPERT_LRU = 1 };
enum em_expert_io { EM_EXPERT_IO_AUTO = 0, EM_EXPERT_IO_URING = 1, EM_EXPERT_IO_PREAD = 2 };
enum em_expert_fault { EM_EXPERT_FAULT_NONE = 0, EM_EXPERT_FAULT_EIO, EM_EXPERT_FAULT_SHORT };

typedef struct em_expert_cache_opts {
    uint64_t budget;      /* bytes of expert slots; at least the largest one expert's slot */
    int policy;           /* enum em_expert_policy */
    int io;               /* enum em_expert_io; URING fails when io_uring is unavailable */
    bool buffered;        /* never O_DIRECT (tests; file systems known to be slow at it) */
    double lfu_halflife;  /* LFU: expert accesses after which a count halves (0: 8 times the
                           * number of slots the budget holds, the best of 2/4/8/16 measured) */
} em_expert_cache_opts;

typedef struct em_expert_cache em_expert_cache;

/* The store must outlive the cache. Opens the shard files (O_DIRECT where allowed). */
int em_expert_cache_create(em_expert_cache **out, const em_expert_store *s,
                           const em_expert_cache_opts *opts, em_err *err);
void em_expert_cache_free(em_expert_cache *c);

/* One expert's weights while it is pinned: part[p] points at rows[p] x row_bytes[p] bytes. */
typedef struct em_expert_data {
    int layer, expert;
    const void *part[EM_EXPERT_NPARTS];
} em_expert_data;

/* Called once for each expert whose read lands, before any run sees it, with its parts
 * writable (part[p] as em_expert_data's): the provider packs them in place there. */
typedef void (*em_expert_landed_fn)(void *ctx, int layer, uint8_t *const part[EM_EXPERT_NPARTS]);
void em_expert_cache_on_landed(em_expert_cache *c, em_expert_landed_fn fn, void *ctx);

/* Called once for each expert of a run; i is its index in the experts array. A nonzero
 * return stops the run with that status. */
typedef int (*em_expert_fn)(void *ctx, int i, const em_expert_data *d, em_err *err);

/* Serves experts[0..n) of one layer (distinct ids, e.g. em_route_union.expert): calls fn once
 * for every one, hits first (while the first batch of misses loads), then the misses batch by
 * batch. On failure (fn, I/O, bad ids) the cache holds no partial entry and no pin. */
int em_expert_cache_run(em_expert_cache *c, int layer, const int *experts, int n,
                        em_expert_fn fn, void *ctx, em_err *err);

/* The same run, handing fn several pinned experts at once so that it can compute them
 * together (one pool run for all their products): once with every hit (while the first
 * misses load), then once per batch of misses. idx[j] is d[j]'s index in experts; the
 * pointers in d are valid only during the call. */
typedef int (*em_expert_batch_fn)(void *ctx, const int *idx, const em_expert_data *d, int n,
                                  em_err *err);
int em_expert_cache_run_batch(em_expert_cache *c, int layer, const int *experts, int n,
                              em_expert_batch_fn fn, void *ctx, em_err *err);

typedef struct em_expert_stats {
    uint64_t bytes_read; /* bytes transferred from storage */
    uint64_t reads;      /* read requests issued (three per missed expert) */
    uint64_t hits, misses;
    double read_seconds; /* waiting for reads, not counting hits computed meanwhile */
    uint64_t prefetched;    /* experts read ahead (their bytes and reads are counted above) */
    uint64_t prefetch_used; /* of those, used by a run before being evicted */
} em_expert_stats;

/* layer -1: the total over all layers. */
void em_expert_cache_stats(const em_expert_cache *c, int layer, em_expert_stats *out);
void em_expert_cache_stats_reset(em_expert_cache *c);
uint64_t em_expert_cache_used(const em_expert_cache *c);   /* bytes held now */
uint64_t em_expert_cache_budget(const em_expert_cache *c);
int em_expert_cache_count(const em_expert_cache *c);       /* experts held now */
bool em_expert_cache_holds(const em_expert_cache *c, int layer, int expert);
/* Bytes a slot of this layer occupies (the three parts widened to EM_DIRECT_ALIGN). */
uint64_t em_expert_cache_slot_bytes(const em_expert_cache *c, int layer);
/* How reads go now: io_uring or pread, O_DIRECT (for every shard) or buffered. */
void em_expert_cache_io_info(const em_expert_cache *c, bool *uring, bool *direct);

/* Cost hints. Exact: the bytes reading experts[0..n) of layer would transfer now (misses'
 * widened slots; the union's duplicates must already be gone). Estimate: the bytes a verify
 * of n_rows rows would read over all layers, for k experts per row drawn uniformly (expected
 * distinct experts X (1 - (1 - k/X)^n_rows), of which the fraction the cache holds of that
 * layer hits). */
uint64_t em_expert_cache_miss_bytes(const em_expert_cache *c, int layer, const int *experts,
                                    int n);
uint64_t em_expert_cache_estimate(const em_expert_cache *c, int n_rows, int k);
/* The estimate's part for one layer (0 for a layer without experts): a caller that knows the
 * exact bytes of its real unions (em_expert_cache_miss_bytes) can calibrate the estimate. */
uint64_t em_expert_cache_estimate_layer(const em_expert_cache *c, int layer, int n_rows, int k);

/* Read-ahead, for experts a caller predicts the coming runs will list. em_expert_cache_predict
 * starts a new prediction: the slots the previous one protected become ordinary. Then
 * em_expert_cache_prefetch goes through list[0..n) in order (the order the runs will want
 * them): held experts are marked as predicted, the others start reading in the background
 * (as `chains` chains of reads run one after another, so the first listed land first) while
 * the reads in flight and the experts read ahead for this prediction but not used yet stay
 * within EM_EXPERT_AHEAD_SHARE of the budget. It returns how many entries it got through (n:
 * all held or coming; without io_uring it stops at the first that is not held), or EM_EINVAL
 * for an expert that does not exist or chains < 1. It never evicts a slot the current
 * prediction lists. Runs wait only for the reads of experts they list; a failed
 * read-ahead is dropped unseen (the run that needs the expert reads it and reports the
 * failure; the fault shim never hits read-ahead). */
#define EM_EXPERT_AHEAD_SHARE 0.5
typedef struct em_expert_ref {
    int layer, expert;
} em_expert_ref;
void em_expert_cache_predict(em_expert_cache *c);
int em_expert_cache_prefetch(em_expert_cache *c, const em_expert_ref *list, int n, int chains, em_err *err);

/* Test hook: the (after_n_reads + 1)-th read completed from now fails as kind says (EIO:
 * the read reports an I/O error; SHORT: it returns half the bytes asked for). Fires once. */
void em_expert_cache_fault_arm(em_expert_cache *c, int kind, uint64_t after_n_reads);

/* ---- provider ----------------------------------------------------------------------------- */

/* Where routed experts live (the values of model.h's em_moe_storage). RESIDENT: used in place
 * from the mapping. SSD: read on demand through a cache; everything else stays mapped. AUTO:
 * resident when all tensors fit in EM_EXPERTS_AUTO_FIT of MemAvailable, else SSD. */
enum em_experts_storage { EM_EXPERTS_AUTO = 0, EM_EXPERTS_RESIDENT = 1, EM_EXPERTS_SSD = 2 };
#define EM_EXPERTS_AUTO_FIT 0.9
/* The default SSD budget: this share of the memory the resident weights leave. */
#define EM_EXPERTS_DEFAULT_CACHE_SHARE 0.5

/* One layer's routed-expert tensors as the model loaded them (views into the mapping of the
 * file the provider opens with): part[GATE], part[UP] n_expert * F rows, part[DOWN]
 * n_expert * E rows. n_expert == 0: the layer has none. */
typedef struct em_experts_src {
    int n_expert;
    em_mat part[EM_EXPERT_NPARTS];
} em_experts_src;

typedef struct em_experts_opts {
    int storage;          /* enum em_experts_storage */
    uint64_t cache_bytes; /* SSD: the cache budget; 0: em_experts_default_budget */
    bool no_prefetch;     /* SSD: no route memory, no read-ahead */
    bool pack;            /* CPU products: packed experts (compute/packed.c) when every part
                           * packs per expert and all of them fit em_mat_pack_budget: resident,
                           * packed copies made at open; SSD, each slot packed in place as its
                           * read lands. Both modes compute the same floats. */
} em_experts_opts;

typedef struct em_experts em_experts;

/* Chooses the storage mode, opens what it needs (SSD: the store and the cache of g's routed
 * experts, checked against layers[]), and logs the one-line load summary. layers[0..n_layer)
 * must stay valid (g open) until em_experts_close. Errors name the file. */
int em_experts_open(em_experts **out, const em_gguf *g, const em_experts_src *layers, int n_layer,
                    const em_experts_opts *opts, em_err *err);
void em_experts_close(em_experts *x); /* NULL-safe */

/* The mode AUTO resolves to (or `requested` itself): tensors of all_bytes in total, routed of
 * them routed experts, avail bytes of memory (0: unknown, taken as enough). Nothing routed:
 * RESIDENT. */
int em_experts_choose_storage(int requested, uint64_t all_bytes, uint64_t routed_bytes, uint64_t avail);
/* The default budget: EM_EXPERTS_DEFAULT_CACHE_SHARE of what avail leaves after the resident
 * bytes, at least the largest slot, at most every slot of the store. */
uint64_t em_experts_default_budget(const em_expert_store *s, uint64_t resident, uint64_t avail);

/* One expert's matrices while a run holds it (mapped or cached): part[p] is the expert's
 * rows of layers[layer].part[p]. */
typedef struct em_expert_view {
    int layer, expert;
    em_mat part[EM_EXPERT_NPARTS];
} em_expert_view;

/* Called with several experts at once so they can be computed together; idx[j] is v[j]'s
 * index in the experts array of the run. The views are valid only during the call. */
typedef int (*em_experts_fn)(void *ctx, const int *idx, const em_expert_view *v, int n, em_err *err);

/* The weights of experts[0..n) of layer (distinct, e.g. em_route_union.expert) for n_rows rows
 * of k experts each: resident, one call with all of them; SSD, the cache's run (hits first,
 * while the misses load, then batch by batch). Counts the uses; on failure nothing stays
 * pinned and the next run works. */
int em_experts_run(em_experts *x, int layer, const int *experts, int n, int n_rows, int k, em_experts_fn fn,
                   void *ctx, em_err *err);

typedef struct em_experts_counts {
    uint64_t bytes_read, reads, hits, misses;
    double read_seconds;
    uint64_t prefetched, prefetch_used;            /* experts read ahead; of them used */
    uint64_t cache_bytes, cache_budget, slot_bytes; /* 0 when resident */
    uint64_t n_experts;                            /* over all layers */
    uint64_t resident_bytes, file_bytes;
    int storage;                                   /* EM_EXPERTS_RESIDENT or _SSD */
} em_experts_counts;

/* Counters of one layer (-1: all) since open; resident uses count as hits. */
void em_experts_stats(const em_experts *x, int layer, em_experts_counts *out);
/* Bytes from storage, and the seconds they would take (at the rate measured so far, else
 * EM_NOMINAL_DISK_BPS), that a verify of n_rows rows of k experts would read now; 0 when
 * resident. The uniform-routing estimate is calibrated by the unions run so far. */
uint64_t em_experts_cost(const em_experts *x, int n_rows, int k, double *seconds);
/* Route memory and read-ahead (SSD, unless opened with no_prefetch; otherwise both do nothing).
 * em_experts_note: the forward's routes of one layer, ids n_rows x k for the rows' tokens
 * (EM_EINVAL when k changes between calls). em_experts_prefetch: the coming forward's tokens
 * (the first EM_EXPERTS_PREDICT_ROWS of them); starts reading ahead the experts they were
 * last routed to, layer by layer, and keeps doing so as each layer's run frees the share.
 * Prediction only moves reads earlier: what a run computes never depends on it. */
#define EM_EXPERTS_PREDICT_ROWS 16
int em_experts_note(em_experts *x, int layer, const int32_t *tokens, const int *ids, int n_rows, int k,
                    em_err *err);
int em_experts_prefetch(em_experts *x, const int32_t *tokens, int n, em_err *err);

/* Test hook (the cache's fault shim): the (after_n_reads + 1)-th read from now fails as kind
 * says. EM_EUNSUPPORTED when x is NULL or resident, EM_EINVAL for another kind. */
int em_experts_fault_arm(em_experts *x, int kind, uint64_t after_n_reads, em_err *err);

#endif
