/* tests/cuda/test_gpu_target.c: the CUDA target (model/kimi_cuda.c) against the CPU target, the
 * reference (model/kimi.c), and against transformers' logits:
 *  - logits of the committed fixtures (kimi_a/b/c, kimi_b_bf16; converted by run.sh into
 *    MODELS_DIR) on cuda:0 against the CPU's and against transformers 5.17's fp32 references
 *    (tests/fixtures/ref/manifest.json): the GPU must be as close to transformers as the CPU
 *    is (F32: max |d| <= 1e-3 max |logit|, or twice the CPU's own error where that is larger);
 *    K3 files written by tests/compat/k3_synth.h (every K3 feature on; F32 and MXFP4 experts)
 *    against the CPU;
 *  - on the device: verify(n) rows memcmp-equal to n one-row steps (width invariance) for
 *    n = 1..16 and a wide verify of 20; verify(n) + commit(k) then one step equal to k + 1
 *    one-row steps for every 0 <= k <= n <= 16; argmax-only rows equal em_argmax of the
 *    logits; features against the CPU's;
 *  - bad input: a device that is not there, a model that does not fit (the device's memory
 *    taken first), AUTO falling back to the CPU then, SSD experts, route margins.
 * Needs a GPU. Usage (from the repository root): test_gpu_target MODELS_DIR
 * Prints one line per check; exit 1 when any failed, 2 when no GPU could be opened. */
#include "backend/gpu.h"
#include "model/model.h"
#include "sample/sample.h"

#include "../compat/k3_synth.h"

#include <jansson.h>
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXN 20 /* the widest verify checked (past max_verify 16) */

static const char *models_dir;

static em_target *open_on(const char *path, int device, const em_model_opts *base, em_err *err) {
    em_model_opts o = base ? *base : (em_model_opts){ 0 };
    o.device = device;
    o.cuda_index = 0;
    em_target *t = NULL;
    return em_model_open(&t, path, &o, err) ? NULL : t;
}

static double max_rel(const float *a, const float *b, int64_t n_rows, int64_t width) {
    double worst = 0.0;
    for (int64_t r = 0; r < n_rows; r++) {
        double d = 0.0, m = 1e-30;
        for (int64_t i = 0; i < width; i++) {
            d = fmax(d, fabs((double)a[r * width + i] - b[r * width + i]));
            m = fmax(m, fabs((double)b[r * width + i]));
        }
        worst = fmax(worst, d / m);
    }
    return worst;
}

static int argmax_agree(const float *a, const float *b, int n, int V) {
    int same = 0;
    for (int r = 0; r < n; r++) same += em_argmax(a + (int64_t)r * V, V) == em_argmax(b + (int64_t)r * V, V);
    return same;
}

/* ---- logits against the CPU and transformers ------------------------------------------------ */

static float *read_f32(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    float *v = xcalloc(n, sizeof *v);
    if (!f || fread(v, sizeof *v, n, f) != n) {
        if (f) fclose(f);
        free(v);
        return NULL;
    }
    fclose(f);
    return v;
}

/* logits of every row of tok on t (prefill), malloc'd; NULL with err on failure. */
static float *all_logits(em_target *t, const int32_t *tok, int n, em_err *err) {
    const int V = em_target_get_info(t)->n_vocab;
    float *lg = xcalloc((size_t)n * (size_t)V, sizeof *lg);
    em_target_reset(t);
    if (em_target_prefill(t, tok, n, &(em_rows){ .logits = lg }, err)) {
        free(lg);
        return NULL;
    }
    return lg;
}

static void check_fixture(json_t *manifest, const char *cfg, const char *type) {
    char path[1024], name[128];
    snprintf(path, sizeof path, "%s/%s_%s.gguf", models_dir, cfg, type);
    snprintf(name, sizeof name, "logits %s %s", cfg, type);
    em_err err = { 0 };
    em_target *c = open_on(path, EM_DEVICE_CPU, NULL, &err), *g = c ? open_on(path, EM_DEVICE_CUDA, NULL, &err) : NULL;
    if (!c || !g) {
        record(name, 0, "open: %s", err.msg);
        em_target_close(c);
        return;
    }
    const int V = em_target_get_info(c)->n_vocab;
    json_t *seqs = json_object_get(json_object_get(json_object_get(manifest, "configs"), cfg), "sequences");
    double worst_gc = 0.0, worst_gr = 0.0, worst_cr = 0.0;
    int agree = 0, rows = 0;
    bool ok = seqs != NULL;
    for (size_t s = 0; ok && s < json_array_size(seqs); s++) {
        json_t *seq = json_array_get(seqs, s), *jt = json_object_get(seq, "tokens");
        const int n = (int)json_array_size(jt);
        int32_t *tok = xcalloc((size_t)n, sizeof *tok);
        for (int i = 0; i < n; i++) tok[i] = (int32_t)json_integer_value(json_array_get(jt, (size_t)i));
        char rel[512];
        snprintf(rel, sizeof rel, "tests/fixtures/%s", json_string_value(json_object_get(seq, "logits_file")));
        float *ref = read_f32(rel, (size_t)n * (size_t)V);
        float *lc = all_logits(c, tok, n, &err), *lg = lc ? all_logits(g, tok, n, &err) : NULL;
        if (!ref || !lc || !lg) {
            ok = false;
            record(name, 0, "%s: %s", ref ? "prefill" : rel, ref ? err.msg : "cannot read the reference");
        } else {
            worst_gc = fmax(worst_gc, max_rel(lg, lc, n, V));
            worst_gr = fmax(worst_gr, max_rel(lg, ref, n, V));
            worst_cr = fmax(worst_cr, max_rel(lc, ref, n, V));
            agree += argmax_agree(lg, lc, n, V);
            rows += n;
        }
        free(tok), free(ref), free(lc), free(lg);
    }
    if (ok) {
        const bool f32 = !strcmp(type, "f32"), bf16 = !strcmp(type, "bf16");
        /* float weights: the GPU's own rounding only; Q8_0: an activation quant can flip */
        const double tol_gc = f32 ? 1e-4 : bf16 ? 1e-3 : 5e-2;
        const double tol_ref = fmax(f32 ? 1e-3 : bf16 ? 1e-2 : 1.0, 2.0 * worst_cr);
        record(name, worst_gc <= tol_gc && worst_gr <= tol_ref && (f32 || bf16 || agree * 10 >= rows * 9),
               "gpu-cpu %.2e (tol %.0e), gpu-ref %.2e, cpu-ref %.2e (tol %.2e), argmax gpu=cpu %d/%d", worst_gc,
               tol_gc, worst_gr, worst_cr, tol_ref, agree, rows);
    }
    em_target_close(g);
    em_target_close(c);
}

/* ---- decoding on the device ----------------------------------------------------------------- */

typedef struct dec {
    em_target *t;
    int V, P;
    int32_t tok[64];
    float *step;  /* [MAXN + 1][V]: one-row steps after the prompt */
    float *buf;   /* [MAXN][V] */
} dec;

static int prompt(dec *d, em_err *err) {
    em_target_reset(d->t);
    return em_target_prefill(d->t, d->tok, d->P, &(em_rows){ 0 }, err);
}

static int one_step(dec *d, int32_t tok, float *logits, em_err *err) {
    int rc = em_target_verify(d->t, &tok, 1, &(em_rows){ .logits = logits }, err);
    return rc ? rc : em_target_commit(d->t, 1, err);
}

static void check_decoding(const char *label, const char *path) {
    char name[160];
    em_err err = { 0 };
    dec d = { .P = 5 };
    d.t = open_on(path, EM_DEVICE_CUDA, NULL, &err);
    snprintf(name, sizeof name, "decode %s: open", label);
    if (!d.t) {
        record(name, 0, "%s", err.msg);
        return;
    }
    d.V = em_target_get_info(d.t)->n_vocab;
    uint64_t s = 7;
    for (int i = 0; i < 64; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        d.tok[i] = (int32_t)(s % (uint64_t)d.V);
    }
    d.step = xcalloc((size_t)(MAXN + 1) * (size_t)d.V, sizeof(float));
    d.buf = xcalloc((size_t)MAXN * (size_t)d.V, sizeof(float));
    int rc = prompt(&d, &err);
    for (int j = 0; !rc && j <= MAXN; j++) rc = one_step(&d, d.tok[d.P + j], d.step + (int64_t)j * d.V, &err);
    snprintf(name, sizeof name, "decode %s: one-row steps", label);
    if (rc) {
        record(name, 0, "%s", err.msg);
        goto done;
    }
    /* width invariance: verify(n) rows are the one-row steps' bits */
    int bad_w = 0, bad_k = 0, pairs = 0, bad_am = 0;
    const int widths[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, MAXN };
    for (size_t wi = 0; !rc && wi < sizeof widths / sizeof widths[0]; wi++) {
        const int n = widths[wi];
        int32_t am[MAXN];
        if ((rc = prompt(&d, &err)) ||
            (rc = em_target_verify(d.t, d.tok + d.P, n, &(em_rows){ .logits = d.buf, .argmax = am }, &err)))
            break;
        if (memcmp(d.buf, d.step, (size_t)n * (size_t)d.V * sizeof(float))) bad_w++;
        for (int j = 0; j < n; j++) bad_am += am[j] != em_argmax(d.step + (int64_t)j * d.V, d.V);
        /* verify(n) + commit(k), then one step: the (k + 1)-th one-row step's logits */
        for (int k = 0; !rc && k <= n; k += (n == MAXN ? 13 : 1)) {
            if (k > 0 || n > 1) {
                if ((rc = prompt(&d, &err)) || (rc = em_target_verify(d.t, d.tok + d.P, n, &(em_rows){ 0 }, &err)))
                    break;
            }
            if ((rc = em_target_commit(d.t, k, &err)) || (rc = one_step(&d, d.tok[d.P + k], d.buf, &err))) break;
            bad_k += memcmp(d.buf, d.step + (int64_t)k * d.V, (size_t)d.V * sizeof(float)) != 0;
            pairs++;
        }
    }
    snprintf(name, sizeof name, "decode %s: width invariance", label);
    record(name, !rc && bad_w == 0 && bad_am == 0, "%s%d of %zu widths differ (memcmp), %d argmaxes differ",
           rc ? err.msg : "", bad_w, sizeof widths / sizeof widths[0], bad_am);
    snprintf(name, sizeof name, "decode %s: verify+commit(k) == k steps", label);
    record(name, !rc && bad_k == 0, "%d of %d (n, k) pairs differ (memcmp of the next logits)", bad_k, pairs);
    const em_target_stats *st = &d.t->stats;
    snprintf(name, sizeof name, "decode %s: commit paths", label);
    record(name, st->fast_commits > 0 && st->full_replays > 0 && st->failed_fallbacks == 0,
           "%llu fast commits, %llu replays (the wide verifies)", (unsigned long long)st->fast_commits,
           (unsigned long long)st->full_replays);
done:
    free(d.step);
    free(d.buf);
    em_target_close(d.t);
}

/* Features (the residual after layers 0..2) and the last-row argmax of a prompt vs the CPU. */
static void check_features(const char *path) {
    const int layers[] = { 0, 1, 2 };
    const em_model_opts o = { .feature_layers = layers, .n_feature_layers = 3 };
    em_err err = { 0 };
    em_target *c = open_on(path, EM_DEVICE_CPU, &o, &err), *g = c ? open_on(path, EM_DEVICE_CUDA, &o, &err) : NULL;
    if (!g) {
        record("features kimi_a f32", 0, "%s", err.msg);
        em_target_close(c);
        return;
    }
    const int F = em_target_get_info(c)->n_feat, n = 21;
    int32_t tok[21], amc = -2, amg = -3;
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(i * 37 % em_target_get_info(c)->n_vocab);
    float *fc = xcalloc((size_t)n * (size_t)F, sizeof *fc), *fg = xcalloc((size_t)n * (size_t)F, sizeof *fg);
    int rc = em_target_prefill(c, tok, n, &(em_rows){ .features = fc, .argmax = &amc, .last_only = true }, &err);
    if (!rc) rc = em_target_prefill(g, tok, n, &(em_rows){ .features = fg, .argmax = &amg, .last_only = true }, &err);
    const double rel = rc ? 0 : max_rel(fg, fc, n, F);
    record("features kimi_a f32", !rc && rel <= 1e-4 && amc == amg, "%s rel %.2e (tol 1e-4), last argmax cpu %d gpu %d",
           rc ? err.msg : "", rel, amc, amg);

    /* with the last row's logits asked for too (a sampling loop's prefill): the features still come */
    float *lg = xcalloc((size_t)em_target_get_info(g)->n_vocab, sizeof *lg);
    memset(fg, 0, (size_t)n * (size_t)F * sizeof *fg);
    em_target_reset(g);
    if (!rc) rc = em_target_prefill(g, tok, n, &(em_rows){ .features = fg, .logits = lg, .last_only = true }, &err);
    const double rel2 = rc ? 0 : max_rel(fg, fc, n, F);
    record("features kimi_a f32, with logits", !rc && rel2 <= 1e-4, "%s rel %.2e (tol 1e-4)", rc ? err.msg : "", rel2);
    free(fc), free(fg), free(lg);
    em_target_close(g);
    em_target_close(c);
}

/* ---- wide prefill passes ----------------------------------------------------------------------- */

/* The target opened with EMBER_GPU_WIDE=wide (its prefills from that many rows on go wide). */
static em_target *open_wide(const char *path, const char *wide, const em_model_opts *o, em_err *err) {
    setenv("EMBER_GPU_WIDE", wide, 1);
    em_target *t = open_on(path, EM_DEVICE_CUDA, o, err);
    unsetenv("EMBER_GPU_WIDE");
    return t;
}

/* A prompt of N_WIDE rows through wide passes (two of EM_GPU_WIDE_MAX_ROWS rows, the second a
 * replay of the first's graph, then the rest) against narrow passes only: every row's logits,
 * the features of layers 0..2, and then three one-row steps (so the KDA states and the MLA cache
 * the prompt left) memcmp-equal. */
#define N_WIDE (2 * EM_GPU_WIDE_MAX_ROWS + 44)
static void check_wide(const char *label, const char *path) {
    char name[160];
    snprintf(name, sizeof name, "wide prefill %s", label);
    const int layers[] = { 0, 1, 2 };
    const em_model_opts o = { .feature_layers = layers, .n_feature_layers = 3, .n_ctx = 4096 };
    em_err err = { 0 };
    em_target *t[2] = { open_wide(path, "0", &o, &err), NULL };
    if (t[0]) t[1] = open_wide(path, "1", &o, &err);
    if (!t[1]) {
        record(name, 0, "open: %s", err.msg);
        em_target_close(t[0]);
        return;
    }
    const int V = em_target_get_info(t[0])->n_vocab, F = em_target_get_info(t[0])->n_feat;
    int32_t tok[N_WIDE];
    for (int i = 0; i < N_WIDE; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
    float *lg[2], *ft[2], *st[2];
    int rc = 0;
    for (int v = 0; v < 2; v++) {
        lg[v] = xcalloc((size_t)N_WIDE * (size_t)V, sizeof(float));
        ft[v] = xcalloc((size_t)N_WIDE * (size_t)F, sizeof(float));
        st[v] = xcalloc((size_t)3 * (size_t)V, sizeof(float));
        if (!rc) rc = em_target_prefill(t[v], tok, N_WIDE, &(em_rows){ .logits = lg[v], .features = ft[v] }, &err);
        for (int s = 0; s < 3 && !rc; s++) {
            int32_t next = (int32_t)em_argmax(s ? st[v] + (int64_t)(s - 1) * V : lg[v] + (int64_t)(N_WIDE - 1) * V, V);
            rc = em_target_verify(t[v], &next, 1, &(em_rows){ .logits = st[v] + (int64_t)s * V }, &err);
            if (!rc) rc = em_target_commit(t[v], 1, &err);
        }
    }
    const bool same_l = !rc && !memcmp(lg[0], lg[1], (size_t)N_WIDE * (size_t)V * sizeof(float));
    const bool same_f = !rc && !memcmp(ft[0], ft[1], (size_t)N_WIDE * (size_t)F * sizeof(float));
    const bool same_s = !rc && !memcmp(st[0], st[1], (size_t)3 * (size_t)V * sizeof(float));
    record(name, same_l && same_f && same_s, "%s logits of %d rows %s, features %s, 3 steps after %s", rc ? err.msg : "",
           N_WIDE, same_l ? "memcmp-equal to narrow passes'" : "DIFFER", same_f ? "equal" : "DIFFER",
           same_s ? "equal" : "DIFFER");
    for (int v = 0; v < 2; v++) free(lg[v]), free(ft[v]), free(st[v]), em_target_close(t[v]);
}

/* ---- K3 ---------------------------------------------------------------------------------------- */

static void k3_file(char *path, size_t cap, const char *name, const k3_synth_opts *o) {
    snprintf(path, cap, "%s/%s.gguf", models_dir, name);
    em_err err = { 0 };
    if (k3_synth_write(path, o, &err)) {
        fprintf(stderr, "k3_synth_write %s: %s\n", path, err.msg);
        exit(1);
    }
}

static void check_k3_logits(const char *label, const char *path) {
    char name[128];
    snprintf(name, sizeof name, "logits %s", label);
    em_err err = { 0 };
    em_target *c = open_on(path, EM_DEVICE_CPU, NULL, &err), *g = c ? open_on(path, EM_DEVICE_CUDA, NULL, &err) : NULL;
    if (!g) {
        record(name, 0, "%s", err.msg);
        em_target_close(c);
        return;
    }
    const int V = em_target_get_info(c)->n_vocab, n = 24;
    int32_t tok[24];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 53 + 11) % V);
    float *lc = all_logits(c, tok, n, &err), *lg = lc ? all_logits(g, tok, n, &err) : NULL;
    const double rel = lg ? max_rel(lg, lc, n, V) : 0;
    record(name, lg && rel <= 1e-4, "%s gpu-cpu %.2e (tol 1e-4), argmax %d/%d", lg ? "" : err.msg, rel,
           lg ? argmax_agree(lg, lc, n, V) : 0, n);
    free(lc), free(lg);
    em_target_close(g);
    em_target_close(c);
}

/* ---- routed experts in shares (--devices, model/kimi_cuda_ep.c) ------------------------------------ */

/* --devices cuda:0 (one share of every expert, combined; passes without graphs): the logits of
 * every row the same bits as the target's own experts. */
static void check_shares(const char *label, const char *path) {
    char name[128];
    snprintf(name, sizeof name, "--devices cuda:0 %s", label);
    em_err err = { 0 };
    static const int one[1] = { 0 };
    const em_model_opts shares = { .cuda_devices = one, .n_cuda_devices = 1 };
    em_target *g = open_on(path, EM_DEVICE_CUDA, NULL, &err), *s = g ? open_on(path, EM_DEVICE_CUDA, &shares, &err) : NULL;
    if (!s) {
        record(name, 0, "%s", err.msg);
        em_target_close(g);
        return;
    }
    const int V = em_target_get_info(g)->n_vocab, n = 24;
    int32_t tok[24];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 37 + 5) % V);
    float *lg = all_logits(g, tok, n, &err), *ls = lg ? all_logits(s, tok, n, &err) : NULL;
    record(name, ls && !memcmp(lg, ls, (size_t)n * V * sizeof *lg), "%s%d rows' logits memcmp-equal to --device cuda:0",
           ls ? "" : err.msg, n);
    free(lg), free(ls);
    em_target_close(s);
    em_target_close(g);
    /* the same device twice, and the CPU with --devices: refused */
    static const int twice[2] = { 0, 0 };
    em_model_opts o = { .device = EM_DEVICE_CUDA, .cuda_devices = twice, .n_cuda_devices = 2 };
    em_target *t = NULL;
    int rc = em_model_open(&t, path, &o, &err);
    snprintf(name, sizeof name, "error: --devices cuda:0,cuda:0 %s", label);
    record(name, rc == EM_EINVAL && strstr(err.msg, "listed twice") && !t, "%d: %s", rc, err.msg);
    o = (em_model_opts){ .device = EM_DEVICE_CPU, .cuda_devices = one, .n_cuda_devices = 1 };
    rc = em_model_open(&t, path, &o, &err);
    snprintf(name, sizeof name, "error: --devices with --device cpu %s", label);
    record(name, rc == EM_EINVAL && strstr(err.msg, "--device says cpu") && !t, "%d: %s", rc, err.msg);
}

/* ---- bad input --------------------------------------------------------------------------------- */

static void check_errors(const char *path) {
    em_err err = { 0 };
    em_model_opts o = { .device = EM_DEVICE_CUDA, .cuda_index = 7 };
    em_target *t = NULL;
    int rc = em_model_open(&t, path, &o, &err);
    record("error: no device cuda:7", rc == EM_ENOTFOUND && strstr(err.msg, "cuda:7"), "%d: %s", rc, err.msg);
    o = (em_model_opts){ .device = EM_DEVICE_CUDA, .moe_storage = EM_MOE_SSD };
    rc = em_model_open(&t, path, &o, &err);
    record("error: ssd experts on cuda", rc == EM_EUNSUPPORTED && strstr(err.msg, "ssd"), "%d: %s", rc, err.msg);
    t = open_on(path, EM_DEVICE_CUDA, NULL, &err);
    if (t) {
        float mg[64];
        int32_t tok = 1;
        rc = em_target_prefill(t, &tok, 1, &(em_rows){ .route_margins = mg }, &err);
        record("error: route margins on cuda", rc == EM_EUNSUPPORTED, "%d: %s", rc, err.msg);
        em_target_close(t);
    }
    /* a model that does not fit: the device's memory taken first */
    em_gpu *g = NULL;
    void *hog = NULL;
    uint64_t free_b = 0;
    if (em_gpu_open(0, &g, &err) || em_gpu_mem(g, &free_b, NULL, &err) ||
        em_gpu_alloc(g, free_b - (64ull << 20), "memory hog", &hog, &err)) {
        record("error: model does not fit", 0, "setup: %s", err.msg);
        em_gpu_close(g);
        return;
    }
    t = open_on(path, EM_DEVICE_CUDA, NULL, &err);
    record("error: model does not fit", !t && err.code == EM_ENOMEM && strstr(err.msg, "needs") && strstr(err.msg, "free"),
           "%s", err.msg);
    em_target_close(t);
    t = open_on(path, EM_DEVICE_AUTO, NULL, &err);
    record("auto: falls back to the cpu", t && !strcmp(em_target_get_info(t)->device, "cpu"), "%s",
           t ? em_target_get_info(t)->device : err.msg);
    em_target_close(t);
    em_gpu_free(g, hog);
    em_gpu_close(g);
    t = open_on(path, EM_DEVICE_AUTO, NULL, &err);
    record("auto: cuda:0 when it fits", t && !strncmp(em_target_get_info(t)->device, "cuda:0", 6), "%s",
           t ? em_target_get_info(t)->device : err.msg);
    em_target_close(t);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_gpu_target MODELS_DIR (run from the repository root)\n");
        return 2;
    }
    models_dir = argv[1];
    em_err err = { 0 };
    int n_dev = 0;
    if (em_gpu_device_count(&n_dev, &err) || n_dev == 0) {
        fprintf(stderr, "no GPU: %s\n", err.msg[0] ? err.msg : "0 devices");
        return 2;
    }
    json_error_t jerr;
    json_t *manifest = json_load_file("tests/fixtures/ref/manifest.json", 0, &jerr);
    if (!manifest) {
        fprintf(stderr, "tests/fixtures/ref/manifest.json: %s (run from the repository root)\n", jerr.text);
        return 2;
    }
    static const char *const fx[][2] = {
        { "kimi_a", "f32" }, { "kimi_a", "q8_0" }, { "kimi_b", "f32" }, { "kimi_b", "q8_0" },
        { "kimi_b_bf16", "bf16" }, { "kimi_c", "f32" }, { "kimi_c", "q8_0" },
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) check_fixture(manifest, fx[i][0], fx[i][1]);
    json_decref(manifest);
    char path[1024];
    snprintf(path, sizeof path, "%s/kimi_a_f32.gguf", models_dir);
    check_decoding("kimi_a f32", path);
    check_features(path);
    check_errors(path);
    snprintf(path, sizeof path, "%s/kimi_a_q8_0.gguf", models_dir);
    check_decoding("kimi_a q8_0", path);
    check_shares("kimi_a q8_0", path);
    check_wide("kimi_a q8_0", path);
    snprintf(path, sizeof path, "%s/kimi_b_f32.gguf", models_dir);
    check_wide("kimi_b f32", path);
    if (access("models/kimi-linear-19m-q8_0.gguf", R_OK) == 0) check_wide("19M default target", "models/kimi-linear-19m-q8_0.gguf");
    k3_synth_opts o = k3_synth_defaults();
    o.kda_head_dim = 32; /* the GPU's KDA takes head_dim 32, 64 or 128 */
    k3_file(path, sizeof path, "k3_gpu", &o);
    check_k3_logits("k3 (AttnRes, SiTU, latent MoE, gated MLA; f32)", path);
    check_shares("k3 latent MoE", path);
    check_decoding("k3 f32", path);
    o.exp_types[0][0] = o.exp_types[0][1] = o.exp_types[0][2] = EM_TYPE_MXFP4;
    o.n_exp_sets = 1;
    k3_file(path, sizeof path, "k3_gpu_mxfp4", &o);
    check_k3_logits("k3 mxfp4 experts", path);
    printf("%d checks, %d passed, %d failed\n", n_ok + n_fail, n_ok, n_fail);
    return n_fail ? 1 : 0;
}
