/* Tests for the decode loop (decode/) over the kimi_a fixture converted to F32 by the CLI
 * ($EMBER_BIN convert), opened with em_model_open. References are computed independently of
 * the loop: every token of a chain is checked against the target's logits of one fresh
 * full-sequence verify over prompt + the tokens before it (no prefill, no commits).
 *
 *  - greedy: the loop's tokens are the argmax chain of those logits;
 *  - sampling: the same seed gives the same tokens, other seeds give others, and with top-k 3
 *    every sampled token is among the reference row's 3 best;
 *  - stopping: n_max (passes = n_gen - 1), an end-of-generation id (a tokenizer copy whose
 *    eos is the chain's 4th token: three tokens, EOG not passed on; ignore_eog runs through),
 *    a stop from the callback, a context that fills up;
 *  - text: the streamed bytes concatenated equal em_tok_decode of the ids (control tokens
 *    skipped); no tokenizer gives empty text;
 *  - errors: a prompt longer than the context, ids out of range, n_max < 1, an empty prompt,
 *    a verify width without a drafter; the session still works afterwards.
 *
 * Speculation (issue 6), with drafters written here through em_drafter_ops (an oracle that
 * proposes the target's own greedy continuation, a random one, a "noisy" one whose logits are
 * the target's exact rows plus noise) and the real DSpark fixture drafters:
 *  - the parts alone: the feature ring (every dtype, Q8_0 padding, wrap-around, bounds), the
 *    scheduler on synthetic survivals and cost curves, greedy acceptance, and rejection
 *    sampling's first token against the target distribution on synthetic rows;
 *  - greedy speculative output is token-identical to plain greedy output on many prompts,
 *    targets (kimi_a F32 and Q8_0, kimi_c) and drafters, at every fixed width 1..8 and every
 *    feature dtype; the features the drafter receives equal a reference verify's (per-dtype
 *    tolerance); stops (EOG, n_max, the callback) land exactly inside a block;
 *  - the committed rows' logits after any accept pattern equal a full-sequence reference
 *    within 1e-5 relative; every commit is fast, no replays;
 *  - sampling is lossless: over thousands of seeded runs the joint distribution of the first
 *    three tokens matches the exact one computed from the target's rows (chi-square, p ~ 1e-4),
 *    with the scheduler on (a proxy target with a linear cost) and with a fixed width;
 *  - bad input: drafter/target mismatches and verify widths out of range;
 *  - the DSpark fixture drafters (tests/fixtures/dspark_*, converted, opened with em_draft_open
 *    against kimi_a, the target opened with their taps): greedy output identical to plain at
 *    the automatic width and fixed widths, every dtype; seeded sampling reproducible. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "draft/draft.h"
#include "draft_oldpath.h"
#include "format/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "decode/decode.h"
#include "decode/decode_impl.h"
#include "text/text.h"

#define MAX_GEN 160

static char g_model[600], g_model_q8[600], g_model_c[600];
static em_tok *g_tok;
static em_target *g_t;   /* the loop's target */
static em_target *g_ref; /* a second instance for reference logits (and features) */
static bool g_have;

/* Targets for speculation: each fixture as a plain target (the greedy reference) and as one
 * capturing the taps' features for a drafter. */
static const int g_taps[2] = { 0, 2 };
#define N_TAPS 2
static em_target *g_tf;           /* kimi_a F32, features */
static em_target *g_q8, *g_q8f;   /* kimi_a Q8_0 plain / features */
static em_target *g_c, *g_cf;     /* kimi_c F32 plain / features */

/* One thread: the fixtures are tiny, and a pool's hand-offs would dominate (and the machine
 * is shared). */
static int open_target(const char *path, bool features, em_target **t, em_err *err) {
    em_model_opts mo = { .n_threads = 1 };
    if (features) mo.feature_layers = g_taps, mo.n_feature_layers = N_TAPS;
    return em_model_open(t, path, &mo, err);
}

static int setup(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) {
        fprintf(stderr, "EMBER_BIN is not set: spec tests are skipped\n");
        return 0;
    }
    if (em_test_convert_fixture(bin, "kimi_a", "f32", g_model, sizeof g_model) ||
        em_test_convert_fixture(bin, "kimi_a", "q8_0", g_model_q8, sizeof g_model_q8) ||
        em_test_convert_fixture(bin, "kimi_c", "f32", g_model_c, sizeof g_model_c))
        return -1;
    em_err err = { 0 };
    em_gguf *g = NULL;
    if (em_gguf_open(&g, g_model, &err) || em_tok_create(&g_tok, g, NULL, &err) ||
        open_target(g_model, false, &g_t, &err) || open_target(g_model, true, &g_ref, &err) ||
        open_target(g_model, true, &g_tf, &err) || open_target(g_model_q8, false, &g_q8, &err) ||
        open_target(g_model_q8, true, &g_q8f, &err) || open_target(g_model_c, false, &g_c, &err) ||
        open_target(g_model_c, true, &g_cf, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        em_gguf_close(g);
        return -1;
    }
    em_gguf_close(g);
    g_have = true;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    em_target *all[] = { g_t, g_ref, g_tf, g_q8, g_q8f, g_c, g_cf };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_target_close(all[i]);
    em_tok_free(g_tok);
    return 0;
}

#define NEED_MODEL()                                                                           \
    do {                                                                                       \
        if (!g_have) skip();                                                                   \
    } while (0)

/* ---- reference -------------------------------------------------------------------------- */

/* The logits of the last row of one full-sequence verify of seq[0..n) on a fresh state. */
static float *ref_last_row(const int32_t *seq, int n) {
    int vocab = em_target_get_info(g_ref)->n_vocab;
    float *all = malloc((size_t)n * (size_t)vocab * sizeof *all);
    assert_non_null(all);
    em_target_reset(g_ref);
    em_rows rows = { .logits = all };
    OK(em_target_verify(g_ref, seq, n, &rows, E));
    float *last = malloc((size_t)vocab * sizeof *last);
    assert_non_null(last);
    memcpy(last, all + (size_t)(n - 1) * (size_t)vocab, (size_t)vocab * sizeof *last);
    free(all);
    return last;
}

/* Checks that gen[0..n_gen) is the greedy chain after prompt. A near tie in the reference
 * (top two within 1e-5 of the scale) may go either way; the check stops there. */
static void check_greedy_chain(const int32_t *prompt, int n_prompt, const int32_t *gen, int n_gen) {
    int vocab = em_target_get_info(g_ref)->n_vocab;
    int32_t *seq = malloc((size_t)(n_prompt + n_gen) * sizeof *seq);
    assert_non_null(seq);
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    memcpy(seq + n_prompt, gen, (size_t)n_gen * sizeof *seq);
    for (int i = 0; i < n_gen; i++) {
        float *row = ref_last_row(seq, n_prompt + i);
        int32_t best = em_argmax(row, vocab);
        float second = -INFINITY, scale = 0;
        for (int v = 0; v < vocab; v++) {
            if (v != best && row[v] > second) second = row[v];
            if (fabsf(row[v]) > scale) scale = fabsf(row[v]);
        }
        bool tie = row[best] - second < 1e-5f * scale;
        if (gen[i] != best && tie) {
            fprintf(stderr, "note: near tie at generated token %d (%d vs %d): chain checked up to here\n", i,
                    gen[i], best);
            free(row);
            break;
        }
        if (gen[i] != best) fail_msg("generated token %d is %d, the reference argmax is %d", i, gen[i], best);
        free(row);
    }
    free(seq);
}

/* ---- collecting the loop's output -------------------------------------------------------- */

typedef struct collect {
    int32_t ids[MAX_GEN];
    int n;
    char text[MAX_GEN * 64];
    size_t len;
    int stop_after; /* return nonzero on this many tokens; 0: never */
    int flush_calls, calls_after_stop;
    int held; /* tokens whose bytes were held back (a UTF-8 sequence left unfinished) */
} collect;

static int on_token(void *ud, int32_t token, const char *bytes, size_t len) {
    collect *c = ud;
    assert_true(len < sizeof c->text - c->len);
    if (len) {
        assert_non_null(bytes);
        memcpy(c->text + c->len, bytes, len);
        c->len += len;
    }
    if (token < 0) {
        c->flush_calls++;
        return 0;
    }
    if (c->stop_after && c->n >= c->stop_after) c->calls_after_stop++;
    size_t piece_len = 0;
    if (g_tok && em_tok_type_of(g_tok, token) == EM_TOK_NORMAL && em_tok_piece(g_tok, token, &piece_len) &&
        piece_len > len)
        c->held++;
    assert_true(c->n < MAX_GEN);
    c->ids[c->n++] = token;
    return c->stop_after && c->n == c->stop_after;
}

static em_decode_params greedy(int n_max) {
    em_decode_params p = { .n_max = n_max, .ignore_eog = true };
    p.sampling.temperature = 0;
    return p;
}

static em_decode_params sampled(int n_max, uint64_t seed, int top_k) {
    em_decode_params p = { .n_max = n_max, .ignore_eog = true };
    p.sampling = (em_sampler_params){ .temperature = 1.0f, .top_k = top_k, .top_p = 1.0f, .min_p = 0, .seed = seed };
    return p;
}

/* A prompt: Kimi's chat format around text. */
static int32_t *chat_prompt(const char *text, int *n) {
    em_chat_msg m = { .role = "user", .content = text };
    int32_t *ids;
    size_t n_ids;
    OK(em_chat_encode_kimi(g_tok, &m, 1, true, &ids, &n_ids, E));
    *n = (int)n_ids;
    return ids;
}

static void run_loop(em_decode *s, const int32_t *prompt, int n_prompt, const em_decode_params *p, collect *c,
                     em_decode_result *r) {
    OK(em_decode_generate(s, prompt, n_prompt, p, on_token, c, r, E));
    assert_int_equal(r->n_gen, c->n);
    assert_int_equal(r->n_prompt, n_prompt);
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_greedy_chain(void **state) {
    (void)state;
    NEED_MODEL();
    em_decode *s;
    em_decode_opts o = { .tok = g_tok };
    OK(em_decode_create(&s, g_t, &o, E));
    int n_prompt;
    int32_t *prompt = chat_prompt("Hello, who are you?", &n_prompt);
    em_decode_params p = greedy(20);
    collect c = { 0 };
    em_decode_result r;
    run_loop(s, prompt, n_prompt, &p, &c, &r);
    assert_int_equal(c.n, 20);
    assert_int_equal(r.finish, EM_DECODE_LENGTH);
    check_greedy_chain(prompt, n_prompt, c.ids, c.n);
    /* plain decoding: one row per pass, every commit from the log */
    assert_int_equal(r.passes, 19);
    assert_int_equal(r.drafted, 0);
    assert_int_equal(r.accepted, 0);
    assert_int_equal(r.fast_commits, 19);
    assert_int_equal(r.full_replays, 0);
    assert_int_equal(r.failed_fallbacks, 0);
    assert_true(r.prompt_seconds > 0 && r.gen_seconds > 0);

    /* a second call starts over from an empty sequence: same tokens */
    collect c2 = { 0 };
    run_loop(s, prompt, n_prompt, &p, &c2, &r);
    assert_memory_equal(c.ids, c2.ids, sizeof c.ids);

    /* a short plain prompt too */
    int32_t plain[3] = { 72, 316, 111 };
    collect c3 = { 0 };
    p = greedy(12);
    run_loop(s, plain, 3, &p, &c3, &r);
    check_greedy_chain(plain, 3, c3.ids, c3.n);
    free(prompt);
    em_decode_free(s);
}

static void test_sampling(void **state) {
    (void)state;
    NEED_MODEL();
    em_decode *s;
    OK(em_decode_create(&s, g_t, &(em_decode_opts){ .tok = g_tok }, E));
    int n_prompt;
    int32_t *prompt = chat_prompt("Tell me a story.", &n_prompt);
    em_decode_params p = sampled(16, 42, 0);
    collect a = { 0 }, b = { 0 }, d = { 0 };
    em_decode_result r;
    run_loop(s, prompt, n_prompt, &p, &a, &r);
    run_loop(s, prompt, n_prompt, &p, &b, &r);
    assert_int_equal(a.n, 16);
    assert_memory_equal(a.ids, b.ids, sizeof a.ids);
    p.sampling.seed = 43;
    run_loop(s, prompt, n_prompt, &p, &d, &r);
    assert_int_equal(d.n, 16);
    assert_true(memcmp(a.ids, d.ids, 16 * sizeof *a.ids) != 0);
    /* differs from greedy too (the random model's rows are far from one-hot) */
    em_decode_params gp = greedy(16);
    collect gr = { 0 };
    run_loop(s, prompt, n_prompt, &gp, &gr, &r);
    assert_true(memcmp(a.ids, gr.ids, 16 * sizeof *a.ids) != 0);

    /* top-k 3: each token is among the 3 best of the reference row at its position */
    p = sampled(10, 7, 3);
    collect k = { 0 };
    run_loop(s, prompt, n_prompt, &p, &k, &r);
    int vocab = em_target_get_info(g_ref)->n_vocab;
    int32_t *seq = malloc((size_t)(n_prompt + k.n) * sizeof *seq);
    assert_non_null(seq);
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    memcpy(seq + n_prompt, k.ids, (size_t)k.n * sizeof *seq);
    for (int i = 0; i < k.n; i++) {
        float *row = ref_last_row(seq, n_prompt + i);
        int above = 0;
        for (int v = 0; v < vocab; v++) above += row[v] > row[k.ids[i]];
        if (above >= 3) fail_msg("sampled token %d (%d) is not among the top 3 (%d above it)", i, k.ids[i], above);
        free(row);
    }
    free(seq);
    free(prompt);
    em_decode_free(s);
}

/* A tokenizer like g_tok whose eos is eos: the tokenizer keys copied into a new GGUF. */
static em_tok *tok_with_eos(int32_t eos) {
    em_gguf *g;
    OK(em_gguf_open(&g, g_model, E));
    const char *path = em_test_path("tok_eos.gguf");
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, path, NULL, E));
    for (int64_t i = 0; i < em_gguf_n_keys(g); i++) {
        const char *key = em_gguf_key(g, i);
        if (strncmp(key, "tokenizer.", 10) || !strcmp(key, "tokenizer.ggml.eos_token_id")) continue;
        em_gguf_value v = em_gguf_value_at(g, i);
        OK(em_gguf_writer_set_value(w, key, &v, E));
    }
    OK(em_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos, E));
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
    em_gguf_close(g);
    em_gguf *g2;
    OK(em_gguf_open(&g2, path, E));
    em_tok *t;
    OK(em_tok_create(&t, g2, NULL, E));
    em_gguf_close(g2);
    return t;
}

static void test_stopping(void **state) {
    (void)state;
    NEED_MODEL();
    int32_t prompt[4] = { 72, 316, 111, 259 };
    em_decode *s;
    OK(em_decode_create(&s, g_t, &(em_decode_opts){ .tok = g_tok }, E));
    em_decode_result r;

    /* n_max */
    em_decode_params p = greedy(5);
    collect c = { 0 };
    run_loop(s, prompt, 4, &p, &c, &r);
    assert_int_equal(c.n, 5);
    assert_int_equal(r.finish, EM_DECODE_LENGTH);
    assert_int_equal(r.passes, 4);
    p = greedy(1);
    collect one = { 0 };
    run_loop(s, prompt, 4, &p, &one, &r);
    assert_int_equal(one.n, 1);
    assert_int_equal(one.ids[0], c.ids[0]);
    assert_int_equal(r.passes, 0);

    /* the callback's stop */
    p = greedy(10);
    collect st = { .stop_after = 3 };
    run_loop(s, prompt, 4, &p, &st, &r);
    assert_int_equal(st.n, 3);
    assert_int_equal(st.calls_after_stop, 0);
    assert_int_equal(r.finish, EM_DECODE_STOPPED);
    assert_memory_equal(st.ids, c.ids, 3 * sizeof *c.ids);
    em_decode_free(s);

    /* end of generation: a tokenizer whose eos is the chain's 4th token (when the first three
     * are different from it) */
    int32_t eos = c.ids[3];
    if (eos == c.ids[0] || eos == c.ids[1] || eos == c.ids[2] || em_tok_is_eog(g_tok, c.ids[0]) ||
        em_tok_is_eog(g_tok, c.ids[1]) || em_tok_is_eog(g_tok, c.ids[2]))
        fail_msg("the fixture's greedy chain repeats early; pick another prompt for this test");
    em_tok *t = tok_with_eos(eos);
    assert_true(em_tok_is_eog(t, eos));
    OK(em_decode_create(&s, g_t, &(em_decode_opts){ .tok = t }, E));
    p = greedy(10);
    p.ignore_eog = false;
    collect e = { 0 };
    run_loop(s, prompt, 4, &p, &e, &r);
    assert_int_equal(e.n, 3);
    assert_int_equal(r.finish, EM_DECODE_EOG);
    assert_int_equal(r.passes, 3); /* the third pass gave the EOG token */
    assert_memory_equal(e.ids, c.ids, 3 * sizeof *c.ids);
    p.ignore_eog = true;
    p.n_max = 5;
    collect ig = { 0 };
    run_loop(s, prompt, 4, &p, &ig, &r);
    assert_int_equal(ig.n, 5);
    assert_int_equal(r.finish, EM_DECODE_LENGTH);
    assert_memory_equal(ig.ids, c.ids, 5 * sizeof *c.ids);
    em_decode_free(s);
    em_tok_free(t);
}

static void test_context_fills(void **state) {
    (void)state;
    NEED_MODEL();
    em_target *t;
    OK(em_model_open(&t, g_model, &(em_model_opts){ .n_threads = 2, .n_ctx = 8 }, E));
    em_decode *s;
    OK(em_decode_create(&s, t, &(em_decode_opts){ .tok = g_tok }, E));
    int32_t prompt[9] = { 72, 316, 111, 259, 263, 117, 115, 260, 72 };
    em_decode_params p = greedy(50);
    em_decode_result r;

    /* 5 prompt tokens in 8 positions: the prefill's token and 3 more passes */
    collect c = { 0 };
    run_loop(s, prompt, 5, &p, &c, &r);
    assert_int_equal(c.n, 4);
    assert_int_equal(r.finish, EM_DECODE_LENGTH);
    check_greedy_chain(prompt, 5, c.ids, c.n);
    /* a prompt that fills the context still gives the token after it */
    collect full = { 0 };
    run_loop(s, prompt, 8, &p, &full, &r);
    assert_int_equal(full.n, 1);
    assert_int_equal(r.finish, EM_DECODE_LENGTH);

    /* one token too many is an error that says so */
    em_err err = { 0 };
    collect none = { 0 };
    assert_int_equal(em_decode_generate(s, prompt, 9, &p, on_token, &none, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "9 tokens"));
    assert_non_null(strstr(err.msg, "context of 8"));
    assert_int_equal(none.n, 0);
    em_decode_free(s);
    em_target_close(t);
}

static void test_streamed_text(void **state) {
    (void)state;
    NEED_MODEL();
    em_decode *s;
    OK(em_decode_create(&s, g_t, &(em_decode_opts){ .tok = g_tok }, E));
    int n_prompt;
    int32_t *prompt = chat_prompt("Write something.", &n_prompt);
    /* several seeds at a high temperature: byte tokens cut UTF-8 sequences, control tokens
     * come up; the concatenation must still be the decode of the ids */
    int held = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        em_decode_params p = sampled(MAX_GEN, seed, 0);
        p.sampling.temperature = 2.0f;
        collect c = { 0 };
        em_decode_result r;
        run_loop(s, prompt, n_prompt, &p, &c, &r);
        char *want;
        size_t len;
        OK(em_tok_decode(g_tok, c.ids, (size_t)c.n, EM_TOK_SKIP_SPECIAL, &want, &len, E));
        assert_int_equal(c.len, len);
        assert_memory_equal(c.text, want, len);
        assert_true(c.flush_calls <= 1);
        held += c.held;
        free(want);
    }
    assert_true(held > 0); /* the held-back path was exercised */
    em_decode_free(s);

    /* no tokenizer: tokens but no text, and EOG ids are not known */
    OK(em_decode_create(&s, g_t, NULL, E));
    em_decode_params p = greedy(6);
    p.ignore_eog = false;
    collect c = { 0 };
    em_decode_result r;
    run_loop(s, prompt, n_prompt, &p, &c, &r);
    assert_int_equal(c.n, 6);
    assert_int_equal(c.len, 0);
    assert_int_equal(c.flush_calls, 0);
    /* and no callback at all */
    OK(em_decode_generate(s, prompt, n_prompt, &p, NULL, NULL, &r, E));
    assert_int_equal(r.n_gen, 6);
    free(prompt);
    em_decode_free(s);
}

static void test_errors(void **state) {
    (void)state;
    NEED_MODEL();
    em_err err = { 0 };
    em_decode *s = NULL;
    assert_int_equal(em_decode_create(&s, g_t, &(em_decode_opts){ .verify_width = 4 }, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "drafter"));
    assert_null(s);
    assert_int_equal(em_decode_create(&s, g_t, &(em_decode_opts){ .verify_width = -1 }, &err), EM_EINVAL);
    OK(em_decode_create(&s, g_t, &(em_decode_opts){ .tok = g_tok, .verify_width = 1 }, E));

    int32_t prompt[3] = { 72, 316, 111 };
    em_decode_result r;
    collect c = { 0 };
    em_decode_params p = greedy(4);
    int32_t bad[3] = { 72, 512, 111 };
    assert_int_equal(em_decode_generate(s, bad, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "512"));
    bad[1] = -1;
    assert_int_equal(em_decode_generate(s, bad, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "-1"));
    assert_int_equal(em_decode_generate(s, prompt, 0, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "empty"));
    p.n_max = 0;
    assert_int_equal(em_decode_generate(s, prompt, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "n_max"));
    p = greedy(4);
    p.sampling.temperature = NAN;
    assert_int_equal(em_decode_generate(s, prompt, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_int_equal(c.n, 0);

    /* the session still works, from an empty sequence */
    p = greedy(4);
    run_loop(s, prompt, 3, &p, &c, &r);
    check_greedy_chain(prompt, 3, c.ids, c.n);
    em_decode_free(s);
    em_decode_free(NULL);
}

/* ==== speculation (issue 6) ================================================================= */

/* ---- the parts alone: ring, schedule, acceptance ------------------------------------------ */

static void test_ring(void **state) {
    (void)state;
    enum { NF = 100, CAP = 5, N = 7 }; /* 100 features: Q8_0 pads each row to 128 */
    float rows[N][NF], back[N][NF];
    uint64_t rng = 11;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < NF; j++) rows[i][j] = em_test_randf(&rng) * (float)(1 + i) * (j % 7 == 0 ? 10.0f : 1.0f);
    const int types[4] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16, EM_TYPE_Q8_0 };
    const size_t bytes[4] = { NF * 4, NF * 2, NF * 2, 4 * 34 };
    for (int t = 0; t < 4; t++) {
        em_decode_ring *r;
        OK(em_decode_ring_create(&r, NF, CAP, types[t], E));
        assert_int_equal(em_decode_ring_row_bytes(r), bytes[t]);
        OK(em_decode_ring_push(r, 0, rows[0], 3, E));
        OK(em_decode_ring_push(r, 3, rows[3], 4, E)); /* wraps: positions 2..6 held */
        assert_int_equal(em_decode_ring_end(r), 7);
        OK(em_decode_ring_read(r, 2, 5, back[2], E));
        for (int i = 2; i < N; i++) {
            for (int b = 0; b < NF; b += 32) { /* per 32-value block: the type's own error bound */
                float amax = 0;
                for (int j = b; j < b + 32 && j < NF; j++) amax = fmaxf(amax, fabsf(rows[i][j]));
                for (int j = b; j < b + 32 && j < NF; j++) {
                    float want = rows[i][j], got = back[i][j], d = fabsf(got - want);
                    float tol = types[t] == EM_TYPE_F32    ? 0.0f
                                : types[t] == EM_TYPE_F16  ? fabsf(want) * 1e-3f + 1e-7f
                                : types[t] == EM_TYPE_BF16 ? fabsf(want) * 8e-3f + 1e-30f
                                                           : amax / 127.0f * 0.5f * 1.01f + amax * 1e-3f;
                    if (d > tol) fail_msg("%s row %d value %d: %g for %g", em_type_name(types[t]), i, j, got, want);
                }
            }
        }
        /* out of the held window, or not in order: refused with a message */
        em_err err = { 0 };
        assert_int_equal(em_decode_ring_read(r, 1, 2, back[0], &err), EM_EINVAL);
        assert_non_null(strstr(err.msg, "[2, 7)"));
        assert_int_equal(em_decode_ring_read(r, 5, 3, back[0], &err), EM_EINVAL);
        assert_int_equal(em_decode_ring_push(r, 9, rows[0], 1, &err), EM_EINVAL);
        assert_non_null(strstr(err.msg, "next position is 7"));
        /* more rows than the ring holds in one push: the last CAP stay */
        em_decode_ring_reset(r);
        OK(em_decode_ring_push(r, 0, rows[0], N, E));
        OK(em_decode_ring_read(r, N - CAP, CAP, back[0], E));
        if (types[t] == EM_TYPE_F32) assert_memory_equal(back[0], rows[N - CAP], sizeof(float) * NF * CAP);
        em_decode_ring_free(r);
    }
    em_decode_ring *r = NULL;
    em_err err = { 0 };
    assert_int_equal(em_decode_ring_create(&r, NF, CAP, EM_TYPE_Q4_0, &err), EM_EINVAL);
    assert_int_equal(em_decode_ring_create(&r, 0, CAP, EM_TYPE_F32, &err), EM_EINVAL);
    assert_null(r);
    /* names of --feature-dtype */
    assert_int_equal(em_decode_feature_type("f32"), EM_TYPE_F32);
    assert_int_equal(em_decode_feature_type("f16"), EM_TYPE_F16);
    assert_int_equal(em_decode_feature_type("bf16"), EM_TYPE_BF16);
    assert_int_equal(em_decode_feature_type("q8_0"), EM_TYPE_Q8_0);
    assert_int_equal(em_decode_feature_type("q4_0"), -1);
}

/* Cost curves for the scheduler. */
typedef struct curve {
    double fixed, per_row; /* linear: fixed + per_row * n */
    int step_at;           /* > 0: a staircase, cost 1 up to step_at rows, 2 after */
    int calls;
} curve;

static double curve_cost(void *ud, int n) {
    curve *c = ud;
    c->calls++;
    if (c->step_at) return n <= c->step_at ? 1.0 : 2.0;
    return c->fixed + c->per_row * n;
}

static float logit_of(double p) { return (float)log(p / (1 - p)); }

/* A cost curve as the walk's plain-data table (draft.h): passes of 1 .. n + 1 rows, all a walk
 * over n drafts may read. */
static em_draft_sched_params table_of(double (*fn)(void *, int), void *ud, int n) {
    em_draft_sched_params p = { .n_cost = n + 1 };
    for (int i = 1; i <= p.n_cost; i++) p.cost[i - 1] = fn(ud, i);
    return p;
}

/* The batch walk over n drafts against a curve (fn NULL: no cost). */
static int schedule(const float *z, int n, double (*fn)(void *, int), void *ud) {
    em_draft_sched_params p = fn ? table_of(fn, ud, n > 0 ? n : 0) : (em_draft_sched_params){ 0 };
    return em_draft_schedule(fn ? &p : NULL, z, n);
}

static void test_schedule(void **state) {
    (void)state;
    float z[8];
    curve lin = { .fixed = 1, .per_row = 0.25 };
    /* survivals 0.9, 0.81, 0.729, 0.0729: E/cost = 0.8, 1.267, 1.549, 1.720, then 1.561: 3 */
    const double c4[4] = { 0.9, 0.9, 0.9, 0.1 };
    for (int i = 0; i < 4; i++) z[i] = logit_of(c4[i]);
    assert_int_equal(schedule(z, 4, curve_cost, &lin), 3);
    assert_int_equal(schedule(z, 2, curve_cost, &lin), 2); /* fewer proposals: all pay */
    /* a steep cost: one draft of 0.9 does not pay for a second row (1.9/3 < 1/2) ... */
    curve steep = { .fixed = 0, .per_row = 1 };
    assert_int_equal(schedule(z, 4, curve_cost, &steep), 0);
    /* ... a flat cost takes every draft with any survival */
    curve flat = { .fixed = 1, .per_row = 0 };
    for (int i = 0; i < 8; i++) z[i] = logit_of(0.05);
    assert_int_equal(schedule(z, 8, curve_cost, &flat), 8);
    /* non-anticipating: on a staircase (1 up to 4 rows, 2 after) with survivals 0.99 the walk
     * stops at 3 drafts, although 8 drafts would pay more overall (E(8)/2 = 4.33 > 3.94) */
    curve stair = { .step_at = 4 };
    for (int i = 0; i < 8; i++) z[i] = logit_of(0.99);
    assert_int_equal(schedule(z, 8, curve_cost, &stair), 3);
    /* the walk stops at the first draft that does not pay: it never looks further than
     * cost(1) .. cost(5) (costs past them, made free or unknown, change nothing) */
    em_draft_sched_params tp = table_of(curve_cost, &stair, 8);
    for (int i = 5; i < tp.n_cost; i++) tp.cost[i] = i % 2 ? NAN : 1e-9;
    assert_int_equal(em_draft_schedule(&tp, z, 8), 3);
    /* NaN confidence counts as 0; no confidence head or no cost: the whole block */
    z[0] = NAN;
    assert_int_equal(schedule(z, 8, curve_cost, &lin), 0);
    assert_int_equal(schedule(NULL, 6, curve_cost, &lin), 6);
    assert_int_equal(schedule(z, 6, NULL, NULL), 6);
    curve zero = { 0 };
    assert_int_equal(schedule(z, 6, curve_cost, &zero), 6);
    assert_int_equal(schedule(z, 0, curve_cost, &lin), 0);
}

/* A cost that turns unusable (0) from row `bad_from` on. */
typedef struct cut_curve {
    curve c;
    int bad_from;
} cut_curve;

static double cut_cost(void *ud, int n) {
    cut_curve *c = ud;
    return n >= c->bad_from ? 0.0 : curve_cost(&c->c, n);
}

/* The walk one draft at a time (what a drafter runs inside its propose) keeps
 * exactly the drafts the batch walk keeps, says no from the first it drops on, and the batch
 * walk over the kept drafts alone keeps them all (so the loop's re-check agrees). */
static void test_schedule_incremental(void **state) {
    (void)state;
    uint64_t rng = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        float z[12];
        int n = 1 + (int)(em_test_rand(&rng) % 12);
        for (int i = 0; i < n; i++) z[i] = (float)((double)(em_test_rand(&rng) % 2001) / 250.0 - 4.0);
        if (trial % 50 == 7) z[em_test_rand(&rng) % (uint64_t)n] = NAN;
        cut_curve cc = { .c = { .fixed = (double)(em_test_rand(&rng) % 100) / 25.0,
                                .per_row = (double)(em_test_rand(&rng) % 100) / 100.0 },
                         .bad_from = trial % 3 == 0 ? 2 + (int)(em_test_rand(&rng) % 12) : 1000 };
        if (trial % 5 == 1) cc.c = (curve){ .step_at = 1 + (int)(em_test_rand(&rng) % 8) };
        int want = schedule(z, n, cut_cost, &cc);
        em_draft_sched_params tp = table_of(cut_cost, &cc, n);
        em_draft_sched st;
        em_draft_sched_start(&st, &tp);
        int kept = 0;
        while (kept < n && em_draft_sched_keep(&st, z[kept])) kept++;
        assert_int_equal(kept, want);
        if (kept < n) assert_false(em_draft_sched_keep(&st, z[kept])); /* stays stopped */
        assert_int_equal(schedule(z, kept, cut_cost, &cc), kept);
    }
    /* no cost: every draft */
    em_draft_sched st;
    em_draft_sched_start(&st, NULL);
    for (int i = 0; i < 40; i++) assert_true(em_draft_sched_keep(&st, -20.0f));
}


/* The chain's per-slot rules (draft.c), on synthetic rows: greedy is em_argmax (ties to the
 * lower id; all NaN ends the block); a sampler at temperature 0 is greedy and draws nothing;
 * sampling is em_sampler_dist + em_sampler_draw (em_sampler_sample without dists) on the
 * caller's stream, draw for draw; keep is the schedule's walk, the oracle when given, or yes. */
static void test_chain_rules(void **state) {
    (void)state;
    enum { V = 6 };
    const em_draft_chain greedy_chain = { 0 };
    const float tie[V] = { 0, 5, 5, 1, -INFINITY, NAN };
    assert_int_equal(em_draft_chain_pick(&greedy_chain, 0, tie, V), 1);
    const float nans[V] = { NAN, NAN, NAN, NAN, NAN, NAN };
    assert_int_equal(em_draft_chain_pick(&greedy_chain, 0, nans, V), -1);
    const float ninf[V] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    assert_int_equal(em_draft_chain_pick(&greedy_chain, 0, ninf, V), 0); /* em_argmax's answer */

    em_sampler_params gp = { .temperature = 0, .seed = 3 };
    em_sampler *g0, *g1;
    OK(em_sampler_create(&g0, &gp, V, E));
    OK(em_sampler_create(&g1, &gp, V, E));
    assert_int_equal(em_draft_chain_pick(&(em_draft_chain){ .sampler = g0 }, 0, tie, V), 1);
    double a = em_sampler_uniform(g0), b = em_sampler_uniform(g1);
    assert_memory_equal(&a, &b, sizeof a); /* no draw at temperature 0 */

    em_sampler_params sp = { .temperature = 0.9f, .top_k = 4, .top_p = 0.97f, .min_p = 0.01f, .seed = 77 };
    em_sampler *s, *twin;
    OK(em_sampler_create(&s, &sp, V, E));
    OK(em_sampler_create(&twin, &sp, V, E));
    em_sample_dist dists[3], ref;
    for (int k = 0; k < 3; k++) OK(em_sample_dist_init(&dists[k], V, E));
    OK(em_sample_dist_init(&ref, V, E));
    uint64_t rng = 99;
    for (int t = 0; t < 300; t++) {
        float row[V];
        for (int v = 0; v < V; v++) row[v] = 3.0f * em_test_randf(&rng);
        int k = t % 3;
        bool keep_dists = t % 4 != 0;
        int32_t got = em_draft_chain_pick(&(em_draft_chain){ .sampler = s, .dists = keep_dists ? dists : NULL }, k, row, V);
        OK(em_sampler_dist(twin, row, &ref, E));
        int32_t want = em_sampler_draw(twin, &ref);
        assert_int_equal(got, want);
        if (keep_dists) {
            assert_int_equal(dists[k].n, ref.n);
            assert_memory_equal(dists[k].ids, ref.ids, (size_t)ref.n * sizeof *ref.ids);
            assert_memory_equal(dists[k].probs, ref.probs, (size_t)ref.n * sizeof *ref.probs);
        }
    }
    a = em_sampler_uniform(s), b = em_sampler_uniform(twin);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(em_draft_chain_pick(&(em_draft_chain){ .sampler = s, .dists = dists }, 0, nans, V), -1);

    /* keep: the walk over the table, as em_draft_sched_keep walks it */
    curve lin = { .fixed = 1, .per_row = 0.25 };
    em_draft_sched_params tp = table_of(curve_cost, &lin, 8);
    em_draft_chain kc = { .sched = &tp };
    assert_true(em_draft_chain_may_stop(&kc));
    assert_false(em_draft_chain_may_stop(&greedy_chain));
    const double c4[5] = { 0.9, 0.9, 0.9, 0.1, 0.9 };
    em_draft_sched st, ref_st;
    em_draft_chain_begin(&kc, &st);
    em_draft_sched_start(&ref_st, &tp);
    for (int k = 0; k < 5; k++)
        assert_int_equal(em_draft_chain_keep(&kc, &st, k, logit_of(c4[k])), em_draft_sched_keep(&ref_st, logit_of(c4[k])));
    assert_int_equal(st.width, 3);
    em_draft_chain_begin(&greedy_chain, &st);
    for (int k = 0; k < 5; k++) assert_true(em_draft_chain_keep(&greedy_chain, &st, k, -30.0f));
    for (int k = 0; k < 3; k++) em_sample_dist_free(&dists[k]);
    em_sample_dist_free(&ref);
    em_sampler_free(g0);
    em_sampler_free(g1);
    em_sampler_free(s);
    em_sampler_free(twin);
}

static void test_accept_greedy(void **state) {
    (void)state;
    enum { V = 5 };
    float rows[4][V] = {
        { 0, 3, 1, 0, 0 }, /* argmax 1 */
        { 0, 0, 0, 5, 5 }, /* argmax 3 (tie: lower id) */
        { 9, 0, 0, 0, 0 }, /* argmax 0 */
        { 0, 0, 2, 0, 0 }, /* argmax 2 */
    };
    int32_t next, am[4]; /* the rows' argmaxes as the target gives them (em_rows.argmax) */
    for (int i = 0; i < 4; i++) am[i] = em_argmax(rows[i], V);
    int32_t all[3] = { 1, 3, 0 };
    assert_int_equal(em_decode_accept_greedy(am, all, 3, &next), 3);
    assert_int_equal(next, 2); /* the bonus: argmax of row 3 */
    int32_t second_wrong[3] = { 1, 4, 0 };
    assert_int_equal(em_decode_accept_greedy(am, second_wrong, 3, &next), 1);
    assert_int_equal(next, 3); /* the target's token at the rejected slot */
    int32_t first_wrong[3] = { 2, 3, 0 };
    assert_int_equal(em_decode_accept_greedy(am, first_wrong, 3, &next), 0);
    assert_int_equal(next, 1);
    assert_int_equal(em_decode_accept_greedy(am, all, 0, &next), 0);
    assert_int_equal(next, 1);
}

/* Chi-square critical value for df degrees of freedom at about p = 1e-4 (Wilson-Hilferty). */
static double chi2_crit(int df) {
    double z = 3.719, h = 2.0 / (9.0 * df);
    return df * pow(1 - h + z * sqrt(h), 3);
}

/* Chi-square statistic of counts against probabilities (cells with expected < 5 merged into
 * one); *df gets its degrees of freedom. */
static double chi2(const double *prob, const int *count, int n_cells, int n_runs, int *df) {
    double stat = 0, rest_e = 0, rest_o = 0;
    int cells = 0;
    for (int i = 0; i < n_cells; i++) {
        double e = prob[i] * n_runs;
        if (e < 5) {
            rest_e += e, rest_o += count[i];
            continue;
        }
        stat += (count[i] - e) * (count[i] - e) / e;
        cells++;
    }
    if (rest_e > 0) {
        stat += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
        cells++;
    }
    *df = cells > 1 ? cells - 1 : 1;
    return stat;
}

/* Rejection sampling alone on synthetic rows: the first emitted token (the accepted d_1 or
 * the residual draw) is distributed as the target's filtered row 0, for a draft distribution
 * unlike it, for one with a disjoint support, and for the target's own. */
static void test_accept_sample_unit(void **state) {
    (void)state;
    enum { V = 6, K = 2, RUNS = 20000 };
    float rows[K + 1][V] = { { 1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f },
                             { 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f },
                             { 3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f } };
    float drafts_logits[3][V] = { { 2.0f, 0.0f, 1.0f, -1.0f, 0.5f, 0.0f },         /* unlike */
                                  { -INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.0f, 1.0f }, /* ids 4, 5 */
                                  { 1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f } };      /* the target's */
    /* top-k 3: the target keeps ids 3, 0, 1; the second draft keeps 5, 4 (disjoint) */
    em_sampler_params sp = { .temperature = 0.9f, .top_k = 3, .top_p = 1.0f, .min_p = 0, .seed = 3 };
    em_sampler *s;
    OK(em_sampler_create(&s, &sp, V, E));
    em_decode_accept *a;
    OK(em_decode_accept_create(&a, V, E));
    em_sample_dist pt, dd[K];
    OK(em_sample_dist_init(&pt, V, E));
    for (int k = 0; k < K; k++) OK(em_sample_dist_init(&dd[k], V, E));
    OK(em_sampler_dist(s, rows[0], &pt, E));
    double want[V];
    for (int v = 0; v < V; v++) want[v] = em_sample_dist_prob(&pt, v);
    for (int c = 0; c < 3; c++) {
        int count[V] = { 0 }, n_acc[K + 1] = { 0 };
        em_sampler_reseed(s, 100 + (uint64_t)c);
        for (int run = 0; run < RUNS; run++) {
            int32_t d[K], next;
            for (int k = 0; k < K; k++) {
                OK(em_sampler_dist(s, drafts_logits[c], &dd[k], E));
                d[k] = em_sampler_draw(s, &dd[k]);
            }
            em_err err = { 0 };
            int acc = em_decode_accept_sample(a, s, &rows[0][0], d, dd, K, &next, &err);
            assert_true(acc >= 0 && acc <= K);
            n_acc[acc]++;
            count[acc ? d[0] : next]++;
        }
        int df;
        double x2 = chi2(want, count, V, RUNS, &df);
        if (x2 > chi2_crit(df)) fail_msg("draft %d: chi-square %.1f over %d dof (limit %.1f)", c, x2, df, chi2_crit(df));
        if (c == 1) assert_int_equal(n_acc[0], RUNS); /* disjoint support: always rejected */
        if (c == 2) assert_true(n_acc[0] < RUNS / 100); /* the target's own: (nearly) always accepted */
        if (c == 0) assert_true(n_acc[0] > 0 && n_acc[0] < RUNS);
    }
    em_sample_dist_free(&pt);
    for (int k = 0; k < K; k++) em_sample_dist_free(&dd[k]);
    em_decode_accept_free(a);
    em_sampler_free(s);
}

/* ---- drafters written for the tests -------------------------------------------------------- */

enum td_mode {
    TD_ORACLE, /* proposes truth[pos]: the target's own greedy continuation */
    TD_RANDOM, /* random logits and confidences: low acceptance */
    TD_NOISY,  /* the target's exact row for the context (from a table) plus noise */
};

#define TD_MAX_POS 512

/* An exact target row for the context prompt + gen[0..depth) (TD_NOISY and the lossless test). */
typedef struct exact_row {
    int depth;
    int32_t gen[3];
    float *logits; /* [n_vocab] */
} exact_row;

typedef struct tdraft {
    em_drafter base;
    int mode;
    uint64_t rng;
    float *logits;             /* [n_vocab] scratch */
    /* TD_ORACLE */
    const int32_t *truth;      /* tokens by position */
    int n_truth;
    /* features checked against a reference ([n_ref][n_feat] by position), when set */
    const float *ref_feats;
    int n_ref;
    double max_feat_err;       /* largest |got - want| / max |want| of a row */
    int64_t rows_checked;
    /* TD_NOISY: tokens by position, rebuilt from the anchors and earlier proposals */
    int n_prompt;
    int32_t hist[TD_MAX_POS];
    int64_t last_anchor_pos;
    int32_t last_prop[EM_DRAFT_MAX_BLOCK];
    int n_last_prop;
    const exact_row *table;
    int n_table;
    float noise;
    int64_t proposals;
    bool greedy_only;          /* refuse sampling chains (EM_EUNSUPPORTED), as a device drafter does */
} tdraft;

static int td_add_context(em_drafter *d, const float *feats, int n, em_err *err) {
    (void)err;
    tdraft *t = (tdraft *)d;
    int nf = d->info.n_feat;
    for (int i = 0; t->ref_feats && i < n; i++) {
        int64_t pos = d->info.n_ctx + i;
        assert_true(pos < t->n_ref);
        const float *want = t->ref_feats + (size_t)pos * (size_t)nf, *got = feats + (size_t)i * (size_t)nf;
        double scale = 0, diff = 0;
        for (int j = 0; j < nf; j++) {
            scale = fmax(scale, fabs(want[j]));
            diff = fmax(diff, fabs((double)got[j] - want[j]));
        }
        if (diff / scale > t->max_feat_err) t->max_feat_err = diff / scale;
        t->rows_checked++;
    }
    d->info.n_ctx += n;
    return EM_OK;
}

static const exact_row *td_lookup(const tdraft *t, const int32_t *gen, int depth) {
    for (int i = 0; i < t->n_table; i++)
        if (t->table[i].depth == depth && !memcmp(t->table[i].gen, gen, (size_t)depth * sizeof *gen))
            return &t->table[i];
    return NULL;
}

/* Slot k's logits (after the block's tokens so far, seq[0..pos]) and confidence logit. */
static float td_slot(tdraft *t, int k, int64_t pos, int32_t prev) {
    int V = t->base.info.n_vocab;
    float conf;
    if (t->mode == TD_ORACLE) {
        for (int v = 0; v < V; v++) t->logits[v] = -4.0f + 0.5f * em_test_randf(&t->rng);
        t->logits[t->truth[pos + 1]] = 4.0f;
        return 3.0f;
    }
    const exact_row *row = NULL;
    if (t->mode == TD_NOISY) {
        int depth = (int)(pos + 1 - t->n_prompt);
        if (depth >= 0 && depth <= 3) row = td_lookup(t, t->hist + t->n_prompt, depth);
    }
    for (int v = 0; v < V; v++)
        t->logits[v] = (row ? row->logits[v] : 0.0f) + t->noise * em_test_randf(&t->rng);
    /* the confidence depends on the token before the slot only, as DSpark's does */
    conf = (float)((uint32_t)prev * 2654435761u % 13u) / 3.0f - 1.0f;
    (void)k;
    return conf;
}

static int td_propose(em_drafter *d, int32_t anchor, int n_max, const em_draft_chain *chain,
                      em_draft_out *out, em_err *err) {
    tdraft *t = (tdraft *)d;
    if (t->greedy_only && chain->sampler && em_sampler_params_of(chain->sampler)->temperature > 0)
        return em_err_set(err, EM_EUNSUPPORTED, "test drafter: greedy chains only");
    int64_t pos = d->info.n_ctx; /* the anchor's */
    assert_true(pos + d->info.n_drafts + 1 < TD_MAX_POS);
    for (int64_t p = t->last_anchor_pos + 1; t->last_anchor_pos >= 0 && p < pos; p++) {
        /* committed tokens between anchors were drafts, unless plain passes (the governor)
         * came between: then this history may be off, which only makes the drafts worse */
        int i = (int)(p - t->last_anchor_pos - 1);
        t->hist[p] = i < t->n_last_prop ? t->last_prop[i] : -1;
    }
    t->hist[pos] = anchor;
    int n = n_max < d->info.n_drafts ? n_max : d->info.n_drafts, k;
    for (k = 0; k < n; k++) {
        if (t->mode == TD_ORACLE && pos + k + 1 >= t->n_truth) break;
        float conf = td_slot(t, k, pos + k, t->hist[pos + k]);
        if (out->conf_logits) out->conf_logits[k] = conf;
        if (out->logits) memcpy(out->logits + (size_t)k * (size_t)d->info.n_vocab, t->logits,
                                (size_t)d->info.n_vocab * sizeof(float));
        int32_t id = em_draft_chain_pick(chain, k, t->logits, d->info.n_vocab); /* keep ignored: the loop re-walks */
        if (id < 0) break;
        out->tokens[k] = id;
        t->hist[pos + k + 1] = id;
    }
    out->n = k;
    memcpy(t->last_prop, out->tokens, (size_t)k * sizeof *out->tokens);
    t->n_last_prop = k;
    t->last_anchor_pos = pos;
    t->proposals++;
    return EM_OK;
}

static void td_reset(em_drafter *d) {
    tdraft *t = (tdraft *)d;
    d->info.n_ctx = 0;
    t->last_anchor_pos = -1;
    t->n_last_prop = 0;
}

static void td_close(em_drafter *d) {
    tdraft *t = (tdraft *)d;
    free(t->logits);
    free(t);
}

static const em_drafter_ops td_ops = { .add_context = td_add_context, .propose = td_propose, .reset = td_reset,
                                       .close = td_close };

static tdraft *td_create(int mode, const em_target *target, int n_drafts, bool conf, uint64_t seed) {
    tdraft *t = calloc(1, sizeof *t);
    assert_non_null(t);
    const em_target_info *ti = em_target_get_info(target);
    t->base.ops = &td_ops;
    t->base.info = (em_draft_info){ .n_drafts = n_drafts, .block_size = n_drafts, .n_vocab = ti->n_vocab,
                                    .n_feat = ti->n_feat, .n_taps = N_TAPS, .has_confidence = conf };
    t->base.info.taps[0] = g_taps[0], t->base.info.taps[1] = g_taps[1];
    t->mode = mode;
    t->rng = seed;
    t->noise = 3.0f;
    t->last_anchor_pos = -1;
    t->logits = malloc((size_t)ti->n_vocab * sizeof *t->logits);
    assert_non_null(t->logits);
    return t;
}

/* ---- helpers --------------------------------------------------------------------------------- */

static int32_t *concat(const int32_t *a, int na, const int32_t *b, int nb) {
    int32_t *s = malloc((size_t)(na + nb) * sizeof *s);
    assert_non_null(s);
    memcpy(s, a, (size_t)na * sizeof *s);
    memcpy(s + na, b, (size_t)nb * sizeof *s);
    return s;
}

/* Runs the loop on target with drafter d (NULL: plain) and options; returns the result. */
static em_decode_result gen_with(em_target *target, em_drafter *d, int width, int ftype, const int32_t *prompt,
                               int n_prompt, const em_decode_params *p, collect *c) {
    em_decode *s;
    em_decode_opts o = { .tok = g_tok, .drafter = d, .verify_width = width, .feature_type = ftype };
    OK(em_decode_create(&s, target, &o, E));
    em_decode_result r;
    run_loop(s, prompt, n_prompt, p, c, &r);
    em_decode_free(s);
    uint64_t hist = 0;
    for (int i = 0; i < EM_DECODE_MAX_WIDTH; i++) hist += r.accept_hist[i];
    assert_int_equal(hist, r.passes);
    assert_int_equal(r.full_replays, 0);
    assert_int_equal(r.failed_fallbacks, 0);
    assert_int_equal(r.fast_commits, r.passes);
    assert_true(r.accepted <= r.drafted);
    if (r.passes) assert_true(fabs(r.mean_verify_width - (double)(r.passes + r.drafted) / (double)r.passes) < 1e-9);
    return r;
}

/* Prompts: chat-formatted texts and raw id runs. */
#define N_PROMPTS 8
static int32_t *make_prompt(int i, int *n) {
    static const char *texts[4] = { "Hello, who are you?", "Tell me a story.", "2+2=", "Write a haiku about rust." };
    if (i < 4) return chat_prompt(texts[i], n);
    int32_t *p = malloc(16 * sizeof *p);
    assert_non_null(p);
    uint64_t rng = 1000 + (uint64_t)i;
    *n = 3 + 3 * (i - 4);
    for (int j = 0; j < *n; j++) p[j] = (int32_t)(em_test_rand(&rng) % 470);
    return p;
}

/* The plain greedy continuation of prompt on target (n tokens). */
static void plain_greedy(em_target *target, const int32_t *prompt, int n_prompt, int n, collect *c) {
    em_decode_params p = greedy(n);
    gen_with(target, NULL, 0, 0, prompt, n_prompt, &p, c);
    assert_int_equal(c->n, n);
}

/* ---- greedy: token-identical to plain -------------------------------------------------------- */

#define GEN_N 24

static void test_decode_greedy_identity(void **state) {
    (void)state;
    NEED_MODEL();
    em_target *plain[3] = { g_t, g_q8, g_c }, *feat[3] = { g_tf, g_q8f, g_cf };
    const char *names[3] = { "kimi_a f32", "kimi_a q8_0", "kimi_c f32" };
    uint64_t drafted = 0, accepted = 0, oracle_passes = 0;
    double random_width = 0;
    for (int m = 0; m < 3; m++) {
        for (int i = 0; i < N_PROMPTS; i++) {
            int n_prompt;
            int32_t *prompt = make_prompt(i, &n_prompt);
            collect ref = { 0 };
            plain_greedy(plain[m], prompt, n_prompt, GEN_N, &ref);
            int32_t *truth = concat(prompt, n_prompt, ref.ids, ref.n);
            for (int mode = TD_ORACLE; mode <= TD_RANDOM; mode++) {
                /* the oracle without a confidence head: the whole block every pass */
                tdraft *d = td_create(mode, feat[m], 7, mode != TD_ORACLE, 5 + (uint64_t)i);
                d->truth = truth, d->n_truth = n_prompt + ref.n;
                em_decode_params p = greedy(GEN_N);
                collect c = { 0 };
                em_decode_result r = gen_with(feat[m], &d->base, 0, 0, prompt, n_prompt, &p, &c);
                if (c.n != ref.n || memcmp(c.ids, ref.ids, sizeof c.ids))
                    fail_msg("%s prompt %d drafter %d: speculative output differs from plain", names[m], i, mode);
                if (mode == TD_ORACLE) { /* every draft stands: passes of the whole block */
                    assert_int_equal(r.accepted, r.drafted);
                    assert_true(r.passes <= (GEN_N - 1 + 7) / 8 + 1);
                    oracle_passes += r.passes;
                } else {
                    drafted += r.drafted, accepted += r.accepted, random_width += r.mean_verify_width;
                }
                d->base.ops->close(&d->base);
            }
            free(truth);
            free(prompt);
        }
    }
    /* the random drafter was mostly rejected, but proposals did get verified */
    assert_true(drafted > 100);
    assert_true(accepted < drafted / 4);
    fprintf(stderr, "note: random drafter accepted %llu of %llu drafts (scheduled mean width %.2f); oracle %llu "
                    "passes for %d prompts\n", (unsigned long long)accepted, (unsigned long long)drafted,
            random_width / (3 * N_PROMPTS), (unsigned long long)oracle_passes, 3 * N_PROMPTS);
}

static void test_decode_widths_and_dtypes(void **state) {
    (void)state;
    NEED_MODEL();
    int n_prompt;
    int32_t *prompt = make_prompt(0, &n_prompt);
    collect ref = { 0 };
    plain_greedy(g_t, prompt, n_prompt, GEN_N, &ref);
    int32_t *truth = concat(prompt, n_prompt, ref.ids, ref.n);
    /* reference features of every position: one verify of the whole sequence */
    int n_all = n_prompt + ref.n, nf = em_target_get_info(g_ref)->n_feat;
    float *feats = malloc((size_t)n_all * (size_t)nf * sizeof *feats);
    assert_non_null(feats);
    em_target_reset(g_ref);
    OK(em_target_verify(g_ref, truth, n_all, &(em_rows){ .features = feats }, E));

    for (int w = 1; w <= 8; w++) {
        for (int mode = TD_ORACLE; mode <= TD_RANDOM; mode++) {
            tdraft *d = td_create(mode, g_tf, 7, true, 77 + (uint64_t)w);
            d->truth = truth, d->n_truth = n_all;
            em_decode_params p = greedy(GEN_N);
            collect c = { 0 };
            em_decode_result r = gen_with(g_tf, &d->base, w, 0, prompt, n_prompt, &p, &c);
            if (memcmp(c.ids, ref.ids, sizeof c.ids)) fail_msg("width %d drafter %d: output differs from plain", w, mode);
            assert_true(r.mean_verify_width <= w + 1e-9);
            if (mode == TD_ORACLE) { /* the whole width every pass but the last (n_max) */
                assert_int_equal(r.accepted, r.drafted);
                assert_int_equal(r.passes, (GEN_N - 1 + w - 1) / w);
                assert_int_equal(r.accept_hist[w - 1], (GEN_N - 1) / w);
            }
            if (w == 1) assert_int_equal(r.drafted, 0);
            d->base.ops->close(&d->base);
        }
    }
    const int types[4] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16, EM_TYPE_Q8_0 };
    const double tol[4] = { 1e-5, 1e-3, 8e-3, 1.5e-2 }; /* of a row's largest feature */
    for (int t = 0; t < 4; t++) {
        for (int mode = TD_ORACLE; mode <= TD_RANDOM; mode++) {
            tdraft *d = td_create(mode, g_tf, 7, true, 99);
            d->truth = truth, d->n_truth = n_all;
            d->ref_feats = feats, d->n_ref = n_all;
            em_decode_params p = greedy(GEN_N);
            collect c = { 0 };
            gen_with(g_tf, &d->base, 0, types[t], prompt, n_prompt, &p, &c);
            if (memcmp(c.ids, ref.ids, sizeof c.ids))
                fail_msg("feature type %s drafter %d: output differs from plain", em_type_name(types[t]), mode);
            /* every committed position reached the drafter (but those of the last pass, which
             * no proposal followed), with its own features */
            assert_true(d->rows_checked >= n_all - 8);
            if (d->max_feat_err > tol[t])
                fail_msg("feature type %s: features off by %g of the row's scale (limit %g)", em_type_name(types[t]),
                         d->max_feat_err, tol[t]);
            d->base.ops->close(&d->base);
        }
    }
    free(feats);
    free(truth);
    free(prompt);
}

/* Stops land exactly inside a block: n_max, the callback's stop, an end-of-generation token. */
static void test_decode_stops(void **state) {
    (void)state;
    NEED_MODEL();
    int32_t prompt[4] = { 72, 316, 111, 259 };
    collect ref = { 0 };
    plain_greedy(g_t, prompt, 4, 12, &ref);
    int32_t *truth = concat(prompt, 4, ref.ids, ref.n);
    for (int n = 1; n <= 10; n++) { /* n_max anywhere in the block */
        tdraft *d = td_create(TD_ORACLE, g_tf, 7, true, 1);
        d->truth = truth, d->n_truth = 4 + ref.n;
        em_decode_params p = greedy(n);
        collect c = { 0 };
        em_decode_result r = gen_with(g_tf, &d->base, 0, 0, prompt, 4, &p, &c);
        assert_int_equal(c.n, n);
        assert_int_equal(r.finish, EM_DECODE_LENGTH);
        assert_memory_equal(c.ids, ref.ids, (size_t)n * sizeof *c.ids);
        assert_int_equal(r.drafted + r.passes, n - 1); /* nothing verified past n_max */
        d->base.ops->close(&d->base);
    }
    for (int stop = 1; stop <= 6; stop++) { /* the callback's stop */
        tdraft *d = td_create(TD_ORACLE, g_tf, 7, true, 1);
        d->truth = truth, d->n_truth = 4 + ref.n;
        em_decode_params p = greedy(12);
        collect c = { .stop_after = stop };
        em_decode_result r = gen_with(g_tf, &d->base, 0, 0, prompt, 4, &p, &c);
        assert_int_equal(c.n, stop);
        assert_int_equal(c.calls_after_stop, 0);
        assert_int_equal(r.finish, EM_DECODE_STOPPED);
        d->base.ops->close(&d->base);
    }
    /* end of generation: eos is the chain's 4th token, which the oracle proposes mid-block */
    int32_t eos = ref.ids[3];
    assert_true(eos != ref.ids[0] && eos != ref.ids[1] && eos != ref.ids[2]);
    em_tok *t = tok_with_eos(eos);
    tdraft *d = td_create(TD_ORACLE, g_tf, 7, true, 1);
    d->truth = truth, d->n_truth = 4 + ref.n;
    em_decode *s;
    OK(em_decode_create(&s, g_tf, &(em_decode_opts){ .tok = t, .drafter = &d->base }, E));
    em_decode_params p = greedy(12);
    p.ignore_eog = false;
    collect c = { 0 };
    em_decode_result r;
    run_loop(s, prompt, 4, &p, &c, &r);
    assert_int_equal(c.n, 3);
    assert_int_equal(r.finish, EM_DECODE_EOG);
    assert_int_equal(r.passes, 1); /* one block held the EOG token */
    assert_memory_equal(c.ids, ref.ids, 3 * sizeof *c.ids);
    em_decode_free(s);
    em_tok_free(t);
    d->base.ops->close(&d->base);
    free(truth);
}

/* ---- a proxy target: another cost curve, and a log of the committed rows' logits ------------ */

typedef struct proxy {
    em_target base;
    em_target *in;
    double fixed, per_row; /* cost(n) = fixed + per_row * n */
    bool nominal;          /* the cost as nominal_seconds too (what the nominal governor reads) */
    long sleep_ns_per_row; /* a verify also sleeps this long a row (timings that load cannot turn) */
    bool log;
    float *rows;           /* the last verify's logits [n][n_vocab] (the caller's, or own) */
    float *own;            /* [EM_DECODE_MAX_WIDTH][n_vocab]: logits the log needs when the caller
                              asked only for argmaxes (a greedy loop) */
    int n_rows;
    float *committed;      /* [cap][n_vocab]: logits of committed verify rows, by position */
    int64_t cap;
    int64_t n_logged;
} proxy;

static void proxy_sync(proxy *p) {
    p->base.pos = p->in->pos;
    p->base.pending = p->in->pending;
    p->base.stats = p->in->stats;
}

static int proxy_verify(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    proxy *p = (proxy *)t;
    em_rows in = *out; /* what the caller asked for, plus every row's logits for the log */
    if (p->log && !in.logits) {
        assert_true(n <= EM_DECODE_MAX_WIDTH && !in.logit_rows);
        if (!p->own) assert_non_null(p->own = malloc((size_t)EM_DECODE_MAX_WIDTH * (size_t)t->info.n_vocab * sizeof(float)));
        in.logits = p->own;
    }
    int rc = em_target_verify(p->in, tok, n, &in, err);
    if (p->sleep_ns_per_row > 0) {
        const long ns = p->sleep_ns_per_row * n;
        nanosleep(&(struct timespec){ .tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L }, NULL);
    }
    proxy_sync(p);
    p->rows = in.logits, p->n_rows = n;
    return rc;
}

static int proxy_commit(em_target *t, int k, em_err *err) {
    proxy *p = (proxy *)t;
    int64_t pos = p->in->pos;
    int V = t->info.n_vocab;
    for (int i = 0; p->log && i < k && pos + i < p->cap; i++) {
        memcpy(p->committed + (size_t)(pos + i) * (size_t)V, p->rows + (size_t)i * (size_t)V, (size_t)V * sizeof(float));
        p->n_logged++;
    }
    int rc = em_target_commit(p->in, k, err);
    proxy_sync(p);
    return rc;
}

static int proxy_prefill(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    proxy *p = (proxy *)t;
    int rc = em_target_prefill(p->in, tok, n, out, err);
    proxy_sync(p);
    return rc;
}

static em_cost proxy_cost(const em_target *t, int n) {
    const proxy *p = (const proxy *)t;
    const double c = p->fixed + p->per_row * n;
    return (em_cost){ .seconds = c, .nominal_seconds = p->nominal ? c : 0.0 };
}

static void proxy_reset(em_target *t) {
    proxy *p = (proxy *)t;
    em_target_reset(p->in);
    proxy_sync(p);
}

static void proxy_close(em_target *t) { (void)t; }

static const em_target_ops proxy_ops = { .verify = proxy_verify, .commit = proxy_commit, .prefill = proxy_prefill,
                                         .cost = proxy_cost, .reset = proxy_reset, .close = proxy_close };

static void proxy_init(proxy *p, em_target *in, double fixed, double per_row) {
    memset(p, 0, sizeof *p);
    p->base.ops = &proxy_ops;
    p->base.info = in->info;
    p->in = in;
    p->fixed = fixed, p->per_row = per_row;
    proxy_sync(p);
}


/* The loop with drafter d, and with d_old (d itself, or a twin in the same state) behind the
 * old per-slot callbacks (draft_oldpath.h): the same tokens, passes, widths, drafts and
 * acceptances. */
static void expect_as_oldpath(em_target *t, em_drafter *d, em_drafter *d_old, int width, const int32_t *prompt,
                              int n_prompt, const em_decode_params *p, const char *what) {
    collect a = { 0 }, b = { 0 };
    em_decode_result ra = gen_with(t, d, width, EM_TYPE_F32, prompt, n_prompt, p, &a);
    oldpath op;
    oldpath_wrap(&op, d_old, t);
    em_decode_result rb = gen_with(t, &op.base, width, EM_TYPE_F32, prompt, n_prompt, p, &b);
    if (a.n != b.n || memcmp(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]))
        fail_msg("%s: the in-drafter chain's tokens differ from the old callbacks'", what);
    assert_int_equal(ra.passes, rb.passes);
    assert_int_equal(ra.drafted, rb.drafted);
    assert_int_equal(ra.accepted, rb.accepted);
    assert_memory_equal(ra.accept_hist, rb.accept_hist, sizeof ra.accept_hist);
    assert_true(op.picks > 0);
}

/* test drafters (which leave the keep test to the loop's re-walk) on a proxy target whose
 * linear cost stops blocks at varied widths, greedy and seeded sampling, twins per run */
static void test_decode_chain_as_oldpath(void **state) {
    (void)state;
    NEED_MODEL();
    for (int i = 0; i < 4; i++) {
        int n_prompt;
        int32_t *prompt = make_prompt(i, &n_prompt);
        proxy px;
        proxy_init(&px, g_tf, 1.0, 0.15);
        for (int mode = TD_ORACLE; mode <= TD_RANDOM; mode++) {
            tdraft *d = td_create(mode, g_tf, 7, true, 5 + (uint64_t)i), *twin = td_create(mode, g_tf, 7, true, 5 + (uint64_t)i);
            collect truth = { 0 };
            plain_greedy(g_t, prompt, n_prompt, 40, &truth);
            int32_t *seq = concat(prompt, n_prompt, truth.ids, truth.n);
            d->truth = twin->truth = seq, d->n_truth = twin->n_truth = n_prompt + truth.n;
            em_decode_params p = i % 2 ? greedy(30) : sampled(30, 40 + (uint64_t)i, 0);
            expect_as_oldpath(&px.base, &d->base, &twin->base, 0, prompt, n_prompt, &p, "test drafter");
            d->base.ops->close(&d->base);
            twin->base.ops->close(&twin->base);
            free(seq);
        }
        free(prompt);
    }
}

/* After any accept pattern, the logits of every committed row equal those of one fresh
 * full-sequence verify (so the committed KDA/MLA state is plain decoding's), and every commit
 * was fast. */
static void test_decode_commit_state(void **state) {
    (void)state;
    NEED_MODEL();
    int V = em_target_get_info(g_tf)->n_vocab;
    for (int mode = TD_RANDOM; mode <= TD_NOISY; mode++) {
        for (int i = 0; i < 4; i++) {
            int n_prompt;
            int32_t *prompt = make_prompt(i, &n_prompt);
            proxy px;
            proxy_init(&px, g_tf, 1.0, 0.1);
            px.log = true;
            px.cap = em_target_get_info(g_tf)->n_ctx;
            px.committed = calloc((size_t)px.cap * (size_t)V, sizeof(float));
            assert_non_null(px.committed);
            tdraft *d = td_create(mode, g_tf, 7, true, 31 + (uint64_t)i);
            d->n_prompt = n_prompt;
            d->noise = 0.5f; /* TD_NOISY without a table: mostly noise, some acceptance by chance */
            em_decode_params p = i % 2 ? greedy(40) : sampled(40, 9 + (uint64_t)i, 0);
            collect c = { 0 };
            em_decode_result r = gen_with(&px.base, &d->base, 0, 0, prompt, n_prompt, &p, &c);
            assert_true(r.fast_commits > 0);
            assert_int_equal(r.full_replays, 0);
            /* committed rows: positions n_prompt .. n_prompt + n_logged - 1, tokens gen[0..) */
            int n_all = n_prompt + c.n;
            int32_t *seq = concat(prompt, n_prompt, c.ids, c.n);
            float *ref = malloc((size_t)n_all * (size_t)V * sizeof *ref);
            assert_non_null(ref);
            em_target_reset(g_ref);
            OK(em_target_verify(g_ref, seq, n_all, &(em_rows){ .logits = ref }, E));
            assert_int_equal(px.n_logged, r.passes + r.accepted);
            assert_true(px.n_logged <= c.n);
            double worst = 0;
            for (int64_t q = n_prompt; q < n_prompt + px.n_logged; q++) {
                const float *a = px.committed + (size_t)q * (size_t)V, *b = ref + (size_t)q * (size_t)V;
                double scale = 0, diff = 0;
                for (int v = 0; v < V; v++) {
                    scale = fmax(scale, fabs(b[v]));
                    diff = fmax(diff, fabs((double)a[v] - b[v]));
                }
                if (diff / scale > worst) worst = diff / scale;
            }
            if (worst > 1e-5) fail_msg("drafter %d prompt %d: committed logits off by %g relative", mode, i, worst);
            free(ref);
            free(seq);
            free(px.committed);
            free(px.own);
            d->base.ops->close(&d->base);
            free(prompt);
        }
    }
}

/* ---- lossless rejection sampling ------------------------------------------------------------ */

#define LL_K 4      /* top-k of the test's sampler: the support of each token */
#define LL_RUNS 3000

/* The exact joint distribution of the first three tokens after prompt, from the target's rows
 * through em_sampler_dist: rows for every context of depth 0..2 within the support. */
typedef struct exact {
    exact_row rows[1 + LL_K + LL_K * LL_K];
    int n_rows;
    int32_t tok[LL_K * LL_K * LL_K][3];
    double prob[LL_K * LL_K * LL_K];
    int n_cells;
} exact;

static const exact_row *exact_add(exact *x, const int32_t *prompt, int n_prompt, const int32_t *gen, int depth) {
    int V = em_target_get_info(g_ref)->n_vocab;
    exact_row *r = &x->rows[x->n_rows++];
    r->depth = depth;
    memcpy(r->gen, gen, (size_t)depth * sizeof *gen);
    r->logits = malloc((size_t)V * sizeof *r->logits);
    assert_non_null(r->logits);
    int32_t *seq = concat(prompt, n_prompt, gen, depth);
    float *last = ref_last_row(seq, n_prompt + depth);
    memcpy(r->logits, last, (size_t)V * sizeof *last);
    free(last);
    free(seq);
    return r;
}

static void exact_build(exact *x, const int32_t *prompt, int n_prompt, const em_sampler_params *sp) {
    int V = em_target_get_info(g_ref)->n_vocab;
    memset(x, 0, sizeof *x);
    em_sampler *s;
    OK(em_sampler_create(&s, sp, V, E));
    em_sample_dist d0, d1, d2;
    OK(em_sample_dist_init(&d0, V, E));
    OK(em_sample_dist_init(&d1, V, E));
    OK(em_sample_dist_init(&d2, V, E));
    int32_t g[3];
    OK(em_sampler_dist(s, exact_add(x, prompt, n_prompt, g, 0)->logits, &d0, E));
    assert_true(d0.n <= LL_K);
    for (int a = 0; a < d0.n; a++) {
        g[0] = d0.ids[a];
        OK(em_sampler_dist(s, exact_add(x, prompt, n_prompt, g, 1)->logits, &d1, E));
        for (int b = 0; b < d1.n; b++) {
            g[1] = d1.ids[b];
            OK(em_sampler_dist(s, exact_add(x, prompt, n_prompt, g, 2)->logits, &d2, E));
            for (int c = 0; c < d2.n; c++) {
                memcpy(x->tok[x->n_cells], (int32_t[3]){ g[0], g[1], d2.ids[c] }, sizeof x->tok[0]);
                x->prob[x->n_cells++] = (double)d0.probs[a] * d1.probs[b] * d2.probs[c];
            }
        }
    }
    em_sample_dist_free(&d0);
    em_sample_dist_free(&d1);
    em_sample_dist_free(&d2);
    em_sampler_free(s);
}

static void exact_free(exact *x) {
    for (int i = 0; i < x->n_rows; i++) free(x->rows[i].logits);
}

/* LL_RUNS seeded runs of 4 tokens; the first three tokens' joint against the exact one. */
static void lossless_case(const char *name, em_target *target, const exact *x, const int32_t *prompt, int n_prompt,
                          const em_sampler_params *sp, int width, const em_decode_govern_params *govern) {
    int *count = calloc((size_t)x->n_cells, sizeof *count);
    assert_non_null(count);
    tdraft *d = td_create(TD_NOISY, g_tf, 3, true, 4242);
    d->n_prompt = n_prompt;
    d->table = x->rows, d->n_table = x->n_rows;
    d->noise = 1.5f; /* the draft distribution differs from the target's */
    em_decode *s;
    const int policy = govern ? EM_DECODE_SPEC_NOMINAL : EM_DECODE_SPEC_ALWAYS;
    OK(em_decode_create(&s, target, &(em_decode_opts){ .drafter = &d->base, .verify_width = width, .spec_policy = policy },
                        E));
    if (govern) em_decode_set_govern(s, govern);
    uint64_t drafted = 0, accepted = 0, widths[5] = { 0 }, outside = 0, plain = 0;
    for (int run = 0; run < LL_RUNS; run++) {
        em_decode_params p = { .n_max = 4, .ignore_eog = true, .sampling = *sp };
        p.sampling.seed = 1 + (uint64_t)run;
        collect c = { 0 };
        em_decode_result r;
        run_loop(s, prompt, n_prompt, &p, &c, &r);
        assert_int_equal(c.n, 4);
        drafted += r.drafted, accepted += r.accepted, plain += r.plain_passes;
        widths[r.passes < 5 ? r.passes : 4]++;
        int cell = -1;
        for (int i = 0; i < x->n_cells && cell < 0; i++)
            if (!memcmp(x->tok[i], c.ids, sizeof x->tok[i])) cell = i;
        if (cell < 0) outside++;
        else count[cell]++;
    }
    assert_int_equal(outside, 0); /* nothing outside the filtered support */
    int df;
    double x2 = chi2(x->prob, count, x->n_cells, LL_RUNS, &df), tv = 0;
    for (int i = 0; i < x->n_cells; i++) tv += fabs((double)count[i] / LL_RUNS - x->prob[i]) / 2;
    fprintf(stderr, "note: lossless %s: %llu of %llu drafts accepted; passes per run 1/2/3: %llu/%llu/%llu; "
                    "chi-square %.1f over %d dof (limit %.1f), total variation %.3f\n",
            name, (unsigned long long)accepted, (unsigned long long)drafted, (unsigned long long)widths[1],
            (unsigned long long)widths[2], (unsigned long long)widths[3], x2, df, chi2_crit(df), tv);
    if (x2 > chi2_crit(df)) fail_msg("%s: chi-square %.1f over %d dof exceeds %.1f", name, x2, df, chi2_crit(df));
    assert_true(tv < 0.1); /* sampling noise alone gives about 0.04 at these counts */
    assert_true(accepted > drafted / 10 && accepted < drafted); /* both paths ran: acceptance and residual */
    if (govern) { /* the governor both drafted and went plain, on what it had seen */
        fprintf(stderr, "note: lossless %s: %llu plain passes\n", name, (unsigned long long)plain);
        assert_true(plain > LL_RUNS / 10 && drafted > 0);
    }
    em_decode_free(s);
    d->base.ops->close(&d->base);
    free(count);
}

static void test_decode_lossless(void **state) {
    (void)state;
    NEED_MODEL();
    int32_t prompt[4] = { 72, 316, 111, 259 };
    em_sampler_params sp = { .temperature = 0.9f, .top_k = LL_K, .top_p = 1.0f, .min_p = 0, .seed = 0 };
    exact x;
    exact_build(&x, prompt, 4, &sp);
    assert_true(x.n_cells > 20);
    /* the scheduler on, over a proxy target whose cost makes the width depend on confidence */
    proxy px;
    proxy_init(&px, g_tf, 1.0, 0.6);
    lossless_case("scheduled", &px.base, &x, prompt, 4, &sp, 0, NULL);
    /* a fixed width of 3 rows (2 drafts) */
    lossless_case("width 3", g_tf, &x, prompt, 4, &sp, 3, NULL);
    /* the governor on (nominal costs where 2 drafts pay only when most stand; a probe of one
     * pass, stretches of one or two), so whether a pass drafts depends on earlier draws */
    proxy pg;
    proxy_init(&pg, g_tf, 1.0, 0.6);
    pg.nominal = true;
    const em_decode_govern_params quick = { .probe = 1, .plain_first = 1, .backoff_min = 1, .backoff_max = 2,
                                            .refresh = 2 };
    lossless_case("governed width 3", &pg.base, &x, prompt, 4, &sp, 3, &quick);
    exact_free(&x);
    /* top-p and min-p filters too, on the fixed width */
    em_sampler_params sp2 = { .temperature = 1.3f, .top_k = LL_K, .top_p = 0.9f, .min_p = 0.05f, .seed = 0 };
    exact_build(&x, prompt, 4, &sp2);
    lossless_case("top-p/min-p width 4", g_tf, &x, prompt, 4, &sp2, 4, NULL);
    exact_free(&x);
}

/* A drafter that refuses sampling chains (EM_EUNSUPPORTED, before any draw; the drafter on a
 * GPU does): a sampled request then decodes plainly, the same tokens as plain decoding with
 * the same seed, nothing drafted, and the next greedy request drafts again. */
static void test_decode_refused_chain(void **state) {
    (void)state;
    NEED_MODEL();
    int32_t prompt[4] = { 72, 316, 111, 259 };
    tdraft *d = td_create(TD_ORACLE, g_tf, 7, true, 1);
    d->greedy_only = true;
    collect truth = { 0 }, a = { 0 }, b = { 0 }, c = { 0 };
    plain_greedy(g_tf, prompt, 4, GEN_N + 8, &truth);
    int32_t *seq = concat(prompt, 4, truth.ids, truth.n);
    d->truth = seq, d->n_truth = 4 + truth.n;
    em_decode_params ps = sampled(GEN_N, 77, 8);
    em_decode_result rp = gen_with(g_tf, NULL, 0, 0, prompt, 4, &ps, &a);
    em_decode_result rs = gen_with(g_tf, &d->base, 0, 0, prompt, 4, &ps, &b);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]);
    assert_int_equal(rs.drafted, 0);
    assert_int_equal(rs.passes, rp.passes);
    em_decode_params pg = greedy(GEN_N);
    em_decode_result rg = gen_with(g_tf, &d->base, 0, 0, prompt, 4, &pg, &c);
    assert_memory_equal(c.ids, truth.ids, (size_t)GEN_N * sizeof c.ids[0]);
    assert_true(rg.drafted > 0);
    free(seq);
    td_close(&d->base);
}

/* ---- whether to draft: the governor -------------------------------------------------------- */

#define GOV_N 150

/* A drafter that never helps (random proposals, the whole block every pass) under the nominal
 * policy: the loop settles on plain passes (stretches doubling up to 32 between probes of two
 * passes), and the tokens are plain greedy's. One that always helps (the oracle) keeps
 * drafting, with a plain pass now and then to keep the plain cost current. The timed policy
 * gives the same tokens too. */
static void test_decode_governed(void **state) {
    (void)state;
    NEED_MODEL();
    int n_prompt;
    int32_t *prompt = make_prompt(0, &n_prompt);
    collect ref = { 0 };
    plain_greedy(g_t, prompt, n_prompt, GOV_N, &ref);
    int32_t *truth = concat(prompt, n_prompt, ref.ids, ref.n);
    proxy px; /* nominal costs: a verify of n rows costs 1 + 0.25 n */
    proxy_init(&px, g_tf, 1.0, 0.25);
    px.nominal = true;
    const em_decode_govern_params pace = { .probe = 2, .plain_first = 1, .backoff_min = 4, .backoff_max = 32,
                                           .refresh = 16 };
    /* a stretch longer than the feature ring (128 rows): the drafter's context catches up
     * during it, before the ring would drop rows it has not read */
    const em_decode_govern_params long_pace = { .probe = 1, .plain_first = 1, .backoff_min = 130, .backoff_max = 130,
                                                .refresh = 16 };
    const int policies[4] = { EM_DECODE_SPEC_NOMINAL, EM_DECODE_SPEC_ALWAYS, EM_DECODE_SPEC_TIMED,
                              EM_DECODE_SPEC_NOMINAL };
    for (int mode = TD_ORACLE; mode <= TD_RANDOM; mode++) {
        for (int k = 0; k < 4; k++) {
            tdraft *d = td_create(mode, g_tf, 7, false, 11);
            d->truth = truth, d->n_truth = n_prompt + ref.n;
            em_decode *s;
            OK(em_decode_create(&s, &px.base, &(em_decode_opts){ .tok = g_tok, .drafter = &d->base,
                                                                  .spec_policy = policies[k] }, E));
            em_decode_set_govern(s, k == 3 ? &long_pace : &pace);
            em_decode_params p = greedy(GOV_N);
            collect c = { 0 };
            em_decode_result r;
            run_loop(s, prompt, n_prompt, &p, &c, &r);
            if (c.n != ref.n || memcmp(c.ids, ref.ids, sizeof c.ids))
                fail_msg("drafter %d policy %d: output differs from plain greedy", mode, policies[k]);
            assert_true(r.plain_passes <= r.passes);
            assert_true(r.drafted == 7 * (r.passes - r.plain_passes) || r.drafted < 7 * (r.passes - r.plain_passes));
            fprintf(stderr, "note: governed drafter %d policy %d: %llu passes, %llu plain, %llu of %llu accepted\n",
                    mode, policies[k], (unsigned long long)r.passes, (unsigned long long)r.plain_passes,
                    (unsigned long long)r.accepted, (unsigned long long)r.drafted);
            if (policies[k] == EM_DECODE_SPEC_ALWAYS) assert_int_equal(r.plain_passes, 0);
            if (k == 0 && mode == TD_RANDOM) /* settled on plain */
                assert_true(r.plain_passes * 4 >= r.passes * 3);
            if (k == 3 && mode == TD_RANDOM) /* probe, plain, probe, a stretch, probe, a stretch (+ the last
                                                pass, of one row: no drafting possible) */
                assert_true(r.plain_passes >= 100 && r.passes - r.plain_passes <= 4);
            if ((k == 0 || k == 3) && mode == TD_ORACLE) /* the first plain one, refreshes */
                assert_true(r.plain_passes <= 1 + r.passes / 16 + 1);
            em_decode_free(s);
            d->base.ops->close(&d->base);
        }
    }
    free(truth);
    free(prompt);
}

/* The governor alone, on passes it is told of (3 ms a speculative pass, 1 ms a plain one):
 * speculation that pays by 17% (3.5 tokens a pass, settled) survives one pass of a single token
 * (3.2 tokens: it still pays; a memory of four passes, the newest weighing 1/4, made it 2.9 and
 * stopped), not two; a probe that paid by luck (8 tokens) is corrected by the passes after it,
 * each weighing as much as it did. Either way a stretch of plain passes follows. */
static void test_decode_govern_averages(void **state) {
    (void)state;
    const em_decode_govern_params pace = { .probe = 1, .plain_first = 1, .backoff_min = 4, .backoff_max = 16,
                                           .refresh = 1000 };
    em_decode_govern g;
    em_decode_govern_reset(&g, EM_DECODE_SPEC_TIMED, &pace);
    assert_true(em_decode_govern_draft(&g));
    em_decode_govern_report(&g, true, 3, 3e-3); /* the probe, then a plain figure */
    assert_false(em_decode_govern_draft(&g));
    em_decode_govern_report(&g, false, 1, 1e-3);
    for (int i = 0; i < 12; i++) {
        assert_true(em_decode_govern_draft(&g));
        em_decode_govern_report(&g, true, i % 10 < 3 ? 3 : 4, 3e-3); /* 3.3 tokens a pass, settled */
    }
    assert_true(em_decode_govern_draft(&g));
    em_decode_govern_report(&g, true, 1, 3e-3); /* one poor pass */
    assert_true(em_decode_govern_draft(&g));
    em_decode_govern_report(&g, true, 1, 3e-3); /* a second */
    assert_false(em_decode_govern_draft(&g));
    assert_int_equal(em_decode_govern_plain_ahead(&g), 4);
    for (int i = 0; i < 4; i++) em_decode_govern_report(&g, false, 1, 1e-3);
    assert_true(em_decode_govern_draft(&g)); /* a fresh probe, lucky */
    em_decode_govern_report(&g, true, 8, 3e-3);
    assert_true(em_decode_govern_draft(&g));
    em_decode_govern_report(&g, true, 1, 3e-3); /* (8 + 1) / 2 tokens a 3 ms pass: still pays */
    assert_true(em_decode_govern_draft(&g));
    em_decode_govern_report(&g, true, 1, 3e-3); /* 10 / 3: about 1.1x */
    assert_true(em_decode_govern_draft(&g));
    em_decode_govern_report(&g, true, 1, 3e-3); /* 11 / 4: 0.92x */
    assert_false(em_decode_govern_draft(&g));
    assert_int_equal(em_decode_govern_plain_ahead(&g), 4); /* the probe paid: stretches start over */
}

/* The timed governor carries what it learnt to the session's next call of the same kind: over
 * a target whose verify sleeps 300 us a row, speculation with a drafter that never helps
 * cannot pay whatever the machine's load, so a long greedy call ends inside a plain stretch,
 * and a short greedy call after it makes only plain passes, its drafter idle throughout (the
 * stretch outlasts the call: parked); a sampled call starts with its own probe, and so does a
 * greedy call after the pacing is set again. */
static void test_decode_governed_memory(void **state) {
    (void)state;
    NEED_MODEL();
    int n_prompt;
    int32_t *prompt = make_prompt(1, &n_prompt);
    proxy px;
    proxy_init(&px, g_tf, 1.0, 0.25);
    px.sleep_ns_per_row = 300000;
    tdraft *d = td_create(TD_RANDOM, g_tf, 7, false, 3);
    em_decode *s;
    OK(em_decode_create(&s, &px.base, &(em_decode_opts){ .tok = g_tok, .drafter = &d->base,
                                                          .spec_policy = EM_DECODE_SPEC_TIMED }, E));
    const em_decode_govern_params pace = { .probe = 2, .plain_first = 1, .backoff_min = 4, .backoff_max = 32,
                                           .refresh = 16 };
    em_decode_set_govern(s, &pace);
    collect c = { 0 };
    em_decode_result r;
    em_decode_params p = greedy(GOV_N);
    run_loop(s, prompt, n_prompt, &p, &c, &r);
    assert_true(r.plain_passes * 4 >= r.passes * 3); /* settled on plain */
    /* what it learnt, carried to another session (as ember run --spec-memory carries it to the
     * next process): that session's short call stays plain too; damaged numbers are refused
     * and leave the session as it was */
    double v[EM_DECODE_LEARNT_VALUES];
    assert_int_equal(em_decode_learnt_get(s, v), 1);
    em_decode *s2;
    OK(em_decode_create(&s2, &px.base, &(em_decode_opts){ .tok = g_tok, .drafter = &d->base,
                                                           .spec_policy = EM_DECODE_SPEC_TIMED }, E));
    em_decode_set_govern(s2, &pace);
    double bad[EM_DECODE_LEARNT_VALUES];
    const struct { int at; double v; } damage[] = { { 0, NAN }, { 1, -1 }, { 3, 0.5 }, { 6, 1e9 }, { 8, 0 } };
    for (size_t i = 0; i < sizeof damage / sizeof damage[0]; i++) {
        memcpy(bad, v, sizeof v);
        bad[damage[i].at] = damage[i].v;
        em_err err = { 0 };
        assert_int_equal(em_decode_learnt_set(s2, 1, bad, &err), EM_EINVAL);
        assert_non_null(strstr(err.msg, "governor value"));
    }
    OK(em_decode_learnt_set(s2, 1, v, E));
    double back[EM_DECODE_LEARNT_VALUES];
    assert_int_equal(em_decode_learnt_get(s2, back), 1);
    assert_memory_equal(back, v, sizeof v);
    em_decode_params p8 = greedy(8);
    memset(&c, 0, sizeof c);
    run_loop(s2, prompt, n_prompt, &p8, &c, &r);
    assert_int_equal(r.drafted, 0); /* in the stretch the other session left, which outlasts the
                                       call: the drafter sat it out (no context, no time) */
    assert_int_equal(d->base.info.n_ctx, 0);
    assert_true(r.draft_seconds == 0.0);
    em_decode_free(s2);
    p = greedy(8);
    memset(&c, 0, sizeof c);
    run_loop(s, prompt, n_prompt, &p, &c, &r);
    assert_int_equal(r.drafted, 0); /* still in the stretch the first call left */
    assert_true(r.plain_passes + 1 >= r.passes);
    assert_int_equal(d->base.info.n_ctx, 0);
    em_decode_params ps = sampled(8, 5, 0);
    memset(&c, 0, sizeof c);
    run_loop(s, prompt, n_prompt, &ps, &c, &r);
    assert_true(r.drafted > 0); /* sampled calls learn on their own */
    assert_true(d->base.info.n_ctx >= n_prompt);
    em_decode_set_govern(s, &pace);
    memset(&c, 0, sizeof c);
    run_loop(s, prompt, n_prompt, &p, &c, &r);
    assert_true(r.drafted > 0); /* forgotten: a probe first */
    em_decode_free(s);
    d->base.ops->close(&d->base);
    free(prompt);
}

/* ---- bad input ------------------------------------------------------------------------------- */

static void test_decode_bad_input(void **state) {
    (void)state;
    NEED_MODEL();
    em_err err = { 0 };
    em_decode *s = NULL;
    tdraft *d = td_create(TD_RANDOM, g_tf, 7, true, 1);
    /* the target captures no features */
    assert_int_equal(em_decode_create(&s, g_t, &(em_decode_opts){ .drafter = &d->base }, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "captures no features"));
    /* features of another width (one tap instead of two) */
    d->base.info.n_feat = 96, d->base.info.n_taps = 1;
    assert_int_equal(em_decode_create(&s, g_tf, &(em_decode_opts){ .drafter = &d->base }, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "96 features"));
    assert_non_null(strstr(err.msg, "192"));
    d->base.info.n_feat = 192, d->base.info.n_taps = 2;
    /* another vocabulary */
    d->base.info.n_vocab = 1000;
    assert_int_equal(em_decode_create(&s, g_tf, &(em_decode_opts){ .drafter = &d->base }, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "vocabulary"));
    d->base.info.n_vocab = 512;
    /* widths out of range */
    assert_int_equal(em_decode_create(&s, g_tf, &(em_decode_opts){ .drafter = &d->base, .verify_width = 9 }, &err),
                     EM_EINVAL);
    assert_non_null(strstr(err.msg, "7 drafts"));
    assert_int_equal(em_decode_create(&s, g_tf, &(em_decode_opts){ .drafter = &d->base, .verify_width = -2 }, &err),
                     EM_EINVAL);
    assert_int_equal(em_decode_create(&s, g_tf, &(em_decode_opts){ .verify_width = 2 }, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "drafter"));
    em_target *narrow;
    OK(em_model_open(&narrow, g_model, &(em_model_opts){ .n_threads = 1, .max_verify = 4, .feature_layers = g_taps,
                                                          .n_feature_layers = N_TAPS }, E));
    assert_int_equal(em_decode_create(&s, narrow, &(em_decode_opts){ .drafter = &d->base, .verify_width = 6 }, &err),
                     EM_EINVAL);
    assert_non_null(strstr(err.msg, "4 rows"));
    /* automatic width on that target: at most its 4 fast rows, never a replay */
    OK(em_decode_create(&s, narrow, &(em_decode_opts){ .drafter = &d->base }, E));
    int32_t prompt[3] = { 72, 316, 111 };
    em_decode_params p = greedy(20);
    collect c = { 0 };
    em_decode_result r;
    run_loop(s, prompt, 3, &p, &c, &r);
    assert_int_equal(r.full_replays, 0);
    assert_true(r.mean_verify_width <= 4);
    em_decode_free(s);
    em_target_close(narrow);
    /* a feature type the ring does not store */
    assert_int_equal(em_decode_create(&s, g_tf, &(em_decode_opts){ .drafter = &d->base, .feature_type = EM_TYPE_Q4_0 },
                                    &err), EM_EINVAL);
    assert_null(s);
    d->base.ops->close(&d->base);
}

/* ---- the real DSpark fixture drafters (draft/), paired with kimi_a ------------------------- */

/* g_model capturing the drafter's taps, and the drafter at path borrowing its weights. */
static void open_pair(const char *path, em_target **t, em_drafter **d) {
    int taps[EM_DRAFT_MAX_TAPS], n_taps;
    em_target_shared shared;
    OK(em_draft_read_taps(path, taps, &n_taps, E));
    OK(em_model_open(t, g_model, &(em_model_opts){ .n_threads = 1, .feature_layers = taps, .n_feature_layers = n_taps },
                     E));
    OK(em_target_shared_weights(*t, &shared, E));
    OK(em_draft_open(d, path, &shared, &(em_draft_opts){ .n_threads = 1 }, E));
}

static void test_decode_dspark_fixtures(void **state) {
    (void)state;
    NEED_MODEL();
    static const char *const names[] = { "dspark_deepspec", "dspark_deepspec_gated", "dspark_specforge",
                                         "dspark_specforge_rnn" };
    const char *bin = getenv("EMBER_BIN");
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        char path[600];
        if (em_test_convert_fixture(bin, names[f], "f32", path, sizeof path)) fail_msg("converting %s", names[f]);
        em_drafter *d;
        em_target *t;
        open_pair(path, &t, &d);
        const em_draft_info *di = em_draft_get_info(d);
        assert_int_equal(em_target_get_info(t)->n_feat, di->n_feat);
        uint64_t drafted = 0, accepted = 0;
        for (int i = 0; i < 4; i++) {
            int n_prompt;
            int32_t *prompt = make_prompt(2 * i, &n_prompt);
            collect ref = { 0 };
            plain_greedy(g_t, prompt, n_prompt, GEN_N, &ref);
            /* automatic width, then every fixed width the block allows (by prompt), every dtype */
            const int types[4] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16, EM_TYPE_Q8_0 };
            for (int w = 0; w <= di->n_drafts + 1; w++) {
                if (w > 1 && w % 4 != i) continue;
                em_decode_params p = greedy(GEN_N);
                collect c = { 0 };
                em_decode_result r = gen_with(t, d, w, types[(w + i) % 4], prompt, n_prompt, &p, &c);
                if (memcmp(c.ids, ref.ids, sizeof c.ids))
                    fail_msg("%s prompt %d width %d: speculative output differs from plain", names[f], 2 * i, w);
                drafted += r.drafted, accepted += r.accepted;
                assert_true(w == 1 ? r.draft_seconds == 0 : r.draft_seconds > 0);
            }
            free(prompt);
        }
        /* sampling runs, reproducibly per seed */
        int32_t prompt[4] = { 72, 316, 111, 259 };
        em_decode_params p = sampled(20, 5, 0);
        collect a = { 0 }, b = { 0 };
        gen_with(t, d, 0, EM_TYPE_F32, prompt, 4, &p, &a);
        gen_with(t, d, 0, EM_TYPE_F32, prompt, 4, &p, &b);
        assert_int_equal(a.n, 20);
        assert_memory_equal(a.ids, b.ids, sizeof a.ids);
        /* the chain inside the drafter (keep test included) against the old callbacks */
        for (int i = 0; i < 3; i++) {
            em_decode_params q = i == 1 ? greedy(GEN_N) : sampled(GEN_N, 60 + (uint64_t)i, i ? 8 : 0);
            int n_prompt;
            int32_t *pr = make_prompt(2 * i + 1, &n_prompt);
            expect_as_oldpath(t, d, d, 0, pr, n_prompt, &q, names[f]);
            if (i == 2) expect_as_oldpath(t, d, d, di->n_drafts + 1, pr, n_prompt, &q, names[f]);
            free(pr);
        }
        fprintf(stderr, "note: %s (%d drafts, %d taps): %llu of %llu drafts accepted (random weights)\n", names[f],
                di->n_drafts, di->n_taps, (unsigned long long)accepted, (unsigned long long)drafted);
        assert_true(drafted > 0);
        /* a target capturing other layers does not fit this drafter */
        if (di->n_feat != em_target_get_info(g_tf)->n_feat) {
            em_err err = { 0 };
            em_decode *s = NULL;
            assert_int_equal(em_decode_create(&s, g_tf, &(em_decode_opts){ .drafter = d }, &err), EM_EINVAL);
            assert_non_null(strstr(err.msg, "does not fit"));
        }
        em_draft_close(d);
        em_target_close(t);
    }
}

/* A prompt of several prefill chunks: the drafter catches up after each chunk (the ring holds
 * only one chunk), and the speculative output still equals plain decoding. */
static void test_decode_long_prompt(void **state) {
    (void)state;
    NEED_MODEL();
    char path[600];
    if (em_test_convert_fixture(getenv("EMBER_BIN"), "dspark_deepspec", "f32", path, sizeof path))
        fail_msg("converting dspark_deepspec");
    em_drafter *d;
    em_target *t;
    open_pair(path, &t, &d);
    enum { N_LONG = 300 }; /* over two chunks of 128 */
    int32_t prompt[N_LONG];
    uint64_t rng = 77;
    for (int j = 0; j < N_LONG; j++) prompt[j] = (int32_t)(em_test_rand(&rng) % 470);
    collect ref = { 0 }, c = { 0 };
    plain_greedy(g_t, prompt, N_LONG, GEN_N, &ref);
    em_decode_params p = greedy(GEN_N);
    em_decode_result r = gen_with(t, d, 0, EM_TYPE_Q8_0, prompt, N_LONG, &p, &c);
    assert_int_equal(r.n_prompt, N_LONG);
    assert_memory_equal(c.ids, ref.ids, sizeof c.ids);
    assert_true(r.drafted > 0);
    em_draft_close(d);
    em_target_close(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_chain),  cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_stopping),      cmocka_unit_test(test_context_fills),
        cmocka_unit_test(test_streamed_text), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_ring),          cmocka_unit_test(test_schedule), cmocka_unit_test(test_schedule_incremental),
        cmocka_unit_test(test_chain_rules),   cmocka_unit_test(test_decode_chain_as_oldpath),
        cmocka_unit_test(test_accept_greedy), cmocka_unit_test(test_accept_sample_unit),
        cmocka_unit_test(test_decode_greedy_identity), cmocka_unit_test(test_decode_widths_and_dtypes),
        cmocka_unit_test(test_decode_stops),    cmocka_unit_test(test_decode_commit_state),
        cmocka_unit_test(test_decode_lossless), cmocka_unit_test(test_decode_bad_input),
        cmocka_unit_test(test_decode_governed), cmocka_unit_test(test_decode_govern_averages),
        cmocka_unit_test(test_decode_governed_memory),
        cmocka_unit_test(test_decode_refused_chain),
        cmocka_unit_test(test_decode_dspark_fixtures), cmocka_unit_test(test_decode_long_prompt),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
