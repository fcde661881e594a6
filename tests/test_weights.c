/* Tests for model/weights (the one weight loader both model loaders use), on a small GGUF
 * written here with known keys and tensors, and on kimi_a converted by the CLI.
 *
 *  - keys: values, defaults of absent keys, required keys missing, ranges, non-finite or huge
 *    numbers, keys of another type; every message names the file and the key.
 *  - matrices: 2-D and stacked views point at the tensor's bytes in the mapping; a wrong
 *    shape names file, tensor, shape found and wanted; a type without dot kernels is refused;
 *    em_wload_mat_float turns Q8_0 into f32 equal to em_dequantize of the data (float types
 *    stay in place); vectors: one dimension or the conv layout, their values.
 *  - the hook: every matrix made passes it once, finished (a converted matrix as f32), in
 *    order, and every vector as the values handed out; its refusal fails the load naming the
 *    file and the tensor; and kimi_load sends every matrix and vector of a real model (each
 *    one the forward pass uses) through it exactly once.
 */
/* model/ internals first: testutil.h defines E, a name kimi_impl.h uses */
#include "model/kimi_impl.h"
#include "model/weights.h"

#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_path[600];
static em_gguf *g_file;
static em_arena *g_store;
static float g_q_src[64];                 /* the Q8_0 tensor "q" before quantization */
static const int64_t NE_M2[2] = { 8, 3 }; /* "m2" [3 rows of 8] */

/* ---- the file ------------------------------------------------------------------------------ */

static void add(em_gguf_writer *w, const char *name, int type, int nd, const int64_t *ne) {
    OK(em_gguf_writer_add_tensor(w, name, type, nd, ne, E));
}

static void put(em_gguf_writer *w, const char *name, const void *data, size_t bytes) {
    OK(em_gguf_writer_write_tensor(w, name, data, bytes, E));
}

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "%s", em_test_path("weights.gguf"));
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, g_path, NULL, E));
    OK(em_gguf_writer_set_u32(w, "t.i", 7, E));
    OK(em_gguf_writer_set_i32(w, "t.neg", -3, E));
    OK(em_gguf_writer_set_f32(w, "t.f", 0.5f, E));
    OK(em_gguf_writer_set_f32(w, "t.nan", NAN, E));
    OK(em_gguf_writer_set_f64(w, "t.big", 1e31, E));
    OK(em_gguf_writer_set_bool(w, "t.b", true, E));
    OK(em_gguf_writer_set_str(w, "t.s", "hello", E));
    const int64_t ne_m3[3] = { 8, 2, 3 }, ne_q[2] = { 32, 2 }, ne_h[2] = { 8, 2 }, ne_v[1] = { 5 },
                  ne_v1[2] = { 5, 1 }, ne_conv[2] = { 4, 6 }, ne_i[1] = { 8 };
    add(w, "m2", EM_TYPE_F32, 2, NE_M2);
    add(w, "m3", EM_TYPE_F32, 3, ne_m3);
    add(w, "q", EM_TYPE_Q8_0, 2, ne_q);
    add(w, "h", EM_TYPE_F16, 2, ne_h);
    add(w, "v", EM_TYPE_F32, 1, ne_v);
    add(w, "v1", EM_TYPE_F32, 2, ne_v1);
    add(w, "conv", EM_TYPE_F32, 2, ne_conv);
    add(w, "i", EM_TYPE_I64, 1, ne_i);
    const int64_t ne_81[1] = { 32 };
    add(w, "q81", EM_TYPE_Q8_1, 1, ne_81); /* no converter to float */
    float f[48];
    for (int i = 0; i < 48; i++) f[i] = (float)i;
    put(w, "m2", f, 24 * sizeof(float));
    put(w, "m3", f, 48 * sizeof(float));
    uint64_t rng = 5;
    for (int i = 0; i < 64; i++) g_q_src[i] = em_test_randf(&rng);
    uint8_t q[2 * 34], h[16 * 2];
    OK(em_quantize(EM_TYPE_Q8_0, g_q_src, q, 64, E));
    OK(em_quantize(EM_TYPE_F16, f, h, 16, E));
    put(w, "q", q, sizeof q);
    put(w, "h", h, sizeof h);
    put(w, "v", f, 5 * sizeof(float));
    put(w, "v1", f, 5 * sizeof(float));
    put(w, "conv", f, 24 * sizeof(float));
    int64_t ids[8] = { 0 };
    put(w, "i", ids, sizeof ids);
    uint64_t b81;
    OK(em_type_row_bytes(EM_TYPE_Q8_1, 32, &b81, E));
    uint8_t z81[64] = { 0 };
    assert_true(b81 <= sizeof z81);
    put(w, "q81", z81, (size_t)b81);
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
    OK(em_gguf_open(&g_file, g_path, E));
    OK(em_arena_create(&g_store, 1u << 16, E));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    em_gguf_close(g_file);
    em_arena_free(g_store);
    return 0;
}

/* The message of a failed call holds the file and every needle. */
static void expect(int rc, int code, const em_err *err, const char *const *needles) {
    if (rc != code) fail_msg("got %d (%s), want %d", rc, err->msg, code);
    if (!strstr(err->msg, g_path)) fail_msg("message '%s' does not name the file", err->msg);
    for (int i = 0; needles[i]; i++)
        if (!strstr(err->msg, needles[i])) fail_msg("message '%s' lacks '%s'", err->msg, needles[i]);
}

#define NEEDLES(...) ((const char *const[]){ __VA_ARGS__, NULL })

/* ---- keys ---------------------------------------------------------------------------------- */

static void test_keys(void **state) {
    (void)state;
    em_wload L;
    em_wload_init(&L, g_file, g_store, NULL);
    assert_string_equal(L.path, g_path);
    em_err err = { 0 };
    int i = 0;
    OK(em_wload_int(&L, "t.i", true, 0, 0, 10, &i, E));
    assert_int_equal(i, 7);
    OK(em_wload_int(&L, "t.none", false, 42, 0, 10, &i, E)); /* a default is not range-checked */
    assert_int_equal(i, 42);
    expect(em_wload_int(&L, "t.none", true, 0, 0, 10, &i, &err), EM_ENOTFOUND, &err, NEEDLES("key t.none", "missing"));
    expect(em_wload_int(&L, "t.i", true, 0, 0, 6, &i, &err), EM_EFORMAT, &err, NEEDLES("t.i = 7", "[0, 6]"));
    expect(em_wload_int(&L, "t.neg", true, 0, 0, 6, &i, &err), EM_EFORMAT, &err, NEEDLES("t.neg = -3"));
    expect(em_wload_int(&L, "t.s", true, 0, 0, 6, &i, &err), EM_EFORMAT, &err, NEEDLES("t.s"));
    assert_int_equal(i, 42); /* untouched by the failures */
    double d = 0;
    float f = 0;
    OK(em_wload_float(&L, "t.f", true, 0, &d, E));
    assert_true(d == 0.5);
    OK(em_wload_f32(&L, "t.none", false, -INFINITY, &f, E));
    assert_true(isinf(f) && f < 0);
    expect(em_wload_float(&L, "t.nan", true, 0, &d, &err), EM_EFORMAT, &err, NEEDLES("t.nan", "not a usable number"));
    expect(em_wload_f32(&L, "t.big", true, 0, &f, &err), EM_EFORMAT, &err, NEEDLES("t.big", "not a usable number"));
    expect(em_wload_float(&L, "t.none", true, 0, &d, &err), EM_ENOTFOUND, &err, NEEDLES("key t.none"));
    bool b = false;
    OK(em_wload_bool(&L, "t.b", false, &b, E));
    assert_true(b);
    OK(em_wload_bool(&L, "t.none", true, &b, E));
    assert_true(b);
    assert_int_equal(em_wload_bool(&L, "t.i", true, &b, &err), EM_EFORMAT);
    char s[16] = "x";
    OK(em_wload_str(&L, "t.s", s, sizeof s, E));
    assert_string_equal(s, "hello");
    OK(em_wload_str(&L, "t.none", s, sizeof s, E));
    assert_string_equal(s, "");
    L.arch = "kimi-k3";
    assert_string_equal(em_wload_akey(&L, "block_count"), "kimi-k3.block_count");
}

/* ---- matrices and vectors ------------------------------------------------------------------ */

/* What a hook saw: each matrix's name, value when hooked, and where it lives. */
#define MAX_SEEN 256
typedef struct seen {
    int n;
    char names[MAX_SEEN][48];
    em_mat mats[MAX_SEEN];
    const em_mat *where[MAX_SEEN];
    int n_vecs;
    const float *vecs[MAX_SEEN];
    int64_t vec_n[MAX_SEEN];
    const char *refuse; /* refuse this tensor */
} seen;

static int record(void *ud, const char *name, em_mat *m, em_err *err) {
    seen *s = ud;
    if (s->refuse && !strcmp(name, s->refuse)) return em_err_set(err, EM_ENOMEM, "no device memory left");
    if (s->n >= MAX_SEEN) return em_err_set(err, EM_EOVERFLOW, "more than %d matrices", MAX_SEEN);
    snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    s->mats[s->n] = *m;
    s->where[s->n++] = m;
    return EM_OK;
}

static int record_vec(void *ud, const char *name, const float *v, int64_t n, em_err *err) {
    seen *s = ud;
    if (s->refuse && !strcmp(name, s->refuse)) return em_err_set(err, EM_ENOMEM, "no device memory left");
    if (s->n_vecs >= MAX_SEEN) return em_err_set(err, EM_EOVERFLOW, "more than %d vectors", MAX_SEEN);
    s->vec_n[s->n_vecs] = n;
    s->vecs[s->n_vecs++] = v;
    return EM_OK;
}

#define HOOK(s) (&(em_wload_hook){ .mat = record, .vec = record_vec, .ud = (s) })

static const void *tensor_data(const char *name) { return em_gguf_find_tensor(g_file, name)->data; }

static void test_matrices(void **state) {
    (void)state;
    static seen s;
    em_wload L;
    em_wload_init(&L, g_file, g_store, HOOK(&s));
    em_err err = { 0 };
    em_mat m2, m3, q, h, bad;
    OK(em_wload_mat(&L, "m2", 8, 3, 1, &m2, E));
    assert_int_equal(m2.rows, 3);
    assert_int_equal(m2.cols, 8);
    assert_ptr_equal(m2.data, tensor_data("m2")); /* a view into the mapping, not a copy */
    OK(em_wload_mat(&L, "m3", 8, 2, 3, &m3, E));
    assert_int_equal(m3.rows, 6);
    assert_ptr_equal(m3.data, tensor_data("m3"));
    expect(em_wload_mat(&L, "m2", 8, 4, 1, &bad, &err), EM_EFORMAT, &err, NEEDLES("tensor m2", "[8, 3]", "want [8, 4]"));
    expect(em_wload_mat(&L, "m3", 8, 6, 1, &bad, &err), EM_EFORMAT, &err, NEEDLES("[8, 2, 3]", "want [8, 6]"));
    expect(em_wload_mat(&L, "nope", 8, 3, 1, &bad, &err), EM_ENOTFOUND, &err, NEEDLES("tensor nope", "missing"));
    expect(em_wload_mat(&L, "i", 8, 1, 1, &bad, &err), EM_EUNSUPPORTED, &err, NEEDLES("tensor i", "cannot multiply"));
    /* Q8_0 becomes f32 (exact fp32 dots), in the store; F16 stays in the mapping */
    OK(em_wload_mat_float(&L, "q", 32, 2, &q, E));
    assert_int_equal(q.type, EM_TYPE_F32);
    assert_ptr_not_equal(q.data, tensor_data("q"));
    float want[64];
    OK(em_dequantize(EM_TYPE_Q8_0, tensor_data("q"), want, 64, E));
    assert_memory_equal(q.data, want, sizeof want);
    for (int i = 0; i < 64; i++) assert_true(fabsf(want[i] - g_q_src[i]) < 0.01f);
    OK(em_wload_mat_float(&L, "h", 8, 2, &h, E));
    assert_int_equal(h.type, EM_TYPE_F16);
    assert_ptr_equal(h.data, tensor_data("h"));
    /* the hook saw every matrix made, once, finished, in order; failures are not made */
    assert_int_equal(s.n, 4);
    assert_int_equal(L.n_mats, 4);
    const char *order[4] = { "m2", "m3", "q", "h" };
    const em_mat *made[4] = { &m2, &m3, &q, &h };
    uint64_t bytes = 0;
    for (int i = 0; i < 4; i++) {
        assert_string_equal(s.names[i], order[i]);
        assert_ptr_equal(s.where[i], made[i]);
        assert_memory_equal(&s.mats[i], made[i], sizeof(em_mat));
        bytes += made[i]->row_bytes * (uint64_t)made[i]->rows;
    }
    assert_int_equal(L.mat_bytes, bytes);
    /* a refusal (a device out of memory) fails the load, naming file and tensor */
    s.refuse = "m3";
    expect(em_wload_mat(&L, "m3", 8, 2, 3, &bad, &err), EM_ENOMEM, &err, NEEDLES("tensor m3", "no device memory left"));
}

static void test_vectors(void **state) {
    (void)state;
    static seen s;
    em_wload L;
    em_wload_init(&L, g_file, g_store, HOOK(&s));
    em_err err = { 0 };
    const float *v, *v1, *c, *none = (const float *)&err;
    OK(em_wload_vec(&L, "v", 5, 0, &v, E));
    OK(em_wload_vec(&L, "v1", 5, 0, &v1, E)); /* [5, 1]: a one-row Linear */
    for (int i = 0; i < 5; i++) assert_true(v[i] == (float)i && v1[i] == (float)i);
    assert_ptr_not_equal(v, tensor_data("v")); /* a copy in the store */
    OK(em_wload_vec(&L, "conv", 24, 4, &c, E));
    assert_true(c[23] == 23.0f);
    expect(em_wload_vec(&L, "conv", 24, 0, &c, &err), EM_EFORMAT, &err, NEEDLES("tensor conv", "[4, 6]", "one dimension"));
    expect(em_wload_vec(&L, "conv", 24, 6, &c, &err), EM_EFORMAT, &err, NEEDLES("ne[0] = 6"));
    expect(em_wload_vec(&L, "v", 6, 0, &c, &err), EM_EFORMAT, &err, NEEDLES("tensor v", "(5 values)", "want 6"));
    expect(em_wload_vec(&L, "q81", 32, 0, &c, &err), EM_EUNSUPPORTED, &err, NEEDLES("tensor q81", "q8_1", "cannot read"));
    expect(em_wload_vec(&L, "nope", 8, 0, &c, &err), EM_ENOTFOUND, &err, NEEDLES("tensor nope"));
    OK(em_wload_vec_opt(&L, "nope", 8, &none, E));
    assert_null(none);
    OK(em_wload_vec_opt(&L, "v", 5, &none, E));
    assert_true(none && none[4] == 4.0f);
    /* each vector made passed the hook once, as the values handed out; failures did not */
    assert_int_equal(s.n_vecs, 4);
    assert_int_equal(L.n_vecs, 4);
    const float *made[4] = { v, v1, c, none };
    for (int i = 0; i < 4; i++) assert_ptr_equal(s.vecs[i], made[i]);
    assert_int_equal(s.vec_n[2], 24);
    s.refuse = "v";
    expect(em_wload_vec(&L, "v", 5, 0, &c, &err), EM_ENOMEM, &err, NEEDLES("tensor v", "no device memory left"));
    expect(em_wload_readable(&L, "q81", EM_TYPE_Q8_1, &err), EM_EUNSUPPORTED, &err, NEEDLES("tensor q81", "q8_1"));
    OK(em_wload_readable(&L, "q", EM_TYPE_Q8_0, E));
    assert_true(em_wload_has(&L, "v") && !em_wload_has(&L, "nope"));
}

/* ---- every matrix of a real model passes the hook once -------------------------------------- */

/* Each nonempty matrix the forward pass can use. */
static int model_mats(const kimi_hparams *hp, const kimi_weights *w, const em_mat **out, int cap) {
    int n = 0;
#define TAKE(m) (void)((m).rows > 0 && n < cap && (out[n++] = &(m)))
    TAKE(w->tok_embd);
    TAKE(w->output);
    for (int l = 0; l < hp->n_layer; l++) {
        const kimi_layer *y = &w->layers[l];
        const kimi_kda_w *k = &y->kda;
        const kimi_mla_w *a = &y->mla;
        const kimi_ffn_w *f = &y->ffn;
        TAKE(k->q), TAKE(k->k), TAKE(k->v), TAKE(k->f_a), TAKE(k->f_b), TAKE(k->beta), TAKE(k->g_a), TAKE(k->g_b);
        TAKE(k->out), TAKE(k->g);
        TAKE(a->q), TAKE(a->q_a), TAKE(a->q_b), TAKE(a->kv_a), TAKE(a->k_b), TAKE(a->v_b), TAKE(a->out), TAKE(a->gate);
        TAKE(f->gate), TAKE(f->up), TAKE(f->down), TAKE(f->router), TAKE(f->gate_exps), TAKE(f->up_exps);
        TAKE(f->down_exps), TAKE(f->gate_sh), TAKE(f->up_sh), TAKE(f->down_sh), TAKE(f->routed_down);
        TAKE(f->routed_up);
    }
#undef TAKE
    return n;
}

/* Each vector the forward pass can use. */
static int model_vecs(const kimi_hparams *hp, const kimi_weights *w, const float **out, int cap) {
    int n = 0;
#define TAKE(v) (void)((v) && n < cap && (out[n++] = (v)))
    TAKE(w->output_norm), TAKE(w->output_res);
    for (int l = 0; l < hp->n_layer; l++) {
        const kimi_layer *y = &w->layers[l];
        const em_kda_params *p = &y->kda.p;
        TAKE(y->attn_norm), TAKE(y->ffn_norm), TAKE(y->attn_res), TAKE(y->ffn_res);
        TAKE(p->conv_q), TAKE(p->conv_k), TAKE(p->conv_v), TAKE(p->ssm_a), TAKE(p->dt_bias), TAKE(p->o_norm);
        TAKE(y->mla.q_a_norm), TAKE(y->mla.kv_a_norm), TAKE(y->ffn.router_bias), TAKE(y->ffn.routed_norm);
    }
#undef TAKE
    return n;
}

static void test_kimi_through_hook(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin) skip();
    char path[600];
    if (em_test_convert_fixture(bin, "kimi_a", "q8_0", path, sizeof path)) fail_msg("converting kimi_a");
    em_gguf *g;
    OK(em_gguf_open(&g, path, E));
    seen *s = calloc(1, sizeof *s);
    assert_non_null(s);
    kimi_hparams hp;
    kimi_weights w;
    OK(kimi_load(g, HOOK(s), &hp, &w, E));
    const em_mat *mats[MAX_SEEN];
    int n = model_mats(&hp, &w, mats, MAX_SEEN);
    assert_true(n > 20 && n < MAX_SEEN);
    assert_int_equal(s->n, n); /* as many hooked as the model holds: none twice, none left out */
    for (int i = 0; i < n; i++) {
        int hits = 0, at = -1;
        for (int j = 0; j < s->n; j++)
            if (s->where[j] == mats[i]) hits++, at = j;
        if (hits != 1) fail_msg("matrix %d of the model passed the hook %d times", i, hits);
        /* hooked finished: the value the forward pass uses (a Q8_0 router as its f32 copy) */
        assert_memory_equal(&s->mats[at], mats[i], sizeof(em_mat));
    }
    const float *vecs[MAX_SEEN];
    int n_vecs = model_vecs(&hp, &w, vecs, MAX_SEEN);
    assert_true(n_vecs > 10 && n_vecs < MAX_SEEN);
    assert_int_equal(s->n_vecs, n_vecs);
    for (int i = 0; i < n_vecs; i++) {
        int hits = 0;
        for (int j = 0; j < s->n_vecs; j++) hits += s->vecs[j] == vecs[i];
        if (hits != 1) fail_msg("vector %d of the model passed the hook %d times", i, hits);
    }
    int routers = 0;
    for (int l = 0; l < hp.n_layer; l++)
        if (w.layers[l].ffn.moe) assert_int_equal(w.layers[l].ffn.router.type, EM_TYPE_F32), routers++;
    assert_true(routers > 0);
    printf("  kimi_a q8_0: %d matrices and %d vectors through the hook, %d routers as f32\n", n, n_vecs, routers);
    kimi_unload(&hp, &w);
    em_gguf_close(g);
    free(s);
    /* a refused matrix fails kimi_load naming it, and frees what was loaded (ASan checks) */
    seen *no = calloc(1, sizeof *no);
    assert_non_null(no);
    no->refuse = "blk.3.ffn_up_exps.weight";
    OK(em_gguf_open(&g, path, E));
    em_err err = { 0 };
    assert_int_equal(kimi_load(g, HOOK(no), &hp, &w, &err), EM_ENOMEM);
    assert_non_null(strstr(err.msg, "blk.3.ffn_up_exps.weight"));
    assert_non_null(strstr(err.msg, "no device memory left"));
    assert_non_null(strstr(err.msg, path));
    em_gguf_close(g);
    free(no);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_matrices),
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_kimi_through_hook),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
