/* quant/quantize_k.c: f32 -> the 256-value "K" super-block formats (Q2_K .. Q6_K) and the
 * Q8_K activation format, following ggml's reference quantizers (no importance matrix).
 *
 * Each super-block is split into sub-blocks; a per-sub-block scale (and minimum) is fitted
 * by a small search, the scales themselves are quantized to 4/6/8 bits against one fp16
 * super-scale, and finally every value is re-quantized against the scale it will actually
 * be decoded with. Invariant: bytes identical to ggml_quantize_chunk for finite input,
 * which needs the same float operations in the same order (no FMA contraction) and ggml's
 * tie-to-even rounding (em_round_int). Blocks are built in locals and copied out. */
#include "quant/convert.h"

#include "base/base.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Sub-blocks whose largest magnitude is below this are treated as all zero. */
#define GROUP_EPS 1e-15f

static inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The value of largest magnitude (the first one on ties), sign kept; its magnitude goes to
 * *amax. NaN never wins, as in ggml. */
static float signed_absmax(const float *x, int n, float *amax) {
    float a = 0, max = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > a) {
            a = fabsf(x[i]);
            max = x[i];
        }
    }
    *amax = a;
    return max;
}

/* ---- scale fitting ---------------------------------------------------------------- */

/* Rounds iscale * x[i] to codes l in [-nmax, nmax), stores l + bias in L[i] unless L is NULL,
 * and returns the x^2-weighted sums of x*l (*sumlx) and l*l (*suml2), in index order. */
static void round_weighted(int n, int nmax, const float *x, float iscale, int8_t *L, int bias,
                           float *sumlx, float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clamp_int(em_round_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        if (L) L[i] = (int8_t)(l + bias);
        slx += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

/* Symmetric fit with an error weight of x^2 (ggml's make_qx_quants, rmse type 1): codes
 * L[i] in [0, 2*nmax) stand for L[i] - nmax. Starts from the scale that maps the value of
 * largest magnitude to -nmax, then tries 18 nearby scales and keeps the one with the best
 * weighted least-squares fit. Returns the fitted scale (0 for an all-zero group). */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float sumlx, suml2;
    round_weighted(n, nmax, x, -nmax / max, L, nmax, &sumlx, &suml2);
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        const float iscale = -((float)nmax + 0.1f * (float)is) / max;
        round_weighted(n, nmax, x, iscale, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            round_weighted(n, nmax, x, iscale, L, nmax, &sumlx, &suml2); /* same sums */
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric fit for Q3_K (ggml's make_q3_quants with rmse): start from the max-magnitude
 * scale, then up to 5 rounds of coordinate descent, moving one code at a time when that
 * improves the x^2-weighted fit. Codes L[i] in [0, 2*nmax) stand for L[i] - nmax. */
static float fit_symmetric_q3(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float sumlx, suml2;
    round_weighted(n, nmax, x, -nmax / max, L, 0, &sumlx, &suml2);
    for (int round = 0; round < 5; round++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            const int l = clamp_int(em_round_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (l == L[i]) continue;
            slx += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Parameters of the asymmetric scale search (ggml's make_qkx2_quants arguments). */
typedef struct {
    int nmax;      /* codes 0..nmax */
    float rmin;    /* first trial: (nmax + rmin) / range */
    float rdelta;  /* step between trials */
    int nstep;     /* trials are 0..nstep */
    bool abs_err;  /* minimise weighted |error| instead of error^2 */
} fit_params;

static float fit_error(const fit_params *p, const float *x, const float *w, const uint8_t *L,
                       int n, float scale, float min) {
    float err = 0;
    for (int i = 0; i < n; i++) {
        float diff = scale * (float)L[i] + min - x[i];
        diff = p->abs_err ? fabsf(diff) : diff * diff;
        err += w[i] * diff;
    }
    return err;
}

/* Asymmetric fit x ~ scale * L + min with min <= 0 and codes L in [0, nmax], weighted by w.
 * Tries nstep+1 scales around nmax/range and solves the weighted least-squares problem for
 * (scale, min) at each; keeps the lowest error. Stores -min in *neg_min, returns scale. */
static float fit_scale_min(const fit_params *p, int n, const float *x, const float *w,
                           uint8_t *L, float *neg_min) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)p->nmax / (max - min);
    float scale = 1 / iscale;
    for (int i = 0; i < n; i++)
        L[i] = (uint8_t)clamp_int(em_round_int(iscale * (x[i] - min)), 0, p->nmax);
    float best_err = fit_error(p, x, w, L, n, scale, min);
    uint8_t trial[32];
    for (int is = 0; is <= p->nstep; is++) {
        iscale = (p->rmin + p->rdelta * (float)is + (float)p->nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(em_round_int(iscale * (x[i] - min)), 0, p->nmax);
            trial[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (!(det > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        const float err = fit_error(p, x, w, trial, n, this_scale, this_min);
        if (err < best_err) {
            memcpy(L, trial, (size_t)n);
            best_err = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

/* ---- Q2_K ------------------------------------------------------------------------- */

/* Packs 256 2-bit codes: per 128 values, byte l holds values l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < EM_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 |
                                      L[j + l + 96] << 6);
}

static void quant_block_q2_K(const float *x, em_block_q2_K *b) {
    static const fit_params fit = { 3, -0.5f, 0.1f, 15, true };
    uint8_t L[EM_QK_K];
    float scales[16], mins[16], w[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
        scales[j] = fit_scale_min(&fit, 16, x + 16 * j, w, L + 16 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
        const float iscale = 15.f / max_scale;
        for (int j = 0; j < 16; j++) b->scales[j] = (uint8_t)em_round_int(iscale * scales[j]);
        b->d = em_fp32_to_fp16(max_scale / 15.f);
    } else {
        memset(b->scales, 0, sizeof b->scales);
        b->d = em_fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
        const float iscale = 15.f / max_min;
        for (int j = 0; j < 16; j++)
            b->scales[j] = (uint8_t)(b->scales[j] | (unsigned)em_round_int(iscale * mins[j]) << 4);
        b->dmin = em_fp32_to_fp16(max_min / 15.f);
    } else {
        b->dmin = em_fp32_to_fp16(0.f);
    }
    const float d_all = em_fp16_to_fp32(b->d), dmin_all = em_fp16_to_fp32(b->dmin);
    for (int j = 0; j < 16; j++) {
        const float d = d_all * (float)(b->scales[j] & 0xF);
        if (d == 0.0f) continue;
        const float dm = dmin_all * (float)(b->scales[j] >> 4);
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (uint8_t)clamp_int(em_round_int((x[16 * j + l] + dm) / d), 0, 3);
    }
    pack_2bit(L, b->qs);
}

/* ---- Q3_K ------------------------------------------------------------------------- */

static void quant_block_q3_K(const float *x, em_block_q3_K *b) {
    int8_t L[EM_QK_K];
    float scales[16], amax;
    for (int j = 0; j < 16; j++) scales[j] = fit_symmetric_q3(16, 4, x + 16 * j, L + 16 * j);
    const float max_scale = signed_absmax(scales, 16, &amax);
    /* 6-bit scales biased by 32: low nibbles in scales[0..7], 2 high bits in [8..11] */
    memset(b->scales, 0, sizeof b->scales);
    if (max_scale != 0.0f) {
        const float iscale = -32.f / max_scale;
        for (int j = 0; j < 16; j++) {
            const int l = clamp_int((int8_t)em_round_int(iscale * scales[j]), -32, 31) + 32;
            if (j < 8)
                b->scales[j] = (uint8_t)(l & 0xF);
            else
                b->scales[j - 8] = (uint8_t)(b->scales[j - 8] | (l & 0xF) << 4);
            b->scales[8 + j % 4] = (uint8_t)(b->scales[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
        }
        b->d = em_fp32_to_fp16(1 / iscale);
    } else {
        b->d = em_fp32_to_fp16(0.f);
    }
    const float d_all = em_fp16_to_fp32(b->d);
    for (int j = 0; j < 16; j++) {
        const int low = j < 8 ? b->scales[j] & 0xF : b->scales[j - 8] >> 4;
        const int sc = (low | ((b->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
        const float d = d_all * (float)sc;
        if (d == 0.0f) continue;
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (int8_t)(clamp_int(em_round_int(x[16 * j + l] / d), -4, 3) + 4);
    }
    /* third bit: value j sets bit j/32 of hmask[j%32]; the low two bits pack as in Q2_K */
    uint8_t low2[EM_QK_K];
    memset(b->hmask, 0, sizeof b->hmask);
    for (int j = 0; j < EM_QK_K; j++) {
        int v = L[j];
        if (v > 3) {
            b->hmask[j % 32] = (uint8_t)(b->hmask[j % 32] | 1u << (j / 32));
            v -= 4;
        }
        low2[j] = (uint8_t)v;
    }
    pack_2bit(low2, b->qs);
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------ */

/* Fits 8 sub-blocks of 32 (weights |x| + rms of the sub-block), quantizes scales and mins
 * to 6 bits and packs them as k4 scales; leaves the codes, re-fitted to the stored scales,
 * in L[256] (0..nmax). */
static void quant_scales_k4(const fit_params *fit, const float *x, uint8_t *L, uint16_t *d_out,
                            uint16_t *dmin_out, uint8_t packed[12]) {
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        scales[j] = fit_scale_min(fit, 32, xs, w, L + 32 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        /* the int -> uint8 wrap mirrors ggml; in range for finite input */
        ls[j] = (uint8_t)em_round_int(inv_scale * scales[j]);
        lm[j] = (uint8_t)em_round_int(inv_min * mins[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        packed[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        packed[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | (lm[j + 4] & 0xF) << 4);
    }
    *d_out = em_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = em_fp32_to_fp16(max_min / 63.f);
    const float d_all = em_fp16_to_fp32(*d_out), dmin_all = em_fp16_to_fp32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        const int sc = j < 4 ? packed[j] & 63 : (packed[j + 4] & 0xF) | (packed[j - 4] >> 6) << 4;
        const int m = j < 4 ? packed[j + 4] & 63 : (packed[j + 4] >> 4) | (packed[j] >> 6) << 4;
        const float d = d_all * (float)sc;
        if (d == 0.0f) continue;
        const float dm = dmin_all * (float)m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] =
                (uint8_t)clamp_int(em_round_int((x[32 * j + l] + dm) / d), 0, fit->nmax);
    }
}

static void quant_block_q4_K(const float *x, em_block_q4_K *b) {
    static const fit_params fit = { 15, -1.f, 0.1f, 20, false };
    uint8_t L[EM_QK_K];
    quant_scales_k4(&fit, x, L, &b->d, &b->dmin, b->scales);
    /* per 64 values, byte l holds value l (low nibble) and value l + 32 (high) */
    for (int j = 0; j < EM_QK_K; j += 64)
        for (int l = 0; l < 32; l++) b->qs[j / 2 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
}

static void quant_block_q5_K(const float *x, em_block_q5_K *b) {
    static const fit_params fit = { 31, -0.5f, 0.1f, 15, false };
    uint8_t L[EM_QK_K];
    quant_scales_k4(&fit, x, L, &b->d, &b->dmin, b->scales);
    /* as Q4_K, plus the fifth bit of value 32*j + l (sub-block j) in bit j of qh[l] */
    memset(b->qh, 0, sizeof b->qh);
    for (int j = 0; j < EM_QK_K; j += 64) {
        for (int l = 0; l < 32; l++) {
            const int lo = L[j + l], hi = L[j + l + 32];
            const int sub = j / 32;
            b->qh[l] = (uint8_t)(b->qh[l] | (lo >> 4) << sub | (hi >> 4) << (sub + 1));
            b->qs[j / 2 + l] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------------- */

static void quant_block_q6_K(const float *x, em_block_q6_K *b) {
    int8_t L[EM_QK_K];
    float scales[16], max_abs_scale;
    for (int j = 0; j < 16; j++) scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
    const float max_scale = signed_absmax(scales, 16, &max_abs_scale);
    if (max_abs_scale < GROUP_EPS) {
        memset(b, 0, sizeof *b);
        return;
    }
    const float iscale = -128.f / max_scale;
    b->d = em_fp32_to_fp16(1 / iscale);
    for (int j = 0; j < 16; j++) {
        const int s = em_round_int(iscale * scales[j]);
        b->scales[j] = (int8_t)(s < 127 ? s : 127);
    }
    const float d_all = em_fp16_to_fp32(b->d);
    for (int j = 0; j < 16; j++) {
        const float d = d_all * (float)b->scales[j];
        if (d == 0.0f) continue;
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (int8_t)(clamp_int(em_round_int(x[16 * j + l] / d), -32, 31) + 32);
    }
    /* the layout em_dequant_q6_K reads: per 128 values, 4 rows k of 32 */
    for (int h = 0; h < 2; h++) {
        const int8_t *Lh = L + 128 * h;
        uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            const int q0 = Lh[l], q1 = Lh[l + 32], q2 = Lh[l + 64], q3 = Lh[l + 96];
            ql[l] = (uint8_t)((q0 & 0xF) | (q2 & 0xF) << 4);
            ql[l + 32] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
            qh[l] = (uint8_t)(q0 >> 4 | (q1 >> 4) << 2 | (q2 >> 4) << 4 | (q3 >> 4) << 6);
        }
    }
}

/* ---- Q8_K (activations): float scale, codes in [-127, 127], sums of 16 ------------ */

static void quant_block_q8_K(const float *x, em_block_q8_K *b) {
    float amax;
    const float max = signed_absmax(x, EM_QK_K, &amax);
    if (amax == 0.0f) {
        memset(b, 0, sizeof *b); /* ggml leaves bsums untouched here; zero is their value */
        return;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < EM_QK_K; j++) {
        const int v = em_round_int(iscale * x[j]);
        b->qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int g = 0; g < EM_QK_K / 16; g++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += b->qs[16 * g + l];
        b->bsums[g] = (int16_t)sum;
    }
    b->d = 1 / iscale;
}

/* ---- row entry points -------------------------------------------------------------- */

#define K_QUANT_ROW(name, block_type)                                          \
    void em_quant_##name(const float *src, void *dst, int64_t n) {             \
        uint8_t *out = dst;                                                    \
        for (int64_t i = 0; i < n / EM_QK_K; i++, src += EM_QK_K) {           \
            block_type b;                                                      \
            quant_block_##name(src, &b);                                       \
            memcpy(out + (size_t)i * sizeof b, &b, sizeof b);                  \
        }                                                                      \
    }

K_QUANT_ROW(q2_K, em_block_q2_K)
K_QUANT_ROW(q3_K, em_block_q3_K)
K_QUANT_ROW(q4_K, em_block_q4_K)
K_QUANT_ROW(q5_K, em_block_q5_K)
K_QUANT_ROW(q6_K, em_block_q6_K)
K_QUANT_ROW(q8_K, em_block_q8_K)
