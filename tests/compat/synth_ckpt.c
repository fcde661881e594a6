/* tests/compat/synth_ckpt.c: writes a synthetic Kimi-Linear checkpoint in the Moonshot layout
 * (config.json + BF16 safetensors, optionally sharded with model.safetensors.index.json) of
 * any size, streaming: the data is generated 1 MiB at a time, so a checkpoint of many GB
 * takes a few MiB of memory to write. Used by the converter's memory benchmark
 * (bench/convert_rss.sh) and its interruption test (tests/test_convert.c).
 *
 *   synth_ckpt OUT_DIR [--hidden H] [--layers L] [--experts E] [--ff-exp F] [--ff D]
 *                      [--vocab V] [--heads N] [--shards S] [--seed X] [--mla-every M]
 *                      [--top-k K]
 *
 * Every M-th layer is MLA, the rest KDA (0-indexed layers l with l % M == M - 1, and the last
 * layer, are MLA; default M 2: KDA and MLA alternate); layer 0 is dense, the rest MoE with one
 * shared expert and K experts per token (default min(E, 8)). Values are pseudo-random (xorshift64*), scaled like
 * trained weights (|w| ~ 0.02, norms ~ 1, A_log ~ U(0, 2)). Prints the total tensor bytes.
 * Independent of the converter: the tensor list is written out here from the reference
 * notes (llamacpp-formats.md §1.3), not taken from convert/. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"

typedef struct tensor {
    char name[128];
    int n_dims;
    uint64_t shape[3];
    int kind; /* 0 weight, 1 norm, 2 A_log, 3 small bias */
    int shard;
    uint64_t begin, end; /* within the shard's data */
} tensor;

typedef struct synth {
    int64_t hidden, layers, experts, ff_exp, ff, vocab, heads, shards, mla_every, top_k;
    int64_t kda_hd, nope, rope, v, kv_lora;
    uint64_t seed;
    tensor *t;
    int n, cap;
} synth;

static void die(const char *msg) {
    fprintf(stderr, "synth_ckpt: %s\n", msg);
    exit(2);
}

static void add(synth *s, int kind, int n_dims, uint64_t a, uint64_t b, uint64_t c,
                const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void add(synth *s, int kind, int n_dims, uint64_t a, uint64_t b, uint64_t c,
                const char *fmt, ...) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->t = realloc(s->t, (size_t)s->cap * sizeof *s->t);
        if (!s->t) die("out of memory");
    }
    tensor *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->kind = kind;
    t->n_dims = n_dims;
    t->shape[0] = a, t->shape[1] = b, t->shape[2] = c;
}

static bool is_mla(const synth *s, int64_t l) {
    return l % s->mla_every == s->mla_every - 1 || l == s->layers - 1;
}

static void list_tensors(synth *s) {
    uint64_t H = (uint64_t)s->hidden, inner = (uint64_t)(s->heads * s->kda_hd);
    add(s, 0, 2, (uint64_t)s->vocab, H, 0, "model.embed_tokens.weight");
    for (int64_t l = 0; l < s->layers; l++) {
        const char *p = "model.layers";
        add(s, 1, 1, H, 0, 0, "%s.%lld.input_layernorm.weight", p, (long long)l);
        add(s, 1, 1, H, 0, 0, "%s.%lld.post_attention_layernorm.weight", p, (long long)l);
        if (!is_mla(s, l)) {
            const char *qkv[] = { "q", "k", "v" };
            for (int i = 0; i < 3; i++) {
                add(s, 0, 2, inner, H, 0, "%s.%lld.self_attn.%s_proj.weight", p, (long long)l, qkv[i]);
                add(s, 0, 3, inner, 1, 4, "%s.%lld.self_attn.%s_conv1d.weight", p, (long long)l, qkv[i]);
            }
            add(s, 2, 3, 1, 1, (uint64_t)s->heads, "%s.%lld.self_attn.A_log", p, (long long)l);
            add(s, 3, 1, inner, 0, 0, "%s.%lld.self_attn.dt_bias", p, (long long)l);
            add(s, 0, 2, (uint64_t)s->kda_hd, H, 0, "%s.%lld.self_attn.f_a_proj.weight", p, (long long)l);
            add(s, 0, 2, inner, (uint64_t)s->kda_hd, 0, "%s.%lld.self_attn.f_b_proj.weight", p, (long long)l);
            add(s, 0, 2, (uint64_t)s->heads, H, 0, "%s.%lld.self_attn.b_proj.weight", p, (long long)l);
            add(s, 0, 2, (uint64_t)s->kda_hd, H, 0, "%s.%lld.self_attn.g_a_proj.weight", p, (long long)l);
            add(s, 0, 2, inner, (uint64_t)s->kda_hd, 0, "%s.%lld.self_attn.g_b_proj.weight", p, (long long)l);
            add(s, 1, 1, (uint64_t)s->kda_hd, 0, 0, "%s.%lld.self_attn.o_norm.weight", p, (long long)l);
            add(s, 0, 2, H, inner, 0, "%s.%lld.self_attn.o_proj.weight", p, (long long)l);
        } else {
            uint64_t nh = (uint64_t)s->heads;
            add(s, 0, 2, nh * (uint64_t)(s->nope + s->rope), H, 0, "%s.%lld.self_attn.q_proj.weight", p, (long long)l);
            add(s, 0, 2, (uint64_t)(s->kv_lora + s->rope), H, 0,
                "%s.%lld.self_attn.kv_a_proj_with_mqa.weight", p, (long long)l);
            add(s, 1, 1, (uint64_t)s->kv_lora, 0, 0, "%s.%lld.self_attn.kv_a_layernorm.weight", p, (long long)l);
            add(s, 0, 2, nh * (uint64_t)(s->nope + s->v), (uint64_t)s->kv_lora, 0,
                "%s.%lld.self_attn.kv_b_proj.weight", p, (long long)l);
            add(s, 0, 2, H, nh * (uint64_t)s->v, 0, "%s.%lld.self_attn.o_proj.weight", p, (long long)l);
        }
        if (l == 0) {
            add(s, 0, 2, (uint64_t)s->ff, H, 0, "%s.0.mlp.gate_proj.weight", p);
            add(s, 0, 2, (uint64_t)s->ff, H, 0, "%s.0.mlp.up_proj.weight", p);
            add(s, 0, 2, H, (uint64_t)s->ff, 0, "%s.0.mlp.down_proj.weight", p);
            continue;
        }
        uint64_t F = (uint64_t)s->ff_exp;
        add(s, 0, 2, (uint64_t)s->experts, H, 0, "%s.%lld.block_sparse_moe.gate.weight", p, (long long)l);
        add(s, 3, 1, (uint64_t)s->experts, 0, 0, "%s.%lld.block_sparse_moe.gate.e_score_correction_bias",
            p, (long long)l);
        for (int64_t e = 0; e < s->experts; e++) {
            add(s, 0, 2, F, H, 0, "%s.%lld.block_sparse_moe.experts.%lld.w1.weight", p, (long long)l, (long long)e);
            add(s, 0, 2, H, F, 0, "%s.%lld.block_sparse_moe.experts.%lld.w2.weight", p, (long long)l, (long long)e);
            add(s, 0, 2, F, H, 0, "%s.%lld.block_sparse_moe.experts.%lld.w3.weight", p, (long long)l, (long long)e);
        }
        add(s, 0, 2, F, H, 0, "%s.%lld.block_sparse_moe.shared_experts.gate_proj.weight", p, (long long)l);
        add(s, 0, 2, F, H, 0, "%s.%lld.block_sparse_moe.shared_experts.up_proj.weight", p, (long long)l);
        add(s, 0, 2, H, F, 0, "%s.%lld.block_sparse_moe.shared_experts.down_proj.weight", p, (long long)l);
    }
    add(s, 1, 1, H, 0, 0, "model.norm.weight");
    add(s, 0, 2, (uint64_t)s->vocab, H, 0, "lm_head.weight");
}

static uint64_t n_elems(const tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

/* Assigns shards by size and data offsets; returns total bytes. */
static uint64_t layout(synth *s) {
    uint64_t total = 0;
    for (int i = 0; i < s->n; i++) total += 2 * n_elems(&s->t[i]);
    uint64_t per = total / (uint64_t)s->shards + 1, acc = 0, pos = 0;
    int shard = 0;
    for (int i = 0; i < s->n; i++) {
        uint64_t b = 2 * n_elems(&s->t[i]);
        if (acc >= per * (uint64_t)(shard + 1) && shard + 1 < s->shards) shard++, pos = 0;
        s->t[i].shard = shard;
        s->t[i].begin = pos;
        s->t[i].end = pos + b;
        pos += b;
        acc += b;
    }
    return total;
}

static void shard_name(const synth *s, int k, char *buf, size_t cap) {
    if (s->shards == 1) snprintf(buf, cap, "model.safetensors");
    else snprintf(buf, cap, "model-%05d-of-%05lld.safetensors", k + 1, (long long)s->shards);
}

static char *header_json(const synth *s, int k) {
    size_t cap = 1 << 16, len = 0;
    char *h = malloc(cap);
    if (!h) die("out of memory");
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < s->n; i++) {
        const tensor *t = &s->t[i];
        if (t->shard != k) continue;
        if (cap - len < 512) {
            cap *= 2;
            h = realloc(h, cap);
            if (!h) die("out of memory");
        }
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[", t->name);
        for (int d = 0; d < t->n_dims; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)t->begin, (unsigned long long)t->end);
    }
    /* pad with spaces to a multiple of 8, as the reference writer does */
    while ((len + 1) % 8) {
        if (len + 2 >= cap) die("header");
        h[len++] = ' ';
    }
    h[len++] = '}';
    h[len] = 0;
    return h;
}

static uint64_t next_rand(uint64_t *x) {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

static uint16_t value(int kind, uint64_t r) {
    float u = (float)(r >> 40) / (float)(1ull << 24); /* [0, 1) */
    float x = kind == 0 ? (u - 0.5f) * 0.07f : kind == 1 ? 0.9f + 0.2f * u : kind == 2 ? 2.0f * u
                                                                                   : (u - 0.5f);
    return em_fp32_to_bf16(x);
}

static void write_shard(const synth *s, int k, const char *dir) {
    char name[64], path[4096];
    shard_name(s, k, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) die(strerror(errno));
    char *h = header_json(s, k);
    uint64_t hl = strlen(h);
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, hl, f);
    free(h);
    static uint16_t buf[1 << 19];
    uint64_t x = s->seed ? s->seed : 88172645463325252ull;
    for (int i = 0; i < s->n; i++) {
        const tensor *t = &s->t[i];
        if (t->shard != k) continue;
        for (uint64_t left = n_elems(t); left;) {
            uint64_t n = left < (1u << 19) ? left : (1u << 19);
            for (uint64_t j = 0; j < n; j++) buf[j] = value(t->kind, next_rand(&x));
            if (fwrite(buf, 2, n, f) != n) die("write failed");
            left -= n;
        }
    }
    if (fclose(f)) die("close failed");
}

static void write_index(const synth *s, const char *dir, uint64_t total) {
    char path[4096], name[64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) die(strerror(errno));
    fprintf(f, "{\"metadata\":{\"total_size\":%llu},\"weight_map\":{", (unsigned long long)total);
    for (int i = 0; i < s->n; i++) {
        shard_name(s, s->t[i].shard, name, sizeof name);
        fprintf(f, "%s\"%s\":\"%s\"", i ? "," : "", s->t[i].name, name);
    }
    fprintf(f, "}}\n");
    fclose(f);
}

static void write_config(const synth *s, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) die(strerror(errno));
    fprintf(f, "{\n  \"architectures\": [\"KimiLinearForCausalLM\"],\n  \"model_type\": \"kimi_linear\",\n"
               "  \"dtype\": \"bfloat16\",\n  \"vocab_size\": %lld,\n  \"hidden_size\": %lld,\n"
               "  \"intermediate_size\": %lld,\n  \"num_hidden_layers\": %lld,\n"
               "  \"num_attention_heads\": %lld,\n  \"num_key_value_heads\": %lld,\n",
            (long long)s->vocab, (long long)s->hidden, (long long)s->ff, (long long)s->layers,
            (long long)s->heads, (long long)s->heads);
    fprintf(f, "  \"kv_lora_rank\": %lld,\n  \"q_lora_rank\": null,\n  \"qk_nope_head_dim\": %lld,\n"
               "  \"qk_rope_head_dim\": %lld,\n  \"v_head_dim\": %lld,\n  \"mla_use_nope\": true,\n",
            (long long)s->kv_lora, (long long)s->nope, (long long)s->rope, (long long)s->v);
    fprintf(f, "  \"linear_attn_config\": {\"full_attn_layers\": [");
    for (int64_t l = 0, first = 1; l < s->layers; l++)
        if (is_mla(s, l)) fprintf(f, "%s%lld", first ? "" : ", ", (long long)l + 1), first = 0;
    fprintf(f, "], \"kda_layers\": [");
    for (int64_t l = 0, first = 1; l < s->layers; l++)
        if (!is_mla(s, l)) fprintf(f, "%s%lld", first ? "" : ", ", (long long)l + 1), first = 0;
    fprintf(f, "], \"head_dim\": %lld, \"num_heads\": %lld, \"short_conv_kernel_size\": 4},\n",
            (long long)s->kda_hd, (long long)s->heads);
    fprintf(f, "  \"num_experts\": %lld,\n  \"num_experts_per_token\": %d,\n"
               "  \"moe_intermediate_size\": %lld,\n  \"num_shared_experts\": 1,\n"
               "  \"first_k_dense_replace\": 1,\n  \"moe_layer_freq\": 1,\n"
               "  \"moe_router_activation_func\": \"sigmoid\",\n  \"moe_renormalize\": true,\n"
               "  \"routed_scaling_factor\": 2.446,\n  \"num_expert_group\": 1,\n  \"topk_group\": 1,\n"
               "  \"use_grouped_topk\": false,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n"
               "  \"rope_scaling\": null,\n  \"model_max_length\": 1048576,\n"
               "  \"tie_word_embeddings\": false,\n  \"hidden_act\": \"silu\",\n"
               "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 0,\n"
               "  \"num_nextn_predict_layers\": 0\n}\n",
            (long long)s->experts, (int)s->top_k, (long long)s->ff_exp);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: synth_ckpt OUT_DIR [--hidden H] [--layers L] [--experts E] [--ff-exp F] "
                      "[--ff D] [--vocab V] [--heads N] [--shards S] [--seed X] [--mla-every M] "
                      "[--top-k K]");
    synth s = { .hidden = 1024, .layers = 4, .experts = 16, .ff_exp = 512, .ff = 2048, .vocab = 4096,
                .heads = 8, .shards = 1, .kda_hd = 128, .nope = 128, .rope = 64, .v = 128, .kv_lora = 512,
                .mla_every = 2, .top_k = 0 };
    for (int i = 2; i + 1 < argc; i += 2) {
        long long v = atoll(argv[i + 1]);
        if (v <= 0) die("values must be positive");
        if (!strcmp(argv[i], "--hidden")) s.hidden = v;
        else if (!strcmp(argv[i], "--layers")) s.layers = v;
        else if (!strcmp(argv[i], "--experts")) s.experts = v;
        else if (!strcmp(argv[i], "--ff-exp")) s.ff_exp = v;
        else if (!strcmp(argv[i], "--ff")) s.ff = v;
        else if (!strcmp(argv[i], "--vocab")) s.vocab = v;
        else if (!strcmp(argv[i], "--heads")) s.heads = v;
        else if (!strcmp(argv[i], "--shards")) s.shards = v;
        else if (!strcmp(argv[i], "--seed")) s.seed = (uint64_t)v;
        else if (!strcmp(argv[i], "--mla-every")) s.mla_every = v;
        else if (!strcmp(argv[i], "--top-k")) s.top_k = v;
        else die("unknown flag");
    }
    if (s.layers < 2) die("--layers must be at least 2");
    if (s.top_k == 0) s.top_k = s.experts < 8 ? s.experts : 8;
    if (s.top_k > s.experts) die("--top-k must not exceed --experts");
    mkdir(argv[1], 0777);
    list_tensors(&s);
    uint64_t total = layout(&s);
    write_config(&s, argv[1]);
    for (int k = 0; k < s.shards; k++) write_shard(&s, k, argv[1]);
    if (s.shards > 1) write_index(&s, argv[1], total);
    printf("%llu\n", (unsigned long long)total);
    free(s.t);
    return 0;
}
