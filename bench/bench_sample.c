/* bench_sample: microseconds per em_sampler_dist call (the filtered distribution behind every
 * sampled token and every drafted slot) and per em_sampler_sample call, for vocabularies of
 * 8192 (the default model) and 163840 (Kimi), over several parameter sets and two logit
 * shapes. A benchmark (prints a table), not a test.
 *
 *   peaked  logits ~ 3 * N(0, 1) plus one to three clear favourites (like a trained model);
 *   flat    logits uniform in [0, 8) (many near-equal candidates: worst case for top-p).
 *
 * Rows cycle over 16 different logit vectors so no call sees the previous one's answer.
 * Reports wall µs and process CPU µs per call (on a shared machine wall time includes
 * waiting for a core).
 *
 * Measured (CPU µs per em_sampler_dist, 2-core shared machine, peaked / flat logits), the
 * first sampler (qsort of the candidates) against the current one (fused top-k scan, radix
 * sort, top-p cut sorting only the leading ranks, no exp for an unused normaliser):
 *   vocab 8192    default T.8 k40 p.95 m.05   22 / 24  ->   7 / 8
 *                 T.7 k0 p1 m0 (plain)       900 / 890 -> 116 / 91
 *                 T.7 k0 p.95 m0             830 / 870 -> 128 / 122
 *   vocab 163840  default                    490 / 463 ->  62 / 64
 *                 T.7 k0 p1 m0             25900 / 24300 -> 2600 / 1840
 *                 T.7 k0 p.95 m0           25100 / 22600 -> 2700 / 2470
 *
 * usage: bench_sample [--seconds T] [--vocab N] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "bench_util.h"
#include "sample/sample.h"

enum { N_ROWS = 16 };

static double gauss(uint64_t *s) {
    double u = bench_uniform(s), v = bench_uniform(s);
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static float *make_rows(int32_t vocab, bool peaked, uint64_t seed) {
    float *l = malloc((size_t)vocab * N_ROWS * sizeof *l);
    if (!l) {
        fprintf(stderr, "bench_sample: out of memory\n");
        exit(1);
    }
    uint64_t s = seed;
    for (int r = 0; r < N_ROWS; r++) {
        float *row = l + (size_t)r * (size_t)vocab;
        for (int32_t i = 0; i < vocab; i++) row[i] = peaked ? (float)(3 * gauss(&s)) : (float)(8 * bench_uniform(&s));
        if (peaked)
            for (int f = 0; f <= r % 3; f++) row[(size_t)(bench_uniform(&s) * vocab)] = (float)(14 + 2 * bench_uniform(&s));
    }
    return l;
}

typedef struct cfg {
    const char *name;
    float t;
    int k;
    float p, m;
} cfg;

static void run(const cfg *c, int32_t vocab, const float *rows, const char *shape, double seconds) {
    em_sampler_params p = { .temperature = c->t, .top_k = c->k, .top_p = c->p, .min_p = c->m, .seed = 1 };
    em_sampler *s;
    em_sample_dist d;
    em_err err = { 0 };
    if (em_sampler_create(&s, &p, vocab, &err) || em_sample_dist_init(&d, vocab, &err)) {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
        exit(1);
    }
    double us[2][2]; /* [dist, sample][wall, cpu] */
    long kept = 0;
    for (int what = 0; what < 2; what++) {
        long n = 0;
        double w0 = em_time_now(), c0 = bench_cpu_now(), w1;
        do {
            for (int r = 0; r < N_ROWS; r++, n++) {
                const float *row = rows + (size_t)r * (size_t)vocab;
                int32_t id;
                int rc = what == 0 ? em_sampler_dist(s, row, &d, &err) : em_sampler_sample(s, row, &id, &err);
                if (rc) {
                    fprintf(stderr, "bench_sample: %s\n", err.msg);
                    exit(1);
                }
                if (what == 0) kept += d.n;
            }
            w1 = em_time_now();
        } while (w1 - w0 < seconds);
        us[what][0] = 1e6 * (w1 - w0) / (double)n;
        us[what][1] = 1e6 * (bench_cpu_now() - c0) / (double)n;
        if (what == 0) kept /= n;
    }
    printf("%7d  %-6s  %-28s  %10.2f %10.2f  %10.2f %10.2f  %7ld\n", vocab, shape, c->name, us[0][0], us[0][1],
           us[1][0], us[1][1], kept);
    em_sample_dist_free(&d);
    em_sampler_free(s);
}

int main(int argc, char **argv) {
    double seconds = 0.3;
    int32_t only_vocab = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) only_vocab = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_sample [--seconds T] [--vocab N]\n");
            return 2;
        }
    }
    const cfg cfgs[] = {
        { "default (T.8 k40 p.95 m.05)", 0.8f, 40, 0.95f, 0.05f },
        { "T.7 k40 p.95 m.05", 0.7f, 40, 0.95f, 0.05f },
        { "T.7 k0 p.95 m.05", 0.7f, 0, 0.95f, 0.05f },
        { "T.7 k0 p.95 m0", 0.7f, 0, 0.95f, 0 },
        { "T.7 k0 p1 m0 (plain)", 0.7f, 0, 1, 0 },
        { "greedy (T0)", 0, 40, 0.95f, 0.05f },
    };
    const int32_t vocabs[] = { 8192, 163840 };
    printf("  vocab  logits  params                        dist wall   dist cpu  sample wall sample cpu  kept\n");
    printf("                                                  (µs/call)              (µs/call)\n");
    for (size_t v = 0; v < 2; v++) {
        if (only_vocab && vocabs[v] != only_vocab) continue;
        for (int shape = 0; shape < 2; shape++) {
            float *rows = make_rows(vocabs[v], shape == 0, 42 + v);
            for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
                run(&cfgs[c], vocabs[v], rows, shape == 0 ? "peaked" : "flat", seconds);
            free(rows);
        }
    }
    return 0;
}
