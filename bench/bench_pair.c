/* bench_pair: a target and its drafter on the eval prompts, in one process (models loaded once,
 * no process start per prompt, and a warm-up prompt first, so one-time costs such as a device's
 * graph captures stay out of the numbers): per set, greedy, plain decoding and speculative
 * decoding with the confidence/cost scheduler (--spec-policy always: every pass drafts, what the
 * drafter and the verify cost is what is measured), each prompt run plain then speculative;
 * median generation tok/s of each and their ratio (median over prompts of the per-prompt ratio
 * too), tau, and where a speculative pass's time goes: the drafter (draft_seconds, which also
 * holds the little it does while the prompt runs), the target's verify and commit
 * (target_seconds), the loop's own work (the rest); and a plain pass's time and its target's
 * share. Speculative tokens must equal plain tokens (exit 1 otherwise). A benchmark (prints
 * numbers), not a test.
 *
 * usage: bench_pair [-m TARGET.gguf] [--draft DRAFT.gguf] [--device D] [--draft-device D]
 *                   [--threads T] [-n N] [--limit L] [--sets humaneval,mt_bench] [--verify-width W]
 *   defaults: the default pair of models/, cpu / cpu, 2 threads, 128 tokens, 16 prompts a set,
 *   the scheduler's widths (--verify-width W: W rows every pass, as `ember run --verify-width`)
 *   (bench/eval/humaneval_64.jsonl raw, bench/eval/mt_bench_64.jsonl in the chat format), run
 *   from the repository root. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu.h"
#include "base/base.h"
#include "decode/decode.h"
#include "draft/draft.h"
#include "format/gguf.h"
#include "model/model.h"
#include "text/text.h"

#include "bench_util.h"

#define MAX_GEN 1024
#define MAX_PROMPTS 64

typedef struct tokens {
    int32_t ids[MAX_GEN];
    int n;
} tokens;

static int collect(void *ud, int32_t token, const char *bytes, size_t len) {
    (void)bytes, (void)len;
    tokens *t = ud;
    if (token >= 0 && t->n < MAX_GEN) t->ids[t->n++] = token;
    return 0;
}

static int device_of(const char *v, int *kind, int *index, em_err *err) {
    if (!strcmp(v, "cpu")) return *kind = EM_DEVICE_CPU, EM_OK;
    if (!strcmp(v, "auto")) return *kind = EM_DEVICE_AUTO, EM_OK;
    *kind = EM_DEVICE_CUDA;
    return em_gpu_parse_device(v, index, err);
}

/* The prompt of one JSONL line, encoded as `ember run` does (chat: one user message). */
static int encode(const em_tok *tok, const char *line, bool chat, int32_t **ids, size_t *n, em_err *err) {
    json_error_t jerr;
    json_t *j = json_loads(line, 0, &jerr);
    const char *text = j ? json_string_value(json_object_get(j, "prompt")) : NULL;
    int rc = text ? EM_OK : em_err_set(err, EM_EFORMAT, "bad eval line (%s): %.60s", j ? "no prompt" : jerr.text, line);
    if (!rc && chat) {
        em_chat_msg m = { .role = "user", .content = text };
        rc = em_chat_encode_kimi(tok, &m, 1, true, ids, n, err);
    } else if (!rc) {
        rc = em_tok_encode(tok, text, strlen(text), EM_TOK_PARSE_SPECIAL | EM_TOK_ADD_SPECIAL, ids, n, err);
    }
    json_decref(j);
    return rc;
}

typedef struct run_opts {
    int n_gen, limit;
} run_opts;

static int generate(em_decode *s, const int32_t *ids, size_t n, int n_gen, tokens *out, em_decode_result *r,
                    em_err *err) {
    em_decode_params prm = { .sampling = em_sampler_default_params(), .n_max = n_gen, .ignore_eog = true };
    prm.sampling.temperature = 0;
    out->n = 0;
    return em_decode_generate(s, ids, (int)n, &prm, collect, out, r, err);
}

static int run_set(em_decode *plain, em_decode *spec, const em_tok *tok, const char *path, bool chat,
                   const run_opts *o, em_err *err) {
    size_t len;
    char *text = NULL;
    int rc = em_file_read_all(path, &text, &len, err);
    if (rc) return rc;
    double tp[MAX_PROMPTS], ts[MAX_PROMPTS], ratio[MAX_PROMPTS];
    uint64_t passes = 0, accepted = 0, plain_passes = 0;
    double rows = 0, draft_s = 0, spec_s = 0, target_s = 0, plain_s = 0, plain_target_s = 0;
    int n = 0, same = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && n < o->limit; line = strtok_r(NULL, "\n", &save)) {
        int32_t *ids = NULL;
        size_t ni = 0;
        tokens a, b;
        em_decode_result ra, rb;
        if ((rc = encode(tok, line, chat, &ids, &ni, err)) || (rc = generate(plain, ids, ni, o->n_gen, &a, &ra, err)) ||
            (rc = generate(spec, ids, ni, o->n_gen, &b, &rb, err))) {
            free(ids);
            break;
        }
        free(ids);
        same += a.n == b.n && !memcmp(a.ids, b.ids, (size_t)a.n * sizeof a.ids[0]);
        tp[n] = ra.n_gen / (ra.gen_seconds > 0 ? ra.gen_seconds : 1e-9);
        ts[n] = rb.n_gen / (rb.gen_seconds > 0 ? rb.gen_seconds : 1e-9);
        ratio[n] = ts[n] / tp[n];
        rows += rb.mean_verify_width * (double)rb.passes;
        passes += rb.passes, accepted += rb.accepted, draft_s += rb.draft_seconds, spec_s += rb.gen_seconds;
        target_s += rb.target_seconds, plain_passes += ra.passes, plain_s += ra.gen_seconds;
        plain_target_s += ra.target_seconds;
        n++;
    }
    free(text);
    if (rc) return rc;
    const double tau = passes ? (double)(passes + accepted) / (double)passes : 0;
    const double per_pass = passes ? 1e3 / (double)passes : 0, per_plain = plain_passes ? 1e3 / (double)plain_passes : 0;
    printf("%-28s %3d prompts  plain %7.0f tok/s  spec %7.0f tok/s  %.2fx (per prompt %.2fx)  tau %.2f  width %.2f  pass %.3f ms "
           "(drafter %.3f, target %.3f, loop %.3f; plain pass %.3f, target %.3f)  identical %d/%d\n", path, n,
           bench_median(tp, n), bench_median(ts, n), bench_median(ts, n) / bench_median(tp, n), bench_median(ratio, n), tau,
           passes ? rows / (double)passes : 0,
           spec_s * per_pass, draft_s * per_pass, target_s * per_pass, (spec_s - draft_s - target_s) * per_pass,
           plain_s * per_plain, plain_target_s * per_plain, same, n);
    return same == n ? EM_OK : em_err_set(err, EM_EINVAL, "%s: speculative greedy tokens differ from plain on %d prompts",
                                          path, n - same);
}

int main(int argc, char **argv) {
    const char *model = "models/kimi-linear-19m-q8_0.gguf", *draft = "models/dspark-kimi-linear-19m-q8_0.gguf";
    const char *device = "cpu", *draft_device = "cpu", *sets = "humaneval,mt_bench";
    int threads = 2, width = 0;
    run_opts o = { .n_gen = 128, .limit = 16 };
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--draft")) draft = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--draft-device")) draft_device = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "-n")) o.n_gen = atoi(v);
        else if (!strcmp(a, "--limit")) o.limit = atoi(v);
        else if (!strcmp(a, "--sets")) sets = v;
        else if (!strcmp(a, "--verify-width")) width = atoi(v);
        else {
            fprintf(stderr, "bench_pair: unknown flag %s (see the comment at the top of bench/bench_pair.c)\n", a);
            return 2;
        }
    }
    if (o.n_gen < 1 || o.n_gen > MAX_GEN || o.limit < 1 || o.limit > MAX_PROMPTS || threads < 1 || width < 0) {
        fprintf(stderr, "bench_pair: -n 1..%d, --limit 1..%d, --threads >= 1, --verify-width >= 0\n", MAX_GEN,
                MAX_PROMPTS);
        return 2;
    }
    em_err err = { 0 };
    em_target *t = NULL;
    em_drafter *d = NULL;
    em_tok *tok = NULL;
    em_gguf *g = NULL;
    em_decode *plain = NULL, *spec = NULL;
    em_target_shared shared;
    int taps[EM_DRAFT_MAX_TAPS], n_taps = 0;
    em_model_opts mo = { .n_threads = threads };
    int rc = device_of(device, &mo.device, &mo.cuda_index, &err);
    if (!rc) rc = em_draft_read_taps(draft, taps, &n_taps, &err);
    mo.feature_layers = taps, mo.n_feature_layers = n_taps;
    if (!rc) rc = em_model_open(&t, model, &mo, &err);
    if (!rc) rc = em_target_shared_weights(t, &shared, &err);
    if (!rc)
        rc = em_draft_open(&d, draft, &shared,
                           &(em_draft_opts){ .n_threads = threads, .device = strcmp(draft_device, "cpu") ? draft_device : NULL },
                           &err);
    if (!rc) rc = em_gguf_open(&g, model, &err);
    if (!rc) rc = em_tok_create(&tok, g, NULL, &err);
    if (!rc) rc = em_decode_create(&plain, t, &(em_decode_opts){ .tok = tok }, &err);
    if (!rc)
        rc = em_decode_create(&spec, t,
                              &(em_decode_opts){ .tok = tok, .drafter = d, .spec_policy = EM_DECODE_SPEC_ALWAYS,
                                                 .verify_width = width },
                              &err);
    if (!rc) {
        printf("bench_pair: target %s on %s, drafter on %s, %d threads, %d tokens, greedy, --spec-policy always\n", model,
               em_target_get_info(t)->device, em_draft_get_info(d)->device, threads, o.n_gen);
        /* warm-up: one short run of each, so graph captures and first touches are not timed */
        static const int32_t warm[] = { 1, 2, 3, 4 };
        tokens w;
        em_decode_result r;
        for (int i = 0; !rc && i < 2; i++) rc = generate(i ? spec : plain, warm, 4, 64, &w, &r, &err);
    }
    static const struct {
        const char *name, *file;
        bool chat;
    } all[] = { { "humaneval", "bench/eval/humaneval_64.jsonl", false }, { "mt_bench", "bench/eval/mt_bench_64.jsonl", true } };
    for (size_t i = 0; !rc && i < sizeof all / sizeof all[0]; i++)
        if (strstr(sets, all[i].name)) rc = run_set(plain, spec, tok, all[i].file, all[i].chat, &o, &err);
    if (rc) fprintf(stderr, "bench_pair: %s\n", err.msg);
    em_decode_free(spec);
    em_decode_free(plain);
    em_tok_free(tok);
    em_gguf_close(g);
    em_draft_close(d);
    em_target_close(t);
    return rc ? 1 : 0;
}
