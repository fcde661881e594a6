/* Tests for quant/ dot products and compute/ matvec.
 *
 * References, all independent of the kernels under test:
 *  - ref_dequant(): this file's own decoding of every weight block layout, written in the
 *    loop structure of ggml's to_float (halves / shifts / scale words) rather than the
 *    per-element index arithmetic of dot.c, computed in double (so exact);
 *  - the dot product of those values with the activations in double.
 *  - IQ types: em_dequantize's values instead (their decoding is table lookups that
 *    tests/compat/quant_vs_ggml.c proves bit-identical to ggml's to_float; every IQ value is
 *    exact in float: an fp16 d times small integers), so the check is exactly "kernel ==
 *    dequantize-then-f32-dot" within the tolerance below.
 * Tolerance: |result - reference| <= TOL * S, S = sum over values of |scale part * a| +
 * |min part * a| (the magnitudes the kernels add up, so cancellation cannot hide behind a
 * small result). TOL = 4e-6: float rounding of these sums is ~1e-7 S in practice, while a
 * single wrong value among 16K changes the result by ~6e-5 S.
 * Activation quants are drawn in [-127, 127], the range the quantizers produce. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/compute.h"
#include "quant/blocks.h"
#include "quant/quant.h"

#define TOL 4e-6

static const int dot_types[] = {
    EM_TYPE_F32,  EM_TYPE_F16,  EM_TYPE_BF16, EM_TYPE_Q8_0, EM_TYPE_Q4_0,
    EM_TYPE_Q4_1, EM_TYPE_Q5_0, EM_TYPE_Q5_1, EM_TYPE_Q2_K, EM_TYPE_Q3_K,
    EM_TYPE_Q4_K, EM_TYPE_Q5_K, EM_TYPE_Q6_K, EM_TYPE_MXFP4,
    EM_TYPE_IQ1_S, EM_TYPE_IQ1_M, EM_TYPE_IQ2_XXS, EM_TYPE_IQ2_XS, EM_TYPE_IQ2_S,
    EM_TYPE_IQ3_XXS, EM_TYPE_IQ3_S, EM_TYPE_IQ4_NL, EM_TYPE_IQ4_XS,
};
#define N_DOT_TYPES (int)(sizeof dot_types / sizeof dot_types[0])

/* ---- random data ------------------------------------------------------------------------ */

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static uint32_t rand_u32(void) { return (uint32_t)(em_test_rand(&rng) >> 32); }
static float rand_f(void) { return em_test_randf(&rng); } /* [-1, 1) */

/* A random fp16 scale of magnitude in [lo, 2 lo), random sign. */
static uint16_t rand_scale(float lo) {
    float v = lo * (1.0f + 0.5f * (rand_f() + 1.0f));
    return em_fp32_to_fp16(rand_u32() & 1 ? -v : v);
}

static uint64_t row_bytes(int type, int64_t n) {
    uint64_t b = 0;
    assert_int_equal(em_type_row_bytes(type, (uint64_t)n, &b, NULL), 0);
    return b;
}

/* Random weights of type t: random bits everywhere, then sane scale fields. */
static void *rand_weights(int t, int64_t n) {
    uint64_t nbytes = row_bytes(t, n);
    uint8_t *p = malloc(nbytes + 1);
    assert_non_null(p);
    if (t == EM_TYPE_F32 || t == EM_TYPE_F16 || t == EM_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = rand_f();
            if (t == EM_TYPE_F32) ((float *)p)[i] = v;
            if (t == EM_TYPE_F16) ((uint16_t *)p)[i] = em_fp32_to_fp16(v);
            if (t == EM_TYPE_BF16) ((uint16_t *)p)[i] = em_fp32_to_bf16(v);
        }
        return p;
    }
    for (uint64_t i = 0; i < nbytes; i++) p[i] = (uint8_t)rand_u32();
    int64_t nb = n / em_dot_block_elems(t);
    for (int64_t b = 0; b < nb; b++) {
        switch (t) {
        case EM_TYPE_Q8_0: ((em_block_q8_0 *)p)[b].d = rand_scale(0.01f); break;
        case EM_TYPE_Q4_0: ((em_block_q4_0 *)p)[b].d = rand_scale(0.1f); break;
        case EM_TYPE_Q5_0: ((em_block_q5_0 *)p)[b].d = rand_scale(0.05f); break;
        case EM_TYPE_Q4_1:
            ((em_block_q4_1 *)p)[b].d = rand_scale(0.1f);
            ((em_block_q4_1 *)p)[b].m = rand_scale(0.5f);
            break;
        case EM_TYPE_Q5_1:
            ((em_block_q5_1 *)p)[b].d = rand_scale(0.05f);
            ((em_block_q5_1 *)p)[b].m = rand_scale(0.5f);
            break;
        case EM_TYPE_MXFP4: ((em_block_mxfp4 *)p)[b].e = (uint8_t)(110 + rand_u32() % 30); break;
        case EM_TYPE_Q2_K:
            ((em_block_q2_K *)p)[b].d = rand_scale(0.02f);
            ((em_block_q2_K *)p)[b].dmin = rand_scale(0.02f);
            break;
        case EM_TYPE_Q3_K: ((em_block_q3_K *)p)[b].d = rand_scale(0.01f); break;
        case EM_TYPE_Q4_K:
            ((em_block_q4_K *)p)[b].d = rand_scale(0.003f);
            ((em_block_q4_K *)p)[b].dmin = rand_scale(0.003f);
            break;
        case EM_TYPE_Q5_K:
            ((em_block_q5_K *)p)[b].d = rand_scale(0.002f);
            ((em_block_q5_K *)p)[b].dmin = rand_scale(0.002f);
            break;
        case EM_TYPE_Q6_K: ((em_block_q6_K *)p)[b].d = rand_scale(0.0005f); break;
        case EM_TYPE_IQ2_XXS: ((em_block_iq2_xxs *)p)[b].d = rand_scale(0.001f); break;
        case EM_TYPE_IQ2_XS: ((em_block_iq2_xs *)p)[b].d = rand_scale(0.001f); break;
        case EM_TYPE_IQ2_S: ((em_block_iq2_s *)p)[b].d = rand_scale(0.001f); break;
        case EM_TYPE_IQ3_XXS: ((em_block_iq3_xxs *)p)[b].d = rand_scale(0.001f); break;
        case EM_TYPE_IQ3_S: ((em_block_iq3_s *)p)[b].d = rand_scale(0.001f); break;
        case EM_TYPE_IQ1_S: ((em_block_iq1_s *)p)[b].d = rand_scale(0.01f); break;
        case EM_TYPE_IQ4_NL: ((em_block_iq4_nl *)p)[b].d = rand_scale(0.001f); break;
        case EM_TYPE_IQ4_XS: ((em_block_iq4_xs *)p)[b].d = rand_scale(0.0001f); break;
        case EM_TYPE_IQ1_M: { /* the fp16 d sits in the top nibbles of the 4 scale words */
            em_block_iq1_m *x = (em_block_iq1_m *)p + b;
            uint16_t d = rand_scale(0.01f), sc[4];
            memcpy(sc, x->scales, sizeof sc);
            for (int k = 0; k < 4; k++) sc[k] = (uint16_t)((sc[k] & 0x0fff) | ((d >> (4 * k)) & 15) << 12);
            memcpy(x->scales, sc, sizeof sc);
            break;
        }
        default: fail_msg("no generator for type %d", t);
        }
    }
    return p;
}

/* Random activations of the type that weight type t pairs with, built directly (quants in
 * [-127, 127], consistent bsums) so these tests do not depend on em_quantize. */
static void *rand_act(int t, int64_t n) {
    int at = em_dot_act_type(t);
    uint8_t *p = malloc(row_bytes(at, n) + 1);
    assert_non_null(p);
    if (at == EM_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) ((float *)p)[i] = rand_f();
    } else if (at == EM_TYPE_Q8_0) {
        em_block_q8_0 *b = (em_block_q8_0 *)p;
        for (int64_t k = 0; k < n / 32; k++) {
            b[k].d = rand_scale(0.01f);
            for (int j = 0; j < 32; j++) b[k].qs[j] = (int8_t)((int)(rand_u32() % 255) - 127);
        }
    } else {
        em_block_q8_K *b = (em_block_q8_K *)p;
        for (int64_t k = 0; k < n / 256; k++) {
            b[k].d = 0.01f * (1.0f + 0.5f * (rand_f() + 1.0f));
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) {
                    int v = (int)(rand_u32() % 255) - 127;
                    b[k].qs[16 * g + j] = (int8_t)v;
                    s += v;
                }
                b[k].bsums[g] = (int16_t)s;
            }
        }
    }
    return p;
}

/* ---- reference decoding (double, exact) --------------------------------------------------- */

static double f16d(uint16_t h) { return (double)em_fp16_to_fp32(h); }

/* Activation values. */
static void ref_act(int at, const void *src, int64_t n, double *out) {
    if (at == EM_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) out[i] = ((const float *)src)[i];
    } else if (at == EM_TYPE_Q8_0) {
        const em_block_q8_0 *b = src;
        for (int64_t i = 0; i < n; i++) out[i] = f16d(b[i / 32].d) * b[i / 32].qs[i % 32];
    } else {
        const em_block_q8_K *b = src;
        for (int64_t i = 0; i < n; i++) out[i] = (double)b[i / 256].d * b[i / 256].qs[i % 256];
    }
}

static bool is_iq_type(int t) {
    return (t >= EM_TYPE_IQ2_XXS && t <= EM_TYPE_IQ4_XS) || t == EM_TYPE_IQ1_M;
}

/* Weight values as scale part v[i] plus min part m[i] (0 for symmetric types). */
static void ref_dequant(int t, const void *src, int64_t n, double *v, double *m) {
    memset(m, 0, (size_t)n * sizeof *m);
    switch (t) {
    case EM_TYPE_F32:
        for (int64_t i = 0; i < n; i++) v[i] = ((const float *)src)[i];
        return;
    case EM_TYPE_F16:
        for (int64_t i = 0; i < n; i++) v[i] = f16d(((const uint16_t *)src)[i]);
        return;
    case EM_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) v[i] = em_bf16_to_fp32(((const uint16_t *)src)[i]);
        return;
    default: break;
    }
    if (is_iq_type(t)) {
        float *f = malloc((size_t)n * sizeof *f);
        assert_non_null(f);
        assert_int_equal(em_dequantize(t, src, f, n, NULL), 0);
        for (int64_t i = 0; i < n; i++) v[i] = f[i];
        free(f);
        return;
    }
    const int blk = em_dot_block_elems(t);
    for (int64_t b = 0; b < n / blk; b++) {
        double *y = v + b * blk, *ym = m + b * blk;
        switch (t) {
        case EM_TYPE_Q8_0: {
            const em_block_q8_0 *x = (const em_block_q8_0 *)src + b;
            for (int j = 0; j < 32; j++) y[j] = f16d(x->d) * x->qs[j];
            break;
        }
        case EM_TYPE_Q4_0: {
            const em_block_q4_0 *x = (const em_block_q4_0 *)src + b;
            for (int j = 0; j < 16; j++) {
                y[j] = f16d(x->d) * ((x->qs[j] & 0x0F) - 8);
                y[j + 16] = f16d(x->d) * ((x->qs[j] >> 4) - 8);
            }
            break;
        }
        case EM_TYPE_Q4_1: {
            const em_block_q4_1 *x = (const em_block_q4_1 *)src + b;
            for (int j = 0; j < 16; j++) {
                y[j] = f16d(x->d) * (x->qs[j] & 0x0F);
                y[j + 16] = f16d(x->d) * (x->qs[j] >> 4);
                ym[j] = ym[j + 16] = f16d(x->m);
            }
            break;
        }
        case EM_TYPE_Q5_0:
        case EM_TYPE_Q5_1: {
            const bool q50 = t == EM_TYPE_Q5_0;
            const uint8_t *qs = q50 ? ((const em_block_q5_0 *)src)[b].qs : ((const em_block_q5_1 *)src)[b].qs;
            const uint8_t *qhp = q50 ? ((const em_block_q5_0 *)src)[b].qh : ((const em_block_q5_1 *)src)[b].qh;
            const double d = f16d(q50 ? ((const em_block_q5_0 *)src)[b].d : ((const em_block_q5_1 *)src)[b].d);
            const double mm = q50 ? 0.0 : f16d(((const em_block_q5_1 *)src)[b].m);
            uint32_t qh;
            memcpy(&qh, qhp, 4);
            for (int j = 0; j < 16; j++) {
                int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
                y[j] = d * (((qs[j] & 0x0F) | h0) - (q50 ? 16 : 0));
                y[j + 16] = d * (((qs[j] >> 4) | h1) - (q50 ? 16 : 0));
                ym[j] = ym[j + 16] = mm;
            }
            break;
        }
        case EM_TYPE_MXFP4: {
            static const int kv[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
            const em_block_mxfp4 *x = (const em_block_mxfp4 *)src + b;
            const double d = ldexp(1.0, (int)x->e - 128);
            for (int j = 0; j < 16; j++) {
                y[j] = d * kv[x->qs[j] & 15];
                y[j + 16] = d * kv[x->qs[j] >> 4];
            }
            break;
        }
        case EM_TYPE_Q2_K: {
            const em_block_q2_K *x = (const em_block_q2_K *)src + b;
            const uint8_t *q = x->qs;
            int is = 0;
            for (int half = 0; half < 2; half++, q += 32)
                for (int shift = 0; shift < 8; shift += 2)
                    for (int part = 0; part < 2; part++, is++)
                        for (int l = 0; l < 16; l++) {
                            *y++ = f16d(x->d) * (x->scales[is] & 0xF) * ((q[l + 16 * part] >> shift) & 3);
                            *ym++ = -f16d(x->dmin) * (x->scales[is] >> 4);
                        }
            break;
        }
        case EM_TYPE_Q3_K: {
            const em_block_q3_K *x = (const em_block_q3_K *)src + b;
            uint32_t aux[4];
            memcpy(aux, x->scales, 12);
            const uint32_t tmp = aux[2];
            aux[2] = ((aux[0] >> 4) & 0x0f0f0f0f) | (((tmp >> 4) & 0x03030303) << 4);
            aux[3] = ((aux[1] >> 4) & 0x0f0f0f0f) | (((tmp >> 6) & 0x03030303) << 4);
            aux[0] = (aux[0] & 0x0f0f0f0f) | ((tmp & 0x03030303) << 4);
            aux[1] = (aux[1] & 0x0f0f0f0f) | (((tmp >> 2) & 0x03030303) << 4);
            int8_t sc[16];
            memcpy(sc, aux, 16);
            const uint8_t *q = x->qs;
            uint8_t bit = 1;
            int is = 0;
            for (int half = 0; half < 2; half++, q += 32)
                for (int shift = 0; shift < 8; shift += 2, bit <<= 1)
                    for (int part = 0; part < 2; part++, is++)
                        for (int l = 16 * part; l < 16 * part + 16; l++)
                            *y++ = f16d(x->d) * (sc[is] - 32) *
                                   (((q[l] >> shift) & 3) - ((x->hmask[l] & bit) ? 0 : 4));
            break;
        }
        case EM_TYPE_Q4_K:
        case EM_TYPE_Q5_K: {
            const bool q4 = t == EM_TYPE_Q4_K;
            const em_block_q4_K *x4 = (const em_block_q4_K *)src + b;
            const em_block_q5_K *x5 = (const em_block_q5_K *)src + b;
            const uint8_t *s = q4 ? x4->scales : x5->scales;
            const uint8_t *q = q4 ? x4->qs : x5->qs;
            const double d = f16d(q4 ? x4->d : x5->d), dmin = f16d(q4 ? x4->dmin : x5->dmin);
            for (int j = 0; j < 8; j++) {
                int sc, mn;
                if (j < 4) {
                    sc = s[j] & 63;
                    mn = s[j + 4] & 63;
                } else {
                    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                }
                const uint8_t *qq = q + 32 * (j / 2);
                for (int l = 0; l < 32; l++) {
                    int val = j % 2 ? qq[l] >> 4 : qq[l] & 0xF;
                    if (!q4) val += (x5->qh[l] >> j) & 1 ? 16 : 0;
                    y[32 * j + l] = d * sc * val;
                    ym[32 * j + l] = -dmin * mn;
                }
            }
            break;
        }
        case EM_TYPE_Q6_K: {
            const em_block_q6_K *x = (const em_block_q6_K *)src + b;
            const uint8_t *ql = x->ql, *qh = x->qh;
            const int8_t *sc = x->scales;
            for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8)
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    double d = f16d(x->d);
                    y[l] = d * sc[is] * q1;
                    y[l + 32] = d * sc[is + 2] * q2;
                    y[l + 64] = d * sc[is + 4] * q3;
                    y[l + 96] = d * sc[is + 6] * q4;
                }
            break;
        }
        default: fail_msg("no reference decoder for type %d", t);
        }
    }
}

typedef struct ref_result {
    double dot; /* exact dot product */
    double mag; /* S: sum of |scale part * a| + |min part * a| */
} ref_result;

static ref_result reference(int t, const void *w, const void *act, int64_t n) {
    double *v = malloc((size_t)n * sizeof *v), *m = malloc((size_t)n * sizeof *m);
    double *a = malloc((size_t)n * sizeof *a);
    assert_true(v && m && a);
    ref_dequant(t, w, n, v, m);
    ref_act(em_dot_act_type(t), act, n, a);
    ref_result r = { 0, 0 };
    for (int64_t i = 0; i < n; i++) {
        r.dot += (v[i] + m[i]) * a[i];
        r.mag += fabs(v[i] * a[i]) + fabs(m[i] * a[i]);
    }
    free(v);
    free(m);
    free(a);
    return r;
}

/* ---- lengths ------------------------------------------------------------------------------ */

static int lengths_for(int t, int64_t *out) {
    static const int64_t flt[] = { 1, 3, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4096, 4099, 16384 };
    static const int64_t b32[] = { 1, 2, 3, 7, 64, 129, 512 };   /* in blocks */
    static const int64_t b256[] = { 1, 2, 3, 13, 64 };          /* in blocks */
    int blk = em_dot_block_elems(t), k = 0;
    if (blk == 1)
        for (size_t i = 0; i < sizeof flt / sizeof flt[0]; i++) out[k++] = flt[i];
    else if (blk == 32)
        for (size_t i = 0; i < sizeof b32 / sizeof b32[0]; i++) out[k++] = 32 * b32[i];
    else
        for (size_t i = 0; i < sizeof b256 / sizeof b256[0]; i++) out[k++] = 256 * b256[i];
    return k;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_pairing(void **state) {
    (void)state;
    assert_int_equal(em_dot_act_type(EM_TYPE_F32), EM_TYPE_F32);
    assert_int_equal(em_dot_act_type(EM_TYPE_F16), EM_TYPE_F32);
    assert_int_equal(em_dot_act_type(EM_TYPE_BF16), EM_TYPE_F32);
    assert_int_equal(em_dot_act_type(EM_TYPE_Q8_0), EM_TYPE_Q8_0);
    assert_int_equal(em_dot_act_type(EM_TYPE_Q4_0), EM_TYPE_Q8_0);
    assert_int_equal(em_dot_act_type(EM_TYPE_Q4_1), EM_TYPE_Q8_0);
    assert_int_equal(em_dot_act_type(EM_TYPE_Q5_0), EM_TYPE_Q8_0);
    assert_int_equal(em_dot_act_type(EM_TYPE_Q5_1), EM_TYPE_Q8_0);
    assert_int_equal(em_dot_act_type(EM_TYPE_MXFP4), EM_TYPE_Q8_0);
    for (int t = EM_TYPE_Q2_K; t <= EM_TYPE_Q6_K; t++) assert_int_equal(em_dot_act_type(t), EM_TYPE_Q8_K);
    assert_int_equal(em_dot_act_type(EM_TYPE_Q8_K), -1);
    assert_int_equal(em_dot_act_type(EM_TYPE_IQ4_NL), EM_TYPE_Q8_0); /* as ggml pairs them */
    static const int iq_k[] = { EM_TYPE_IQ1_S, EM_TYPE_IQ1_M, EM_TYPE_IQ2_XXS, EM_TYPE_IQ2_XS,
                                EM_TYPE_IQ2_S, EM_TYPE_IQ3_XXS, EM_TYPE_IQ3_S, EM_TYPE_IQ4_XS };
    for (size_t i = 0; i < sizeof iq_k / sizeof iq_k[0]; i++) {
        assert_int_equal(em_dot_act_type(iq_k[i]), EM_TYPE_Q8_K);
        assert_int_equal(em_dot_block_elems(iq_k[i]), 256);
    }
    assert_int_equal(em_dot_block_elems(EM_TYPE_IQ4_NL), 32);
    assert_int_equal(em_dot_act_type(EM_TYPE_TQ1_0), -1);
    assert_int_equal(em_dot_act_type(-1), -1);
    assert_int_equal(em_dot_act_type(1000), -1);
    assert_int_equal(em_dot_block_elems(EM_TYPE_BF16), 1);
    assert_int_equal(em_dot_block_elems(EM_TYPE_Q5_1), 32);
    assert_int_equal(em_dot_block_elems(EM_TYPE_Q6_K), 256);
    assert_int_equal(em_dot_block_elems(EM_TYPE_I32), 0);
    assert_null(em_dot_kernel(EM_TYPE_I8, EM_ISA_SCALAR, NULL));
    assert_null(em_dot_kernel(EM_TYPE_Q8_0, -1, NULL));
    assert_null(em_dot_kernel(EM_TYPE_Q8_0, EM_ISA_COUNT, NULL));
}

static void test_isa_names_and_default(void **state) {
    (void)state;
    for (int i = 0; i < EM_ISA_COUNT; i++) assert_int_equal(em_isa_from_name(em_isa_name(i)), i);
    assert_int_equal(em_isa_from_name("sse9"), -1);
    assert_int_equal(em_isa_from_name(NULL), -1);
    assert_string_equal(em_isa_name(7), "unknown");
    assert_true(em_isa_cpu_supports(EM_ISA_SCALAR));
    assert_false(em_isa_cpu_supports(EM_ISA_COUNT));
    int best = em_isa_cpu_best();
    assert_true(em_isa_cpu_supports(best));
    /* main() set EMBER_ISA (unless the caller did) before anything read it */
    const char *env = getenv("EMBER_ISA");
    int want = env ? em_isa_from_name(env) : -1;
    int expect = want < 0 || want > best ? best : want;
    assert_int_equal(em_isa_default(), expect);
    int used = -1;
    assert_ptr_equal(em_dot_get(EM_TYPE_Q8_0), em_dot_kernel(EM_TYPE_Q8_0, expect, &used));
    assert_true(used >= 0 && used <= expect);
    print_message("cpu best ISA: %s, default (EMBER_ISA=%s): %s\n", em_isa_name(best),
                  env ? env : "", em_isa_name(em_isa_default()));
}

/* The scalar kernel against the exact reference. */
static void test_scalar_vs_reference(void **state) {
    (void)state;
    int64_t lens[32];
    for (int ti = 0; ti < N_DOT_TYPES; ti++) {
        int t = dot_types[ti];
        em_dot_fn scalar = em_dot_kernel(t, EM_ISA_SCALAR, NULL);
        assert_non_null(scalar);
        double worst = 0;
        for (int li = 0, nl = lengths_for(t, lens); li < nl; li++) {
            int64_t n = lens[li];
            void *w = rand_weights(t, n), *a = rand_act(t, n);
            ref_result r = reference(t, w, a, n);
            double err = fabs((double)scalar(w, a, n) - r.dot);
            if (err > TOL * r.mag)
                fail_msg("%s scalar n=%lld: got %.9g, reference %.9g (|err| %.3g > %.3g)", em_type_name(t),
                         (long long)n, (double)scalar(w, a, n), r.dot, err, TOL * r.mag);
            if (r.mag > 0 && err / r.mag > worst) worst = err / r.mag;
            free(w);
            free(a);
        }
        print_message("%-6s scalar vs exact: worst |err|/S = %.2e\n", em_type_name(t), worst);
    }
}

/* Every SIMD kernel the CPU can run against the scalar kernel. */
static void test_simd_vs_scalar(void **state) {
    (void)state;
    int64_t lens[32];
    for (int isa = EM_ISA_AVX2; isa < EM_ISA_COUNT; isa++) {
        if (!em_isa_cpu_supports(isa)) {
            print_message("%s: not supported by this CPU, skipped\n", em_isa_name(isa));
            continue;
        }
        for (int ti = 0; ti < N_DOT_TYPES; ti++) {
            int t = dot_types[ti], used = -1;
            em_dot_fn simd = em_dot_kernel(t, isa, &used);
            em_dot_fn scalar = em_dot_kernel(t, EM_ISA_SCALAR, NULL);
            assert_non_null(simd);
            assert_true(used > EM_ISA_SCALAR && used <= isa); /* every type has an AVX2 kernel */
            double worst = 0;
            for (int li = 0, nl = lengths_for(t, lens); li < nl; li++) {
                int64_t n = lens[li];
                void *w = rand_weights(t, n), *a = rand_act(t, n);
                ref_result r = reference(t, w, a, n);
                float s = scalar(w, a, n), v = simd(w, a, n);
                double err = fabs((double)v - (double)s);
                if (err > TOL * r.mag)
                    fail_msg("%s %s n=%lld: simd %.9g vs scalar %.9g (|diff| %.3g > %.3g)", em_type_name(t),
                             em_isa_name(used), (long long)n, (double)v, (double)s, err, TOL * r.mag);
                if (r.mag > 0 && err / r.mag > worst) worst = err / r.mag;
                free(w);
                free(a);
            }
            print_message("%-6s %-6s (kernel %s) vs scalar: worst |diff|/S = %.2e\n", em_type_name(t),
                          em_isa_name(isa), em_isa_name(used), worst);
        }
    }
}

/* Weights that decode to 0 (or the activation is 0) give exactly 0 on every ISA; empty
 * rows give 0. */
static void test_zero_and_empty(void **state) {
    (void)state;
    for (int ti = 0; ti < N_DOT_TYPES; ti++) {
        int t = dot_types[ti];
        int64_t n = em_dot_block_elems(t) == 1 ? 40 : 2 * em_dot_block_elems(t);
        void *w = rand_weights(t, n);
        uint64_t abytes = row_bytes(em_dot_act_type(t), n);
        void *a = calloc(1, abytes);
        assert_non_null(a);
        for (int isa = 0; isa < EM_ISA_COUNT; isa++) {
            em_dot_fn fn = em_dot_kernel(t, isa, NULL);
            if (!fn) continue;
            assert_true(fn(w, a, n) == 0.0f);
            assert_true(fn(w, a, 0) == 0.0f);
        }
        free(w);
        free(a);
    }
}

/* MXFP4 exponents at the edges, one value per row so no block hides behind bigger ones:
 * 0 and 1 give subnormal fp32 scales (2^-128, 2^-127), 2 the smallest normal one, 240 a
 * huge one. Activation scales are picked so d_w * d_a stays a normal float (as real data
 * would); then every kernel is held to the usual tolerance against the exact reference. */
static void test_mxfp4_exponent_edges(void **state) {
    (void)state;
    static const uint8_t edges[] = { 0, 1, 2, 3, 127, 200, 240 };
    const int64_t nb = 9, n = 32 * nb; /* 4 + 4 blocks and a tail of 1 */
    for (size_t ei = 0; ei < sizeof edges / sizeof edges[0]; ei++) {
        const uint8_t e = edges[ei];
        em_block_mxfp4 *w = rand_weights(EM_TYPE_MXFP4, n);
        em_block_q8_0 *a = rand_act(EM_TYPE_MXFP4, n);
        for (int64_t b = 0; b < nb; b++) {
            w[b].e = e;
            if (e < 2) a[b].d = em_fp32_to_fp16(4096.0f * (1.0f + (float)b / 16)); /* d = 2^-116.. */
            if (e >= 200) a[b].d = em_fp32_to_fp16(6.1035156e-05f);                /* 2^-14 */
        }
        ref_result r = reference(EM_TYPE_MXFP4, w, a, n);
        for (int isa = 0; isa < EM_ISA_COUNT; isa++) {
            em_dot_fn fn = em_dot_kernel(EM_TYPE_MXFP4, isa, NULL);
            if (!fn) continue;
            float v = fn(w, a, n);
            if (!(fabs((double)v - r.dot) <= TOL * r.mag))
                fail_msg("mxfp4 e=%d %s: %.9g vs exact %.9g", e, em_isa_name(isa), (double)v, r.dot);
        }
        free(w);
        free(a);
    }
}

/* The full path: f32 activations -> em_dot_quantize_act -> em_dot, against the f32 dot in
 * double. The activation quantization error is at most half a step per value: |a - x| <=
 * amax(block) / 254 (Q8_0 and Q8_K both use d = amax / 127 and round to nearest). */
static void test_quantized_activation_path(void **state) {
    (void)state;
    for (int ti = 0; ti < N_DOT_TYPES; ti++) {
        int t = dot_types[ti];
        const int64_t n = 1024;
        void *w = rand_weights(t, n);
        float *x = malloc(n * sizeof *x);
        double *v = malloc(n * sizeof *v), *m = malloc(n * sizeof *m);
        assert_true(x && v && m);
        for (int64_t i = 0; i < n; i++) x[i] = rand_f() * (i % 7 == 0 ? 3.0f : 1.0f);
        uint64_t abytes = 0;
        assert_int_equal(em_dot_act_bytes(t, n, &abytes, NULL), 0);
        assert_int_equal(abytes, row_bytes(em_dot_act_type(t), n));
        void *a = malloc(abytes);
        assert_non_null(a);
        em_err err = { 0 };
        int rc = em_dot_quantize_act(t, x, a, n, &err);
        if (rc) fail_msg("quantize activations for %s: %s", em_type_name(t), err.msg);
        float got = 0;
        assert_int_equal(em_dot(t, w, a, n, &got, &err), 0);
        ref_dequant(t, w, n, v, m);
        int at = em_dot_act_type(t), ablk = at == EM_TYPE_F32 ? 1 : at == EM_TYPE_Q8_0 ? 32 : 256;
        double exact = 0, mag = 0, qerr = 0;
        for (int64_t b = 0; b < n / ablk; b++) {
            double amax = 0;
            for (int j = 0; j < ablk; j++) amax = fmax(amax, fabs(x[b * ablk + j]));
            for (int j = 0; j < ablk; j++) {
                int64_t i = b * ablk + j;
                exact += (v[i] + m[i]) * x[i];
                mag += fabs(v[i] * x[i]) + fabs(m[i] * x[i]);
                if (at != EM_TYPE_F32) qerr += fabs(v[i] + m[i]) * amax / 254.0;
            }
        }
        double bound = 1.001 * qerr + TOL * 2 * mag;
        if (fabs(got - exact) > bound)
            fail_msg("%s: quantized path %.9g vs f32 %.9g (|err| %.3g > %.3g)", em_type_name(t), (double)got,
                     exact, fabs(got - exact), bound);
        free(w);
        free(x);
        free(v);
        free(m);
        free(a);
    }
}

/* This file's reference decoding agrees bit for bit with em_dequantize (both claim ggml's
 * to_float semantics; their agreement anchors the reference used above). */
static void test_reference_matches_em_dequantize(void **state) {
    (void)state;
    for (int ti = 0; ti < N_DOT_TYPES; ti++) {
        int t = dot_types[ti];
        int64_t n = em_dot_block_elems(t) == 1 ? 77 : 8 * em_dot_block_elems(t);
        void *w = rand_weights(t, n);
        float *f = malloc(n * sizeof *f);
        double *v = malloc(n * sizeof *v), *m = malloc(n * sizeof *m);
        assert_true(f && v && m);
        em_err err = { 0 };
        assert_int_equal(em_dequantize(t, w, f, n, &err), 0);
        ref_dequant(t, w, n, v, m);
        for (int64_t i = 0; i < n; i++) {
            /* ggml computes the K-quant values in float: d*sc*q - dmin*m rounds once or twice */
            double tol = 2.5e-7 * (fabs(v[i]) + fabs(m[i]));
            if (fabs((double)f[i] - (v[i] + m[i])) > tol)
                fail_msg("%s value %lld: em_dequantize %.9g, reference %.9g", em_type_name(t), (long long)i,
                         (double)f[i], v[i] + m[i]);
        }
        free(w);
        free(f);
        free(v);
        free(m);
    }
}

static void test_checked_entry_points(void **state) {
    (void)state;
    em_err err = { 0 };
    float out = 1, x[64] = { 0 };
    uint64_t bytes = 0;
    uint8_t buf[512] = { 0 };
    assert_int_equal(em_dot(EM_TYPE_Q8_0, buf, buf, 33, &out, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "q8_0"));
    assert_int_equal(em_dot(EM_TYPE_Q4_K, buf, buf, -256, &out, &err), EM_EINVAL);
    assert_int_equal(em_dot(EM_TYPE_I16, buf, buf, 32, &out, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_dot(EM_TYPE_Q8_0, NULL, buf, 32, &out, &err), EM_EINVAL);
    assert_int_equal(em_dot(EM_TYPE_Q8_0, buf, buf, 32, NULL, &err), EM_EINVAL);
    assert_int_equal(em_dot(EM_TYPE_Q8_0, NULL, NULL, 0, &out, &err), 0);
    assert_true(out == 0.0f);
    assert_int_equal(em_dot_act_bytes(EM_TYPE_Q6_K, 512, &bytes, &err), 0);
    assert_int_equal(bytes, 2 * sizeof(em_block_q8_K));
    assert_int_equal(em_dot_act_bytes(EM_TYPE_Q6_K, 100, &bytes, &err), EM_EINVAL);
    assert_int_equal(em_dot_act_bytes(EM_TYPE_BF16, 3, &bytes, &err), 0);
    assert_int_equal(bytes, 12);
    assert_int_equal(em_dot_quantize_act(EM_TYPE_Q8_0, x, NULL, 32, &err), EM_EINVAL);
    assert_int_equal(em_dot_quantize_act(EM_TYPE_Q8_0, x, buf, 31, &err), EM_EINVAL);
    assert_int_equal(em_dot_quantize_act(EM_TYPE_TQ2_0, x, buf, 256, &err), EM_EUNSUPPORTED);
    x[5] = 2.5f;
    assert_int_equal(em_dot_quantize_act(EM_TYPE_F16, x, buf, 8, &err), 0);
    assert_memory_equal(buf, x, 8 * sizeof(float));
}

/* matvec against per-row dots with the same kernel: identical results, for a NULL pool and
 * pools of 1 and 2 threads, on every ISA; shapes that give one task and many. */
static void test_matvec(void **state) {
    (void)state;
    em_pool *pools[3] = { NULL, NULL, NULL };
    assert_int_equal(em_pool_create(&pools[1], 1, NULL), 0);
    assert_int_equal(em_pool_create(&pools[2], 2, NULL), 0);
    static const int64_t shapes[][2] = { { 1, 256 }, { 37, 512 }, { 300, 4096 }, { 2051, 768 } };
    for (int ti = 0; ti < N_DOT_TYPES; ti++) {
        int t = dot_types[ti];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            void *w = rand_weights(t, rows * cols), *a = rand_act(t, cols);
            uint64_t rb = row_bytes(t, cols);
            float *y = malloc((size_t)(rows + 1) * sizeof *y), *want = malloc((size_t)rows * sizeof *want);
            assert_true(y && want);
            for (int isa = 0; isa < EM_ISA_COUNT; isa++) {
                em_dot_fn fn = em_dot_kernel(t, isa, NULL);
                if (!fn) continue;
                for (int64_t r = 0; r < rows; r++) want[r] = fn((const uint8_t *)w + r * rb, a, cols);
                for (int p = 0; p < 3; p++) {
                    for (int64_t r = 0; r <= rows; r++) y[r] = NAN;
                    em_err err = { 0 };
                    int rc = em_matvec_isa(pools[p], isa, t, w, rows, cols, a, y, &err);
                    if (rc) fail_msg("matvec %s: %s", em_type_name(t), err.msg);
                    assert_memory_equal(y, want, (size_t)rows * sizeof *y);
                    assert_true(isnan(y[rows])); /* nothing written past the end */
                }
            }
            /* the default-ISA entry point equals em_dot_get row by row */
            assert_int_equal(em_matvec(pools[2], t, w, rows, cols, a, y, NULL), 0);
            for (int64_t r = 0; r < rows; r++)
                assert_true(y[r] == em_dot_get(t)((const uint8_t *)w + r * rb, a, cols));
            free(w);
            free(a);
            free(y);
            free(want);
        }
    }
    em_pool_free(pools[1]);
    em_pool_free(pools[2]);
}

/* Matrices of tens of MiB, so rows split into several multi-MiB tasks over 2 threads (the
 * shapes above give one or two): every row still equals its own dot, nothing is skipped or
 * written twice out of place. */
static void test_matvec_many_tasks(void **state) {
    (void)state;
    em_pool *pool = NULL;
    assert_int_equal(em_pool_create(&pool, 2, NULL), 0);
    static const struct { int type; int64_t rows, cols; } cases[] = {
        { EM_TYPE_F32, 2600, 4096 },  /* 42.6 MB: 11 tasks */
        { EM_TYPE_Q8_0, 2999, 8192 }, /* 26 MB: 7 tasks */
        { EM_TYPE_Q4_K, 9001, 4096 }, /* 20.7 MB: 5 tasks */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int t = cases[i].type;
        int64_t rows = cases[i].rows, cols = cases[i].cols;
        void *w = rand_weights(t, rows * cols), *a = rand_act(t, cols);
        uint64_t rb = row_bytes(t, cols);
        float *y = malloc((size_t)(rows + 1) * sizeof *y);
        assert_non_null(y);
        for (int64_t r = 0; r <= rows; r++) y[r] = NAN;
        assert_int_equal(em_matvec(pool, t, w, rows, cols, a, y, NULL), 0);
        em_dot_fn fn = em_dot_get(t);
        for (int64_t r = 0; r < rows; r++)
            if (!(y[r] == fn((const uint8_t *)w + r * rb, a, cols)))
                fail_msg("%s matvec row %lld of %lld differs from its dot", em_type_name(t), (long long)r,
                         (long long)rows);
        assert_true(isnan(y[rows]));
        free(w);
        free(a);
        free(y);
    }
    em_pool_free(pool);
}

static void test_matvec_errors(void **state) {
    (void)state;
    em_err err = { 0 };
    uint8_t buf[1024] = { 0 };
    float y[4];
    assert_int_equal(em_matvec(NULL, EM_TYPE_Q8_0, buf, 2, 48, buf, y, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "48"));
    assert_int_equal(em_matvec(NULL, EM_TYPE_Q8_0, buf, -1, 32, buf, y, &err), EM_EINVAL);
    assert_int_equal(em_matvec(NULL, EM_TYPE_I32, buf, 1, 32, buf, y, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_matvec(NULL, EM_TYPE_Q8_0, NULL, 1, 32, buf, y, &err), EM_EINVAL);
    assert_int_equal(em_matvec(NULL, EM_TYPE_Q8_0, buf, 1, 32, buf, NULL, &err), EM_EINVAL);
    assert_int_equal(em_matvec_isa(NULL, 99, EM_TYPE_Q8_0, buf, 1, 32, buf, y, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_matvec(NULL, EM_TYPE_Q8_0, buf, INT64_MAX / 2, 32, buf, y, &err), EM_EOVERFLOW);
    assert_int_equal(em_matvec(NULL, EM_TYPE_Q8_0, NULL, 0, 32, NULL, NULL, &err), 0);
    y[0] = y[1] = 7;
    assert_int_equal(em_matvec(NULL, EM_TYPE_F32, buf, 2, 0, NULL, y, &err), 0);
    assert_true(y[0] == 0.0f && y[1] == 0.0f);
}

int main(void) {
    /* Exercise the EMBER_ISA override (read at the first em_isa_* / dispatch call, so set it
     * before any): ask for AVX2, below the AVX-512 best of the development machine; a CPU
     * without AVX2 falls back to its best with a warning. Unless the caller chose already. */
    if (!getenv("EMBER_ISA")) setenv("EMBER_ISA", "avx2", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairing),
        cmocka_unit_test(test_isa_names_and_default),
        cmocka_unit_test(test_scalar_vs_reference),
        cmocka_unit_test(test_simd_vs_scalar),
        cmocka_unit_test(test_zero_and_empty),
        cmocka_unit_test(test_mxfp4_exponent_edges),
        cmocka_unit_test(test_quantized_activation_path),
        cmocka_unit_test(test_reference_matches_em_dequantize),
        cmocka_unit_test(test_checked_entry_points),
        cmocka_unit_test(test_matvec),
        cmocka_unit_test(test_matvec_many_tasks),
        cmocka_unit_test(test_matvec_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
