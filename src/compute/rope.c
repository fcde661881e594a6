/* Rotary position embeddings in the HF "rotate-half" (neox) layout: for a head of `dims`
 * rotated values, value i pairs with value i + dims/2 and turns by pos * inv_freq[i].
 * Owns the inverse frequencies of the three schedules drafters use (plain, linear scaling,
 * and HF YaRN: a ramp between interpolated and extrapolated frequencies over the correction
 * range of beta_fast / beta_slow, with cos/sin scaled by the attention factor, by default
 * 0.1 * ln(factor) + 1). Angles and their cos/sin are computed in double and rounded once.
 * Invariants: dims is even, 2 <= dims <= EM_ROPE_MAX_DIMS; every inv_freq is finite and
 * positive. Nothing is allocated. */
#include "compute/compute.h"

#include <stdio.h>

static const char *scaling_name(int s) {
    switch (s) {
    case EM_ROPE_NONE: return "none";
    case EM_ROPE_LINEAR: return "linear";
    case EM_ROPE_YARN: return "yarn";
    default: return "unknown";
    }
}

/* HF's find_correction_dim: the dimension whose wavelength fits n_rot turns in orig_ctx. */
static double correction_dim(double n_rot, int dims, double theta, double orig_ctx) {
    return dims * log(orig_ctx / (n_rot * 2.0 * M_PI)) / (2.0 * log(theta));
}

static int check_params(const em_rope_params *p, em_err *err) {
    if (p->dims < 2 || p->dims > EM_ROPE_MAX_DIMS || p->dims % 2 != 0)
        return em_err_set(err, EM_EINVAL, "rope: %d rotated dimensions (want an even number in 2..%d)",
                          p->dims, EM_ROPE_MAX_DIMS);
    if (!(p->theta > 1.0 && p->theta < 1e30))
        return em_err_set(err, EM_EINVAL, "rope: base (theta) %g is not > 1", p->theta);
    if (p->scaling != EM_ROPE_NONE && p->scaling != EM_ROPE_LINEAR && p->scaling != EM_ROPE_YARN)
        return em_err_set(err, EM_EINVAL, "rope: unknown scaling type %d", p->scaling);
    if (p->scaling != EM_ROPE_NONE && !(p->factor > 0.0 && p->factor < 1e9))
        return em_err_set(err, EM_EINVAL, "rope: %s scaling factor %g is not positive",
                          scaling_name(p->scaling), p->factor);
    if (p->scaling == EM_ROPE_YARN) {
        if (!(p->orig_ctx >= 1.0 && p->orig_ctx < 1e15))
            return em_err_set(err, EM_EINVAL, "rope: yarn original context length %g is not >= 1", p->orig_ctx);
        if (!(p->beta_fast > 0.0 && p->beta_fast < 1e9) || !(p->beta_slow > 0.0 && p->beta_slow < 1e9))
            return em_err_set(err, EM_EINVAL, "rope: yarn beta_fast %g / beta_slow %g must be positive",
                              p->beta_fast, p->beta_slow);
        if (p->attn_factor < 0.0 || !(p->attn_factor < 1e9))
            return em_err_set(err, EM_EINVAL, "rope: yarn attention factor %g is negative", p->attn_factor);
    }
    return EM_OK;
}

/* HF _compute_yarn_parameters with truncate = true. */
static void yarn_freqs(const em_rope_params *p, double *inv, double *attn) {
    const int half = p->dims / 2;
    double lo = floor(correction_dim(p->beta_fast, p->dims, p->theta, p->orig_ctx));
    double hi = ceil(correction_dim(p->beta_slow, p->dims, p->theta, p->orig_ctx));
    if (lo < 0) lo = 0;
    if (hi > p->dims - 1) hi = p->dims - 1;
    if (lo == hi) hi += 0.001; /* HF: avoids a zero-width ramp */
    for (int i = 0; i < half; i++) {
        double extra = inv[i], inter = inv[i] / p->factor;
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double keep = 1.0 - ramp; /* share of the extrapolated (unscaled) frequency */
        inv[i] = inter * (1.0 - keep) + extra * keep;
    }
    *attn = p->attn_factor > 0 ? p->attn_factor : p->factor <= 1.0 ? 1.0 : 0.1 * log(p->factor) + 1.0;
}

int em_rope_init(em_rope *r, const em_rope_params *p, em_err *err) {
    int rc = check_params(p, err);
    if (rc) return rc;
    const int half = p->dims / 2;
    double inv[EM_ROPE_MAX_DIMS / 2], attn = 1.0;
    for (int i = 0; i < half; i++) inv[i] = 1.0 / pow(p->theta, (2.0 * i) / p->dims);
    if (p->scaling == EM_ROPE_LINEAR)
        for (int i = 0; i < half; i++) inv[i] /= p->factor;
    else if (p->scaling == EM_ROPE_YARN)
        yarn_freqs(p, inv, &attn);
    *r = (em_rope){ .dims = p->dims, .attn_factor = attn };
    for (int i = 0; i < half; i++) r->inv_freq[i] = inv[i];
    return EM_OK;
}

void em_rope_cos_sin(const em_rope *r, int64_t pos, float *cs, float *sn) {
    const int half = r->dims / 2;
    for (int i = 0; i < half; i++) {
        double a = (double)pos * r->inv_freq[i];
        cs[i] = (float)(cos(a) * r->attn_factor);
        sn[i] = (float)(sin(a) * r->attn_factor);
    }
}

void em_rope_apply(float *x, int n_heads, int64_t head_stride, int dims, const float *cs,
                   const float *sn) {
    const int half = dims / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_stride;
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}
