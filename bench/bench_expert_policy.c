/* bench_expert_policy: LRU vs frequency-aware (LFU with aging) expert-cache policies on
 * routing traces recorded from a real forward pass.
 *
 *   bench_expert_policy record -m MODEL.gguf -o TRACE [-p P] [-n N] [--threads T]
 *       prefills P pseudo-random tokens, then decodes N tokens greedily (verify 1 + commit 1),
 *       and writes every decoded token's routes (em_rows.routes: n_moe_layers x k ids) to
 *       TRACE: a header of 4 int32 (n_tokens, n_moe_layers, k, n_expert) then the ids.
 *   bench_expert_policy replay TRACE [--width W] [--dir D]
 *       writes a small GGUF with the trace's layer x expert shape (tiny experts: every slot
 *       the same size, so a budget is a slot count), and replays the trace through
 *       em_expert_cache_run, W tokens per forward step (the route union of W rows: plain
 *       decoding is 1), for LRU and LFU with half-lives of 2, 4, 8 (the default) and 16 x
 *       the slots, at budgets of 10%, 25% and 50% of all experts. Prints hit rates.
 * A benchmark, not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts/experts.h"
#include "model/model.h"
#include "quant/quant.h"

static int fail(const char *what, const em_err *err) {
    fprintf(stderr, "bench_expert_policy: %s: %s\n", what, err ? err->msg : "");
    return 1;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static int record(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    int n_prompt = 16, n_gen = 200, threads = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) model = argv[i + 1];
        else if (!strcmp(argv[i], "-o")) out = argv[i + 1];
        else if (!strcmp(argv[i], "-p")) n_prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) n_gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (!model || !out || n_prompt < 1 || n_gen < 1) return fail("record needs -m MODEL -o TRACE", NULL);
    em_err err = { 0 };
    em_model_opts o = { .n_threads = threads, .n_ctx = n_prompt + n_gen + 1, .moe_storage = EM_MOE_RESIDENT };
    em_target *t;
    if (em_model_open(&t, model, &o, &err)) return fail(model, &err);
    const em_target_info *info = em_target_get_info(t);
    if (info->n_moe_layers == 0) return fail("the model has no routed experts", NULL);
    const int V = info->n_vocab, R = info->n_route;
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *tok = malloc((size_t)n_prompt * sizeof(int32_t));
    int32_t *routes = malloc((size_t)n_gen * (size_t)R * sizeof(int32_t));
    if (!logits || !tok || !routes) return fail("out of memory", NULL);
    uint64_t s = 12345;
    for (int i = 0; i < n_prompt; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        tok[i] = (int32_t)((s * 2685821657736338717ull >> 33) % (uint64_t)V);
    }
    em_rows last = { .logits = logits, .last_only = true };
    if (em_target_prefill(t, tok, n_prompt, &last, &err)) return fail("prefill", &err);
    for (int i = 0; i < n_gen; i++) {
        int32_t next = argmax(logits, V);
        em_rows one = { .logits = logits, .routes = routes + (size_t)i * (size_t)R };
        if (em_target_verify(t, &next, 1, &one, &err) || em_target_commit(t, 1, &err)) return fail("decode", &err);
    }
    /* n_expert is not in the info: the largest id + 1 is a lower bound; the model's own
     * count comes from its counters (routed experts / MoE layers) */
    em_target_expert_counts c;
    em_target_expert_stats(t, -1, &c, NULL);
    int32_t head[4] = { n_gen, info->n_moe_layers, R / info->n_moe_layers,
                        (int32_t)(c.n_experts / (uint64_t)info->n_moe_layers) };
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(head, sizeof head, 1, f) != 1 ||
        fwrite(routes, sizeof(int32_t) * (size_t)R, (size_t)n_gen, f) != (size_t)n_gen || fclose(f))
        return fail(out, NULL);
    printf("recorded %d tokens x %d MoE layers x top-%d of %d experts into %s\n", head[0], head[1], head[2], head[3],
           out);
    em_target_close(t);
    free(logits);
    free(tok);
    free(routes);
    return 0;
}

/* A GGUF with L layers of X tiny f32 experts (gate/up [32, 32, X], down [32, 32, X]). */
static int write_model(const char *path, int L, int X, em_err *err) {
    em_gguf_writer *w;
    int rc = em_gguf_writer_create(&w, path, NULL, err);
    if (rc) return rc;
    static const char *const parts[3] = { "gate", "up", "down" };
    char name[64];
    for (int l = 0; l < L && !rc; l++)
        for (int p = 0; p < 3 && !rc; p++) {
            int64_t ne[3] = { 32, 32, X };
            snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, parts[p]);
            rc = em_gguf_writer_add_tensor(w, name, EM_TYPE_F32, 3, ne, err);
        }
    uint64_t total = (uint64_t)L * 3 * (uint64_t)X * 32 * 32 * 4;
    static uint8_t zero[1 << 16];
    for (uint64_t done = 0; !rc && done < total; done += sizeof zero)
        rc = em_gguf_writer_write_data(w, zero, total - done < sizeof zero ? total - done : sizeof zero, err);
    if (!rc) rc = em_gguf_writer_finish(w, err);
    em_gguf_writer_free(w);
    return rc;
}

static int nop(void *ctx, int i, const em_expert_data *d, em_err *err) {
    (void)ctx, (void)i, (void)d, (void)err;
    return 0;
}

/* Hit rate of one policy and budget over the trace, W tokens per step. */
static double replay_one(const em_expert_store *s, const int32_t *ids, const int32_t *head, int W, int policy,
                         double halflife_x, int slots, uint64_t slot) {
    em_err err = { 0 };
    em_expert_cache_opts o = { .budget = (uint64_t)slots * slot, .policy = policy, .buffered = true,
                               .lfu_halflife = halflife_x > 0 ? halflife_x * slots : 0 };
    em_expert_cache *c;
    if (em_expert_cache_create(&c, s, &o, &err)) return fail("cache", &err), -1.0;
    const int T = head[0], L = head[1], K = head[2], X = head[3];
    int *u = malloc((size_t)X * sizeof *u);
    for (int t0 = 0; t0 < T; t0 += W) {
        for (int l = 0; l < L; l++) {
            int n = 0;
            bool seen[4096] = { 0 };
            for (int t = t0; t < t0 + W && t < T; t++)
                for (int k = 0; k < K; k++) {
                    int e = ids[((size_t)t * (size_t)L + (size_t)l) * (size_t)K + (size_t)k];
                    if (!seen[e]) u[n++] = e;
                    seen[e] = true;
                }
            if (em_expert_cache_run(c, l, u, n, nop, NULL, &err)) return fail("run", &err), -1.0;
        }
    }
    em_expert_stats st;
    em_expert_cache_stats(c, -1, &st);
    em_expert_cache_free(c);
    free(u);
    return (double)st.hits / (double)(st.hits + st.misses);
}

static int replay(int argc, char **argv) {
    const char *trace = argv[2], *dir = "/tmp";
    int W = 1;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--width")) W = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
    }
    FILE *f = fopen(trace, "rb");
    int32_t head[4];
    if (!f || fread(head, sizeof head, 1, f) != 1) return fail(trace, NULL);
    if (head[0] < 1 || head[1] < 1 || head[2] < 1 || head[3] < head[2] || head[3] > 4096 || W < 1)
        return fail("bad trace header", NULL);
    size_t n = (size_t)head[0] * (size_t)head[1] * (size_t)head[2];
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids || fread(ids, sizeof *ids, n, f) != n) return fail("short trace", NULL);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= head[3]) return fail("expert id out of range in trace", NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/policy_replay_%d_%d.gguf", dir, head[1], head[3]);
    em_err err = { 0 };
    em_gguf *g;
    em_expert_store *s;
    if (write_model(path, head[1], head[3], &err) || em_gguf_open(&g, path, &err) || em_expert_store_open(&s, g, &err))
        return fail(path, &err);
    em_expert_cache *probe;
    em_expert_cache_opts po = { .budget = 1ull << 30, .buffered = true };
    if (em_expert_cache_create(&probe, s, &po, &err)) return fail("cache", &err);
    uint64_t slot = em_expert_cache_slot_bytes(probe, 0);
    em_expert_cache_free(probe);
    const int all = head[1] * head[3];
    printf("trace %s: %d tokens, %d MoE layers, top-%d of %d; %d token(s) per step\n", trace, head[0], head[1], head[2],
           head[3], W);
    const double fracs[3] = { 0.10, 0.25, 0.50 };
    for (int b = 0; b < 3; b++) {
        int slots = (int)(fracs[b] * all + 0.5);
        if (slots < 1) slots = 1;
        double lru = replay_one(s, ids, head, W, EM_EXPERT_LRU, 0, slots, slot);
        printf("budget %2.0f%% (%d slots): LRU %.3f  LFU halflife 2/4/8(default)/16 x slots:", 100 * fracs[b], slots, lru);
        const double hl[4] = { 2, 4, 0, 16 };
        for (int h = 0; h < 4; h++) printf(" %.3f", replay_one(s, ids, head, W, EM_EXPERT_LFU, hl[h], slots, slot));
        printf("\n");
    }
    em_expert_store_close(s);
    em_gguf_close(g);
    remove(path);
    free(ids);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "record")) return record(argc, argv);
    if (argc >= 3 && !strcmp(argv[1], "replay")) return replay(argc, argv);
    fprintf(stderr, "usage: bench_expert_policy record -m MODEL.gguf -o TRACE [-p P] [-n N] [--threads T]\n"
                    "       bench_expert_policy replay TRACE [--width W] [--dir D]\n");
    return 2;
}
