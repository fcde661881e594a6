/* experts/cache: a byte-budgeted cache of expert slots over the store, and the per-layer run
 * that serves a route union from it. A slot is one EM_DIRECT_ALIGN-aligned buffer holding
 * the three parts, each widened to the alignment (so O_DIRECT can read it in place).
 * Invariants: used <= budget at all times; a slot is in the index only once fully read; a
 * pinned slot (in use by the current run) is never evicted; a run that fails leaves no pin
 * and no partial slot. Victims: LRU (oldest access) or LFU with exponential aging (lowest
 * decayed access count; the history covers every expert, resident or not), ties to LRU.
 * Slot buffers are mapped anonymous memory: an evicted one is kept on a free list for the
 * next miss (no page faults, no heap fragmentation) as long as held + free bytes stay within
 * the budget, and unmapped otherwise, so the cache never holds more than its budget.
 * Read-ahead: em_expert_cache_prefetch starts reading predicted experts into fresh buffers
 * (counted in flight against the budget; with those read ahead for the current prediction
 * and not used yet, at most EM_EXPERT_AHEAD_SHARE of it); a completed one enters the index
 * unpinned at the next call that settles completions. A run that lists a coming expert waits
 * for that read only. Slots the current prediction lists and no run has used yet are never
 * evicted to make room for a read-ahead, and runs evict them last. An in-flight buffer is
 * never freed before its read completes (em_expert_cache_free waits). */
#include "experts/experts_impl.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct slot {
    int layer, expert;
    uint8_t *buf;
    uint64_t bytes;
    int pins;
    bool fresh;               /* read ahead and not used yet */
    uint64_t want;            /* the prediction that lists it, until a run uses it (0: none) */
} slot;

#define AHEAD_MAX 21 /* experts read ahead at once (three requests each, in a ring of 64) */

typedef struct ahead {        /* one expert being read ahead; never moves while in flight */
    bool busy;
    int layer, expert;
    uint8_t *buf;
    uint64_t bytes, gen;
    em_xio_req reqs[EM_EXPERT_NPARTS];
} ahead;

typedef struct expert_meta {  /* per (layer, expert), resident or not */
    int slot;                 /* index in slots, -1 when not resident */
    int ahead;                /* index in aheads while being read ahead, else -1 */
    uint64_t last;            /* tick of the last access */
    double freq;              /* decayed access count as of `last` */
    uint64_t run;             /* id of the last run that listed it (duplicate check) */
} expert_meta;

struct em_expert_cache {
    const em_expert_store *store;
    em_expert_cache_opts opts;
    em_xio *io;
    int n_layers;
    int *layer_base;          /* [n_layers + 1] index of (layer, 0) in meta */
    expert_meta *meta;
    uint64_t *slot_bytes;     /* [n_layers] */
    uint64_t (*part_off)[EM_EXPERT_NPARTS]; /* [n_layers] offset of each part in a slot */
    em_expert_landed_fn landed;               /* NULL: none */
    void *landed_ctx;
    slot *slots;
    int n_slots, cap_slots;
    uint64_t used, tick, runs;
    struct free_buf *free_list; /* evicted slot buffers kept for reuse */
    uint64_t free_bytes;
    uint64_t inflight;          /* buffers being read, by a batch or ahead (not yet in `used`) */
    ahead aheads[AHEAD_MAX];
    int n_ahead;                /* busy entries of aheads */
    uint64_t ahead_bytes, gen;  /* in flight ahead; the current prediction */
    int *held;                  /* [n_layers] experts of each layer in the cache */
    em_expert_stats *stats;   /* [n_layers] */
    /* a run's scratch, sized for the largest layer (a run never lists more experts) */
    int *hit;
    uint64_t (*miss)[2];
    struct pending *batch;
    em_xio_req *reqs;
    int *call_idx;            /* one batch call's union indices and data */
    em_expert_data *call_data;
};

typedef struct free_buf { /* lives in the first bytes of an unused slot buffer */
    struct free_buf *next;
    uint64_t bytes;
} free_buf;

/* A slot buffer of `bytes` (a multiple of the page size) for a batch being read: a kept one
 * of that size, else fresh mapped memory (after unmapping kept ones of other sizes as far as
 * held + kept + in flight would pass the budget). */
static uint8_t *buf_get(em_expert_cache *c, uint64_t bytes, em_err *err) {
    for (free_buf **p = &c->free_list; *p; p = &(*p)->next)
        if ((*p)->bytes == bytes) {
            free_buf *f = *p;
            *p = f->next;
            c->free_bytes -= bytes;
            c->inflight += bytes;
            return (uint8_t *)f;
        }
    while (c->free_list && c->used + c->free_bytes + c->inflight + bytes > c->opts.budget) {
        free_buf *f = c->free_list;
        c->free_list = f->next;
        c->free_bytes -= f->bytes;
        munmap(f, (size_t)f->bytes);
    }
    void *m = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        char b[32];
        em_err_set(err, EM_ENOMEM, "experts: cannot map a slot of %s", em_format_size(bytes, b, sizeof b));
        return NULL;
    }
    c->inflight += bytes;
    return m;
}

/* Takes back a buffer (of a failed batch when inflight, else of an evicted slot): kept for
 * reuse while held + kept + in flight bytes fit the budget, else unmapped. */
static void buf_put(em_expert_cache *c, uint8_t *buf, uint64_t bytes, bool inflight) {
    if (inflight) c->inflight -= bytes;
    if (c->used + c->free_bytes + c->inflight + bytes <= c->opts.budget) {
        free_buf *f = (free_buf *)(void *)buf;
        f->next = c->free_list;
        f->bytes = bytes;
        c->free_list = f;
        c->free_bytes += bytes;
        return;
    }
    munmap(buf, (size_t)bytes);
}

static bool ahead_complete(const ahead *a) {
    for (int p = 0; p < EM_EXPERT_NPARTS; p++)
        if (!a->reqs[p].done) return false;
    return true;
}

typedef struct pending {
    int idx;           /* in the union */
    uint8_t *buf;
    uint64_t bytes;
} pending;

static uint64_t widened(uint64_t offset, uint64_t bytes) {
    return em_align_up(offset + bytes, EM_DIRECT_ALIGN) - offset / EM_DIRECT_ALIGN * EM_DIRECT_ALIGN;
}

/* Slot layout per layer: the parts back to back, each at an aligned offset and as long as
 * the widest any expert of the layer needs once widened to the alignment. */
static int plan_layer(em_expert_cache *c, int l, em_err *err) {
    const em_expert_layer *L = em_expert_store_layer(c->store, l);
    uint64_t off = 0;
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
        c->part_off[l][p] = off;
        uint64_t w = 0;
        for (int e = 0; e < L->n_expert; e++) {
            em_expert_range r;
            em_expert_store_range(c->store, l, e, p, &r, NULL);
            uint64_t we = widened(r.offset, r.bytes);
            if (we > w) w = we;
            if (w == em_align_up(r.bytes, EM_DIRECT_ALIGN) + EM_DIRECT_ALIGN) break; /* the most */
        }
        if (em_add_overflow(off, w, &off))
            return em_err_set(err, EM_EOVERFLOW, "expert slot of layer %d overflows", l);
    }
    c->slot_bytes[l] = off;
    return EM_OK;
}

int em_expert_cache_create(em_expert_cache **out, const em_expert_store *s,
                           const em_expert_cache_opts *opts, em_err *err) {
    *out = NULL;
    em_expert_cache *c = em_calloc(1, sizeof *c, "expert cache", err);
    if (!c) return EM_ENOMEM;
    c->store = s;
    c->opts = *opts;
    c->n_layers = em_expert_store_n_layers(s);
    size_t nl = (size_t)c->n_layers + 1;
    c->layer_base = em_calloc(nl, sizeof *c->layer_base, "expert cache index", err);
    c->slot_bytes = em_calloc(nl, sizeof *c->slot_bytes, "expert cache slots", err);
    c->part_off = em_calloc(nl, sizeof *c->part_off, "expert cache slots", err);
    c->stats = em_calloc(nl, sizeof *c->stats, "expert cache stats", err);
    c->held = em_calloc(nl, sizeof *c->held, "expert cache index", err);
    int rc = c->layer_base && c->slot_bytes && c->part_off && c->stats && c->held ? EM_OK : EM_ENOMEM;
    uint64_t largest = 0;
    for (int l = 0; !rc && l < c->n_layers; l++) {
        c->layer_base[l + 1] = c->layer_base[l] + em_expert_store_layer(s, l)->n_expert;
        rc = plan_layer(c, l, err);
        if (!rc && c->slot_bytes[l] > largest) largest = c->slot_bytes[l];
    }
    if (!rc) {
        size_t n_meta = (size_t)c->layer_base[c->n_layers];
        c->meta = em_calloc(n_meta ? n_meta : 1, sizeof *c->meta, "expert cache index", err);
        if (!c->meta) rc = EM_ENOMEM;
        for (size_t i = 0; !rc && i < n_meta; i++) c->meta[i].slot = c->meta[i].ahead = -1;
    }
    if (!rc && opts->budget < largest) {
        char a[32], b[32];
        rc = em_err_set(err, EM_EINVAL, "expert cache budget %s is smaller than one expert (%s)",
                        em_format_size(opts->budget, a, sizeof a), em_format_size(largest, b, sizeof b));
    }
    int max_x = 1;
    for (int l = 0; l < c->n_layers; l++)
        if (em_expert_store_layer(s, l)->n_expert > max_x) max_x = em_expert_store_layer(s, l)->n_expert;
    if (!rc) {
        c->hit = em_calloc((size_t)max_x, sizeof *c->hit, "expert run scratch", err);
        c->miss = em_calloc((size_t)max_x, sizeof *c->miss, "expert run scratch", err);
        c->batch = em_calloc((size_t)max_x, sizeof(pending), "expert run scratch", err);
        c->reqs = em_calloc((size_t)max_x * EM_EXPERT_NPARTS, sizeof *c->reqs, "expert run scratch", err);
        c->call_idx = em_calloc((size_t)max_x, sizeof *c->call_idx, "expert run scratch", err);
        c->call_data = em_calloc((size_t)max_x, sizeof *c->call_data, "expert run scratch", err);
        if (!c->hit || !c->miss || !c->batch || !c->reqs || !c->call_idx || !c->call_data) rc = EM_ENOMEM;
    }
    if (!rc && c->opts.lfu_halflife <= 0)
        c->opts.lfu_halflife = 8.0 * (double)(opts->budget / (largest ? largest : 1));
    if (!rc) rc = em_xio_open(&c->io, s, opts->io, opts->buffered, err);
    if (rc) {
        em_expert_cache_free(c);
        return rc;
    }
    *out = c;
    return EM_OK;
}

void em_expert_cache_free(em_expert_cache *c) {
    if (!c) return;
    while (c->n_ahead > 0) { /* the ring still writes into their buffers */
        em_xio_reap(c->io, true);
        for (int i = 0; i < AHEAD_MAX; i++)
            if (c->aheads[i].busy && ahead_complete(&c->aheads[i])) {
                munmap(c->aheads[i].buf, (size_t)c->aheads[i].bytes);
                c->aheads[i].busy = false;
                c->n_ahead--;
            }
    }
    for (int i = 0; i < c->n_slots; i++) munmap(c->slots[i].buf, (size_t)c->slots[i].bytes);
    while (c->free_list) {
        free_buf *f = c->free_list;
        c->free_list = f->next;
        munmap(f, (size_t)f->bytes);
    }
    free(c->slots);
    em_xio_close(c->io);
    free(c->meta);
    free(c->layer_base);
    free(c->slot_bytes);
    free(c->part_off);
    free(c->stats);
    free(c->held);
    free(c->hit);
    free(c->miss);
    free(c->batch);
    free(c->reqs);
    free(c->call_idx);
    free(c->call_data);
    free(c);
}

static expert_meta *meta_of(const em_expert_cache *c, int layer, int expert) {
    return &c->meta[c->layer_base[layer] + expert];
}

static double decayed(const em_expert_cache *c, const expert_meta *m) {
    return m->freq * exp2(-(double)(c->tick - m->last) / c->opts.lfu_halflife);
}

static void touch(em_expert_cache *c, expert_meta *m) {
    c->tick++;
    m->freq = decayed(c, m) + 1.0;
    m->last = c->tick;
}

/* True when slot a should go before slot b. */
static bool evict_before(const em_expert_cache *c, const slot *a, const slot *b) {
    const expert_meta *ma = meta_of(c, a->layer, a->expert), *mb = meta_of(c, b->layer, b->expert);
    if (c->opts.policy == EM_EXPERT_LFU) {
        double fa = decayed(c, ma), fb = decayed(c, mb);
        if (fa != fb) return fa < fb;
    }
    return ma->last < mb->last;
}

static void remove_slot(em_expert_cache *c, int i) {
    slot *s = &c->slots[i];
    meta_of(c, s->layer, s->expert)->slot = -1;
    c->held[s->layer]--;
    c->used -= s->bytes;
    buf_put(c, s->buf, s->bytes, false);
    if (i != c->n_slots - 1) {
        c->slots[i] = c->slots[c->n_slots - 1];
        meta_of(c, c->slots[i].layer, c->slots[i].expert)->slot = i;
    }
    c->n_slots--;
}

/* Predicted by the current prediction and not used since. */
static bool predicted_unused(const em_expert_cache *c, const slot *s) { return s->want != 0 && s->want == c->gen; }

/* Evicts unpinned slots until `want` more bytes fit beside those held and in flight; false
 * when pins prevent it. Slots the current prediction lists and no run has used go last, and
 * never when `for_ahead` (one read-ahead does not push out what another prediction wants). */
static bool make_room(em_expert_cache *c, uint64_t want, bool for_ahead) {
    while (c->used + c->inflight + want > c->opts.budget) {
        int victim = -1;
        for (int i = 0; i < c->n_slots; i++) {
            const slot *s = &c->slots[i];
            if (s->pins || (for_ahead && predicted_unused(c, s))) continue;
            if (victim >= 0) {
                const slot *v = &c->slots[victim];
                bool fs = predicted_unused(c, s), fv = predicted_unused(c, v);
                if (fs != fv ? fs : !evict_before(c, s, v)) continue;
            }
            victim = i;
        }
        if (victim < 0) return false;
        remove_slot(c, victim);
    }
    return true;
}

static uint64_t unpinned_bytes(const em_expert_cache *c) {
    uint64_t b = 0;
    for (int i = 0; i < c->n_slots; i++)
        if (!c->slots[i].pins) b += c->slots[i].bytes;
    return b;
}

/* Where each part of expert (layer, e) starts in its slot buffer buf. */
static void parts_in(const em_expert_cache *c, int layer, int e, uint8_t *buf, uint8_t *part[EM_EXPERT_NPARTS]) {
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
        em_expert_range r;
        em_expert_store_range(c->store, layer, e, p, &r, NULL);
        part[p] = buf + c->part_off[layer][p] + r.offset % EM_DIRECT_ALIGN;
    }
}

static em_expert_data data_of(const em_expert_cache *c, const slot *s) {
    em_expert_data d = {.layer = s->layer, .expert = s->expert};
    uint8_t *part[EM_EXPERT_NPARTS];
    parts_in(c, s->layer, s->expert, s->buf, part);
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) d.part[p] = part[p];
    return d;
}

void em_expert_cache_on_landed(em_expert_cache *c, em_expert_landed_fn fn, void *ctx) {
    c->landed = fn;
    c->landed_ctx = ctx;
}

/* A read of expert (layer, e) into buf landed whole: the landed hook, before it enters the index. */
static void land(const em_expert_cache *c, int layer, int e, uint8_t *buf) {
    if (!c->landed) return;
    uint8_t *part[EM_EXPERT_NPARTS];
    parts_in(c, layer, e, buf, part);
    c->landed(c->landed_ctx, layer, part);
}

/* ---- one layer's run --------------------------------------------------------------------- */

typedef struct run_state {
    em_expert_cache *c;
    int layer;
    const int *experts;
    int *hit;          /* union indices that hit, pinned until computed */
    int n_hit;
    bool hits_done;
    em_expert_batch_fn fn;
    void *ctx;
    double overlap_s;  /* seconds spent computing hits while reads were in flight */
} run_state;

/* One call of fn over the pinned experts idx[0..n) (union indices), then their pins go. */
static int call_batch(run_state *st, const int *idx, int n, em_err *err) {
    em_expert_cache *c = st->c;
    for (int j = 0; j < n; j++) {
        c->call_idx[j] = idx[j];
        c->call_data[j] = data_of(c, &c->slots[meta_of(c, st->layer, st->experts[idx[j]])->slot]);
    }
    int rc = n > 0 ? st->fn(st->ctx, c->call_idx, c->call_data, n, err) : EM_OK;
    for (int j = 0; j < n; j++) c->slots[meta_of(c, st->layer, st->experts[idx[j]])->slot].pins--;
    return rc;
}

/* Computes every pinned hit in one call, unpinning them after use (or on failure). */
static int run_hits(void *vctx, em_err *err) {
    run_state *st = vctx;
    if (st->hits_done) return EM_OK;
    st->hits_done = true;
    double t0 = em_time_now();
    int rc = call_batch(st, st->hit, st->n_hit, err);
    st->overlap_s += em_time_now() - t0;
    return rc;
}


static int by_first_offset(const void *a, const void *b) {
    const uint64_t *x = a, *y = b; /* pairs (key, idx) */
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* The reads that fill a slot buffer with (layer, expert): one per part. */
static void slot_reqs(const em_expert_cache *c, int layer, int expert, uint8_t *buf, em_xio_req *reqs) {
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
        em_expert_range r;
        em_expert_store_range(c->store, layer, expert, p, &r, NULL);
        uint64_t a0 = r.offset / EM_DIRECT_ALIGN * EM_DIRECT_ALIGN;
        reqs[p] = (em_xio_req){.file = r.shard, .offset = a0, .bytes = widened(r.offset, r.bytes),
                               .need = r.offset + r.bytes - a0, .dst = buf + c->part_off[layer][p]};
    }
}

/* Reads batch[0..n) (buffers allocated, room made) and computes them. */
static int load_batch(run_state *st, pending *batch, int n, em_xio_req *reqs, em_err *err) {
    em_expert_cache *c = st->c;
    int nr = 0;
    for (int b = 0; b < n; b++, nr += EM_EXPERT_NPARTS)
        slot_reqs(c, st->layer, st->experts[batch[b].idx], batch[b].buf, reqs + nr);
    double t0 = em_time_now(), o0 = st->overlap_s;
    int rc = em_xio_read(c->io, reqs, nr, run_hits, st, err);
    em_expert_stats *ls = &c->stats[st->layer];
    ls->read_seconds += em_time_now() - t0 - (st->overlap_s - o0);
    ls->reads += (uint64_t)nr;
    for (int i = 0; i < nr; i++) ls->bytes_read += reqs[i].got;
    if (rc) {
        for (int b = 0; b < n; b++) buf_put(c, batch[b].buf, batch[b].bytes, true);
        return rc;
    }
    for (int b = 0; b < n; b++) { /* complete: now they enter the index, pinned */
        int e = st->experts[batch[b].idx];
        land(c, st->layer, e, batch[b].buf);
        c->slots[c->n_slots] = (slot){.layer = st->layer, .expert = e, .buf = batch[b].buf,
                                      .bytes = batch[b].bytes, .pins = 1};
        meta_of(c, st->layer, e)->slot = c->n_slots++;
        c->held[st->layer]++;
        c->used += batch[b].bytes;
        c->inflight -= batch[b].bytes;
        ls->misses++;
    }
    int *idx = st->c->hit + st->n_hit; /* free room after the hits' indices */
    for (int b = 0; b < n; b++) idx[b] = batch[b].idx;
    return call_batch(st, idx, n, err);
}

static int check_run(em_expert_cache *c, int layer, const int *experts, int n, em_err *err) {
    const em_expert_layer *L = em_expert_store_layer(c->store, layer);
    if (!L || L->n_expert == 0 || n < 0 || n > L->n_expert)
        return em_err_set(err, EM_EINVAL, "experts: layer %d has no routed experts (or %d asked)", layer, n);
    for (int i = 0; i < n; i++)
        if (experts[i] < 0 || experts[i] >= L->n_expert)
            return em_err_set(err, EM_EINVAL, "experts: layer %d has no expert %d", layer, experts[i]);
    c->runs++;
    for (int i = 0; i < n; i++) { /* distinct: a duplicate would be pinned and counted twice */
        expert_meta *m = meta_of(c, layer, experts[i]);
        if (m->run == c->runs)
            return em_err_set(err, EM_EINVAL, "experts: layer %d: expert %d listed twice", layer,
                              experts[i]);
        m->run = c->runs;
    }
    return EM_OK;
}

/* Room for `extra` more slots besides every read-ahead's. */
static int grow_slots(em_expert_cache *c, int extra, em_err *err) {
    if (c->n_slots + extra + AHEAD_MAX <= c->cap_slots) return EM_OK;
    int cap = (c->n_slots + extra + AHEAD_MAX) * 2;
    slot *s = realloc(c->slots, (size_t)cap * sizeof *s);
    if (!s) return em_err_set(err, EM_ENOMEM, "experts: out of memory for %d slots", cap);
    c->slots = s;
    c->cap_slots = cap;
    return EM_OK;
}

/* Misses from *m on that fit once unpinned slots go: allocates their buffers. */
static int next_batch(run_state *st, const uint64_t (*miss)[2], int n_miss, int *m, pending *batch,
                      int *nb, em_err *err) {
    em_expert_cache *c = st->c;
    const uint64_t sb = c->slot_bytes[st->layer];
    uint64_t room = c->opts.budget - (c->used - unpinned_bytes(c)) - c->inflight, want = 0;
    *nb = 0;
    while (*m < n_miss && want + sb <= room) {
        batch[*nb] = (pending){.idx = (int)miss[*m][1], .bytes = sb};
        want += sb;
        (*nb)++, (*m)++;
    }
    if (*nb == 0) return EM_OK;
    bool ok = make_room(c, want, false);
    assert(ok);
    (void)ok;
    for (int b = 0; b < *nb; b++) {
        batch[b].buf = buf_get(c, sb, err);
        if (!batch[b].buf) {
            for (int j = 0; j < b; j++) buf_put(c, batch[j].buf, sb, true);
            return EM_ENOMEM;
        }
    }
    return EM_OK;
}

/* ---- read-ahead --------------------------------------------------------------------------- */

/* Moves completed read-aheads into the index (unpinned); a failed one is dropped (a run that
 * needs the expert reads it again and reports the failure). Slots have room (grow_slots). */
static void ahead_settle(em_expert_cache *c) {
    for (int i = 0; i < AHEAD_MAX; i++) {
        ahead *a = &c->aheads[i];
        if (!a->busy || !ahead_complete(a)) continue;
        a->busy = false;
        c->n_ahead--;
        c->ahead_bytes -= a->bytes;
        expert_meta *m = meta_of(c, a->layer, a->expert);
        m->ahead = -1;
        em_expert_stats *ls = &c->stats[a->layer];
        bool ok = true;
        for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
            ok = ok && a->reqs[p].status == EM_OK;
            ls->bytes_read += a->reqs[p].got;
        }
        ls->reads += EM_EXPERT_NPARTS;
        if (!ok) {
            buf_put(c, a->buf, a->bytes, true);
            continue;
        }
        assert(c->n_slots < c->cap_slots);
        land(c, a->layer, a->expert, a->buf);
        c->slots[c->n_slots] = (slot){.layer = a->layer, .expert = a->expert, .buf = a->buf,
                                      .bytes = a->bytes, .fresh = true, .want = a->gen};
        m->slot = c->n_slots++;
        c->held[a->layer]++;
        c->used += a->bytes;
        c->inflight -= a->bytes;
        ls->prefetched++;
    }
}

/* Waits for read-ahead entry i (or all of them when i < 0) and settles. */
static void ahead_wait(em_expert_cache *c, int i) {
    while (i >= 0 ? !ahead_complete(&c->aheads[i]) : c->n_ahead > 0) {
        em_xio_reap(c->io, true);
        if (i < 0) ahead_settle(c);
    }
    ahead_settle(c);
}

/* Bytes read ahead for the current prediction and not used yet (in the index). */
static uint64_t unused_ahead_bytes(const em_expert_cache *c) {
    uint64_t b = 0;
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].fresh && predicted_unused(c, &c->slots[i])) b += c->slots[i].bytes;
    return b;
}

void em_expert_cache_predict(em_expert_cache *c) { c->gen++; }

/* Gives back entry i of a read-ahead that never reached the ring. */
static void ahead_drop(em_expert_cache *c, int i) {
    ahead *a = &c->aheads[i];
    meta_of(c, a->layer, a->expert)->ahead = -1;
    buf_put(c, a->buf, a->bytes, true);
    c->ahead_bytes -= a->bytes;
    c->n_ahead--;
    a->busy = false;
}

/* Takes an entry and a buffer for reading one expert ahead (its requests made, not issued);
 * -1 when the budget share, the ring or the entries are full. */
static int ahead_take(em_expert_cache *c, int layer, int expert, uint64_t share, int queued) {
    const uint64_t sb = c->slot_bytes[layer];
    if (c->n_ahead == AHEAD_MAX || em_xio_ahead_room(c->io) < (queued + 1) * EM_EXPERT_NPARTS ||
        c->ahead_bytes + unused_ahead_bytes(c) + sb > share || !make_room(c, sb, true))
        return -1;
    em_err tmp;
    uint8_t *buf = buf_get(c, sb, &tmp);
    if (!buf) return -1;
    int i = 0;
    while (c->aheads[i].busy) i++;
    ahead *a = &c->aheads[i];
    *a = (ahead){.busy = true, .layer = layer, .expert = expert, .buf = buf, .bytes = sb, .gen = c->gen};
    slot_reqs(c, layer, expert, buf, a->reqs);
    c->n_ahead++;
    c->ahead_bytes += sb;
    meta_of(c, layer, expert)->ahead = i;
    return i;
}

static int check_refs(const em_expert_cache *c, const em_expert_ref *list, int n, em_err *err) {
    for (int i = 0; i < n; i++) {
        const em_expert_layer *L = em_expert_store_layer(c->store, list[i].layer);
        if (!L || list[i].expert < 0 || list[i].expert >= L->n_expert)
            return em_err_set(err, EM_EINVAL, "experts: read-ahead of layer %d, expert %d: no such routed expert",
                              list[i].layer, list[i].expert);
    }
    return EM_OK;
}

int em_expert_cache_prefetch(em_expert_cache *c, const em_expert_ref *list, int n, int chains, em_err *err) {
    int rc = chains < 1 ? em_err_set(err, EM_EINVAL, "experts: read-ahead over %d chains", chains)
                        : check_refs(c, list, n, err);
    if (!rc) rc = grow_slots(c, 0, err);
    if (rc) return rc;
    ahead_settle(c);
    const uint64_t share = (uint64_t)((double)c->opts.budget * EM_EXPERT_AHEAD_SHARE);
    em_xio_req *reqs[AHEAD_MAX * EM_EXPERT_NPARTS];
    int taken[AHEAD_MAX], done = 0, queued = 0;
    for (; done < n; done++) {
        expert_meta *m = meta_of(c, list[done].layer, list[done].expert);
        if (m->slot >= 0) c->slots[m->slot].want = c->gen;
        if (m->slot >= 0 || m->ahead >= 0) continue;
        int i = ahead_take(c, list[done].layer, list[done].expert, share, queued);
        if (i < 0) break;
        for (int p = 0; p < EM_EXPERT_NPARTS; p++) reqs[queued * EM_EXPERT_NPARTS + p] = &c->aheads[i].reqs[p];
        taken[queued++] = i;
    }
    if (queued && (rc = em_xio_submit(c->io, reqs, queued * EM_EXPERT_NPARTS, EM_EXPERT_NPARTS, chains, err))) {
        for (int q = 0; q < queued; q++) ahead_drop(c, taken[q]); /* nothing was issued */
        return rc;
    }
    return done;
}

int em_expert_cache_run_batch(em_expert_cache *c, int layer, const int *experts, int n,
                              em_expert_batch_fn fn, void *ctx, em_err *err) {
    int rc = check_run(c, layer, experts, n, err);
    if (rc) return rc;
    if (n == 0) return EM_OK;
    if (c->n_ahead > 0) { /* reads started ahead: settle those done, wait for those listed */
        double t0 = em_time_now();
        ahead_settle(c);
        for (int i = 0; i < n; i++)
            if (meta_of(c, layer, experts[i])->ahead >= 0) ahead_wait(c, meta_of(c, layer, experts[i])->ahead);
        c->stats[layer].read_seconds += em_time_now() - t0;
    }
    rc = grow_slots(c, n, err); /* before any slot pointer is taken */
    int *hit = c->hit;
    uint64_t (*miss)[2] = c->miss;
    pending *batch = c->batch;
    em_xio_req *reqs = c->reqs;
    run_state st = {.c = c, .layer = layer, .experts = experts, .hit = hit, .fn = fn, .ctx = ctx};
    int n_miss = 0;
    for (int i = 0; !rc && i < n; i++) {
        expert_meta *me = meta_of(c, layer, experts[i]);
        touch(c, me);
        if (me->slot >= 0) {
            slot *sl = &c->slots[me->slot];
            sl->pins++;
            c->stats[layer].prefetch_used += sl->fresh;
            sl->fresh = false;
            sl->want = 0;
            hit[st.n_hit++] = i;
            c->stats[layer].hits++;
        } else {
            em_expert_range r;
            em_expert_store_range(c->store, layer, experts[i], EM_EXPERT_GATE, &r, NULL);
            miss[n_miss][0] = ((uint64_t)r.shard << 48) ^ r.offset; /* disk order */
            miss[n_miss++][1] = (uint64_t)i;
        }
    }
    if (!rc) qsort(miss, (size_t)n_miss, sizeof *miss, by_first_offset);
    for (int m = 0; !rc && m < n_miss;) {
        int nb;
        rc = next_batch(&st, (const uint64_t(*)[2])miss, n_miss, &m, batch, &nb, err);
        if (!rc && nb == 0) { /* pinned hits (or reads ahead) fill the budget: compute the hits
                               * (or let the reads land as evictable slots) first, then retry */
            if (!st.hits_done) rc = run_hits(&st, err);
            else if (c->n_ahead > 0) ahead_wait(c, -1);
            else rc = em_err_set(err, EM_EINVAL, "experts: budget holds no slot of layer %d", layer);
            continue;
        }
        if (!rc) rc = load_batch(&st, batch, nb, reqs, err);
    }
    if (!rc) rc = run_hits(&st, err);
    if (rc && !st.hits_done) { /* failed before the hits ran: drop their pins */
        for (int j = 0; j < st.n_hit; j++) c->slots[meta_of(c, layer, experts[hit[j]])->slot].pins--;
    }
    return rc;
}

/* The one-expert-at-a-time form: fn is called for each expert of each batch. */
typedef struct single_ctx {
    em_expert_fn fn;
    void *ctx;
} single_ctx;

static int call_single(void *vctx, const int *idx, const em_expert_data *d, int n, em_err *err) {
    const single_ctx *s = vctx;
    for (int j = 0; j < n; j++) {
        int rc = s->fn(s->ctx, idx[j], &d[j], err);
        if (rc) return rc;
    }
    return EM_OK;
}

int em_expert_cache_run(em_expert_cache *c, int layer, const int *experts, int n,
                        em_expert_fn fn, void *ctx, em_err *err) {
    single_ctx s = {.fn = fn, .ctx = ctx};
    return em_expert_cache_run_batch(c, layer, experts, n, call_single, &s, err);
}

/* ---- statistics, hints, hooks ------------------------------------------------------------ */

void em_expert_cache_stats(const em_expert_cache *c, int layer, em_expert_stats *out) {
    memset(out, 0, sizeof *out);
    for (int l = 0; l < c->n_layers; l++) {
        if (layer >= 0 && l != layer) continue;
        out->bytes_read += c->stats[l].bytes_read;
        out->reads += c->stats[l].reads;
        out->hits += c->stats[l].hits;
        out->misses += c->stats[l].misses;
        out->read_seconds += c->stats[l].read_seconds;
        out->prefetched += c->stats[l].prefetched;
        out->prefetch_used += c->stats[l].prefetch_used;
    }
}

void em_expert_cache_stats_reset(em_expert_cache *c) {
    memset(c->stats, 0, (size_t)c->n_layers * sizeof *c->stats);
}

uint64_t em_expert_cache_used(const em_expert_cache *c) { return c->used; }
uint64_t em_expert_cache_budget(const em_expert_cache *c) { return c->opts.budget; }
int em_expert_cache_count(const em_expert_cache *c) { return c->n_slots; }

bool em_expert_cache_holds(const em_expert_cache *c, int layer, int expert) {
    const em_expert_layer *L = em_expert_store_layer(c->store, layer);
    return L && expert >= 0 && expert < L->n_expert && meta_of(c, layer, expert)->slot >= 0;
}

uint64_t em_expert_cache_slot_bytes(const em_expert_cache *c, int layer) {
    return layer >= 0 && layer < c->n_layers ? c->slot_bytes[layer] : 0;
}

void em_expert_cache_io_info(const em_expert_cache *c, bool *uring, bool *direct) {
    if (uring) *uring = em_xio_uring(c->io);
    if (direct) *direct = em_xio_direct(c->io);
}

/* Bytes the reads of one missing expert transfer (its three widened parts). */
static uint64_t read_bytes(const em_expert_cache *c, int layer, int expert) {
    uint64_t b = 0;
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
        em_expert_range r;
        if (em_expert_store_range(c->store, layer, expert, p, &r, NULL) == EM_OK)
            b += widened(r.offset, r.bytes);
    }
    return b;
}

uint64_t em_expert_cache_miss_bytes(const em_expert_cache *c, int layer, const int *experts,
                                    int n) {
    const em_expert_layer *L = em_expert_store_layer(c->store, layer);
    uint64_t b = 0;
    for (int i = 0; L && i < n; i++)
        if (experts[i] >= 0 && experts[i] < L->n_expert && meta_of(c, layer, experts[i])->slot < 0 &&
            meta_of(c, layer, experts[i])->ahead < 0)
            b += read_bytes(c, layer, experts[i]);
    return b;
}

/* Expected bytes layer l would read for n_rows rows of k uniform choices (0: no experts). */
static double layer_estimate(const em_expert_cache *c, int l, int n_rows, int k) {
    const em_expert_layer *L = em_expert_store_layer(c->store, l);
    if (!L || L->n_expert == 0 || n_rows <= 0 || k <= 0) return 0.0;
    double X = L->n_expert, kk = k < L->n_expert ? k : L->n_expert;
    double distinct = X * (1.0 - pow(1.0 - kk / X, n_rows));
    double miss = distinct * (1.0 - c->held[l] / X);
    return miss * (double)read_bytes(c, l, 0);
}

uint64_t em_expert_cache_estimate(const em_expert_cache *c, int n_rows, int k) {
    double total = 0;
    for (int l = 0; l < c->n_layers; l++) total += layer_estimate(c, l, n_rows, k);
    return (uint64_t)(total + 0.5);
}

uint64_t em_expert_cache_estimate_layer(const em_expert_cache *c, int layer, int n_rows, int k) {
    return (uint64_t)(layer_estimate(c, layer, n_rows, k) + 0.5);
}

void em_expert_cache_fault_arm(em_expert_cache *c, int kind, uint64_t after_n_reads) {
    em_xio_fault_arm(c->io, kind, after_n_reads);
}
