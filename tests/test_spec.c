/* Tests for the decode loop (spec/) over the kimi_a fixture converted to F32 by the CLI
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
 *    a verify width without a drafter; the session still works afterwards. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "model/model.h"
#include "spec/spec.h"
#include "text/text.h"

#define MAX_GEN 64

static char g_model[600];
static em_tok *g_tok;
static em_target *g_t;   /* the loop's target */
static em_target *g_ref; /* a second instance for reference logits */
static bool g_have;

static int setup(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) {
        fprintf(stderr, "EMBER_BIN is not set: spec tests are skipped\n");
        return 0;
    }
    if (em_test_convert_fixture(bin, "kimi_a", "f32", g_model, sizeof g_model)) return -1;
    em_err err = { 0 };
    em_gguf *g = NULL;
    em_model_opts mo = { .n_threads = 2 };
    if (em_gguf_open(&g, g_model, &err) || em_tok_create(&g_tok, g, NULL, &err) ||
        em_model_open(&g_t, g_model, &mo, &err) || em_model_open(&g_ref, g_model, &mo, &err)) {
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
    em_target_close(g_t);
    em_target_close(g_ref);
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

static em_spec_params greedy(int n_max) {
    em_spec_params p = { .n_max = n_max, .ignore_eog = true };
    p.sampling.temperature = 0;
    return p;
}

static em_spec_params sampled(int n_max, uint64_t seed, int top_k) {
    em_spec_params p = { .n_max = n_max, .ignore_eog = true };
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

static void run_loop(em_spec *s, const int32_t *prompt, int n_prompt, const em_spec_params *p, collect *c,
                     em_spec_result *r) {
    OK(em_spec_generate(s, prompt, n_prompt, p, on_token, c, r, E));
    assert_int_equal(r->n_gen, c->n);
    assert_int_equal(r->n_prompt, n_prompt);
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_greedy_chain(void **state) {
    (void)state;
    NEED_MODEL();
    em_spec *s;
    em_spec_opts o = { .tok = g_tok };
    OK(em_spec_create(&s, g_t, &o, E));
    int n_prompt;
    int32_t *prompt = chat_prompt("Hello, who are you?", &n_prompt);
    em_spec_params p = greedy(20);
    collect c = { 0 };
    em_spec_result r;
    run_loop(s, prompt, n_prompt, &p, &c, &r);
    assert_int_equal(c.n, 20);
    assert_int_equal(r.finish, EM_SPEC_LENGTH);
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
    em_spec_free(s);
}

static void test_sampling(void **state) {
    (void)state;
    NEED_MODEL();
    em_spec *s;
    OK(em_spec_create(&s, g_t, &(em_spec_opts){ .tok = g_tok }, E));
    int n_prompt;
    int32_t *prompt = chat_prompt("Tell me a story.", &n_prompt);
    em_spec_params p = sampled(16, 42, 0);
    collect a = { 0 }, b = { 0 }, d = { 0 };
    em_spec_result r;
    run_loop(s, prompt, n_prompt, &p, &a, &r);
    run_loop(s, prompt, n_prompt, &p, &b, &r);
    assert_int_equal(a.n, 16);
    assert_memory_equal(a.ids, b.ids, sizeof a.ids);
    p.sampling.seed = 43;
    run_loop(s, prompt, n_prompt, &p, &d, &r);
    assert_int_equal(d.n, 16);
    assert_true(memcmp(a.ids, d.ids, 16 * sizeof *a.ids) != 0);
    /* differs from greedy too (the random model's rows are far from one-hot) */
    em_spec_params gp = greedy(16);
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
    em_spec_free(s);
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
    em_spec *s;
    OK(em_spec_create(&s, g_t, &(em_spec_opts){ .tok = g_tok }, E));
    em_spec_result r;

    /* n_max */
    em_spec_params p = greedy(5);
    collect c = { 0 };
    run_loop(s, prompt, 4, &p, &c, &r);
    assert_int_equal(c.n, 5);
    assert_int_equal(r.finish, EM_SPEC_LENGTH);
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
    assert_int_equal(r.finish, EM_SPEC_STOPPED);
    assert_memory_equal(st.ids, c.ids, 3 * sizeof *c.ids);
    em_spec_free(s);

    /* end of generation: a tokenizer whose eos is the chain's 4th token (when the first three
     * are different from it) */
    int32_t eos = c.ids[3];
    if (eos == c.ids[0] || eos == c.ids[1] || eos == c.ids[2] || em_tok_is_eog(g_tok, c.ids[0]) ||
        em_tok_is_eog(g_tok, c.ids[1]) || em_tok_is_eog(g_tok, c.ids[2]))
        fail_msg("the fixture's greedy chain repeats early; pick another prompt for this test");
    em_tok *t = tok_with_eos(eos);
    assert_true(em_tok_is_eog(t, eos));
    OK(em_spec_create(&s, g_t, &(em_spec_opts){ .tok = t }, E));
    p = greedy(10);
    p.ignore_eog = false;
    collect e = { 0 };
    run_loop(s, prompt, 4, &p, &e, &r);
    assert_int_equal(e.n, 3);
    assert_int_equal(r.finish, EM_SPEC_EOG);
    assert_int_equal(r.passes, 3); /* the third pass gave the EOG token */
    assert_memory_equal(e.ids, c.ids, 3 * sizeof *c.ids);
    p.ignore_eog = true;
    p.n_max = 5;
    collect ig = { 0 };
    run_loop(s, prompt, 4, &p, &ig, &r);
    assert_int_equal(ig.n, 5);
    assert_int_equal(r.finish, EM_SPEC_LENGTH);
    assert_memory_equal(ig.ids, c.ids, 5 * sizeof *c.ids);
    em_spec_free(s);
    em_tok_free(t);
}

static void test_context_fills(void **state) {
    (void)state;
    NEED_MODEL();
    em_target *t;
    OK(em_model_open(&t, g_model, &(em_model_opts){ .n_threads = 2, .n_ctx = 8 }, E));
    em_spec *s;
    OK(em_spec_create(&s, t, &(em_spec_opts){ .tok = g_tok }, E));
    int32_t prompt[9] = { 72, 316, 111, 259, 263, 117, 115, 260, 72 };
    em_spec_params p = greedy(50);
    em_spec_result r;

    /* 5 prompt tokens in 8 positions: the prefill's token and 3 more passes */
    collect c = { 0 };
    run_loop(s, prompt, 5, &p, &c, &r);
    assert_int_equal(c.n, 4);
    assert_int_equal(r.finish, EM_SPEC_LENGTH);
    check_greedy_chain(prompt, 5, c.ids, c.n);
    /* a prompt that fills the context still gives the token after it */
    collect full = { 0 };
    run_loop(s, prompt, 8, &p, &full, &r);
    assert_int_equal(full.n, 1);
    assert_int_equal(r.finish, EM_SPEC_LENGTH);

    /* one token too many is an error that says so */
    em_err err = { 0 };
    collect none = { 0 };
    assert_int_equal(em_spec_generate(s, prompt, 9, &p, on_token, &none, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "9 tokens"));
    assert_non_null(strstr(err.msg, "context of 8"));
    assert_int_equal(none.n, 0);
    em_spec_free(s);
    em_target_close(t);
}

static void test_streamed_text(void **state) {
    (void)state;
    NEED_MODEL();
    em_spec *s;
    OK(em_spec_create(&s, g_t, &(em_spec_opts){ .tok = g_tok }, E));
    int n_prompt;
    int32_t *prompt = chat_prompt("Write something.", &n_prompt);
    /* several seeds at a high temperature: byte tokens cut UTF-8 sequences, control tokens
     * come up; the concatenation must still be the decode of the ids */
    int held = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        em_spec_params p = sampled(MAX_GEN, seed, 0);
        p.sampling.temperature = 2.0f;
        collect c = { 0 };
        em_spec_result r;
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
    em_spec_free(s);

    /* no tokenizer: tokens but no text, and EOG ids are not known */
    OK(em_spec_create(&s, g_t, NULL, E));
    em_spec_params p = greedy(6);
    p.ignore_eog = false;
    collect c = { 0 };
    em_spec_result r;
    run_loop(s, prompt, n_prompt, &p, &c, &r);
    assert_int_equal(c.n, 6);
    assert_int_equal(c.len, 0);
    assert_int_equal(c.flush_calls, 0);
    /* and no callback at all */
    OK(em_spec_generate(s, prompt, n_prompt, &p, NULL, NULL, &r, E));
    assert_int_equal(r.n_gen, 6);
    free(prompt);
    em_spec_free(s);
}

static void test_errors(void **state) {
    (void)state;
    NEED_MODEL();
    em_err err = { 0 };
    em_spec *s = NULL;
    assert_int_equal(em_spec_create(&s, g_t, &(em_spec_opts){ .verify_width = 4 }, &err), EM_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "drafter"));
    assert_null(s);
    assert_int_equal(em_spec_create(&s, g_t, &(em_spec_opts){ .verify_width = -1 }, &err), EM_EINVAL);
    OK(em_spec_create(&s, g_t, &(em_spec_opts){ .tok = g_tok, .verify_width = 1 }, E));

    int32_t prompt[3] = { 72, 316, 111 };
    em_spec_result r;
    collect c = { 0 };
    em_spec_params p = greedy(4);
    int32_t bad[3] = { 72, 512, 111 };
    assert_int_equal(em_spec_generate(s, bad, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "512"));
    bad[1] = -1;
    assert_int_equal(em_spec_generate(s, bad, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "-1"));
    assert_int_equal(em_spec_generate(s, prompt, 0, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "empty"));
    p.n_max = 0;
    assert_int_equal(em_spec_generate(s, prompt, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "n_max"));
    p = greedy(4);
    p.sampling.temperature = NAN;
    assert_int_equal(em_spec_generate(s, prompt, 3, &p, on_token, &c, &r, &err), EM_EINVAL);
    assert_int_equal(c.n, 0);

    /* the session still works, from an empty sequence */
    p = greedy(4);
    run_loop(s, prompt, 3, &p, &c, &r);
    check_greedy_chain(prompt, 3, c.ids, c.n);
    em_spec_free(s);
    em_spec_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_chain),  cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_stopping),      cmocka_unit_test(test_context_fills),
        cmocka_unit_test(test_streamed_text), cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
