/* Routed experts through experts/ (model/moe.c): the kimi fixtures converted by the CLI, run
 * resident and from storage (--moe-storage ssd) with every cache budget from one expert slot
 * to all of them, with and without read-ahead, through prefill, decoding (verify 1 + commit 1)
 * and verify(n) + commit(k).
 *
 *  - logits: SSD runs are bit-identical (memcmp) to the resident run, at every budget;
 *  - counters: hits + misses = expert uses (one use = one distinct expert of one MoE layer in
 *    one forward step, counted independently from the routes the target reports); three
 *    reads per miss and per expert read ahead; bytes read lie between those counts x an
 *    expert's file bytes and x its cache slot; with room for every expert each (layer,
 *    expert) ever used is read exactly once, by a miss or ahead (the route union reads an
 *    expert shared by rows once); read-ahead happens and is used; resident mode counts every
 *    use as a hit and reads nothing;
 *  - cost hints: storage bytes only in SSD mode, growing with the verify width, zero once
 *    the cache holds every expert;
 *  - faults: an injected EIO / short read fails verify and prefill with a message naming the
 *    file and offset; verify leaves the committed state as it was and prefill resets it; the
 *    next calls give the reference logits;
 *  - bad options and CLI flag values are clear errors; `ember run --json` reports the
 *    counters. */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/experts.h"
#include "model/model.h"

static const char *const convs[][2] = {
    { "kimi_a", "q8_0" }, { "kimi_a", "f32" }, { "kimi_c", "q8_0" }, { "kimi_c", "f32" },
};
#define N_CONVS 4
static char paths[N_CONVS][600];
static const char *bin;
static bool have_models;

static int setup(void **state) {
    (void)state;
    bin = getenv("EMBER_BIN");
    if (!bin) {
        fprintf(stderr, "EMBER_BIN is not set: model tests are skipped\n");
        return 0;
    }
    for (int i = 0; i < N_CONVS; i++)
        if (em_test_convert_fixture(bin, convs[i][0], convs[i][1], paths[i], sizeof paths[i])) return -1;
    have_models = true;
    return 0;
}

#define NEED_MODELS()        \
    do {                     \
        if (!have_models) {  \
            skip();          \
        }                    \
    } while (0)

static em_target *open_model_ahead(const char *path, int storage, uint64_t budget, bool ahead) {
    em_model_opts o = { .n_threads = 2, .moe_storage = storage, .expert_cache_bytes = budget,
                        .expert_no_prefetch = !ahead };
    em_target *t = NULL;
    em_err err = { 0 };
    if (em_model_open(&t, path, &o, &err)) fail_msg("open %s: %s", path, err.msg);
    return t;
}

static em_target *open_model(const char *path, int storage, uint64_t budget) {
    return open_model_ahead(path, storage, budget, false);
}

/* ---- the scenario: prefill, decoding, verify + commit -------------------------------------- */

#define MAX_ROWS 64
#define MAX_EXPERTS 64
#define MAX_LAYERS 16

typedef struct record {
    float *logits;   /* all rows' logits, in call order */
    int rows;
    uint64_t uses;   /* distinct experts per MoE layer per forward step */
    bool used[MAX_LAYERS][MAX_EXPERTS]; /* [moe layer][expert] ever used */
    int n_used;
} record;

/* Counts the uses of one forward step of n rows from its reported routes. */
static void count_uses(record *r, const em_target_info *info, const int32_t *routes, int n) {
    const int k = info->n_route / info->n_moe_layers;
    for (int m = 0; m < info->n_moe_layers; m++) {
        bool seen[MAX_EXPERTS] = { 0 };
        for (int t = 0; t < n; t++)
            for (int i = 0; i < k; i++) {
                int e = routes[t * info->n_route + m * k + i];
                assert_true(e >= 0 && e < MAX_EXPERTS);
                if (!seen[e]) r->uses++;
                seen[e] = true;
                if (!r->used[m][e]) r->n_used++;
                r->used[m][e] = true;
            }
    }
}

/* verify (or prefill) n rows from tok, recording logits and uses. */
static int forward(em_target *t, record *r, const int32_t *tok, int n, bool prefill, em_err *err) {
    const em_target_info *info = em_target_get_info(t);
    int32_t routes[MAX_ROWS * 64];
    assert_true(n * info->n_route <= (int)(sizeof routes / sizeof routes[0]));
    assert_true(r->rows + n <= MAX_ROWS);
    em_rows out = { .logits = r->logits + (size_t)r->rows * (size_t)info->n_vocab, .routes = routes };
    int rc = prefill ? EM_OK : em_target_prefetch(t, tok, n, err); /* as the loop does while drafting */
    if (!rc) rc = prefill ? em_target_prefill(t, tok, n, &out, err) : em_target_verify(t, tok, n, &out, err);
    if (rc) return rc;
    r->rows += n;
    count_uses(r, info, routes, n);
    return EM_OK;
}

static void scenario(em_target *t, record *r) {
    const em_target_info *info = em_target_get_info(t);
    int32_t tok[40];
    uint64_t seed = 77;
    for (int i = 0; i < 40; i++) tok[i] = (int32_t)(em_test_rand(&seed) % (uint64_t)info->n_vocab);
    memset(r, 0, sizeof *r);
    r->logits = calloc((size_t)MAX_ROWS * (size_t)info->n_vocab, sizeof(float));
    assert_non_null(r->logits);
    int at = 0;
    OK(forward(t, r, tok, 9, true, E));
    at += 9;
    for (int i = 0; i < 3; i++, at++) { /* plain decoding */
        OK(forward(t, r, tok + at, 1, false, E));
        OK(em_target_commit(t, 1, E));
    }
    OK(forward(t, r, tok + at, 6, false, E)); /* verify 6, keep 2 */
    OK(em_target_commit(t, 2, E));
    at += 2;
    OK(forward(t, r, tok + at, 4, false, E));
    OK(em_target_commit(t, 4, E));
    at += 4;
    OK(forward(t, r, tok + at, 3, false, E)); /* superseded by the next verify */
    OK(forward(t, r, tok + at, 2, false, E));
    OK(em_target_commit(t, 1, E));
    at += 1;
    /* wider than max_verify (16): the commit replays the 5 kept tokens from the same state,
     * so its routes are the verify's first 5 rows' */
    int32_t routes[MAX_ROWS * 64];
    em_rows out = { .logits = r->logits + (size_t)r->rows * (size_t)info->n_vocab, .routes = routes };
    OK(em_target_verify(t, tok + at, 18, &out, E));
    r->rows += 18;
    count_uses(r, info, routes, 18);
    OK(em_target_commit(t, 5, E));
    count_uses(r, info, routes, 5);
    assert_int_equal(t->stats.full_replays, 1);
    assert_int_equal(em_target_position(t), 9 + 3 + 2 + 4 + 1 + 5);
}

static em_target_expert_counts counts(const em_target *t) {
    em_target_expert_counts c;
    OK(em_target_expert_stats(t, -1, &c, E));
    return c;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_bit_identical(void **state) {
    (void)state;
    NEED_MODELS();
    for (int m = 0; m < N_CONVS; m++) {
        em_target *t = open_model(paths[m], EM_MOE_RESIDENT, 0);
        const em_target_info info_copy = *em_target_get_info(t), *info = &info_copy;
        const int n_moe = info->n_moe_layers, V = info->n_vocab;
        record ref;
        scenario(t, &ref);
        em_target_expert_counts c = counts(t);
        assert_int_equal(c.storage, EM_MOE_RESIDENT);
        assert_int_equal(c.hits, ref.uses);
        assert_int_equal(c.misses, 0);
        assert_int_equal(c.bytes_read, 0);
        assert_int_equal(c.file_bytes, 0);
        assert_int_equal(em_target_cost(t, 4).bytes_read, 0);
        em_target_close(t);

        t = open_model(paths[m], EM_MOE_SSD, 1ull << 30); /* the slot size and the file bytes */
        c = counts(t);
        const uint64_t slot = c.slot_bytes, file = c.file_bytes;
        const int n_expert = 8; /* every fixture has 8 routed experts per MoE layer */
        const uint64_t per_expert = file / (uint64_t)(n_moe * n_expert);
        assert_true(slot >= per_expert && per_expert > 0);
        em_target_close(t);

        const int all = n_moe * n_expert, budgets[] = { 1, 2, 3, 5, 8, 13, all };
        uint64_t ahead_used = 0;
        for (size_t bi = 0; bi < 2 * sizeof budgets / sizeof budgets[0]; bi++) {
            const size_t b = bi / 2;
            const bool ahead = bi % 2;
            t = open_model_ahead(paths[m], EM_MOE_SSD, (uint64_t)budgets[b] * slot, ahead);
            em_cost before = em_target_cost(t, 1), wider = em_target_cost(t, 4);
            assert_true(before.bytes_read > 0 && wider.bytes_read > before.bytes_read);
            record r;
            scenario(t, &r);
            assert_int_equal(r.rows, ref.rows);
            assert_int_equal(r.uses, ref.uses);
            if (memcmp(r.logits, ref.logits, (size_t)r.rows * (size_t)V * sizeof(float)) != 0)
                fail_msg("%s: ssd logits with a budget of %d slots (read-ahead %s) differ from resident", paths[m],
                         budgets[b], ahead ? "on" : "off");
            c = counts(t);
            assert_int_equal(c.storage, EM_MOE_SSD);
            assert_int_equal(c.hits + c.misses, r.uses);
            const uint64_t got = c.misses + c.prefetched; /* experts read */
            assert_int_equal(c.reads, 3 * got);
            assert_true(c.bytes_read >= got * per_expert && c.bytes_read <= got * slot);
            assert_true(c.prefetch_used <= c.prefetched);
            if (!ahead) assert_int_equal(c.prefetched, 0);
            ahead_used += c.prefetch_used;
            assert_true(c.cache_bytes <= c.cache_budget && c.cache_budget == (uint64_t)budgets[b] * slot);
            if (budgets[b] == all) { /* nothing evicted: each used expert read once */
                assert_int_equal(c.misses + c.prefetch_used, r.n_used);
                print_message("%s: %llu expert uses, %d distinct, all-slot cache, read-ahead %s: %llu hits, "
                              "%llu misses, %llu read ahead\n", paths[m], (unsigned long long)r.uses, r.n_used,
                              ahead ? "on" : "off", (unsigned long long)c.hits, (unsigned long long)c.misses,
                              (unsigned long long)c.prefetched);
            }
            if (budgets[b] == 1) assert_int_equal(c.hits, 0); /* one slot: every use reads */
            if (budgets[b] == 5 && ahead)
                print_message("%s: 5-slot cache, read-ahead: %llu hits, %llu misses, %llu read ahead, %llu of them used\n",
                              paths[m], (unsigned long long)c.hits, (unsigned long long)c.misses,
                              (unsigned long long)c.prefetched, (unsigned long long)c.prefetch_used);
            uint64_t layer_hits = 0, layer_misses = 0;
            for (int l = 0; l < info->n_layer; l++) {
                em_target_expert_counts lc;
                OK(em_target_expert_stats(t, l, &lc, E));
                layer_hits += lc.hits;
                layer_misses += lc.misses;
            }
            assert_int_equal(layer_hits, c.hits);
            assert_int_equal(layer_misses, c.misses);
            free(r.logits);
            em_target_close(t);
        }
        assert_true(ahead_used > 0); /* tokens seen before: their experts were read ahead and used */
        free(ref.logits);
    }
}

/* Once every expert is cached, a verify reads nothing and its cost hint says so. */
static void test_cost_hint(void **state) {
    (void)state;
    NEED_MODELS();
    em_target *t = open_model(paths[0], EM_MOE_SSD, 1ull << 30);
    const em_target_info *info = em_target_get_info(t);
    int32_t tok[48];
    for (int i = 0; i < 48; i++) tok[i] = (int32_t)((i * 37 + 5) % info->n_vocab);
    em_cost c1 = em_target_cost(t, 1), c8 = em_target_cost(t, 8);
    assert_true(c1.bytes_read > 0 && c8.bytes_read > c1.bytes_read && c8.seconds > c1.seconds);
    em_rows none = { 0 };
    OK(em_target_prefill(t, tok, 48, &none, E));
    em_target_expert_counts c = counts(t);
    bool all_cached = c.misses == (uint64_t)(info->n_moe_layers * 8);
    print_message("after 48 rows: %llu of %d experts cached; cost(1) = %llu bytes\n", (unsigned long long)c.misses,
                  info->n_moe_layers * 8, (unsigned long long)em_target_cost(t, 1).bytes_read);
    if (all_cached) assert_int_equal(em_target_cost(t, 1).bytes_read, 0);
    else assert_true(em_target_cost(t, 1).bytes_read < c1.bytes_read);
    em_target_close(t);
}

static uint64_t slot_of(const char *path) {
    em_target *t = open_model(path, EM_MOE_SSD, 1ull << 30);
    uint64_t slot = counts(t).slot_bytes;
    em_target_close(t);
    return slot;
}

static float *run_rows(em_target *t, const int32_t *tok, int n, bool prefill, int *rc, em_err *err) {
    const int V = em_target_get_info(t)->n_vocab;
    float *logits = calloc((size_t)n * (size_t)V, sizeof(float));
    assert_non_null(logits);
    em_rows out = { .logits = logits };
    *rc = prefill ? em_target_prefill(t, tok, n, &out, err) : em_target_verify(t, tok, n, &out, err);
    return logits;
}

static void expect_same(const float *a, const float *b, int n, int V) {
    assert_memory_equal(a, b, (size_t)n * (size_t)V * sizeof(float));
}

/* An injected read error fails the call clearly; the next calls give the reference logits. */
static void test_faults(void **state) {
    (void)state;
    NEED_MODELS();
    const char *path = paths[0];
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (int32_t)((i * 53 + 11) % 512);
    em_target *ref = open_model(path, EM_MOE_RESIDENT, 0);
    const int V = em_target_get_info(ref)->n_vocab;
    int rc;
    float *ref_pre = run_rows(ref, tok, 6, true, &rc, NULL);
    assert_int_equal(rc, 0);
    float *ref_ver = run_rows(ref, tok + 6, 3, false, &rc, NULL);
    assert_int_equal(rc, 0);
    const uint64_t slot = slot_of(path);
    const int kinds[2] = { EM_EXPERT_FAULT_EIO, EM_EXPERT_FAULT_SHORT };
    for (int k = 0; k < 2; k++) {
        em_target *t = open_model(path, EM_MOE_SSD, 2 * slot);
        em_err err = { 0 };
        float *l = run_rows(t, tok, 6, true, &rc, &err);
        assert_int_equal(rc, 0);
        expect_same(l, ref_pre, 6, V);
        free(l);
        /* verify: fails, the committed state stays */
        OK(em_experts_fault_arm(t->experts, kinds[k], 1, E));
        l = run_rows(t, tok + 6, 3, false, &rc, &err);
        free(l);
        assert_int_equal(rc, EM_EIO);
        print_message("injected %s in verify: %s\n", k ? "short read" : "EIO", err.msg);
        assert_non_null(strstr(err.msg, path));
        assert_non_null(strstr(err.msg, "offset"));
        assert_non_null(strstr(err.msg, k ? "short read" : "Input/output error"));
        assert_int_equal(em_target_position(t), 6);
        assert_int_not_equal(em_target_commit(t, 1, &err), 0); /* the failed verify left nothing to commit */
        l = run_rows(t, tok + 6, 3, false, &rc, &err);
        assert_int_equal(rc, 0);
        expect_same(l, ref_ver, 3, V);
        free(l);
        /* prefill: fails and resets the sequence; the next prefill works */
        em_target_reset(t);
        OK(em_experts_fault_arm(t->experts, kinds[k], 4, E));
        l = run_rows(t, tok, 6, true, &rc, &err);
        free(l);
        assert_int_equal(rc, EM_EIO);
        assert_non_null(strstr(err.msg, "sequence reset"));
        assert_int_equal(em_target_position(t), 0);
        l = run_rows(t, tok, 6, true, &rc, &err);
        assert_int_equal(rc, 0);
        expect_same(l, ref_pre, 6, V);
        free(l);
        em_target_expert_counts c = counts(t);
        assert_true(c.cache_bytes <= c.cache_budget);
        em_target_close(t);
    }
    free(ref_pre);
    free(ref_ver);
    em_target_close(ref);
}

/* The model file truncated under an open target, in both storage modes: the next forward
 * reads zero pages where the file's pages were (no SIGBUS) and fails with a message naming the
 * file; so does every later call, and a new open of the (now short) file is refused. */
static void test_file_truncated(void **state) {
    (void)state;
    NEED_MODELS();
    int32_t tok[8];
    for (int i = 0; i < 8; i++) tok[i] = (int32_t)((i * 53 + 11) % 512);
    size_t n;
    void *orig = em_test_read(paths[0], &n);
    const int modes[2] = { EM_MOE_RESIDENT, EM_MOE_SSD };
    for (int k = 0; k < 2; k++) {
        const char *copy = em_test_path("truncated.gguf");
        em_test_write(copy, orig, n);
        const uint64_t budget = modes[k] == EM_MOE_SSD ? 2 * slot_of(copy) : 0;
        em_target *t = open_model(copy, modes[k], budget);
        em_err err = { 0 };
        int rc;
        free(run_rows(t, tok, 4, true, &rc, &err));
        assert_int_equal(rc, 0);
        assert_int_equal(truncate(copy, (off_t)(n / 2)), 0);
        free(run_rows(t, tok + 4, 2, false, &rc, &err)); /* no size check here: the fault tells */
        assert_int_equal(rc, EM_EIO);
        print_message("%s: %s\n", k ? "ssd" : "resident", err.msg);
        char want[1024];
        snprintf(want, sizeof want, "model file %s changed on disk while mapped (%zu bytes now, %zu mapped): restart to reload",
                 copy, n / 2, n);
        assert_string_equal(err.msg, want);
        assert_int_equal(em_target_commit(t, 1, &err), EM_EIO); /* and so on, for good */
        em_target_reset(t);
        free(run_rows(t, tok, 4, true, &rc, &err));
        assert_int_equal(rc, EM_EIO);
        assert_string_equal(err.msg, want);
        em_target_close(t);
        assert_int_equal(em_model_files_check(true, &err), EM_OK); /* closed: nothing is watched */

        /* shrunk between two requests: the next prompt's size check fails it before any read */
        em_test_write(copy, orig, n);
        t = open_model(copy, modes[k], budget);
        free(run_rows(t, tok, 4, true, &rc, &err));
        assert_int_equal(rc, 0);
        assert_int_equal(truncate(copy, (off_t)(n - 4096)), 0);
        em_target_reset(t);
        free(run_rows(t, tok, 4, true, &rc, &err));
        assert_int_equal(rc, EM_EIO);
        assert_non_null(strstr(err.msg, "changed on disk while mapped"));
        assert_non_null(strstr(err.msg, copy));
        em_target_close(t);
    }
    free(orig);
}

static void test_bad_options(void **state) {
    (void)state;
    NEED_MODELS();
    em_target *t = NULL;
    em_err err = { 0 };
    em_model_opts o = { .moe_storage = 9 };
    assert_int_equal(em_model_open(&t, paths[0], &o, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "moe_storage"));
    o = (em_model_opts){ .moe_storage = EM_MOE_SSD, .expert_cache_bytes = 1000 };
    assert_int_not_equal(em_model_open(&t, paths[0], &o, &err), 0);
    assert_null(t);
    print_message("tiny budget: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "smaller than one expert"));
    assert_non_null(strstr(err.msg, paths[0]));
    t = open_model(paths[0], EM_MOE_RESIDENT, 0);
    assert_int_equal(em_experts_fault_arm(t->experts, EM_EXPERT_FAULT_EIO, 0, &err), EM_EUNSUPPORTED);
    em_target_expert_counts c;
    assert_int_equal(em_target_expert_stats(t, 99, &c, &err), EM_EINVAL);
    em_target_close(t);
    t = open_model(paths[0], EM_MOE_SSD, 1ull << 30);
    assert_int_equal(em_experts_fault_arm(t->experts, 7, 0, &err), EM_EINVAL);
    const int32_t bad_tok[2] = { 1, em_target_get_info(t)->n_vocab };
    assert_int_equal(em_target_prefetch(t, bad_tok, 2, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "not in the vocabulary"));
    assert_int_equal(em_target_prefetch(t, bad_tok, 1, &err), EM_OK);
    em_target_close(t);
}

/* The last line of out.txt as JSON. */
static json_t *last_json(void) {
    size_t n;
    char *text = em_test_read(em_test_path("out.txt"), &n);
    while (n > 0 && text[n - 1] == '\n') text[--n] = 0;
    char *line = strrchr(text, '\n');
    json_error_t jerr;
    json_t *o = json_loads(line ? line + 1 : text, 0, &jerr);
    if (!o) fail_msg("no JSON on the last line of: %s", text);
    free(text);
    return o;
}

static void expect_stderr(const char *needle) {
    size_t n;
    char *text = em_test_read(em_test_path("err.txt"), &n);
    if (!strstr(text, needle)) fail_msg("stderr lacks '%s': %s", needle, text);
    free(text);
}

static int64_t expert_field(json_t *o, const char *key) {
    return json_integer_value(json_object_get(json_object_get(o, "experts"), key));
}

static void test_cli(void **state) {
    (void)state;
    NEED_MODELS();
    const char *m = paths[0];
    assert_int_equal(em_test_sh(1, "'%s' run -m '%s' -p hello -n 4 --json --moe-storage ssd --expert-cache 64KiB", bin, m), 0);
    expect_stderr("experts ssd:");
    expect_stderr("file-backed, expert cache 64.00 KiB");
    json_t *o = last_json();
    assert_true(expert_field(o, "misses") > 0 && expert_field(o, "bytes_read") > 0);
    assert_true(expert_field(o, "cache_bytes") > 0 && expert_field(o, "cache_bytes") <= 64 * 1024);
    /* generation's share of the reads, and that over the 3 tokens its passes committed */
    const int64_t gen = expert_field(o, "gen_bytes_read");
    assert_true(gen > 0 && gen < expert_field(o, "bytes_read"));
    const double per = json_real_value(json_object_get(json_object_get(o, "experts"), "gen_bytes_per_token"));
    const json_t *spec = json_object_get(o, "spec");
    const double committed = (double)(json_integer_value(json_object_get(spec, "passes")) +
                                      json_integer_value(json_object_get(spec, "accepted")));
    assert_true(committed > 0 && fabs(per - (double)gen / committed) <= 1e-9 * per);
    /* the time spent waiting for those reads: positive, and below the whole run's */
    const double rs = json_real_value(json_object_get(json_object_get(o, "experts"), "read_seconds"));
    assert_true(rs > 0 && rs < 60);
    json_t *toks_ssd = json_incref(json_object_get(o, "tokens"));
    json_decref(o);
    assert_int_equal(em_test_sh(1, "'%s' run -m '%s' -p hello -n 4 --json --moe-storage resident", bin, m), 0);
    expect_stderr("experts resident:");
    o = last_json();
    assert_true(expert_field(o, "hits") > 0);
    assert_int_equal(expert_field(o, "misses"), 0);
    assert_int_equal(expert_field(o, "bytes_read"), 0);
    assert_int_equal(expert_field(o, "gen_bytes_read"), 0);
    assert_true(json_equal(toks_ssd, json_object_get(o, "tokens")));
    json_decref(o);
    json_decref(toks_ssd);
    static const char *const bad[] = { "--moe-storage disk", "--expert-cache 12XB", "--expert-cache 0",
                                       "--expert-prefetch yes", "--expert-prefetch", "--expert-cache",
                                       "--moe-storage" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = em_test_sh(1, "'%s' run -m '%s' -p a -n 2 %s", bin, m, bad[i]);
        if (rc != 2) fail_msg("'%s' exits %d, not 2", bad[i], rc);
    }
    expect_stderr("--moe-storage");
    int rc = em_test_sh(1, "'%s' run -m '%s' -p a -n 2 --moe-storage ssd --expert-cache 1KiB", bin, m);
    assert_true(rc != 0 && rc != 2);
    expect_stderr("smaller than one expert");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_cost_hint),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_file_truncated),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
