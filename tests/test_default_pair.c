/* The shipped default model pair (models/: the trained Kimi-Linear target and its DSpark
 * drafter) on the eval prompts (bench/eval/: 64 HumanEval prompts, raw, and the first turns of
 * 64 MT-Bench questions in Kimi's chat format), through the library's one decode loop:
 *  - speculative greedy output is token-identical to plain greedy output on all 128 prompts,
 *    at 32 tokens each, under the confidence/cost scheduler (verify width 0) and at the full
 *    block (verify width 8, 7 drafts per pass), and with the speculation governor deciding per
 *    pass on timings (--spec-policy auto); same count and same finish reason;
 *  - the drafter is the trained one, not merely a harmless one: at width 8 it is accepted
 *    (tau over the whole set above 1.5; the eval measures about 2.5-3).
 *  - the chain run inside the drafter (greedy picks, seeded draws, the schedule's keep test)
 *    gives exactly the tokens, passes, widths and accepted counts of the old per-slot
 *    callbacks (tests/draft_oldpath.h): greedy under the scheduler on every prompt, seeded
 *    sampling (temperature 0.7) under the scheduler and at width 8 on every fourth.
 * One thread, so a machine busy with other work does not slow the pool's barriers.
 * On the GPU machine (tests/cuda/run.sh): EMBER_TEST_DEVICE / EMBER_TEST_DRAFT_DEVICE (cpu,
 * cuda:N) place the target and the drafter; a drafter on a device runs greedy chains only, so
 * the comparisons with the old callbacks are left out there.
 * Skipped when the models are not there. bench/eval_spec.sh checks the same identity at 128
 * tokens on 2 threads, and at temperature 0.7 measures without comparing. */
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu.h"
#include "draft/draft.h"
#include "draft_oldpath.h"
#include "format/gguf.h"
#include "model/model.h"
#include "decode/decode.h"
#include "text/text.h"

#define N_GEN 32
#if defined(__SANITIZE_ADDRESS__)
#define N_PER_SET 8 /* the sanitizer build (ten times slower) checks the first 8 of each set */
#else
#define N_PER_SET 64
#endif

typedef struct tokens {
    int32_t ids[N_GEN + 8];
    int n;
} tokens;

static int collect(void *ud, int32_t token, const char *bytes, size_t len) {
    (void)bytes, (void)len;
    tokens *t = ud;
    if (token < 0) return 0;
    if (t->n >= N_GEN + 8) return 1;
    t->ids[t->n++] = token;
    return 0;
}

typedef struct pair {
    em_tok *tok;
    em_target *target;
    em_drafter *drafter;
    em_decode *plain, *sched, *w8;
    em_decode *governed;          /* the scheduler under --spec-policy auto (timed), as users run it */
    oldpath old;                  /* the drafter behind the old per-slot callbacks */
    em_decode *sched_old, *w8_old;
} pair;

/* Where the drafter runs (EMBER_TEST_DRAFT_DEVICE; NULL: the CPU). */
static const char *draft_device(void) {
    const char *d = getenv("EMBER_TEST_DRAFT_DEVICE");
    return d && *d && strcmp(d, "cpu") ? d : NULL;
}

/* The target's device (EMBER_TEST_DEVICE: cpu or cuda:N; unset: the CPU). */
static void target_device(em_model_opts *o) {
    const char *d = getenv("EMBER_TEST_DEVICE");
    em_err err = { 0 };
    if (d && !strncmp(d, "cuda", 4) && !em_gpu_parse_device(d, &o->cuda_index, &err)) o->device = EM_DEVICE_CUDA;
}

static int open_pair(pair *p, const char *target_path, const char *draft_path) {
    em_err err = { 0 };
    em_gguf *g = NULL;
    int taps[EM_DRAFT_MAX_TAPS], n_taps = 0;
    em_target_shared shared;
    int rc = em_draft_read_taps(draft_path, taps, &n_taps, &err);
    em_model_opts mo = { .n_threads = 1, .feature_layers = taps, .n_feature_layers = n_taps };
    target_device(&mo);
    if (!rc) rc = em_model_open(&p->target, target_path, &mo, &err);
    if (!rc) rc = em_target_shared_weights(p->target, &shared, &err);
    if (!rc)
        rc = em_draft_open(&p->drafter, draft_path, &shared, &(em_draft_opts){ .n_threads = 1, .device = draft_device() },
                           &err);
    if (!rc) rc = em_gguf_open(&g, target_path, &err);
    if (!rc) rc = em_tok_create(&p->tok, g, NULL, &err);
    em_gguf_close(g);
    if (!rc) rc = em_decode_create(&p->plain, p->target, &(em_decode_opts){ .tok = p->tok }, &err);
    if (!rc) rc = em_decode_create(&p->sched, p->target, &(em_decode_opts){ .tok = p->tok, .drafter = p->drafter }, &err);
    if (!rc)
        rc = em_decode_create(&p->w8, p->target,
                            &(em_decode_opts){ .tok = p->tok, .drafter = p->drafter, .verify_width = 8 }, &err);
    if (!rc)
        rc = em_decode_create(&p->governed, p->target,
                              &(em_decode_opts){ .tok = p->tok, .drafter = p->drafter, .spec_policy = EM_DECODE_SPEC_TIMED },
                              &err);
    if (!rc) oldpath_wrap(&p->old, p->drafter, p->target);
    if (!rc) rc = em_decode_create(&p->sched_old, p->target, &(em_decode_opts){ .tok = p->tok, .drafter = &p->old.base }, &err);
    if (!rc)
        rc = em_decode_create(&p->w8_old, p->target,
                            &(em_decode_opts){ .tok = p->tok, .drafter = &p->old.base, .verify_width = 8 }, &err);
    if (rc) fprintf(stderr, "opening the default pair: %s\n", err.msg);
    return rc;
}

static void close_pair(pair *p) {
    em_decode_free(p->plain);
    em_decode_free(p->sched);
    em_decode_free(p->w8);
    em_decode_free(p->governed);
    em_decode_free(p->sched_old);
    em_decode_free(p->w8_old);
    em_draft_close(p->drafter); /* before the target it borrows from */
    em_target_close(p->target);
    em_tok_free(p->tok);
}

/* The prompt of line `line` of a bench/eval JSONL file, encoded as `ember run` does (chat: one
 * user message and the assistant generation prompt). */
static int32_t *encode_line(const pair *p, const char *line, bool chat, size_t *n) {
    json_error_t jerr;
    json_t *j = json_loads(line, 0, &jerr);
    if (!j) fail_msg("bad JSONL line (%s): %.80s", jerr.text, line);
    const char *text = json_string_value(json_object_get(j, "prompt"));
    assert_non_null(text);
    int32_t *ids = NULL;
    if (chat) {
        em_chat_msg m = { .role = "user", .content = text };
        OK(em_chat_encode_kimi(p->tok, &m, 1, true, &ids, n, E));
    } else {
        OK(em_tok_encode(p->tok, text, strlen(text), EM_TOK_PARSE_SPECIAL | EM_TOK_ADD_SPECIAL, &ids, n, E));
    }
    json_decref(j);
    assert_true(*n > 0);
    return ids;
}

static void generate_at(em_decode *s, const int32_t *ids, size_t n, float temp, uint64_t seed, tokens *out,
                        em_decode_result *r) {
    em_decode_params prm = { .sampling = em_sampler_default_params(), .n_max = N_GEN };
    prm.sampling.temperature = temp;
    prm.sampling.seed = seed;
    out->n = 0;
    OK(em_decode_generate(s, ids, (int)n, &prm, collect, out, r, E));
    assert_int_equal(out->n, r->n_gen);
}

static void generate(em_decode *s, const int32_t *ids, size_t n, tokens *out, em_decode_result *r) {
    generate_at(s, ids, n, 0.0f, 0, out, r);
}

/* The same run through the in-drafter chain and through the old callbacks. */
static void expect_same_run(em_decode *s, em_decode *s_old, const int32_t *ids, size_t n, float temp, uint64_t seed,
                            const char *what, int line) {
    tokens a, b;
    em_decode_result ra, rb;
    generate_at(s, ids, n, temp, seed, &a, &ra);
    generate_at(s_old, ids, n, temp, seed, &b, &rb);
    if (a.n != b.n || memcmp(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]) || ra.finish != rb.finish)
        fail_msg("%s line %d: the in-drafter chain's tokens differ from the old callbacks' (temperature %g)", what, line,
                 (double)temp);
    if (ra.passes != rb.passes || ra.drafted != rb.drafted || ra.accepted != rb.accepted ||
        memcmp(ra.accept_hist, rb.accept_hist, sizeof ra.accept_hist))
        fail_msg("%s line %d: passes %llu/%llu, drafted %llu/%llu, accepted %llu/%llu: the widths or acceptances differ "
                 "from the old callbacks' (temperature %g)", what, line, (unsigned long long)ra.passes,
                 (unsigned long long)rb.passes, (unsigned long long)ra.drafted, (unsigned long long)rb.drafted,
                 (unsigned long long)ra.accepted, (unsigned long long)rb.accepted, (double)temp);
}

/* Runs every prompt of one file four ways (plain, scheduler, width 8, governed); adds passes / accepted
 * of the width-8 runs. */
static void check_set(const pair *p, const char *rel, bool chat, uint64_t *passes, uint64_t *accepted,
                      uint64_t *drafted_sched) {
    size_t len;
    char *text = em_test_read(em_test_src(rel), &len);
    char *save = NULL;
    int n_lines = 0;
    for (char *line = strtok_r(text, "\n", &save); line && n_lines < N_PER_SET; line = strtok_r(NULL, "\n", &save)) {
        size_t n;
        int32_t *ids = encode_line(p, line, chat, &n);
        tokens a, b, c, d;
        em_decode_result ra, rb, rc, rd;
        generate(p->plain, ids, n, &a, &ra);
        generate(p->sched, ids, n, &b, &rb);
        generate(p->w8, ids, n, &c, &rc);
        generate(p->governed, ids, n, &d, &rd);
        if (a.n != d.n || memcmp(a.ids, d.ids, (size_t)a.n * sizeof a.ids[0]) || ra.finish != rd.finish)
            fail_msg("%s line %d: the governed loop's greedy tokens differ from plain decoding's", rel, n_lines + 1);
        if (a.n != b.n || memcmp(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]) || ra.finish != rb.finish)
            fail_msg("%s line %d: the scheduler's greedy tokens differ from plain decoding's", rel, n_lines + 1);
        if (a.n != c.n || memcmp(a.ids, c.ids, (size_t)a.n * sizeof a.ids[0]) || ra.finish != rc.finish)
            fail_msg("%s line %d: width 8's greedy tokens differ from plain decoding's", rel, n_lines + 1);
        assert_int_equal(ra.drafted, 0);
        if (!draft_device()) expect_same_run(p->sched, p->sched_old, ids, n, 0.0f, 0, rel, n_lines + 1);
        if (n_lines % 4 == 0 && !draft_device()) {
            expect_same_run(p->sched, p->sched_old, ids, n, 0.7f, 1 + (uint64_t)n_lines, rel, n_lines + 1);
            expect_same_run(p->w8, p->w8_old, ids, n, 0.7f, 1 + (uint64_t)n_lines, rel, n_lines + 1);
        }
        *passes += rc.passes;
        *accepted += rc.accepted;
        *drafted_sched += rb.drafted;
        free(ids);
        n_lines++;
    }
    assert_int_equal(n_lines, N_PER_SET);
    free(text);
}

static void test_greedy_identical(void **state) {
    (void)state;
    char target[4096], draft[4096];
    snprintf(target, sizeof target, "%s", em_test_src("models/kimi-linear-19m-q8_0.gguf"));
    snprintf(draft, sizeof draft, "%s", em_test_src("models/dspark-kimi-linear-19m-q8_0.gguf"));
    FILE *f1 = fopen(target, "rb"), *f2 = fopen(draft, "rb");
    if (f1) fclose(f1);
    if (f2) fclose(f2);
    if (!f1 || !f2) {
        fprintf(stderr, "the default pair is not in models/: skipped\n");
        skip();
    }
    pair p = { 0 };
    assert_int_equal(open_pair(&p, target, draft), 0);
    static const struct {
        const char *file;
        bool chat;
    } sets[] = { { "bench/eval/humaneval_64.jsonl", false }, { "bench/eval/mt_bench_64.jsonl", true } };
    for (size_t i = 0; i < 2; i++) {
        uint64_t passes = 0, accepted = 0, drafted = 0;
        check_set(&p, sets[i].file, sets[i].chat, &passes, &accepted, &drafted);
        double tau = passes ? (double)(passes + accepted) / (double)passes : 0;
        fprintf(stderr, "%s: %d prompts x %d tokens identical (target %s, drafter %s); width 8 tau %.2f; scheduler "
                "drafted %llu\n", sets[i].file, N_PER_SET, N_GEN, em_target_get_info(p.target)->device,
                em_draft_get_info(p.drafter)->device, tau, (unsigned long long)drafted);
        if (tau <= 1.5) fail_msg("%s: width 8 tau %.2f: the drafter is hardly accepted", sets[i].file, tau);
        assert_true(drafted > 0); /* the scheduler speculated */
    }
    close_pair(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
