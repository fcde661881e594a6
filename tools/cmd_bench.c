/* `ember bench -m MODEL.gguf [-p 512] [-n 64] [--threads N] [--reps R] [--json]`: prompt and
 * decode speed of a target. Each repetition starts from an empty sequence (reset), prefills
 * P token ids (pseudo-random from --seed, the same every repetition; timed), then runs N
 * decode steps of verify(W) + commit(W) (W = --verify-width, default 1: plain decoding;
 * timed), each step's first token the greedy pick of the previous step's last row and the
 * other W-1 pseudo-random. With --commit C < W a step models a speculative pass that commits C
 * tokens (tau C): its first C rows replay a plain greedy run made before (the anchor and C - 1
 * drafts the target accepts), the other W - C are pseudo-random (rejected drafts), and the
 * step commits C; each step checks that the target's pick after its C rows is the greedy run's
 * next token (verify rows equal single steps). Prints min / median / max over the repetitions
 * of prompt tok/s and decode tok/s (W > 1: verified rows/s; C < W: committed tokens/s). Untimed warm-up repetitions first fault the
 * mapped weights in. tests/compat/llama_ref.c `bench` runs the same protocol through
 * llama.cpp (the token ids come from the same generator). With routed experts on storage
 * (--moe-storage ssd, --expert-cache), also the bytes read from storage per decoded row and the
 * expert cache's hit rate during the decode steps. A CPU target also reports where a decode
 * step's time goes (its phases: seconds, weight bytes and pool hand-offs per step), and the
 * memory rate the decode reached (weight bytes a step streams x steps/s) against a plain
 * threaded read of as many bytes of the model file, timed right after each repetition's
 * decode (the same machine state): the roofline the step is measured by. Owns only the
 * protocol, timing and output. */
#include "cli.h"

#include "model/model.h"
#include "model_flags.h"
#include "compute/compute.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char bench_usage[] =
    "usage: ember bench -m MODEL.gguf [-p P] [-n N] [--threads T] [--reps R] [--warmup K]\n"
    "                   [--verify-width W] [--commit C] [--ubatch U] [--seed S] [--json] [--phases]\n"
    "                   [--moe-storage resident|ssd|auto] [--expert-cache SIZE] [--device D] [--devices L]\n"
    "\n"
    "Measures prompt and decode speed. Each repetition resets the sequence, prefills P\n"
    "pseudo-random token ids (timed: prompt tok/s), then runs N decode steps, each a\n"
    "verify of W rows and a commit of all W, or of C (timed: decode tok/s, or rows/s when\n"
    "W > 1 commits all W).\n"
    "Prints min, median and max over the repetitions.\n"
    "\n"
    "  -m, --model FILE       the model (GGUF)\n"
    "  -p, --n-prompt P       prompt tokens (default 512)\n"
    "  -n, --n-gen N          decode steps (default 64; 0: prompt only)\n"
    "      --threads T        compute threads (default: all CPUs)\n"
    "      --reps R           timed repetitions (default 3)\n"
    "      --warmup K         untimed repetitions first (default 1)\n"
    "      --verify-width W   rows per decode step (default 1)\n"
    "      --commit C         rows a step commits (1..W, default W): a speculative pass at tau C,\n"
    "                         its first C rows replaying a plain greedy run, the rest rejected\n"
    "                         (decode tok/s and storage bytes per committed token)\n"
    "      --ubatch U         rows per prefill step (default: the model's, 128)\n"
    "      --seed S           seed of the prompt's token ids (default 1)\n"
    "      --moe-storage M    where routed experts live (default auto; ssd: read on demand)\n"
    "      --expert-cache SIZE  the expert cache budget with ssd (e.g. 512M; default: automatic)\n"
    "                         with ssd the decode line is followed by storage bytes per\n"
    "                         committed row\n"
    "      --device D         cpu, cuda:N or auto (default: cuda:0 when the model fits there, else cpu)\n"
    "      --devices L        the routed experts over several GPUs, e.g. cuda:0,cuda:1 (the first holds\n"
    "                         the rest of the model)\n"
    "      --phases           also print where a decode step's time goes (a CPU target's phases)\n"
    "      --json             one JSON object on stdout instead of the table (phases included)\n";

#define MAX_REPS 1000

typedef struct bench_opts {
    const char *model;
    int n_prompt, n_gen, n_threads, reps, warmup, width, commit, ubatch;
    unsigned long long seed;
    bool json, phases;
    int moe_storage;            /* enum em_moe_storage */
    int device, cuda_index;     /* --device (enum em_device_kind) */
    int cuda_devices[EM_GPU_MAX_SHARES], n_cuda_devices; /* --devices */
    uint64_t expert_cache;
} bench_opts;

/* One repetition's rates. */
typedef struct bench_rep {
    double prompt_s, decode_s;
    double bytes_read, hits, misses; /* routed experts from storage during the decode steps */
    double read_gbs;                 /* the plain read of a step's weight bytes after it (0: none) */
} bench_rep;

/* ---- the read-rate reference --------------------------------------------------------------- */

/* GB/s of the pool reading about `bytes` of the mapped model (1 MiB tasks, as the products
 * stream their matrices; one task under 1 MiB), or 0 when there is nothing to read. */
static double read_rate(em_pool *pool, const em_mmap *map, uint64_t bytes) {
    if (bytes > map->size) bytes = map->size;
    const uint64_t part = bytes < (1u << 20) ? bytes / 128 * 128 : 1u << 20;
    const double s = em_read_seconds(pool, map->data, bytes, part);
    return s > 0 ? (double)(bytes / part * part) / s / 1e9 : 0.0;
}

static void expert_counts(const em_target *t, em_target_expert_counts *c) {
    em_err ignored = { 0 };
    if (em_target_expert_stats(t, -1, c, &ignored)) *c = (em_target_expert_counts){ 0 };
}

/* The prompt generator shared with llama_ref.c's bench (xorshift64*, ids in [0, n_vocab)):
 * both engines see the same ids. */
static int32_t next_token(uint64_t *s, int n_vocab) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (int32_t)(((*s * 2685821657736338717ull) >> 33) % (uint64_t)n_vocab);
}

static int32_t argmax(const float *row, int n) {
    int best = 0;
    for (int j = 1; j < n; j++)
        if (row[j] > row[best]) best = j;
    return best;
}

/* What a repetition measures besides the target: its phases (summed over the timed
 * repetitions) and the read-rate reference. */
typedef struct bench_probe {
    bool phases;          /* the target has a breakdown */
    em_target_phase sum[EM_PHASES_MAX];
    int n_phases;
    uint64_t step_bytes;  /* weight bytes a decode step streams (em_cost) */
    em_pool *pool;        /* NULL: no read reference */
    em_mmap map;
} bench_probe;

/* One decode step: block[0] is the anchor; rows 1..C-1 the replayed run's next tokens (ref,
 * from the anchor's index on) when replaying, and the rest pseudo-random; verify W, commit C,
 * and the next anchor: the pick after row C - 1 (replaying: checked against ref). */
static int bench_step(em_target *t, const bench_opts *o, const int32_t *ref, int64_t at, uint64_t *s, int32_t *block,
                      float *logits, em_err *err) {
    const int V = em_target_get_info(t)->n_vocab, W = o->width, C = o->commit;
    for (int j = 1; j < W; j++) block[j] = ref && j < C ? ref[at + j] : next_token(s, V);
    em_rows all = { .logits = logits };
    int rc = em_target_verify(t, block, W, &all, err);
    if (!rc) rc = em_target_commit(t, C, err);
    if (rc) return rc;
    block[0] = argmax(logits + (int64_t)(C - 1) * V, V);
    if (ref && block[0] != ref[at + C])
        return em_err_set(err, EM_EINVAL, "the pick after %d verified rows is token %d, the plain run's %d (a verify "
                          "row differs from a single step)", C, block[0], ref[at + C]);
    return EM_OK;
}

/* The plain greedy run a --commit < W bench replays: the pick after the prompt, then n_gen x C
 * one-row steps (untimed; before the warm-up, which leaves the expert cache as the replay
 * leaves it). ref holds n_gen x C + 1 ids. */
static int reference_run(em_target *t, const bench_opts *o, const int32_t *prompt, float *logits, int32_t *ref,
                         em_err *err) {
    const int V = em_target_get_info(t)->n_vocab;
    em_target_reset(t);
    em_rows last = { .logits = logits, .last_only = true };
    int rc = em_target_prefill(t, prompt, o->n_prompt, &last, err);
    if (rc) return em_err_prefix(err, "the plain run for --commit");
    ref[0] = argmax(logits, V);
    const int64_t n = (int64_t)o->n_gen * o->commit;
    for (int64_t i = 0; i < n; i++) {
        em_rows one = { .logits = logits };
        if ((rc = em_target_verify(t, &ref[i], 1, &one, err)) || (rc = em_target_commit(t, 1, err)))
            return em_err_prefix(err, "the plain run for --commit, token %lld", (long long)i);
        ref[i + 1] = argmax(logits, V);
    }
    return EM_OK;
}

/* Reset, timed prefill, timed decode steps, then the read of as many bytes as the steps
 * streamed (when pr->pool). logits holds [width][n_vocab]; ref: the plain run a --commit
 * below the width replays (else NULL). */
static int bench_once(em_target *t, const bench_opts *o, const int32_t *prompt, const int32_t *ref, float *logits,
                      bench_probe *pr, bool timed, bench_rep *r, em_err *err) {
    const int V = em_target_get_info(t)->n_vocab;
    em_target_reset(t);
    em_rows last = { .logits = logits, .last_only = true };
    double t0 = em_time_now();
    int rc = em_target_prefill(t, prompt, o->n_prompt, &last, err);
    if (rc) return rc;
    em_target_expert_counts c0, c1;
    expert_counts(t, &c0);
    double t1 = em_time_now();
    uint64_t s = o->seed ^ 0x9E3779B97F4A7C15ull; /* the extra rows of a wide verify */
    int32_t block[256];
    block[0] = argmax(logits, V);
    if (ref && block[0] != ref[0]) return em_err_set(err, EM_EINVAL, "the prompt's pick differs from the plain run's");
    if (pr->phases && (rc = em_target_phases_enable(t, true, err))) return rc;
    for (int i = 0; i < o->n_gen; i++)
        if ((rc = bench_step(t, o, ref, (int64_t)i * o->commit, &s, block, logits, err)))
            return em_err_prefix(err, "decode step %d", i);
    double t2 = em_time_now();
    em_target_phase ph[EM_PHASES_MAX];
    const int n_ph = pr->phases ? em_target_phases(t, ph, EM_PHASES_MAX) : 0;
    for (int i = 0; timed && i < n_ph; i++) {
        pr->sum[i].name = ph[i].name;
        pr->sum[i].seconds += ph[i].seconds;
        pr->sum[i].laps += ph[i].laps;
        pr->sum[i].bytes += ph[i].bytes;
        pr->sum[i].pool_runs += ph[i].pool_runs;
    }
    if (timed) pr->n_phases = n_ph;
    if (pr->phases) (void)em_target_phases_enable(t, false, err);
    if (pr->pool) r->read_gbs = read_rate(pr->pool, &pr->map, pr->step_bytes);
    expert_counts(t, &c1);
    r->prompt_s = t1 - t0;
    r->decode_s = t2 - t1;
    r->bytes_read = (double)(c1.bytes_read - c0.bytes_read);
    r->hits = (double)(c1.hits - c0.hits);
    r->misses = (double)(c1.misses - c0.misses);
    return EM_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct summary {
    double min, median, max;
} summary;

static summary summarize(const double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    summary out = { 0 };
    if (!s) return out;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    out.min = s[0];
    out.max = s[n - 1];
    out.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return out;
}

static json_t *json_metric(const char *unit, const double *v, int n) {
    summary s = summarize(v, n);
    json_t *runs = json_array();
    for (int i = 0; runs && i < n; i++) json_array_append_new(runs, json_real(v[i]));
    return json_pack("{s:s, s:f, s:f, s:f, s:o}", "unit", unit, "min", s.min, "median", s.median, "max",
                     s.max, "runs", runs);
}

static void print_metric(const char *name, int count, const char *what, const char *unit,
                         const double *v, int n) {
    summary s = summarize(v, n);
    printf("%-9s %5d %-7s %-7s min %9.2f  median %9.2f  max %9.2f\n", name, count, what, unit, s.min,
           s.median, s.max);
}

/* Per repetition: prompt tok/s, decode tok/s (or rows/s), storage bytes per committed row and
 * the hit rate, the decode's weight GB/s and the read reference's GB/s. */
typedef struct bench_results {
    double *pp, *tg, *bpr, *hit, *mem, *read;
} bench_results;

/* The phases as JSON: per decode step (timed repetitions' sums / their steps). */
static json_t *json_phases(const bench_probe *pr, double steps) {
    json_t *a = json_array();
    for (int i = 0; a && i < pr->n_phases; i++) {
        const em_target_phase *p = &pr->sum[i];
        json_array_append_new(a, json_pack("{s:s, s:f, s:f, s:f, s:f}", "name", p->name, "ms_per_step",
                                           p->seconds / steps * 1e3, "weight_mb_per_step", (double)p->bytes / steps / 1e6,
                                           "gb_per_s", p->seconds > 0 ? (double)p->bytes / p->seconds / 1e9 : 0.0,
                                           "pool_runs_per_step", (double)p->pool_runs / steps));
    }
    return a;
}

static void print_phases(const bench_probe *pr, double steps) {
    double total = 0;
    for (int i = 0; i < pr->n_phases; i++) total += pr->sum[i].seconds;
    printf("decode step by phase (per step, over the timed repetitions):\n");
    printf("  %-18s %9s %6s %10s %8s %10s\n", "phase", "ms", "share", "weight MB", "GB/s", "pool runs");
    for (int i = 0; i < pr->n_phases; i++) {
        const em_target_phase *p = &pr->sum[i];
        if (p->laps == 0) continue;
        printf("  %-18s %9.3f %5.1f%% %10.2f %8.2f %10.1f\n", p->name, p->seconds / steps * 1e3,
               total > 0 ? 100.0 * p->seconds / total : 0.0, (double)p->bytes / steps / 1e6,
               p->seconds > 0 ? (double)p->bytes / p->seconds / 1e9 : 0.0, (double)p->pool_runs / steps);
    }
}

static int report(const bench_opts *o, const em_target *t, const bench_probe *pr, const bench_results *res) {
    em_target_expert_counts ec;
    expert_counts(t, &ec);
    const bool ssd = ec.storage == EM_MOE_SSD && o->n_gen > 0;
    bool roof = pr->pool && o->n_gen > 0;
    for (int i = 0; roof && i < o->reps; i++) roof = res->read[i] > 0;
    const double steps = (double)o->n_gen * o->reps;
    const em_target_info *info = em_target_get_info(t);
    const char *unit = o->width == 1 || o->commit < o->width ? "tok/s" : "rows/s";
    if (o->json) {
        json_t *root = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:o}", "engine",
                                 "ember", "model", o->model, "arch", info->arch, "device", info->device, "threads", o->n_threads,
                                 "n_prompt", o->n_prompt, "n_gen", o->n_gen, "verify_width", o->width, "commit", o->commit,
                                 "reps", o->reps, "warmup", o->warmup, "n_vocab", info->n_vocab, "seed",
                                 (json_int_t)o->seed, "prompt", json_metric("tok/s", res->pp, o->reps));
        if (root && o->n_gen > 0) json_object_set_new(root, "decode", json_metric(unit, res->tg, o->reps));
        if (root && roof) {
            json_object_set_new(root, "weight_bytes_per_step", json_integer((json_int_t)pr->step_bytes));
            json_object_set_new(root, "decode_weight_gbs", json_metric("GB/s", res->mem, o->reps));
            json_object_set_new(root, "read_same_bytes_gbs", json_metric("GB/s", res->read, o->reps));
        }
        if (root && pr->n_phases > 0 && o->n_gen > 0) json_object_set_new(root, "decode_phases", json_phases(pr, steps));
        if (root && ssd) {
            json_object_set_new(root, "storage_bytes_per_row", json_metric("bytes", res->bpr, o->reps));
            json_object_set_new(root, "expert_hit_rate", json_metric("fraction", res->hit, o->reps));
            json_object_set_new(root, "expert_cache_budget", json_integer((json_int_t)ec.cache_budget));
            json_object_set_new(root, "routed_bytes", json_integer((json_int_t)ec.file_bytes));
        }
        char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
        json_decref(root);
        if (!text) {
            fprintf(stderr, "ember bench: out of memory for the JSON report\n");
            return EM_EXIT_FAIL;
        }
        printf("%s\n", text);
        free(text);
        return EM_EXIT_OK;
    }
    printf("ember bench: %s (%s, %d layers, vocab %d) on %s, %d threads, %d reps after %d warm-up\n", o->model,
           info->arch, info->n_layer, info->n_vocab, info->device, o->n_threads, o->reps, o->warmup);
    print_metric("prompt", o->n_prompt, "tokens", "tok/s", res->pp, o->reps);
    if (o->n_gen > 0) {
        char name[32];
        if (o->commit < o->width) snprintf(name, sizeof name, "tau%d/w%d", o->commit, o->width);
        else snprintf(name, sizeof name, o->width == 1 ? "decode" : "verify%d", o->width);
        print_metric(name, o->n_gen, "steps", unit, res->tg, o->reps);
    }
    if (roof) {
        print_metric("weights", o->n_gen, "steps", "GB/s", res->mem, o->reps);
        print_metric("read", o->n_gen, "steps", "GB/s", res->read, o->reps);
    }
    if (ssd) {
        print_metric("storage", o->n_gen, "steps", o->commit < o->width ? "KiB/tok" : "KiB/row", res->bpr, o->reps);
        print_metric("hits", o->n_gen, "steps", "%", res->hit, o->reps);
    }
    if (o->phases && pr->n_phases > 0 && o->n_gen > 0) print_phases(pr, steps);
    return EM_EXIT_OK;
}

/* The breakdown and the read reference, where the target runs on the CPU (a GPU's steps are
 * not bound by host memory). */
static int probe_open(bench_probe *pr, em_target *t, const bench_opts *o, em_err *err) {
    *pr = (bench_probe){ 0 };
    if (strcmp(em_target_get_info(t)->device, "cpu") != 0 || o->n_gen == 0) return EM_OK;
    em_err ignored = { 0 };
    pr->phases = em_target_phases_enable(t, false, &ignored) == EM_OK;
    pr->step_bytes = em_target_cost(t, o->width).weight_bytes;
    if (pr->step_bytes == 0) return EM_OK;
    int rc = em_mmap_open(&pr->map, o->model, err);
    if (!rc) rc = em_pool_create(&pr->pool, o->n_threads, err);
    if (!rc) (void)read_rate(pr->pool, &pr->map, pr->step_bytes); /* faults the mapping in, untimed */
    return rc;
}

static void probe_close(bench_probe *pr) {
    em_pool_free(pr->pool);
    em_mmap_close(&pr->map);
}

static int run_bench(bench_opts *o, em_err *err) {
    int64_t positions = (int64_t)o->n_prompt + (int64_t)o->n_gen * o->width;
    if (positions > (1 << 24))
        return em_err_set(err, EM_EINVAL, "%d prompt tokens + %d steps x %d rows exceed %d positions", o->n_prompt,
                          o->n_gen, o->width, 1 << 24);
    em_model_opts mo = {
        .n_threads = o->n_threads, .n_ctx = (int)positions, .ubatch = o->ubatch,
        .moe_storage = o->moe_storage, .expert_cache_bytes = o->expert_cache,
        .device = o->device, .cuda_index = o->cuda_index, .cuda_devices = o->cuda_devices,
        .n_cuda_devices = o->n_cuda_devices,
        .max_verify = o->width > EM_MODEL_DEFAULT_MAX_VERIFY ? o->width : 0,
    };
    em_target *t;
    int rc = em_model_open(&t, o->model, &mo, err);
    if (rc) return rc;
    if (o->n_threads == 0) o->n_threads = em_cpu_count();
    const int V = em_target_get_info(t)->n_vocab;
    bench_probe pr;
    rc = probe_open(&pr, t, o, err);
    int32_t *prompt = em_malloc((size_t)o->n_prompt * sizeof *prompt, "prompt ids", err);
    float *logits = em_malloc((size_t)o->width * (size_t)V * sizeof *logits, "logits", err);
    double *all = em_calloc(6 * (size_t)o->reps, sizeof *all, "results", err);
    int32_t *ref = NULL; /* the plain run a --commit below the width replays */
    if (!rc && o->commit < o->width) {
        ref = em_malloc(((size_t)o->n_gen * (size_t)o->commit + 1) * sizeof *ref, "the plain run's ids", err);
        if (!ref) rc = EM_ENOMEM;
    }
    bench_results res = { 0 };
    if (all)
        res = (bench_results){ all, all + o->reps, all + 2 * o->reps, all + 3 * o->reps, all + 4 * o->reps,
                               all + 5 * o->reps };
    if (!rc && (!prompt || !logits || !all)) rc = EM_ENOMEM;
    uint64_t s = o->seed ? o->seed : 1;
    for (int i = 0; !rc && i < o->n_prompt; i++) prompt[i] = next_token(&s, V);
    if (!rc && ref) rc = reference_run(t, o, prompt, logits, ref, err);
    for (int i = 0; !rc && i < o->warmup + o->reps; i++) {
        bench_rep r = { 0 };
        const int k = i - o->warmup;
        rc = bench_once(t, o, prompt, ref, logits, &pr, k >= 0, &r, err);
        if (rc) em_err_prefix(err, "repetition %d", i);
        else if (k >= 0) { /* rates per committed row */
            const double rows = (double)o->n_gen * o->commit, looked = r.hits + r.misses;
            res.pp[k] = o->n_prompt / r.prompt_s;
            res.tg[k] = r.decode_s > 0 ? rows / r.decode_s : 0.0;
            /* JSON: bytes per committed row; the table: KiB per row, hit rate in % */
            res.bpr[k] = rows > 0 ? r.bytes_read / rows / (o->json ? 1.0 : 1024.0) : 0.0;
            res.hit[k] = looked > 0 ? r.hits / looked * (o->json ? 1.0 : 100.0) : 0.0;
            res.mem[k] = r.decode_s > 0 ? (double)pr.step_bytes * o->n_gen / r.decode_s / 1e9 : 0.0;
            res.read[k] = r.read_gbs;
        }
    }
    int status = rc ? -1 : report(o, t, &pr, &res);
    probe_close(&pr);
    free(all);
    free(ref);
    free(prompt);
    free(logits);
    em_target_close(t);
    if (status > 0) return em_err_set(err, EM_ENOMEM, "out of memory for the report");
    return rc;
}

static int bench_main(int argc, char **argv) {
    bench_opts o = { .n_prompt = 512, .n_gen = 64, .reps = 3, .warmup = 1, .width = 1, .seed = 1 };
    em_err err = { 0 };
    const em_cmd *cmd = &em_cmd_bench;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            o.json = true;
            continue;
        }
        if (!strcmp(a, "--phases")) {
            o.phases = true;
            continue;
        }
        if ((!strcmp(a, "--moe-storage") || !strcmp(a, "--expert-cache") || !strcmp(a, "--device") ||
             !strcmp(a, "--devices")) && i + 1 >= argc)
            return em_cli_usage_error(cmd, "%s needs a value", a);
        if (!strcmp(a, "--device")) {
            int rc = em_cli_device(cmd, a, argv[++i], &o.device, &o.cuda_index);
            if (rc >= 0) return rc;
            continue;
        }
        if (!strcmp(a, "--devices")) {
            int rc = em_cli_devices(cmd, a, argv[++i], o.cuda_devices, &o.n_cuda_devices);
            if (rc >= 0) return rc;
            continue;
        }
        if (!strcmp(a, "--moe-storage")) {
            const char *v = argv[++i];
            if (!strcmp(v, "auto")) o.moe_storage = EM_MOE_AUTO;
            else if (!strcmp(v, "resident")) o.moe_storage = EM_MOE_RESIDENT;
            else if (!strcmp(v, "ssd")) o.moe_storage = EM_MOE_SSD;
            else return em_cli_usage_error(cmd, "--moe-storage: '%s' is not resident, ssd or auto", v);
            continue;
        }
        if (!strcmp(a, "--expert-cache")) {
            if (em_parse_size(argv[++i], &o.expert_cache, &err) || o.expert_cache == 0)
                return em_cli_usage_error(cmd, "--expert-cache: %s", err.msg[0] ? err.msg : "no room for any expert");
            continue;
        }
        struct { const char *flag, *alt; int *dst; long long lo, hi; } ints[] = {
            { "-p", "--n-prompt", &o.n_prompt, 1, 1 << 24 }, { "-n", "--n-gen", &o.n_gen, 0, 1 << 24 },
            { "--threads", NULL, &o.n_threads, 1, 1024 },     { "--reps", NULL, &o.reps, 1, MAX_REPS },
            { "--warmup", NULL, &o.warmup, 0, MAX_REPS },     { "--verify-width", NULL, &o.width, 1, 256 },
            { "--ubatch", NULL, &o.ubatch, 1, 1 << 16 },       { "--commit", NULL, &o.commit, 1, 256 },
        };
        bool is_model = !strcmp(a, "-m") || !strcmp(a, "--model"), is_seed = !strcmp(a, "--seed");
        int which = -1;
        for (int k = 0; k < (int)(sizeof ints / sizeof ints[0]); k++)
            if (!strcmp(a, ints[k].flag) || (ints[k].alt && !strcmp(a, ints[k].alt))) which = k;
        if (!is_model && !is_seed && which < 0) {
            if (a[0] == '-') return em_cli_usage_error(cmd, "unknown flag '%s'", a);
            return em_cli_usage_error(cmd, "unexpected argument '%s'", a);
        }
        if (i + 1 >= argc) return em_cli_usage_error(cmd, "%s needs a value", a);
        const char *val = argv[++i];
        long long v;
        if (is_model) {
            o.model = val;
        } else if (is_seed) {
            if (em_parse_int(val, 0, INT64_MAX, &v, a, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
            o.seed = (unsigned long long)v;
        } else {
            if (em_parse_int(val, ints[which].lo, ints[which].hi, &v, a, &err))
                return em_cli_usage_error(cmd, "%s", err.msg);
            *ints[which].dst = (int)v;
        }
    }
    if (!o.model) return em_cli_usage_error(cmd, "missing -m MODEL.gguf");
    if (o.commit > o.width)
        return em_cli_usage_error(cmd, "--commit %d: a step commits at most the %d rows it verifies (--verify-width)",
                                  o.commit, o.width);
    if (o.commit == 0) o.commit = o.width;
    return run_bench(&o, &err) ? em_cli_fail(cmd, &err) : EM_EXIT_OK;
}

const em_cmd em_cmd_bench = {
    .name = "bench",
    .summary = "prompt and decode speed (tok/s, min/median/max over repetitions)",
    .usage = bench_usage,
    .main = bench_main,
};
