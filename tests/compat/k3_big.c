/* tests/compat/k3_big.c: a shape-only Kimi-K3 at its real size, for tests/k3_big.sh.
 *
 *   k3_big write PREFIX [--mix ud|seed] [--shards N]
 *        writes PREFIX-00001-of-0000N.gguf ... (default 14 shards) with the real K3 geometry
 *        (llamacpp-formats.md §1, kimi-linear.md §9: 93 layers, MLA at 0-indexed i % 4 == 3
 *        and 92, hidden 7168, 96 heads, q-LoRA 1536, kv-LoRA 512, KDA 96 x 128, dense layer 0
 *        of 33792, 896 experts top-16 at the latent width 3584 with n_ff_exp 3072, two shared
 *        experts, AttnRes blocks of 12, vocabulary 163840), the keys and tensor names of
 *        tests/compat/k3_synth.h, and a type mix; the tensor data is never written: every
 *        byte of it is a hole (em_gguf_writer_skip_data), so the files take a few MB of disk
 *        while their sizes are those of the real model. Prints `shards=`, `tensors=`,
 *        `bytes=` (file sizes), `routed_bytes=` and `other_bytes=` (tensor data).
 *   k3_big open PATH [--storage ssd|auto] [--cache BYTES]
 *        em_model_open with routed experts on storage (expert data is never read: the cache
 *        fills on demand and nothing runs a forward), prints `open_seconds=`, `storage=`,
 *        `resident_bytes=`, `file_bytes=`, `cache_budget=`, `n_experts=` from
 *        em_target_expert_stats, then closes.
 *
 * Mixes (routed experts are ffn_{gate,up,down}_exps; 1-D tensors, conv taps and the router
 * are F32 in both):
 *   ud    UD-IQ1_S-like: gate/up experts IQ1_S and down experts IQ1_M, except the first three
 *         MoE layers (1-3), whose experts are IQ2_XXS; token_embd Q4_K, output Q6_K, other
 *         matrices Q4_K where their rows are a multiple of 256, else Q8_0; shared experts Q6_K;
 *   seed  every routed expert IQ1_S, every other matrix Q8_0: the seed numbers
 *         (~495.3 GiB of routed experts, ~58 GiB of the rest).
 * Exit 0, or 1 with a message. */
#include "k3_synth.h"

#include "model/model.h"

#include <sys/stat.h>
#include <time.h>

static k3_synth_opts real_k3(void) {
    k3_synth_opts o = k3_synth_defaults();
    o.n_embd = 7168, o.n_layer = 93, o.n_head = 96, o.kda_head_dim = 128, o.d_conv = 4;
    o.q_lora = 1536, o.kv_lora = 512, o.nope = 128, o.rope = 64, o.v_head = 128;
    o.n_ff = 33792, o.n_expert = 896, o.n_used = 16, o.n_ff_exp = 3072, o.n_shared = 2;
    o.n_latent = 3584, o.n_vocab = 163840, o.res_block = 12, o.routed_norm = true;
    o.mla_gate = true, o.gate_lb = -5.0f, o.situ_beta = 4.0f, o.situ_lin_beta = 25.0f;
    o.expert_scale = 1.0f, o.expert_norm = true;
    return o;
}

static bool ends_with(const char *s, const char *t) {
    size_t a = strlen(s), b = strlen(t);
    return a >= b && !strcmp(s + a - b, t);
}

static bool is_routed(const char *name) {
    return ends_with(name, "ffn_gate_exps.weight") || ends_with(name, "ffn_up_exps.weight") ||
           ends_with(name, "ffn_down_exps.weight");
}

static int layer_of(const char *name) {
    int l = -1;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

static int type_for(const k3_tensor *t, bool ud) {
    const char *n = t->name;
    if (t->n_dims == 1 || t->ne[0] < 32 || ends_with(n, "ffn_gate_inp.weight")) return EM_TYPE_F32;
    if (is_routed(n)) {
        if (!ud) return EM_TYPE_IQ1_S;
        int l = layer_of(n);
        if (l >= 1 && l <= 3) return EM_TYPE_IQ2_XXS;
        return ends_with(n, "ffn_down_exps.weight") ? EM_TYPE_IQ1_M : EM_TYPE_IQ1_S;
    }
    if (!ud) return EM_TYPE_Q8_0;
    if (!strcmp(n, "token_embd.weight")) return EM_TYPE_Q4_K;
    if (!strcmp(n, "output.weight") || strstr(n, "_shexp.")) return EM_TYPE_Q6_K;
    return t->ne[0] % 256 == 0 ? EM_TYPE_Q4_K : EM_TYPE_Q8_0;
}

static int tensor_bytes(const k3_tensor *t, int type, uint64_t *out, em_err *err) {
    uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3], row;
    int rc = em_type_row_bytes(type, (uint64_t)t->ne[0], &row, err);
    if (!rc && em_mul_overflow(row, rows, out)) rc = em_err_set(err, EM_EOVERFLOW, "k3_big: tensor size");
    return rc;
}

static int write_big(const char *prefix, bool ud, int want_shards) {
    k3_synth_opts o = real_k3();
    k3_list l = { 0 };
    em_err err = { 0 };
    if (k3_list_tensors(&o, &l)) {
        fprintf(stderr, "k3_big: out of memory\n");
        return 1;
    }
    /* a budget that gives want_shards shards: the greedy packing leaves less than the largest
     * tensor unused per shard */
    uint64_t total = 0, largest = 0, routed = 0, other = 0;
    int *types = calloc((size_t)l.n, sizeof *types);
    int rc = types ? 0 : em_err_set(&err, EM_ENOMEM, "k3_big: out of memory");
    for (int i = 0; !rc && i < l.n; i++) {
        uint64_t b = 0;
        types[i] = type_for(&l.t[i], ud);
        rc = tensor_bytes(&l.t[i], types[i], &b, &err);
        total += em_align_up(b, 32);
        if (b > largest) largest = b;
        if (is_routed(l.t[i].name)) routed += b;
        else other += b;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.gguf", prefix);
    em_gguf_writer *w = NULL;
    em_gguf_write_opts wo = { .max_shard_bytes = total / (uint64_t)want_shards + largest + (64u << 20) };
    if (!rc) rc = em_gguf_writer_create(&w, path, want_shards > 1 ? &wo : NULL, &err);
    if (!rc) rc = k3_write_keys(w, &o, &err);
    for (int i = 0; !rc && i < l.n; i++) rc = em_gguf_writer_add_tensor(w, l.t[i].name, types[i], l.t[i].n_dims, l.t[i].ne, &err);
    for (int i = 0; !rc && i < l.n; i++) {
        uint64_t b = 0;
        rc = tensor_bytes(&l.t[i], types[i], &b, &err);
        if (!rc) rc = em_gguf_writer_skip_data(w, b, &err);
    }
    if (!rc) rc = em_gguf_writer_finish(w, &err);
    uint64_t bytes = 0;
    int ns = rc ? 0 : em_gguf_writer_n_shards(w);
    for (int i = 0; i < ns; i++) {
        struct stat sb;
        if (stat(em_gguf_writer_shard_path(w, i), &sb) == 0) bytes += (uint64_t)sb.st_size;
    }
    if (!rc)
        printf("shards=%d\ntensors=%d\nbytes=%llu\nrouted_bytes=%llu\nother_bytes=%llu\nfirst=%s\n", ns, l.n,
               (unsigned long long)bytes, (unsigned long long)routed, (unsigned long long)other,
               em_gguf_writer_shard_path(w, 0));
    else fprintf(stderr, "k3_big: %s\n", err.msg);
    em_gguf_writer_free(w);
    free(types);
    free(l.t);
    return rc ? 1 : 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int open_big(const char *path, int storage, uint64_t cache) {
    em_err err = { 0 };
    em_target *t = NULL;
    em_model_opts mo = { .n_threads = 1, .n_ctx = 256, .moe_storage = storage, .expert_cache_bytes = cache };
    double t0 = now();
    if (em_model_open(&t, path, &mo, &err)) {
        fprintf(stderr, "k3_big: %s\n", err.msg);
        return 1;
    }
    double dt = now() - t0;
    em_target_expert_counts c;
    int rc = em_target_expert_stats(t, -1, &c, &err);
    if (!rc)
        printf("open_seconds=%.3f\nstorage=%s\nresident_bytes=%llu\nfile_bytes=%llu\ncache_budget=%llu\n"
               "n_experts=%llu\nn_layer=%d\n",
               dt, c.storage == EM_MOE_SSD ? "ssd" : "resident", (unsigned long long)c.resident_bytes,
               (unsigned long long)c.file_bytes, (unsigned long long)c.cache_budget,
               (unsigned long long)c.n_experts, em_target_get_info(t)->n_layer);
    else fprintf(stderr, "k3_big: %s\n", err.msg);
    em_target_close(t);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "write")) {
        bool ud = true;
        int shards = 14;
        for (int i = 3; i + 1 < argc; i += 2) {
            if (!strcmp(argv[i], "--mix")) ud = strcmp(argv[i + 1], "seed") != 0;
            else if (!strcmp(argv[i], "--shards")) shards = atoi(argv[i + 1]);
        }
        if (shards < 1 || shards > 99) {
            fprintf(stderr, "k3_big: --shards %d\n", shards);
            return 2;
        }
        return write_big(argv[2], ud, shards);
    }
    if (argc >= 3 && !strcmp(argv[1], "open")) {
        int storage = EM_MOE_SSD;
        uint64_t cache = 1ull << 30;
        for (int i = 3; i + 1 < argc; i += 2) {
            if (!strcmp(argv[i], "--storage")) storage = !strcmp(argv[i + 1], "auto") ? EM_MOE_AUTO : EM_MOE_SSD;
            else if (!strcmp(argv[i], "--cache")) cache = strtoull(argv[i + 1], NULL, 10);
        }
        return open_big(argv[2], storage, cache);
    }
    fprintf(stderr, "usage: k3_big write PREFIX [--mix ud|seed] [--shards N] | k3_big open PATH [--storage ssd|auto] [--cache BYTES]\n");
    return 2;
}
