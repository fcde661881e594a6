/* bench_draft: microseconds per drafter pass as the decode loop makes them: add_context of a
 * few committed rows, then propose with a greedy chooser and a keep that stops the block
 * after --keep slots (the scheduler's usual width). Features are random N(0, 1) rows; the
 * context starts at --ctx rows and grows by --step per pass, reset when it would pass 4096.
 * Reports wall and process CPU µs per pass (median of --reps rounds of --passes passes), and
 * an FNV-1a hash of every proposal's tokens, confidence logits and corrected logits, so two
 * builds can be checked to propose bit-identical blocks. A benchmark (prints numbers), not a
 * test.
 *
 * --device cuda:N runs the drafter there (draft/dspark_cuda.c): the block stops at n_max = keep
 * slots (a device drafter takes no keep callback) and no logits rows are downloaded, as in the
 * decode loop; its hash covers tokens and confidences only.
 *
 * usage: bench_draft DRAFT.gguf TARGET.gguf [--threads N] [--keep K] [--passes P] [--reps R]
 *                    [--ctx C] [--step S] [--vary 1] [--device D]
 *        (--vary 1: stop after 1, 2, .. K slots in turn) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "bench_util.h"
#include "draft/draft.h"
#include "model/model.h"
#include "sample/sample.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

typedef struct bench_ud {
    int n_vocab, keep;
} bench_ud;

static bool keep_first(void *ud, int k, float z) {
    (void)z;
    return k < ((bench_ud *)ud)->keep;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_draft DRAFT.gguf TARGET.gguf [--threads N] [--keep K] [--passes P] "
                        "[--reps R] [--ctx C] [--step S] [--vary 1] [--device D]\n");
        return 2;
    }
    int threads = 2, keep = 6, passes = 30, reps = 15, ctx = 16, step = 4, vary = 0;
    const char *device = NULL;
    for (int i = 3; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--device")) device = strcmp(argv[i + 1], "cpu") ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--keep")) keep = v;
        else if (!strcmp(argv[i], "--passes")) passes = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else if (!strcmp(argv[i], "--ctx")) ctx = v;
        else if (!strcmp(argv[i], "--step")) step = v;
        else if (!strcmp(argv[i], "--vary")) vary = v;
    }
    em_err err = { 0 };
    em_drafter *d = NULL;
    em_target *t = NULL; /* opened only to lend the drafter its embedding / LM head */
    em_target_shared shared;
    em_draft_opts o = { .n_threads = threads, .n_ctx = 4096, .device = device };
    if (em_model_open(&t, argv[2], &(em_model_opts){ .n_threads = 1 }, &err) ||
        em_target_shared_weights(t, &shared, &err) || em_draft_open(&d, argv[1], &shared, &o, &err)) {
        fprintf(stderr, "bench_draft: %s\n", err.msg);
        em_target_close(t);
        return 1;
    }
    const em_draft_info *info = em_draft_get_info(d);
    const int nf = info->n_feat, nd = info->n_drafts;
    const int rows = ctx > step ? ctx : step;
    float *feats = malloc((size_t)rows * (size_t)nf * sizeof *feats);
    float *conf = malloc((size_t)nd * sizeof *conf);
    int32_t *toks = malloc((size_t)nd * sizeof *toks);
    float *logits = malloc((size_t)nd * (size_t)info->n_vocab * sizeof *logits);
    uint64_t hash = 0xcbf29ce484222325ull;
    double *wall = malloc((size_t)reps * sizeof *wall), *cpu = malloc((size_t)reps * sizeof *cpu);
    if (!feats || !conf || !toks || !logits || !wall || !cpu) return 1;
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < (int64_t)rows * nf; i++) {
        double u = bench_uniform(&s), v = bench_uniform(&s);
        feats[i] = (float)(sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v));
    }
    bench_ud ud = { .n_vocab = info->n_vocab, .keep = keep };
    int64_t made = 0;
    int32_t anchor = 17;
    for (int r = 0; r < reps; r++) {
        em_draft_reset(d);
        if (em_draft_add_context(d, feats, ctx, &err)) goto fail;
        double w0 = em_time_now(), c0 = bench_cpu_now();
        for (int p = 0; p < passes; p++) {
            if (info->n_ctx + step > 4096) {
                em_draft_reset(d);
                if (em_draft_add_context(d, feats, ctx, &err)) goto fail;
            }
            if (em_draft_add_context(d, feats, step, &err)) goto fail;
            em_draft_out out = { .tokens = toks, .logits = device ? NULL : logits, .conf_logits = conf };
            em_draft_chain chain = { .keep = device ? NULL : keep_first, .keep_ud = &ud }; /* greedy picks */
            if (vary) ud.keep = keep > 0 ? 1 + p % keep : 0; /* stops at 1 .. keep in turn */
            const int n_max = device ? (ud.keep > 0 ? ud.keep : 1) : nd;
            if (em_draft_propose(d, anchor, n_max, &chain, &out, &err)) goto fail;
            hash = fnv(hash, toks, (size_t)out.n * sizeof *toks);
            hash = fnv(hash, conf, (size_t)(out.n < nd ? out.n + 1 : nd) * sizeof *conf);
            if (!device) hash = fnv(hash, logits, (size_t)out.n * (size_t)info->n_vocab * sizeof *logits);
            made += out.n;
            anchor = out.n > 0 ? toks[out.n - 1] : anchor;
        }
        wall[r] = (em_time_now() - w0) / passes * 1e6;
        cpu[r] = (bench_cpu_now() - c0) / passes * 1e6;
    }
    const double wall_med = bench_median(wall, reps), cpu_med = bench_median(cpu, reps);
    printf("bench_draft: %s, %d threads, keep %d, %d passes x %d reps: %.1f us wall, %.1f us cpu per pass (median; "
           "min wall %.1f), %.2f slots per pass, hash %016llx\n", info->device, threads, keep, passes, reps, wall_med,
           cpu_med, wall[0], (double)made / ((double)passes * reps), (unsigned long long)hash);
    em_draft_close(d);
    em_target_close(t);
    return 0;
fail:
    fprintf(stderr, "bench_draft: %s\n", err.msg);
    em_draft_close(d);
    em_target_close(t);
    return 1;
}
