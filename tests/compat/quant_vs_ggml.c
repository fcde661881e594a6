/* compat_quant_vs_ggml BINS_DIR: checks Ember's quant formats against ggml's own library
 * (BINS_DIR/libggml-base.so, loaded with dlopen), bit for bit:
 *   - the type table (names, block sizes, block bytes) against ggml's type traits;
 *   - fp16 <-> fp32 and bf16 <-> fp32 conversions (all 65536 halves, many floats);
 *   - per type, em_dequantize against ggml's to_float on bytes quantized by ggml and on
 *     random bytes (scale fields finite, plus some inf/NaN), and em_quantize against
 *     ggml_quantize_chunk (no importance matrix) on many kinds of rows (Q8_K: against
 *     quantize_row_q8_K_ref / dequantize_row_q8_K).
 *   - the IQ types (read only in Ember): em_dequantize against to_float on many random blocks
 *     (enough that every grid entry and sign pattern is drawn) and on data ggml quantized
 *     itself (with a uniform importance matrix where ggml requires one; finite rows only,
 *     and fewer shapes: ggml's IQ quantizers are slow).
 * Prints one line per check with PASS/FAIL; on a mismatch, the first differing block with
 * its bytes. Exit status 0 when everything matches, 1 on any mismatch, 2 when the library
 * cannot be used. Deterministic: fixed seeds. */
#include <math.h>
#include <stdlib.h>

#include "base/base.h"
#include "ggml_api.h"
#include "quant/quant.h"

typedef void (*row_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*row_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct {
    ggml_lib lib;
    void (*quantize_init)(int type);
    row_from_float_fn q8_K_quantize; /* quantize_row_q8_K_ref */
    row_to_float_fn q8_K_dequantize; /* dequantize_row_q8_K */
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

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- input rows ------------------------------------------------------------------- */

enum {
    DATA_UNIFORM, DATA_GAUSS, DATA_WIDE_RANGE, DATA_ZEROS, DATA_NEGATIVE, DATA_POSITIVE,
    DATA_SPARSE, DATA_CONSTANT, DATA_GRID, DATA_TINY, DATA_HUGE, DATA_GROUP_SCALES,
    DATA_FP16_EDGE, DATA_NONFINITE, DATA_COUNT
};
static const char *const data_names[DATA_COUNT] = {
    "uniform", "gauss", "wide-range", "zeros", "negative", "positive", "sparse", "constant",
    "grid", "tiny", "huge", "group-scales", "fp16-edge", "non-finite",
};

static float data_value(int kind, int64_t i, uint64_t *s) {
    switch (kind) {
    case DATA_UNIFORM: return rng_unit(s);
    case DATA_GAUSS: return 0.02f * rng_gauss(s);
    case DATA_WIDE_RANGE: return rng_unit(s) * ldexpf(1.0f, (int)(rng_next(s) % 61) - 30);
    case DATA_ZEROS: return 0.0f;
    case DATA_NEGATIVE: return -fabsf(rng_unit(s)) - 0.01f;
    case DATA_POSITIVE: return fabsf(rng_gauss(s));
    case DATA_SPARSE: return rng_next(s) % 37 == 0 ? 100.0f * rng_unit(s) : 0.0f;
    case DATA_CONSTANT: return 0.75f;
    case DATA_GRID: return (float)((int)(rng_next(s) % 17) - 8) * 0.5f; /* many ties */
    case DATA_TINY: return 1e-20f * rng_unit(s);
    case DATA_HUGE: return 3e6f * rng_unit(s);
    case DATA_GROUP_SCALES: return rng_unit(s) * ldexpf(1.0f, (int)((i / 16) % 24) - 12);
    case DATA_FP16_EDGE: { /* around the fp16 normal / subnormal boundary and its max */
        const float edges[] = { 6.1035156e-05f, 5.9604645e-08f, 65504.0f, 65520.0f, 2.98e-8f };
        return edges[rng_next(s) % 5] * (1.0f + 0.001f * rng_unit(s)) *
               (rng_next(s) & 1 ? 1.0f : -1.0f);
    }
    case DATA_NONFINITE: { /* a few inf / NaN among ordinary values */
        const uint64_t r = rng_next(s) % 41;
        return r == 0 ? INFINITY : r == 1 ? -INFINITY : r == 2 ? NAN : rng_unit(s);
    }
    default: return 0.0f;
    }
}

static void fill_rows(float *x, int64_t n, int kind, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)kind + 1;
    for (int64_t i = 0; i < n; i++) x[i] = data_value(kind, i, &s);
}

/* Row shapes as (rows, blocks per row). */
static const int shapes[][2] = { { 1, 1 }, { 3, 3 }, { 2, 16 }, { 5, 7 }, { 16, 64 } };
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* ---- reporting -------------------------------------------------------------------- */

static void hex_dump(const char *label, const uint8_t *p, size_t n) {
    printf("    %s:", label);
    for (size_t i = 0; i < n; i++) printf("%s%02x", i % 32 == 0 && i ? "\n        " : " ", p[i]);
    printf("\n");
}

/* ---- the type table and half conversions ------------------------------------------- */

static bool table_matches(checker *c) {
    bool ok = true;
    for (int t = 0; t < EM_TYPE_COUNT; t++) {
        const em_type_info *e = em_type_get(t);
        const struct ggml_type_traits *g = c->lib.ggml_get_type_traits(t);
        const bool g_known = g && g->blck_size > 0;
        if (!e) {
            if (g_known) printf("  note: ggml type %d (%s) is unknown to Ember\n", t, g->type_name);
            continue;
        }
        if (!g_known || strcmp(e->name, g->type_name) != 0 || e->block_elems != g->blck_size ||
            (size_t)e->block_bytes != g->type_size) {
            printf("  type %d: Ember %s/%d/%d, ggml %s/%lld/%zu\n", t, e->name, e->block_elems,
                   e->block_bytes, g ? g->type_name : "?", g ? (long long)g->blck_size : 0LL,
                   g ? g->type_size : (size_t)0);
            ok = false;
        }
    }
    return ok;
}

static bool halves_match(checker *c) {
    const struct ggml_type_traits *f16 = c->lib.ggml_get_type_traits(GGML_TYPE_F16);
    const struct ggml_type_traits *bf16 = c->lib.ggml_get_type_traits(GGML_TYPE_BF16);
    static uint16_t h[65536];
    static float ref[65536];
    bool ok = true;
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    /* every half, both formats, to f32 */
    for (int pass = 0; pass < 2; pass++) {
        (pass ? bf16 : f16)->to_float(h, ref, 65536);
        for (int i = 0; i < 65536; i++) {
            const float mine = pass ? em_bf16_to_fp32(h[i]) : em_fp16_to_fp32(h[i]);
            if (float_to_bits(mine) != float_to_bits(ref[i])) {
                printf("  %s %04x -> f32: ggml %08x, Ember %08x\n", pass ? "bf16" : "f16", i,
                       float_to_bits(ref[i]), float_to_bits(mine));
                ok = false;
                break;
            }
        }
    }
    /* f32 -> half: all halves' exact values, midpoints between them, random bit patterns
     * (every exponent, NaNs and infinities included) */
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x);
    uint16_t *out = malloc(N * sizeof *out);
    if (!x || !out) {
        free(x);
        free(out);
        printf("  out of memory\n");
        return false;
    }
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) {
        const uint32_t r = (uint32_t)rng_next(&s);
        if (i < 65536)
            x[i] = em_fp16_to_fp32((uint16_t)i);
        else if (i < 2 * 65536) /* f32 patterns whose low 13 bits sit at the rounding tie */
            x[i] = bits_to_float((r & 0xffffe000u) | 0x1000u);
        else
            x[i] = bits_to_float(r);
    }
    for (int pass = 0; pass < 2; pass++) {
        (pass ? bf16 : f16)->from_float_ref(x, out, N);
        for (int i = 0; i < N; i++) {
            const uint16_t mine = pass ? em_fp32_to_bf16(x[i]) : em_fp32_to_fp16(x[i]);
            if (mine != out[i]) {
                printf("  f32 %08x -> %s: ggml %04x, Ember %04x\n", float_to_bits(x[i]),
                       pass ? "bf16" : "f16", out[i], mine);
                ok = false;
                break;
            }
        }
    }
    free(x);
    free(out);
    return ok;
}

/* ---- one type --------------------------------------------------------------------- */

typedef struct {
    int type;
    int block_elems, block_bytes;
    row_to_float_fn ggml_to_float;
    bool ggml_can_quantize; /* through ggml_quantize_chunk (else Q8_K's row function) */
} type_case;

/* Compares n floats from em_dequantize with ggml's; reports the first differing block. */
static bool compare_dequant(const type_case *tc, const uint8_t *bytes, int64_t n,
                            const char *what) {
    float *ref = malloc((size_t)n * sizeof *ref), *mine = malloc((size_t)n * sizeof *mine);
    bool ok = ref && mine;
    em_err err = { 0 };
    if (ok) {
        tc->ggml_to_float(bytes, ref, n);
        if (em_dequantize(tc->type, bytes, mine, n, &err) != EM_OK) {
            printf("  %s: em_dequantize failed: %s\n", what, err.msg);
            ok = false;
        }
    }
    for (int64_t i = 0; ok && i < n; i++) {
        if (float_to_bits(ref[i]) != float_to_bits(mine[i])) {
            const int64_t blk = i / tc->block_elems;
            printf("  %s: block %lld value %lld: ggml %08x (%g), Ember %08x (%g)\n", what,
                   (long long)blk, (long long)(i % tc->block_elems), float_to_bits(ref[i]),
                   (double)ref[i], float_to_bits(mine[i]), (double)mine[i]);
            hex_dump("block", bytes + blk * tc->block_bytes, (size_t)tc->block_bytes);
            ok = false;
        }
    }
    free(ref);
    free(mine);
    return ok;
}

/* ggml_quantize_requires_imatrix(): the types ggml_quantize_chunk asserts an imatrix for. */
static bool needs_imatrix(int type) {
    return type == GGML_TYPE_IQ2_XXS || type == GGML_TYPE_IQ2_XS || type == GGML_TYPE_IQ1_S;
}

static bool is_iq(int type) {
    switch (type) {
    case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS:
    case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ4_NL:
    case GGML_TYPE_IQ4_XS: return true;
    default: return false;
    }
}

static void ggml_quantize_rows(checker *c, const type_case *tc, const float *x, void *dst,
                               int64_t rows, int64_t per_row) {
    if (tc->ggml_can_quantize) {
        float *imatrix = NULL; /* uniform, where ggml refuses to quantize without one */
        if (needs_imatrix(tc->type)) {
            imatrix = malloc((size_t)per_row * sizeof *imatrix);
            if (!imatrix) abort();
            for (int64_t i = 0; i < per_row; i++) imatrix[i] = 1.0f;
        }
        c->lib.ggml_quantize_chunk(tc->type, x, dst, 0, rows, per_row, imatrix);
        free(imatrix);
    } else {
        /* Q8_K: the reference row quantizer leaves bsums unwritten for all-zero blocks */
        memset(dst, 0, (size_t)(rows * per_row / tc->block_elems * tc->block_bytes));
        c->q8_K_quantize(x, dst, rows * per_row);
    }
}

/* Quantize with ggml and compare em_quantize's bytes; then dequantize those bytes. */
static bool check_rows(checker *c, const type_case *tc, const float *x, int64_t rows,
                       int64_t per_row, const char *label, bool *quant_ok) {
    const int64_t n = rows * per_row, nblocks = n / tc->block_elems;
    const size_t bytes = (size_t)(nblocks * tc->block_bytes);
    uint8_t *ref = malloc(bytes), *mine = malloc(bytes);
    bool deq_ok = ref && mine;
    if (!deq_ok) {
        free(ref);
        free(mine);
        return false;
    }
    ggml_quantize_rows(c, tc, x, ref, rows, per_row);
    const em_type_info *info = em_type_get(tc->type);
    if (info && info->from_float && *quant_ok) {
        em_err err = { 0 };
        if (em_quantize(tc->type, x, mine, n, &err) != EM_OK) {
            printf("  quantize %s: %s\n", label, err.msg);
            *quant_ok = false;
        } else if (memcmp(ref, mine, bytes) != 0) {
            int64_t blk = 0;
            while (memcmp(ref + blk * tc->block_bytes, mine + blk * tc->block_bytes,
                          (size_t)tc->block_bytes) == 0)
                blk++;
            printf("  quantize %s (%lld x %lld): first differing block %lld\n", label,
                   (long long)rows, (long long)per_row, (long long)blk);
            hex_dump("ggml ", ref + blk * tc->block_bytes, (size_t)tc->block_bytes);
            hex_dump("Ember", mine + blk * tc->block_bytes, (size_t)tc->block_bytes);
            printf("    input:");
            for (int j = 0; j < tc->block_elems && j < 8; j++)
                printf(" %.9g", (double)x[blk * tc->block_elems + j]);
            printf("%s\n", tc->block_elems > 8 ? " ..." : "");
            *quant_ok = false;
        }
    }
    if (tc->ggml_to_float) {
        char what[96];
        snprintf(what, sizeof what, "dequant of ggml-quantized %s", label);
        deq_ok = compare_dequant(tc, ref, n, what);
    }
    free(ref);
    free(mine);
    return deq_ok;
}

/* A random finite fp16, every exponent (subnormals too); 1 in 16 is inf or NaN when wild. */
static uint16_t random_half(uint64_t *s, bool wild) {
    const uint64_t r = rng_next(s);
    if (wild && r % 16 == 0) return (uint16_t)(0x7c00 | (r >> 8 & 0x83ff));
    uint16_t h = (uint16_t)(r >> 16);
    if ((h & 0x7c00) == 0x7c00) h &= 0xbfff; /* exponent 31 -> 15 */
    return h;
}

/* Offsets of the fp16 scale fields in a block (-1 ends the list). */
static const int *half_fields(int type) {
    static const int d0[] = { 0, -1 }, d0m2[] = { 0, 2, -1 }, q2k[] = { 80, 82, -1 },
                     q3k[] = { 108, -1 }, q6k[] = { 208, -1 }, none[] = { -1 };
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: return d0;
    case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS:
    case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ4_NL: case GGML_TYPE_IQ4_XS:
        return d0; /* IQ1_M's d is spread over nibbles: see check_random_bytes */
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
        return d0m2;
    case GGML_TYPE_Q2_K: return q2k;
    case GGML_TYPE_Q3_K: return q3k;
    case GGML_TYPE_Q6_K: return q6k;
    default: return none;
    }
}

/* Random block bytes with controlled scale fields, through both dequantizers. */
static bool check_random_bytes(const type_case *tc, bool wild) {
    /* IQ types: 2048 blocks, 16K+ grid lookups each way, so every entry of the largest grid
     * (IQ1_S's 2048) is drawn with near certainty */
    const int64_t nblocks = is_iq(tc->type) ? 2048 : 4096 / tc->block_elems + 64;
    const size_t bytes = (size_t)(nblocks * tc->block_bytes);
    uint8_t *p = malloc(bytes);
    if (!p) return false;
    uint64_t s = 777 + (uint64_t)tc->type * 131 + wild;
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)(rng_next(&s) >> 24);
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + b * tc->block_bytes;
        /* at most one non-finite field per block: with two NaNs, which payload survives
         * depends on the operand order a compiler picks, on either side */
        for (const int *f = half_fields(tc->type); *f >= 0; f++) {
            const uint16_t h = random_half(&s, wild && f == half_fields(tc->type));
            memcpy(blk + *f, &h, 2);
        }
        if (tc->type == GGML_TYPE_Q8_K) { /* float d: finite, any exponent */
            uint32_t u = (uint32_t)rng_next(&s);
            if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;
            memcpy(blk, &u, 4);
        }
    }
    /* IQ1_M: the fp16 d is the top nibbles of the four u16 scale words; its exponent's top
     * bit is bit 14 of the last word (byte 55, bit 6). Clear it (finite d), or in wild mode
     * set the whole exponent (bits 10..14: byte 53 bits 6-7, byte 55 bits 4-6) in 1 of 16. */
    if (tc->type == GGML_TYPE_IQ1_M)
        for (int64_t b = 0; b < nblocks; b++) {
            uint8_t *blk = p + b * tc->block_bytes;
            blk[55] &= (uint8_t)~0x40;
            if (wild && rng_next(&s) % 16 == 0) {
                blk[53] |= 0xc0;
                blk[55] |= 0x70;
            }
        }
    if (tc->type == GGML_TYPE_MXFP4) /* every scale byte, 0 and 1 (subnormal scales) too */
        for (int64_t b = 0; b < nblocks; b++) p[b * tc->block_bytes] = (uint8_t)b;
    const bool ok = compare_dequant(tc, p, nblocks * tc->block_elems,
                                    wild ? "dequant of random bytes (inf/NaN scales)"
                                         : "dequant of random bytes");
    free(p);
    return ok;
}

static void check_type(checker *c, int type) {
    const em_type_info *info = em_type_get(type);
    const struct ggml_type_traits *g = c->lib.ggml_get_type_traits(type);
    type_case tc = { .type = type, .ggml_can_quantize = type != GGML_TYPE_Q8_K };
    if (!info) {
        printf("%-6s FAIL (unknown to Ember)\n", g->type_name);
        c->failures++;
        return;
    }
    tc.block_elems = info->block_elems;
    tc.block_bytes = info->block_bytes;
    tc.ggml_to_float = type == GGML_TYPE_Q8_K ? c->q8_K_dequantize : g->to_float;
    if (c->quantize_init && tc.ggml_can_quantize) c->quantize_init(type);

    bool deq_ok = true, quant_ok = true, rand_ok = true;
    const int unit = info->block_elems == 1 ? 32 : info->block_elems;
    /* IQ types: the four smaller shapes, finite data (ggml's IQ searches assert on NaN) */
    const int n_shapes = is_iq(type) ? N_SHAPES - 1 : N_SHAPES;
    for (int sh = 0; sh < n_shapes; sh++) {
        const int64_t rows = shapes[sh][0], per_row = (int64_t)shapes[sh][1] * unit;
        float *x = malloc((size_t)(rows * per_row) * sizeof *x);
        if (!x) {
            deq_ok = false;
            break;
        }
        for (int kind = 0; kind < DATA_COUNT; kind++) {
            if (is_iq(type) && kind == DATA_NONFINITE) continue;
            char label[64];
            snprintf(label, sizeof label, "%s rows", data_names[kind]);
            fill_rows(x, rows * per_row, kind, (uint64_t)(sh * 1000 + type));
            if (!check_rows(c, &tc, x, rows, per_row, label, &quant_ok)) deq_ok = false;
        }
        free(x);
    }
    if (tc.ggml_to_float && type != GGML_TYPE_F32 && type != GGML_TYPE_F16 &&
        type != GGML_TYPE_BF16) /* the halves were checked exhaustively above */
        rand_ok = check_random_bytes(&tc, false) && check_random_bytes(&tc, true);

    const bool can_quant = info->from_float != NULL;
    printf("%-8s dequant(ggml data) %s  dequant(random bytes) %s  quantize %s\n", info->name,
           !tc.ggml_to_float ? "n/a " : deq_ok ? "PASS" : "FAIL",
           !tc.ggml_to_float || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 ? "n/a "
           : rand_ok ? "PASS" : "FAIL",
           !can_quant ? "n/a" : quant_ok ? "PASS" : "FAIL");
    if (!deq_ok || !rand_ok || (can_quant && !quant_ok)) c->failures++;
}

static void *need_sym(checker *c, const char *name) {
    void *p = dlsym(c->lib.handle, name);
    if (!p) printf("note: %s not exported by this libggml-base\n", name);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s BINS_DIR (folder holding libggml-base.so)\n", argv[0]);
        return 2;
    }
    checker c = { 0 };
    char msg[512];
    if (ggml_lib_open(&c.lib, argv[1], msg, sizeof msg) != 0 ||
        ggml_lib_check_layout(&c.lib, msg, sizeof msg) != 0) {
        fprintf(stderr, "compat_quant_vs_ggml: %s\n", msg);
        return 2;
    }
    void *sym = need_sym(&c, "ggml_quantize_init");
    memcpy(&c.quantize_init, &sym, sizeof sym);
    sym = need_sym(&c, "quantize_row_q8_K_ref");
    memcpy(&c.q8_K_quantize, &sym, sizeof sym);
    sym = need_sym(&c, "dequantize_row_q8_K");
    memcpy(&c.q8_K_dequantize, &sym, sizeof sym);

    /* sanity: ggml's F16 to_float through the declared traits struct */
    const uint16_t probe[3] = { 0x3c00, 0xc000, 0x0001 };
    float got[3];
    c.lib.ggml_get_type_traits(GGML_TYPE_F16)->to_float(probe, got, 3);
    if (got[0] != 1.0f || got[1] != -2.0f || got[2] != 0x1p-24f) {
        fprintf(stderr, "compat_quant_vs_ggml: ggml F16 to_float gives %g %g %g: traits layout?\n",
                (double)got[0], (double)got[1], (double)got[2]);
        return 2;
    }

    bool ok = table_matches(&c);
    printf("%-6s %s\n", "table", ok ? "PASS" : "FAIL");
    c.failures += !ok;
    ok = halves_match(&c);
    printf("%-6s %s\n", "halves", ok ? "PASS" : "FAIL");
    c.failures += !ok;

    static const int types[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4, GGML_TYPE_Q2_K,
        GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K,
        GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ2_S,
        GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M,
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (types[i] == GGML_TYPE_Q8_K && (!c.q8_K_quantize || !c.q8_K_dequantize)) {
            printf("q8_K   SKIP (row functions not exported)\n");
            continue;
        }
        check_type(&c, types[i]);
    }
    printf("%s: %d failing check(s)\n", c.failures ? "FAIL" : "PASS", c.failures);
    ggml_lib_close(&c.lib);
    return c.failures ? 1 : 0;
}
