/* tests/cuda/test_gpu_ops.c: every GPU op of backend/gpu.h against its CPU twin (compute/,
 * quant/, sample/, model/ are the reference), on random inputs of Kimi-Linear-48B-A3B's real
 * shapes (hidden 2304, 32 KDA heads of 128, MLA rope 64, 256 experts top-8, expert ffn 1024,
 * vocabulary 163840), with stated tolerances; width invariance (rows of an n-row call
 * memcmp-equal to one-row calls, n = 1..16); poisoned outputs (every element written); graph
 * replay equal to plain launches; error paths. Then bandwidth of the products (median of
 * timed launches, CUDA events). Needs a GPU: built with the CUDA backend, not run by ctest (CI
 * has none); tests/cuda/run.sh runs it on the device machine. Prints one line per check and a
 * PASS/FAIL table last; exit status 1 when any check failed, 2 when no GPU could be opened.
 * Usage: test_gpu_ops [--device cuda:N] [--no-bench] [--moe-only] [--moe-wide]   (--moe-only: K3's row ops and
 * the MoE layers alone, no benchmarks, e.g. for a memcheck run within the device's time;
 * --moe-wide: the wide calls of the Q8_0 MoE layers alone, with the 48B shape's timing) */
#include "backend/gpu.h"
#include "compute/compute.h"
#include "model/kimi_impl.h"
#include "quant/quant.h"
#include "sample/sample.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kimi-Linear-48B-A3B */
#define HIDDEN 2304
#define KDA_HEADS 32
#define KDA_DIM 128
#define ROPE_DIMS 64
#define MLA_HEADS 32
#define MLA_QK 192 /* nope 128 + rope 64 per query head */
#define N_EXPERT 256
#define TOP_K 8
#define FFN_EXP 1024
#define VOCAB 163840
#define R EM_GPU_MAX_ROWS

static em_gpu *G;
static em_err E;

/* ---- results ----------------------------------------------------------------------------- */

#define MAX_RESULTS 384
static struct {
    char name[64];
    int ok;
    char detail[160];
} res[MAX_RESULTS];
static int n_res;

static void record(const char *name, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void record(const char *name, int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char d[160];
    vsnprintf(d, sizeof d, fmt, ap);
    va_end(ap);
    printf("%-4s %-34s %s\n", ok ? "ok" : "FAIL", name, d);
    fflush(stdout);
    if (n_res < MAX_RESULTS) {
        snprintf(res[n_res].name, sizeof res[n_res].name, "%s", name);
        snprintf(res[n_res].detail, sizeof res[n_res].detail, "%s", d);
        res[n_res++].ok = ok;
    }
}

/* A failed setup call: recorded as a failure with its message; the caller returns. */
#define TRY(name, call)                                                          \
    do {                                                                         \
        int rc_ = (call);                                                        \
        if (rc_) {                                                               \
            record(name, 0, "%s -> %s: %s", #call, em_status_name(rc_), E.msg); \
            return;                                                              \
        }                                                                        \
    } while (0)

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}
static float rndf(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rndf() * scale;
}
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
static void *dalloc(uint64_t bytes) {
    void *p = NULL;
    if (em_gpu_alloc(G, bytes, "test buffer", &p, &E)) {
        fprintf(stderr, "device allocation: %s\n", E.msg);
        exit(1);
    }
    return p;
}
static void up(void *d, const void *h, uint64_t n) {
    if (em_gpu_upload(G, d, h, n, &E)) {
        fprintf(stderr, "upload: %s\n", E.msg);
        exit(1);
    }
}
static int down(void *h, const void *d, uint64_t n) { return em_gpu_download(G, h, d, n, &E); }
/* Fills device memory with 0xff bytes: as floats NaN, as int32 -1 (poison). */
static void poison(void *d, uint64_t n) {
    if (em_gpu_memset(G, d, 0xff, n, &E)) {
        fprintf(stderr, "memset: %s\n", E.msg);
        exit(1);
    }
}
/* Elements of a host copy still holding the poison pattern. */
static int64_t unwritten(const void *h, int64_t n) {
    const uint32_t *u = h;
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += u[i] == 0xffffffffu;
    return c;
}

typedef struct cmp {
    double rel_l2, max_abs, max_ref;
    int64_t nan, identical, n;
} cmp;
static cmp compare(const float *got, const float *ref, int64_t n) {
    cmp c = { 0 };
    double num = 0, den = 0;
    c.n = n;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(ref[i])) c.nan++;
        if (memcmp(&got[i], &ref[i], 4) == 0) c.identical++;
        if (isnan(got[i]) || isnan(ref[i])) continue;
        const double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        if (fabs(d) > c.max_abs) c.max_abs = fabs(d);
        if (fabs(ref[i]) > c.max_ref) c.max_ref = fabs(ref[i]);
    }
    c.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    return c;
}
/* rel L2 <= tol_l2 and max |diff| <= tol_max * max |ref|, no NaN mismatch. */
static void record_cmp(const char *name, cmp c, double tol_l2, double tol_max) {
    const int ok = c.nan == 0 && c.rel_l2 <= tol_l2 && c.max_abs <= tol_max * (c.max_ref > 0 ? c.max_ref : 1);
    record(name, ok, "relL2 %.2e (<= %.0e) maxabs %.2e (<= %.0e x %.3g) identical %lld/%lld nan %lld", c.rel_l2, tol_l2,
           c.max_abs, tol_max, c.max_ref, (long long)c.identical, (long long)c.n, (long long)c.nan);
}

/* Random weights of type as GGUF bytes (values uniform in [-scale, scale), quantized by quant/). */
static void *make_weights(int type, int64_t rows, int64_t cols, float scale) {
    uint64_t rb = 0;
    em_type_row_bytes(type, (uint64_t)cols, &rb, NULL);
    uint8_t *w = xmalloc(rb * (uint64_t)rows);
    float *tmp = xmalloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        fill(tmp, cols, scale);
        em_quantize(type, tmp, w + (uint64_t)r * rb, cols, NULL);
    }
    free(tmp);
    return w;
}

/* ---- error paths -------------------------------------------------------------------------- */

static void test_errors(void) {
    int n = 0;
    em_gpu_device_count(&n, &E);
    em_gpu *g2 = NULL;
    int rc = em_gpu_open(n, &g2, &E);
    record("error: open cuda:<count>", rc == EM_ENOTFOUND && strstr(E.msg, "no CUDA device"), "%s: %s",
           em_status_name(rc), E.msg);
    rc = em_gpu_open(-1, &g2, &E);
    record("error: open cuda:-1", rc == EM_ENOTFOUND, "%s: %s", em_status_name(rc), E.msg);
    int idx = 0;
    rc = em_gpu_parse_device("cuda:x", &idx, &E);
    record("error: parse cuda:x", rc == EM_EINVAL && strstr(E.msg, "cuda:x"), "%s", E.msg);
    void *p = NULL;
    rc = em_gpu_alloc(G, 1ull << 50, "a 1 PiB test buffer", &p, &E);
    record("error: alloc 1 PiB", rc == EM_ENOMEM && strstr(E.msg, "needs") && strstr(E.msg, "free") && !p, "%s", E.msg);
    em_gpu_mat m;
    float dummy[256] = { 0 };
    rc = em_gpu_mat_upload(G, EM_TYPE_TQ1_0, 1, 256, dummy, "blk.0.ffn_down.weight", &m, &E);
    record("error: tq1_0 upload", rc == EM_EUNSUPPORTED && strstr(E.msg, "blk.0.ffn_down.weight") && strstr(E.msg, "tq1_0"),
           "%s", E.msg);
    em_gpu_act a = { .type = EM_TYPE_F32, .n = 17, .cols = 256, .x = (const float *)dummy, .ldx = 256 };
    rc = em_gpu_matmul(G, &m, &a, (float *)dummy, 256, &E);
    record("error: matmul without matrix", rc == EM_EINVAL, "%s", E.msg);
    /* the context still works after refused calls */
    rc = em_gpu_sync(G, &E);
    record("error: context usable after", rc == 0, "%s", rc ? E.msg : "sync ok");
}

/* ---- products ------------------------------------------------------------------------------ */

/* One type at one shape: 16 rows against quant/'s em_matmul (and, for float weights, against
 * a double-precision dot of the dequantized weights), then width invariance. */
static void test_matmul(int type, int64_t rows, int64_t cols) {
    char name[64];
    snprintf(name, sizeof name, "matmul %s %lldx%lld", em_type_name(type), (long long)rows, (long long)cols);
    void *hw = make_weights(type, rows, cols, 0.05f);
    float *x = xmalloc((size_t)R * cols * sizeof(float));
    fill(x, (int64_t)R * cols, 1.0f);
    float *ref = xmalloc((size_t)R * rows * sizeof(float)), *got = xmalloc((size_t)R * rows * sizeof(float));
    em_mat mat;
    TRY(name, em_mat_init(&mat, type, rows, cols, hw, &E));
    uint64_t ab = 0;
    TRY(name, em_act_bytes(type, cols, R, &ab, &E));
    void *buf = ab ? xmalloc(ab) : NULL;
    TRY(name, em_matmul(NULL, &mat, x, cols, R, ref, rows, buf, &E));
    free(buf);

    em_gpu_mat gm;
    TRY(name, em_gpu_mat_upload(G, type, rows, cols, hw, name, &gm, &E));
    float *dx = dalloc((uint64_t)R * cols * 4), *dy = dalloc((uint64_t)R * rows * 4);
    const uint64_t sb = em_gpu_act_bytes(type, cols, R);
    void *ds = sb ? dalloc(sb) : NULL;
    up(dx, x, (uint64_t)R * cols * 4);
    em_gpu_act act;
    poison(dy, (uint64_t)R * rows * 4);
    TRY(name, em_gpu_act_prepare(G, type, dx, cols, cols, R, ds, &act, &E));
    TRY(name, em_gpu_matmul(G, &gm, &act, dy, rows, &E));
    TRY(name, down(got, dy, (uint64_t)R * rows * 4));
    const int64_t unw = unwritten(got, (int64_t)R * rows);
    record_cmp(name, compare(got, ref, (int64_t)R * rows), 1e-5, 1e-4);
    if (unw) record(name, 0, "%lld outputs never written", (long long)unw);

    if (type != EM_TYPE_Q8_0) { /* float weights: against a float64 dot of the same numbers */
        float *wf = xmalloc((size_t)cols * sizeof(float));
        float *ref64 = xmalloc((size_t)R * rows * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            em_dequantize(type, (const uint8_t *)hw + (uint64_t)r * mat.row_bytes, wf, cols, NULL);
            for (int j = 0; j < R; j++) {
                double s = 0;
                for (int64_t i = 0; i < cols; i++) s += (double)wf[i] * x[(int64_t)j * cols + i];
                ref64[(int64_t)j * rows + r] = (float)s;
            }
        }
        char n2[80];
        snprintf(n2, sizeof n2, "%s vs f64", name);
        record_cmp(n2, compare(got, ref64, (int64_t)R * rows), 1e-5, 1e-4);
        free(wf);
        free(ref64);
    }

    /* width invariance: row j of every n-row call equals the one-row call on row j */
    float *one = xmalloc((size_t)R * rows * sizeof(float));
    for (int j = 0; j < R; j++) {
        poison(dy, (uint64_t)rows * 4);
        TRY(name, em_gpu_act_prepare(G, type, dx + (int64_t)j * cols, cols, cols, 1, ds, &act, &E));
        TRY(name, em_gpu_matmul(G, &gm, &act, dy, rows, &E));
        TRY(name, down(one + (int64_t)j * rows, dy, (uint64_t)rows * 4));
    }
    int64_t differ = 0, unw2 = 0;
    for (int n = 1; n <= R; n++) {
        poison(dy, (uint64_t)R * rows * 4);
        TRY(name, em_gpu_act_prepare(G, type, dx, cols, cols, n, ds, &act, &E));
        TRY(name, em_gpu_matmul(G, &gm, &act, dy, rows, &E));
        TRY(name, down(got, dy, (uint64_t)R * rows * 4));
        differ += memcmp(got, one, (size_t)n * rows * 4) != 0;
        unw2 += unwritten(got, (int64_t)n * rows);
        /* rows past n stay untouched (poisoned) */
        unw2 -= unwritten(got + (int64_t)n * rows, (int64_t)(R - n) * rows) - (int64_t)(R - n) * rows;
    }
    snprintf(name + strlen(name), sizeof name - strlen(name), " width");
    record(name, differ == 0 && unw2 == 0, "n=1..16 rows memcmp-equal to n=1: %s; unwritten/overwritten %lld",
           differ ? "NO" : "yes", (long long)unw2);
    free(one);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, ds);
    em_gpu_mat_free(G, &gm);
    free(hw), free(x), free(ref), free(got);
}

/* ---- activations made inside the product's blocks (em_gpu_act_in_block) -------------------- */

static void *random_qbytes(int type, int64_t rows, int64_t cols, uint64_t *bytes);

/* y = W a for n rows, a prepared by em_gpu_act_prepare from x (ldx), after glu(x, u) on the
 * device when u is set (act: SwiGLU, or SiTU with beta 2 and lin_beta 6). Returns 0 or -1. */
static int in_block_ref(const em_gpu_mat *gm, const float *dx, const float *du, int64_t ldx, int n, int act, float *dg,
                        void *ds, float *dy) {
    em_gpu_act a;
    const int64_t cols = gm->cols;
    const float *in = dx;
    if (du) {
        for (int j = 0; j < n; j++) {
            const float *g = dx + (int64_t)j * ldx, *u = du + (int64_t)j * ldx;
            float *y = dg + (int64_t)j * ldx;
            if (act == EM_GPU_ACT_SITU ? em_gpu_situ(G, g, u, cols, 2.0f, 6.0f, y, &E) : em_gpu_swiglu(G, g, u, cols, y, &E))
                return -1;
        }
        in = dg;
    }
    if (em_gpu_act_prepare(G, gm->type, in, ldx, cols, n, ds, &a, &E)) return -1;
    return em_gpu_matmul(G, gm, &a, dy, gm->rows, &E) ? -1 : 0;
}

/* Every n with n * cols <= EM_GPU_IN_BLOCK_MAX, the rows as they are and through SwiGLU and
 * SiTU, rows ldx = cols + 32 apart: memcmp-equal to the launches they replace. */
static void test_in_block(int type, int64_t rows, int64_t cols) {
    char name[80];
    snprintf(name, sizeof name, "matmul %s %lldx%lld in-block activations", em_type_name(type), (long long)rows,
             (long long)cols);
    uint64_t bytes = 0;
    void *hw = type == EM_TYPE_Q8_0 ? make_weights(type, rows, cols, 0.05f) : random_qbytes(type, rows, cols, &bytes);
    em_gpu_mat gm;
    TRY(name, em_gpu_mat_upload(G, type, rows, cols, hw, name, &gm, &E));
    const int64_t ldx = cols + 32, nx = (int64_t)R * ldx;
    float *x = xmalloc((size_t)nx * 4), *u = xmalloc((size_t)nx * 4);
    fill(x, nx, 2.0f), fill(u, nx, 2.0f);
    float *dx = dalloc((uint64_t)nx * 4), *du = dalloc((uint64_t)nx * 4), *dg = dalloc((uint64_t)nx * 4);
    float *dy = dalloc((uint64_t)R * rows * 4);
    void *ds = dalloc(em_gpu_act_bytes(type, cols, R));
    up(dx, x, (uint64_t)nx * 4), up(du, u, (uint64_t)nx * 4);
    float *ref = xmalloc((size_t)R * rows * 4), *got = xmalloc((size_t)R * rows * 4);
    int differ = 0, tried = 0;
    for (int glu = -1; glu <= EM_GPU_ACT_SITU; glu++) {
        for (int n = 1; n <= R && (int64_t)n * cols <= EM_GPU_IN_BLOCK_MAX; n++) {
            const float *dup = glu < 0 ? NULL : du;
            em_gpu_act a;
            if (!em_gpu_act_in_block(type, dx, dup, ldx, cols, n, glu < 0 ? 0 : glu, 2.0f, 6.0f, &a)) {
                record(name, 0, "em_gpu_act_in_block refused %d rows", n);
                continue;
            }
            TRY(name, in_block_ref(&gm, dx, dup, ldx, n, glu, dg, ds, dy) ? E.code : 0);
            TRY(name, down(ref, dy, (uint64_t)n * rows * 4));
            poison(dy, (uint64_t)R * rows * 4);
            TRY(name, em_gpu_matmul(G, &gm, &a, dy, rows, &E));
            TRY(name, down(got, dy, (uint64_t)n * rows * 4));
            differ += memcmp(got, ref, (size_t)n * rows * 4) != 0;
            tried++;
        }
    }
    record(name, differ == 0 && tried > 0, "%d calls (plain, SwiGLU, SiTU rows), %d not memcmp-equal to prepared rows",
           tried, differ);
    /* em_gpu_act_prepare_glu: the SwiGLU and SiTU rows quantized in one launch, every n */
    char gname[96];
    snprintf(gname, sizeof gname, "matmul %s %lldx%lld GLU activations in one launch", em_type_name(type), (long long)rows,
             (long long)cols);
    differ = tried = 0;
    for (int glu = EM_GPU_ACT_SWIGLU; glu <= EM_GPU_ACT_SITU; glu++)
        for (int n = 1; n <= R; n++) {
            em_gpu_act a;
            TRY(gname, in_block_ref(&gm, dx, du, ldx, n, glu, dg, ds, dy) ? E.code : 0);
            TRY(gname, down(ref, dy, (uint64_t)n * rows * 4));
            poison(dy, (uint64_t)R * rows * 4);
            TRY(gname, em_gpu_act_prepare_glu(G, type, dx, du, ldx, cols, n, glu, 2.0f, 6.0f, ds, &a, &E));
            TRY(gname, em_gpu_matmul(G, &gm, &a, dy, rows, &E));
            TRY(gname, down(got, dy, (uint64_t)n * rows * 4));
            differ += memcmp(got, ref, (size_t)n * rows * 4) != 0;
            tried++;
        }
    record(gname, differ == 0, "%d calls (SwiGLU, SiTU rows), %d not memcmp-equal to the activation's launch + "
           "em_gpu_act_prepare", tried, differ);
    em_gpu_act a;
    snprintf(name + strlen(name), sizeof name - strlen(name), " refused");
    record(name,
           !em_gpu_act_in_block(EM_TYPE_F32, dx, NULL, cols, cols, 1, 0, 0, 0, &a) &&
               !em_gpu_act_in_block(type, dx, NULL, EM_GPU_IN_BLOCK_MAX + 32, EM_GPU_IN_BLOCK_MAX + 32, 1, 0, 0, 0, &a) &&
               !em_gpu_act_in_block(type, dx, NULL, cols, cols + 16, 1, 0, 0, 0, &a) &&
               !em_gpu_act_in_block(type, dx, du, cols, cols, 1, EM_GPU_ACT_SITU, 0.0f, 0, &a),
           "F32 weights, too many values, columns not a multiple of 32, SiTU with beta 0");
    em_gpu_free(G, dx), em_gpu_free(G, du), em_gpu_free(G, dg), em_gpu_free(G, dy), em_gpu_free(G, ds);
    em_gpu_mat_free(G, &gm);
    free(hw), free(x), free(u), free(ref), free(got);
}

/* ---- quantized weight types (wt-cuda3): Q4_K, Q6_K, MXFP4 products; converted types ------- */

/* Random GGUF bytes of a block type (every quant bit pattern), with its scale fields set to
 * small positive values so that products stay finite: fp16 d (and dmin) for the K and IQ
 * types, an e8m0 exponent near 2^-5 for MXFP4. */
static void *random_qbytes(int type, int64_t rows, int64_t cols, uint64_t *bytes) {
    em_type_row_bytes(type, (uint64_t)cols, bytes, NULL);
    *bytes *= (uint64_t)rows;
    uint8_t *w = xmalloc(*bytes);
    for (uint64_t i = 0; i + 8 <= *bytes; i += 8) {
        const uint64_t v = rnd();
        memcpy(w + i, &v, 8);
    }
    for (uint64_t i = *bytes & ~(uint64_t)7; i < *bytes; i++) w[i] = (uint8_t)rnd();
    const em_type_info *ti = em_type_get(type);
    const uint64_t nb = *bytes / (uint64_t)ti->block_bytes;
    int d_at = 0, dmin_at = -1; /* byte offsets of the fp16 fields in a block */
    switch (type) {
    case EM_TYPE_Q4_K: case EM_TYPE_Q5_K: dmin_at = 2; break;
    case EM_TYPE_Q6_K: d_at = 208; break;
    case EM_TYPE_Q2_K: d_at = 80, dmin_at = 82; break;
    case EM_TYPE_Q3_K: d_at = 108; break;
    default: break;
    }
    for (uint64_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * (uint64_t)ti->block_bytes;
        if (type == EM_TYPE_MXFP4) {
            blk[0] = (uint8_t)(120 + rnd() % 6);
            continue;
        }
        const uint16_t d = em_fp32_to_fp16(0.0002f + 0.002f * (float)(rnd() % 1000) / 1000.0f);
        memcpy(blk + d_at, &d, 2);
        if (dmin_at >= 0) {
            const uint16_t m = em_fp32_to_fp16(0.0002f + 0.002f * (float)(rnd() % 1000) / 1000.0f);
            memcpy(blk + dmin_at, &m, 2);
        }
    }
    return w;
}

/* The exact reference of a GPU product with Q8_0 activations: double sums of quant/'s
 * dequantized weights times the dequantized Q8_0 activations (act = NULL: the floats x as
 * they are, for converted types). Every stride-th output row (the LM head's double sums are
 * many); skipped rows are left NaN. */
static void ref_f64(int type, const void *hw, int64_t rows, int64_t cols, const float *xa, int64_t stride, float *ref) {
    uint64_t rb = 0;
    em_type_row_bytes(type, (uint64_t)cols, &rb, NULL);
    float *wf = xmalloc((size_t)cols * 4);
    for (int64_t i = 0; i < (int64_t)R * rows; i++) ref[i] = NAN;
    for (int64_t r = 0; r < rows; r += stride) {
        em_dequantize(type, (const uint8_t *)hw + (uint64_t)r * rb, wf, cols, NULL);
        for (int j = 0; j < R; j++) {
            double s = 0;
            const float *x = xa + (int64_t)j * cols;
            for (int64_t i = 0; i < cols; i++) s += (double)wf[i] * x[i];
            ref[(int64_t)j * rows + r] = (float)s;
        }
    }
    free(wf);
}

/* got restricted to the rows ref has (the others NaN in ref) for compare(). */
static void mask_like(float *got, const float *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (isnan(ref[i])) got[i] = NAN;
}

/* One quantized type at one shape, from random GGUF bytes: 16 rows against the exact
 * reference (ref_f64) and against quant/'s em_matmul (Q8_K activations for the K types: a
 * different activation rounding, hence the looser bound), then width invariance. */
static void test_matmul_q(int type, int64_t rows, int64_t cols) {
    char name[64];
    snprintf(name, sizeof name, "matmul %s %lldx%lld", em_type_name(type), (long long)rows, (long long)cols);
    uint64_t bytes = 0;
    void *hw = random_qbytes(type, rows, cols, &bytes);
    const int dev = em_gpu_mat_dev_type(type), conv = dev != type;
    float *x = xmalloc((size_t)R * cols * 4), *xa = xmalloc((size_t)R * cols * 4);
    fill(x, (int64_t)R * cols, 1.0f);
    if (!conv) { /* the activations as the GPU quantizes them (bit-identical to em_quant_q8_0) */
        uint8_t *q = xmalloc((size_t)cols / 32 * 34);
        for (int j = 0; j < R; j++) {
            em_quantize(EM_TYPE_Q8_0, x + (int64_t)j * cols, q, cols, NULL);
            em_dequantize(EM_TYPE_Q8_0, q, xa + (int64_t)j * cols, cols, NULL);
        }
        free(q);
    } else {
        memcpy(xa, x, (size_t)R * cols * 4);
    }
    const int64_t stride = rows > 65536 ? 16 : 1;
    float *ref = xmalloc((size_t)R * rows * 4), *cpu = xmalloc((size_t)R * rows * 4), *got = xmalloc((size_t)R * rows * 4);
    ref_f64(type, hw, rows, cols, xa, stride, ref);
    em_mat mat;
    TRY(name, em_mat_init(&mat, type, rows, cols, hw, &E));
    uint64_t ab = 0;
    TRY(name, em_act_bytes(type, cols, R, &ab, &E));
    void *buf = ab ? xmalloc(ab) : NULL;
    TRY(name, em_matmul(NULL, &mat, x, cols, R, cpu, rows, buf, &E));
    free(buf);

    em_gpu_mat gm;
    TRY(name, em_gpu_mat_upload(G, type, rows, cols, hw, name, &gm, &E));
    record(name, gm.type == dev && gm.src_type == type, "device layout %s (from %s), %.1f MB", em_type_name(gm.type),
           em_type_name(gm.src_type), gm.bytes / 1e6);
    float *dx = dalloc((uint64_t)R * cols * 4), *dy = dalloc((uint64_t)R * rows * 4);
    const uint64_t sb = em_gpu_act_bytes(dev, cols, R);
    void *ds = sb ? dalloc(sb) : NULL;
    up(dx, x, (uint64_t)R * cols * 4);
    em_gpu_act act;
    poison(dy, (uint64_t)R * rows * 4);
    TRY(name, em_gpu_act_prepare(G, dev, dx, cols, cols, R, ds, &act, &E));
    TRY(name, em_gpu_matmul(G, &gm, &act, dy, rows, &E));
    TRY(name, down(got, dy, (uint64_t)R * rows * 4));
    const int64_t unw = unwritten(got, (int64_t)R * rows);
    if (unw) record(name, 0, "%lld outputs never written", (long long)unw);
    /* the same activation numbers as the CPU product only for MXFP4 (Q8_0 both); the K types'
     * CPU products quantize activations to Q8_K, Q4_0's to Q8_0 (the GPU's converted F32 rows
     * take them as floats) */
    const int same_act = type == EM_TYPE_MXFP4;
    char n2[96];
    snprintf(n2, sizeof n2, "%s vs cpu em_matmul", name);
    record_cmp(n2, compare(got, cpu, (int64_t)R * rows), same_act ? 1e-5 : 2e-2, same_act ? 1e-4 : 3e-2);
    mask_like(got, ref, (int64_t)R * rows);
    snprintf(n2, sizeof n2, "%s vs f64%s", name, stride > 1 ? " (1/16 rows)" : "");
    record_cmp(n2, compare(got, ref, (int64_t)R * rows), 1e-5, 1e-4);

    float *one = xmalloc((size_t)R * rows * 4);
    for (int j = 0; j < R; j++) {
        poison(dy, (uint64_t)rows * 4);
        TRY(name, em_gpu_act_prepare(G, dev, dx + (int64_t)j * cols, cols, cols, 1, ds, &act, &E));
        TRY(name, em_gpu_matmul(G, &gm, &act, dy, rows, &E));
        TRY(name, down(one + (int64_t)j * rows, dy, (uint64_t)rows * 4));
    }
    int64_t differ = 0, unw2 = 0;
    for (int n = 1; n <= R; n++) {
        poison(dy, (uint64_t)R * rows * 4);
        TRY(name, em_gpu_act_prepare(G, dev, dx, cols, cols, n, ds, &act, &E));
        TRY(name, em_gpu_matmul(G, &gm, &act, dy, rows, &E));
        TRY(name, down(got, dy, (uint64_t)R * rows * 4));
        differ += memcmp(got, one, (size_t)n * rows * 4) != 0;
        unw2 += unwritten(got, (int64_t)n * rows);
        unw2 -= unwritten(got + (int64_t)n * rows, (int64_t)(R - n) * rows) - (int64_t)(R - n) * rows;
    }
    snprintf(name + strlen(name), sizeof name - strlen(name), " width");
    record(name, differ == 0 && unw2 == 0, "n=1..16 rows memcmp-equal to n=1: %s; unwritten/overwritten %lld",
           differ ? "NO" : "yes", (long long)unw2);
    free(one);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, ds);
    em_gpu_mat_free(G, &gm);
    free(hw), free(x), free(xa), free(ref), free(cpu), free(got);
}

static void test_embed(int type, int64_t vocab);

static void test_quant_types(void) {
    const int fast[] = { EM_TYPE_Q4_K, EM_TYPE_Q6_K, EM_TYPE_MXFP4 };
    for (int t = 0; t < 3; t++) {
        test_matmul_q(fast[t], FFN_EXP, HIDDEN);             /* an expert's gate / up */
        test_matmul_q(fast[t], HIDDEN, FFN_EXP);             /* an expert's down */
        test_matmul_q(fast[t], KDA_HEADS * KDA_DIM, HIDDEN); /* a KDA q / k / v projection */
        test_matmul_q(fast[t], 1001, 512);                   /* rows not a multiple of a warp's 4 outputs */
        test_matmul_q(fast[t], VOCAB, HIDDEN);               /* the LM head */
    }
    /* types without a GPU kernel: converted to F32 at upload, then the F32 product */
    test_matmul_q(EM_TYPE_Q5_K, FFN_EXP, HIDDEN);
    test_matmul_q(EM_TYPE_Q2_K, HIDDEN, FFN_EXP);
    test_matmul_q(EM_TYPE_IQ4_XS, FFN_EXP, HIDDEN);
    test_matmul_q(EM_TYPE_Q4_0, FFN_EXP, HIDDEN);
    test_embed(EM_TYPE_Q4_K, 1024);
    test_embed(EM_TYPE_Q6_K, 1024);
    test_embed(EM_TYPE_MXFP4, 1024);
    test_embed(EM_TYPE_Q5_K, 1024); /* converted */
}

/* ---- end of quantized weight types ------------------------------------------------------ */

/* ---- row ops ----------------------------------------------------------------------------- */

static void test_rmsnorm(const char *name, int rows, int64_t n) {
    float *x = xmalloc((size_t)rows * n * 4), *w = xmalloc((size_t)n * 4), *ref = xmalloc((size_t)rows * n * 4),
          *got = xmalloc((size_t)rows * n * 4);
    fill(x, (int64_t)rows * n, 3.0f);
    fill(w, n, 1.0f);
    em_rmsnorm_rows(x, n, w, 1e-5f, rows, n, ref, n);
    float *dx = dalloc((uint64_t)rows * n * 4), *dw = dalloc((uint64_t)n * 4), *dy = dalloc((uint64_t)rows * n * 4);
    up(dx, x, (uint64_t)rows * n * 4);
    up(dw, w, (uint64_t)n * 4);
    poison(dy, (uint64_t)rows * n * 4);
    TRY(name, em_gpu_rmsnorm_rows(G, dx, n, dw, 1e-5f, rows, n, dy, n, &E));
    TRY(name, down(got, dy, (uint64_t)rows * n * 4));
    cmp c = compare(got, ref, (int64_t)rows * n);
    record_cmp(name, c, 1e-6, 1e-6);
    em_gpu_free(G, dx), em_gpu_free(G, dw), em_gpu_free(G, dy);
    free(x), free(w), free(ref), free(got);
}

static void test_elementwise(void) {
    const int64_t n = (int64_t)R * TOP_K * FFN_EXP; /* the routed experts' gate/up rows of a 16-row verify */
    float *g = xmalloc((size_t)n * 4), *u = xmalloc((size_t)n * 4), *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4);
    fill(g, n, 8.0f);
    fill(u, n, 2.0f);
    float *dg = dalloc((uint64_t)n * 4), *du = dalloc((uint64_t)n * 4), *dy = dalloc((uint64_t)n * 4);
    up(dg, g, (uint64_t)n * 4);
    up(du, u, (uint64_t)n * 4);
    em_swiglu(g, u, n, ref);
    poison(dy, (uint64_t)n * 4);
    TRY("swiglu", em_gpu_swiglu(G, dg, du, n, dy, &E));
    TRY("swiglu", down(got, dy, (uint64_t)n * 4));
    record_cmp("swiglu 16x8x1024", compare(got, ref, n), 1e-6, 1e-6);
    for (int64_t i = 0; i < n; i++) ref[i] = g[i] + u[i];
    poison(dy, (uint64_t)n * 4);
    TRY("add", em_gpu_add(G, dg, du, n, dy, &E));
    TRY("add", down(got, dy, (uint64_t)n * 4));
    cmp c = compare(got, ref, n);
    record("add 16x8x1024", c.identical == n, "bit-identical %lld/%lld", (long long)c.identical, (long long)n);
    em_gpu_free(G, dg), em_gpu_free(G, du), em_gpu_free(G, dy);
    free(g), free(u), free(ref), free(got);
}

static void test_embed(int type, int64_t vocab) {
    char name[64];
    snprintf(name, sizeof name, "embed %s %lldx%d", em_type_name(type), (long long)vocab, HIDDEN);
    void *hw = make_weights(type, vocab, HIDDEN, 1.0f);
    uint64_t rb = 0;
    em_type_row_bytes(type, HIDDEN, &rb, NULL);
    int32_t tok[R];
    for (int j = 0; j < R; j++) tok[j] = (int32_t)(rnd() % (uint64_t)vocab);
    tok[0] = 0, tok[1] = (int32_t)vocab - 1, tok[5] = -1, tok[9] = (int32_t)vocab; /* ends, and two bad ids */
    float *ref = xmalloc((size_t)R * HIDDEN * 4), *got = xmalloc((size_t)R * HIDDEN * 4);
    for (int j = 0; j < R; j++) {
        if (tok[j] < 0 || tok[j] >= vocab)
            for (int i = 0; i < HIDDEN; i++) ref[j * HIDDEN + i] = NAN;
        else
            em_dequantize(type, (const uint8_t *)hw + (uint64_t)tok[j] * rb, ref + j * HIDDEN, HIDDEN, NULL);
    }
    em_gpu_mat t;
    TRY(name, em_gpu_mat_upload(G, type, vocab, HIDDEN, hw, "token_embd.weight", &t, &E));
    int32_t *dt = dalloc(sizeof tok);
    float *dy = dalloc((uint64_t)R * HIDDEN * 4);
    up(dt, tok, sizeof tok);
    poison(dy, (uint64_t)R * HIDDEN * 4);
    TRY(name, em_gpu_embed(G, &t, dt, R, dy, HIDDEN, &E));
    TRY(name, down(got, dy, (uint64_t)R * HIDDEN * 4));
    int64_t same = 0;
    for (int64_t i = 0; i < (int64_t)R * HIDDEN; i++)
        same += (isnan(ref[i]) && isnan(got[i])) || memcmp(&ref[i], &got[i], 4) == 0;
    record(name, same == (int64_t)R * HIDDEN, "bit-identical to em_dequantize (bad ids NaN) %lld/%lld", (long long)same,
           (long long)R * HIDDEN);
    em_gpu_mat_free(G, &t);
    em_gpu_free(G, dt), em_gpu_free(G, dy);
    free(hw), free(ref), free(got);
}

static void test_argmax(void) {
    const int64_t n = VOCAB;
    float *x = xmalloc((size_t)R * n * 4);
    fill(x, (int64_t)R * n, 10.0f);
    /* planted: ties (the lower index must win), NaNs, a row of NaN, a max at the last index */
    x[0 * n + 777] = 50.0f, x[0 * n + 70000] = 50.0f;
    x[1 * n + 5] = NAN, x[1 * n + 6] = 60.0f, x[1 * n + 3] = NAN;
    for (int64_t i = 0; i < n; i++) x[2 * n + i] = NAN;
    x[3 * n + n - 1] = 99.0f;
    x[4 * n + 0] = 99.0f, x[4 * n + 1024] = 99.0f; /* same thread of the reduction */
    for (int64_t i = 0; i < n; i++) x[5 * n + i] = 1.0f; /* all equal: 0 */
    int32_t ref[R], got[R];
    for (int j = 0; j < R; j++) ref[j] = em_argmax(x + (int64_t)j * n, (int32_t)n);
    float *dx = dalloc((uint64_t)R * n * 4);
    int32_t *dout = dalloc(sizeof got);
    up(dx, x, (uint64_t)R * n * 4);
    poison(dout, sizeof got);
    TRY("argmax", em_gpu_argmax_rows(G, dx, n, R, n, dout, &E));
    TRY("argmax", down(got, dout, sizeof got));
    int same = 0;
    for (int j = 0; j < R; j++) same += got[j] == ref[j];
    record("argmax 16x163840", same == R, "equal to em_argmax %d/16 (ties, NaN, all-NaN -> %d)", same, got[2]);
    em_gpu_free(G, dx), em_gpu_free(G, dout);
    free(x);
}

static void test_rope(void) {
    em_rope_params p = { .dims = ROPE_DIMS, .theta = 50000.0, .scaling = EM_ROPE_NONE };
    em_rope rp;
    TRY("rope", em_rope_init(&rp, &p, &E));
    const int64_t ld = (int64_t)MLA_HEADS * MLA_QK;
    float *x = xmalloc((size_t)R * ld * 4), *ref = xmalloc((size_t)R * ld * 4), *got = xmalloc((size_t)R * ld * 4);
    fill(x, (int64_t)R * ld, 2.0f);
    memcpy(ref, x, (size_t)R * ld * 4);
    int32_t pos[R];
    for (int j = 0; j < R; j++) pos[j] = j < 8 ? j : (int32_t)(rnd() % 1000000);
    float cs[EM_ROPE_MAX_DIMS / 2], sn[EM_ROPE_MAX_DIMS / 2];
    for (int j = 0; j < R; j++) { /* the rope part of each query head: values 128..191 */
        em_rope_cos_sin(&rp, pos[j], cs, sn);
        em_rope_apply(ref + j * ld + 128, MLA_HEADS, MLA_QK, ROPE_DIMS, cs, sn);
    }
    float *dx = dalloc((uint64_t)R * ld * 4);
    int32_t *dp = dalloc(sizeof pos);
    double *df = dalloc(sizeof(double) * (ROPE_DIMS / 2));
    up(dx, x, (uint64_t)R * ld * 4);
    up(dp, pos, sizeof pos);
    up(df, rp.inv_freq, sizeof(double) * (ROPE_DIMS / 2));
    TRY("rope", em_gpu_rope_rows(G, dx + 128, ld, R, MLA_HEADS, MLA_QK, ROPE_DIMS, dp, df, rp.attn_factor, &E));
    TRY("rope", down(got, dx, (uint64_t)R * ld * 4));
    record_cmp("rope 16x32 heads, 64 of 192", compare(got, ref, (int64_t)R * ld), 1e-7, 1e-6);
    em_gpu_free(G, dx), em_gpu_free(G, dp), em_gpu_free(G, df);
    free(x), free(ref), free(got);
}

/* The router against kimi_moe_route: X experts top-K (X need not be a multiple of 32), with
 * groups, and (ties) logits on a coarse grid so that many choices are equal (the lower index
 * wins). */
static void test_route(int X, int K, int n_group, int n_group_used, bool ties) {
    char name[96];
    snprintf(name, sizeof name, "router %d top-%d groups %d/%d%s", X, K, n_group, n_group_used, ties ? " ties" : "");
    kimi_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_expert = X, hp.n_expert_used = K, hp.n_group = n_group, hp.n_group_used = n_group_used;
    hp.expert_norm = true, hp.expert_scale = 2.446f;
    float *lg = xmalloc((size_t)R * X * 4), *bias = xmalloc((size_t)X * 4);
    fill(lg, (int64_t)R * X, 4.0f);
    fill(bias, X, 0.5f);
    if (ties) {
        for (int64_t i = 0; i < (int64_t)R * X; i++) lg[i] = floorf(lg[i]);
        for (int i = 0; i < X; i++) bias[i] = 0.0f;
    }
    int *ref_ids = xmalloc((size_t)R * K * sizeof(int));
    float *ref_w = xmalloc((size_t)R * K * 4), margin, *scratch = xmalloc(((size_t)3 * X + 64) * 4);
    for (int j = 0; j < R; j++) kimi_moe_route(&hp, lg + (int64_t)j * X, bias, ref_ids + j * K, ref_w + j * K, &margin, scratch);
    const uint64_t wb = (uint64_t)R * K * 4;
    float *dl = dalloc((uint64_t)R * X * 4), *db = dalloc((uint64_t)X * 4), *dw = dalloc(wb);
    int32_t *di = dalloc(wb);
    up(dl, lg, (uint64_t)R * X * 4);
    up(db, bias, (uint64_t)X * 4);
    poison(dw, wb), poison(di, wb);
    em_gpu_router r = { .n_expert = X, .k = K, .n_group = n_group, .n_group_used = n_group_used, .norm = true,
                        .scale = 2.446f };
    TRY(name, em_gpu_route(G, &r, dl, X, db, R, di, dw, &E));
    int32_t *ids = xmalloc(wb);
    float *w = xmalloc(wb);
    TRY(name, down(ids, di, wb));
    TRY(name, down(w, dw, wb));
    int same = 0;
    for (int i = 0; i < R * K; i++) same += ids[i] == ref_ids[i];
    cmp c = compare(w, ref_w, (int64_t)R * K);
    record(name, same == R * K && c.rel_l2 <= 1e-6 && c.nan == 0,
           "ids equal to kimi_moe_route %d/%d; weights relL2 %.2e (<= 1e-6), identical %lld", same, R * K, c.rel_l2,
           (long long)c.identical);
    em_gpu_free(G, dl), em_gpu_free(G, db), em_gpu_free(G, dw), em_gpu_free(G, di);
    free(lg), free(bias), free(scratch), free(ref_ids), free(ref_w), free(ids), free(w);
}

/* ---- K3's row ops: SiTU, the sigmoid output gate, the AttnRes mix ------------------------ */

static void test_situ(float beta, float lin_beta) {
    char name[64];
    snprintf(name, sizeof name, "situ 16x8x1024 beta %g lin %g", (double)beta, (double)lin_beta);
    const int64_t n = (int64_t)R * TOP_K * FFN_EXP;
    float *g = xmalloc((size_t)n * 4), *u = xmalloc((size_t)n * 4), *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4);
    fill(g, n, 8.0f);
    fill(u, n, 12.0f);
    em_situ(g, u, beta, lin_beta, n, ref);
    float *dg = dalloc((uint64_t)n * 4), *du = dalloc((uint64_t)n * 4), *dy = dalloc((uint64_t)n * 4);
    up(dg, g, (uint64_t)n * 4), up(du, u, (uint64_t)n * 4);
    poison(dy, (uint64_t)n * 4);
    TRY(name, em_gpu_situ(G, dg, du, n, beta, lin_beta, dy, &E));
    TRY(name, down(got, dy, (uint64_t)n * 4));
    record_cmp(name, compare(got, ref, n), 1e-6, 2e-6);
    /* in place over up (y aliases up) */
    TRY(name, em_gpu_situ(G, dg, du, n, beta, lin_beta, du, &E));
    TRY(name, down(got, du, (uint64_t)n * 4));
    snprintf(name + strlen(name), sizeof name - strlen(name), " in place");
    record_cmp(name, compare(got, ref, n), 1e-6, 2e-6);
    em_gpu_free(G, dg), em_gpu_free(G, du), em_gpu_free(G, dy);
    free(g), free(u), free(ref), free(got);
}

static void test_sigmoid_mul(void) {
    const int64_t n = (int64_t)R * MLA_HEADS * 128; /* K3's gated MLA output rows */
    float *x = xmalloc((size_t)n * 4), *g = xmalloc((size_t)n * 4), *ref = xmalloc((size_t)n * 4), *got = xmalloc((size_t)n * 4);
    fill(x, n, 3.0f);
    fill(g, n, 10.0f);
    for (int64_t i = 0; i < n; i++) ref[i] = x[i] * em_sigmoidf(g[i]);
    float *dx = dalloc((uint64_t)n * 4), *dg = dalloc((uint64_t)n * 4);
    up(dx, x, (uint64_t)n * 4), up(dg, g, (uint64_t)n * 4);
    TRY("sigmoid_mul", em_gpu_sigmoid_mul(G, dx, dg, n, &E));
    TRY("sigmoid_mul", down(got, dx, (uint64_t)n * 4));
    record_cmp("sigmoid_mul 16x32x128", compare(got, ref, n), 1e-6, 1e-6);
    em_gpu_free(G, dx), em_gpu_free(G, dg);
    free(x), free(g), free(ref), free(got);
}

/* em_gpu_res_mix against model/attnres.c's kimi_res_input, nb banks of 16 rows of 2304 (the
 * banks scaled differently so that the softmax is not flat), then row 5 alone (width) and the
 * output over x in place. */
static void test_res_mix(int nb) {
    char name[64];
    snprintf(name, sizeof name, "res_mix 16x2304, %d banks", nb);
    const int64_t Ed = HIDDEN, ld = (int64_t)R * Ed;
    const float eps = 1e-6f;
    float *bank = xmalloc((size_t)(nb ? nb : 1) * ld * 4), *x = xmalloc((size_t)ld * 4), *w = xmalloc((size_t)Ed * 4);
    float *mix = xmalloc((size_t)ld * 4), *p = xmalloc((size_t)(nb + 1) * 4), *got = xmalloc((size_t)ld * 4);
    for (int j = 0; j < nb; j++) fill(bank + j * ld, ld, 0.5f + (float)j);
    fill(x, ld, 2.0f);
    fill(w, Ed, 1.0f);
    for (int64_t d = 0; d < Ed; d++) w[d] += 0.3f; /* scores of both signs, far apart */
    kimi_resbank b = { .block = 1, .n_bank = nb, .n = R, .E = Ed, .eps = eps, .rows = bank, .mix = mix, .p = p };
    const float *ref = kimi_res_input(&b, x, w, 0, R);
    float *dbank = dalloc((uint64_t)(nb ? nb : 1) * ld * 4), *dx = dalloc((uint64_t)ld * 4), *dw = dalloc((uint64_t)Ed * 4);
    float *dout = dalloc((uint64_t)ld * 4);
    if (nb) up(dbank, bank, (uint64_t)nb * ld * 4);
    up(dx, x, (uint64_t)ld * 4), up(dw, w, (uint64_t)Ed * 4);
    poison(dout, (uint64_t)ld * 4);
    TRY(name, em_gpu_res_mix(G, dbank, nb, ld, dx, Ed, dw, Ed, eps, R, dout, Ed, &E));
    TRY(name, down(got, dout, (uint64_t)ld * 4));
    record_cmp(name, compare(got, ref, ld), 1e-6, 1e-6);
    /* row 5 alone: the same bits */
    float *one = xmalloc((size_t)Ed * 4);
    poison(dout, (uint64_t)Ed * 4);
    TRY(name, em_gpu_res_mix(G, dbank + 5 * Ed, nb, ld, dx + 5 * Ed, Ed, dw, Ed, eps, 1, dout, Ed, &E));
    TRY(name, down(one, dout, (uint64_t)Ed * 4));
    /* in place over x */
    TRY(name, em_gpu_res_mix(G, dbank, nb, ld, dx, Ed, dw, Ed, eps, R, dx, Ed, &E));
    float *inpl = xmalloc((size_t)ld * 4);
    TRY(name, down(inpl, dx, (uint64_t)ld * 4));
    snprintf(name + strlen(name), sizeof name - strlen(name), " width");
    record(name, memcmp(one, got + 5 * Ed, (size_t)Ed * 4) == 0 && memcmp(inpl, got, (size_t)ld * 4) == 0,
           "row 5 alone and out = x in place memcmp-equal to the 16-row call");
    em_gpu_free(G, dbank), em_gpu_free(G, dx), em_gpu_free(G, dw), em_gpu_free(G, dout);
    free(bank), free(x), free(w), free(mix), free(p), free(got), free(one), free(inpl);
}

static void test_rowops_k3(void) {
    test_situ(2.0f, 6.0f);
    test_situ(1.5f, 0.0f);
    test_sigmoid_mul();
    test_res_mix(0);
    test_res_mix(1);
    test_res_mix(7);
    float *d = dalloc(1024);
    int rc = em_gpu_situ(G, d, d, 16, 0.0f, 1.0f, d, &E);
    record("error: situ beta 0", rc == EM_EINVAL && strstr(E.msg, "beta 0"), "%s", E.msg);
    rc = em_gpu_sigmoid_mul(G, NULL, d, 16, &E);
    record("error: sigmoid_mul no x", rc == EM_EINVAL, "%s", E.msg);
    rc = em_gpu_res_mix(G, d, 256, 16, d, 16, d, 16, 1e-6f, 1, d, 16, &E);
    record("error: res_mix 256 banks", rc == EM_EINVAL && strstr(E.msg, "256 banked"), "%s", E.msg);
    rc = em_gpu_res_mix(G, d, 2, 16, d, 16, NULL, 16, 1e-6f, 1, d, 16, &E);
    record("error: res_mix without w", rc == EM_EINVAL && strstr(E.msg, "w"), "%s", E.msg);
    rc = em_gpu_res_mix(G, d, 2, 8, d, 16, d, 16, 1e-6f, 1, d, 16, &E);
    record("error: res_mix ld_bank < E", rc == EM_EINVAL && strstr(E.msg, "ld_bank 8"), "%s", E.msg);
    em_gpu_free(G, d);
}

/* ---- graphs ------------------------------------------------------------------------------- */

/* A small pass (norm, quantize, product, argmax) captured once per width and replayed: the
 * replay's argmaxes and products equal plain launches'. Then 1000 tiny launches, plain vs replayed. */
static void test_graph(void) {
    const int64_t rows = 4096, cols = HIDDEN;
    void *hw = make_weights(EM_TYPE_Q8_0, rows, cols, 0.05f);
    em_gpu_mat gm;
    TRY("graph", em_gpu_mat_upload(G, EM_TYPE_Q8_0, rows, cols, hw, "graph test matrix", &gm, &E));
    float *x = xmalloc((size_t)R * cols * 4);
    fill(x, (int64_t)R * cols, 1.0f);
    float *dx = dalloc((uint64_t)R * cols * 4), *dn = dalloc((uint64_t)R * cols * 4), *dy = dalloc((uint64_t)R * rows * 4);
    void *ds = dalloc(em_gpu_act_bytes(EM_TYPE_Q8_0, cols, R));
    int32_t *da = dalloc(R * 4);
    up(dx, x, (uint64_t)R * cols * 4);
    int bad = 0;
    for (int n = 1; n <= R && !bad; n++) {
        em_gpu_act act;
        float *y1 = xmalloc((size_t)n * rows * 4), *y2 = xmalloc((size_t)n * rows * 4);
        int32_t a1[R], a2[R];
        /* plain */
        TRY("graph", em_gpu_rmsnorm_rows(G, dx, cols, NULL, 1e-5f, n, cols, dn, cols, &E));
        TRY("graph", em_gpu_act_prepare(G, EM_TYPE_Q8_0, dn, cols, cols, n, ds, &act, &E));
        TRY("graph", em_gpu_matmul(G, &gm, &act, dy, rows, &E));
        TRY("graph", em_gpu_argmax_rows(G, dy, rows, n, rows, da, &E));
        TRY("graph", down(y1, dy, (uint64_t)n * rows * 4));
        TRY("graph", down(a1, da, (uint64_t)n * 4));
        /* captured */
        poison(dy, (uint64_t)R * rows * 4), poison(da, R * 4);
        TRY("graph", em_gpu_sync(G, &E));
        em_gpu_graph *gr = NULL;
        TRY("graph", em_gpu_capture_begin(G, &E));
        int rc = em_gpu_rmsnorm_rows(G, dx, cols, NULL, 1e-5f, n, cols, dn, cols, &E);
        if (!rc) rc = em_gpu_act_prepare(G, EM_TYPE_Q8_0, dn, cols, cols, n, ds, &act, &E);
        if (!rc) rc = em_gpu_matmul(G, &gm, &act, dy, rows, &E);
        if (!rc) rc = em_gpu_argmax_rows(G, dy, rows, n, rows, da, &E);
        em_err e2;
        int rc2 = em_gpu_capture_end(G, &gr, &e2);
        if (rc || rc2) {
            record("graph", 0, "capture of width %d: %s", n, rc ? E.msg : e2.msg);
            return;
        }
        for (int rep = 0; rep < 3; rep++) TRY("graph", em_gpu_graph_launch(G, gr, &E));
        TRY("graph", down(y2, dy, (uint64_t)n * rows * 4));
        TRY("graph", down(a2, da, (uint64_t)n * 4));
        bad += memcmp(y1, y2, (size_t)n * rows * 4) != 0 || memcmp(a1, a2, (size_t)n * 4) != 0;
        em_gpu_graph_free(gr);
        free(y1), free(y2);
    }
    record("graph replay = plain, widths 1..16", bad == 0, "norm+quantize+matmul+argmax: %s", bad ? "DIFFER" : "memcmp-equal");

    /* launch overhead: 1000 one-row norms of 2304 */
    float ms_plain = 0, ms_graph = 0;
    TRY("graph timing", em_gpu_mark(G, 0, &E));
    for (int i = 0; i < 1000; i++) TRY("graph timing", em_gpu_rmsnorm_rows(G, dx, cols, NULL, 1e-5f, 1, cols, dn, cols, &E));
    TRY("graph timing", em_gpu_mark(G, 1, &E));
    TRY("graph timing", em_gpu_elapsed_ms(G, &ms_plain, &E));
    em_gpu_graph *gr = NULL;
    TRY("graph timing", em_gpu_capture_begin(G, &E));
    for (int i = 0; i < 1000; i++) em_gpu_rmsnorm_rows(G, dx, cols, NULL, 1e-5f, 1, cols, dn, cols, &E);
    TRY("graph timing", em_gpu_capture_end(G, &gr, &E));
    TRY("graph timing", em_gpu_graph_launch(G, gr, &E)); /* warm */
    TRY("graph timing", em_gpu_mark(G, 0, &E));
    TRY("graph timing", em_gpu_graph_launch(G, gr, &E));
    TRY("graph timing", em_gpu_mark(G, 1, &E));
    TRY("graph timing", em_gpu_elapsed_ms(G, &ms_graph, &E));
    em_gpu_graph_free(gr);
    printf("info graph: 1000 rmsnorm launches %.1f us each plain, %.1f us each replayed\n", ms_plain, ms_graph);
    em_gpu_mat_free(G, &gm);
    em_gpu_free(G, dx), em_gpu_free(G, dn), em_gpu_free(G, dy), em_gpu_free(G, ds), em_gpu_free(G, da);
    free(hw), free(x);
}

/* ---- bandwidth --------------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Random GGUF bytes of type without quantizing (fast for big matrices): Q8_0 scales are small
 * positive fp16 values, float types get values in [-1, 1). */
static void *random_bytes(int type, int64_t rows, int64_t cols, uint64_t *bytes) {
    em_type_row_bytes(type, (uint64_t)cols, bytes, NULL);
    *bytes *= (uint64_t)rows;
    if (type != EM_TYPE_Q8_0 && em_type_get(type)->block_elems > 1) /* wt-cuda3 */
        return random_qbytes(type, rows, cols, bytes);
    uint8_t *w = xmalloc(*bytes);
    if (type == EM_TYPE_Q8_0) {
        for (uint64_t b = 0; b < *bytes / 34; b++) {
            uint8_t *blk = w + b * 34;
            const uint16_t d = em_fp32_to_fp16(0.001f + 0.01f * (float)(rnd() % 1000) / 1000.0f);
            memcpy(blk, &d, 2);
            const uint64_t a = rnd(), c = rnd(), e = rnd(), f = rnd();
            memcpy(blk + 2, &a, 8), memcpy(blk + 10, &c, 8), memcpy(blk + 18, &e, 8), memcpy(blk + 26, &f, 8);
        }
    } else {
        float *tmp = xmalloc((size_t)cols * 4);
        const uint64_t rb = *bytes / (uint64_t)rows;
        for (int64_t r = 0; r < rows; r++) {
            fill(tmp, cols, 1.0f);
            em_quantize(type, tmp, w + (uint64_t)r * rb, cols, NULL);
        }
        free(tmp);
    }
    return w;
}

static void bench_matmul(int type, int64_t rows, int64_t cols, const char *what) {
    uint64_t bytes = 0;
    void *hw = random_bytes(type, rows, cols, &bytes);
    em_gpu_mat gm;
    if (em_gpu_mat_upload(G, type, rows, cols, hw, what, &gm, &E)) {
        record("bench upload", 0, "%s", E.msg);
        free(hw);
        return;
    }
    free(hw);
    float *x = xmalloc((size_t)R * cols * 4);
    fill(x, (int64_t)R * cols, 1.0f);
    float *dx = dalloc((uint64_t)R * cols * 4), *dy = dalloc((uint64_t)R * rows * 4);
    const uint64_t sb = em_gpu_act_bytes(type, cols, R);
    void *ds = sb ? dalloc(sb) : NULL;
    up(dx, x, (uint64_t)R * cols * 4);
    printf("bench %-5s %-26s %7.1f MB:", em_type_name(type), what, bytes / 1e6);
    double t1 = 0;
    for (int n = 1; n <= R; n *= 2) {
        em_gpu_act act;
        if (em_gpu_act_prepare(G, type, dx, cols, cols, n, ds, &act, &E)) break;
        float t[21];
        for (int rep = -3; rep < 21; rep++) {
            em_gpu_mark(G, 0, &E);
            em_gpu_matmul(G, &gm, &act, dy, rows, &E);
            em_gpu_mark(G, 1, &E);
            float ms = 0;
            if (em_gpu_elapsed_ms(G, &ms, &E)) break;
            if (rep >= 0) t[rep] = ms;
        }
        qsort(t, 21, sizeof t[0], cmp_float);
        const double s = t[10] * 1e-3;
        if (n == 1) t1 = s;
        printf("  n=%d %.1f us %.0f GB/s (t/t1 %.2f)", n, s * 1e6, bytes / s / 1e9, s / t1);
    }
    printf("\n");
    fflush(stdout);
    em_gpu_mat_free(G, &gm);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, ds);
    free(x);
}

/* ---- per-head products (wt-mla: MLA's attn_k_b / attn_v_b) ------------------------------ */

/* GGUF bytes of heads x hr rows: quantized from floats (float types, Q8_0) or random blocks. */
static void *heads_weights(int type, int64_t rows, int64_t cols) {
    uint64_t b = 0;
    if (type == EM_TYPE_Q4_K || type == EM_TYPE_Q6_K || type == EM_TYPE_MXFP4) return random_qbytes(type, rows, cols, &b);
    return make_weights(type, rows, cols, 0.05f);
}

/* em_gpu_matmul_heads against em_gpu_matmul of each head's rows (the head's GGUF rows uploaded
 * as a matrix of their own) on each row alone: memcmp of the whole output buffer (the gaps
 * between heads must stay poisoned) for every n = 1..16, which is also width invariance. x rows
 * hold the heads xhs apart (ldx = heads * xhs), y rows yhs apart (ldy = heads * yhs). */
static void test_matmul_heads(int type, int heads, int64_t hr, int64_t cols, int64_t xhs, int64_t yhs) {
    char name[64];
    snprintf(name, sizeof name, "matmul heads %s %dx%lldx%lld", em_type_name(type), heads, (long long)hr,
             (long long)cols);
    const int64_t rows = (int64_t)heads * hr, ldx = (int64_t)heads * xhs, ldy = (int64_t)heads * yhs;
    void *hw = heads_weights(type, rows, cols);
    uint64_t rb = 0;
    em_type_row_bytes(type, (uint64_t)cols, &rb, NULL);
    em_gpu_mat gm, *gh = xmalloc((size_t)heads * sizeof *gh);
    TRY(name, em_gpu_mat_upload(G, type, rows, cols, hw, name, &gm, &E));
    for (int h = 0; h < heads; h++)
        TRY(name, em_gpu_mat_upload(G, type, hr, cols, (const uint8_t *)hw + (uint64_t)h * hr * rb, name, &gh[h], &E));
    float *x = xmalloc((size_t)R * ldx * 4);
    fill(x, (int64_t)R * ldx, 1.0f);
    const uint64_t yb = (uint64_t)R * ldy * 4;
    float *dx = dalloc((uint64_t)R * ldx * 4), *dy = dalloc(yb), *dref = dalloc(yb);
    const uint64_t sb1 = em_gpu_act_bytes(type, cols, 1), sbh = em_gpu_matmul_heads_scratch_bytes(type, heads, cols, R);
    void *ds1 = sb1 ? dalloc(sb1) : NULL, *dsh = sbh ? dalloc(sbh) : NULL;
    up(dx, x, (uint64_t)R * ldx * 4);
    poison(dref, yb);
    for (int j = 0; j < R; j++)
        for (int h = 0; h < heads; h++) {
            em_gpu_act act;
            TRY(name, em_gpu_act_prepare(G, type, dx + (int64_t)j * ldx + h * xhs, ldx, cols, 1, ds1, &act, &E));
            TRY(name, em_gpu_matmul(G, &gh[h], &act, dref + (int64_t)j * ldy + h * yhs, ldy, &E));
        }
    float *ref = xmalloc(yb), *got = xmalloc(yb);
    TRY(name, down(ref, dref, yb));
    int64_t unw = 0;
    for (int j = 0; j < R; j++)
        for (int h = 0; h < heads; h++) unw += unwritten(ref + (int64_t)j * ldy + h * yhs, hr);
    int differ = 0;
    for (int n = 1; n <= R; n++) {
        poison(dy, yb);
        TRY(name, em_gpu_matmul_heads(G, &gm, heads, hr, dx, ldx, xhs, cols, n, dsh, dy, ldy, yhs, &E));
        TRY(name, down(got, dy, yb));
        /* rows < n equal the per-head one-row products, gaps included; rows >= n untouched */
        differ += memcmp(got, ref, (size_t)n * ldy * 4) != 0 ||
                  unwritten(got + (int64_t)n * ldy, (int64_t)(R - n) * ldy) != (int64_t)(R - n) * ldy;
    }
    record(name, differ == 0 && unw == 0,
           "n=1..16: %d widths differ from per-head em_gpu_matmul one-row calls (memcmp, gaps poisoned); "
           "reference unwritten %lld", differ, (long long)unw);
    /* the per-head results are the products: one head against the CPU (quant/'s em_matmul) */
    if (type == EM_TYPE_F32 || type == EM_TYPE_BF16 || type == EM_TYPE_Q8_0) {
        em_mat mat;
        const int h = heads - 1;
        TRY(name, em_mat_init(&mat, type, hr, cols, (const uint8_t *)hw + (uint64_t)h * hr * rb, &E));
        uint64_t ab = 0;
        TRY(name, em_act_bytes(type, cols, R, &ab, &E));
        void *buf = ab ? xmalloc(ab) : NULL;
        float *cpu = xmalloc((size_t)R * hr * 4), *g1 = xmalloc((size_t)R * hr * 4);
        TRY(name, em_matmul(NULL, &mat, x + h * xhs, ldx, R, cpu, hr, buf, &E));
        for (int j = 0; j < R; j++) memcpy(g1 + (int64_t)j * hr, got + (int64_t)j * ldy + h * yhs, (size_t)hr * 4);
        char n2[128];
        snprintf(n2, sizeof n2, "%s head %d vs CPU", name, h);
        record_cmp(n2, compare(g1, cpu, (int64_t)R * hr), 1e-5, 1e-4);
        free(buf), free(cpu), free(g1);
    }
    em_gpu_mat bad = gm;
    bad.rows = rows + 1;
    const int rc = em_gpu_matmul_heads(G, &bad, heads, hr, dx, ldx, xhs, cols, 1, dsh, dy, ldy, yhs, &E);
    if (type == EM_TYPE_Q8_0)
        record("matmul heads: rows != heads x head_rows", rc == EM_EINVAL && strstr(E.msg, "heads"), "%s", E.msg);
    for (int h = 0; h < heads; h++) em_gpu_mat_free(G, &gh[h]);
    em_gpu_mat_free(G, &gm);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, dref), em_gpu_free(G, ds1), em_gpu_free(G, dsh);
    free(gh), free(hw), free(x), free(ref), free(got);
}

/* A wide pass's call: n = 17, 100 and EM_GPU_WIDE_MAX_ROWS rows in one em_gpu_matmul_heads ==
 * the same rows in calls of R (memcmp, rows past n left poisoned). */
static void test_matmul_heads_wide(int type, int heads, int64_t hr, int64_t cols, int64_t xhs, int64_t yhs) {
    enum { W = EM_GPU_WIDE_MAX_ROWS };
    char name[64];
    snprintf(name, sizeof name, "matmul heads wide %s %dx%lldx%lld", em_type_name(type), heads, (long long)hr,
             (long long)cols);
    const int64_t rows = (int64_t)heads * hr, ldx = (int64_t)heads * xhs, ldy = (int64_t)heads * yhs;
    void *hw = heads_weights(type, rows, cols);
    em_gpu_mat gm;
    TRY(name, em_gpu_mat_upload(G, type, rows, cols, hw, name, &gm, &E));
    float *x = xmalloc((size_t)W * ldx * 4);
    fill(x, (int64_t)W * ldx, 1.0f);
    const uint64_t yb = (uint64_t)W * ldy * 4, sb = em_gpu_matmul_heads_scratch_bytes(type, heads, cols, W);
    float *dx = dalloc((uint64_t)W * ldx * 4), *dy = dalloc(yb), *dref = dalloc(yb);
    void *ds = sb ? dalloc(sb) : NULL;
    float *ref = xmalloc(yb), *got = xmalloc(yb);
    up(dx, x, (uint64_t)W * ldx * 4);
    const int ns[3] = { 17, 100, W };
    int differ = 0;
    for (int i = 0; i < 3; i++) {
        const int n = ns[i];
        poison(dref, yb), poison(dy, yb);
        for (int r0 = 0; r0 < n; r0 += R)
            TRY(name, em_gpu_matmul_heads(G, &gm, heads, hr, dx + r0 * ldx, ldx, xhs, cols, n - r0 < R ? n - r0 : R, ds,
                                          dref + r0 * ldy, ldy, yhs, &E));
        TRY(name, em_gpu_matmul_heads(G, &gm, heads, hr, dx, ldx, xhs, cols, n, ds, dy, ldy, yhs, &E));
        TRY(name, down(ref, dref, yb));
        TRY(name, down(got, dy, yb));
        differ += memcmp(got, ref, yb) != 0;
    }
    record(name, differ == 0, "n = 17, 100, %d: %d of 3 differ from calls of %d rows (memcmp, rows past n poisoned)", W,
           differ, R);
    em_gpu_mat_free(G, &gm);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, dref), em_gpu_free(G, ds);
    free(hw), free(x), free(ref), free(got);
}

static void test_heads(void) {
    /* k_b: 32 heads of kv_lora 512 rows over nope 128 (q rows of 192 per head, outputs into
     * qa rows of 576 per head); v_b: 32 heads of v_head 128 over kv_lora 512 (ctx rows of 512,
     * outputs packed). Q4_K / Q6_K need 256-value rows: v_b only. */
    const int kb[] = { EM_TYPE_Q8_0, EM_TYPE_F32, EM_TYPE_BF16, EM_TYPE_F16, EM_TYPE_MXFP4 };
    for (int t = 0; t < 5; t++) test_matmul_heads(kb[t], MLA_HEADS, 512, 128, MLA_QK, 512 + ROPE_DIMS);
    const int vb[] = { EM_TYPE_Q8_0, EM_TYPE_F32, EM_TYPE_BF16, EM_TYPE_Q4_K, EM_TYPE_Q6_K, EM_TYPE_MXFP4 };
    for (int t = 0; t < 6; t++) test_matmul_heads(vb[t], MLA_HEADS, 128, 512, 512, 128);
    test_matmul_heads(EM_TYPE_Q8_0, 3, 1001, 64, 96, 1003); /* rows not a multiple of a warp's 4 outputs */
    test_matmul_heads_wide(EM_TYPE_Q8_0, MLA_HEADS, 512, 128, MLA_QK, 512 + ROPE_DIMS);
    test_matmul_heads_wide(EM_TYPE_Q8_0, MLA_HEADS, 128, 512, 512, 128);
    test_matmul_heads_wide(EM_TYPE_F32, MLA_HEADS, 128, 512, 512, 128);
    test_matmul_heads_wide(EM_TYPE_Q6_K, MLA_HEADS, 128, 512, 512, 128);
}

/* One attn_k_b / attn_v_b product of all 32 heads: em_gpu_matmul_heads against 32 em_gpu_matmul
 * calls (median of 21, n = 1, 4, 16). */
static void bench_heads(int type, int64_t hr, int64_t cols, int64_t xhs, int64_t yhs, const char *what) {
    const int heads = MLA_HEADS;
    const int64_t rows = (int64_t)heads * hr, ldx = heads * xhs, ldy = heads * yhs;
    uint64_t bytes = 0;
    void *hw = random_bytes(type, rows, cols, &bytes);
    em_gpu_mat gm;
    if (em_gpu_mat_upload(G, type, rows, cols, hw, what, &gm, &E)) {
        record("bench heads upload", 0, "%s", E.msg);
        free(hw);
        return;
    }
    free(hw);
    float *x = xmalloc((size_t)R * ldx * 4);
    fill(x, (int64_t)R * ldx, 1.0f);
    float *dx = dalloc((uint64_t)R * ldx * 4), *dy = dalloc((uint64_t)R * ldy * 4);
    const uint64_t sb = em_gpu_matmul_heads_scratch_bytes(type, heads, cols, R);
    void *ds = sb ? dalloc(sb) : NULL;
    up(dx, x, (uint64_t)R * ldx * 4);
    printf("bench heads %-5s %-22s %5.1f MB:", em_type_name(type), what, bytes / 1e6);
    for (int n = 1; n <= R; n *= 4) {
        float t[2][21];
        for (int way = 0; way < 2; way++)
            for (int rep = -3; rep < 21; rep++) {
                em_gpu_mark(G, 0, &E);
                if (way == 0) em_gpu_matmul_heads(G, &gm, heads, hr, dx, ldx, xhs, cols, n, ds, dy, ldy, yhs, &E);
                else
                    for (int h = 0; h < heads; h++) { /* the per-head calls it replaces */
                        em_gpu_mat m = gm;
                        if (type != EM_TYPE_Q8_0) break;
                        m.rows = hr;
                        m.data = (int8_t *)gm.data + (int64_t)h * hr * cols;
                        m.scales = (uint16_t *)gm.scales + (int64_t)h * hr * (cols / 32);
                        em_gpu_act act;
                        em_gpu_act_prepare(G, type, dx + h * xhs, ldx, cols, n, ds, &act, &E);
                        em_gpu_matmul(G, &m, &act, dy + h * yhs, ldy, &E);
                    }
                em_gpu_mark(G, 1, &E);
                float ms = 0;
                if (em_gpu_elapsed_ms(G, &ms, &E)) break;
                if (rep >= 0) t[way][rep] = ms;
            }
        qsort(t[0], 21, sizeof t[0][0], cmp_float);
        qsort(t[1], 21, sizeof t[1][0], cmp_float);
        printf("  n=%d %.1f us (%.0f GB/s; 32 calls %.1f us)", n, t[0][10] * 1e3, bytes / (t[0][10] * 1e-3) / 1e9,
               type == EM_TYPE_Q8_0 ? t[1][10] * 1e3 : 0.0);
    }
    printf("\n");
    fflush(stdout);
    em_gpu_mat_free(G, &gm);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, ds);
    free(x);
}

/* ---- fused launches: several products, residual + norm + Q8_0, launch overlap ------------ */

/* em_gpu_matmul_multi: four products of one input in one launch (types[i]: one type, or Q8_0
 * and F32 together, k_mm_mixed), each output memcmp-equal to its own em_gpu_matmul at every
 * width (n = 1, 2, 3, 4, 8, 12, 16; the shapes of a KDA layer's projections); then a short ldy
 * and, for a mix, Q8_0 with BF16 refused. */
static void test_matmul_multi(const int types[4], const char *name) {
    const bool mixed = types[0] != types[1];
    const int64_t cols = HIDDEN, rows[4] = { KDA_HEADS * KDA_DIM, KDA_HEADS, 256, 1001 };
    em_gpu_mat gm[4];
    void *hw[4];
    float *dy[4], *d1[4];
    for (int i = 0; i < 4; i++) {
        hw[i] = make_weights(types[i], rows[i], cols, 0.05f);
        TRY(name, em_gpu_mat_upload(G, types[i], rows[i], cols, hw[i], name, &gm[i], &E));
        dy[i] = dalloc((uint64_t)R * rows[i] * 4), d1[i] = dalloc((uint64_t)R * rows[i] * 4);
    }
    float *x = xmalloc((size_t)R * cols * 4);
    fill(x, (int64_t)R * cols, 1.0f);
    float *dx = dalloc((uint64_t)R * cols * 4);
    up(dx, x, (uint64_t)R * cols * 4);
    const int launch_type = mixed ? EM_TYPE_Q8_0 : types[0]; /* a mix takes Q8_0 rows (carrying the F32 ones) */
    const uint64_t sb = em_gpu_act_bytes(launch_type, cols, R);
    void *ds = sb ? dalloc(sb) : NULL;
    int differ = 0, widths = 0;
    for (int n = 1; n <= R; n += n < 4 ? 1 : 4) {
        em_gpu_act act, f32;
        TRY(name, em_gpu_act_prepare(G, launch_type, dx, cols, cols, n, ds, &act, &E));
        TRY(name, em_gpu_act_prepare(G, EM_TYPE_F32, dx, cols, cols, n, NULL, &f32, &E));
        em_gpu_mm_out outs[4];
        for (int i = 0; i < 4; i++) {
            poison(dy[i], (uint64_t)R * rows[i] * 4), poison(d1[i], (uint64_t)R * rows[i] * 4);
            outs[i] = (em_gpu_mm_out){ &gm[i], dy[i], rows[i] };
            const em_gpu_act *own = em_gpu_act_type(types[i]) == act.type ? &act : &f32;
            TRY(name, em_gpu_matmul(G, &gm[i], own, d1[i], rows[i], &E));
        }
        TRY(name, em_gpu_matmul_multi(G, outs, 4, &act, &E));
        for (int i = 0; i < 4; i++) {
            const uint64_t b = (uint64_t)R * rows[i] * 4;
            float *a = xmalloc(b), *c = xmalloc(b);
            TRY(name, down(a, dy[i], b));
            TRY(name, down(c, d1[i], b));
            differ += memcmp(a, c, b) != 0;
            free(a), free(c);
        }
        widths++;
    }
    record(name, differ == 0, "%d of %d outputs differ from their own em_gpu_matmul (n = 1, 2, 3, 4, 8, 12, 16)", differ,
           4 * widths);
    em_gpu_act act;
    TRY(name, em_gpu_act_prepare(G, launch_type, dx, cols, cols, 1, ds, &act, &E));
    em_gpu_mm_out bad[2] = { { &gm[0], dy[0], rows[0] }, { &gm[3], dy[3], rows[3] - 1 } };
    int rc = em_gpu_matmul_multi(G, bad, 2, &act, &E);
    record("matmul multi: short ldy refused", rc == EM_EINVAL && strstr(E.msg, "ldy"), "%s", E.msg);
    if (mixed) {
        em_gpu_mat bf;
        void *hb = make_weights(EM_TYPE_BF16, 64, cols, 0.05f);
        TRY(name, em_gpu_mat_upload(G, EM_TYPE_BF16, 64, cols, hb, "bf16", &bf, &E));
        bad[1] = (em_gpu_mm_out){ &bf, dy[1], 64 };
        rc = em_gpu_matmul_multi(G, bad, 2, &act, &E);
        record("matmul multi: q8_0 + bf16 refused", rc == EM_EINVAL && strstr(E.msg, "share a type"), "%s", E.msg);
        em_gpu_mat_free(G, &bf), free(hb);
    }
    for (int i = 0; i < 4; i++) em_gpu_mat_free(G, &gm[i]), em_gpu_free(G, dy[i]), em_gpu_free(G, d1[i]), free(hw[i]);
    em_gpu_free(G, dx), em_gpu_free(G, ds);
    free(x);
}

/* ---- products of many rows (wide prefill passes) ------------------------------------------- */

/* y = W x over n rows of dx (cols values) in calls of R rows each: the reference a wide call
 * must equal bit for bit. */
static int mm_chunks(const em_gpu_mat *w, const float *dx, int64_t cols, int n, void *ds, float *dy, int64_t ldy) {
    for (int r = 0; r < n; r += R) {
        const int m = n - r < R ? n - r : R;
        em_gpu_act a;
        int rc = em_gpu_act_prepare(G, w->type, dx + (int64_t)r * cols, cols, cols, m, ds, &a, &E);
        if (!rc) rc = em_gpu_matmul(G, w, &a, dy + (int64_t)r * ldy, ldy, &E);
        if (rc) return rc;
    }
    return 0;
}

/* em_gpu_matmul over n > R rows (Q8_0 on the tensor cores, other types in chunks) memcmp-equal
 * to calls of R rows, every output written, for n = 17, 100 and EM_GPU_WIDE_MAX_ROWS. */
static void test_matmul_wide(int type, int64_t rows, int64_t cols) {
    const int NW = EM_GPU_WIDE_MAX_ROWS;
    char name[64];
    snprintf(name, sizeof name, "matmul wide %s %lldx%lld", em_type_name(type), (long long)rows, (long long)cols);
    void *hw = make_weights(type, rows, cols, 0.05f);
    em_gpu_mat gm;
    TRY(name, em_gpu_mat_upload(G, type, rows, cols, hw, name, &gm, &E));
    const uint64_t yb = (uint64_t)NW * rows * 4;
    float *x = xmalloc((size_t)NW * cols * 4), *got = xmalloc(yb), *want = xmalloc(yb);
    fill(x, (int64_t)NW * cols, 1.0f);
    float *dx = dalloc((uint64_t)NW * cols * 4), *dy = dalloc(yb);
    const uint64_t sb = em_gpu_act_bytes(type, cols, NW);
    void *ds = sb ? dalloc(sb) : NULL;
    up(dx, x, (uint64_t)NW * cols * 4);
    const int widths[] = { 17, 100, NW };
    char why[768] = "";
    for (int i = 0; i < 3 && !why[0]; i++) {
        const int n = widths[i];
        const uint64_t b = (uint64_t)n * rows * 4;
        poison(dy, yb);
        em_gpu_act a;
        if (mm_chunks(&gm, dx, cols, n, ds, dy, rows) || down(want, dy, b)) {
            snprintf(why, sizeof why, "chunks of %d rows: %s", R, E.msg);
            break;
        }
        poison(dy, yb);
        if (em_gpu_act_prepare(G, type, dx, cols, cols, n, ds, &a, &E) || em_gpu_matmul(G, &gm, &a, dy, rows, &E) ||
            down(got, dy, b)) {
            snprintf(why, sizeof why, "%d rows: %s", n, E.msg);
            break;
        }
        const int64_t unw = unwritten(got, (int64_t)n * rows);
        if (memcmp(got, want, b) || unw) {
            int64_t first = 0;
            while (first < (int64_t)n * rows && !memcmp(&got[first], &want[first], 4)) first++;
            snprintf(why, sizeof why, "%d rows differ from chunks of %d (first at row %lld output %lld: %.9g vs %.9g; "
                     "%lld unwritten)", n, R, (long long)(first / rows), (long long)(first % rows),
                     first < (int64_t)n * rows ? got[first] : 0.0, first < (int64_t)n * rows ? want[first] : 0.0,
                     (long long)unw);
        }
    }
    if (why[0]) record(name, 0, "%s", why);
    else record(name, 1, "n = 17, 100, %d memcmp-equal to calls of %d rows, every output written", NW, R);
    if (!why[0] && type == EM_TYPE_Q8_0 && rows >= 4096) { /* what a wide pass gains on this product */
        em_gpu_act a;
        float t[2][7];
        for (int rep = -1; rep < 7; rep++)
            for (int v = 0; v < 2; v++) {
                em_gpu_mark(G, 0, &E);
                if (v) em_gpu_act_prepare(G, type, dx, cols, cols, NW, ds, &a, &E), em_gpu_matmul(G, &gm, &a, dy, rows, &E);
                else mm_chunks(&gm, dx, cols, NW, ds, dy, rows);
                em_gpu_mark(G, 1, &E);
                float ms = 0;
                em_gpu_elapsed_ms(G, &ms, &E);
                if (rep >= 0) t[v][rep] = ms;
            }
        qsort(t[0], 7, sizeof t[0][0], cmp_float), qsort(t[1], 7, sizeof t[1][0], cmp_float);
        printf("info %s: %d rows (median of 7): %d calls of %d rows %.3f ms, one wide call %.3f ms\n", name, NW, NW / R, R,
               t[0][3], t[1][3]);
    }
    em_gpu_mat_free(G, &gm), em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, ds);
    free(hw), free(x), free(got), free(want);
}

/* em_gpu_matmul_multi over EM_GPU_WIDE_MAX_ROWS rows of a KDA layer's Q8_0 projections with its
 * F32 beta (the Q8_0 ones on the tensor cores, the F32 one in chunks), each memcmp-equal to its
 * own calls of R rows; then one row more and in-block activations over R rows refused. */
static void test_matmul_multi_wide(void) {
    const char *name = "matmul multi wide q8_0 + f32";
    const int NW = EM_GPU_WIDE_MAX_ROWS, types[3] = { EM_TYPE_Q8_0, EM_TYPE_F32, EM_TYPE_Q8_0 };
    const int64_t cols = HIDDEN, rows[3] = { KDA_HEADS * KDA_DIM, KDA_HEADS, KDA_DIM };
    em_gpu_mat gm[3];
    void *hw[3];
    float *dy[3];
    for (int i = 0; i < 3; i++) {
        hw[i] = make_weights(types[i], rows[i], cols, 0.05f);
        TRY(name, em_gpu_mat_upload(G, types[i], rows[i], cols, hw[i], name, &gm[i], &E));
        dy[i] = dalloc((uint64_t)NW * rows[i] * 4);
    }
    float *x = xmalloc((size_t)NW * cols * 4);
    fill(x, (int64_t)NW * cols, 1.0f);
    float *dx = dalloc((uint64_t)NW * cols * 4);
    void *ds = dalloc(em_gpu_act_bytes(EM_TYPE_Q8_0, cols, NW));
    up(dx, x, (uint64_t)NW * cols * 4);
    em_gpu_act act;
    TRY(name, em_gpu_act_prepare(G, EM_TYPE_Q8_0, dx, cols, cols, NW, ds, &act, &E));
    em_gpu_mm_out outs[3];
    for (int i = 0; i < 3; i++) poison(dy[i], (uint64_t)NW * rows[i] * 4), outs[i] = (em_gpu_mm_out){ &gm[i], dy[i], rows[i] };
    TRY(name, em_gpu_matmul_multi(G, outs, 3, &act, &E));
    int differ = 0;
    for (int i = 0; i < 3; i++) {
        const uint64_t b = (uint64_t)NW * rows[i] * 4;
        float *a = xmalloc(b), *c = xmalloc(b);
        TRY(name, down(a, dy[i], b));
        TRY(name, mm_chunks(&gm[i], dx, cols, NW, ds, dy[i], rows[i]));
        TRY(name, down(c, dy[i], b));
        differ += memcmp(a, c, b) != 0 || unwritten(a, (int64_t)NW * rows[i]);
        free(a), free(c);
    }
    record(name, differ == 0, "%d of 3 products (%d rows) differ from their own calls of %d rows", differ, NW, R);
    act.n = NW + 1;
    int rc = em_gpu_matmul_multi(G, outs, 3, &act, &E);
    char too_many[32];
    snprintf(too_many, sizeof too_many, "%d rows", NW + 1);
    record("matmul: one row too many refused", rc == EM_EINVAL && strstr(E.msg, too_many), "%s", E.msg);
    em_gpu_act ib;
    const bool ib_ok = em_gpu_act_in_block(EM_TYPE_Q8_0, dx, NULL, cols, KDA_DIM, R + 1, EM_GPU_ACT_SWIGLU, 0, 0, &ib);
    record("matmul: in-block over 16 rows", !ib_ok, "em_gpu_act_in_block %s %d rows", ib_ok ? "accepted" : "refused",
           R + 1);
    for (int i = 0; i < 3; i++) em_gpu_mat_free(G, &gm[i]), em_gpu_free(G, dy[i]), free(hw[i]);
    em_gpu_free(G, dx), em_gpu_free(G, ds);
    free(x);
}

/* em_gpu_add_rmsnorm against the launches it replaces (two adds, the norm, the Q8_0
 * quantization), memcmp; and against the CPU twins. */
static void test_add_rmsnorm(void) {
    const char *name = "add_rmsnorm 16x2304 (+ y + y2, Q8_0)";
    const int64_t n = HIDDEN, c = (int64_t)R * n;
    float *x = xmalloc((size_t)c * 4), *y = xmalloc((size_t)c * 4), *y2 = xmalloc((size_t)c * 4), *w = xmalloc((size_t)n * 4);
    fill(x, c, 3.0f), fill(y, c, 1.0f), fill(y2, c, 1.0f), fill(w, n, 1.0f);
    float *dx = dalloc((uint64_t)c * 4), *dx2 = dalloc((uint64_t)c * 4), *dy = dalloc((uint64_t)c * 4),
          *dy2 = dalloc((uint64_t)c * 4), *dt = dalloc((uint64_t)c * 4), *dw = dalloc((uint64_t)n * 4),
          *dh = dalloc((uint64_t)c * 4), *dh2 = dalloc((uint64_t)c * 4);
    const uint64_t qb = em_gpu_act_bytes(EM_TYPE_Q8_0, n, R);
    void *dq = dalloc(qb), *dq2 = dalloc(qb);
    up(dx, x, (uint64_t)c * 4), up(dx2, x, (uint64_t)c * 4), up(dy, y, (uint64_t)c * 4), up(dy2, y2, (uint64_t)c * 4);
    up(dw, w, (uint64_t)n * 4);
    poison(dh, (uint64_t)c * 4), poison(dq, qb), poison(dq2, qb);
    em_gpu_act q, q2;
    TRY(name, em_gpu_add_rmsnorm(G, dx, n, dy, dy2, n, dw, 1e-5f, R, n, dh, n, dq, &q, &E));
    TRY(name, em_gpu_add(G, dy, dy2, c, dt, &E));
    TRY(name, em_gpu_add(G, dx2, dt, c, dx2, &E));
    TRY(name, em_gpu_rmsnorm_rows(G, dx2, n, dw, 1e-5f, R, n, dh2, n, &E));
    TRY(name, em_gpu_act_prepare(G, EM_TYPE_Q8_0, dh2, n, n, R, dq2, &q2, &E));
    float *a = xmalloc((size_t)c * 4), *b = xmalloc((size_t)c * 4);
    uint8_t *qa = xmalloc(qb), *qc = xmalloc(qb);
    TRY(name, down(a, dx, (uint64_t)c * 4));
    TRY(name, down(b, dx2, (uint64_t)c * 4));
    int same = !memcmp(a, b, (size_t)c * 4);
    TRY(name, down(a, dh, (uint64_t)c * 4));
    TRY(name, down(b, dh2, (uint64_t)c * 4));
    same &= !memcmp(a, b, (size_t)c * 4);
    TRY(name, down(qa, dq, qb));
    TRY(name, down(qc, dq2, qb));
    same &= !memcmp(qa, qc, qb) && q.qs == (const int8_t *)dq && q.n == R && q.cols == n &&
            (const uint8_t *)q.d - (const uint8_t *)q.qs == (const uint8_t *)q2.d - (const uint8_t *)q2.qs;
    record(name, same, "x, h and the Q8_0 bytes memcmp-equal to add + add + rmsnorm + act_prepare: %s", same ? "yes" : "NO");
    /* the CPU twins: x + (y + y2), em_rmsnorm_rows */
    float *ref = xmalloc((size_t)c * 4), *xs = xmalloc((size_t)c * 4);
    for (int64_t i = 0; i < c; i++) xs[i] = x[i] + (y[i] + y2[i]);
    em_rmsnorm_rows(xs, n, w, 1e-5f, R, n, ref, n);
    record_cmp("add_rmsnorm vs cpu", compare(a, ref, c), 1e-6, 1e-6);
    const int rc = em_gpu_add_rmsnorm(G, dx, n, dy, NULL, n, dw, 1e-5f, R, 33, dh, n, dq, &q, &E);
    record("add_rmsnorm: Q8_0 of 33 columns refused", rc == EM_EINVAL && strstr(E.msg, "multiple of 32"), "%s", E.msg);
    em_gpu_free(G, dx), em_gpu_free(G, dx2), em_gpu_free(G, dy), em_gpu_free(G, dy2), em_gpu_free(G, dt);
    em_gpu_free(G, dw), em_gpu_free(G, dh), em_gpu_free(G, dh2), em_gpu_free(G, dq), em_gpu_free(G, dq2);
    free(x), free(y), free(y2), free(w), free(a), free(b), free(qa), free(qc), free(ref), free(xs);
}

/* ---- routed experts ---------------------------------------------------------------------- */

/* One MoE layer's routed experts: types of gate/up/down, shape, activation. */
typedef struct moe_cfg {
    const char *name;
    int tg, tu, td;
    int n_expert, ffn, hidden, k;
    int act;
    float beta, lin_beta;
} moe_cfg;

typedef struct moe_fix {
    moe_cfg c;
    void *hg, *hu, *hd; /* GGUF bytes of the stacks */
    em_gpu_mat gate, up, down;
    em_gpu_experts ex;
} moe_fix;

/* GGUF bytes of a stack: random block bytes for the quantized types (random_bytes); for float
 * types, rows cut at scattered offsets from one pool of random values (quantized by quant/ to
 * F16 / BF16), so that 256 experts of F32 (7 GB) take a memcpy per row, and rows still differ. */
static void *stack_bytes(int type, int64_t rows, int64_t cols) {
    uint64_t bytes = 0;
    if (type != EM_TYPE_F32 && type != EM_TYPE_F16 && type != EM_TYPE_BF16) return random_bytes(type, rows, cols, &bytes);
    const int64_t pool_n = (1 << 22) + 17;
    float *pool = xmalloc((size_t)pool_n * 4);
    fill(pool, pool_n, 0.05f);
    uint64_t rb = 0;
    em_type_row_bytes(type, (uint64_t)cols, &rb, NULL);
    uint8_t *w = xmalloc(rb * (uint64_t)rows);
    const int64_t span = pool_n - cols;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = (int64_t)(((uint64_t)r * 2654435761ull + (rnd() & 0xffff)) % (uint64_t)span);
        if (type == EM_TYPE_F32) memcpy(w + (uint64_t)r * rb, pool + at, (size_t)cols * 4);
        else em_quantize(type, pool + at, w + (uint64_t)r * rb, cols, NULL);
    }
    free(pool);
    return w;
}

static int moe_open(moe_fix *f, const moe_cfg *c) {
    memset(f, 0, sizeof *f);
    f->c = *c;
    const int64_t X = c->n_expert, F = c->ffn, H = c->hidden;
    f->hg = stack_bytes(c->tg, X * F, H);
    f->hu = stack_bytes(c->tu, X * F, H);
    f->hd = stack_bytes(c->td, X * H, F);
    if (em_gpu_mat_upload(G, c->tg, X * F, H, f->hg, "ffn_gate_exps", &f->gate, &E) ||
        em_gpu_mat_upload(G, c->tu, X * F, H, f->hu, "ffn_up_exps", &f->up, &E) ||
        em_gpu_mat_upload(G, c->td, X * H, F, f->hd, "ffn_down_exps", &f->down, &E))
        return -1;
    f->ex = (em_gpu_experts){ .gate = &f->gate, .up = &f->up, .down = &f->down, .n_expert = c->n_expert, .ffn = c->ffn,
                              .act = c->act, .situ_beta = c->beta, .situ_lin_beta = c->lin_beta };
    return 0;
}
static void moe_close(moe_fix *f) {
    em_gpu_mat_free(G, &f->gate), em_gpu_mat_free(G, &f->up), em_gpu_mat_free(G, &f->down);
    free(f->hg), free(f->hu), free(f->hd);
}
/* k distinct random experts (of X) per row; adjacent rows share some (as real routing does)
 * when share. */
static void random_routes(int32_t *ids, float *w, int n, int k, int X, int share) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < k; i++) {
            int32_t e;
            int dup;
            do {
                e = share && j > 0 && i < k / 2 ? ids[(j - 1) * k + i] : (int32_t)(rnd() % (uint64_t)X);
                dup = 0;
                for (int t = 0; t < i; t++) dup |= ids[j * k + t] == e;
                if (dup) share = 0; /* fall back to a fresh draw */
            } while (dup);
            ids[j * k + i] = e;
            w[j * k + i] = 0.1f + 0.3f * (rndf() + 1.0f);
        }
}

static void mlp_act(const moe_cfg *c, float *g, const float *u, int64_t n) {
    if (c->act == EM_GPU_ACT_SITU) em_situ(g, u, c->beta, c->lin_beta, n, g);
    else em_swiglu(g, u, n, g);
}

/* The CPU twin: per row, each of its experts with quant/'s products and compute/'s SwiGLU or
 * SiTU, summed in ascending expert order with em_axpy, as model/moe.c does. */
static void moe_ref(const moe_fix *f, const float *x, const int32_t *ids, const float *w, int n, float *y) {
    const moe_cfg *c = &f->c;
    const int64_t F = c->ffn, H = c->hidden;
    em_mat g, u, d;
    em_mat_init(&g, c->tg, c->n_expert * F, H, f->hg, NULL);
    em_mat_init(&u, c->tu, c->n_expert * F, H, f->hu, NULL);
    em_mat_init(&d, c->td, c->n_expert * H, F, f->hd, NULL);
    float *gt = xmalloc((size_t)F * 4), *up = xmalloc((size_t)F * 4), *o = xmalloc((size_t)H * 4);
    uint64_t ab = 0, a2 = 0;
    em_act_bytes(c->tg, H, 1, &ab, NULL);
    em_act_bytes(c->tu, H, 1, &a2, NULL);
    if (a2 > ab) ab = a2;
    em_act_bytes(c->td, F, 1, &a2, NULL);
    if (a2 > ab) ab = a2;
    void *buf = xmalloc(ab + 4096);
    for (int j = 0; j < n; j++) {
        memset(y + (int64_t)j * H, 0, (size_t)H * 4);
        for (int e = 0; e < c->n_expert; e++)
            for (int i = 0; i < c->k; i++) {
                if (ids[j * c->k + i] != e) continue;
                em_mat ge = em_mat_rows(&g, (int64_t)e * F, F), ue = em_mat_rows(&u, (int64_t)e * F, F);
                em_mat de = em_mat_rows(&d, (int64_t)e * H, H);
                em_matmul(NULL, &ge, x + (int64_t)j * H, H, 1, gt, F, buf, NULL);
                em_matmul(NULL, &ue, x + (int64_t)j * H, H, 1, up, F, buf, NULL);
                mlp_act(c, gt, up, F);
                em_matmul(NULL, &de, gt, F, 1, o, H, buf, NULL);
                em_axpy(w[j * c->k + i], o, H, y + (int64_t)j * H);
            }
    }
    free(gt), free(up), free(o), free(buf);
}

/* Expert e's rows of a stack (GGUF bytes), uploaded as a matrix of its own. */
static int upload_expert(int type, const void *stack, int64_t e, int64_t rows, int64_t cols, em_gpu_mat *m) {
    uint64_t rb = 0;
    em_type_row_bytes(type, (uint64_t)cols, &rb, NULL);
    return em_gpu_mat_upload(G, type, rows, cols, (const uint8_t *)stack + (uint64_t)e * (uint64_t)rows * rb, "expert", m,
                             &E);
}

/* The dense composition on the device: for each row and each of its experts (ascending), the
 * expert's own matrices through em_gpu_act_prepare + em_gpu_matmul, em_gpu_swiglu / em_gpu_situ
 * on the device, then y += w * out on the host in float (one rounding per operation, as
 * k_moe_sum). em_gpu_moe promises these bits. Returns 0, or -1 with E set. */
static int moe_dense(const moe_fix *f, const float *dx, const int32_t *ids, const float *w, int n, float *y) {
    const moe_cfg *c = &f->c;
    const int64_t F = c->ffn, H = c->hidden;
    em_gpu_mat *ge = xmalloc((size_t)c->n_expert * 3 * sizeof *ge);
    memset(ge, 0, (size_t)c->n_expert * 3 * sizeof *ge);
    float *dg = dalloc((uint64_t)F * 4), *du = dalloc((uint64_t)F * 4), *dout = dalloc((uint64_t)H * 4);
    void *ds = dalloc(em_gpu_act_bytes(EM_TYPE_Q8_0, H > F ? H : F, 1) + 256);
    float *o = xmalloc((size_t)H * 4);
    int rc = 0;
    for (int j = 0; j < n && !rc; j++) {
        float *yr = y + (int64_t)j * H;
        memset(yr, 0, (size_t)H * 4);
        for (int e = 0; e < c->n_expert && !rc; e++)
            for (int i = 0; i < c->k && !rc; i++) {
                if (ids[j * c->k + i] != e) continue;
                em_gpu_mat *m = ge + 3 * e;
                if (!m[0].data)
                    rc = upload_expert(c->tg, f->hg, e, F, H, &m[0]) || upload_expert(c->tu, f->hu, e, F, H, &m[1]) ||
                         upload_expert(c->td, f->hd, e, H, F, &m[2]);
                em_gpu_act a;
                if (!rc) rc = em_gpu_act_prepare(G, m[0].type, dx + (int64_t)j * H, H, H, 1, ds, &a, &E);
                if (!rc) rc = em_gpu_matmul(G, &m[0], &a, dg, F, &E);
                if (!rc) rc = em_gpu_act_prepare(G, m[1].type, dx + (int64_t)j * H, H, H, 1, ds, &a, &E);
                if (!rc) rc = em_gpu_matmul(G, &m[1], &a, du, F, &E);
                if (!rc)
                    rc = c->act == EM_GPU_ACT_SITU ? em_gpu_situ(G, dg, du, F, c->beta, c->lin_beta, dg, &E)
                                                   : em_gpu_swiglu(G, dg, du, F, dg, &E);
                if (!rc) rc = em_gpu_act_prepare(G, m[2].type, dg, F, F, 1, ds, &a, &E);
                if (!rc) rc = em_gpu_matmul(G, &m[2], &a, dout, H, &E);
                if (!rc) rc = down(o, dout, (uint64_t)H * 4);
                const float wt = w[j * c->k + i];
                for (int64_t t = 0; !rc && t < H; t++) {
                    const float p = wt * o[t];
                    yr[t] = yr[t] + p;
                }
            }
    }
    for (int i = 0; i < 3 * c->n_expert; i++) em_gpu_mat_free(G, &ge[i]);
    free(ge), free(o);
    em_gpu_free(G, dg), em_gpu_free(G, du), em_gpu_free(G, dout), em_gpu_free(G, ds);
    return rc ? -1 : 0;
}

/* The experts [e0, e1) of f's stacks uploaded as a share of their own (em_gpu_moe_share). */
typedef struct moe_share {
    em_gpu_mat gate, up, down;
    em_gpu_experts ex;
} moe_share;

static int share_open(const moe_fix *f, int e0, int e1, moe_share *s) {
    const moe_cfg *c = &f->c;
    const int64_t F = c->ffn, H = c->hidden, X = e1 - e0;
    uint64_t rg = 0, ru = 0, rd = 0;
    memset(s, 0, sizeof *s);
    if (em_type_row_bytes(c->tg, (uint64_t)H, &rg, &E) || em_type_row_bytes(c->tu, (uint64_t)H, &ru, &E) ||
        em_type_row_bytes(c->td, (uint64_t)F, &rd, &E) ||
        em_gpu_mat_upload(G, c->tg, X * F, H, (const uint8_t *)f->hg + (uint64_t)(e0 * F) * rg, "gate share", &s->gate, &E) ||
        em_gpu_mat_upload(G, c->tu, X * F, H, (const uint8_t *)f->hu + (uint64_t)(e0 * F) * ru, "up share", &s->up, &E) ||
        em_gpu_mat_upload(G, c->td, X * H, F, (const uint8_t *)f->hd + (uint64_t)(e0 * H) * rd, "down share", &s->down, &E))
        return -1;
    s->ex = f->ex;
    s->ex.gate = &s->gate, s->ex.up = &s->up, s->ex.down = &s->down, s->ex.n_expert = (int)X;
    return 0;
}
static void share_close(moe_share *s) { em_gpu_mat_free(G, &s->gate), em_gpu_mat_free(G, &s->up), em_gpu_mat_free(G, &s->down); }

/* The experts split into three uneven shares, each run on its own (em_gpu_moe_share), then
 * combined: memcmp-equal to em_gpu_moe (want: its rows, the one-row calls) at n = 1, 2, 16;
 * and a share writes exactly the slots of the experts it holds. */
static void test_moe_shares(moe_fix *f, const float *dx, const int32_t *di, const float *dw, const float *want) {
    const moe_cfg *c = &f->c;
    const int K = c->k, X = c->n_expert;
    const int64_t H = c->hidden;
    const int cut[4] = { 0, X / 4, X / 4 + (3 * X) / 8, X };
    static const int widths[] = { 1, 2, R };
    char nm[96], why[640] = "";
    snprintf(nm, sizeof nm, "%s shares", c->name);
    moe_share sh[3];
    em_gpu_moe_parts parts = { .n = 3 };
    float *dy = dalloc((uint64_t)R * H * 4), *got = xmalloc((size_t)R * H * 4), *hs = xmalloc((size_t)K * H * 4);
    void *ds = dalloc(em_gpu_moe_scratch_bytes(X, K, c->ffn, H, R));
    int opened = 0, written = 0;
    for (; opened < 3 && !why[0]; opened++) {
        if (share_open(f, cut[opened], cut[opened + 1], &sh[opened])) snprintf(why, sizeof why, "upload: %s", E.msg);
        parts.out[opened] = dalloc((uint64_t)R * K * H * 4), parts.first[opened + 1] = cut[opened + 1];
    }
    for (size_t w = 0; w < sizeof widths / sizeof widths[0] && !why[0]; w++) {
        const int n = widths[w];
        for (int r = 0; r < 3 && !why[0]; r++) {
            poison((void *)parts.out[r], (uint64_t)n * K * H * 4);
            if (em_gpu_moe_share(G, &sh[r].ex, cut[r], dx, H, n, NULL, di, K, ds, (float *)parts.out[r], &E))
                snprintf(why, sizeof why, "share %d, %d rows: %s", r, n, E.msg);
        }
        poison(dy, (uint64_t)n * H * 4);
        if (!why[0] && (em_gpu_moe_combine(G, &parts, di, dw, n, K, H, dy, H, &E) || down(got, dy, (uint64_t)n * H * 4)))
            snprintf(why, sizeof why, "combine, %d rows: %s", n, E.msg);
        else if (!why[0] && memcmp(got, want, (size_t)n * H * 4))
            snprintf(why, sizeof why, "%d rows: the combined shares differ from em_gpu_moe", n);
    }
    /* the slots share 0 wrote for row 0 (its last run: 16 rows) */
    int32_t ids[32];
    if (!why[0] && (down(ids, di, (uint64_t)K * 4) || down(hs, parts.out[0], (uint64_t)K * H * 4)))
        snprintf(why, sizeof why, "download: %s", E.msg);
    for (int t = 0; t < K && !why[0]; t++) {
        const int held = ids[t] >= cut[0] && ids[t] < cut[1];
        written += held;
        if (held != (unwritten(hs + (int64_t)t * H, H) == 0))
            snprintf(why, sizeof why, "share 0 %s slot %d (expert %d)", held ? "left out" : "wrote", t, ids[t]);
    }
    if (why[0]) record(nm, 0, "%s", why);
    else record(nm, 1, "3 shares (%d, %d, %d experts) combined memcmp-equal to em_gpu_moe at 1, 2, 16 rows; share 0 wrote "
                       "the %d slots of row 0 it holds, no other", cut[1], cut[2] - cut[1], X - cut[2], written);
    for (int r = 0; r < opened; r++) share_close(&sh[r]), em_gpu_free(G, (void *)parts.out[r]);
    em_gpu_free(G, dy), em_gpu_free(G, ds);
    free(got), free(hs);
}

/* em_gpu_moe_wide over NW rows whose first half all chose experts 0..k-1 (each of those takes
 * many union slots) and the rest random: memcmp-equal to em_gpu_moe over each
 * 16-row chunk, every output written; rows past the limit refused. At the 48B shape with Q8_0
 * experts, its time against the chunks' (uniform routes). */
#define NW EM_GPU_WIDE_MAX_ROWS
static void test_moe_wide(moe_fix *f) {
    const moe_cfg *c = &f->c;
    const int K = c->k;
    const int64_t H = c->hidden;
    char nm[96], why[768] = "";
    snprintf(nm, sizeof nm, "%s wide", c->name);
    int32_t *ids = xmalloc((size_t)NW * K * 4);
    float *w = xmalloc((size_t)NW * K * 4), *x = xmalloc((size_t)NW * H * 4);
    float *got = xmalloc((size_t)NW * H * 4), *want = xmalloc((size_t)NW * H * 4);
    random_routes(ids, w, NW, K, c->n_expert, 1);
    for (int j = 0; j < NW / 2; j++)
        for (int i = 0; i < K; i++) ids[j * K + i] = i;
    fill(x, (int64_t)NW * H, 1.0f);
    float *dx = dalloc((uint64_t)NW * H * 4), *dy = dalloc((uint64_t)NW * H * 4), *dw = dalloc((uint64_t)NW * K * 4);
    int32_t *di = dalloc((uint64_t)NW * K * 4);
    void *ds = dalloc(em_gpu_moe_scratch_bytes(c->n_expert, K, c->ffn, H, R));
    void *dsw = dalloc(em_gpu_moe_wide_scratch_bytes(c->n_expert, K, c->ffn, H, NW));
    up(dx, x, (uint64_t)NW * H * 4), up(di, ids, (uint64_t)NW * K * 4), up(dw, w, (uint64_t)NW * K * 4);
    for (int r = 0; r < NW && !why[0]; r += R)
        if (em_gpu_moe(G, &f->ex, dx + (int64_t)r * H, H, R, di + r * K, dw + r * K, K, ds, dy + (int64_t)r * H, H, &E))
            snprintf(why, sizeof why, "em_gpu_moe, rows %d..: %s", r, E.msg);
    if (!why[0] && down(want, dy, (uint64_t)NW * H * 4)) snprintf(why, sizeof why, "download: %s", E.msg);
    poison(dy, (uint64_t)NW * H * 4);
    if (!why[0] && (em_gpu_moe_wide(G, &f->ex, dx, H, NW, di, dw, K, dsw, dy, H, &E) || down(got, dy, (uint64_t)NW * H * 4)))
        snprintf(why, sizeof why, "em_gpu_moe_wide: %s", E.msg);
    const int64_t unw = why[0] ? 0 : unwritten(got, (int64_t)NW * H);
    if (!why[0] && (memcmp(got, want, (size_t)NW * H * 4) || unw))
        snprintf(why, sizeof why, "%d rows differ from em_gpu_moe's chunks of 16 (%lld outputs unwritten)", NW, (long long)unw);
    const int rc = em_gpu_moe_wide(G, &f->ex, dx, H, NW + 1, di, dw, K, dsw, dy, H, &E);
    if (!why[0] && rc != EM_EINVAL) snprintf(why, sizeof why, "%d rows not refused (rc %d)", NW + 1, rc);
    if (why[0]) record(nm, 0, "%s", why);
    else record(nm, 1, "%d rows (%d of them on each of experts 0..%d) memcmp-equal to em_gpu_moe in chunks of %d; "
                       "%d rows refused", NW, NW / 2, K - 1, R, NW + 1);
    if (!why[0] && c->n_expert == N_EXPERT && c->tg == EM_TYPE_Q8_0 && c->td == EM_TYPE_Q8_0) {
        random_routes(ids, w, NW, K, c->n_expert, 0);
        up(di, ids, (uint64_t)NW * K * 4);
        float t[2][7];
        for (int rep = -1; rep < 7; rep++)
            for (int v = 0; v < 2; v++) {
                em_gpu_mark(G, 0, &E);
                if (v) em_gpu_moe_wide(G, &f->ex, dx, H, NW, di, dw, K, dsw, dy, H, &E);
                else
                    for (int r = 0; r < NW; r += R)
                        em_gpu_moe(G, &f->ex, dx + (int64_t)r * H, H, R, di + r * K, dw + r * K, K, ds,
                                   dy + (int64_t)r * H, H, &E);
                em_gpu_mark(G, 1, &E);
                float ms = 0;
                em_gpu_elapsed_ms(G, &ms, &E);
                if (rep >= 0) t[v][rep] = ms;
            }
        qsort(t[0], 7, sizeof t[0][0], cmp_float), qsort(t[1], 7, sizeof t[1][0], cmp_float);
        printf("info %s: %d rows (uniform routes, median of 7): %d calls of %d rows %.3f ms, one wide call %.3f ms\n",
               c->name, NW, NW / R, R, t[0][3], t[1][3]);
    }
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, dw), em_gpu_free(G, di), em_gpu_free(G, ds), em_gpu_free(G, dsw);
    free(ids), free(w), free(x), free(got), free(want);
}

/* One layer: 16 rows against the CPU twin, bit-exact against the dense composition, width
 * invariance (n = 1..16 memcmp-equal to one-row calls, every output written), graph replay. */
static void test_moe(moe_fix *f, double tol_l2, double tol_max) {
    const moe_cfg *c = &f->c;
    const int K = c->k;
    const int64_t H = c->hidden;
    const char *name = c->name;
    char nm[96];
    int32_t ids[R * 32];
    float w[R * 32];
    random_routes(ids, w, R, K, c->n_expert, 1);
    float *x = xmalloc((size_t)R * H * 4), *ref = xmalloc((size_t)R * H * 4), *got = xmalloc((size_t)R * H * 4);
    fill(x, (int64_t)R * H, 1.0f);
    moe_ref(f, x, ids, w, R, ref);
    float *dx = dalloc((uint64_t)R * H * 4), *dy = dalloc((uint64_t)R * H * 4), *dw = dalloc((uint64_t)R * K * 4);
    int32_t *di = dalloc((uint64_t)R * K * 4);
    void *ds = dalloc(em_gpu_moe_scratch_bytes(c->n_expert, K, c->ffn, H, R));
    up(dx, x, (uint64_t)R * H * 4), up(di, ids, (uint64_t)R * K * 4), up(dw, w, (uint64_t)R * K * 4);
    poison(dy, (uint64_t)R * H * 4);
    TRY(name, em_gpu_moe(G, &f->ex, dx, H, R, di, dw, K, ds, dy, H, &E));
    TRY(name, down(got, dy, (uint64_t)R * H * 4));
    snprintf(nm, sizeof nm, "%s vs cpu", name);
    record_cmp(nm, compare(got, ref, (int64_t)R * H), tol_l2, tol_max);
    /* the dense products of each row's experts, composed: the same bits */
    float *dense = xmalloc((size_t)R * H * 4);
    snprintf(nm, sizeof nm, "%s == dense", name);
    if (moe_dense(f, dx, ids, w, R, dense)) {
        record(nm, 0, "dense composition: %s", E.msg);
    } else {
        const cmp cd = compare(got, dense, (int64_t)R * H);
        record(nm, cd.identical == (int64_t)R * H, "bit-identical to em_gpu_matmul per expert + host sum: %lld/%lld",
               (long long)cd.identical, (long long)R * H);
    }
    free(dense);
    /* width invariance: row j of an n-row call equals the one-row call of row j */
    float *one = xmalloc((size_t)R * H * 4);
    for (int j = 0; j < R; j++) {
        poison(dy, (uint64_t)H * 4);
        TRY(name, em_gpu_moe(G, &f->ex, dx + (int64_t)j * H, H, 1, di + j * K, dw + j * K, K, ds, dy, H, &E));
        TRY(name, down(one + (int64_t)j * H, dy, (uint64_t)H * 4));
    }
    int differ = 0;
    int64_t unw = 0;
    for (int n = 1; n <= R; n++) {
        poison(dy, (uint64_t)R * H * 4);
        TRY(name, em_gpu_moe(G, &f->ex, dx, H, n, di, dw, K, ds, dy, H, &E));
        TRY(name, down(got, dy, (uint64_t)R * H * 4));
        differ += memcmp(got, one, (size_t)n * H * 4) != 0;
        unw += unwritten(got, (int64_t)n * H);
    }
    snprintf(nm, sizeof nm, "%s width", name);
    record(nm, differ == 0 && unw == 0, "n=1..16 rows memcmp-equal to n=1: %s; unwritten %lld", differ ? "NO" : "yes",
           (long long)unw);
    test_moe_shares(f, dx, di, dw, one);
    test_moe_wide(f);
    /* one row that chose an expert twice, through down and the sum in one launch (Q8_0 down):
     * both slots' weights on the expert's one output, in slot order, as the dense composition
     * adds them (em_gpu_route never repeats an expert; the other paths assume it) */
    if (c->td == EM_TYPE_Q8_0) {
        int32_t rid[32];
        float rw[32], *rep = xmalloc((size_t)H * 4), *rdense = xmalloc((size_t)H * 4);
        memcpy(rid, ids, (size_t)K * 4), memcpy(rw, w, (size_t)K * 4);
        rid[K - 1] = rid[0];
        up(di, rid, (uint64_t)K * 4), up(dw, rw, (uint64_t)K * 4);
        poison(dy, (uint64_t)H * 4);
        TRY(name, em_gpu_moe(G, &f->ex, dx, H, 1, di, dw, K, ds, dy, H, &E));
        TRY(name, down(rep, dy, (uint64_t)H * 4));
        snprintf(nm, sizeof nm, "%s repeated id", name);
        if (moe_dense(f, dx, rid, rw, 1, rdense)) record(nm, 0, "dense composition: %s", E.msg);
        else record(nm, memcmp(rep, rdense, (size_t)H * 4) == 0, "one row bit-identical to the dense composition");
        free(rep), free(rdense);
    }
    up(di, ids, (uint64_t)R * K * 4), up(dw, w, (uint64_t)R * K * 4);
    /* inputs the caller made Q8_0 (em_gpu_moe_prepared), and launches without overlap: the same bits */
    if (em_gpu_act_type(c->tg) == EM_TYPE_Q8_0 || em_gpu_act_type(c->tu) == EM_TYPE_Q8_0) {
        void *dq = dalloc(em_gpu_act_bytes(EM_TYPE_Q8_0, H, R));
        em_gpu_act xa;
        poison(dy, (uint64_t)R * H * 4);
        TRY(name, em_gpu_act_prepare(G, EM_TYPE_Q8_0, dx, H, H, R, dq, &xa, &E));
        TRY(name, em_gpu_moe_prepared(G, &f->ex, dx, H, R, &xa, di, dw, K, ds, dy, H, &E));
        TRY(name, down(got, dy, (uint64_t)R * H * 4));
        snprintf(nm, sizeof nm, "%s prepared inputs", name);
        record(nm, memcmp(got, one, (size_t)R * H * 4) == 0, "em_gpu_moe_prepared == em_gpu_moe (16 rows)");
        em_gpu_free(G, dq);
    }
    em_gpu_set_overlap(G, false);
    poison(dy, (uint64_t)R * H * 4);
    TRY(name, em_gpu_moe(G, &f->ex, dx, H, R, di, dw, K, ds, dy, H, &E));
    em_gpu_set_overlap(G, true);
    TRY(name, down(got, dy, (uint64_t)R * H * 4));
    snprintf(nm, sizeof nm, "%s no overlap", name);
    record(nm, memcmp(got, one, (size_t)R * H * 4) == 0, "launches without overlap (EMBER_GPU_PDL=0) give the same bits");
    /* graph: the whole layer captured once for 16 rows, replayed equal */
    em_gpu_graph *gr = NULL;
    poison(dy, (uint64_t)R * H * 4);
    TRY(name, em_gpu_sync(G, &E));
    TRY(name, em_gpu_capture_begin(G, &E));
    int rc = em_gpu_moe(G, &f->ex, dx, H, R, di, dw, K, ds, dy, H, &E);
    em_err e2;
    int rc2 = em_gpu_capture_end(G, &gr, &e2);
    snprintf(nm, sizeof nm, "%s graph replay", name);
    if (rc || rc2) {
        record(nm, 0, "%s", rc ? E.msg : e2.msg);
    } else {
        TRY(name, em_gpu_graph_launch(G, gr, &E));
        TRY(name, down(got, dy, (uint64_t)R * H * 4));
        record(nm, memcmp(got, one, (size_t)R * H * 4) == 0, "16 rows, captured layer == plain calls");
        em_gpu_graph_free(gr);
    }
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, dw), em_gpu_free(G, di), em_gpu_free(G, ds);
    free(x), free(ref), free(got), free(one);
}

/* The communicator of expert shares: one device needs no NCCL and exchanges nothing; a device
 * listed twice, no device or too many are refused with a message; a combine of bad shares too. */
static void test_ep(void) {
    em_gpu_ep *ep = NULL;
    em_gpu *g2 = NULL;
    float *buf = dalloc(256);
    void *bufs[1] = { buf };
    const void *src[1] = { buf };
    int rc = em_gpu_ep_open(&G, 1, &ep, &E);
    record("ep one device", !rc && em_gpu_ep_devices(ep) == 1 && !em_gpu_ep_broadcast(ep, bufs, 256, &E) &&
                                !em_gpu_ep_gather(ep, src, bufs, 256, &E),
           "a communicator of one device, its exchanges no-ops: %s", rc ? E.msg : "ok");
    em_gpu_ep_close(ep);
    rc = em_gpu_open(em_gpu_get_info(G)->index, &g2, &E);
    em_gpu *two[2] = { G, g2 };
    rc = rc ? rc : em_gpu_ep_open(two, 2, &ep, &E);
    record("ep device twice", rc == EM_EINVAL && strstr(E.msg, "listed twice") && !ep, "%s", E.msg);
    em_gpu_close(g2);
    rc = em_gpu_ep_open(&G, 0, &ep, &E);
    record("ep no device", rc == EM_EINVAL && strstr(E.msg, "0 devices"), "%s", E.msg);
    em_gpu_moe_parts parts = { .out = { buf }, .first = { 0, 0 }, .n = 1 };
    int32_t *di = dalloc(64);
    rc = em_gpu_moe_combine(G, &parts, di, buf, 1, 2, 32, buf, 32, &E);
    record("moe combine empty share", rc == EM_EINVAL && strstr(E.msg, "share 0"), "%s", E.msg);
    em_gpu_free(G, buf), em_gpu_free(G, di);
}

/* Bad MoE arguments: EM_EINVAL naming what is wrong, nothing launched. */
static void test_moe_errors(moe_fix *f) {
    const moe_cfg *c = &f->c;
    float *dx = dalloc((uint64_t)R * c->hidden * 4 + 256), *dy = dalloc((uint64_t)R * c->hidden * 4);
    int32_t *di = dalloc((uint64_t)R * c->k * 4);
    float *dw = dalloc((uint64_t)R * c->k * 4);
    void *ds = dalloc(em_gpu_moe_scratch_bytes(c->n_expert, c->k, c->ffn, c->hidden, R));
    em_gpu_experts ex = f->ex;
    ex.act = 7;
    int rc = em_gpu_moe(G, &ex, dx, c->hidden, 1, di, dw, c->k, ds, dy, c->hidden, &E);
    record("error: moe activation 7", rc == EM_EINVAL && strstr(E.msg, "activation 7"), "%s", E.msg);
    ex = f->ex, ex.act = EM_GPU_ACT_SITU, ex.situ_beta = 0.0f;
    rc = em_gpu_moe(G, &ex, dx, c->hidden, 1, di, dw, c->k, ds, dy, c->hidden, &E);
    record("error: moe situ beta 0", rc == EM_EINVAL && strstr(E.msg, "beta 0"), "%s", E.msg);
    em_gpu_mat bad = *f->ex.down;
    bad.type = EM_TYPE_Q5_K;
    ex = f->ex, ex.down = &bad;
    rc = em_gpu_moe(G, &ex, dx, c->hidden, 1, di, dw, c->k, ds, dy, c->hidden, &E);
    record("error: moe down of type q5_K", rc == EM_EINVAL && strstr(E.msg, "q5_K"), "%s", E.msg);
    ex = f->ex, ex.ffn = c->ffn / 2;
    rc = em_gpu_moe(G, &ex, dx, c->hidden, 1, di, dw, c->k, ds, dy, c->hidden, &E);
    record("error: moe shapes", rc == EM_EINVAL && strstr(E.msg, "expert shapes"), "%s", E.msg);
    rc = em_gpu_moe(G, &f->ex, dx, c->hidden, 17, di, dw, c->k, ds, dy, c->hidden, &E);
    record("error: moe 17 rows", rc == EM_EINVAL && strstr(E.msg, "17 rows"), "%s", E.msg);
    if (em_gpu_act_type(c->tg) == EM_TYPE_F32 || em_gpu_act_type(c->tu) == EM_TYPE_F32) {
        rc = em_gpu_moe(G, &f->ex, dx + 1, c->hidden, 1, di, dw, c->k, ds, dy, c->hidden, &E);
        record("error: moe f32 rows misaligned", rc == EM_EINVAL && strstr(E.msg, "16-byte"), "%s", E.msg);
    }
    rc = em_gpu_sync(G, &E);
    record("error: moe context usable after", rc == 0, "%s", rc ? E.msg : "sync ok");
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, di), em_gpu_free(G, dw), em_gpu_free(G, ds);
}

/* Median microseconds of 11 timed layers at n rows (uniform routes). */
static double moe_time(moe_fix *f, int n) {
    const moe_cfg *c = &f->c;
    int32_t ids[R * 32];
    float w[R * 32];
    random_routes(ids, w, n, c->k, c->n_expert, 0);
    float *dx = dalloc((uint64_t)R * c->hidden * 4), *dy = dalloc((uint64_t)R * c->hidden * 4), *dw = dalloc(sizeof w);
    int32_t *di = dalloc(sizeof ids);
    void *ds = dalloc(em_gpu_moe_scratch_bytes(c->n_expert, c->k, c->ffn, c->hidden, R));
    em_gpu_memset(G, dx, 0, (uint64_t)R * c->hidden * 4, &E);
    up(di, ids, sizeof ids), up(dw, w, sizeof w);
    float t[11];
    for (int rep = -2; rep < 11; rep++) {
        em_gpu_mark(G, 0, &E);
        em_gpu_moe(G, &f->ex, dx, c->hidden, n, di, dw, c->k, ds, dy, c->hidden, &E);
        em_gpu_mark(G, 1, &E);
        float ms = 0;
        em_gpu_elapsed_ms(G, &ms, &E);
        if (rep >= 0) t[rep] = ms;
    }
    qsort(t, 11, sizeof t[0], cmp_float);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, dw), em_gpu_free(G, di), em_gpu_free(G, ds);
    return t[5] * 1e3;
}

static int moe_wide_only; /* --moe-wide: the wide calls of the Q8_0 configurations alone */

/* Every expert type at Kimi-Linear-48B's shape (256 x ffn 1024 x hidden 2304, top-8), then
 * small layers with gate/up/down of different types and K3's SiTU. Tolerances against the CPU:
 * same activations (Q8_0 for Q8_0/MXFP4, F32 for float weights): rel L2 1e-4 (a hidden value's
 * Q8_0 quant can flip where CUDA's expf/tanhf and libm's differ by an ulp); Q4_K/Q6_K (the CPU
 * takes Q8_K activations): 3e-2 (three products, each within the 2e-2 of the matmul checks);
 * the exact check is "== dense" (bit-identical to the dense products). Returns the Q8_0 Kimi fixture open in keep (for the bench). */
static int test_moe_all(moe_fix *keep) {
    const moe_cfg kimi[] = {
        { "moe 256x(1024x2304) top-8 q8_0", EM_TYPE_Q8_0, EM_TYPE_Q8_0, EM_TYPE_Q8_0, N_EXPERT, FFN_EXP, HIDDEN, TOP_K, 0, 0, 0 },
        { "moe 256x(1024x2304) top-8 f32", EM_TYPE_F32, EM_TYPE_F32, EM_TYPE_F32, N_EXPERT, FFN_EXP, HIDDEN, TOP_K, 0, 0, 0 },
        { "moe 256x(1024x2304) top-8 bf16", EM_TYPE_BF16, EM_TYPE_BF16, EM_TYPE_BF16, N_EXPERT, FFN_EXP, HIDDEN, TOP_K, 0, 0, 0 },
        { "moe 256x(1024x2304) top-8 q4_K", EM_TYPE_Q4_K, EM_TYPE_Q4_K, EM_TYPE_Q4_K, N_EXPERT, FFN_EXP, HIDDEN, TOP_K, 0, 0, 0 },
        { "moe 256x(1024x2304) top-8 q6_K", EM_TYPE_Q6_K, EM_TYPE_Q6_K, EM_TYPE_Q6_K, N_EXPERT, FFN_EXP, HIDDEN, TOP_K, 0, 0, 0 },
        { "moe 256x(1024x2304) top-8 mxfp4", EM_TYPE_MXFP4, EM_TYPE_MXFP4, EM_TYPE_MXFP4, N_EXPERT, FFN_EXP, HIDDEN, TOP_K, 0, 0, 0 },
        { "moe 32x(512x768) top-4 f16", EM_TYPE_F16, EM_TYPE_F16, EM_TYPE_F16, 32, 512, 768, 4, 0, 0, 0 },
        { "moe 32x(512x512) q4_K/q6_K/bf16", EM_TYPE_Q4_K, EM_TYPE_Q6_K, EM_TYPE_BF16, 32, 512, 512, 4, 0, 0, 0 },
        { "moe 32x(512x512) bf16/q8_0/mxfp4", EM_TYPE_BF16, EM_TYPE_Q8_0, EM_TYPE_MXFP4, 32, 512, 512, 4, 0, 0, 0 },
        { "moe 32x(512x1024) top-6 situ q8_0", EM_TYPE_Q8_0, EM_TYPE_Q8_0, EM_TYPE_Q8_0, 32, 512, 1024, 6, EM_GPU_ACT_SITU, 2.0f, 6.0f },
        { "moe 32x(256x512) situ f32/mxfp4/q6_K", EM_TYPE_F32, EM_TYPE_MXFP4, EM_TYPE_Q6_K, 32, 256, 512, 8, EM_GPU_ACT_SITU, 1.5f, 0.0f },
        /* hidden rows made inside down up to 8 rows, by launches of their own past that */
        { "moe 16x(3072x256) top-4 q8_0", EM_TYPE_Q8_0, EM_TYPE_Q8_0, EM_TYPE_Q8_0, 16, 3072, 256, 4, 0, 0, 0 },
    };
    int kept = 0;
    for (size_t i = 0; i < sizeof kimi / sizeof kimi[0]; i++) {
        const moe_cfg *c = &kimi[i];
        moe_fix f;
        if (moe_open(&f, c)) {
            record(c->name, 0, "upload: %s", E.msg);
            moe_close(&f);
            continue;
        }
        if (moe_wide_only) { /* the wide calls of the all-Q8_0 configurations alone */
            if (c->tg == EM_TYPE_Q8_0 && c->tu == EM_TYPE_Q8_0 && c->td == EM_TYPE_Q8_0) test_moe_wide(&f);
            moe_close(&f);
            continue;
        }
        const int kq = c->tg == EM_TYPE_Q4_K || c->tg == EM_TYPE_Q6_K || c->tu == EM_TYPE_Q4_K || c->tu == EM_TYPE_Q6_K ||
                       c->td == EM_TYPE_Q4_K || c->td == EM_TYPE_Q6_K;
        /* Q8_0 hidden rows: a value whose CUDA expf and libm expf differ by an ulp can round to
         * the other quant, each such flip worth a quant step of one expert's output (run 9:
         * rel L2 up to 1.3e-4 on Q8_0 down weights) */
        test_moe(&f, kq ? 3e-2 : 3e-4, kq ? 5e-2 : 1e-3);
        if (i == sizeof kimi / sizeof kimi[0] - 1) test_moe_errors(&f);
        if (c->n_expert == N_EXPERT)
            printf("info %s: layer n=1 %.1f us, n=16 %.1f us (uniform routes, median of 11)\n", c->name, moe_time(&f, 1),
                   moe_time(&f, R));
        if (i == 0) {
            *keep = f, kept = 1;
            keep->ex.gate = &keep->gate, keep->ex.up = &keep->up, keep->ex.down = &keep->down;
        } else {
            moe_close(&f);
        }
    }
    return kept;
}

/* One MoE layer's routed experts at n rows: time (median of 21) and the bytes of the union. */
static void bench_moe(moe_fix *f) {
    float *x = xmalloc((size_t)R * HIDDEN * 4);
    fill(x, (int64_t)R * HIDDEN, 1.0f);
    float *dx = dalloc((uint64_t)R * HIDDEN * 4), *dy = dalloc((uint64_t)R * HIDDEN * 4), *dw = dalloc(R * TOP_K * 4);
    int32_t *di = dalloc(R * TOP_K * 4);
    void *ds = dalloc(em_gpu_moe_scratch_bytes(N_EXPERT, TOP_K, FFN_EXP, HIDDEN, R));
    up(dx, x, (uint64_t)R * HIDDEN * 4);
    const double expert_bytes = 3.0 * FFN_EXP * HIDDEN * 34.0 / 32.0;
    for (int share = 0; share < 2; share++) {
        printf("bench moe layer (%s routes):", share ? "half shared by neighbours" : "uniform");
        double t1 = 0;
        for (int n = 1; n <= R; n *= 2) {
            int32_t ids[R * TOP_K];
            float w[R * TOP_K];
            random_routes(ids, w, n, TOP_K, N_EXPERT, share);
            char seen[N_EXPERT] = { 0 };
            int un = 0;
            for (int i = 0; i < n * TOP_K; i++) un += !seen[ids[i]]++;
            up(di, ids, (uint64_t)n * TOP_K * 4), up(dw, w, (uint64_t)n * TOP_K * 4);
            float t[21];
            for (int rep = -3; rep < 21; rep++) {
                em_gpu_mark(G, 0, &E);
                em_gpu_moe(G, &f->ex, dx, HIDDEN, n, di, dw, TOP_K, ds, dy, HIDDEN, &E);
                em_gpu_mark(G, 1, &E);
                float ms = 0;
                if (em_gpu_elapsed_ms(G, &ms, &E)) break;
                if (rep >= 0) t[rep] = ms;
            }
            qsort(t, 21, sizeof t[0], cmp_float);
            const double s = t[10] * 1e-3;
            if (n == 1) t1 = s;
            printf("  n=%d union %d: %.1f us %.0f GB/s (t/t1 %.2f)", n, un, s * 1e6, un * expert_bytes / s / 1e9, s / t1);
        }
        printf("\n");
    }
    fflush(stdout);
    em_gpu_free(G, dx), em_gpu_free(G, dy), em_gpu_free(G, dw), em_gpu_free(G, di), em_gpu_free(G, ds);
    free(x);
}

static void test_all_but_moe(void) {
    test_errors();
    const int types[] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16, EM_TYPE_Q8_0 };
    for (int t = 0; t < 4; t++) {
        test_matmul(types[t], FFN_EXP, HIDDEN);             /* an expert's gate / up */
        test_matmul(types[t], HIDDEN, FFN_EXP);             /* an expert's down */
        test_matmul(types[t], KDA_HEADS * KDA_DIM, HIDDEN); /* a KDA q / k / v projection */
    }
    test_matmul(EM_TYPE_F32, N_EXPERT, HIDDEN); /* a MoE router (one row: every load at once, mm_deep) */
    test_matmul(EM_TYPE_Q8_0, VOCAB, HIDDEN); /* the LM head */
    test_matmul(EM_TYPE_Q8_0, 1001, 512);     /* rows not a multiple of a warp's 4 outputs */
    test_matmul(EM_TYPE_BF16, 1003, 512);
    {
        const int one[][4] = { { EM_TYPE_Q8_0, EM_TYPE_Q8_0, EM_TYPE_Q8_0, EM_TYPE_Q8_0 },
                               { EM_TYPE_F32, EM_TYPE_F32, EM_TYPE_F32, EM_TYPE_F32 },
                               { EM_TYPE_Q4_K, EM_TYPE_Q4_K, EM_TYPE_Q4_K, EM_TYPE_Q4_K } };
        const int mix[4] = { EM_TYPE_Q8_0, EM_TYPE_F32, EM_TYPE_F32, EM_TYPE_Q8_0 };
        for (int t = 0; t < 3; t++) {
            char nm[64];
            snprintf(nm, sizeof nm, "matmul multi %s (4 products)", em_type_name(one[t][0]));
            test_matmul_multi(one[t], nm);
        }
        test_matmul_multi(mix, "matmul multi q8_0 + f32 (4 products)");
    }
    test_matmul_wide(EM_TYPE_Q8_0, KDA_HEADS * KDA_DIM, HIDDEN); /* a KDA projection */
    test_matmul_wide(EM_TYPE_Q8_0, HIDDEN, KDA_HEADS * KDA_DIM); /* its output */
    test_matmul_wide(EM_TYPE_Q8_0, FFN_EXP, HIDDEN);             /* a shared expert's gate */
    test_matmul_wide(EM_TYPE_Q8_0, 256, 256);   /* the default target: 8 blocks a row, most lanes idle */
    test_matmul_wide(EM_TYPE_Q8_0, 1001, 96);   /* 3 blocks a row, outputs past a block's 32 */
    test_matmul_wide(EM_TYPE_Q4_K, 1001, 512);  /* other types: chunks */
    test_matmul_wide(EM_TYPE_F32, N_EXPERT, HIDDEN);
    test_matmul_multi_wide();
    test_in_block(EM_TYPE_Q8_0, HIDDEN, FFN_EXP); /* a shared expert's down */
    test_in_block(EM_TYPE_Q8_0, KDA_HEADS * KDA_DIM, KDA_DIM); /* a KDA low-rank up */
    test_in_block(EM_TYPE_Q4_K, 1001, 512);
    test_in_block(EM_TYPE_Q6_K, 512, 256);
    test_in_block(EM_TYPE_MXFP4, 768, 64);
    test_add_rmsnorm();
    test_rmsnorm("rmsnorm 16x2304", R, HIDDEN);
    test_rmsnorm("rmsnorm 16x32 heads of 128", R * KDA_HEADS, KDA_DIM);
    test_rmsnorm("rmsnorm 16x512 (kv_lora)", R, 512);
    test_elementwise();
    test_embed(EM_TYPE_F32, 4096);
    test_embed(EM_TYPE_F16, 4096);
    test_embed(EM_TYPE_BF16, 4096);
    test_embed(EM_TYPE_Q8_0, VOCAB);
    test_argmax();
    test_rope();
    test_route(N_EXPERT, TOP_K, 1, 1, false);
    test_route(N_EXPERT, TOP_K, 8, 4, false);
    test_route(N_EXPERT, TOP_K, 1, 1, true);
    test_route(16, 2, 1, 1, false); /* the default pair's router: half the lanes hold no expert */
    test_route(16, 2, 1, 1, true);
    test_route(384, 16, 1, 1, false);
    test_route(1000, 32, 8, 2, true);
    test_graph();
    test_quant_types(); /* wt-cuda3 */
    test_heads();       /* wt-mla */
}

int main(int argc, char **argv) {
    const char *dev = "cuda:0";
    int bench = 1, moe_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev = argv[++i];
        else if (!strcmp(argv[i], "--no-bench")) bench = 0;
        else if (!strcmp(argv[i], "--moe-only")) moe_only = 1, bench = 0;
        else if (!strcmp(argv[i], "--moe-wide")) moe_only = 1, moe_wide_only = 1, bench = 0;
        else {
            fprintf(stderr, "usage: %s [--device cuda:N] [--no-bench] [--moe-only] [--moe-wide]\n", argv[0]);
            return 2;
        }
    }
    int idx = 0;
    if (em_gpu_parse_device(dev, &idx, &E) || em_gpu_open(idx, &G, &E)) {
        fprintf(stderr, "test_gpu_ops: %s\n", E.msg);
        return 2;
    }
    const em_gpu_info *in = em_gpu_get_info(G);
    uint64_t fr = 0, tot = 0;
    em_gpu_mem(G, &fr, &tot, &E);
    printf("device cuda:%d %s, cc %d.%d, %d SMs, L2 %llu MB, %.1f of %.1f GiB free, driver %d\n", in->index, in->name,
           in->cc_major, in->cc_minor, in->sm_count, (unsigned long long)in->l2_bytes >> 20, fr / 1073741824.0,
           tot / 1073741824.0, in->driver_version);

    if (!moe_only) test_all_but_moe();
    if (!moe_wide_only) test_rowops_k3();
    moe_fix mf;
    const int have_moe = test_moe_all(&mf);
    if (!moe_wide_only) test_ep();
    if (bench) {
        if (have_moe) bench_moe(&mf);
        bench_matmul(EM_TYPE_Q8_0, VOCAB, HIDDEN, "LM head 163840x2304");
        bench_matmul(EM_TYPE_Q8_0, 4 * 16384, 4096, "65536x4096");
        bench_matmul(EM_TYPE_Q8_0, FFN_EXP, HIDDEN, "expert gate 1024x2304");
        /* wt-cuda3: the quantized types at Kimi shapes */
        const int qt[] = { EM_TYPE_Q4_K, EM_TYPE_Q6_K, EM_TYPE_MXFP4 };
        for (int t = 0; t < 3; t++) {
            bench_matmul(qt[t], VOCAB, HIDDEN, "LM head 163840x2304");
            bench_matmul(qt[t], 4096, HIDDEN, "4096x2304");
            bench_matmul(qt[t], FFN_EXP, HIDDEN, "expert gate 1024x2304");
            bench_matmul(qt[t], HIDDEN, FFN_EXP, "expert down 2304x1024");
        }
        bench_matmul(EM_TYPE_BF16, 16384, 8192, "16384x8192");
        bench_matmul(EM_TYPE_F16, 16384, 8192, "16384x8192");
        bench_matmul(EM_TYPE_F32, 8192, 8192, "8192x8192");
        bench_heads(EM_TYPE_Q8_0, 512, 128, MLA_QK, 512 + ROPE_DIMS, "k_b 32x512x128"); /* wt-mla */
        bench_heads(EM_TYPE_Q8_0, 128, 512, 512, 128, "v_b 32x128x512");
        bench_heads(EM_TYPE_BF16, 512, 128, MLA_QK, 512 + ROPE_DIMS, "k_b 32x512x128");
    }
    if (have_moe) moe_close(&mf);
    em_gpu_close(G);

    int fails = 0;
    printf("\n== GPU op checks (%s) ==\n", dev);
    for (int i = 0; i < n_res; i++) {
        printf("%-4s %s\n", res[i].ok ? "PASS" : "FAIL", res[i].name);
        fails += !res[i].ok;
    }
    printf("== %d checks, %d passed, %d failed ==\n", n_res, n_res - fails, fails);
    return fails ? 1 : 0;
}
