/* experts/provider.c: a model's routed experts as its MoE forward asks for them (em_experts).
 * Owns the storage policy: the mode (resident, SSD, or AUTO from MemAvailable), the default
 * cache budget, the store's and the cache's life, the load summary line, the counters,
 * calibrated cost hints and the fault shim for tests; and, with SSD storage, the route memory
 * that predicts which experts coming rows will need, and the read-ahead it drives.
 *
 * Route memory: routing in these models follows the token far more than the neighbouring
 * token (kimi-linear-19m, 24 HumanEval prompts decoded greedily: 81% of a row's experts are
 * the ones its token was routed to the last time it was seen, 17% the previous row's), so
 * the memory keeps, per (token, layer), the experts of the token's last routed row: a
 * direct-mapped table of ROUTE_MEM_SLOTS entries (a collision forgets the older token).
 * A prediction (em_experts_prefetch) lists, layer by layer in forward order, the experts the
 * given tokens were last routed to; the cache reads them ahead within its read-ahead share,
 * and each layer's run hands what is left of the share to the layers after it. The decode
 * loop predicts only the next verify's first token, while its drafter works (85-93% of those
 * reads get used); predicting every row of a verify at its start read 30-40% more bytes and
 * ran slower on a bandwidth-bound disk (models/README.md).
 *
 * Invariants: the forward sees the same weights whatever the mode (resident: rows of the
 * model's mapped tensors; SSD: the same bytes read into the cache, checked at open to have the
 * model's shapes and types; packed in both or in neither, see "packing" below), so logits
 * never depend on the mode or the budget. Views handed to
 * a run's callback live in scratch sized at open (no allocation per run). Single-threaded. */
#include "experts/experts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct em_experts {
    int storage;                 /* EM_EXPERTS_RESIDENT or EM_EXPERTS_SSD */
    int n_layer;
    const em_experts_src *src;   /* [n_layer] the model's tensors (resident packed: packed_src) */
    bool packed;                 /* experts packed (em_experts_opts.pack) */
    em_experts_src *packed_src;  /* resident packed: the model's tensors with their packed copies */
    uint8_t *pack_mem;           /* resident packed: those copies */
    uint8_t *pack_tmp;           /* SSD packed: a group of 16 rows of the widest part */
    em_expert_store *store;      /* SSD */
    em_expert_cache *cache;      /* SSD */
    em_expert_stats *uses;       /* [n_layer] resident: expert uses, counted as hits */
    uint64_t resident_bytes, file_bytes;
    uint64_t n_experts;          /* routed experts over all layers */
    /* cost-hint calibration (SSD): decayed sums of the exact bytes each layer's union would
     * read and of what the uniform-routing estimate predicted for it */
    double calib_exact, calib_pred;
    em_expert_view *views;       /* [max n_expert] one run's views */
    int *order;                  /* [max n_expert] 0, 1, 2, ... (a resident run's idx) */
    /* the SSD run in progress: its callback, wrapped */
    em_experts_fn fn;
    void *fn_ctx;
    /* route memory and the prediction in progress (SSD, read-ahead on) */
    uint32_t *mem_key;           /* [ROUTE_MEM_SLOTS] token * n_layer + layer + 1; 0: empty */
    uint16_t *mem_ids;           /* [ROUTE_MEM_SLOTS][mem_k] */
    int mem_k;                   /* experts per row, set by the first note */
    int32_t pred_tok[EM_EXPERTS_PREDICT_ROWS];
    int n_pred, pred_layer;      /* rows predicted; the first layer not yet read ahead */
    em_expert_ref *pred;         /* [n_layer * EM_EXPERTS_PREDICT_ROWS * mem_k] the list */
};

#define ROUTE_MEM_BITS 17
#define ROUTE_MEM_SLOTS (1u << ROUTE_MEM_BITS)
/* Reads ahead run as two chains, each one read at a time: the first listed (the first layers)
 * land first, and the device still has two reads to overlap (this VM's disk: 1.16 GB/s at
 * queue depth 1, 1.36 at 2, 1.8 at 8 for 100 KB reads). */
#define AHEAD_CHAINS 2

#define CALIB_DECAY 0.99 /* per layer run: about the last 100 layer unions count */

static uint64_t mat_bytes(const em_mat *m) { return m->row_bytes * (uint64_t)m->rows; }

static uint64_t src_bytes(const em_experts_src *s) {
    uint64_t b = 0;
    for (int p = 0; p < EM_EXPERT_NPARTS && s->n_expert > 0; p++) b += mat_bytes(&s->part[p]);
    return b;
}

int em_experts_choose_storage(int requested, uint64_t all_bytes, uint64_t routed_bytes, uint64_t avail) {
    int mode = requested;
    if (mode == EM_EXPERTS_AUTO)
        mode = avail == 0 || (double)all_bytes <= EM_EXPERTS_AUTO_FIT * (double)avail ? EM_EXPERTS_RESIDENT
                                                                                        : EM_EXPERTS_SSD;
    return routed_bytes == 0 ? EM_EXPERTS_RESIDENT : mode; /* nothing to stream */
}

/* An upper bound of one expert's cache slot of layer L (parts widened to the alignment). */
static uint64_t slot_bound(const em_expert_layer *L) {
    uint64_t b = 0;
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) b += em_align_up(L->part_bytes[p], EM_DIRECT_ALIGN) + EM_DIRECT_ALIGN;
    return b;
}

uint64_t em_experts_default_budget(const em_expert_store *s, uint64_t resident, uint64_t avail) {
    uint64_t largest = 0, all = 0;
    for (int l = 0; l < em_expert_store_n_layers(s); l++) {
        const em_expert_layer *L = em_expert_store_layer(s, l);
        if (L->n_expert == 0) continue;
        uint64_t b = slot_bound(L);
        if (b > largest) largest = b;
        all += b * (uint64_t)L->n_expert;
    }
    uint64_t want = avail > resident ? (uint64_t)((double)(avail - resident) * EM_EXPERTS_DEFAULT_CACHE_SHARE) : 0;
    if (want < largest) want = largest;
    return want < all ? want : all;
}

/* The store must hold each of the model's expert layers with the model's shapes and types,
 * so that a cached expert is the same matrix as the mapped one. */
static int check_store(const em_experts *x, em_err *err) {
    for (int l = 0; l < x->n_layer; l++) {
        const em_experts_src *s = &x->src[l];
        if (s->n_expert == 0) continue;
        const em_expert_layer *L = em_expert_store_layer(x->store, l);
        if (!L || L->n_expert != s->n_expert)
            return em_err_set(err, EM_EFORMAT, "layer %d: the stacked expert tensors hold %d experts, the model %d", l,
                              L ? L->n_expert : 0, s->n_expert);
        for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
            const em_mat *m = &s->part[p];
            if (L->type[p] != m->type || L->cols[p] != m->cols || L->row_bytes[p] != m->row_bytes ||
                L->rows[p] * s->n_expert != m->rows)
                return em_err_set(err, EM_EFORMAT, "layer %d: expert part %d in the file is not the model's matrix", l,
                                  p);
        }
    }
    return EM_OK;
}

static int open_ssd(em_experts *x, const em_gguf *g, const em_experts_opts *o, uint64_t avail, em_err *err) {
    int rc = em_expert_store_open(&x->store, g, err);
    if (!rc) rc = check_store(x, err); /* the caller's prefix names the file */
    if (rc) return rc;
    em_expert_cache_opts co = {
        .budget = o->cache_bytes ? o->cache_bytes : em_experts_default_budget(x->store, x->resident_bytes, avail),
    };
    return em_expert_cache_create(&x->cache, x->store, &co, err);
}

static void log_summary(const em_experts *x, const char *path, uint64_t routed) {
    char r[32], f[32], b[32];
    em_format_size(x->resident_bytes, r, sizeof r);
    if (!x->cache) {
        em_log(EM_LOG_INFO, "%s: experts resident: %s resident (routed experts %s of it%s), 0 B file-backed, no expert cache",
               path, r, em_format_size(routed, f, sizeof f), x->packed ? ", packed" : "");
        return;
    }
    bool uring, direct;
    em_expert_cache_io_info(x->cache, &uring, &direct);
    uint64_t budget = em_expert_cache_budget(x->cache);
    char pct[32];
    double share = (double)budget / (double)x->file_bytes;
    snprintf(pct, sizeof pct, share < 1.0 ? "%.0f%% of them" : "all fit", 100.0 * share);
    em_log(EM_LOG_INFO, "%s: experts ssd: %s resident, %s of routed experts file-backed, expert cache %s (%s; %s, %s%s)",
           path, r, em_format_size(x->file_bytes, f, sizeof f), em_format_size(budget, b, sizeof b), pct,
           uring ? "io_uring" : "pread", direct ? "O_DIRECT" : "buffered", x->packed ? ", packed as read" : "");
}

/* ---- packing (compute/packed.c) -----------------------------------------------------------
 * Whether an expert packs is decided from the model alone (shapes, types, total bytes against
 * em_mat_pack_budget), never from the storage mode, so resident and SSD runs compute the same
 * floats: resident experts get packed copies at open, SSD slots are packed in place as their
 * reads land (before any run sees them). */

/* One expert's rows of part p of layer s. */
static em_mat expert_mat(const em_experts_src *s, int p) {
    return em_mat_rows(&s->part[p], 0, s->part[p].rows / s->n_expert);
}

static bool experts_pack(const em_experts *x, uint64_t routed) {
    if (routed == 0 || routed > em_mat_pack_budget()) return false;
    for (int l = 0; l < x->n_layer; l++)
        for (int p = 0; p < EM_EXPERT_NPARTS && x->src[l].n_expert > 0; p++) {
            const em_mat one = expert_mat(&x->src[l], p);
            if (!em_mat_packable(&one)) return false;
        }
    return true;
}

static int pack_resident(em_experts *x, uint64_t routed, em_err *err) {
    x->packed_src = em_calloc((size_t)x->n_layer, sizeof *x->packed_src, "packed experts", err);
    if (!x->packed_src || !(x->pack_mem = em_aligned_alloc(64, routed, "packed routed experts", err)))
        return EM_ENOMEM;
    uint8_t *at = x->pack_mem;
    for (int l = 0; l < x->n_layer; l++) {
        x->packed_src[l] = x->src[l];
        for (int p = 0; p < EM_EXPERT_NPARTS && x->src[l].n_expert > 0; p++) {
            em_mat_pack(&x->packed_src[l].part[p], at); /* the stack packs as one: its experts are whole groups */
            at += em_mat_packed_bytes(&x->packed_src[l].part[p]);
        }
    }
    x->src = x->packed_src;
    return EM_OK;
}

static void pack_landed(void *ctx, int layer, uint8_t *const part[EM_EXPERT_NPARTS]) {
    em_experts *x = ctx;
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
        em_mat m = expert_mat(&x->src[layer], p);
        em_mat_pack_inplace(&m, part[p], x->pack_tmp);
    }
}

static int pack_slots(em_experts *x, em_err *err) {
    uint64_t widest = 0;
    for (int l = 0; l < x->n_layer; l++)
        for (int p = 0; p < EM_EXPERT_NPARTS && x->src[l].n_expert > 0; p++)
            if (x->src[l].part[p].row_bytes > widest) widest = x->src[l].part[p].row_bytes;
    if (!(x->pack_tmp = em_malloc(EM_PACK_ROWS * widest, "expert packing", err))) return EM_ENOMEM;
    em_expert_cache_on_landed(x->cache, pack_landed, x);
    return EM_OK;
}

static int alloc_scratch(em_experts *x, em_err *err) {
    int most = 1;
    for (int l = 0; l < x->n_layer; l++)
        if (x->src[l].n_expert > most) most = x->src[l].n_expert;
    x->uses = em_calloc((size_t)x->n_layer + 1, sizeof *x->uses, "expert statistics", err);
    x->views = em_calloc((size_t)most, sizeof *x->views, "expert views", err);
    x->order = em_calloc((size_t)most, sizeof *x->order, "expert order", err);
    if (!x->uses || !x->views || !x->order) return EM_ENOMEM;
    for (int i = 0; i < most; i++) x->order[i] = i;
    return EM_OK;
}

int em_experts_open(em_experts **out, const em_gguf *g, const em_experts_src *layers, int n_layer,
                    const em_experts_opts *opts, em_err *err) {
    *out = NULL;
    const char *path = em_gguf_path(g);
    if (opts->storage < EM_EXPERTS_AUTO || opts->storage > EM_EXPERTS_SSD)
        return em_err_set(err, EM_EINVAL, "%s: expert storage %d is not auto, resident or ssd", path, opts->storage);
    em_experts *x = em_calloc(1, sizeof *x, "expert storage", err);
    if (!x) return EM_ENOMEM;
    x->n_layer = n_layer;
    x->src = layers;
    int rc = alloc_scratch(x, err);
    uint64_t all = 0, routed = 0;
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) all += em_gguf_tensor_at(g, i)->bytes;
    for (int l = 0; l < n_layer; l++) {
        routed += src_bytes(&layers[l]);
        x->n_experts += (uint64_t)layers[l].n_expert;
    }
    const uint64_t avail = em_experts_mem_available();
    x->storage = em_experts_choose_storage(opts->storage, all, routed, avail);
    x->resident_bytes = x->storage == EM_EXPERTS_SSD ? all - routed : all;
    x->file_bytes = x->storage == EM_EXPERTS_SSD ? routed : 0;
    if (!rc && x->storage == EM_EXPERTS_SSD && (rc = open_ssd(x, g, opts, avail, err)))
        em_err_prefix(err, "%s: --moe-storage ssd", path);
    x->packed = !rc && opts->pack && experts_pack(x, routed);
    if (x->packed && !rc) rc = x->storage == EM_EXPERTS_SSD ? pack_slots(x, err) : pack_resident(x, routed, err);
    if (!rc && x->storage == EM_EXPERTS_SSD && !opts->no_prefetch) {
        x->mem_key = em_calloc(ROUTE_MEM_SLOTS, sizeof *x->mem_key, "route memory", err);
        if (!x->mem_key) rc = EM_ENOMEM;
    }
    if (rc) {
        em_experts_close(x);
        return rc;
    }
    if (x->storage == EM_EXPERTS_RESIDENT && opts->cache_bytes && routed > 0)
        em_log(EM_LOG_WARN, "%s: experts are resident%s: the expert cache budget is not used", path,
               opts->storage == EM_EXPERTS_AUTO ? " (the model fits in memory)" : "");
    log_summary(x, path, routed);
    *out = x;
    return EM_OK;
}

void em_experts_close(em_experts *x) {
    if (!x) return;
    em_expert_cache_free(x->cache);
    em_expert_store_close(x->store);
    free(x->uses);
    free(x->views);
    free(x->order);
    free(x->pred);
    free(x->mem_key);
    free(x->mem_ids);
    free(x->packed_src);
    free(x->pack_mem);
    free(x->pack_tmp);
    free(x);
}

/* ---- route memory and read-ahead ---------------------------------------------------------- */

static uint32_t mem_slot(uint32_t key) { return (key * 2654435761u) >> (32 - ROUTE_MEM_BITS); } /* Fibonacci hash */

/* The experts token was last routed to in layer (NULL: not remembered). */
static const uint16_t *remembered(const em_experts *x, int32_t token, int layer) {
    const uint32_t key = (uint32_t)token * (uint32_t)x->n_layer + (uint32_t)layer + 1, i = mem_slot(key);
    return x->mem_key[i] == key ? x->mem_ids + (uint64_t)i * (uint64_t)x->mem_k : NULL;
}

int em_experts_note(em_experts *x, int layer, const int32_t *tokens, const int *ids, int n_rows, int k,
                    em_err *err) {
    if (!x || !x->mem_key || n_rows <= 0) return EM_OK;
    if (layer < 0 || layer >= x->n_layer || k <= 0 || k > x->src[layer].n_expert || (x->mem_k && k != x->mem_k))
        return em_err_set(err, EM_EINVAL, "experts: routes of %d experts per row for layer %d", k, layer);
    if (!x->mem_ids) {
        x->mem_ids = em_calloc((size_t)ROUTE_MEM_SLOTS * (size_t)k, sizeof *x->mem_ids, "route memory", err);
        x->pred = em_calloc((size_t)x->n_layer * EM_EXPERTS_PREDICT_ROWS * (size_t)k, sizeof *x->pred,
                            "expert prediction", err);
        if (!x->mem_ids || !x->pred) return EM_ENOMEM;
        x->mem_k = k;
    }
    for (int t = 0; t < n_rows; t++) {
        if (tokens[t] < 0) continue;
        const uint32_t key = (uint32_t)tokens[t] * (uint32_t)x->n_layer + (uint32_t)layer + 1, i = mem_slot(key);
        x->mem_key[i] = key;
        for (int j = 0; j < k; j++) x->mem_ids[(uint64_t)i * (uint64_t)k + (uint64_t)j] = (uint16_t)ids[t * k + j];
    }
    return EM_OK;
}

/* One layer's predicted experts (distinct, row by row) appended to x->pred[n..]; the new n. */
static int predicted(em_experts *x, int layer, int n) {
    const int first = n;
    for (int t = 0; t < x->n_pred; t++) {
        const uint16_t *ids = remembered(x, x->pred_tok[t], layer);
        for (int j = 0; ids && j < x->mem_k; j++) {
            int e = ids[j], seen = 0;
            for (int i = first; i < n && !seen; i++) seen = x->pred[i].expert == e;
            if (!seen && e < x->src[layer].n_expert) x->pred[n++] = (em_expert_ref){ layer, e };
        }
    }
    return n;
}

/* Reads ahead, in forward order from the first layer not yet done, as far as the cache's
 * share allows; the rest waits for the runs to free it. */
static int read_ahead(em_experts *x, em_err *err) {
    if (x->n_pred == 0 || x->pred_layer >= x->n_layer) return EM_OK;
    int n = 0;
    for (int l = x->pred_layer; l < x->n_layer; l++)
        if (x->src[l].n_expert > 0) n = predicted(x, l, n);
    int done = em_expert_cache_prefetch(x->cache, x->pred, n, AHEAD_CHAINS, err);
    if (done < 0) return done;
    x->pred_layer = done < n ? x->pred[done].layer : x->n_layer;
    return EM_OK;
}

int em_experts_prefetch(em_experts *x, const int32_t *tokens, int n, em_err *err) {
    if (!x || !x->mem_ids || n <= 0) return EM_OK;
    x->n_pred = n < EM_EXPERTS_PREDICT_ROWS ? n : EM_EXPERTS_PREDICT_ROWS;
    memcpy(x->pred_tok, tokens, (size_t)x->n_pred * sizeof *tokens);
    x->pred_layer = 0;
    em_expert_cache_predict(x->cache);
    return read_ahead(x, err);
}

/* Expert e's rows of each of the layer's matrices. */
static em_expert_view view_of(const em_experts_src *s, int layer, int e) {
    em_expert_view v = { .layer = layer, .expert = e };
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
        const int64_t rows = s->part[p].rows / s->n_expert;
        v.part[p] = em_mat_rows(&s->part[p], (int64_t)e * rows, rows);
    }
    return v;
}

/* The cache's batch callback: its pinned bytes as the model's matrices. */
static int cached_batch(void *vctx, const int *idx, const em_expert_data *d, int n, em_err *err) {
    em_experts *x = vctx;
    for (int j = 0; j < n; j++) {
        x->views[j] = view_of(&x->src[d[j].layer], d[j].layer, d[j].expert);
        for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
            x->views[j].part[p].data = d[j].part[p];
            x->views[j].part[p].packed = x->packed ? d[j].part[p] : NULL; /* packed as it landed */
        }
    }
    return x->fn(x->fn_ctx, idx, x->views, n, err);
}

int em_experts_run(em_experts *x, int layer, const int *experts, int n, int n_rows, int k, em_experts_fn fn,
                   void *ctx, em_err *err) {
    if (layer < 0 || layer >= x->n_layer || x->src[layer].n_expert == 0)
        return em_err_set(err, EM_EINVAL, "experts: layer %d has no routed experts", layer);
    const em_experts_src *s = &x->src[layer];
    if (n < 0 || n > s->n_expert)
        return em_err_set(err, EM_EINVAL, "experts: %d experts asked of layer %d (it has %d)", n, layer, s->n_expert);
    if (x->cache) {
        x->calib_exact = CALIB_DECAY * x->calib_exact + (double)em_expert_cache_miss_bytes(x->cache, layer, experts, n);
        x->calib_pred = CALIB_DECAY * x->calib_pred + (double)em_expert_cache_estimate_layer(x->cache, layer, n_rows, k);
        x->fn = fn;
        x->fn_ctx = ctx;
        int rc = em_expert_cache_run_batch(x->cache, layer, experts, n, cached_batch, x, err);
        if (!rc && x->pred_layer <= layer) x->pred_layer = layer + 1; /* too late for this one */
        return rc ? rc : read_ahead(x, err); /* its slots are used: the share has room again */
    }
    for (int i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= s->n_expert)
            return em_err_set(err, EM_EINVAL, "experts: expert %d is not one of layer %d's %d", experts[i], layer,
                              s->n_expert);
        x->views[i] = view_of(s, layer, experts[i]);
    }
    int rc = fn(ctx, x->order, x->views, n, err);
    if (!rc) x->uses[layer].hits += (uint64_t)n;
    return rc;
}

void em_experts_stats(const em_experts *x, int layer, em_experts_counts *out) {
    *out = (em_experts_counts){ .storage = x->storage, .resident_bytes = x->resident_bytes,
                                .file_bytes = x->file_bytes, .n_experts = x->n_experts };
    em_expert_stats s = { 0 };
    if (x->cache) {
        em_expert_cache_stats(x->cache, layer, &s);
        out->cache_bytes = em_expert_cache_used(x->cache);
        out->cache_budget = em_expert_cache_budget(x->cache);
        for (int l = 0; l < x->n_layer; l++)
            if (em_expert_cache_slot_bytes(x->cache, l) > out->slot_bytes)
                out->slot_bytes = em_expert_cache_slot_bytes(x->cache, l);
    } else {
        for (int l = 0; l < x->n_layer; l++)
            if (layer < 0 || l == layer) s.hits += x->uses[l].hits;
    }
    out->bytes_read = s.bytes_read;
    out->reads = s.reads;
    out->hits = s.hits;
    out->misses = s.misses;
    out->read_seconds = s.read_seconds;
    out->prefetched = s.prefetched;
    out->prefetch_used = s.prefetch_used;
}

uint64_t em_experts_cost(const em_experts *x, int n_rows, int k, double *seconds) {
    *seconds = 0.0;
    if (!x || !x->cache) return 0;
    uint64_t bytes = em_expert_cache_estimate(x->cache, n_rows, k);
    /* routing is not uniform (the cache keeps the popular experts): scale by what the real
     * unions read against what the estimate said for them */
    if (x->calib_pred > 0) bytes = (uint64_t)((double)bytes * (x->calib_exact / x->calib_pred) + 0.5);
    em_expert_stats s;
    em_expert_cache_stats(x->cache, -1, &s);
    /* the rate measured so far once it means something, else a typical NVMe rate */
    double bps = s.read_seconds > 1e-3 && s.bytes_read > 0 ? (double)s.bytes_read / s.read_seconds : EM_NOMINAL_DISK_BPS;
    *seconds = (double)bytes / bps;
    return bytes;
}

int em_experts_fault_arm(em_experts *x, int kind, uint64_t after_n_reads, em_err *err) {
    if (!x) return em_err_set(err, EM_EUNSUPPORTED, "expert fault: this target reads no experts from storage");
    if (!x->cache)
        return em_err_set(err, EM_EUNSUPPORTED, "expert fault: experts are resident, nothing is read from storage");
    if (kind != EM_EXPERT_FAULT_EIO && kind != EM_EXPERT_FAULT_SHORT)
        return em_err_set(err, EM_EINVAL, "expert fault: kind %d is not EIO or SHORT", kind);
    em_expert_cache_fault_arm(x->cache, kind, after_n_reads);
    return EM_OK;
}
