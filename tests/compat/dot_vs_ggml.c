/* compat_dot_vs_ggml BINS_DIR [VARIANT]: checks Ember's dot products against ggml's own CPU
 * backend (the prebuilt's libggml-cpu-<variant>.so, loaded with dlopen; by default the variant
 * whose ggml_backend_score is highest on this CPU, as ggml's loader picks it), per weight type
 * Ember has a dot kernel for:
 *   1. activations: the same f32 rows quantized by ggml's from_float for the type's
 *      vec_dot_type (what ggml's mul_mat runs, not the _ref quantizer) and by Ember's
 *      em_dot_quantize_act must be byte-identical, except for one known rule: for Q8_0, ggml's
 *      x86 CPU quantizer rounds ties to even where its _ref (and Ember) round them away from
 *      zero (see classify_act_diff; counted and printed, not a failure); any other difference
 *      fails, printed with ggml's _ref quantizer as a third opinion;
 *   2. dot products: ggml's vec_dot and Ember's kernels (every ISA level this CPU runs) on the
 *      same weight blocks (quantized by ggml from gaussian rows, and random blocks with sane
 *      scales) and the same activation bytes (ggml's), must agree within TOL relative to
 *      sum_i |w_i a_i| (both sides sum exact integer block products, then scale and add
 *      in float: only the float rounding of those steps may differ). The largest difference
 *      seen is printed per type and ISA, next to the end-to-end difference (Ember's kernel on
 *      Ember's activations vs ggml's vec_dot on ggml's).
 * Q4_1 / Q5_1 pair with Q8_1 in ggml (Q8_0 in Ember): the Q8_1 quants and scale must equal
 * Ember's Q8_0 ones, and Ember's kernel runs on those; the dot tolerance is looser (ggml uses
 * the fp16-rounded block sum s). F16 / BF16 are not compared: ggml rounds the activations to
 * F16 / BF16, Ember keeps f32 (by design).
 * Exit status 0 when everything agrees, 1 on a mismatch, 2 when the library cannot be used,
 * 77 when no CPU backend library / ggml_get_type_traits_cpu is there. Deterministic. */
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "base/base.h"
#include "ggml_api.h"
#include "quant/quant.h"

/* ggml-cpu.h (ggml-org/ggml, 2025-2026) */
typedef void (*ggml_vec_dot_t)(int n, float *s, size_t bs, const void *x, size_t bx,
                               const void *y, size_t by, int nrc);
struct ggml_type_traits_cpu {
    ggml_from_float_t from_float;
    ggml_vec_dot_t vec_dot;
    int vec_dot_type; /* enum ggml_type */
    int64_t nrows;    /* rows vec_dot processes at once */
};

/* Relative to sum |w_i a_i|. Both sides compute each block's integer sum exactly; what may
 * differ is float rounding of the per-block scaling (a few ulp per block) and of the order
 * the block terms are added in: at most ~(blocks + 3) * 2^-24 of sum |block term| in the
 * worst case, far less in practice (random signs). 1e-6 covers rows of up to ~8 blocks'
 * worst case and thousands of blocks' typical case. */
#define TOL 1e-6
#define TOL_Q8_1 2e-3 /* Q4_1 / Q5_1: ggml's min term uses s = fp16(d * sum q) */

typedef struct {
    ggml_lib lib;
    void *cpu;
    char variant[256];
    const struct ggml_type_traits_cpu *(*traits_cpu)(int type);
    void (*quantize_init)(int type);
    ggml_from_float_t q8_K_ref; /* quantize_row_q8_K_ref, libggml-base */
    int failures;
} checker;

/* ---- deterministic random numbers ------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static float rng_unit(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static float rng_gauss(uint64_t *s) {
    double u1 = ((double)(rng_next(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- activation rows ---------------------------------------------------------------- */

enum { ACT_GAUSS, ACT_UNIFORM, ACT_OUTLIERS, ACT_WIDE, ACT_SPARSE, ACT_TIES, ACT_COUNT };
static const char *const act_names[ACT_COUNT] = {
    "gauss", "uniform", "outliers", "wide-range", "sparse", "ties",
};

static void fill_act(float *x, int64_t n, int kind, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)kind + 7;
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case ACT_GAUSS: x[i] = rng_gauss(&s); break;
        case ACT_UNIFORM: x[i] = 0.1f * rng_unit(&s); break;
        case ACT_OUTLIERS: /* hidden states: mostly small, a few large channels */
            x[i] = rng_gauss(&s) * (rng_next(&s) % 64 == 0 ? 40.0f : 1.0f);
            break;
        case ACT_WIDE: x[i] = rng_unit(&s) * ldexpf(1.0f, (int)(rng_next(&s) % 17) - 8); break;
        case ACT_SPARSE: x[i] = rng_next(&s) % 5 == 0 ? rng_gauss(&s) : 0.0f; break;
        case ACT_TIES: /* block max 127 -> scale 1: every x.5 value is a rounding tie */
            x[i] = i % 32 == 0 ? 127.0f : (float)((int)(rng_next(&s) % 200) - 100) + 0.5f;
            break;
        }
    }
}

/* ---- the CPU backend library -------------------------------------------------------- */

static void *load_sym(void *h, const char *name) { return h ? dlsym(h, name) : NULL; }

/* dlopens BINS/libggml-cpu-VARIANT.so; when variant is NULL, every libggml-cpu-*.so and keeps
 * the one with the highest ggml_backend_score() (0: this CPU cannot run it). */
static int open_cpu_backend(checker *c, const char *bins, const char *variant) {
    char path[4096];
    if (variant) {
        snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", bins, variant);
        c->cpu = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!c->cpu) printf("note: dlopen %s: %s\n", path, dlerror());
        snprintf(c->variant, sizeof c->variant, "%s", variant);
        return c->cpu ? 0 : -1;
    }
    DIR *d = opendir(bins);
    if (!d) return -1;
    int best = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "libggml-cpu-", 12) != 0 || len < 16 ||
            strcmp(e->d_name + len - 3, ".so") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", bins, e->d_name);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        void *sym = load_sym(h, "ggml_backend_score");
        int (*score)(void) = NULL;
        memcpy(&score, &sym, sizeof sym);
        const int sc = score ? score() : 0;
        if (sc > best && load_sym(h, "ggml_get_type_traits_cpu")) {
            if (c->cpu) dlclose(c->cpu);
            c->cpu = h;
            best = sc;
            snprintf(c->variant, sizeof c->variant, "%.*s", (int)(len - 15), e->d_name + 12);
        } else if (h) {
            dlclose(h);
        }
    }
    closedir(d);
    return c->cpu ? 0 : -1;
}

/* The declared ggml_type_traits_cpu against symbols the library exports by name. */
static bool cpu_layout_ok(const checker *c) {
    const struct ggml_type_traits_cpu *q8 = c->traits_cpu(GGML_TYPE_Q8_0);
    const struct ggml_type_traits_cpu *k4 = c->traits_cpu(GGML_TYPE_Q4_K);
    const struct ggml_type_traits_cpu *q41 = c->traits_cpu(GGML_TYPE_Q4_1);
    void *vd = load_sym(c->cpu, "ggml_vec_dot_q8_0_q8_0"), *qr = load_sym(c->cpu, "quantize_row_q8_0");
    void *vk = load_sym(c->cpu, "ggml_vec_dot_q4_K_q8_K"), *qk = load_sym(c->cpu, "quantize_row_q8_K");
    void *a, *b, *e, *f;
    memcpy(&a, &q8->vec_dot, sizeof a);
    memcpy(&b, &q8->from_float, sizeof b);
    memcpy(&e, &k4->vec_dot, sizeof e);
    memcpy(&f, &c->traits_cpu(GGML_TYPE_Q8_K)->from_float, sizeof f);
    return q8 && k4 && q41 && vd && qr && vk && qk && a == vd && b == qr && e == vk && f == qk &&
           q8->vec_dot_type == GGML_TYPE_Q8_0 && k4->vec_dot_type == GGML_TYPE_Q8_K &&
           q41->vec_dot_type == GGML_TYPE_Q8_1 && q8->nrows >= 1 && q8->nrows <= 4;
}

/* ---- helpers -------------------------------------------------------------------------- */

static int64_t act_block_elems(int act_type) { return act_type == GGML_TYPE_Q8_K ? 256 : 32; }

static size_t act_block_bytes(int act_type) {
    return act_type == GGML_TYPE_Q8_K ? 292 : act_type == GGML_TYPE_Q8_1 ? 36 : 34;
}

/* Dequantized activations (d * q) of a Q8_0 / Q8_1 / Q8_K row, or a copy of an F32 row. */
static void act_values(int act_type, const uint8_t *act, int64_t n, double *out) {
    if (act_type == GGML_TYPE_F32) {
        const float *f = (const float *)act;
        for (int64_t i = 0; i < n; i++) out[i] = f[i];
        return;
    }
    const int64_t be = act_block_elems(act_type);
    const size_t bb = act_block_bytes(act_type);
    const size_t qoff = act_type == GGML_TYPE_Q8_K ? 4 : act_type == GGML_TYPE_Q8_1 ? 4 : 2;
    for (int64_t b = 0; b < n / be; b++) {
        const uint8_t *blk = act + b * bb;
        double d;
        if (act_type == GGML_TYPE_Q8_K) {
            float fd;
            memcpy(&fd, blk, 4);
            d = fd;
        } else {
            uint16_t h;
            memcpy(&h, blk, 2);
            d = em_fp16_to_fp32(h);
        }
        for (int64_t j = 0; j < be; j++) out[b * be + j] = d * (int8_t)blk[qoff + j];
    }
}

/* ggml's CPU backend quantizes Q8_0 activations (x86 AVX/AVX2/AVX-512 builds) as
 * round-half-even(x * (127 / amax)); its quantize_row_q8_0_ref, which em_quantize and
 * em_dot_quantize_act reproduce, as round-half-away(x * (1 / (amax / 127))). Both give the same
 * scale; a quant can differ by one where x * 127 / amax is (within an ulp of) a half-integer:
 * exact ties, and about 2 quants per million on gaussian rows. Such a difference is "known";
 * anything else (scale, bsums, a quant off by more, or Ember differing from ggml's _ref) is not.
 * Returns the number of unknown differences, printing the first few of each kind. */
static int64_t classify_act_diff(int act_type, const uint8_t *g, const uint8_t *e, const uint8_t *r,
                                 const float *x, int64_t n, int64_t *n_known, bool verbose) {
    const int64_t be = act_block_elems(act_type);
    const size_t bb = act_block_bytes(act_type);
    const size_t qoff = act_type == GGML_TYPE_Q8_K ? 4 : 2;
    int64_t unknown = 0, shown = 0;
    for (int64_t b = 0; b < n / be; b++) {
        const uint8_t *gb = g + b * bb, *eb = e + b * bb, *rb = r ? r + b * bb : NULL;
        if (!memcmp(gb, eb, bb)) continue;
        const float *xb = x + b * be;
        if (memcmp(gb, eb, qoff)) {
            unknown++;
            if (verbose && shown++ < 4)
                printf("      block %lld: scale differs (ggml %02x%02x.., Ember %02x%02x..)\n",
                       (long long)b, gb[0], gb[1], eb[0], eb[1]);
            continue;
        }
        if (act_type == GGML_TYPE_Q8_K && memcmp(gb + 260, eb + 260, 32)) {
            unknown++;
            if (verbose && shown++ < 4) printf("      block %lld: bsums differ\n", (long long)b);
        }
        float amax = 0.0f;
        for (int64_t j = 0; j < be; j++) amax = fmaxf(amax, fabsf(xb[j]));
        for (int64_t j = 0; j < be; j++) {
            const int gq = (int8_t)gb[qoff + j], eq = (int8_t)eb[qoff + j];
            if (gq == eq) continue;
            const int rq = rb ? (int8_t)rb[qoff + j] : 999;
            const float t = amax > 0.0f ? xb[j] * (127.0f / amax) : 0.0f;
            const float frac = fabsf(t - truncf(t));
            const bool near_tie = fabsf(frac - 0.5f) <= 4.0f * FLT_EPSILON * fmaxf(1.0f, fabsf(t));
            if (act_type == GGML_TYPE_Q8_0 && rq == eq && abs(gq - eq) == 1 && near_tie) {
                (*n_known)++;
                continue;
            }
            unknown++;
            if (verbose && shown++ < 4)
                printf("      block %lld value %lld: x = %.9g (x*127/amax = %.9g), ggml q = %d, "
                       "Ember q = %d, ggml _ref q = %d\n",
                       (long long)b, (long long)j, (double)xb[j], (double)t, gq, eq, rq);
        }
    }
    return unknown;
}

/* ---- weight rows ---------------------------------------------------------------------- */

/* A random fp16 of magnitude 2^-14 .. 2^1, random sign. */
static uint16_t sane_half(uint64_t *s) {
    return em_fp32_to_fp16(rng_unit(s) * ldexpf(1.0f, -(int)(rng_next(s) % 15)));
}

/* Random block bytes with sane scale fields (offsets as ggml lays the blocks out). */
static void random_blocks(int type, uint8_t *p, int64_t nblocks, size_t bb, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)nblocks * bb; i++) p[i] = (uint8_t)(rng_next(&s) >> 24);
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + b * bb;
        int off[2] = { -1, -1 };
        switch (type) {
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
            off[0] = 0, off[1] = 2;
            break;
        case GGML_TYPE_Q2_K: off[0] = 80, off[1] = 82; break;
        case GGML_TYPE_Q3_K: off[0] = 108; break;
        case GGML_TYPE_Q6_K: off[0] = 208; break;
        case GGML_TYPE_MXFP4: blk[0] = (uint8_t)(112 + rng_next(&s) % 24); break;
        case GGML_TYPE_IQ1_M: blk[55] &= (uint8_t)~0x40; break; /* finite d */
        case GGML_TYPE_F32: {
            float f = rng_gauss(&s);
            memcpy(blk, &f, 4);
            break;
        }
        case GGML_TYPE_F16: case GGML_TYPE_BF16: break;
        default: off[0] = 0; /* d first: Q4_0, Q5_0, Q8_0, IQ* */
        }
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                const uint16_t h = sane_half(&s);
                memcpy(blk + off[k], &h, 2);
            }
    }
}

/* ---- one type --------------------------------------------------------------------------- */

typedef struct {
    double max_rel[EM_ISA_COUNT]; /* Ember kernel vs ggml vec_dot, same activation bytes */
    bool isa_seen[EM_ISA_COUNT];
    double max_rel_e2e;           /* Ember on its own activations vs ggml on its own */
    double max_rel_ggml_exact;    /* ggml vec_dot vs the exact dot of the same quants */
    int64_t act_rows, act_same;
    int64_t act_known_rows, act_known_quants; /* rows differing only by classify_act_diff's known rule */
    bool act_comparable;
} type_result;

static const char *ggml_name(const checker *c, int t) { return c->lib.ggml_type_name(t); }

static void check_type(checker *c, int type) {
    const struct ggml_type_traits_cpu *tc = c->traits_cpu(type);
    const struct ggml_type_traits *tb = c->lib.ggml_get_type_traits(type);
    const int act_g = tc ? tc->vec_dot_type : -1, act_e = em_dot_act_type(type);
    if (!tc || !tc->vec_dot || act_e < 0) {
        printf("%-8s SKIP (no vec_dot in ggml or no kernel in Ember)\n", ggml_name(c, type));
        return;
    }
    const struct ggml_type_traits_cpu *ta = c->traits_cpu(act_g);
    if (act_g != GGML_TYPE_F32 && (!ta || !ta->from_float)) {
        printf("%-8s SKIP (ggml has no from_float for %s)\n", ggml_name(c, type), ggml_name(c, act_g));
        return;
    }
    const bool q8_1 = act_g == GGML_TYPE_Q8_1 && act_e == EM_TYPE_Q8_0;
    if (act_g != act_e && !q8_1) {
        printf("%-8s n/a  (ggml pairs it with %s, Ember with %s: different by design)\n",
               ggml_name(c, type), ggml_name(c, act_g), em_type_name(act_e));
        return;
    }
    if (c->quantize_init) c->quantize_init(type);

    enum { N_MAX = 7168 };
    static const int64_t lengths[] = { 256, 2048, 7168 };
    const int64_t wbe = tb->blck_size;
    const size_t wbb = tb->type_size;
    const bool needs_im = c->lib.ggml_quantize_requires_imatrix(type);
    float *x = malloc(N_MAX * sizeof *x), *wsrc = malloc(N_MAX * sizeof *wsrc);
    float *im = malloc(N_MAX * sizeof *im), *wf = malloc(N_MAX * sizeof *wf);
    double *av = malloc(N_MAX * sizeof *av);
    const size_t abytes = (size_t)N_MAX * 4 + 64; /* F32 rows are the largest */
    uint8_t *ag = malloc(abytes), *ae = malloc(abytes), *ar = malloc(abytes), *ae8 = malloc(abytes);
    uint8_t *w = malloc((size_t)N_MAX / (size_t)wbe * wbb + 64);
    if (!x || !wsrc || !im || !wf || !av || !ag || !ae || !ar || !ae8 || !w) abort();
    for (int i = 0; i < N_MAX; i++) im[i] = 1.0f;

    type_result r = { .act_comparable = !q8_1 };
    bool act_ok = true, dot_ok = true;
    const double tol = q8_1 ? TOL_Q8_1 : TOL;
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const int64_t n = lengths[li];
        if (n % wbe) continue;
        for (int wsrc_kind = 0; wsrc_kind < 3; wsrc_kind++) {
            /* weights: 0, 1 quantized by ggml from gaussian rows; 2 random blocks */
            uint64_t s = 1000 + (uint64_t)type * 31 + (uint64_t)li * 7 + (uint64_t)wsrc_kind;
            if (wsrc_kind < 2) {
                for (int64_t i = 0; i < n; i++) wsrc[i] = 0.02f * rng_gauss(&s);
                if (type == GGML_TYPE_F32)
                    memcpy(w, wsrc, (size_t)n * 4);
                else
                    c->lib.ggml_quantize_chunk(type, wsrc, w, 0, 1, n, needs_im ? im : NULL);
            } else {
                random_blocks(type, w, n / wbe, wbb, s);
            }
            if (type == GGML_TYPE_F32)
                memcpy(wf, w, (size_t)n * 4);
            else
                tb->to_float(w, wf, n);
            for (int kind = 0; kind < ACT_COUNT; kind++) {
                fill_act(x, n, kind, (uint64_t)(li * 100 + wsrc_kind * 10) + (uint64_t)type);
                const size_t nb = act_g == GGML_TYPE_F32 ? (size_t)n * 4
                                                         : (size_t)(n / act_block_elems(act_g)) * act_block_bytes(act_g);
                memset(ag, 0, abytes), memset(ae, 0, abytes), memset(ar, 0, abytes);
                if (act_g == GGML_TYPE_F32)
                    memcpy(ag, x, nb);
                else
                    ta->from_float(x, ag, n);
                em_err err = { 0 };
                if (em_dot_quantize_act(type, x, ae, n, &err) != EM_OK) {
                    printf("  em_dot_quantize_act: %s\n", err.msg);
                    act_ok = false;
                    continue;
                }
                /* Q4_1 / Q5_1: ggml's Q8_1 as Q8_0 (d and quants), for the comparison
                 * and for Ember's kernels */
                if (q8_1)
                    for (int64_t b = 0; b < n / 32; b++) {
                        memcpy(ae8 + b * 34, ag + b * 36, 2);
                        memcpy(ae8 + b * 34 + 2, ag + b * 36 + 4, 32);
                    }
                const uint8_t *ggml_act = q8_1 ? ae8 : ag;
                const int cmp_type = q8_1 ? GGML_TYPE_Q8_0 : act_g;
                const size_t cmp_bytes = q8_1 ? (size_t)(n / 32) * 34 : nb;
                /* (1) activation bytes */
                r.act_rows++;
                if (!memcmp(ggml_act, ae, cmp_bytes)) {
                    r.act_same++;
                } else {
                    const uint8_t *ref = NULL;
                    if (cmp_type == GGML_TYPE_Q8_0) {
                        c->lib.ggml_get_type_traits(GGML_TYPE_Q8_0)->from_float_ref(x, ar, n);
                        ref = ar;
                    } else if (cmp_type == GGML_TYPE_Q8_K && c->q8_K_ref) {
                        memset(ar, 0, abytes);
                        c->q8_K_ref(x, ar, n);
                        ref = ar;
                    }
                    int64_t known = 0;
                    const int64_t unknown = classify_act_diff(cmp_type, ggml_act, ae, ref, x, n, &known, false);
                    r.act_known_quants += known;
                    r.act_known_rows += unknown == 0;
                    if (unknown) {
                        printf("  %s: activations (%s, n=%lld, %s rows) differ beyond the known "
                               "rounding rule (%lld unexplained):\n", ggml_name(c, type),
                               ggml_name(c, act_g), (long long)n, act_names[kind], (long long)unknown);
                        classify_act_diff(cmp_type, ggml_act, ae, ref, x, n, &known, true);
                        act_ok = false;
                    }
                }
                /* (2) dot products on the same activation bytes */
                act_values(act_g, ag, n, av);
                double mag = 0.0, exact = 0.0;
                for (int64_t i = 0; i < n; i++) {
                    mag += fabs((double)wf[i] * av[i]);
                    exact += (double)wf[i] * av[i];
                }
                if (mag == 0.0) mag = 1e-30;
                float g = 0.0f;
                tc->vec_dot((int)n, &g, 0, w, 0, ag, 0, 1);
                const double rel_ge = fabs((double)g - exact) / mag;
                if (rel_ge > r.max_rel_ggml_exact) r.max_rel_ggml_exact = rel_ge;
                for (int isa = 0; isa < EM_ISA_COUNT; isa++) {
                    int used = -1;
                    em_dot_fn fn = em_dot_kernel(type, isa, &used);
                    if (!fn || used != isa) continue;
                    r.isa_seen[isa] = true;
                    const float e = fn(w, ggml_act, n);
                    const double rel = fabs((double)e - (double)g) / mag;
                    if (!(rel <= tol)) {
                        if (dot_ok)
                            printf("  %s %s: n=%lld %s weights, %s rows: ggml %.9g, Ember %.9g, "
                                   "exact %.9g, |diff|/sum|w a| = %.3g\n",
                                   ggml_name(c, type), em_isa_name(isa), (long long)n,
                                   wsrc_kind < 2 ? "ggml-quantized" : "random-block",
                                   act_names[kind], (double)g, (double)e, exact, rel);
                        dot_ok = false;
                    }
                    if (rel > r.max_rel[isa] || !(rel == rel)) r.max_rel[isa] = rel == rel ? rel : INFINITY;
                }
                /* end to end: Ember's default kernel on its own activations (tie rows left
                 * out: there the two rounding rules differ in half the quants on purpose) */
                const double rel2 = kind == ACT_TIES ? 0.0 : fabs((double)em_dot_get(type)(w, ae, n) - (double)g) / mag;
                if (rel2 > r.max_rel_e2e) r.max_rel_e2e = rel2;
            }
        }
    }
    printf("%-8s act %s%s: %lld/%lld rows identical", ggml_name(c, type), ggml_name(c, act_g),
           q8_1 ? " (d, qs)" : "", (long long)r.act_same, (long long)r.act_rows);
    if (r.act_known_rows)
        printf(" (+%lld differing only in %lld tie-rounded quants)", (long long)r.act_known_rows,
               (long long)r.act_known_quants);
    printf("; dot vs ggml, max |diff|/sum|w a|:");
    for (int isa = 0; isa < EM_ISA_COUNT; isa++)
        if (r.isa_seen[isa]) printf(" %s %.2g", em_isa_name(isa), r.max_rel[isa]);
    printf("  [e2e (no tie rows) %.2g; ggml vs exact %.2g; tol %.0e]  %s%s\n", r.max_rel_e2e,
           r.max_rel_ggml_exact, tol, act_ok && dot_ok ? "PASS" : "FAIL",
           dot_ok ? "" : " (dot)");
    if (!act_ok || !dot_ok) c->failures++;
    free(x), free(wsrc), free(im), free(wf), free(av), free(ag), free(ae), free(ar), free(ae8), free(w);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s BINS_DIR [CPU_VARIANT] (folder holding libggml-base.so and "
                        "libggml-cpu-*.so)\n", argv[0]);
        return 2;
    }
    checker c = { 0 };
    char msg[512];
    if (ggml_lib_open(&c.lib, argv[1], msg, sizeof msg) != 0 ||
        ggml_lib_check_layout(&c.lib, msg, sizeof msg) != 0) {
        fprintf(stderr, "compat_dot_vs_ggml: %s\n", msg);
        return 2;
    }
    if (open_cpu_backend(&c, argv[1], argc == 3 ? argv[2] : NULL) != 0) {
        printf("SKIP: no usable libggml-cpu-*.so exporting ggml_get_type_traits_cpu in %s\n", argv[1]);
        ggml_lib_close(&c.lib);
        return 77;
    }
    void *sym = load_sym(c.cpu, "ggml_get_type_traits_cpu");
    void *init = load_sym(c.cpu, "ggml_cpu_init");
    if (!sym || !init) {
        printf("SKIP: libggml-cpu-%s.so lacks ggml_get_type_traits_cpu or ggml_cpu_init\n", c.variant);
        return 77;
    }
    memcpy(&c.traits_cpu, &sym, sizeof sym);
    void (*cpu_init)(void);
    memcpy(&cpu_init, &init, sizeof init);
    cpu_init(); /* fp16 tables, CPU feature detection */
    sym = load_sym(c.lib.handle, "ggml_quantize_init");
    memcpy(&c.quantize_init, &sym, sizeof sym);
    sym = load_sym(c.lib.handle, "quantize_row_q8_K_ref");
    memcpy(&c.q8_K_ref, &sym, sizeof sym);
    if (!cpu_layout_ok(&c)) {
        fprintf(stderr, "compat_dot_vs_ggml: struct ggml_type_traits_cpu does not match "
                        "libggml-cpu-%s.so\n", c.variant);
        return 2;
    }
    printf("ggml CPU backend: libggml-cpu-%s.so; Ember ISAs:", c.variant);
    for (int isa = 0; isa < EM_ISA_COUNT; isa++)
        if (em_isa_cpu_supports(isa)) printf(" %s", em_isa_name(isa));
    printf("\n");

    static const int types[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4, GGML_TYPE_Q2_K,
        GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
        GGML_TYPE_IQ4_XS, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ2_S, GGML_TYPE_IQ2_XXS,
        GGML_TYPE_IQ2_XS, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M,
    };
    int n_checked = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (em_dot_act_type(types[i]) < 0) continue;
        check_type(&c, types[i]);
        n_checked++;
    }
    printf("%s: %d type(s) checked, %d failing\n", c.failures ? "FAIL" : "PASS", n_checked, c.failures);
    dlclose(c.cpu);
    ggml_lib_close(&c.lib);
    return c.failures ? 1 : 0;
}
