/* Tests for draft/ (the DSpark / DFlash drafter) against tools/fixtures/drafter_ref.py, an
 * independent float64 PyTorch forward written from dspark.md that reads the fixtures'
 * safetensors and config.json directly (tests/fixtures/ref/drafters/manifest.json).
 *
 * The four drafter fixtures (DeepSpec vanilla and gated, SpecForge vanilla and rnn with YaRN;
 * BF16 checkpoints) are converted by the CLI at F32 and at BF16 (both exact: the checkpoints
 * are BF16) and opened on kimi_a converted to F32 (opened as a target: it lends its weights).
 * Context rows are kimi_a's committed hidden states (tests/fixtures/ref/kimi_a/seq*.hidden.bin,
 * the outputs of layers 0..2), the anchor kimi_a's token at the anchor position.
 *
 *  - logits: every draft slot's Markov-corrected logits (prev = the reference's greedy choice,
 *    replayed by the chooser) within 1e-4 * max |logit|, the confidence logits within 1e-4
 *    absolute (+1e-4 relative); the drafter's own greedy choice equals the reference's
 *    wherever the reference's top-1/top-2 gap exceeds the tolerance.
 *  - the DFlash convention (the DeepSpec file with sample_from_anchor false): B-1 drafts.
 *  - calibration temperatures (dflash.confidence_temperatures): conf_logits are z / T.
 *  - Q8_0 conversion: sanity bound only (printed).
 *  - context bookkeeping: adding the rows in pieces or at once, reset, n_max, early stop,
 *    NULL logits, a full cache; cached Markov biases give the floats a fresh drafter computes;
 *    the keep callback (asked with each slot's confidence before its choice) ends the block
 *    where it says no, and the slots made are the floats of a whole block.
 *  - the chain run inside the drafter (greedy, seeded sampling, the schedule's keep test from
 *    plain data) gives exactly the tokens, logits, distributions, stops and random draws of
 *    the old per-slot callbacks; chains that make no sense are refused with a message.
 *  - lent weights: a drafter without its own embedding / LM head uses the target's matrices
 *    themselves (same views, same data pointers: one copy), one with its own uses its file's;
 *    em_draft_read_taps gives the taps the opened drafter reports.
 *  - bad input: a drafter whose hidden size, vocabulary or taps do not fit the target, or
 *    that needs a matrix the target does not lend or lends in another shape, fails at open
 *    naming both files and the mismatch; broken files; every argument check.
 */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft/draft.h"
#include "draft/dspark_impl.h" /* the borrowed matrices (test_borrowed) */
#include "format/gguf.h"
#include "model/model.h"

#define VOCAB 512
#define HIDDEN 96
#define REL_TOL 1e-4

static const char *const drafters[] = { "dspark_deepspec", "dspark_deepspec_gated", "dspark_specforge",
                                        "dspark_specforge_rnn" };
#define N_DRAFTERS 4

static json_t *manifest, *kimi_manifest;
static bool have_models;
static char target_f32[600], target_b[600];
/* kimi_a and kimi_b (F32) opened as targets, and what they lend their drafters */
static em_target *tgt_a, *tgt_b;
static em_target_shared sh_a, sh_b;
static char draft_path[N_DRAFTERS][3][600]; /* f32, bf16, q8_0 */

static int idx_of(const char *fixture) {
    for (int i = 0; i < N_DRAFTERS; i++)
        if (strcmp(drafters[i], fixture) == 0) return i;
    return -1;
}

static int setup(void **state) {
    (void)state;
    json_error_t jerr;
    manifest = json_load_file(em_test_src("tests/fixtures/ref/drafters/manifest.json"), 0, &jerr);
    kimi_manifest = json_load_file(em_test_src("tests/fixtures/ref/manifest.json"), 0, &jerr);
    if (!manifest || !kimi_manifest) {
        fprintf(stderr, "manifest: %s\n", jerr.text);
        return -1;
    }
    const char *bin = getenv("EMBER_BIN");
    if (!bin) {
        fprintf(stderr, "EMBER_BIN is not set: drafter tests are skipped\n");
        return 0;
    }
    if (em_test_convert_fixture(bin, "kimi_a", "f32", target_f32, sizeof target_f32) ||
        em_test_convert_fixture(bin, "kimi_b", "f32", target_b, sizeof target_b))
        return -1;
    static const char *const types[3] = { "f32", "bf16", "q8_0" };
    for (int i = 0; i < N_DRAFTERS; i++)
        for (int t = 0; t < 3; t++)
            if (em_test_convert_fixture(bin, drafters[i], types[t], draft_path[i][t], sizeof draft_path[i][t]))
                return -1;
    em_err err = { 0 };
    if (em_model_open(&tgt_a, target_f32, &(em_model_opts){ .n_threads = 1 }, &err) ||
        em_model_open(&tgt_b, target_b, &(em_model_opts){ .n_threads = 1 }, &err) ||
        em_target_shared_weights(tgt_a, &sh_a, &err) || em_target_shared_weights(tgt_b, &sh_b, &err)) {
        fprintf(stderr, "targets: %s\n", err.msg);
        return -1;
    }
    have_models = true;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    em_target_close(tgt_a);
    em_target_close(tgt_b);
    json_decref(manifest);
    json_decref(kimi_manifest);
    return 0;
}

#define NEED_MODELS()         \
    do {                      \
        if (!have_models) {   \
            skip();           \
        }                     \
    } while (0)

/* ---- reference data ----------------------------------------------------------------------- */

static const int drafter_taps[N_DRAFTERS][3] = { { 0, 2, -1 }, { 0, 2, -1 }, { 0, 1, 2 }, { 0, 1, 2 } };

static int32_t *seq_tokens(const char *seq, int *n) {
    json_t *seqs = json_object_get(json_object_get(json_object_get(kimi_manifest, "configs"), "kimi_a"), "sequences");
    for (size_t i = 0; i < json_array_size(seqs); i++) {
        json_t *s = json_array_get(seqs, i);
        if (strcmp(json_string_value(json_object_get(s, "name")), seq) != 0) continue;
        json_t *t = json_object_get(s, "tokens");
        *n = (int)json_array_size(t);
        int32_t *v = malloc((size_t)*n * sizeof *v);
        assert_non_null(v);
        for (int j = 0; j < *n; j++) v[j] = (int32_t)json_integer_value(json_array_get(t, (size_t)j));
        return v;
    }
    fail_msg("no sequence %s", seq);
    return NULL;
}

/* Context rows [n][n_taps * 96] of a sequence: taps concatenated in the drafter's order. */
static float *seq_feats(const char *seq, int n, const int *taps, int n_taps) {
    char rel[128];
    snprintf(rel, sizeof rel, "tests/fixtures/ref/kimi_a/%s.hidden.bin", seq);
    float *hid = em_test_read_f32(em_test_src(rel), (size_t)3 * n * HIDDEN);
    float *f = malloc((size_t)n * n_taps * HIDDEN * sizeof *f);
    assert_non_null(f);
    for (int p = 0; p < n; p++)
        for (int t = 0; t < n_taps; t++)
            memcpy(f + ((size_t)p * n_taps + t) * HIDDEN, hid + ((size_t)taps[t] * n + p) * HIDDEN, HIDDEN * sizeof *f);
    free(hid);
    return f;
}

typedef struct ref_case {
    json_t *j;
    const char *fixture, *seq;
    int anchor_pos, n_drafts, di, n_tok, n_taps;
    int32_t anchor, tokens[EM_DRAFT_MAX_BLOCK];
    float *base, *logits, *conf; /* into blob */
    float *blob, *feats;
    double scale;
} ref_case;

static void load_case(json_t *j, ref_case *c) {
    memset(c, 0, sizeof *c);
    c->j = j;
    c->fixture = json_string_value(json_object_get(j, "fixture"));
    c->seq = json_string_value(json_object_get(j, "sequence"));
    c->anchor_pos = (int)json_integer_value(json_object_get(j, "anchor_pos"));
    c->anchor = (int32_t)json_integer_value(json_object_get(j, "anchor_token"));
    c->n_drafts = (int)json_integer_value(json_object_get(j, "n_drafts"));
    c->di = idx_of(c->fixture);
    assert_true(c->di >= 0);
    json_t *t = json_object_get(j, "tokens");
    for (int k = 0; k < c->n_drafts; k++) c->tokens[k] = (int32_t)json_integer_value(json_array_get(t, (size_t)k));
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/ref/drafters/%s", json_string_value(json_object_get(j, "file")));
    size_t nf = (size_t)c->n_drafts * (2 * VOCAB + 1);
    c->blob = em_test_read_f32(em_test_src(rel), nf);
    c->base = c->blob;
    c->logits = c->blob + (size_t)c->n_drafts * VOCAB;
    c->conf = c->blob + (size_t)2 * c->n_drafts * VOCAB;
    c->scale = json_real_value(json_object_get(j, "max_abs_logit"));
    int32_t *toks = seq_tokens(c->seq, &c->n_tok);
    assert_true(c->anchor_pos < c->n_tok);
    assert_int_equal(toks[c->anchor_pos], c->anchor);
    free(toks);
    c->n_taps = drafter_taps[c->di][2] < 0 ? 2 : 3;
    c->feats = seq_feats(c->seq, c->n_tok, drafter_taps[c->di], c->n_taps);
}

static void free_case(ref_case *c) {
    free(c->blob);
    free(c->feats);
}

/* ---- choosers ----------------------------------------------------------------------------- */

typedef struct replay {
    const int32_t *tokens; /* the reference's choices, replayed */
    int32_t argmax[EM_DRAFT_MAX_BLOCK];
    int calls, stop_at;    /* stop_at >= 0: return -1 at that slot */
    int32_t bad;           /* nonzero: return this token */
} replay;

static int32_t argmax_of(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int32_t choose_replay(void *ud, int k, const float *logits) {
    replay *r = ud;
    assert_int_equal(k, r->calls);
    r->calls++;
    r->argmax[k] = argmax_of(logits, VOCAB);
    if (r->stop_at == k) return -1;
    if (r->bad) return r->bad;
    return r->tokens ? r->tokens[k] : r->argmax[k];
}

/* A keep callback that says no at slot stop_at, logging what it was asked. */
typedef struct keep_log {
    int stop_at, calls;
    int k[EM_DRAFT_MAX_BLOCK];
    float z[EM_DRAFT_MAX_BLOCK];
} keep_log;

/* A chain that replays r's choices through the chooser oracle. */
#define REPLAY(r) (&(em_draft_chain){ .choose = choose_replay, .choose_ud = (r) })

static bool keep_until(void *ud, int k, float z) {
    keep_log *kl = ud;
    kl->k[kl->calls] = k;
    kl->z[kl->calls++] = z;
    return k < kl->stop_at;
}

/* ---- comparisons ------------------------------------------------------------------------- */

typedef struct agreement {
    double max_logit, max_conf;
} agreement;

/* Runs one case on an opened drafter (context added in two pieces), compares, returns the
 * deltas. The drafter's context must be empty. */
static agreement run_case(em_drafter *d, const ref_case *c, double tol_rel, bool check_greedy) {
    const em_draft_info *info = em_draft_get_info(d);
    assert_int_equal(info->n_drafts, c->n_drafts);
    assert_int_equal(info->n_vocab, VOCAB);
    assert_int_equal(info->n_feat, c->n_taps * HIDDEN);
    assert_int_equal(info->n_ctx, 0);
    const int a = c->anchor_pos, first = a / 3;
    OK(em_draft_add_context(d, c->feats, first, E));
    OK(em_draft_add_context(d, c->feats + (size_t)first * info->n_feat, a - first, E));
    assert_int_equal(info->n_ctx, a);
    float *logits = malloc((size_t)c->n_drafts * VOCAB * sizeof *logits);
    float conf[EM_DRAFT_MAX_BLOCK];
    int32_t toks[EM_DRAFT_MAX_BLOCK];
    assert_non_null(logits);
    replay r = { .tokens = c->tokens, .stop_at = -1 };
    em_draft_out out = { .tokens = toks, .logits = logits, .conf_logits = conf };
    OK(em_draft_propose(d, c->anchor, EM_DRAFT_MAX_BLOCK, REPLAY(&r), &out, E));
    assert_int_equal(out.n, c->n_drafts);
    assert_int_equal(info->n_ctx, a); /* the block never enters the cache */
    agreement g = { 0, 0 };
    for (int k = 0; k < c->n_drafts; k++) {
        assert_int_equal(toks[k], c->tokens[k]);
        for (int v = 0; v < VOCAB; v++) {
            double dl = fabs((double)logits[(size_t)k * VOCAB + v] - c->logits[(size_t)k * VOCAB + v]);
            if (dl > g.max_logit) g.max_logit = dl;
        }
        double dc = fabs((double)conf[k] - c->conf[k]);
        if (dc > g.max_conf) g.max_conf = dc;
        /* the drafter's own greedy pick, unless the reference's top two are a near tie */
        const float *ref = c->logits + (size_t)k * VOCAB;
        int32_t top = argmax_of(ref, VOCAB);
        float second = -INFINITY;
        for (int v = 0; v < VOCAB; v++)
            if (v != top && ref[v] > second) second = ref[v];
        if (check_greedy && ref[top] - second > 2 * tol_rel * c->scale) assert_int_equal(r.argmax[k], c->tokens[k]);
    }
    free(logits);
    return g;
}

static em_drafter *open_ok(const char *draft, const em_target_shared *target, int n_ctx) {
    em_drafter *d = NULL;
    em_draft_opts o = { .n_threads = 2, .n_ctx = n_ctx };
    OK(em_draft_open(&d, draft, target, &o, E));
    assert_non_null(d);
    return d;
}

/* All reference cases of one convention against conversions of type t (0 f32, 1 bf16). */
static void check_all(int t, const char *convention) {
    json_t *cases = json_object_get(manifest, "cases");
    int n_run = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *j = json_array_get(cases, i);
        if (strcmp(json_string_value(json_object_get(j, "convention")), convention) != 0) continue;
        ref_case c;
        load_case(j, &c);
        em_drafter *d = open_ok(draft_path[c.di][t], &sh_a, 0);
        agreement g = run_case(d, &c, REL_TOL, true);
        printf("  %-44s %s: max |dlogit| %.3g (%.3g of max |logit| %.3g), max |dconf| %.3g\n",
               json_string_value(json_object_get(j, "file")), t ? "bf16" : "f32 ", g.max_logit,
               g.max_logit / c.scale, c.scale, g.max_conf);
        assert_true(g.max_logit <= REL_TOL * c.scale);
        assert_true(g.max_conf <= 1e-4 + 1e-4 * fabs(c.conf[0]));
        em_draft_close(d);
        free_case(&c);
        n_run++;
    }
    assert_true(n_run > 0);
}

static void test_dspark_f32(void **state) {
    (void)state;
    NEED_MODELS();
    check_all(0, "dspark");
}

static void test_dspark_bf16(void **state) {
    (void)state;
    NEED_MODELS();
    check_all(1, "dspark");
}

/* ---- GGUF rewriting (keys changed / dropped, tensors dropped) ------------------------------- */

typedef void (*add_keys_fn)(em_gguf_writer *w, void *ud);

/* Copies src to dst, leaving out keys in drop_keys and tensors in drop_tensors (NULL-ended
 * lists), then lets add() set keys of its own. */
static void rewrite(const char *src, const char *dst, const char *const *drop_keys,
                    const char *const *drop_tensors, add_keys_fn add, void *ud) {
    em_gguf *g = NULL;
    em_gguf_writer *w = NULL;
    OK(em_gguf_open(&g, src, E));
    OK(em_gguf_writer_create(&w, dst, NULL, E));
    for (int64_t i = 0; i < em_gguf_n_keys(g); i++) {
        const char *k = em_gguf_key(g, i);
        bool drop = false;
        for (int j = 0; drop_keys && drop_keys[j]; j++) drop |= strcmp(drop_keys[j], k) == 0;
        if (drop) continue;
        em_gguf_value v = em_gguf_value_at(g, i);
        OK(em_gguf_writer_set_value(w, k, &v, E));
    }
    if (add) add(w, ud);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
            const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
            bool drop = false;
            for (int j = 0; drop_tensors && drop_tensors[j]; j++) drop |= strcmp(drop_tensors[j], t->name) == 0;
            if (drop) continue;
            if (pass == 0) OK(em_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims > 0 ? t->n_dims : 1, t->ne, E));
            else OK(em_gguf_writer_write_tensor(w, t->name, t->data, t->bytes, E));
        }
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
    em_gguf_close(g);
}

typedef struct kv {
    const char *key;
    int type; /* EM_GGUF_U32, BOOL, F32, STR, or ARRAY (f32 array) */
    uint32_t u;
    bool b;
    float f;
    const char *s;
    const float *arr;
    int n;
} kv;

static void add_kv(em_gguf_writer *w, void *ud) {
    for (const kv *e = ud; e->key; e++) {
        switch (e->type) {
        case EM_GGUF_U32: OK(em_gguf_writer_set_u32(w, e->key, e->u, E)); break;
        case EM_GGUF_BOOL: OK(em_gguf_writer_set_bool(w, e->key, e->b, E)); break;
        case EM_GGUF_F32: OK(em_gguf_writer_set_f32(w, e->key, e->f, E)); break;
        case EM_GGUF_STR: OK(em_gguf_writer_set_str(w, e->key, e->s, E)); break;
        case EM_GGUF_ARRAY: OK(em_gguf_writer_set_arr(w, e->key, EM_GGUF_F32, e->arr, (uint64_t)e->n, E)); break;
        default: fail_msg("kv type %d", e->type);
        }
    }
}

/* Rewrites src with keys replaced (the kv list, NULL-key ended) into em_test_path(name). */
static const char *with_keys(const char *src, const char *name, kv *kvs) {
    const char *drop[16];
    int n = 0;
    for (const kv *e = kvs; e->key && n < 15; e++) drop[n++] = e->key;
    drop[n] = NULL;
    const char *dst = em_test_path(name);
    rewrite(src, dst, drop, NULL, add_kv, kvs);
    return dst;
}

/* ---- conventions and calibration -------------------------------------------------------- */

static void test_dflash_convention(void **state) {
    (void)state;
    NEED_MODELS();
    kv kvs[] = { { .key = "dflash.sample_from_anchor", .type = EM_GGUF_BOOL, .b = false }, { 0 } };
    const char *path = with_keys(draft_path[0][0], "deepspec_dflash.gguf", kvs);
    json_t *cases = json_object_get(manifest, "cases");
    int n_run = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *j = json_array_get(cases, i);
        if (strcmp(json_string_value(json_object_get(j, "convention")), "dflash") != 0) continue;
        ref_case c;
        load_case(j, &c);
        em_drafter *d = open_ok(path, &sh_a, 0);
        assert_int_equal(em_draft_get_info(d)->block_size, 7);
        assert_int_equal(em_draft_get_info(d)->n_drafts, 6);
        agreement g = run_case(d, &c, REL_TOL, true);
        printf("  %-44s f32 : max |dlogit| %.3g (%.3g rel), max |dconf| %.3g\n",
               json_string_value(json_object_get(j, "file")), g.max_logit, g.max_logit / c.scale, g.max_conf);
        assert_true(g.max_logit <= REL_TOL * c.scale);
        assert_true(g.max_conf <= 1e-4 + 1e-4 * fabs(c.conf[0]));
        em_draft_close(d);
        free_case(&c);
        n_run++;
    }
    assert_true(n_run >= 2);
}

static json_t *first_case(const char *fixture, const char *convention) {
    json_t *cases = json_object_get(manifest, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *j = json_array_get(cases, i);
        if (strcmp(json_string_value(json_object_get(j, "fixture")), fixture) == 0 &&
            strcmp(json_string_value(json_object_get(j, "convention")), convention) == 0 &&
            json_integer_value(json_object_get(j, "anchor_pos")) > 0)
            return j;
    }
    fail_msg("no case for %s", fixture);
    return NULL;
}

static void test_calibration(void **state) {
    (void)state;
    NEED_MODELS();
    static const float temps[7] = { 1.0f, 1.5f, 2.0f, 0.5f, 3.0f, 1.25f, 4.0f };
    kv kvs[] = { { .key = "dflash.confidence_temperatures", .type = EM_GGUF_ARRAY, .arr = temps, .n = 7 }, { 0 } };
    const char *path = with_keys(draft_path[3][0], "rnn_sts.gguf", kvs);
    ref_case c;
    load_case(first_case("dspark_specforge_rnn", "dspark"), &c);
    em_drafter *d = open_ok(path, &sh_a, 0);
    OK(em_draft_add_context(d, c.feats, c.anchor_pos, E));
    int32_t toks[8];
    float conf[8];
    replay r = { .tokens = c.tokens, .stop_at = -1 };
    em_draft_out out = { .tokens = toks, .conf_logits = conf };
    OK(em_draft_propose(d, c.anchor, 8, REPLAY(&r), &out, E));
    assert_int_equal(out.n, 7);
    for (int k = 0; k < 7; k++) assert_float_equal(conf[k], c.conf[k] / temps[k], 1e-4);
    em_draft_close(d);

    /* a wrong count or a non-positive temperature is refused at open */
    static const float bad[7] = { 1, 1, 1, 0, 1, 1, 1 };
    kv wrong_n[] = { { .key = "dflash.confidence_temperatures", .type = EM_GGUF_ARRAY, .arr = temps, .n = 5 }, { 0 } };
    kv wrong_v[] = { { .key = "dflash.confidence_temperatures", .type = EM_GGUF_ARRAY, .arr = bad, .n = 7 }, { 0 } };
    em_err err = { 0 };
    em_drafter *x = NULL;
    assert_int_equal(em_draft_open(&x, with_keys(draft_path[3][0], "sts_n.gguf", wrong_n), &sh_a, NULL, &err),
                     EM_EFORMAT);
    assert_non_null(strstr(err.msg, "one per draft"));
    assert_int_equal(em_draft_open(&x, with_keys(draft_path[3][0], "sts_v.gguf", wrong_v), &sh_a, NULL, &err),
                     EM_EFORMAT);
    assert_non_null(strstr(err.msg, "temperature"));
    assert_null(x);
    free_case(&c);
}

static void test_q8_0_sanity(void **state) {
    (void)state;
    NEED_MODELS();
    for (int i = 0; i < N_DRAFTERS; i++) {
        ref_case c;
        load_case(first_case(drafters[i], "dspark"), &c);
        em_drafter *d = open_ok(draft_path[i][2], &sh_a, 0);
        agreement g = run_case(d, &c, REL_TOL, false);
        printf("  %-24s q8_0: max |dlogit| %.3g (%.3g of max |logit|), max |dconf| %.3g\n", drafters[i], g.max_logit,
               g.max_logit / c.scale, g.max_conf);
        assert_true(g.max_logit <= 0.1 * c.scale);
        em_draft_close(d);
        free_case(&c);
    }
}

/* ---- context bookkeeping ---------------------------------------------------------------- */

static void test_context_and_choice(void **state) {
    (void)state;
    NEED_MODELS();
    ref_case c;
    load_case(first_case("dspark_specforge", "dspark"), &c);
    em_drafter *d = open_ok(draft_path[2][0], &sh_a, 0);
    const em_draft_info *info = em_draft_get_info(d);
    assert_int_equal(info->n_taps, 3);
    assert_int_equal(info->taps[0], 0);
    assert_int_equal(info->taps[2], 2);
    assert_true(info->has_confidence);
    /* the cost model: a fixed part (backbone) and a part per slot made (LM head row, bias) */
    assert_true(isfinite(info->block_seconds) && info->block_seconds > 0);
    assert_true(isfinite(info->slot_seconds) && info->slot_seconds > 0);
    int32_t toks[8];
    float logits_all[7 * VOCAB], logits3[3 * VOCAB];

    /* everything at once, greedy chooser with NULL logits: the reference's tokens */
    OK(em_draft_add_context(d, c.feats, c.anchor_pos, E));
    replay r = { .stop_at = -1 };
    em_draft_out out = { .tokens = toks };
    OK(em_draft_propose(d, c.anchor, 7, REPLAY(&r), &out, E));
    assert_int_equal(out.n, 7);
    for (int k = 0; k < 7; k++) assert_int_equal(toks[k], c.tokens[k]);

    /* proposing again from the same state is deterministic */
    out = (em_draft_out){ .tokens = toks, .logits = logits_all };
    r = (replay){ .tokens = c.tokens, .stop_at = -1 };
    OK(em_draft_propose(d, c.anchor, 7, REPLAY(&r), &out, E));

    /* n_max 3: three proposals, the same three rows */
    r = (replay){ .tokens = c.tokens, .stop_at = -1 };
    out = (em_draft_out){ .tokens = toks, .logits = logits3 };
    OK(em_draft_propose(d, c.anchor, 3, REPLAY(&r), &out, E));
    assert_int_equal(out.n, 3);
    assert_int_equal(r.calls, 3);
    assert_memory_equal(logits3, logits_all, sizeof logits3);

    /* the first propose above made every Markov bias (vanilla: cached by token); a fresh
     * drafter makes them again, and its logits are the same floats */
    {
        em_drafter *fresh = open_ok(draft_path[2][0], &sh_a, 0);
        float logits_fresh[7 * VOCAB];
        OK(em_draft_add_context(fresh, c.feats, c.anchor_pos, E));
        r = (replay){ .tokens = c.tokens, .stop_at = -1 };
        out = (em_draft_out){ .tokens = toks, .logits = logits_fresh };
        OK(em_draft_propose(fresh, c.anchor, 7, REPLAY(&r), &out, E));
        assert_memory_equal(logits_fresh, logits_all, sizeof logits_fresh);
        em_draft_close(fresh);
    }

    /* keep: asked slot by slot with the slot's confidence before its choice; a no ends the
     * block there. The slots made are the same floats as in a whole block, wherever the stop
     * falls (the LM head is computed in pieces that follow the recent stops) */
    float conf_all[7];
    r = (replay){ .tokens = c.tokens, .stop_at = -1 };
    out = (em_draft_out){ .tokens = toks, .conf_logits = conf_all };
    OK(em_draft_propose(d, c.anchor, 7, REPLAY(&r), &out, E));
    static const int stops[] = { 3, 0, 1, 6, 7, 2, 2, 5, 4, 1, 1, 1, 7, 3 };
    for (size_t t = 0; t < sizeof stops / sizeof stops[0]; t++) {
        keep_log kl = { .stop_at = stops[t] };
        float lg[7 * VOCAB], cf[7];
        r = (replay){ .tokens = c.tokens, .stop_at = -1 };
        out = (em_draft_out){ .tokens = toks, .logits = lg, .conf_logits = cf };
        em_draft_chain kc = { .choose = choose_replay, .choose_ud = &r, .keep = keep_until, .keep_ud = &kl };
        OK(em_draft_propose(d, c.anchor, 7, &kc, &out, E));
        int made = stops[t] < 7 ? stops[t] : 7;
        assert_int_equal(out.n, made);
        assert_int_equal(r.calls, made);
        assert_int_equal(kl.calls, stops[t] < 7 ? stops[t] + 1 : 7);
        for (int k = 0; k < kl.calls; k++) {
            assert_int_equal(kl.k[k], k);
            assert_memory_equal(&kl.z[k], &conf_all[k], sizeof(float));
            assert_memory_equal(&cf[k], &conf_all[k], sizeof(float));
        }
        if (made) assert_memory_equal(lg, logits_all, (size_t)made * VOCAB * sizeof(float));
    }

    /* the chooser stops the block at slot 2 */
    r = (replay){ .tokens = c.tokens, .stop_at = 2 };
    out = (em_draft_out){ .tokens = toks };
    OK(em_draft_propose(d, c.anchor, 7, REPLAY(&r), &out, E));
    assert_int_equal(out.n, 2);

    /* a chooser that returns a token outside the vocabulary is an error */
    em_err err = { 0 };
    r = (replay){ .stop_at = -1, .bad = VOCAB };
    assert_int_equal(em_draft_propose(d, c.anchor, 7, REPLAY(&r), &out, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "chooser"));

    /* reset, then the rows one at a time: the same logits as at once */
    em_draft_reset(d);
    assert_int_equal(info->n_ctx, 0);
    for (int p = 0; p < c.anchor_pos; p++) OK(em_draft_add_context(d, c.feats + (size_t)p * info->n_feat, 1, E));
    float again[7 * VOCAB];
    r = (replay){ .tokens = c.tokens, .stop_at = -1 };
    out = (em_draft_out){ .tokens = toks, .logits = again };
    OK(em_draft_propose(d, c.anchor, 7, REPLAY(&r), &out, E));
    double mx = 0;
    for (int i = 0; i < 7 * VOCAB; i++) mx = fmax(mx, fabs((double)again[i] - logits_all[i]));
    assert_true(mx <= 1e-5 * c.scale);
    em_draft_close(d);

    /* a full cache refuses more rows and keeps what it has */
    d = open_ok(draft_path[2][0], &sh_a, 4);
    OK(em_draft_add_context(d, c.feats, 3, E));
    assert_int_equal(em_draft_add_context(d, c.feats, 2, &err), EM_EOVERFLOW);
    assert_non_null(strstr(err.msg, "do not fit"));
    assert_int_equal(em_draft_get_info(d)->n_ctx, 3);
    OK(em_draft_add_context(d, c.feats, 1, E));
    assert_int_equal(em_draft_get_info(d)->n_ctx, 4);
    em_draft_close(d);
    free_case(&c);
}


/* ---- the chain inside the drafter ------------------------------------------------------- */

/* The loop's old per-slot sampling callback: em_sampler_dist into dists[k], then one draw. */
typedef struct old_pick {
    em_sampler *s;
    em_sample_dist *dists;
} old_pick;

static int32_t choose_old_sampled(void *ud, int k, const float *logits) {
    old_pick *o = ud;
    em_err ignored = { 0 };
    if (em_sampler_dist(o->s, logits, &o->dists[k], &ignored)) return -1;
    return em_sampler_draw(o->s, &o->dists[k]);
}

/* The schedule's walk asked by the oracle keep, slot by slot (what the loop used to hand in). */
static bool keep_sched(void *ud, int k, float z) {
    (void)k;
    return em_draft_sched_keep(ud, z);
}

/* The in-drafter chain (greedy, seeded sampling, the keep test from plain data) gives exactly
 * what the per-slot callbacks gave: the same tokens, logits, distributions, stops, and draws
 * from the stream (the streams stay in step). */
static void test_chain_in_drafter(void **state) {
    (void)state;
    NEED_MODELS();
    ref_case c;
    load_case(first_case("dspark_specforge", "dspark"), &c);
    em_drafter *d = open_ok(draft_path[2][0], &sh_a, 0);
    OK(em_draft_add_context(d, c.feats, c.anchor_pos, E));
    int32_t toks[8], toks2[8];
    float lg[7 * VOCAB], lg2[7 * VOCAB], conf_all[7], cf[7];

    /* greedy: the argmax chain, as the argmax oracle picks it */
    replay r = { .stop_at = -1 };
    em_draft_out out = { .tokens = toks, .logits = lg, .conf_logits = conf_all };
    OK(em_draft_propose(d, c.anchor, 7, REPLAY(&r), &out, E));
    em_draft_out o2 = { .tokens = toks2, .logits = lg2 };
    OK(em_draft_propose(d, c.anchor, 7, &(em_draft_chain){ 0 }, &o2, E));
    assert_int_equal(o2.n, out.n);
    assert_memory_equal(toks2, toks, (size_t)out.n * sizeof *toks);
    assert_memory_equal(lg2, lg, sizeof lg);

    /* sampling: the same draws as the old callback from a twin stream, the same distributions */
    em_sampler_params sp = { .temperature = 1.5f, .top_k = 40, .top_p = 0.98f, .seed = 11 };
    em_sampler *s1, *s2;
    OK(em_sampler_create(&s1, &sp, VOCAB, E));
    OK(em_sampler_create(&s2, &sp, VOCAB, E));
    em_sample_dist d1[7], d2[7];
    for (int k = 0; k < 7; k++) {
        OK(em_sample_dist_init(&d1[k], VOCAB, E));
        OK(em_sample_dist_init(&d2[k], VOCAB, E));
    }
    for (int rep = 0; rep < 6; rep++) {
        old_pick op = { .s = s1, .dists = d1 };
        out = (em_draft_out){ .tokens = toks, .logits = lg };
        OK(em_draft_propose(d, c.anchor, 7, &(em_draft_chain){ .choose = choose_old_sampled, .choose_ud = &op }, &out, E));
        o2 = (em_draft_out){ .tokens = toks2, .logits = lg2 };
        /* every other round without dists: em_sampler_sample's draw, the same one */
        OK(em_draft_propose(d, c.anchor, 7, &(em_draft_chain){ .sampler = s2, .dists = rep % 2 ? NULL : d2 }, &o2, E));
        assert_int_equal(o2.n, out.n);
        assert_memory_equal(toks2, toks, (size_t)out.n * sizeof *toks);
        assert_memory_equal(lg2, lg, (size_t)out.n * VOCAB * sizeof *lg);
        for (int k = 0; k < out.n && rep % 2 == 0; k++) {
            assert_int_equal(d2[k].n, d1[k].n);
            assert_memory_equal(d2[k].ids, d1[k].ids, (size_t)d1[k].n * sizeof *d1[k].ids);
            assert_memory_equal(d2[k].probs, d1[k].probs, (size_t)d1[k].n * sizeof *d1[k].probs);
        }
    }
    double u1 = em_sampler_uniform(s1), u2 = em_sampler_uniform(s2);
    assert_memory_equal(&u1, &u2, sizeof u1); /* the streams drew alike */

    /* the keep test from plain data: the block ends where the walk over the slots'
     * confidences ends, as with the walk asked slot by slot through the keep oracle */
    OK(em_draft_propose(d, c.anchor, 7, &(em_draft_chain){ 0 }, &(em_draft_out){ .tokens = toks, .conf_logits = conf_all }, E));
    int seen[8] = { 0 };
    for (int t = 0; t < 40; t++) {
        em_draft_sched_params p = { .n_cost = 8 };
        for (int n = 1; n <= 8; n++) p.cost[n - 1] = 1.0 + 0.02 * t * n + (t % 5 == 4 && n > 3 ? 1.0 : 0.0);
        int want = em_draft_schedule(&p, conf_all, 7);
        seen[want]++;
        em_draft_sched st;
        em_draft_sched_start(&st, &p);
        out = (em_draft_out){ .tokens = toks, .logits = lg, .conf_logits = cf };
        OK(em_draft_propose(d, c.anchor, 7, &(em_draft_chain){ .keep = keep_sched, .keep_ud = &st }, &out, E));
        o2 = (em_draft_out){ .tokens = toks2, .logits = lg2 };
        OK(em_draft_propose(d, c.anchor, 7, &(em_draft_chain){ .sched = &p }, &o2, E));
        assert_int_equal(out.n, want);
        assert_int_equal(o2.n, want);
        assert_memory_equal(toks2, toks, (size_t)want * sizeof *toks);
        assert_memory_equal(lg2, lg, (size_t)want * VOCAB * sizeof *lg);
    }
    int widths = 0;
    for (int w = 0; w <= 7; w++) widths += seen[w] > 0;
    assert_true(widths >= 3); /* the tables stopped the block at several widths */

    /* chains that make no sense are refused, naming what is wrong */
    em_err err = { 0 };
    em_draft_sched_params bad = { .n_cost = EM_DRAFT_MAX_BLOCK + 2 };
    em_sample_dist small = { .cap = 5 };
    em_sample_dist smalls[7] = { small, small, small, small, small, small, small };
    const struct {
        em_draft_chain chain;
        const char *needle;
    } bads[] = {
        { { .choose = choose_replay, .choose_ud = &r, .sampler = s1 }, "both a chooser and a sampler" },
        { { .keep = keep_sched, .keep_ud = NULL, .sched = &bad }, "both a keep callback" },
        { { .dists = d1 }, "without a sampler" },
        { { .sampler = s1, .dists = smalls }, "dists[0] holds 5 ids" },
        { { .sched = &bad }, "n_cost" },
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        out = (em_draft_out){ .tokens = toks };
        assert_int_equal(em_draft_propose(d, c.anchor, 7, &bads[i].chain, &out, &err), EM_EINVAL);
        if (!strstr(err.msg, bads[i].needle)) fail_msg("chain %zu: '%s' lacks '%s'", i, err.msg, bads[i].needle);
    }
    for (int k = 0; k < 7; k++) em_sample_dist_free(&d1[k]), em_sample_dist_free(&d2[k]);
    em_sampler_free(s1);
    em_sampler_free(s2);
    em_draft_close(d);
    free_case(&c);
}

/* ---- weights lent by the target --------------------------------------------------------- */

/* True when p lies in the bytes of one of g's tensors. */
static bool in_file(const em_gguf *g, const void *p) {
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        const uint8_t *a = t->data;
        if (a && (const uint8_t *)p >= a && (const uint8_t *)p < a + t->bytes) return true;
    }
    return false;
}

/* The drafter's matrix `name` (got): its file's own when the file has that tensor, else the
 * target's lent one itself (the same view, the same bytes). Returns whether it was lent. */
static bool check_lent(const dspark *s, const char *name, const em_mat *got, const em_mat *lent) {
    if (em_gguf_find_tensor(s->g, name)) {
        assert_true(in_file(s->g, got->data));
        assert_ptr_not_equal(got->data, lent->data);
        return false;
    }
    assert_ptr_equal(got->data, lent->data);
    assert_memory_equal(got, lent, sizeof *got);
    return true;
}

/* A drafter without an embedding or LM head of its own uses the target's matrices themselves
 * (one copy); one with its own uses its file's. The taps em_draft_read_taps reads are the
 * ones the opened drafter reports. */
static void test_borrowed(void **state) {
    (void)state;
    NEED_MODELS();
    int borrowed_embd = 0, borrowed_head = 0;
    for (int i = 0; i < N_DRAFTERS; i++) {
        const char *path = draft_path[i][0];
        em_drafter *d = open_ok(path, &sh_a, 0);
        const dspark *s = (const dspark *)d;
        const bool embd = check_lent(s, "token_embd.weight", &s->embd, sh_a.token_embd);
        const bool head = check_lent(s, "output.weight", &s->head, sh_a.output);
        borrowed_embd += embd, borrowed_head += head;
        int taps[EM_DRAFT_MAX_TAPS], n_taps;
        OK(em_draft_read_taps(path, taps, &n_taps, E));
        assert_int_equal(n_taps, em_draft_get_info(d)->n_taps);
        assert_memory_equal(taps, em_draft_get_info(d)->taps, (size_t)n_taps * sizeof *taps);
        printf("  %s: embedding %s, LM head %s\n", drafters[i], embd ? "the target's" : "own",
               head ? "the target's" : "own");
        em_draft_close(d);
    }
    assert_true(borrowed_embd > 0 && borrowed_head > 0); /* the fixtures cover both ways */
}

/* ---- bad input --------------------------------------------------------------------------- */

static void expect_open_fail(const char *draft, const em_target_shared *target, int code, const char *const *needles) {
    em_err err = { 0 };
    em_drafter *d = (em_drafter *)&err; /* must be reset to NULL */
    int rc = em_draft_open(&d, draft, target, NULL, &err);
    if (rc != code) fail_msg("open %s with %s: %d (%s), want %d", draft, target->path, rc, err.msg, code);
    assert_null(d);
    for (int i = 0; needles && needles[i]; i++)
        if (!strstr(err.msg, needles[i])) fail_msg("message '%s' lacks '%s'", err.msg, needles[i]);
    printf("  refused: %s\n", err.msg);
}

/* sh_a as another target would lend it: another file name, and one difference. */
static em_target_shared lent(const char *name) {
    em_target_shared t = sh_a;
    t.path = name; /* named in messages only */
    return t;
}

static void test_mismatch(void **state) {
    (void)state;
    NEED_MODELS();
    /* hidden size: kimi_b is 64 wide */
    expect_open_fail(draft_path[0][0], &sh_b, EM_EINVAL,
                     (const char *const[]){ "hidden size 96", "64", draft_path[0][0], target_b, NULL });
    /* vocabulary: a target of another vocab_size */
    em_target_shared v600 = lent("target_v600.gguf");
    v600.n_vocab = 600;
    expect_open_fail(draft_path[0][0], &v600, EM_EINVAL, (const char *const[]){ "vocabulary 512", "600", v600.path, NULL });
    /* taps: DeepSpec taps layers 0 and 2; a 3-layer target makes 2 its last layer, a 2-layer
     * target lacks it */
    em_target_shared t3 = lent("target_l3.gguf"), t2 = lent("target_l2.gguf");
    t3.n_layer = 3, t2.n_layer = 2;
    expect_open_fail(draft_path[0][0], &t3, EM_EINVAL, (const char *const[]){ "tap 1 is layer 2", "last layer", t3.path, NULL });
    expect_open_fail(draft_path[0][0], &t2, EM_EINVAL,
                     (const char *const[]){ "tap 1 is layer 2", "has 2 layers", draft_path[0][0], NULL });
    /* a drafter without its own embedding borrows the target's: a target lending none fails */
    em_target_shared no_embd = lent("target_noembd.gguf");
    no_embd.token_embd = NULL;
    expect_open_fail(draft_path[2][0], &no_embd, EM_ENOTFOUND,
                     (const char *const[]){ "token_embd.weight", draft_path[2][0], no_embd.path, NULL });
    /* ... while one that carries its own (DeepSpec) does not need it */
    em_drafter *d = open_ok(draft_path[0][0], &no_embd, 0);
    em_draft_close(d);
    /* a lent matrix of another shape (kimi_b's, 64 wide) names both files and the shapes */
    em_target_shared narrow = lent("target_narrow.gguf");
    narrow.token_embd = sh_b.token_embd;
    expect_open_fail(draft_path[2][0], &narrow, EM_EFORMAT,
                     (const char *const[]){ "token_embd.weight", "of 64 values", "wants 512 of 96", draft_path[2][0],
                                            narrow.path, NULL });
}

static void test_bad_files(void **state) {
    (void)state;
    NEED_MODELS();
    /* swapped roles, missing files */
    expect_open_fail(target_f32, &sh_a, EM_EUNSUPPORTED, (const char *const[]){ "not a drafter", NULL });
    em_err err = { 0 };
    int taps[EM_DRAFT_MAX_TAPS], n_taps = 1;
    assert_int_equal(em_draft_read_taps(target_f32, taps, &n_taps, &err), EM_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "not a drafter"));
    assert_int_equal(n_taps, 0);
    /* a drafter is no target: the model refuses it, and a target lent as one is refused too */
    em_target *t = NULL;
    assert_int_equal(em_model_open(&t, draft_path[1][0], NULL, &err), EM_EUNSUPPORTED);
    assert_null(t);
    em_target_shared as_target = { .path = draft_path[1][0], .arch = "dflash", .n_embd = HIDDEN, .n_layer = 4,
                                   .n_vocab = VOCAB };
    expect_open_fail(draft_path[0][0], &as_target, EM_EINVAL, (const char *const[]){ "itself a drafter", NULL });
    /* a target whose file was cut short opens for its sizes, but lends nothing to read */
    size_t size;
    void *bytes = em_test_read(target_f32, &size);
    const char *cut = em_test_path("target_cut.gguf");
    em_test_write(cut, bytes, size - 4096);
    free(bytes);
    em_target_shared none;
    OK(em_model_open(&t, cut, NULL, E));
    assert_int_equal(em_target_shared_weights(t, &none, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "tensor data is missing"));
    assert_null(none.token_embd);
    em_target_close(t);
    expect_open_fail(em_test_path("nope.gguf"), &sh_a, EM_EIO, NULL);
    assert_int_equal(em_draft_read_taps(em_test_path("nope.gguf"), taps, &n_taps, &err), EM_EIO);
    assert_non_null(strstr(err.msg, "nope.gguf"));
    /* a missing tensor, a missing key, unsupported values */
    const char *no_q = em_test_path("no_q.gguf");
    rewrite(draft_path[0][0], no_q, NULL, (const char *const[]){ "blk.1.attn_q.weight", NULL }, NULL, NULL);
    expect_open_fail(no_q, &sh_a, EM_ENOTFOUND, (const char *const[]){ "blk.1.attn_q.weight", no_q, NULL });
    const char *no_eps = em_test_path("no_eps.gguf");
    rewrite(draft_path[0][0], no_eps, (const char *const[]){ "dflash.attention.layer_norm_rms_epsilon", NULL }, NULL,
            NULL, NULL);
    expect_open_fail(no_eps, &sh_a, EM_ENOTFOUND, (const char *const[]){ "layer_norm_rms_epsilon", NULL });
    const char *no_taps = em_test_path("no_taps.gguf");
    rewrite(draft_path[0][0], no_taps, (const char *const[]){ "dflash.target_layers", NULL }, NULL, NULL, NULL);
    assert_int_equal(em_draft_read_taps(no_taps, taps, &n_taps, &err), EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, "dflash.target_layers"));
    assert_non_null(strstr(err.msg, no_taps));
    kv rope[] = { { .key = "dflash.rope.scaling.type", .type = EM_GGUF_STR, .s = "dynamic" }, { 0 } };
    expect_open_fail(with_keys(draft_path[2][0], "rope_dyn.gguf", rope), &sh_a, EM_EUNSUPPORTED,
                     (const char *const[]){ "dynamic", NULL });
    kv markov[] = { { .key = "dflash.markov_head_type", .type = EM_GGUF_STR, .s = "lstm" }, { 0 } };
    expect_open_fail(with_keys(draft_path[0][0], "markov_lstm.gguf", markov), &sh_a, EM_EUNSUPPORTED,
                     (const char *const[]){ "lstm", NULL });
    kv block[] = { { .key = "dflash.block_size", .type = EM_GGUF_U32, .u = 99 }, { 0 } };
    expect_open_fail(with_keys(draft_path[0][0], "block99.gguf", block), &sh_a, EM_EFORMAT,
                     (const char *const[]){ "block_size", NULL });
    kv mask[] = { { .key = "tokenizer.ggml.mask_token_id", .type = EM_GGUF_U32, .u = 512 }, { 0 } };
    expect_open_fail(with_keys(draft_path[0][0], "mask512.gguf", mask), &sh_a, EM_EFORMAT,
                     (const char *const[]){ "mask_token_id", NULL });
    kv heads[] = { { .key = "dflash.attention.head_count_kv", .type = EM_GGUF_U32, .u = 3 }, { 0 } };
    expect_open_fail(with_keys(draft_path[0][0], "kv3.gguf", heads), &sh_a, EM_EFORMAT,
                     (const char *const[]){ "KV heads", NULL });
    kv eps[] = { { .key = "dflash.attention.layer_norm_rms_epsilon", .type = EM_GGUF_STR, .s = "1e-6" }, { 0 } };
    expect_open_fail(with_keys(draft_path[0][0], "eps_str.gguf", eps), &sh_a, EM_EFORMAT,
                     (const char *const[]){ "layer_norm_rms_epsilon", NULL });
}

static void test_arguments(void **state) {
    (void)state;
    em_err err = { 0 };
    em_drafter *d = NULL;
    const em_target_shared b = { .path = "b" }, unnamed = { 0 };
    assert_int_equal(em_draft_open(NULL, "a", &b, NULL, &err), EM_EINVAL);
    assert_int_equal(em_draft_open(&d, NULL, &b, NULL, &err), EM_EINVAL);
    assert_int_equal(em_draft_open(&d, "a", NULL, NULL, &err), EM_EINVAL);
    assert_int_equal(em_draft_open(&d, "a", &unnamed, NULL, &err), EM_EINVAL);
    assert_int_equal(em_draft_open(&d, "", &b, NULL, &err), EM_EINVAL);
    assert_int_equal(em_draft_open(&d, "a", &b, &(em_draft_opts){ .n_threads = -1 }, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "threads"));
    assert_int_equal(em_draft_open(&d, "a", &b, &(em_draft_opts){ .n_ctx = -5 }, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "context"));
    assert_null(d);
    int taps[EM_DRAFT_MAX_TAPS], n_taps;
    assert_int_equal(em_draft_read_taps(NULL, taps, &n_taps, &err), EM_EINVAL);
    assert_int_equal(em_draft_read_taps("", taps, &n_taps, &err), EM_EINVAL);
    assert_int_equal(em_draft_read_taps("a", NULL, &n_taps, &err), EM_EINVAL);
    assert_int_equal(em_draft_read_taps("a", taps, NULL, &err), EM_EINVAL);
    float f[4] = { 0 };
    int32_t t[4];
    em_draft_out out = { .tokens = t };
    assert_int_equal(em_draft_add_context(NULL, f, 1, &err), EM_EINVAL);
    assert_int_equal(em_draft_propose(NULL, 0, 1, REPLAY(NULL), &out, &err), EM_EINVAL);
    em_draft_close(NULL);
    em_draft_reset(NULL);
    assert_null(em_draft_get_info(NULL));
    if (!have_models) return;

    d = open_ok(draft_path[0][0], &sh_a, 8);
    const em_draft_info *info = em_draft_get_info(d);
    float *feats = calloc((size_t)info->n_feat * 2, sizeof *feats);
    assert_non_null(feats);
    assert_int_equal(em_draft_add_context(d, feats, -1, &err), EM_EINVAL);
    assert_int_equal(em_draft_add_context(d, NULL, 1, &err), EM_EINVAL);
    OK(em_draft_add_context(d, NULL, 0, E));
    feats[info->n_feat + 5] = NAN;
    assert_int_equal(em_draft_add_context(d, feats, 2, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "row 1 value 5"));
    feats[info->n_feat + 5] = INFINITY;
    assert_int_equal(em_draft_add_context(d, feats, 2, &err), EM_EINVAL);
    assert_int_equal(info->n_ctx, 0);
    OK(em_draft_add_context(d, feats, 1, E));
    replay r = { .stop_at = -1 };
    assert_int_equal(em_draft_propose(d, 0, 1, REPLAY(&r), NULL, &err), EM_EINVAL);
    out.tokens = NULL;
    assert_int_equal(em_draft_propose(d, 0, 1, REPLAY(&r), &out, &err), EM_EINVAL);
    out.tokens = t;
    assert_int_equal(em_draft_propose(d, 0, 1, NULL, &out, &err), EM_EINVAL);
    assert_int_equal(em_draft_propose(d, 0, 0, REPLAY(&r), &out, &err), EM_EINVAL);
    assert_int_equal(em_draft_propose(d, -1, 1, REPLAY(&r), &out, &err), EM_EINVAL);
    assert_int_equal(em_draft_propose(d, VOCAB, 1, REPLAY(&r), &out, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "anchor"));
    assert_int_equal(r.calls, 0);
    OK(em_draft_propose(d, VOCAB - 1, 4, REPLAY(&r), &out, E)); /* n_max 4 < 7 drafts */
    assert_int_equal(out.n, 4);
    em_draft_close(d);
    free(feats);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dspark_f32),     cmocka_unit_test(test_dspark_bf16),
        cmocka_unit_test(test_dflash_convention), cmocka_unit_test(test_calibration),
        cmocka_unit_test(test_q8_0_sanity),    cmocka_unit_test(test_context_and_choice),
        cmocka_unit_test(test_chain_in_drafter),
        cmocka_unit_test(test_borrowed),       cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
