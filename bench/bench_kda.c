/* bench_kda: speed of the KDA core (model/kda) at a given geometry (default Kimi-Linear-48B:
 * 32 heads x 128, conv 4). A benchmark (prints a table), not a test.
 *
 *   decode   single-token em_kda_forward_commit steps, cycling over --states separate states
 *            (1 = the state stays cache-hot; more = cold, like successive layers), tokens/s
 *            and the state bytes moved per second (S read + written once per token);
 *   verify   em_kda_forward of --verify rows with a log, then em_kda_commit of all but the
 *            last two (a speculative pass), passes/s;
 *   prefill  em_kda_forward_commit of --rows rows in one call, tokens/s, once with the chunked
 *            WY form (chunk_min_rows 1) and once with the recurrent form (chunk_min_rows 0).
 * Each line for every thread count in --threads. EMBER_ISA=scalar|avx2 picks the kernels.
 * Besides wall time, each line gives the process CPU time per item (all threads summed): on a
 * shared machine wall time includes waiting for a core, CPU time does not.
 *
 * usage: bench_kda [--heads H] [--dim D] [--rows N] [--verify N] [--states S]
 *                  [--threads 1,2] [--seconds T] [--bounded]
 *                  [--only decode|verify|prefill] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "bench_util.h"
#include "model/kda.h"
#include "quant/quant.h"

typedef struct opts {
    int heads, dim, rows, verify, states, n_threads, threads[8];
    double seconds;
    bool bounded;
    const char *only;
} opts;

static bool want(const opts *o, const char *what) { return !o->only || !strcmp(o->only, what); }

static float *rnd(size_t n, float lo, float hi, uint64_t *s) {
    float *v = malloc(n * sizeof(float));
    if (!v) {
        fprintf(stderr, "bench_kda: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
        v[i] = lo + (hi - lo) * (float)((*s >> 11) * (1.0 / 9007199254740992.0));
    }
    return v;
}

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){ .heads = 32, .dim = 128, .rows = 512, .verify = 8, .states = 8,
                 .n_threads = 2, .threads = { 1, 2 }, .seconds = 1.0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--bounded")) {
            o->bounded = true;
            continue;
        }
        if (!v) goto usage;
        i++;
        if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--dim")) o->dim = atoi(v);
        else if (!strcmp(a, "--rows")) o->rows = atoi(v);
        else if (!strcmp(a, "--verify")) o->verify = atoi(v);
        else if (!strcmp(a, "--states")) o->states = atoi(v);
        else if (!strcmp(a, "--seconds")) o->seconds = atof(v);
        else if (!strcmp(a, "--only")) o->only = v;
        else if (!strcmp(a, "--threads")) {
            o->n_threads = 0;
            for (const char *p = v; *p && o->n_threads < 8;) {
                o->threads[o->n_threads++] = atoi(p);
                p = strchr(p, ',');
                if (!p) break;
                p++;
            }
        } else goto usage;
    }
    if (o->heads < 1 || o->dim < 1 || o->rows < 1 || o->verify < 3 || o->states < 1 ||
        o->seconds <= 0 || o->n_threads < 1)
        goto usage;
    for (int i = 0; i < o->n_threads; i++)
        if (o->threads[i] < 1) goto usage;
    return 0;
usage:
    fprintf(stderr, "usage: bench_kda [--heads H] [--dim D] [--rows N] [--verify N>=3] "
                    "[--states S] [--threads 1,2] [--seconds T] [--bounded] "
                    "[--only decode|verify|prefill]\n");
    return 2;
}

static void die(int rc, const em_err *err) {
    if (rc) {
        fprintf(stderr, "bench_kda: %s\n", err->msg);
        exit(1);
    }
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) return 2;
    em_kda_dims d = { .n_head = o.heads, .head_dim = o.dim, .d_conv = 4, .norm_eps = 1e-5f,
                      .l2_eps = 1e-6f, .bounded_gate = o.bounded, .gate_lower_bound = -5.0f };
    em_err err = { 0 };
    die(em_kda_dims_check(&d, &err), &err);
    const size_t di = (size_t)o.heads * (size_t)o.dim, dc = 4;
    const int nmax = o.rows > o.verify ? o.rows : o.verify;
    uint64_t seed = 0x1234567;
    float *cq = rnd(di * dc, -0.5f, 0.5f, &seed), *ck = rnd(di * dc, -0.5f, 0.5f, &seed);
    float *cv = rnd(di * dc, -0.5f, 0.5f, &seed), *a = rnd((size_t)o.heads, -16.0f, -1.0f, &seed);
    float *dtb = rnd(di, -1.0f, 1.0f, &seed), *onorm = rnd((size_t)o.dim, 0.5f, 1.5f, &seed);
    em_kda_params p = { cq, ck, cv, a, dtb, onorm };
    float *qkv = rnd((size_t)nmax * 3 * di, -2.0f, 2.0f, &seed);
    float *f = rnd((size_t)nmax * di, -6.0f, 0.0f, &seed);
    float *b = rnd((size_t)nmax * (size_t)o.heads, -3.0f, 3.0f, &seed);
    float *g2 = rnd((size_t)nmax * di, -3.0f, 3.0f, &seed);
    float *out = rnd((size_t)nmax * di, 0.0f, 0.0f, &seed);
    em_kda_state *st = calloc((size_t)o.states, sizeof(*st));
    for (int i = 0; i < o.states; i++) die(em_kda_state_init(&st[i], &d, &err), &err);
    em_kda_log *log;
    die(em_kda_log_create(&log, &d, o.verify, false, &err), &err);
    em_arena *arena;
    die(em_arena_create(&arena, 8u << 20, &err), &err);
    const double s_bytes = (double)o.heads * o.dim * o.dim * 4.0;

    printf("bench_kda: %d heads x %d, d_conv 4, %s gate, isa %s, state %.2f MiB/layer\n",
           o.heads, o.dim, o.bounded ? "bounded (K3)" : "softplus (Kimi-Linear)",
           em_isa_name(em_isa_default()), s_bytes / 1048576.0);
    printf("%-8s %7s %12s %10s %10s %s\n", "what", "threads", "per second", "us each",
           "cpu-us", "notes");
    for (int ti = 0; ti < o.n_threads; ti++) {
        const int nt = o.threads[ti];
        em_pool *pool = NULL;
        if (nt > 1) die(em_pool_create(&pool, nt, &err), &err);
        /* decode, hot (one state) and cold (cycling over all states) */
        for (int cold = 0; want(&o, "decode") && cold < (o.states > 1 ? 2 : 1); cold++) {
            const int ns = cold ? o.states : 1;
            long steps = 0;
            double t0 = em_time_now(), c0 = bench_cpu_now(), t;
            do {
                for (int i = 0; i < 16; i++, steps++) {
                    em_arena_reset(arena);
                    die(em_kda_forward_commit(&d, &p, &st[steps % ns], 1, qkv + (steps % 8) * 3 * di,
                                              f, b, g2, out, pool, arena, &err),
                        &err);
                }
                t = em_time_now() - t0;
            } while (t < o.seconds);
            printf("%-8s %7d %12.0f %10.2f %10.2f %s, %.1f GB/s of state r+w\n", "decode", nt,
                   steps / t, 1e6 * t / steps, 1e6 * (bench_cpu_now() - c0) / steps,
                   cold ? "cold states" : "hot state", 2.0 * s_bytes * steps / t / 1e9);
        }
        /* verify + commit */
        if (want(&o, "verify")) {
            long passes = 0;
            double t0 = em_time_now(), c0 = bench_cpu_now(), t;
            do {
                em_arena_reset(arena);
                die(em_kda_forward(&d, &p, &st[0], o.verify, qkv, f, b, g2, out, log, pool, arena,
                                   &err),
                    &err);
                die(em_kda_commit(&d, &st[0], log, o.verify - 2, pool, &err), &err);
                passes++;
                t = em_time_now() - t0;
            } while (t < o.seconds);
            char note[64];
            snprintf(note, sizeof note, "forward %d rows + commit %d", o.verify, o.verify - 2);
            printf("%-8s %7d %12.0f %10.2f %10.2f %s (%.0f rows/s)\n", "verify", nt, passes / t,
                   1e6 * t / passes, 1e6 * (bench_cpu_now() - c0) / passes, note, passes * o.verify / t);
        }
        /* prefill: one call of --rows rows, chunked form then recurrent form */
        for (int form = 0; form < 2 && want(&o, "prefill"); form++) {
            em_kda_dims df = d;
            df.chunk_min_rows = form ? 0 : 1;
            long passes = 0;
            double t0 = em_time_now(), c0 = bench_cpu_now(), t;
            do {
                em_arena_reset(arena);
                die(em_kda_forward_commit(&df, &p, &st[0], o.rows, qkv, f, b, g2, out, pool, arena,
                                          &err),
                    &err);
                passes++;
                t = em_time_now() - t0;
            } while (t < o.seconds);
            printf("%-8s %7d %12.0f %10.2f %10.2f %d rows per call, %s form (per row)\n",
                   "prefill", nt, passes * (double)o.rows / t, 1e6 * t / (passes * (double)o.rows),
                   1e6 * (bench_cpu_now() - c0) / (passes * (double)o.rows), o.rows,
                   form ? "recurrent" : "chunked WY");
        }
        em_pool_free(pool);
    }
    for (int i = 0; i < o.states; i++) em_kda_state_free(&st[i]);
    free(st);
    em_kda_log_free(log);
    em_arena_free(arena);
    free(cq), free(ck), free(cv), free(a), free(dtb), free(onorm), free(qkv), free(f), free(b);
    free(g2), free(out);
    return 0;
}
