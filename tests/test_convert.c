/* Tests for convert/ (`ember convert`): every fixture in tests/fixtures/ converts; the report's
 * numbers are checked against values computed here from the safetensors files themselves
 * (parameter count, tensor count, bytes, sha256, per-type counts, the error of every lossy
 * tensor recomputed over all its rows); the GGUF read back has the keys (with the GGUF types
 * llama.cpp's loader wants) and shapes of llamacpp-formats.md §1-§2, and its F32 data equals
 * the source values under the documented transforms, checked element by element with an
 * index mapping written out here (ssm_a = -exp(A_log), the kv_b split and transposition,
 * stacked experts); Q8_0 tensors are exactly the Q8_0 encoding of those values. Corrupt
 * inputs (made here from the fixtures) fail with a message naming the problem and leave no
 * file; so do a cancelled conversion and a SIGINT to the CLI. */
#include "testutil.h"

#include "convert/convert.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "quant/quant.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FIX(name) em_test_src("tests/fixtures/" name)

/* ---- helpers ---------------------------------------------------------------------------- */

static const char *mkdir_test(const char *name) {
    const char *p = em_test_path(name);
    if (mkdir(p, 0777) != 0 && errno != EEXIST) fail_msg("mkdir %s: %s", p, strerror(errno));
    return p;
}

static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) fail_msg("opendir %s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static uint64_t file_bytes(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) fail_msg("stat %s", path);
    return (uint64_t)sb.st_size;
}

static void convert_ok(const char *src, const char *out, int type, const char *tok,
                       em_convert_report *rep) {
    em_convert_opts o = { .src_dir = src, .out_path = out, .type = type, .tokenizer_dir = tok,
                          .n_threads = 2 };
    em_err err = { 0 };
    if (em_convert(&o, rep, &err)) fail_msg("convert %s: %s", src, err.msg);
}

/* Sum of element counts over a checkpoint's tensors: the parameter count, independently. */
static uint64_t source_params(const char *dir, int64_t *n_tensors) {
    em_safetensors *st;
    em_err err = { 0 };
    if (em_safetensors_open(&st, dir, &err)) fail_msg("%s", err.msg);
    uint64_t n = 0;
    for (size_t i = 0; i < em_safetensors_count(st); i++) n += em_safetensors_at(st, i)->n_elements;
    *n_tensors = (int64_t)em_safetensors_count(st);
    em_safetensors_close(st);
    return n;
}

static float *source_f32(const em_safetensors *st, const char *name, uint64_t *n) {
    const em_safetensors_tensor *t;
    em_err err = { 0 };
    if (em_safetensors_get(st, name, &t, &err)) fail_msg("%s", err.msg);
    float *v = malloc((size_t)t->n_elements * sizeof *v);
    assert_non_null(v);
    if (em_safetensors_to_f32(t, v, t->n_elements, &err)) fail_msg("%s", err.msg);
    *n = t->n_elements;
    return v;
}

static const em_gguf_tensor *gguf_tensor(const em_gguf *g, const char *name) {
    const em_gguf_tensor *t = em_gguf_find_tensor(g, name);
    if (!t) fail_msg("GGUF tensor '%s' is missing", name);
    return t;
}

static void expect_ne(const em_gguf_tensor *t, int n_dims, int64_t a, int64_t b, int64_t c,
                      int64_t d) {
    int64_t want[4] = { a, b, c, d };
    if (t->n_dims != n_dims) fail_msg("%s: %d dims, want %d", t->name, t->n_dims, n_dims);
    for (int i = 0; i < 4; i++)
        if (t->ne[i] != want[i])
            fail_msg("%s: ne[%d] = %lld, want %lld", t->name, i, (long long)t->ne[i],
                     (long long)want[i]);
}

static uint32_t key_u32(const em_gguf *g, const char *key) {
    uint32_t v;
    em_err err = { 0 };
    if (em_gguf_get_u32(g, key, &v, &err)) fail_msg("%s", err.msg);
    return v;
}
static float key_f32(const em_gguf *g, const char *key) {
    float v;
    em_err err = { 0 };
    if (em_gguf_get_f32(g, key, &v, &err)) fail_msg("%s", err.msg);
    return v;
}
static bool key_bool(const em_gguf *g, const char *key) {
    bool v;
    em_err err = { 0 };
    if (em_gguf_get_bool(g, key, &v, &err)) fail_msg("%s", err.msg);
    return v;
}
static void key_str(const em_gguf *g, const char *key, const char *want) {
    char buf[256];
    em_err err = { 0 };
    if (em_gguf_get_cstr(g, key, buf, sizeof buf, &err)) fail_msg("%s", err.msg);
    assert_string_equal(buf, want);
}
static void key_i32_arr(const em_gguf *g, const char *key, const int32_t *want, int n) {
    const em_gguf_arr *a;
    em_err err = { 0 };
    if (em_gguf_get_arr(g, key, &a, &err)) fail_msg("%s", err.msg);
    assert_int_equal(em_gguf_arr_type(a), EM_GGUF_I32);
    assert_int_equal(em_gguf_arr_count(a), n);
    for (int i = 0; i < n; i++) {
        int64_t v;
        if (em_gguf_arr_get_int(a, (uint64_t)i, &v, &err)) fail_msg("%s", err.msg);
        assert_int_equal(v, want[i]);
    }
}

static em_gguf *open_gguf(const char *path) {
    em_gguf *g;
    em_err err = { 0 };
    if (em_gguf_open(&g, path, &err)) fail_msg("%s", err.msg);
    return g;
}

/* Checks the report's bookkeeping against the files themselves. */
static void check_report_files(const em_convert_report *r, const char *src_dir,
                               const char *src_file) {
    int64_t n_src;
    assert_int_equal(r->n_params, source_params(src_dir, &n_src));
    assert_int_equal(r->n_src_tensors, n_src);
    assert_int_equal(r->n_src_mapped + r->n_src_dropped, n_src);
    assert_int_equal(r->src_bytes, file_bytes(src_file));
    uint64_t out = 0;
    for (int i = 0; i < r->n_shards; i++) {
        char hex[65];
        em_err err = { 0 };
        assert_int_equal(r->shards[i].bytes, file_bytes(r->shards[i].path));
        if (em_sha256_file(r->shards[i].path, hex, &err)) fail_msg("%s", err.msg);
        assert_string_equal(r->shards[i].sha256, hex);
        out += r->shards[i].bytes;
    }
    assert_int_equal(r->out_bytes, out);
    assert_true(fabs(r->ratio - (double)out / (double)r->src_bytes) < 1e-12);
    /* per-type counts equal what the file holds */
    em_gguf *g = open_gguf(r->shards[0].path);
    int64_t counts[EM_TYPE_COUNT] = { 0 }, total = 0;
    uint64_t params = 0;
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        counts[t->type]++;
        params += t->n_elements;
        total++;
    }
    assert_int_equal(total, r->n_out_tensors);
    assert_int_equal(params, r->n_params);
    for (int t = 0; t < EM_TYPE_COUNT; t++) assert_int_equal(counts[t], r->type_counts[t]);
    em_gguf_close(g);
    /* RMS over tensors and the worst one, from the per-tensor list */
    double sum = 0;
    int worst = -1;
    for (int i = 0; i < r->n_quant; i++) {
        sum += r->quant[i].rel_rmse * r->quant[i].rel_rmse;
        if (worst < 0 || r->quant[i].rel_rmse > r->quant[worst].rel_rmse) worst = i;
    }
    assert_int_equal(r->worst, worst);
    if (r->n_quant) assert_true(fabs(r->rmse_rms - sqrt(sum / r->n_quant)) < 1e-12);
}

/* ---- the Kimi-Linear mapping, written out independently --------------------------------- */

/* GGUF suffix <- HF suffix for tensors copied as they are (model.layers.N. prefix). */
static const struct { const char *gguf, *hf; } kimi_copy[] = {
    { "attn_norm.weight", "input_layernorm.weight" },
    { "ffn_norm.weight", "post_attention_layernorm.weight" },
    { "attn_q.weight", "self_attn.q_proj.weight" },
    { "attn_k.weight", "self_attn.k_proj.weight" },
    { "attn_v.weight", "self_attn.v_proj.weight" },
    { "ssm_conv1d_q.weight", "self_attn.q_conv1d.weight" },
    { "ssm_conv1d_k.weight", "self_attn.k_conv1d.weight" },
    { "ssm_conv1d_v.weight", "self_attn.v_conv1d.weight" },
    { "ssm_dt.bias", "self_attn.dt_bias" },
    { "ssm_f_a.weight", "self_attn.f_a_proj.weight" },
    { "ssm_f_b.weight", "self_attn.f_b_proj.weight" },
    { "ssm_beta.weight", "self_attn.b_proj.weight" },
    { "ssm_g_a.weight", "self_attn.g_a_proj.weight" },
    { "ssm_g_b.weight", "self_attn.g_b_proj.weight" },
    { "ssm_norm.weight", "self_attn.o_norm.weight" },
    { "attn_output.weight", "self_attn.o_proj.weight" },
    { "attn_q_a.weight", "self_attn.q_a_proj.weight" },
    { "attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight" },
    { "attn_q_b.weight", "self_attn.q_b_proj.weight" },
    { "attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight" },
    { "attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight" },
    { "ffn_gate.weight", "mlp.gate_proj.weight" },
    { "ffn_up.weight", "mlp.up_proj.weight" },
    { "ffn_down.weight", "mlp.down_proj.weight" },
    { "ffn_gate_inp.weight", "block_sparse_moe.gate.weight" },
    { "exp_probs_b.bias", "block_sparse_moe.gate.e_score_correction_bias" },
    { "ffn_gate_shexp.weight", "block_sparse_moe.shared_experts.gate_proj.weight" },
    { "ffn_up_shexp.weight", "block_sparse_moe.shared_experts.up_proj.weight" },
    { "ffn_down_shexp.weight", "block_sparse_moe.shared_experts.down_proj.weight" },
};

static const float *f32_data(const em_gguf_tensor *t) {
    if (t->type != EM_TYPE_F32) fail_msg("%s is %s, want f32", t->name, em_type_name(t->type));
    return t->data;
}

static void expect_equal(const char *what, const float *got, const float *want, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s[%llu]: %.9g, want %.9g", what, (unsigned long long)i, got[i], want[i]);
}

typedef struct kimi_dims {
    int nope, v, kv_lora, heads, experts;
} kimi_dims;

/* Checks one GGUF tensor of an F32 conversion against the source; returns 1 when handled. */
static int check_kimi_tensor(const em_gguf_tensor *t, const em_safetensors *st, kimi_dims d) {
    uint64_t n;
    float *src;
    char hf[256];
    if (!strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight") ||
        !strcmp(t->name, "output_norm.weight")) {
        src = source_f32(st, !strcmp(t->name, "token_embd.weight") ? "model.embed_tokens.weight"
                             : !strcmp(t->name, "output.weight") ? "lm_head.weight"
                                                                  : "model.norm.weight", &n);
        assert_int_equal(n, t->n_elements);
        expect_equal(t->name, f32_data(t), src, n);
        free(src);
        return 1;
    }
    int layer, off = 0;
    if (sscanf(t->name, "blk.%d.%n", &layer, &off) != 1 || !off) return 0;
    const char *suffix = t->name + off;
    const float *got = f32_data(t);
    for (size_t i = 0; i < sizeof kimi_copy / sizeof kimi_copy[0]; i++) {
        if (strcmp(suffix, kimi_copy[i].gguf)) continue;
        snprintf(hf, sizeof hf, "model.layers.%d.%s", layer, kimi_copy[i].hf);
        if (!em_safetensors_find(st, hf) && !strncmp(kimi_copy[i].hf, "mlp.", 4)) /* tf5 name */
            snprintf(hf, sizeof hf, "model.layers.%d.block_sparse_moe.%s", layer, kimi_copy[i].hf + 4);
        src = source_f32(st, hf, &n);
        assert_int_equal(n, t->n_elements);
        expect_equal(t->name, got, src, n);
        free(src);
        return 1;
    }
    if (!strcmp(suffix, "ssm_a")) {
        snprintf(hf, sizeof hf, "model.layers.%d.self_attn.A_log", layer);
        src = source_f32(st, hf, &n);
        assert_int_equal(n, t->n_elements);
        for (uint64_t i = 0; i < n; i++) src[i] = -expf(src[i]);
        expect_equal(t->name, got, src, n);
        free(src);
        return 1;
    }
    if (!strcmp(suffix, "attn_k_b.weight") || !strcmp(suffix, "attn_v_b.weight")) {
        snprintf(hf, sizeof hf, "model.layers.%d.self_attn.kv_b_proj.weight", layer);
        src = source_f32(st, hf, &n); /* [heads * (nope + v)][kv_lora] */
        bool k = suffix[5] == 'k';
        for (int h = 0; h < d.heads; h++)
            for (int c = 0; c < d.kv_lora; c++)
                for (int j = 0; j < (k ? d.nope : d.v); j++) {
                    int row = h * (d.nope + d.v) + (k ? j : d.nope + j);
                    float want = src[(size_t)row * d.kv_lora + c];
                    /* k: ne [nope, kv_lora, heads]; v: ne [kv_lora, v, heads] */
                    size_t at = k ? (size_t)j + (size_t)d.nope * ((size_t)c + (size_t)d.kv_lora * h)
                                  : (size_t)c + (size_t)d.kv_lora * ((size_t)j + (size_t)d.v * h);
                    if (got[at] != want)
                        fail_msg("%s (h %d, c %d, j %d): %g, want %g", t->name, h, c, j, got[at], want);
                }
        free(src);
        return 1;
    }
    const char *w = !strcmp(suffix, "ffn_gate_exps.weight") ? "w1"
                    : !strcmp(suffix, "ffn_up_exps.weight") ? "w3"
                    : !strcmp(suffix, "ffn_down_exps.weight") ? "w2" : NULL;
    if (w) {
        uint64_t per = t->n_elements / (uint64_t)d.experts;
        assert_int_equal(t->ne[2], d.experts);
        for (int e = 0; e < d.experts; e++) {
            snprintf(hf, sizeof hf, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", layer, e, w);
            src = source_f32(st, hf, &n); /* [out][in]: ne [in, out] per expert */
            assert_int_equal(n, per);
            assert_int_equal(t->ne[0] * t->ne[1], (int64_t)n);
            expect_equal(t->name, got + e * per, src, n);
            free(src);
        }
        return 1;
    }
    return 0;
}

static void check_kimi_f32_data(const char *gguf, const char *src_dir, kimi_dims d) {
    em_gguf *g = open_gguf(gguf);
    em_safetensors *st;
    em_err err = { 0 };
    if (em_safetensors_open(&st, src_dir, &err)) fail_msg("%s", err.msg);
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        if (!check_kimi_tensor(t, st, d)) fail_msg("no independent check for GGUF tensor %s", t->name);
    }
    em_safetensors_close(st);
    em_gguf_close(g);
}

/* Every Q8_0 tensor of q8 is the Q8_0 encoding of the same tensor of f32 (itself checked
 * against the source); F32 tensors are equal; the report's sampled error is checked against
 * the error over all rows. */
static void check_q8_against_f32(const char *q8, const char *f32, const em_convert_report *r) {
    em_gguf *gq = open_gguf(q8), *gf = open_gguf(f32);
    assert_int_equal(em_gguf_n_tensors(gq), em_gguf_n_tensors(gf));
    int lossy = 0;
    for (int64_t i = 0; i < em_gguf_n_tensors(gq); i++) {
        const em_gguf_tensor *tq = em_gguf_tensor_at(gq, i);
        const em_gguf_tensor *tf = gguf_tensor(gf, tq->name);
        assert_int_equal(tq->n_elements, tf->n_elements);
        for (int k = 0; k < 4; k++) assert_int_equal(tq->ne[k], tf->ne[k]);
        if (tq->type == EM_TYPE_F32) {
            assert_memory_equal(tq->data, tf->data, tf->bytes);
            continue;
        }
        assert_int_equal(tq->type, EM_TYPE_Q8_0);
        assert_true(tq->n_dims >= 2 && tq->ne[0] % 32 == 0);
        uint8_t *enc = malloc(tq->bytes);
        float *deq = malloc(tq->n_elements * sizeof *deq);
        em_err err = { 0 };
        if (em_quantize(EM_TYPE_Q8_0, tf->data, enc, (int64_t)tf->n_elements, &err)) fail_msg("%s", err.msg);
        assert_memory_equal(enc, tq->data, tq->bytes);
        if (em_dequantize(EM_TYPE_Q8_0, tq->data, deq, (int64_t)tq->n_elements, &err)) fail_msg("%s", err.msg);
        const float *x = tf->data;
        double e2 = 0, x2 = 0;
        for (uint64_t j = 0; j < tq->n_elements; j++) {
            e2 += ((double)x[j] - deq[j]) * ((double)x[j] - deq[j]);
            x2 += (double)x[j] * x[j];
        }
        double full = sqrt(e2 / x2);
        const em_convert_qstat *q = &r->quant[lossy++];
        assert_string_equal(q->name, tq->name);
        uint64_t rows = tq->n_elements / (uint64_t)tq->ne[0];
        if (rows <= (uint64_t)r->rmse_rows) assert_true(fabs(q->rel_rmse - full) <= 1e-9 * full);
        else assert_true(fabs(q->rel_rmse - full) <= 0.25 * full);
        /* Q8_0 of roughly uniform / normal weights: about 0.4-0.6% relative error */
        assert_true(q->rel_rmse > 0.002 && q->rel_rmse < 0.01);
        free(enc);
        free(deq);
    }
    assert_int_equal(lossy, r->n_quant);
    em_gguf_close(gq);
    em_gguf_close(gf);
}

/* ---- Kimi-Linear ------------------------------------------------------------------------ */

static void check_kimi_a_keys(const em_gguf *g) {
    key_str(g, "general.architecture", "kimi-linear");
    assert_int_equal(key_u32(g, "kimi-linear.block_count"), 4);
    assert_int_equal(key_u32(g, "kimi-linear.embedding_length"), 96);
    assert_int_equal(key_u32(g, "kimi-linear.feed_forward_length"), 128);
    assert_int_equal(key_u32(g, "kimi-linear.context_length"), 1048576);
    assert_int_equal(key_u32(g, "kimi-linear.attention.head_count"), 4);
    static const int32_t kv[] = { 0, 1, 0, 1 }; /* full_attn_layers [2, 4], 1-indexed */
    key_i32_arr(g, "kimi-linear.attention.head_count_kv", kv, 4);
    assert_true(key_f32(g, "kimi-linear.attention.layer_norm_rms_epsilon") == 1e-5f);
    assert_int_equal(key_u32(g, "kimi-linear.attention.key_length_mla"), 48);
    assert_int_equal(key_u32(g, "kimi-linear.attention.value_length_mla"), 32);
    assert_int_equal(key_u32(g, "kimi-linear.attention.kv_lora_rank"), 64);
    assert_int_equal(key_u32(g, "kimi-linear.attention.key_length"), 64 + 16);
    assert_int_equal(key_u32(g, "kimi-linear.attention.value_length"), 64);
    assert_int_equal(key_u32(g, "kimi-linear.rope.dimension_count"), 16);
    assert_int_equal(key_u32(g, "kimi-linear.ssm.conv_kernel"), 4);
    assert_int_equal(key_u32(g, "kimi-linear.kda.head_dim"), 32);
    assert_int_equal(key_u32(g, "kimi-linear.expert_count"), 8);
    assert_int_equal(key_u32(g, "kimi-linear.expert_used_count"), 2);
    assert_int_equal(key_u32(g, "kimi-linear.expert_feed_forward_length"), 32);
    assert_int_equal(key_u32(g, "kimi-linear.expert_shared_count"), 1);
    assert_int_equal(key_u32(g, "kimi-linear.leading_dense_block_count"), 1);
    assert_int_equal(key_u32(g, "kimi-linear.expert_gating_func"), 2); /* sigmoid */
    assert_int_equal(key_u32(g, "kimi-linear.vocab_size"), 512);
    assert_true(key_f32(g, "kimi-linear.expert_weights_scale") == 2.446f);
    assert_true(key_bool(g, "kimi-linear.expert_weights_norm"));
    assert_int_equal(em_gguf_find_key(g, "kimi-linear.attention.q_lora_rank"), -1);
    /* tokenizer: Kimi's tiktoken, 512 ids */
    key_str(g, "tokenizer.ggml.model", "gpt2");
    key_str(g, "tokenizer.ggml.pre", "kimi-k2");
    const em_gguf_arr *toks;
    em_err err = { 0 };
    if (em_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, &err)) fail_msg("%s", err.msg);
    assert_int_equal(em_gguf_arr_count(toks), 512);
    assert_int_equal(key_u32(g, "tokenizer.ggml.bos_token_id"), 480);
    assert_int_equal(key_u32(g, "tokenizer.ggml.eos_token_id"), 481); /* [EOS]: Kimi override */
}

static void check_kimi_a_shapes(const em_gguf *g) {
    expect_ne(gguf_tensor(g, "token_embd.weight"), 2, 96, 512, 1, 1);
    expect_ne(gguf_tensor(g, "output.weight"), 2, 96, 512, 1, 1);
    expect_ne(gguf_tensor(g, "blk.0.ssm_a"), 4, 1, 4, 1, 1);
    expect_ne(gguf_tensor(g, "blk.0.ssm_conv1d_q.weight"), 4, 4, 1, 128, 1);
    expect_ne(gguf_tensor(g, "blk.0.ssm_dt.bias"), 1, 128, 1, 1, 1);
    expect_ne(gguf_tensor(g, "blk.0.ssm_f_b.weight"), 2, 32, 128, 1, 1);
    expect_ne(gguf_tensor(g, "blk.0.ffn_gate.weight"), 2, 96, 128, 1, 1);
    expect_ne(gguf_tensor(g, "blk.1.attn_q.weight"), 2, 96, 4 * 48, 1, 1);
    expect_ne(gguf_tensor(g, "blk.1.attn_kv_a_mqa.weight"), 2, 96, 80, 1, 1);
    expect_ne(gguf_tensor(g, "blk.1.attn_k_b.weight"), 3, 32, 64, 4, 1);
    expect_ne(gguf_tensor(g, "blk.1.attn_v_b.weight"), 3, 64, 32, 4, 1);
    expect_ne(gguf_tensor(g, "blk.1.attn_output.weight"), 2, 128, 96, 1, 1);
    expect_ne(gguf_tensor(g, "blk.1.ffn_gate_exps.weight"), 3, 96, 32, 8, 1);
    expect_ne(gguf_tensor(g, "blk.1.ffn_down_exps.weight"), 3, 32, 96, 8, 1);
    expect_ne(gguf_tensor(g, "blk.1.exp_probs_b.bias"), 1, 8, 1, 1, 1);
    assert_null(em_gguf_find_tensor(g, "blk.1.ffn_gate.weight"));
    assert_null(em_gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight"));
}

static const kimi_dims kimi_a_dims = { .nope = 32, .v = 32, .kv_lora = 64, .heads = 4, .experts = 8 };

static void test_kimi_a_f32(void **state) {
    (void)state;
    const char *out = em_test_path("kimi_a_f32.gguf");
    em_convert_report r;
    convert_ok(FIX("kimi_a"), out, EM_TYPE_F32, NULL, &r);
    check_report_files(&r, FIX("kimi_a"), FIX("kimi_a/model.safetensors"));
    assert_string_equal(r.arch, "kimi-linear");
    assert_int_equal(r.n_src_tensors, 141);
    assert_int_equal(r.n_src_mapped, 141);
    /* 141 sources: 8 experts x 3 x 3 MoE layers fold into 9 stacked tensors (-63), each kv_b
     * becomes two (+2): 80 */
    assert_int_equal(r.n_out_tensors, 80);
    assert_int_equal(r.type_counts[EM_TYPE_F32], 80);
    assert_int_equal(r.n_quant, 0);
    assert_int_equal(r.worst, -1);
    assert_string_equal(r.tokenizer, "gpt2/kimi-k2");
    em_gguf *g = open_gguf(out);
    check_kimi_a_keys(g);
    check_kimi_a_shapes(g);
    assert_int_equal(key_u32(g, "general.file_type"), 0);
    em_gguf_close(g);
    check_kimi_f32_data(out, FIX("kimi_a"), kimi_a_dims);
    em_convert_report_free(&r);
}

static void test_kimi_a_q8_0(void **state) {
    (void)state;
    const char *f32 = em_test_path("kimi_a_ref.gguf"), *q8 = em_test_path("kimi_a_q8.gguf");
    em_convert_report rf, r;
    convert_ok(FIX("kimi_a"), f32, EM_TYPE_F32, NULL, &rf);
    convert_ok(FIX("kimi_a"), q8, EM_TYPE_Q8_0, NULL, &r);
    check_report_files(&r, FIX("kimi_a"), FIX("kimi_a/model.safetensors"));
    /* matrices (rows 96/128/32/64 wide: all multiples of 32) are Q8_0; norms, biases, ssm_a,
     * conv, router stay F32 */
    assert_int_equal(r.type_counts[EM_TYPE_Q8_0], 51);
    assert_int_equal(r.type_counts[EM_TYPE_F32], 29);
    assert_int_equal(r.n_quant, 51);
    em_gguf *g = open_gguf(q8);
    check_kimi_a_keys(g);
    check_kimi_a_shapes(g);
    assert_int_equal(key_u32(g, "general.file_type"), 7);
    static const char *const f32_names[] = { "blk.0.ssm_a", "blk.0.ssm_conv1d_v.weight",
                                             "blk.0.ssm_dt.bias", "blk.1.ffn_gate_inp.weight",
                                             "blk.1.exp_probs_b.bias", "blk.1.attn_kv_a_norm.weight" };
    for (size_t i = 0; i < sizeof f32_names / sizeof f32_names[0]; i++)
        assert_int_equal(gguf_tensor(g, f32_names[i])->type, EM_TYPE_F32);
    em_gguf_close(g);
    check_q8_against_f32(q8, f32, &r);
    assert_true(r.rmse_rms > 0.003 && r.rmse_rms < 0.008);
    em_convert_report_free(&rf);
    em_convert_report_free(&r);
}

/* Same input, same bytes, whatever the thread count. */
static void test_deterministic(void **state) {
    (void)state;
    em_convert_report a, b;
    em_convert_opts o = { .src_dir = FIX("kimi_a"), .out_path = em_test_path("det1.gguf"),
                          .type = EM_TYPE_Q8_0, .n_threads = 1 };
    em_err err = { 0 };
    if (em_convert(&o, &a, &err)) fail_msg("%s", err.msg);
    o.out_path = em_test_path("det3.gguf");
    o.n_threads = 3;
    if (em_convert(&o, &b, &err)) fail_msg("%s", err.msg);
    assert_string_equal(a.shards[0].sha256, b.shards[0].sha256);
    em_convert_report_free(&a);
    em_convert_report_free(&b);
}

static void test_kimi_b(void **state) {
    (void)state;
    em_convert_report r;
    const char *out = em_test_path("kimi_b.gguf");
    convert_ok(FIX("kimi_b"), out, EM_TYPE_F32, NULL, &r);
    check_report_files(&r, FIX("kimi_b"), FIX("kimi_b/model.safetensors"));
    assert_int_equal(r.n_src_tensors, 219);
    /* 219 - 4 MoE layers x (36 experts - 3 stacks) + 2 kv_b splits = 89 */
    assert_int_equal(r.n_out_tensors, 89);
    assert_string_equal(r.tokenizer, "none");
    em_gguf *g = open_gguf(out);
    static const int32_t kv[] = { 1, 0, 0, 1 }; /* full_attn_layers [1, 4] */
    key_i32_arr(g, "kimi-linear.attention.head_count_kv", kv, 4);
    assert_int_equal(key_u32(g, "kimi-linear.attention.q_lora_rank"), 32);
    assert_int_equal(key_u32(g, "kimi-linear.leading_dense_block_count"), 0);
    assert_int_equal(key_u32(g, "kimi-linear.expert_group_count"), 4);
    assert_int_equal(key_u32(g, "kimi-linear.expert_group_used_count"), 2);
    assert_int_equal(key_u32(g, "kimi-linear.expert_shared_count"), 2);
    assert_false(key_bool(g, "kimi-linear.expert_weights_norm"));
    assert_true(key_f32(g, "kimi-linear.attention.layer_norm_rms_epsilon") == 1e-6f);
    key_str(g, "tokenizer.ggml.model", "none");
    expect_ne(gguf_tensor(g, "blk.0.attn_q_a.weight"), 2, 64, 32, 1, 1);
    expect_ne(gguf_tensor(g, "blk.0.attn_q_b.weight"), 2, 32, 2 * 64, 1, 1);
    expect_ne(gguf_tensor(g, "blk.0.ffn_gate_shexp.weight"), 2, 64, 64, 1, 1);
    assert_null(em_gguf_find_tensor(g, "blk.0.attn_q.weight"));
    em_gguf_close(g);
    kimi_dims d = { .nope = 32, .v = 32, .kv_lora = 32, .heads = 2, .experts = 12 };
    check_kimi_f32_data(out, FIX("kimi_b"), d);
    em_convert_report_free(&r);
}

/* BF16 source (with F32 A_log, dt_bias, router bias): F32 output holds the exact widened
 * values; BF16 output keeps the matrices bit for bit. */
static void test_kimi_b_bf16(void **state) {
    (void)state;
    em_convert_report r, rb;
    const char *out = em_test_path("kimi_b_bf16.gguf"), *outb = em_test_path("kimi_b_bf16b.gguf");
    convert_ok(FIX("kimi_b_bf16"), out, EM_TYPE_F32, NULL, &r);
    check_report_files(&r, FIX("kimi_b_bf16"), FIX("kimi_b_bf16/model.safetensors"));
    kimi_dims d = { .nope = 32, .v = 32, .kv_lora = 32, .heads = 2, .experts = 12 };
    check_kimi_f32_data(out, FIX("kimi_b_bf16"), d);
    convert_ok(FIX("kimi_b_bf16"), outb, EM_TYPE_BF16, NULL, &rb);
    check_report_files(&rb, FIX("kimi_b_bf16"), FIX("kimi_b_bf16/model.safetensors"));
    assert_int_equal(rb.type_counts[EM_TYPE_BF16] + rb.type_counts[EM_TYPE_F32], 89);
    for (int i = 0; i < rb.n_quant; i++) assert_true(rb.quant[i].rel_rmse == 0); /* bf16 -> bf16 */
    em_gguf *g = open_gguf(outb);
    em_safetensors *st;
    em_err err = { 0 };
    if (em_safetensors_open(&st, FIX("kimi_b_bf16"), &err)) fail_msg("%s", err.msg);
    const em_gguf_tensor *t = gguf_tensor(g, "blk.1.attn_q.weight");
    assert_int_equal(t->type, EM_TYPE_BF16);
    const em_safetensors_tensor *s = em_safetensors_find(st, "model.layers.1.self_attn.q_proj.weight");
    assert_non_null(s);
    assert_int_equal(s->n_bytes, t->bytes);
    assert_memory_equal(s->data, t->data, t->bytes);
    assert_int_equal(key_u32(g, "general.file_type"), 32);
    em_safetensors_close(st);
    em_gguf_close(g);
    em_convert_report_free(&r);
    em_convert_report_free(&rb);
}

/* transformers 5.17's save_pretrained spelling (dense MLP as block_sparse_moe.*, its own
 * config.json dialect) gives byte-identical output to the Moonshot spelling. */
static void test_transformers_layout(void **state) {
    (void)state;
    const char *moon = mkdir_test("moonshot"), *tf = mkdir_test("tf5");
    char mdir[768], tdir[768];
    snprintf(mdir, sizeof mdir, "%s/kimi_a", moon);
    snprintf(tdir, sizeof tdir, "%s/kimi_a", tf);
    assert_int_equal(em_test_sh(0, "cp -r '%s' '%s'", FIX("kimi_a"), mdir), 0);
    assert_int_equal(em_test_sh(0, "cp -r '%s' '%s' && cp '%s' '%s/config.json'", FIX("kimi_a"), tdir,
                                em_test_src("tests/fixtures/ref/transformers_save_pretrained_kimi_a/config.json"),
                                tdir), 0);
    /* rewrite the safetensors file with the dense MLP named as transformers 5.17 saves it */
    em_safetensors *st;
    em_err err = { 0 };
    char path[900];
    snprintf(path, sizeof path, "%s/model.safetensors", tdir);
    if (em_safetensors_open(&st, path, &err)) fail_msg("%s", err.msg);
    json_t *hdr = json_object();
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    size_t n = em_safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
        const em_safetensors_tensor *t = em_safetensors_at(st, i);
        char name[256];
        const char *mlp = strstr(t->name, "layers.0.mlp.");
        if (mlp) snprintf(name, sizeof name, "model.layers.0.block_sparse_moe.%s", mlp + 13);
        else snprintf(name, sizeof name, "%s", t->name);
        json_t *shape = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        json_object_set_new(hdr, name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", em_st_dtype_name(t->dtype),
                                                 "shape", shape, "data_offsets", (json_int_t)off,
                                                 (json_int_t)(off + t->n_bytes)));
        off += t->n_bytes;
    }
    char *h = json_dumps(hdr, JSON_COMPACT);
    uint64_t hl = strlen(h);
    char out_path[900];
    snprintf(out_path, sizeof out_path, "%s/new.safetensors", tdir);
    FILE *f = fopen(out_path, "wb");
    assert_non_null(f);
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, hl, f);
    for (size_t i = 0; i < n; i++) fwrite(em_safetensors_at(st, i)->data, 1, em_safetensors_at(st, i)->n_bytes, f);
    fclose(f);
    free(h);
    json_decref(hdr);
    em_safetensors_close(st);
    assert_int_equal(em_test_sh(0, "mv '%s' '%s'", out_path, path), 0);

    char mout[900], tout[900];
    snprintf(mout, sizeof mout, "%s/out.gguf", moon);
    snprintf(tout, sizeof tout, "%s/out.gguf", tf);
    em_convert_report a, b;
    convert_ok(mdir, mout, EM_TYPE_Q8_0, NULL, &a);
    convert_ok(tdir, tout, EM_TYPE_Q8_0, NULL, &b);
    assert_string_equal(a.shards[0].sha256, b.shards[0].sha256);
    em_convert_report_free(&a);
    em_convert_report_free(&b);
}

static void test_split(void **state) {
    (void)state;
    const char *dir = mkdir_test("split");
    char out[900], whole[900];
    snprintf(out, sizeof out, "%s/kimi.gguf", dir);
    snprintf(whole, sizeof whole, "%s/whole.gguf", dir);
    em_convert_opts o = { .src_dir = FIX("kimi_a"), .out_path = out, .type = EM_TYPE_Q8_0,
                          .max_shard_bytes = 200000 };
    em_convert_report r, w;
    em_err err = { 0 };
    if (em_convert(&o, &r, &err)) fail_msg("%s", err.msg);
    assert_true(r.n_shards >= 3);
    check_report_files(&r, FIX("kimi_a"), FIX("kimi_a/model.safetensors"));
    assert_non_null(strstr(r.shards[0].path, "kimi-00001-of-0000"));
    convert_ok(FIX("kimi_a"), whole, EM_TYPE_Q8_0, NULL, &w);
    em_gguf *gs = open_gguf(r.shards[1].path), *gw = open_gguf(whole);
    assert_int_equal(em_gguf_n_tensors(gs), em_gguf_n_tensors(gw));
    for (int64_t i = 0; i < em_gguf_n_tensors(gw); i++) {
        const em_gguf_tensor *a = em_gguf_tensor_at(gw, i), *b = gguf_tensor(gs, a->name);
        assert_int_equal(a->bytes, b->bytes);
        assert_memory_equal(a->data, b->data, a->bytes);
    }
    em_gguf_close(gs);
    em_gguf_close(gw);
    em_convert_report_free(&r);
    em_convert_report_free(&w);
}

/* ---- drafters --------------------------------------------------------------------------- */

/* The drafter mapping, written out independently: GGUF name <- HF name (no "model." prefix). */
static const char *drafter_source(const char *gguf, char *buf, size_t cap) {
    static const struct { const char *g, *h; } globals[] = {
        { "token_embd.weight", "embed_tokens.weight" }, { "output.weight", "lm_head.weight" },
        { "fc.weight", "fc.weight" }, { "enc.output_norm.weight", "hidden_norm.weight" },
        { "output_norm.weight", "norm.weight" },
        { "markov_w1.weight", "markov_head.markov_w1.weight" },
        { "markov_w2.weight", "markov_head.markov_w2.weight" },
        { "markov_gate.weight", "markov_head.gate_proj.weight" },
        { "markov_gate.bias", "markov_head.gate_proj.bias" },
        { "markov_joint.weight", "markov_head.joint_proj.weight" },
        { "markov_joint.bias", "markov_head.joint_proj.bias" },
        { "conf_proj.weight", "confidence_head.proj.weight" },
        { "conf_proj.bias", "confidence_head.proj.bias" },
    };
    static const struct { const char *g, *h; } per_layer[] = {
        { "attn_norm.weight", "input_layernorm.weight" },
        { "ffn_norm.weight", "post_attention_layernorm.weight" },
        { "attn_q.weight", "self_attn.q_proj.weight" }, { "attn_k.weight", "self_attn.k_proj.weight" },
        { "attn_v.weight", "self_attn.v_proj.weight" },
        { "attn_output.weight", "self_attn.o_proj.weight" },
        { "attn_q_norm.weight", "self_attn.q_norm.weight" },
        { "attn_k_norm.weight", "self_attn.k_norm.weight" },
        { "ffn_gate.weight", "mlp.gate_proj.weight" }, { "ffn_up.weight", "mlp.up_proj.weight" },
        { "ffn_down.weight", "mlp.down_proj.weight" },
    };
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(gguf, globals[i].g)) return globals[i].h;
    int layer, off = 0;
    if (sscanf(gguf, "blk.%d.%n", &layer, &off) == 1 && off)
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++)
            if (!strcmp(gguf + off, per_layer[i].g)) {
                snprintf(buf, cap, "layers.%d.%s", layer, per_layer[i].h);
                return buf;
            }
    fail_msg("no independent mapping for drafter tensor %s", gguf);
    return NULL;
}

static void check_drafter_f32(const char *gguf, const char *dir) {
    em_gguf *g = open_gguf(gguf);
    em_safetensors *st;
    em_err err = { 0 };
    if (em_safetensors_open(&st, dir, &err)) fail_msg("%s", err.msg);
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        char buf[256];
        uint64_t n;
        float *src = source_f32(st, drafter_source(t->name, buf, sizeof buf), &n);
        assert_int_equal(n, t->n_elements);
        expect_equal(t->name, f32_data(t), src, n);
        free(src);
    }
    em_safetensors_close(st);
    em_gguf_close(g);
}

typedef struct drafter_case {
    const char *fixture;
    int n_tensors, n_q8, n_f32;
    int n_taps;
    int32_t taps[3]; /* HF target_layer_ids + 1 */
    const char *markov;
    float eps, theta;
    bool yarn, embed;
} drafter_case;

static void check_drafter(const drafter_case *c) {
    char src[768], out[768], out32[768];
    snprintf(src, sizeof src, "%s", em_test_src("tests/fixtures/"));
    strncat(src, c->fixture, sizeof src - strlen(src) - 1);
    snprintf(out, sizeof out, "%s/%s.gguf", em_test_dir(), c->fixture);
    snprintf(out32, sizeof out32, "%s/%s_f32.gguf", em_test_dir(), c->fixture);
    em_convert_report r, r32;
    convert_ok(src, out, EM_TYPE_Q8_0, FIX("kimi_a"), &r);
    char file[800];
    snprintf(file, sizeof file, "%s/model.safetensors", src);
    check_report_files(&r, src, file);
    assert_string_equal(r.arch, "dflash");
    assert_string_equal(r.mode, "dspark");
    assert_string_equal(r.markov, c->markov);
    assert_int_equal(r.n_src_tensors, c->n_tensors);
    assert_int_equal(r.n_src_mapped, c->n_tensors);
    assert_int_equal(r.n_out_tensors, c->n_tensors);
    assert_int_equal(r.type_counts[EM_TYPE_Q8_0], c->n_q8);
    assert_int_equal(r.type_counts[EM_TYPE_F32], c->n_f32);
    assert_int_equal(r.n_tokens, 512);
    em_gguf *g = open_gguf(out);
    key_str(g, "general.architecture", "dflash");
    key_i32_arr(g, "dflash.target_layers", c->taps, c->n_taps);
    assert_int_equal(key_u32(g, "dflash.block_size"), 7);
    assert_true(key_bool(g, "dflash.sample_from_anchor"));
    assert_false(key_bool(g, "dflash.attention.causal"));
    assert_true(key_bool(g, "dflash.has_confidence_head"));
    assert_true(key_bool(g, "dflash.confidence_head_with_markov"));
    assert_int_equal(key_u32(g, "dflash.markov_rank"), 32);
    key_str(g, "dflash.markov_head_type", c->markov);
    assert_int_equal(key_u32(g, "tokenizer.ggml.mask_token_id"), 509);
    assert_true(key_f32(g, "dflash.attention.layer_norm_rms_epsilon") == c->eps);
    assert_true(key_f32(g, "dflash.rope.freq_base") == c->theta);
    assert_int_equal(key_u32(g, "dflash.embedding_length"), 96);
    assert_int_equal(key_u32(g, "dflash.attention.head_count"), 4);
    assert_int_equal(key_u32(g, "dflash.attention.key_length"), 32);
    assert_int_equal(key_u32(g, "dflash.vocab_size"), 512);
    if (c->yarn) {
        key_str(g, "dflash.rope.scaling.type", "yarn");
        assert_true(key_f32(g, "dflash.rope.scaling.factor") == 4.0f);
        assert_int_equal(key_u32(g, "dflash.rope.scaling.original_context_length"), 256);
        assert_true(key_f32(g, "dflash.rope.scaling.yarn_beta_fast") == 32.0f);
        assert_true(key_f32(g, "dflash.rope.scaling.yarn_beta_slow") == 1.0f);
    } else {
        assert_int_equal(em_gguf_find_key(g, "dflash.rope.scaling.type"), -1);
    }
    /* the confidence head stays F32; Markov tables [vocab, rank] become ne [rank, vocab] */
    const em_gguf_tensor *conf = gguf_tensor(g, "conf_proj.weight");
    assert_int_equal(conf->type, EM_TYPE_F32);
    expect_ne(conf, 2, 96 + 32, 1, 1, 1);
    expect_ne(gguf_tensor(g, "conf_proj.bias"), 1, 1, 1, 1, 1);
    expect_ne(gguf_tensor(g, "markov_w1.weight"), 2, 32, 512, 1, 1);
    expect_ne(gguf_tensor(g, "fc.weight"), 2, 96 * c->n_taps, 96, 1, 1);
    assert_true((em_gguf_find_tensor(g, "token_embd.weight") != NULL) == c->embed);
    assert_true((em_gguf_find_tensor(g, "output.weight") != NULL) == c->embed);
    /* the borrowed tokenizer agrees with the target's GGUF on every special id */
    assert_int_equal(key_u32(g, "tokenizer.ggml.eos_token_id"), 481);
    assert_int_equal(key_u32(g, "tokenizer.ggml.bos_token_id"), 480);
    em_gguf_close(g);
    convert_ok(src, out32, EM_TYPE_F32, NULL, &r32);
    assert_string_equal(r32.tokenizer, "none");
    check_drafter_f32(out32, src);
    check_q8_against_f32(out, out32, &r);
    em_convert_report_free(&r);
    em_convert_report_free(&r32);
}

static void test_dspark_deepspec(void **state) {
    (void)state;
    /* 31 tensors: 2 layers x 11 + fc, hidden_norm, norm, embed, lm_head, w1, w2, conf w+b;
     * F32: 2 x 4 norms + 2 + conf w + b = 12 */
    drafter_case c = { "dspark_deepspec", 31, 19, 12, 2, { 1, 3 }, "vanilla", 1e-6f, 1e6f, false, true };
    check_drafter(&c);
}

static void test_dspark_deepspec_gated(void **state) {
    (void)state;
    drafter_case c = { "dspark_deepspec_gated", 22, 13, 9, 2, { 1, 3 }, "gated", 1e-6f, 1e6f, false, true };
    check_drafter(&c);
    em_gguf *g = open_gguf(em_test_path("dspark_deepspec_gated.gguf"));
    expect_ne(gguf_tensor(g, "markov_gate.weight"), 2, 128, 32, 1, 1);
    expect_ne(gguf_tensor(g, "markov_gate.bias"), 1, 32, 1, 1, 1);
    em_gguf_close(g);
}

static void test_dspark_specforge(void **state) {
    (void)state;
    drafter_case c = { "dspark_specforge", 29, 17, 12, 3, { 1, 2, 3 }, "vanilla", 1e-5f, 1e4f, true, false };
    check_drafter(&c);
}

static void test_dspark_specforge_rnn(void **state) {
    (void)state;
    drafter_case c = { "dspark_specforge_rnn", 20, 11, 9, 3, { 1, 2, 3 }, "rnn", 1e-5f, 1e4f, true, false };
    check_drafter(&c);
    em_gguf *g = open_gguf(em_test_path("dspark_specforge_rnn.gguf"));
    expect_ne(gguf_tensor(g, "markov_joint.weight"), 2, 160, 96, 1, 1);
    expect_ne(gguf_tensor(g, "markov_joint.bias"), 1, 96, 1, 1, 1);
    em_gguf_close(g);
}

/* ---- corrupt inputs ----------------------------------------------------------------------- */

/* Writes fixture src's tensors again into dir/model.safetensors, leaving out those whose name
 * starts with one of drop (NULL-terminated, may be NULL), storing the tensor named retype
 * (if any) as I32, and appending a 4-element F32 tensor named add (if any). */
static void rewrite_tensors(const char *src, const char *dir, const char *const *drop,
                            const char *retype, const char *add) {
    em_safetensors *st;
    em_err err = { 0 };
    if (em_safetensors_open(&st, src, &err)) fail_msg("%s", err.msg);
    json_t *hdr = json_object();
    uint64_t off = 0;
    size_t n = em_safetensors_count(st);
    bool *keep = calloc(n + 1, sizeof *keep);
    static const float extra[4] = { 1, 2, 3, 4 };
    for (size_t i = 0; i < n; i++) {
        const em_safetensors_tensor *t = em_safetensors_at(st, i);
        keep[i] = true;
        for (int d = 0; drop && drop[d]; d++)
            if (!strncmp(t->name, drop[d], strlen(drop[d]))) keep[i] = false;
        if (!keep[i]) continue;
        const char *dtype = retype && !strcmp(t->name, retype) ? "I32" : em_st_dtype_name(t->dtype);
        json_t *shape = json_array();
        for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        json_object_set_new(hdr, t->name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype, "shape", shape,
                                                    "data_offsets", (json_int_t)off,
                                                    (json_int_t)(off + t->n_bytes)));
        off += t->n_bytes;
    }
    if (add)
        json_object_set_new(hdr, add, json_pack("{s:s,s:[i],s:[I,I]}", "dtype", "F32", "shape", 4,
                                                "data_offsets", (json_int_t)off,
                                                (json_int_t)(off + sizeof extra)));
    char *h = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    uint64_t hl = strlen(h);
    char path[900];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, hl, f);
    for (size_t i = 0; i < n; i++)
        if (keep[i]) fwrite(em_safetensors_at(st, i)->data, 1, em_safetensors_at(st, i)->n_bytes, f);
    if (add) fwrite(extra, 1, sizeof extra, f);
    fclose(f);
    free(h);
    free(keep);
    json_decref(hdr);
    em_safetensors_close(st);
}

/* kimi_a's config.json and its tensors with one edit, in a fresh folder. */
enum edit { E_DROP, E_ADD, E_RETYPE };

static const char *make_case(const char *name, enum edit e, const char *target) {
    const char *dir = mkdir_test(name);
    assert_int_equal(em_test_sh(0, "cp '%s' '%s/'", FIX("kimi_a/config.json"), dir), 0);
    const char *drop[] = { target, NULL };
    rewrite_tensors(FIX("kimi_a"), dir, e == E_DROP ? drop : NULL, e == E_RETYPE ? target : NULL,
                    e == E_ADD ? target : NULL);
    return dir;
}

/* A z-lab DFlash drafter (no Markov or confidence head: mode dflash), made from the SpecForge
 * fixture's backbone with a z-lab config.json. */
static void test_dflash_zlab(void **state) {
    (void)state;
    const char *dir = mkdir_test("zlab");
    static const char cfg[] =
        "{\"architectures\": [\"DFlashDraftModel\"], \"auto_map\": {\"AutoModel\": "
        "\"dflash.DFlashDraftModel\"}, \"block_size\": 16, \"dflash_config\": "
        "{\"mask_token_id\": 509, \"target_layer_ids\": [0, 1, 2]}, \"attention_bias\": false, "
        "\"head_dim\": 32, \"hidden_act\": \"silu\", \"hidden_size\": 96, "
        "\"intermediate_size\": 128, \"layer_types\": [\"full_attention\", \"full_attention\"], "
        "\"max_position_embeddings\": 4096, \"model_type\": \"qwen3\", "
        "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"num_key_value_heads\": 1, "
        "\"num_target_layers\": 4, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, "
        "\"rope_theta\": 1000000, \"tie_word_embeddings\": false, \"vocab_size\": 512}\n";
    char path[900];
    snprintf(path, sizeof path, "%s/config.json", dir);
    em_test_write(path, cfg, strlen(cfg));
    const char *drop[] = { "markov_head.", "confidence_head.", NULL };
    rewrite_tensors(FIX("dspark_specforge"), dir, drop, NULL, NULL);
    em_convert_report r;
    const char *out = em_test_path("zlab.gguf");
    convert_ok(dir, out, EM_TYPE_Q8_0, FIX("kimi_a"), &r);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    check_report_files(&r, dir, path);
    assert_string_equal(r.mode, "dflash");
    assert_int_equal(r.n_out_tensors, 25);
    em_gguf *g = open_gguf(out);
    static const int32_t taps[] = { 1, 2, 3 };
    key_i32_arr(g, "dflash.target_layers", taps, 3);
    assert_int_equal(key_u32(g, "dflash.block_size"), 16);
    assert_false(key_bool(g, "dflash.sample_from_anchor")); /* z-lab: slot 0 is the anchor */
    assert_false(key_bool(g, "dflash.has_confidence_head"));
    assert_int_equal(em_gguf_find_key(g, "dflash.markov_rank"), -1);
    assert_null(em_gguf_find_tensor(g, "markov_w1.weight"));
    assert_null(em_gguf_find_tensor(g, "conf_proj.weight"));
    em_gguf_close(g);
    em_convert_report_free(&r);
}

/* The conversion fails, its message holds each of want (NULL-terminated), and out_dir stays
 * empty. */
static void expect_failure(const char *src, const char *const *want) {
    static int k;
    char out_dir[64], out[900];
    snprintf(out_dir, sizeof out_dir, "out_fail_%d", k++);
    const char *od = mkdir_test(out_dir);
    snprintf(out, sizeof out, "%s/model.gguf", od);
    em_convert_opts o = { .src_dir = src, .out_path = out, .type = EM_TYPE_Q8_0 };
    em_convert_report r;
    em_err err = { 0 };
    int rc = em_convert(&o, &r, &err);
    em_convert_report_free(&r);
    if (rc == 0) fail_msg("conversion of %s succeeded; expected a failure", src);
    for (int i = 0; want[i]; i++)
        if (!strstr(err.msg, want[i])) fail_msg("message '%s' lacks '%s'", err.msg, want[i]);
    assert_int_equal(dir_entries(od), 0);
}

static void test_corrupt_truncated(void **state) {
    (void)state;
    const char *dir = mkdir_test("c_trunc");
    assert_int_equal(em_test_sh(0, "cp '%s' '%s' '%s/' && truncate -s -1000 '%s/model.safetensors'",
                                FIX("kimi_a/config.json"), FIX("kimi_a/model.safetensors"), dir, dir), 0);
    const char *want[] = { "model.safetensors", NULL };
    expect_failure(dir, want);
}

static void test_corrupt_shape(void **state) {
    (void)state;
    const char *dir = mkdir_test("c_shape");
    /* config says kv_lora_rank 32; the checkpoint's MLA tensors are built for 64 */
    assert_int_equal(em_test_sh(0, "cp '%s' '%s/' && sed 's/\"kv_lora_rank\": 64/\"kv_lora_rank\": 32/' "
                                "'%s' > '%s/config.json'", FIX("kimi_a/model.safetensors"), dir,
                                FIX("kimi_a/config.json"), dir), 0);
    const char *want[] = { "model.layers.1.self_attn.kv_a_proj_with_mqa.weight", "[80, 96]", "[48, 96]",
                           "config.json", NULL };
    expect_failure(dir, want);
}

static void test_corrupt_missing(void **state) {
    (void)state;
    const char *dir = make_case("c_missing", E_DROP, "model.layers.2.block_sparse_moe.experts.5.w3.weight");
    const char *want[] = { "model.layers.2.block_sparse_moe.experts.5.w3.weight", "missing",
                           "blk.2.ffn_up_exps.weight", NULL };
    expect_failure(dir, want);
}

static void test_corrupt_extra(void **state) {
    (void)state;
    const char *dir = make_case("c_extra", E_ADD, "model.layers.0.self_attn.rotary_emb.inv_freq");
    const char *want[] = { "model.layers.0.self_attn.rotary_emb.inv_freq", "unknown tensor", NULL };
    expect_failure(dir, want);
}

static void test_corrupt_json(void **state) {
    (void)state;
    const char *dir = mkdir_test("c_json");
    assert_int_equal(em_test_sh(0, "cp '%s' '%s/' && head -c 300 '%s' > '%s/config.json'",
                                FIX("kimi_a/model.safetensors"), dir, FIX("kimi_a/config.json"), dir), 0);
    const char *want[] = { "config.json", "line", NULL };
    expect_failure(dir, want);
}

static void test_corrupt_dtype(void **state) {
    (void)state;
    const char *dir = make_case("c_dtype", E_RETYPE, "model.layers.1.self_attn.q_proj.weight");
    const char *want[] = { "model.layers.1.self_attn.q_proj.weight", "I32", NULL };
    expect_failure(dir, want);
    /* a dtype safetensors itself does not know */
    const char *dir2 = mkdir_test("c_dtype2");
    assert_int_equal(em_test_sh(0, "cp '%s' '%s/' && cp '%s' '%s/model.safetensors' && "
                                "sed -i '0,/\"F32\"/s//\"C64\"/' '%s/model.safetensors'",
                                FIX("kimi_a/config.json"), dir2, FIX("kimi_a/model.safetensors"),
                                dir2, dir2), 0);
    const char *want2[] = { "C64", NULL };
    expect_failure(dir2, want2);
}

static void test_corrupt_unsupported(void **state) {
    (void)state;
    /* a config of another model entirely; a folder that does not exist */
    const char *dir = mkdir_test("c_arch");
    assert_int_equal(em_test_sh(0, "cp '%s' '%s/' && printf '{\"model_type\": \"llama\"}' > '%s/config.json'",
                                FIX("kimi_a/model.safetensors"), dir, dir), 0);
    const char *want[] = { "llama", NULL };
    expect_failure(dir, want);
    const char *want2[] = { "does-not-exist", NULL };
    expect_failure(em_test_path("does-not-exist"), want2);
}

/* The output folder does not exist: the writer's error, nothing left anywhere. */
static void test_bad_output(void **state) {
    (void)state;
    em_convert_opts o = { .src_dir = FIX("kimi_a"), .out_path = em_test_path("no/such/dir/x.gguf"),
                          .type = EM_TYPE_Q8_0 };
    em_convert_report r;
    em_err err = { 0 };
    assert_int_not_equal(em_convert(&o, &r, &err), 0);
    assert_non_null(strstr(err.msg, "no/such/dir/x.gguf"));
    em_convert_report_free(&r);
}

/* ---- cancellation -------------------------------------------------------------------------- */

typedef struct cancel_ctx {
    volatile sig_atomic_t flag;
    int calls;
} cancel_ctx;

static void cancel_after_first(void *user, const em_convert_progress *p) {
    cancel_ctx *c = user;
    (void)p;
    if (++c->calls == 3) c->flag = 1;
}

static void test_cancel(void **state) {
    (void)state;
    const char *od = mkdir_test("cancel");
    char out[900];
    snprintf(out, sizeof out, "%s/m.gguf", od);
    cancel_ctx c = { 0 };
    em_convert_opts o = { .src_dir = FIX("kimi_a"), .out_path = out, .type = EM_TYPE_Q8_0,
                          .cancel = &c.flag, .progress = cancel_after_first, .progress_user = &c };
    em_convert_report r;
    em_err err = { 0 };
    assert_int_not_equal(em_convert(&o, &r, &err), 0);
    assert_non_null(strstr(err.msg, "interrupted"));
    assert_int_equal(dir_entries(od), 0);
    em_convert_report_free(&r);
}

/* SIGINT to `ember convert` on a checkpoint big enough to be caught mid-way (a synthetic one
 * from compat_synth_ckpt, next to the ember binary): exit status 1, "interrupted", no files. */
static void test_sigint(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) skip();
    char synth[900];
    snprintf(synth, sizeof synth, "%.*s/compat_synth_ckpt", (int)(strrchr(bin, '/') - bin), bin);
    if (!strrchr(bin, '/') || access(synth, X_OK) != 0) {
        fprintf(stderr, "skipped: %s is not built\n", synth);
        skip();
    }
    const char *src = em_test_path("synth"), *od = mkdir_test("sigint");
    assert_int_equal(em_test_sh(1, "'%s' '%s' --hidden 1024 --layers 4 --experts 24 --ff-exp 1024 "
                                "--vocab 8192 --heads 8", synth, src), 0);
    char out[900];
    snprintf(out, sizeof out, "%s/m.gguf", od);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen(em_test_path("sigint_err.txt"), "w", stderr))
            _exit(126);
        execl(bin, bin, "convert", src, "-o", out, "--threads", "1", (char *)NULL);
        _exit(127);
    }
    /* wait until the temporary output exists (data is streaming), then interrupt */
    int status = 0;
    bool sent = false;
    for (int i = 0; i < 6000 && !sent; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        if (dir_entries(od) > 0) {
            kill(pid, SIGINT);
            sent = true;
        } else {
            struct timespec ts = { 0, 5000000 };
            nanosleep(&ts, NULL);
        }
    }
    if (!sent) {
        fprintf(stderr, "skipped: the conversion ended before it could be interrupted\n");
        skip();
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 0) {
        fprintf(stderr, "skipped: the conversion finished before the signal arrived\n");
        skip();
    }
    assert_int_equal(WEXITSTATUS(status), 1);
    size_t n;
    char *msg = em_test_read(em_test_path("sigint_err.txt"), &n);
    assert_non_null(strstr(msg, "interrupted"));
    free(msg);
    assert_int_equal(dir_entries(od), 0);
    em_test_sh(0, "rm -rf '%s'", src);
}

/* Chat templates: Kimi-Linear's comes from its tokenizer_config.json, byte for byte (as
 * llama.cpp's converter embeds it); a drafter without tokenizer files gets none. (Kimi-K3, which
 * ships none, gets Ember's: tests/convert_k3.sh renders it.) */
static void test_chat_template(void **state) {
    (void)state;
    em_convert_report r;
    const char *out = em_test_path("tmpl_kimi_a.gguf");
    convert_ok(FIX("kimi_a"), out, EM_TYPE_Q8_0, NULL, &r);
    assert_string_equal(r.chat_template, "checkpoint");
    em_convert_report_free(&r);
    json_error_t je;
    json_t *tc = json_load_file(FIX("kimi_a/tokenizer_config.json"), 0, &je);
    if (!tc) fail_msg("%s", je.text);
    const char *want = json_string_value(json_object_get(tc, "chat_template"));
    assert_non_null(want);
    em_gguf *g = open_gguf(out);
    char got[4096];
    em_err err = { 0 };
    if (em_gguf_get_cstr(g, "tokenizer.chat_template", got, sizeof got, &err)) fail_msg("%s", err.msg);
    assert_string_equal(got, want);
    em_gguf_close(g);
    json_decref(tc);
    out = em_test_path("tmpl_dspark.gguf");
    convert_ok(FIX("dspark_specforge"), out, EM_TYPE_Q8_0, NULL, &r);
    assert_string_equal(r.chat_template, "");
    em_convert_report_free(&r);
    g = open_gguf(out);
    assert_int_equal(em_gguf_get_cstr(g, "tokenizer.chat_template", got, sizeof got, NULL), EM_ENOTFOUND);
    em_gguf_close(g);
}

/* ---- outputs: all or nothing, never over an input (issue 15, items 13 and 14) -------------- */

/* What a path holds ("" when it does not exist), malloc'ed. */
static char *file_text(const char *path) {
    if (access(path, F_OK) != 0) return strdup("");
    size_t n;
    return em_test_read(path, &n);
}

/* A failed conversion leaves the files it was replacing as they were, and no temporary file:
 * the report's folder is missing (found before any work), the report is a folder (found when
 * the GGUF is complete and staged). */
static void test_failed_keeps_old(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) skip();
    char dir[800]; /* em_test_path's buffers rotate: keep a copy */
    snprintf(dir, sizeof dir, "%s", mkdir_test("keep_old"));
    assert_int_equal(em_test_sh(1, "cd '%s' && echo good > o.gguf && mkdir rdir && echo oldrep > r.json", dir), 0);
    assert_int_equal(em_test_sh(1, "cd '%s' && '%s' convert '%s' -o o.gguf --report /nonexistent/r.json",
                                dir, bin, FIX("kimi_a")), 1);
    char path[900];
    snprintf(path, sizeof path, "%s/o.gguf", dir);
    char *t = file_text(path);
    assert_string_equal(t, "good\n");
    free(t);
    assert_int_equal(em_test_sh(1, "cd '%s' && '%s' convert '%s' -o o.gguf --report rdir --threads 2",
                                dir, bin, FIX("kimi_a")), 1);
    t = file_text(path);
    assert_string_equal(t, "good\n");
    free(t);
    assert_int_equal(dir_entries(dir), 3); /* o.gguf, rdir, r.json: nothing staged is left */
    snprintf(path, sizeof path, "%s/rdir", dir);
    assert_int_equal(dir_entries(path), 0);
    /* the library does the same: the API's report_path */
    char out[900], rep_path[900];
    snprintf(out, sizeof out, "%s/o.gguf", dir);
    em_convert_opts o = { .src_dir = FIX("kimi_a"), .out_path = out, .report_path = path,
                          .type = EM_TYPE_Q8_0, .n_threads = 2 };
    em_convert_report r;
    em_err err = { 0 };
    assert_int_not_equal(em_convert(&o, &r, &err), 0);
    assert_non_null(strstr(err.msg, "rdir"));
    em_convert_report_free(&r);
    t = file_text(out);
    assert_string_equal(t, "good\n");
    free(t);
    assert_int_equal(dir_entries(dir), 3);
    /* and a successful one replaces both */
    snprintf(rep_path, sizeof rep_path, "%s/r.json", dir);
    o.report_path = rep_path;
    if (em_convert(&o, &r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(file_bytes(out), r.shards[0].bytes);
    char hex[65];
    if (em_sha256_file(out, hex, &err)) fail_msg("%s", err.msg);
    assert_string_equal(hex, r.shards[0].sha256);
    json_error_t je;
    json_t *j = json_load_file(rep_path, 0, &je);
    if (!j) fail_msg("%s: %s", rep_path, je.text);
    assert_string_equal(json_string_value(json_object_get(j, "sha256")), hex);
    assert_string_equal(json_string_value(json_object_get(j, "output")), out);
    json_decref(j);
    em_convert_report_free(&r);
    assert_int_equal(dir_entries(dir), 3);
}

/* An output that is the report or an input file is refused, naming both paths, before anything
 * is written: a usage error for the CLI (exit 2), EM_EINVAL for the API; split shard names are
 * checked when they are known (exit 1). Existing files are compared by inode, so a link or
 * another spelling of the path is seen through. Nothing changes on disk. */
static void test_output_is_input(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) skip();
    char dir[800]; /* em_test_path's buffers rotate: keep a copy */
    snprintf(dir, sizeof dir, "%s", mkdir_test("out_in"));
    assert_int_equal(em_test_sh(1, "cd '%s' && cp -r '%s' src && ln -s src/model.safetensors link.gguf "
                                "&& ln src/config.json hard.json && echo keep > x.gguf", dir,
                                FIX("kimi_a")), 0);
    char sum_before[900];
    snprintf(sum_before, sizeof sum_before, "%s/sum.txt", dir);
    assert_int_equal(em_test_sh(0, "cd '%s' && sha256sum src/* x.gguf > sum.txt", dir), 0);
    static const struct {
        const char *args, *msg1, *msg2;
        int status;
    } cases[] = {
        { "src -o x.gguf --report x.gguf", "'x.gguf'", "are the same file", 2 },
        { "src -o x.gguf --report ./x.gguf", "'./x.gguf'", "are the same file", 2 },
        { "src -o y.gguf --report ../out_in/y.gguf", "'y.gguf'", "'../out_in/y.gguf'", 2 },
        { "src -o src/model.safetensors", "output 'src/model.safetensors'", "input file", 2 },
        { "src -o ./src/../src/config.json", "output './src/../src/config.json'",
          "input file 'src/config.json'", 2 },
        { "src -o link.gguf", "output 'link.gguf'", "input file 'src/model.safetensors'", 2 },
        { "src -o hard.json", "output 'hard.json'", "input file 'src/config.json'", 2 },
        { "src -o x.gguf --report src/tokenizer_config.json", "report 'src/tokenizer_config.json'",
          "input file", 2 },
        { "src -o o.gguf --tokenizer-from src --report src/tiktoken.model", "report 'src/tiktoken.model'",
          "input file", 2 },
        { "src -o x.gguf --split-max-size 200000 --report x-00002-of-00004.gguf",
          "output 'x-00002-of-00004.gguf'", "the report 'x-00002-of-00004.gguf'", 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st = em_test_sh(1, "cd '%s' && '%s' convert %s --threads 2", dir, bin, cases[i].args);
        size_t n;
        char *msg = em_test_read(em_test_path("err.txt"), &n);
        if (st != cases[i].status || !strstr(msg, cases[i].msg1) || !strstr(msg, cases[i].msg2))
            fail_msg("convert %s: exit %d (want %d): %s", cases[i].args, st, cases[i].status, msg);
        free(msg);
        assert_int_equal(em_test_sh(1, "cd '%s' && sha256sum -c --quiet sum.txt", dir), 0);
        /* src/, link.gguf, hard.json, x.gguf, sum.txt: nothing new, nothing staged left */
        assert_int_equal(dir_entries(dir), 5);
    }
    /* the API refuses the same, with EM_EINVAL */
    char out[900];
    snprintf(out, sizeof out, "%s/src/model.safetensors", dir);
    char src[900];
    snprintf(src, sizeof src, "%s/src", dir);
    em_convert_opts o = { .src_dir = src, .out_path = out, .type = EM_TYPE_Q8_0 };
    em_convert_report r;
    em_err err = { 0 };
    assert_int_equal(em_convert(&o, &r, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "is the input file"));
    em_convert_report_free(&r);
    assert_int_equal(em_test_sh(1, "cd '%s' && sha256sum -c --quiet sum.txt", dir), 0);
}

/* A checkpoint transformers 5.17 wrote itself (tests/fixtures/kimi_tf5: its own
 * KimiLinearConfig and save_pretrained; no moe_router_activation_func, mla_use_nope or
 * linear_attn_config), converted by the CLI with --type f32: `ember logits` of both reference
 * sequences equals transformers' fp32 logits within TF5_TOL absolute (measured 6.3e-6 on
 * logits up to 3.3 in magnitude; a wrong default, e.g. softmax routing or RoPE, moves them by
 * more than 1e-2). */
#define TF5_TOL 2e-5
static void test_kimi_tf5_logits(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) skip();
    const char *out = em_test_path("kimi_tf5.gguf");
    assert_int_equal(em_test_sh(1, "'%s' convert '%s' -o '%s' --type f32 --threads 2", bin,
                                FIX("kimi_tf5"), out), 0);
    json_error_t je;
    json_t *man = json_load_file(em_test_src("tests/fixtures/ref/kimi_tf5/manifest.json"), 0, &je);
    if (!man) fail_msg("kimi_tf5 manifest: %s", je.text);
    static const char *const seqs[] = { "seq0", "seq1" };
    for (int q = 0; q < 2; q++) {
        json_t *toks = json_object_get(json_object_get(man, "tokens"), seqs[q]);
        size_t n = json_array_size(toks);
        assert_true(n > 0);
        char list[1024] = "";
        for (size_t i = 0; i < n; i++) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s%lld", i ? "," : "",
                     (long long)json_integer_value(json_array_get(toks, i)));
        }
        const char *got_path = em_test_path("kimi_tf5.f32");
        assert_int_equal(em_test_sh(1, "'%s' logits -m '%s' --tokens %s -o '%s' --threads 2", bin,
                                    out, list, got_path), 0);
        char rel[128];
        snprintf(rel, sizeof rel, "tests/fixtures/ref/kimi_tf5/%s.logits.bin", seqs[q]);
        float *got = em_test_read_f32(got_path, n * 512), *want = em_test_read_f32(em_test_src(rel), n * 512);
        double worst = 0;
        for (size_t i = 0; i < n * 512; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
        fprintf(stderr, "kimi_tf5 %s: max |ember - transformers| = %.3g over %zu x 512 logits\n",
                seqs[q], worst, n);
        if (!(worst <= TF5_TOL)) fail_msg("kimi_tf5 %s: logits differ by %g (> %g)", seqs[q], worst, TF5_TOL);
        free(got);
        free(want);
    }
    json_decref(man);
}

/* The CLI writes the JSON report with the numbers of the API's report. */
static void test_cli_report(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) skip();
    const char *out = em_test_path("cli.gguf"), *rep = em_test_path("cli.json");
    assert_int_equal(em_test_sh(1, "'%s' convert '%s' -o '%s' --report '%s' --type q8_0", bin,
                                FIX("dspark_specforge"), out, rep), 0);
    json_error_t je;
    json_t *j = json_load_file(rep, 0, &je);
    if (!j) fail_msg("%s: %s", rep, je.text);
    int64_t n_src;
    assert_int_equal(json_integer_value(json_object_get(j, "parameters")),
                     (json_int_t)source_params(FIX("dspark_specforge"), &n_src));
    assert_int_equal(json_integer_value(json_object_get(j, "source_tensors_mapped")), 29);
    assert_string_equal(json_string_value(json_object_get(j, "architecture")), "dflash");
    json_t *types = json_object_get(j, "tensor_types");
    assert_int_equal(json_integer_value(json_object_get(types, "q8_0")), 17);
    assert_int_equal(json_integer_value(json_object_get(types, "f32")), 12);
    char hex[65];
    em_err err = { 0 };
    if (em_sha256_file(out, hex, &err)) fail_msg("%s", err.msg);
    assert_string_equal(json_string_value(json_object_get(j, "sha256")), hex);
    json_t *q = json_object_get(j, "quantization");
    assert_int_equal(json_integer_value(json_object_get(q, "count")), 17);
    double rms = json_real_value(json_object_get(q, "rel_rmse_rms"));
    assert_true(rms > 0.003 && rms < 0.008);
    assert_non_null(json_object_get(json_object_get(q, "worst"), "name"));
    json_decref(j);
    /* usage errors */
    assert_int_equal(em_test_sh(1, "'%s' convert '%s' -o '%s' --type q4_k", bin, FIX("kimi_a"), out), 2);
    assert_int_equal(em_test_sh(1, "'%s' convert '%s'", bin, FIX("kimi_a")), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kimi_a_f32),
        cmocka_unit_test(test_kimi_a_q8_0),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_kimi_b),
        cmocka_unit_test(test_kimi_b_bf16),
        cmocka_unit_test(test_transformers_layout),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_dspark_deepspec),
        cmocka_unit_test(test_dspark_deepspec_gated),
        cmocka_unit_test(test_dspark_specforge),
        cmocka_unit_test(test_dspark_specforge_rnn),
        cmocka_unit_test(test_dflash_zlab),
        cmocka_unit_test(test_corrupt_truncated),
        cmocka_unit_test(test_corrupt_shape),
        cmocka_unit_test(test_corrupt_missing),
        cmocka_unit_test(test_corrupt_extra),
        cmocka_unit_test(test_corrupt_json),
        cmocka_unit_test(test_corrupt_dtype),
        cmocka_unit_test(test_corrupt_unsupported),
        cmocka_unit_test(test_bad_output),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_sigint),
        cmocka_unit_test(test_cli_report),
        cmocka_unit_test(test_kimi_tf5_logits),
        cmocka_unit_test(test_failed_keeps_old),
        cmocka_unit_test(test_output_is_input),
        cmocka_unit_test(test_chat_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
