/* bench/bench_target.c: a target's speed on one device, measured on one open target (so a
 * 52 GB model is uploaded once): prefill of P tokens, greedy decoding (verify(1) + commit(1),
 * argmax only, as the decode loop asks), and the verify cost curve t(n)/t(1) for n = 1..16
 * with the bytes each verify reads (dense weights + the union of the rows' routed experts,
 * from the file's tensor sizes and the routes the target reports). Each figure is the median
 * of --reps runs; the decode roofline is the bytes a token reads over --bw bytes/s.
 *
 *   bench_target -m MODEL.gguf [--device cpu|cuda:N|auto] [-p 4096] [-n 128] [--reps 5]
 *                [--ctx-prompt 512] [--max-width 16] [--bw 4.6e12] [--json]
 *
 * On the CUDA target the absolute times hold (docs/cuda.md); on the CPU use ember bench's
 * ratios instead. */
#include "format/gguf.h"
#include "model/model.h"

#include "bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 101
#define MAX_W 16

typedef struct opts {
    const char *model;
    int device, cuda_index, n_prompt, n_gen, reps, ctx_prompt, max_width;
    double bw;
    bool json;
} opts;

typedef struct sizes {
    double dense, expert, embd_row; /* bytes: non-expert weights, one expert, one embedding row */
    int n_expert, k;
} sizes;

static void die(const char *what, const em_err *err) {
    fprintf(stderr, "bench_target: %s: %s\n", what, err->msg);
    exit(1);
}

static int arch_int(const em_gguf *g, const char *arch, const char *suffix, int def) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    return em_gguf_get_int(g, key, &v, NULL) ? def : (int)v;
}

/* What a token reads, from the file: every tensor but the routed experts and the embedding
 * table is streamed per pass; each routed expert used once; one embedding row. */
static void file_sizes(const char *path, const em_target_info *info, sizes *s) {
    em_gguf *g;
    em_err err = { 0 };
    if (em_gguf_open(&g, path, &err)) die(path, &err);
    *s = (sizes){ 0 };
    double experts = 0, embd = 0, all = 0;
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        all += (double)t->bytes;
        if (strstr(t->name, "_exps.")) experts += (double)t->bytes;
        if (!strcmp(t->name, "token_embd.weight")) embd = (double)t->bytes;
    }
    s->n_expert = arch_int(g, info->arch, "expert_count", 0);
    s->k = arch_int(g, info->arch, "expert_used_count", 0);
    s->dense = all - experts - embd;
    s->expert = info->n_moe_layers && s->n_expert ? experts / info->n_moe_layers / s->n_expert : 0;
    s->embd_row = info->n_vocab ? embd / info->n_vocab : 0;
    em_gguf_close(g);
}

static void next_tokens(uint64_t *s, int32_t *tok, int n, int V) {
    for (int i = 0; i < n; i++) {
        *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
        tok[i] = (int32_t)(*s % (uint64_t)V);
    }
}

/* Distinct experts per MoE layer over n rows' routes, summed over the layers. */
static double union_experts(const int32_t *routes, int n, const em_target_info *info, int k, int n_expert) {
    double total = 0;
    char *seen = calloc((size_t)n_expert, 1);
    for (int l = 0; seen && l < info->n_moe_layers; l++) {
        memset(seen, 0, (size_t)n_expert);
        for (int j = 0; j < n; j++)
            for (int i = 0; i < k; i++) {
                int32_t e = routes[(int64_t)j * info->n_route + l * k + i];
                if (e >= 0 && e < n_expert && !seen[e]) seen[e] = 1, total++;
            }
    }
    free(seen);
    return total;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_target -m MODEL.gguf [--device cpu|cuda:N|auto] [-p P] [-n N] [--reps R] "
                    "[--ctx-prompt C] [--max-width W] [--bw BYTES_PER_S] [--json]\n"
                    "  --max-width W: the verify curve for n = 1..W (1..16; default 16)\n");
    exit(2);
}

static void parse(int argc, char **argv, opts *o) {
    *o = (opts){ .n_prompt = 4096, .n_gen = 128, .reps = 5, .ctx_prompt = 512, .max_width = MAX_W, .bw = 4.6e12 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!v) usage();
        i++;
        if (!strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) o->device = EM_DEVICE_CPU;
            else if (!strcmp(v, "auto")) o->device = EM_DEVICE_AUTO;
            else if (!strncmp(v, "cuda", 4)) o->device = EM_DEVICE_CUDA, o->cuda_index = v[4] == ':' ? atoi(v + 5) : 0;
            else usage();
        } else if (!strcmp(a, "-p")) o->n_prompt = atoi(v);
        else if (!strcmp(a, "-n")) o->n_gen = atoi(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--ctx-prompt")) o->ctx_prompt = atoi(v);
        else if (!strcmp(a, "--max-width")) o->max_width = atoi(v);
        else if (!strcmp(a, "--bw")) o->bw = atof(v);
        else usage();
    }
    if (!o->model || o->n_prompt < 1 || o->n_gen < 1 || o->reps < 1 || o->reps > MAX_REPS || o->ctx_prompt < 1 ||
        o->max_width < 1 || o->max_width > MAX_W || o->bw <= 0)
        usage();
}

int main(int argc, char **argv) {
    opts o;
    parse(argc, argv, &o);
    em_err err = { 0 };
    const int ctx = o.n_prompt > o.ctx_prompt + o.n_gen + MAX_W ? o.n_prompt : o.ctx_prompt + o.n_gen + MAX_W;
    const em_model_opts mo = { .device = o.device, .cuda_index = o.cuda_index, .n_ctx = ctx + 1 };
    em_target *t;
    double t0 = em_time_now();
    if (em_model_open(&t, o.model, &mo, &err)) die(o.model, &err);
    const double open_s = em_time_now() - t0;
    const em_target_info *info = em_target_get_info(t);
    sizes sz;
    file_sizes(o.model, info, &sz);
    const int V = info->n_vocab;
    int32_t *tok = malloc((size_t)ctx * sizeof *tok), *routes = malloc((size_t)MAX_W * (size_t)(info->n_route + 1) * 4);
    double pp[MAX_REPS], tg[MAX_REPS], tw[MAX_W + 1][MAX_REPS], ux[MAX_W + 1];
    if (!tok || !routes) return 1;
    uint64_t s = 12345;
    /* random tokens for every position the benchmark reads (the prompts, the verify curve's rows) */
    next_tokens(&s, tok, ctx, V);
    for (int r = -1; r < o.reps; r++) { /* one warm-up */
        em_target_reset(t);
        int32_t am;
        t0 = em_time_now();
        if (em_target_prefill(t, tok, o.n_prompt, &(em_rows){ .argmax = &am, .last_only = true }, &err))
            die("prefill", &err);
        if (r >= 0) pp[r] = o.n_prompt / (em_time_now() - t0);
    }
    /* greedy decoding after a prompt of ctx_prompt */
    for (int r = -1; r < o.reps; r++) {
        em_target_reset(t);
        int32_t am = 0;
        if (em_target_prefill(t, tok, o.ctx_prompt, &(em_rows){ .argmax = &am, .last_only = true }, &err))
            die("prompt", &err);
        t0 = em_time_now();
        for (int i = 0; i < o.n_gen; i++) {
            int32_t next = am >= 0 ? am : 0;
            if (em_target_verify(t, &next, 1, &(em_rows){ .argmax = &am }, &err) || em_target_commit(t, 1, &err))
                die("decode", &err);
        }
        if (r >= 0) tg[r] = o.n_gen / (em_time_now() - t0);
    }
    /* the verify curve at position ctx_prompt (verify leaves the state as it was) */
    em_target_reset(t);
    int32_t am[MAX_W];
    if (em_target_prefill(t, tok, o.ctx_prompt, &(em_rows){ .argmax = am, .last_only = true }, &err)) die("prompt", &err);
    for (int n = 1; n <= o.max_width; n++) {
        for (int r = -1; r < o.reps; r++) {
            t0 = em_time_now();
            if (em_target_verify(t, tok + o.ctx_prompt, n, &(em_rows){ .argmax = am }, &err)) die("verify", &err);
            if (r >= 0) tw[n][r] = em_time_now() - t0;
        }
        if (em_target_verify(t, tok + o.ctx_prompt, n, &(em_rows){ .routes = info->n_route ? routes : NULL }, &err))
            die("verify (routes)", &err);
        ux[n] = info->n_route ? union_experts(routes, n, info, sz.k, sz.n_expert) : 0;
    }
    const double pp_m = bench_median(pp, o.reps), tg_m = bench_median(tg, o.reps);
    const double tok_bytes = sz.dense + sz.embd_row + (double)info->n_moe_layers * sz.k * sz.expert;
    const double roof = o.bw / tok_bytes;
    double t1 = bench_median(tw[1], o.reps);
    if (o.json) {
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"open_s\":%.2f,\"prefill_tokens\":%d,\"prefill_tok_s\":%.1f,"
               "\"decode_tok_s\":%.1f,\"decode_ms\":%.4f,\"token_bytes\":%.0f,\"roofline_tok_s\":%.1f,\"verify\":[",
               o.model, info->device, open_s, o.n_prompt, pp_m, tg_m, 1e3 / tg_m, tok_bytes, roof);
        for (int n = 1; n <= o.max_width; n++) {
            const double tn = bench_median(tw[n], o.reps);
            printf("%s{\"n\":%d,\"ms\":%.4f,\"ratio\":%.3f,\"union_experts\":%.0f,\"bytes\":%.0f}", n > 1 ? "," : "", n,
                   tn * 1e3, tn / t1, ux[n], sz.dense + ux[n] * sz.expert);
        }
        printf("]}\n");
    } else {
        printf("bench_target: %s on %s (opened in %.1f s), median of %d\n", o.model, info->device, open_s, o.reps);
        printf("prefill %d tokens: %.1f tok/s\n", o.n_prompt, pp_m);
        printf("decode after %d: %.1f tok/s (%.3f ms/token); a token reads %.3f GB: roofline %.0f tok/s at %.2f TB/s "
               "(%.0f%%)\n",
               o.ctx_prompt, tg_m, 1e3 / tg_m, tok_bytes / 1e9, roof, o.bw / 1e12, 100.0 * tg_m / roof);
        printf("verify curve: n  ms  t(n)/t(1)  union experts (all MoE layers)  GB read\n");
        for (int n = 1; n <= o.max_width; n++) {
            const double tn = bench_median(tw[n], o.reps);
            printf("  %2d  %.3f  %.2f  %5.0f  %.3f\n", n, tn * 1e3, tn / t1, ux[n], (sz.dense + ux[n] * sz.expert) / 1e9);
        }
    }
    free(tok);
    free(routes);
    em_target_close(t);
    return 0;
}
