/* experts/: store locations against the tensors' own bytes, the route union, the cache's
 * budget and policies, io_uring vs pread vs O_DIRECT paths, injected faults, and the provider
 * a model asks for its route unions' weights (storage policy, views, counters, fault shim). The model
 * files are small GGUFs written here with stacked expert tensors of random bytes. */
#include "testutil.h"

#undef E /* testutil's error shorthand; E is n_embd here */

#include "experts/experts.h"
#include "quant/quant.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Layer 0 dense (a plain tensor), layers 1.. with X experts of gate/up [E, F, X] (f32 / f16)
 * and down [F, E, X] (f32). A filler tensor of odd size keeps offsets unaligned. */
static void write_model(const char *path, int n_layers, int X, int E, int F) {
    em_err err = {0};
    em_gguf_writer *w;
    assert_int_equal(em_gguf_writer_create(&w, path, NULL, &err), 0);
    int64_t ne_f[1] = {37};
    assert_int_equal(em_gguf_writer_add_tensor(w, "blk.0.ffn_gate.weight", EM_TYPE_F32, 1, ne_f, &err), 0);
    char name[64];
    for (int l = 1; l < n_layers; l++) {
        int64_t gu[3] = {E, F, X}, dn[3] = {F, E, X};
        snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
        assert_int_equal(em_gguf_writer_add_tensor(w, name, EM_TYPE_F32, 3, gu, &err), 0);
        snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", l);
        assert_int_equal(em_gguf_writer_add_tensor(w, name, EM_TYPE_F16, 3, gu, &err), 0);
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", l);
        assert_int_equal(em_gguf_writer_add_tensor(w, name, EM_TYPE_F32, 3, dn, &err), 0);
    }
    uint64_t seed = 0x5eed + (uint64_t)X;
    size_t cap = (size_t)X * (size_t)E * (size_t)F * 4 + 37 * 4;
    uint8_t *buf = malloc(cap);
    for (size_t i = 0; i < cap; i++) buf[i] = (uint8_t)em_test_rand(&seed);
    assert_int_equal(em_gguf_writer_write_tensor(w, "blk.0.ffn_gate.weight", buf, 37 * 4, &err), 0);
    for (int l = 1; l < n_layers; l++) {
        uint64_t b = (uint64_t)X * (uint64_t)E * (uint64_t)F;
        for (size_t i = 0; i < cap; i++) buf[i] = (uint8_t)em_test_rand(&seed);
        snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
        assert_int_equal(em_gguf_writer_write_tensor(w, name, buf, b * 4, &err), 0);
        snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", l);
        assert_int_equal(em_gguf_writer_write_tensor(w, name, buf + 7, b * 2, &err), 0);
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", l);
        assert_int_equal(em_gguf_writer_write_tensor(w, name, buf + 13, b * 4, &err), 0);
    }
    assert_int_equal(em_gguf_writer_finish(w, &err), 0);
    em_gguf_writer_free(w);
    free(buf);
}

typedef struct model {
    em_gguf *g;
    em_expert_store *s;
} model;

static void model_open(model *m, const char *path) {
    em_err err = {0};
    assert_int_equal(em_gguf_open(&m->g, path, &err), 0);
    assert_int_equal(em_expert_store_open(&m->s, m->g, &err), 0);
}

static void model_close(model *m) {
    em_expert_store_close(m->s);
    em_gguf_close(m->g);
}

/* The bytes of (layer, expert, part) as the mapped tensor holds them. */
static const uint8_t *expected(const model *m, int layer, int expert, int part) {
    static const char *const parts[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", layer, parts[part]);
    const em_gguf_tensor *t = em_gguf_find_tensor(m->g, name);
    assert_non_null(t);
    uint64_t per = t->bytes / (uint64_t)t->ne[2];
    return (const uint8_t *)t->data + (uint64_t)expert * per;
}

typedef struct check_ctx {
    const model *m;
    const int *experts;
    int calls, fail_at;
    int *seen;
} check_ctx;

/* The run's callback: every part must equal the tensor's bytes. */
static int check_fn(void *vctx, int i, const em_expert_data *d, em_err *err) {
    check_ctx *c = vctx;
    if (c->fail_at >= 0 && c->calls == c->fail_at) return em_err_set(err, EM_EINVAL, "injected compute failure");
    c->calls++;
    assert_int_equal(d->expert, c->experts[i]);
    if (c->seen) c->seen[i]++;
    const em_expert_layer *L = em_expert_store_layer(c->m->s, d->layer);
    for (int p = 0; p < EM_EXPERT_NPARTS; p++)
        assert_memory_equal(d->part[p], expected(c->m, d->layer, d->expert, p), L->part_bytes[p]);
    return EM_OK;
}

/* The order in which a run calls back (union indices); test-local. */
static int order_buf[16], *order_log, order_n;

static int order_fn(void *vctx, int i, const em_expert_data *d, em_err *err) {
    if (order_log) order_log[order_n++] = i;
    return check_fn(vctx, i, d, err);
}

static int run_checked(em_expert_cache *c, const model *m, int layer, const int *experts, int n,
                       em_err *err) {
    int seen[256] = {0};
    check_ctx cc = {.m = m, .experts = experts, .fail_at = -1, .seen = seen};
    int rc = em_expert_cache_run(c, layer, experts, n, check_fn, &cc, err);
    if (rc == 0) {
        assert_int_equal(cc.calls, n);
        for (int i = 0; i < n; i++) assert_int_equal(seen[i], 1);
    }
    return rc;
}

static uint64_t max_slot(const em_expert_cache *c, const model *m) {
    uint64_t b = 0;
    for (int l = 0; l < em_expert_store_n_layers(m->s); l++)
        if (em_expert_cache_slot_bytes(c, l) > b) b = em_expert_cache_slot_bytes(c, l);
    return b;
}

static void test_store_locates(void **state) {
    (void)state;
    const char *path = em_test_path("m1.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    em_err err = {0};
    assert_int_equal(em_expert_store_n_layers(m.s), 3);
    assert_int_equal(em_expert_store_layer(m.s, 0)->n_expert, 0);
    const em_expert_layer *L = em_expert_store_layer(m.s, 1);
    assert_int_equal(L->n_expert, 8);
    assert_int_equal(L->rows[EM_EXPERT_GATE], 24);
    assert_int_equal(L->cols[EM_EXPERT_GATE], 32);
    assert_int_equal(L->rows[EM_EXPERT_DOWN], 32);
    assert_int_equal(L->part_bytes[EM_EXPERT_UP], 24 * 32 * 2);
    assert_int_equal(em_expert_store_total_bytes(m.s), 2ull * 8 * 24 * 32 * (4 + 2 + 4));
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    uint8_t buf[4096];
    for (int l = 1; l < 3; l++)
        for (int e = 0; e < 8; e++)
            for (int p = 0; p < 3; p++) { /* independent check: pread at the range itself */
                em_expert_range r;
                assert_int_equal(em_expert_store_range(m.s, l, e, p, &r, &err), 0);
                assert_true(r.bytes <= sizeof buf);
                assert_int_equal(pread(fd, buf, r.bytes, (off_t)r.offset), (ssize_t)r.bytes);
                assert_memory_equal(buf, expected(&m, l, e, p), r.bytes);
            }
    close(fd);
    em_expert_range r;
    assert_int_equal(em_expert_store_range(m.s, 1, 8, 0, &r, &err), EM_EINVAL);
    assert_int_equal(em_expert_store_range(m.s, 0, 0, 0, &r, &err), EM_EINVAL);
    model_close(&m);
}

/* Inconsistent stacked shapes are refused with the file and layer named. */
static void test_store_bad_shapes(void **state) {
    (void)state;
    const char *path = em_test_path("bad.gguf");
    em_err err = {0};
    em_gguf_writer *w;
    assert_int_equal(em_gguf_writer_create(&w, path, NULL, &err), 0);
    int64_t gu[3] = {32, 8, 4}, bad_dn[3] = {32, 8, 4};
    assert_int_equal(em_gguf_writer_add_tensor(w, "blk.1.ffn_gate_exps.weight", EM_TYPE_F32, 3, gu, &err), 0);
    assert_int_equal(em_gguf_writer_add_tensor(w, "blk.1.ffn_up_exps.weight", EM_TYPE_F32, 3, gu, &err), 0);
    assert_int_equal(em_gguf_writer_add_tensor(w, "blk.1.ffn_down_exps.weight", EM_TYPE_F32, 3, bad_dn, &err), 0);
    static uint8_t zeros[3 * 32 * 8 * 4 * 4];
    assert_int_equal(em_gguf_writer_write_data(w, zeros, sizeof zeros, &err), 0);
    assert_int_equal(em_gguf_writer_finish(w, &err), 0);
    em_gguf_writer_free(w);
    em_gguf *g;
    em_expert_store *s;
    assert_int_equal(em_gguf_open(&g, path, &err), 0);
    assert_int_equal(em_expert_store_open(&s, g, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "layer 1"));
    assert_non_null(strstr(err.msg, path));
    em_gguf_close(g);
}

/* Every path (io_uring / pread, O_DIRECT / buffered) serves every expert with exact bytes. */
static void test_io_paths(void **state) {
    (void)state;
    const char *path = em_test_path("m2.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    const int modes[2] = {EM_EXPERT_IO_URING, EM_EXPERT_IO_PREAD};
    int all[8] = {7, 0, 3, 5, 1, 6, 2, 4};
    for (int mi = 0; mi < 2; mi++)
        for (int buffered = 0; buffered < 2; buffered++) {
            em_err err = {0};
            em_expert_cache *c;
            em_expert_cache_opts o = {.budget = 1ull << 30, .io = modes[mi], .buffered = buffered};
            int rc = em_expert_cache_create(&c, m.s, &o, &err);
            if (rc == EM_EUNSUPPORTED) {
                print_message("io_uring unavailable here: %s\n", err.msg);
                continue;
            }
            assert_int_equal(rc, 0);
            bool uring, direct;
            em_expert_cache_io_info(c, &uring, &direct);
            print_message("io %s, %s (asked %s)\n", uring ? "io_uring" : "pread",
                          direct ? "O_DIRECT" : "buffered", buffered ? "buffered" : "direct");
            assert_int_equal(uring, mi == 0);
            if (buffered) assert_false(direct);
            for (int l = 1; l < 3; l++) assert_int_equal(run_checked(c, &m, l, all, 8, &err), 0);
            em_expert_stats st;
            em_expert_cache_stats(c, -1, &st);
            assert_int_equal(st.misses, 16);
            assert_int_equal(st.reads, 48);
            em_expert_cache_free(c);
        }
    model_close(&m);
}

static void test_union_dedup(void **state) {
    (void)state;
    em_arena *a;
    em_err err = {0};
    assert_int_equal(em_arena_create(&a, 1 << 16, &err), 0);
    const int ids[8] = {1, 3, 3, 1, 1, 5, 5, 7};
    const float w[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    em_route_union u;
    assert_int_equal(em_route_union_build(&u, ids, w, 4, 2, 8, a, &err), 0);
    assert_int_equal(u.n, 4);
    const int ex[4] = {1, 3, 5, 7}, st[5] = {0, 3, 5, 7, 8};
    const int rows[8] = {0, 1, 2, 0, 1, 2, 3, 3};
    const float ws[8] = {0.1f, 0.4f, 0.5f, 0.2f, 0.3f, 0.6f, 0.7f, 0.8f};
    for (int i = 0; i < 4; i++) assert_int_equal(u.expert[i], ex[i]);
    for (int i = 0; i < 5; i++) assert_int_equal(u.start[i], st[i]);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(u.row[i], rows[i]);
        assert_true(u.weight[i] == ws[i]);
    }
    const int bad[2] = {1, 8};
    assert_int_equal(em_route_union_build(&u, bad, NULL, 1, 2, 8, a, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "expert 8"));

    /* each expert of the union is read once: byte counters equal the miss hint */
    const char *path = em_test_path("m3.gguf");
    write_model(path, 2, 8, 32, 24);
    model m;
    model_open(&m, path);
    em_expert_cache *c;
    em_expert_cache_opts o = {.budget = 1ull << 30};
    assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
    assert_int_equal(em_route_union_build(&u, ids, w, 4, 2, 8, a, &err), 0);
    uint64_t hint = em_expert_cache_miss_bytes(c, 1, u.expert, u.n);
    uint64_t want = 0, got = 0, fsize = em_gguf_shard_at(m.g, 0)->file_size;
    for (int i = 0; i < u.n; i++)
        for (int p = 0; p < 3; p++) { /* widened to the alignment; the file's end clips reads */
            em_expert_range r;
            em_expert_store_range(m.s, 1, u.expert[i], p, &r, &err);
            uint64_t a0 = r.offset / EM_DIRECT_ALIGN * EM_DIRECT_ALIGN;
            uint64_t a1 = em_align_up(r.offset + r.bytes, EM_DIRECT_ALIGN);
            want += a1 - a0;
            got += (a1 < fsize ? a1 : fsize) - a0;
        }
    assert_int_equal(hint, want);
    assert_int_equal(run_checked(c, &m, 1, u.expert, u.n, &err), 0);
    em_expert_stats s;
    em_expert_cache_stats(c, 1, &s);
    assert_int_equal(s.misses, 4);
    assert_int_equal(s.reads, 12);
    assert_int_equal(s.bytes_read, got);
    assert_int_equal(em_expert_cache_miss_bytes(c, 1, u.expert, u.n), 0);
    assert_int_equal(run_checked(c, &m, 1, u.expert, u.n, &err), 0); /* all hits now */
    em_expert_cache_stats(c, -1, &s);
    assert_int_equal(s.hits, 4);
    assert_int_equal(s.bytes_read, got);
    /* estimate: 8 of 8 experts held -> nothing to read; after a miss of 4 of them, more */
    assert_true(em_expert_cache_estimate(c, 4, 2) > 0); /* 4 of 8 held */
    /* cache-first: of {0, 1, 2, 3, 5} the held 1, 3, 5 are computed before the misses 0, 2 */
    const int mixed[5] = {0, 1, 2, 3, 5};
    int order[5] = {0};
    check_ctx oc = {.m = &m, .experts = mixed, .fail_at = -1, .seen = order};
    order_log = order_buf, order_n = 0;
    assert_int_equal(em_expert_cache_run(c, 1, mixed, 5, order_fn, &oc, &err), 0);
    assert_int_equal(order_n, 5);
    for (int i = 0; i < 3; i++) assert_true(order_buf[i] == 1 || order_buf[i] == 3 || order_buf[i] == 4);
    order_log = NULL;
    const int dup[2] = {2, 2};
    assert_int_equal(em_expert_cache_run(c, 1, dup, 2, check_fn, NULL, &err), EM_EINVAL);
    em_expert_cache_free(c);
    model_close(&m);
    em_arena_free(a);
}

/* Budgets from one slot to all experts: never above budget, always the right bytes, and a
 * budget smaller than a layer's union still works. */
static void test_budget(void **state) {
    (void)state;
    const char *path = em_test_path("m4.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    em_err err = {0};
    em_expert_cache *c;
    em_expert_cache_opts o = {.budget = 1};
    assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "smaller than one expert"));
    o.budget = 1ull << 30;
    assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
    uint64_t slot = max_slot(c, &m);
    em_expert_cache_free(c);
    for (int policy = 0; policy < 2; policy++)
        for (uint64_t b = 1; b <= 16; b++) {
            o = (em_expert_cache_opts){.budget = b * slot, .policy = policy, .buffered = b % 2 == 0};
            assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
            uint64_t seed = 99 + b;
            int accesses = 0;
            for (int step = 0; step < 40; step++) {
                int ex[8], n = 1 + (int)(em_test_rand(&seed) % 8), used = 0;
                for (int e = 0; e < 8 && used < n; e++) /* a random subset */
                    if (em_test_rand(&seed) % 2) ex[used++] = e;
                int layer = 1 + (int)(em_test_rand(&seed) % 2);
                assert_int_equal(run_checked(c, &m, layer, ex, used, &err), 0);
                accesses += used;
                assert_true(em_expert_cache_used(c) <= b * slot);
                assert_true(em_expert_cache_count(c) <= (int)b);
            }
            em_expert_stats s;
            em_expert_cache_stats(c, -1, &s);
            assert_int_equal(s.hits + s.misses, (uint64_t)accesses);
            if (b >= 16) assert_true(s.misses <= 16); /* all 16 experts fit: each missed once */
            em_expert_cache_free(c);
        }
    model_close(&m);
}

/* Zipf-like ranks over a per-layer permutation that changes every `phase` tokens. */
static void trace_policy(const model *m, int policy, double halflife, uint64_t budget_slots,
                         double *hit_rate) {
    em_err err = {0};
    em_expert_cache *c;
    em_expert_cache_opts o = {.budget = 1ull << 30};
    assert_int_equal(em_expert_cache_create(&c, m->s, &o, &err), 0);
    uint64_t slot = max_slot(c, m);
    em_expert_cache_free(c);
    o = (em_expert_cache_opts){.budget = budget_slots * slot, .policy = policy, .lfu_halflife = halflife,
                               .buffered = true}; /* page cache: policy, not I/O, is measured */
    assert_int_equal(em_expert_cache_create(&c, m->s, &o, &err), 0);
    enum { X = 64, K = 4, TOKENS = 1500, PHASE = 500, LAYERS = 2 };
    double cdf[X], z = 0;
    for (int r = 0; r < X; r++) z += 1.0 / (r + 1.0);
    for (int r = 0; r < X; r++) cdf[r] = (r ? cdf[r - 1] : 0) + 1.0 / (r + 1.0) / z;
    uint64_t seed = 4242;
    int perm[LAYERS][X];
    for (int t = 0; t < TOKENS; t++) {
        if (t % PHASE == 0)
            for (int l = 0; l < LAYERS; l++) {
                for (int i = 0; i < X; i++) perm[l][i] = i;
                for (int i = X - 1; i > 0; i--) {
                    int j = (int)(em_test_rand(&seed) % (uint64_t)(i + 1)), tmp = perm[l][i];
                    perm[l][i] = perm[l][j], perm[l][j] = tmp;
                }
            }
        for (int l = 0; l < LAYERS; l++) {
            int ex[K], n = 0;
            while (n < K) {
                double u = (double)(em_test_rand(&seed) >> 11) / 9007199254740992.0;
                int r = 0;
                while (r < X - 1 && cdf[r] < u) r++;
                int e = perm[l][r];
                bool dup = false;
                for (int i = 0; i < n; i++) dup |= ex[i] == e;
                if (!dup) ex[n++] = e;
            }
            assert_int_equal(run_checked(c, m, l + 1, ex, K, &err), 0);
        }
    }
    em_expert_stats s;
    em_expert_cache_stats(c, -1, &s);
    *hit_rate = (double)s.hits / (double)(s.hits + s.misses);
    em_expert_cache_free(c);
}

static void test_policies(void **state) {
    (void)state;
    const char *path = em_test_path("m5.gguf");
    write_model(path, 3, 64, 32, 8);
    model m;
    model_open(&m, path);
    const uint64_t budgets[3] = {16, 32, 64};
    for (int b = 0; b < 3; b++) {
        double lru, lfu[4];
        trace_policy(&m, EM_EXPERT_LRU, 0, budgets[b], &lru);
        for (int h = 0; h < 4; h++)
            trace_policy(&m, EM_EXPERT_LFU, h == 2 ? 0 : (double)(budgets[b] << (h + 1)), budgets[b],
                         &lfu[h]); /* 0: the default, 8 x slots */
        print_message("zipf(1) trace, 2 layers x 64 experts, top-4, 1500 tokens, 3 phases, budget %llu "
                      "slots: hit rate LRU %.3f, LFU halflife 2/4/8/16 x slots %.3f %.3f %.3f %.3f\n",
                      (unsigned long long)budgets[b], lru, lfu[0], lfu[1], lfu[2], lfu[3]);
        double lfu_short = lfu[0], lfu_long = lfu[3];
        assert_true(lru > 0.0 && lfu_short > 0.0 && lfu_long > 0.0);
        assert_true(lfu[2] > lru); /* the default policy wins on this (deterministic) trace */
    }
    model_close(&m);
}

/* A copy of a model file whose store reads the copy, so that the copy can shrink under it; the
 * original's mapping (m.g) stays the reference for the bytes. */
typedef struct copied {
    model m;
    const char *path;
    void *orig;
    size_t n;
} copied;

static void copy_open(copied *cp, const model *m, const char *src, const char *name) {
    em_err err = {0};
    cp->orig = em_test_read(src, &cp->n);
    cp->path = em_test_path(name);
    em_test_write(cp->path, cp->orig, cp->n);
    em_gguf *gc;
    cp->m = (model){.g = m->g};
    assert_int_equal(em_gguf_open(&gc, cp->path, &err), 0);
    assert_int_equal(em_expert_store_open(&cp->m.s, gc, &err), 0);
    em_gguf_close(gc); /* the store keeps no reference */
}

static void copy_shrink(const copied *cp) { assert_int_equal(truncate(cp->path, (off_t)(cp->n / 2)), 0); }

static void copy_restore(const copied *cp) { /* in place: same inode, same descriptors */
    int fd = open(cp->path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, cp->orig, cp->n, 0), (ssize_t)cp->n);
    close(fd);
}

static void copy_close(copied *cp) {
    em_expert_store_close(cp->m.s);
    free(cp->orig);
}

/* Faults: each fails the run naming file and offset, leaves no partial entry or pin, and the
 * next run succeeds. */
static void test_faults(void **state) {
    (void)state;
    const char *path = em_test_path("m6.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    const int modes[2] = {EM_EXPERT_IO_AUTO, EM_EXPERT_IO_PREAD};
    const int all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int mi = 0; mi < 2; mi++) {
        em_err err = {0};
        em_expert_cache *c;
        em_expert_cache_opts o = {.budget = 1ull << 30, .io = modes[mi]};
        assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
        assert_int_equal(run_checked(c, &m, 1, all, 3, &err), 0); /* 0..2 resident */
        const int kinds[2] = {EM_EXPERT_FAULT_EIO, EM_EXPERT_FAULT_SHORT};
        for (int k = 0; k < 2; k++) {
            em_expert_cache_fault_arm(c, kinds[k], 4);
            int before = em_expert_cache_count(c);
            memset(&err, 0, sizeof err);
            assert_int_not_equal(run_checked(c, &m, 1, all, 8, &err), 0);
            print_message("injected %s: %s\n", k ? "short read" : "EIO", err.msg);
            assert_non_null(strstr(err.msg, path));
            assert_non_null(strstr(err.msg, "offset"));
            assert_non_null(strstr(err.msg, k ? "short read" : "Input/output error"));
            assert_int_equal(em_expert_cache_count(c), before);
            for (int e = 3; e < 8; e++) assert_false(em_expert_cache_holds(c, 1, e));
            assert_int_equal(run_checked(c, &m, 1, all, 8, &err), 0);
            assert_int_equal(em_expert_cache_count(c), 8);
            /* a failure of the compute callback also leaves no pin: a 1-slot budget run works */
            check_ctx cc = {.m = &m, .experts = all, .fail_at = 1};
            assert_int_equal(em_expert_cache_run(c, 2, all, 8, check_fn, &cc, &err), EM_EINVAL);
            assert_int_equal(run_checked(c, &m, 2, all, 8, &err), 0);
            em_expert_cache_stats_reset(c);
            em_expert_cache_free(c); /* a fresh cache for the next kind */
            assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
            assert_int_equal(run_checked(c, &m, 1, all, 3, &err), 0);
        }
        em_expert_cache_free(c);
    }
    /* a file that shrank after load (a truncated mapping would fault: the store reads a copy) */
    copied cp;
    copy_open(&cp, &m, path, "m6copy.gguf");
    em_err err = {0};
    em_expert_cache *c;
    em_expert_cache_opts o = {.budget = 1ull << 30};
    assert_int_equal(em_expert_cache_create(&c, cp.m.s, &o, &err), 0);
    assert_int_equal(run_checked(c, &cp.m, 1, all, 8, &err), 0);
    copy_shrink(&cp);
    assert_int_not_equal(run_checked(c, &cp.m, 2, all, 8, &err), 0);
    print_message("file shrank: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "shrank"));
    assert_non_null(strstr(err.msg, cp.path));
    for (int e = 0; e < 8; e++) assert_false(em_expert_cache_holds(c, 2, e));
    assert_int_equal(run_checked(c, &cp.m, 1, all, 8, &err), 0); /* resident ones still serve */
    copy_restore(&cp);
    assert_int_equal(run_checked(c, &cp.m, 2, all, 8, &err), 0);
    em_expert_cache_free(c);
    copy_close(&cp);
    model_close(&m);
}

/* ---- read-ahead ------------------------------------------------------------------------ */

static em_expert_ref ref_of(int layer, int expert) { return (em_expert_ref){layer, expert}; }

/* Reads ahead within half the budget, in list order; runs find what was read ahead (counted
 * as hits and used), wait for it, and hand over the same bytes; without io_uring nothing is
 * read ahead; bad references are refused. */
static void test_prefetch(void **state) {
    (void)state;
    const char *path = em_test_path("m7.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    const int modes[2] = {EM_EXPERT_IO_AUTO, EM_EXPERT_IO_PREAD};
    for (int mi = 0; mi < 2; mi++) {
        em_err err = {0};
        em_expert_cache *c;
        em_expert_cache_opts o = {.budget = 1ull << 30, .io = modes[mi], .policy = EM_EXPERT_LRU};
        assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
        const uint64_t slot = max_slot(c, &m);
        em_expert_cache_free(c);
        o.budget = 6 * slot;
        assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
        bool uring;
        em_expert_cache_io_info(c, &uring, NULL);
        em_expert_ref bad[2] = {ref_of(1, 8), ref_of(0, 0)};
        for (int b = 0; b < 2; b++) {
            assert_int_equal(em_expert_cache_prefetch(c, &bad[b], 1, 2, &err), EM_EINVAL);
            assert_non_null(strstr(err.msg, "no such routed expert"));
        }
        assert_int_equal(em_expert_cache_prefetch(c, bad, 0, 0, &err), EM_EINVAL); /* no chain */
        assert_non_null(strstr(err.msg, "0 chains"));
        em_expert_cache_predict(c);
        const em_expert_ref list[5] = {ref_of(1, 0), ref_of(1, 1), ref_of(2, 2), ref_of(2, 3), ref_of(1, 4)};
        int done = em_expert_cache_prefetch(c, list, 5, 2, &err);
        assert_int_equal(done, uring ? 3 : 0); /* half of 6 slots: three experts in flight */
        assert_true(em_expert_cache_used(c) <= o.budget);
        const int l1[3] = {0, 1, 5};
        assert_int_equal(run_checked(c, &m, 1, l1, 3, &err), 0);
        em_expert_stats st;
        em_expert_cache_stats(c, -1, &st);
        assert_int_equal(st.prefetch_used, uring ? 2 : 0);
        assert_int_equal(st.misses, uring ? 1 : 3);
        assert_int_equal(st.hits, uring ? 2 : 0);
        /* the run used two of them: the share has room for the rest */
        assert_int_equal(em_expert_cache_prefetch(c, list + 2, 3, 1, &err), uring ? 3 : 0);
        const int l2[2] = {3, 2};
        assert_int_equal(run_checked(c, &m, 2, l2, 2, &err), 0);
        em_expert_cache_stats(c, -1, &st);
        assert_int_equal(st.prefetch_used, uring ? 4 : 0);
        assert_true(uring ? st.prefetched >= 4 : st.prefetched == 0); /* (1, 4) may be in flight */
        assert_int_equal(st.reads, 3 * (st.misses + st.prefetched));
        /* leaving with a read still in flight is safe (the cache waits for it) */
        em_expert_cache_predict(c);
        const em_expert_ref more[2] = {ref_of(2, 6), ref_of(2, 7)};
        assert_int_equal(em_expert_cache_prefetch(c, more, 2, 2, &err), uring ? 2 : 0);
        em_expert_cache_free(c);
    }
    model_close(&m);
}

/* Random read-aheads between random runs at every budget from 1 to 9 slots: the budget holds
 * at all times, every run hands over the file's bytes, and hits + misses count the runs'
 * experts. */
static void test_prefetch_budget(void **state) {
    (void)state;
    const char *path = em_test_path("m8.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    em_err err = {0};
    em_expert_cache *c;
    em_expert_cache_opts o = {.budget = 1ull << 30};
    assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
    const uint64_t slot = max_slot(c, &m);
    em_expert_cache_free(c);
    uint64_t prefetched = 0;
    for (int policy = 0; policy < 2; policy++)
        for (uint64_t b = 1; b <= 9; b++) {
            o = (em_expert_cache_opts){.budget = b * slot, .policy = policy};
            assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
            uint64_t seed = 7 + b;
            int accesses = 0;
            for (int step = 0; step < 60; step++) {
                if (em_test_rand(&seed) % 3 == 0) em_expert_cache_predict(c);
                em_expert_ref list[8];
                int nl = (int)(em_test_rand(&seed) % 9);
                for (int i = 0; i < nl; i++)
                    list[i] = ref_of(1 + (int)(em_test_rand(&seed) % 2), (int)(em_test_rand(&seed) % 8));
                int done = em_expert_cache_prefetch(c, list, nl, 1 + (int)(em_test_rand(&seed) % 3), &err);
                assert_true(done >= 0 && done <= nl);
                assert_true(em_expert_cache_used(c) <= b * slot);
                int ex[8], n = 1 + (int)(em_test_rand(&seed) % 8), used = 0;
                for (int e = 0; e < 8 && used < n; e++)
                    if (em_test_rand(&seed) % 2) ex[used++] = e;
                assert_int_equal(run_checked(c, &m, 1 + (int)(em_test_rand(&seed) % 2), ex, used, &err), 0);
                accesses += used;
                assert_true(em_expert_cache_used(c) <= b * slot);
            }
            em_expert_stats s;
            em_expert_cache_stats(c, -1, &s);
            assert_int_equal(s.hits + s.misses, (uint64_t)accesses);
            assert_true(s.prefetch_used <= s.prefetched);
            prefetched += s.prefetched;
            em_expert_cache_free(c);
        }
    bool uring;
    assert_int_equal(em_expert_cache_create(&c, m.s, &o, &err), 0);
    em_expert_cache_io_info(c, &uring, NULL);
    em_expert_cache_free(c);
    if (uring) assert_true(prefetched > 0);
    model_close(&m);
}

/* A read-ahead that fails (the file shrank) is dropped unseen; the run that needs the expert
 * reads it and reports the failure, naming the file; restored, the same run works. */
static void test_prefetch_fault(void **state) {
    (void)state;
    const char *path = em_test_path("m9.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    copied cp;
    copy_open(&cp, &m, path, "m9copy.gguf");
    em_err err = {0};
    em_expert_cache *c;
    em_expert_cache_opts o = {.budget = 1ull << 30};
    assert_int_equal(em_expert_cache_create(&c, cp.m.s, &o, &err), 0);
    copy_shrink(&cp);
    em_expert_cache_predict(c);
    const em_expert_ref list[3] = {ref_of(2, 5), ref_of(2, 6), ref_of(2, 7)};
    assert_true(em_expert_cache_prefetch(c, list, 3, 2, &err) >= 0);
    const int want[3] = {5, 6, 7};
    assert_int_not_equal(run_checked(c, &cp.m, 2, want, 3, &err), 0);
    print_message("read ahead from a file that shrank: %s\n", err.msg);
    assert_non_null(strstr(err.msg, cp.path));
    for (int e = 5; e < 8; e++) assert_false(em_expert_cache_holds(c, 2, e));
    copy_restore(&cp);
    assert_int_equal(run_checked(c, &cp.m, 2, want, 3, &err), 0);
    em_expert_cache_free(c);
    copy_close(&cp);
    model_close(&m);
}

/* ---- provider ------------------------------------------------------------------------- */

/* The file's expert tensors as a model hands them to a provider (layer 0 has none). */
static void src_of(const model *m, int n_layers, int X, em_experts_src *src) {
    static const char *const parts[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    memset(src, 0, (size_t)n_layers * sizeof *src);
    for (int l = 1; l < n_layers; l++) {
        src[l].n_expert = X;
        for (int p = 0; p < 3; p++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, parts[p]);
            const em_gguf_tensor *t = em_gguf_find_tensor(m->g, name);
            assert_non_null(t);
            assert_int_equal(em_mat_init(&src[l].part[p], t->type, t->ne[1] * t->ne[2], t->ne[0], t->data, NULL), 0);
        }
    }
}

typedef struct view_ctx {
    const model *m;
    const int *experts;
    int seen[64];
    bool mapped; /* resident: the views must point into the mapping itself */
} view_ctx;

/* A run's callback: each view is its expert's rows of the model's matrices, with their bytes. */
static int view_fn(void *vctx, const int *idx, const em_expert_view *v, int n, em_err *err) {
    (void)err;
    view_ctx *c = vctx;
    for (int j = 0; j < n; j++) {
        assert_int_equal(v[j].expert, c->experts[idx[j]]);
        c->seen[idx[j]]++;
        const em_expert_layer *L = em_expert_store_layer(c->m->s, v[j].layer);
        for (int p = 0; p < EM_EXPERT_NPARTS; p++) {
            const em_mat *mp = &v[j].part[p];
            assert_int_equal(mp->type, L->type[p]);
            assert_int_equal(mp->rows, L->rows[p]);
            assert_int_equal(mp->cols, L->cols[p]);
            assert_int_equal(mp->row_bytes, L->row_bytes[p]);
            const uint8_t *want = expected(c->m, v[j].layer, v[j].expert, p);
            assert_memory_equal(mp->data, want, L->part_bytes[p]);
            if (c->mapped) assert_ptr_equal(mp->data, want);
        }
    }
    return EM_OK;
}

static int run_views(em_experts *x, const model *m, int layer, const int *experts, int n, bool mapped, em_err *err) {
    view_ctx c = {.m = m, .experts = experts, .mapped = mapped};
    int rc = em_experts_run(x, layer, experts, n, 4, 2, view_fn, &c, err);
    for (int i = 0; rc == 0 && i < n; i++) assert_int_equal(c.seen[i], 1);
    return rc;
}

/* The storage policy: AUTO is resident when everything fits in 90% of the memory available
 * (or that is unknown), a model without routed experts is always resident, and the default
 * budget is half of what the resident part leaves, clamped to one slot .. every slot. */
static void test_provider_policy(void **state) {
    (void)state;
    const uint64_t G = 1ull << 30;
    assert_int_equal(em_experts_choose_storage(EM_EXPERTS_AUTO, 9 * G, G, 10 * G), EM_EXPERTS_RESIDENT);
    assert_int_equal(em_experts_choose_storage(EM_EXPERTS_AUTO, 9 * G + 1, G, 10 * G), EM_EXPERTS_SSD);
    assert_int_equal(em_experts_choose_storage(EM_EXPERTS_AUTO, 90 * G, G, 0), EM_EXPERTS_RESIDENT);
    assert_int_equal(em_experts_choose_storage(EM_EXPERTS_AUTO, 90 * G, 0, G), EM_EXPERTS_RESIDENT);
    assert_int_equal(em_experts_choose_storage(EM_EXPERTS_SSD, G, G, 10 * G), EM_EXPERTS_SSD);
    assert_int_equal(em_experts_choose_storage(EM_EXPERTS_SSD, G, 0, 10 * G), EM_EXPERTS_RESIDENT);
    assert_int_equal(em_experts_choose_storage(EM_EXPERTS_RESIDENT, 90 * G, G, G), EM_EXPERTS_RESIDENT);

    const char *path = em_test_path("m7.gguf");
    write_model(path, 3, 8, 32, 24); /* parts of 3072, 1536, 3072 bytes: slots of 3 x 8 KiB bound */
    model m;
    model_open(&m, path);
    const uint64_t slot = 3 * 8192, all = slot * 8 * 2;
    assert_int_equal(em_experts_default_budget(m.s, 1000, 0), slot);
    assert_int_equal(em_experts_default_budget(m.s, 1000, 500), slot);
    assert_int_equal(em_experts_default_budget(m.s, 1000, 1000 + 2 * 5 * slot), 5 * slot);
    assert_int_equal(em_experts_default_budget(m.s, 1000, 1000 + 3 * all), all);
    model_close(&m);
}

/* A provider over the model's tensors: resident views are the mapped rows themselves, SSD
 * views hold the same bytes from the cache, and the counters, cost hints, fault shim and
 * argument checks behave per mode. */
static void test_provider_runs(void **state) {
    (void)state;
    const char *path = em_test_path("m8.gguf");
    write_model(path, 3, 8, 32, 24);
    model m;
    model_open(&m, path);
    em_experts_src src[3];
    src_of(&m, 3, 8, src);
    em_err err = {0};
    em_experts *x;
    const uint64_t slot = 3 * 8192;
    for (int mode = EM_EXPERTS_RESIDENT; mode <= EM_EXPERTS_SSD; mode++) {
        const em_experts_opts o = {.storage = mode, .cache_bytes = 3 * slot};
        assert_int_equal(em_experts_open(&x, m.g, src, 3, &o, &err), 0);
        uint64_t seed = 7, uses = 0;
        for (int step = 0; step < 30; step++) {
            int ex[8], used = 0;
            for (int e = 0; e < 8; e++)
                if (em_test_rand(&seed) % 2) ex[used++] = e;
            const int layer = 1 + step % 2;
            assert_int_equal(run_views(x, &m, layer, ex, used, mode == EM_EXPERTS_RESIDENT, &err), 0);
            uses += (uint64_t)used;
        }
        em_experts_counts c, c1, c2;
        em_experts_stats(x, -1, &c);
        em_experts_stats(x, 1, &c1);
        em_experts_stats(x, 2, &c2);
        assert_int_equal(c.storage, mode);
        assert_int_equal(c.n_experts, 16);
        assert_int_equal(c.hits + c.misses, uses);
        assert_int_equal(c1.hits + c1.misses + c2.hits + c2.misses, uses);
        double sec;
        const uint64_t cost = em_experts_cost(x, 4, 2, &sec);
        if (mode == EM_EXPERTS_RESIDENT) {
            assert_int_equal(c.misses, 0);
            assert_int_equal(c.bytes_read, 0);
            assert_int_equal(c.file_bytes, 0);
            assert_int_equal(cost, 0);
            assert_true(sec == 0.0);
            assert_int_equal(em_experts_fault_arm(x, EM_EXPERT_FAULT_EIO, 0, &err), EM_EUNSUPPORTED);
        } else {
            assert_true(c.misses > 0 && c.bytes_read > 0);
            assert_int_equal(c.file_bytes, 2 * 8 * (3072 + 1536 + 3072));
            assert_int_equal(c.cache_budget, 3 * slot);
            assert_true(c.cache_bytes <= c.cache_budget);
            assert_true(cost > 0 && sec > 0.0);
            assert_int_equal(em_experts_fault_arm(x, 7, 0, &err), EM_EINVAL);
            assert_int_equal(em_experts_fault_arm(x, EM_EXPERT_FAULT_EIO, 0, &err), 0);
            const int all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
            assert_int_equal(run_views(x, &m, 1, all, 8, false, &err), EM_EIO);
            assert_non_null(strstr(err.msg, "Input/output error"));
            assert_int_equal(run_views(x, &m, 1, all, 8, false, &err), 0); /* the next run works */
        }
        const int bad[1] = {8};
        assert_int_equal(em_experts_run(x, 0, bad, 0, 1, 1, view_fn, NULL, &err), EM_EINVAL); /* dense layer */
        assert_non_null(strstr(err.msg, "layer 0"));
        assert_int_not_equal(em_experts_run(x, 1, bad, 1, 1, 1, view_fn, NULL, &err), 0);
        em_experts_close(x);
    }
    assert_int_equal(em_experts_fault_arm(NULL, EM_EXPERT_FAULT_EIO, 0, &err), EM_EUNSUPPORTED);
    em_experts_opts o = {.storage = 9};
    assert_int_equal(em_experts_open(&x, m.g, src, 3, &o, &err), EM_EINVAL);
    assert_null(x);
    /* the cache must serve the model's matrices: a table that disagrees with the file fails */
    src[2].n_expert = 4;
    o = (em_experts_opts){.storage = EM_EXPERTS_SSD};
    assert_int_equal(em_experts_open(&x, m.g, src, 3, &o, &err), EM_EFORMAT);
    print_message("mismatch: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "layer 2"));
    assert_non_null(strstr(err.msg, path));
    model_close(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_locates), cmocka_unit_test(test_store_bad_shapes),
        cmocka_unit_test(test_io_paths),
        cmocka_unit_test(test_union_dedup),   cmocka_unit_test(test_budget),
        cmocka_unit_test(test_policies),      cmocka_unit_test(test_faults),
        cmocka_unit_test(test_prefetch),      cmocka_unit_test(test_prefetch_budget),
        cmocka_unit_test(test_prefetch_fault),
        cmocka_unit_test(test_provider_policy), cmocka_unit_test(test_provider_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
