/* backend/gpu_common.c: the host-only part of the GPU op layer, compiled in every build (with
 * or without CUDA): device-name parsing and the byte sizes of device layouts. Owns no device
 * state and calls no CUDA. */
#include "backend/gpu.h"

#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int em_gpu_parse_device(const char *spec, int *index, em_err *err) {
    if (!spec) return em_err_set(err, EM_EINVAL, "device: no name given (expected cuda or cuda:N)");
    if (strcmp(spec, "cuda") == 0) {
        *index = 0;
        return 0;
    }
    if (strncmp(spec, "cuda:", 5) != 0 || spec[5] == 0)
        return em_err_set(err, EM_EINVAL, "device '%s': expected cpu, cuda or cuda:N", spec);
    long v = 0;
    for (const char *p = spec + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v >= 1024)
            return em_err_set(err, EM_EINVAL, "device '%s': N in cuda:N must be a decimal index below 1024", spec);
        v = v * 10 + (*p - '0');
    }
    if (v >= 1024)
        return em_err_set(err, EM_EINVAL, "device '%s': N in cuda:N must be a decimal index below 1024", spec);
    *index = (int)v;
    return 0;
}

/* ---- weight types (wt-cuda3: the quantized products and the F32 fallback) ---------------- */

bool em_gpu_mat_type_ok(int type) {
    return type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16 || type == EM_TYPE_Q8_0 ||
           type == EM_TYPE_Q4_K || type == EM_TYPE_Q6_K || type == EM_TYPE_MXFP4;
}

int em_gpu_mat_dev_type(int type) {
    if (em_gpu_mat_type_ok(type)) return type;
    const em_type_info *ti = em_type_get(type);
    return ti && ti->to_float ? EM_TYPE_F32 : -1;
}

int em_gpu_mat_bytes(int type, int64_t rows, int64_t cols, uint64_t *bytes, em_err *err) {
    const int dev = em_gpu_mat_dev_type(type);
    if (dev < 0)
        return em_err_set(err, EM_EUNSUPPORTED,
                          "GPU matrices of type %s are not supported (Ember cannot read that type)", em_type_name(type));
    if (rows <= 0 || cols <= 0) return em_err_set(err, EM_EINVAL, "GPU matrix of %lld x %lld values", (long long)rows, (long long)cols);
    uint64_t row = 0;
    int rc = em_type_row_bytes(type, (uint64_t)cols, &row, err); /* checks cols against the GGUF block */
    if (rc) return em_err_prefix(err, "GPU matrix");
    if (dev != type) row = (uint64_t)cols * sizeof(float); /* converted to F32 at upload */
    if ((uint64_t)rows > UINT64_MAX / row) return em_err_set(err, EM_EOVERFLOW, "GPU matrix of %lld rows overflows", (long long)rows);
    *bytes = row * (uint64_t)rows;
    return 0;
}

/* Weights whose products take Q8_0 activations (the integer kernels); float ones take F32. */
static bool q8_act(int wtype) {
    return wtype == EM_TYPE_Q8_0 || wtype == EM_TYPE_Q4_K || wtype == EM_TYPE_Q6_K || wtype == EM_TYPE_MXFP4;
}

int em_gpu_act_type(int wtype) {
    if (!em_gpu_mat_type_ok(wtype)) return -1;
    return q8_act(wtype) ? EM_TYPE_Q8_0 : EM_TYPE_F32;
}

/* ---- end of weight types -------------------------------------------------------------- */

uint64_t em_gpu_act_bytes(int wtype, int64_t cols, int n) {
    if (!q8_act(wtype) || cols <= 0 || n <= 0) return 0;
    /* int8 quants, padded to 16 bytes, then one float scale per 32 values */
    uint64_t q = ((uint64_t)n * (uint64_t)cols + 15) & ~(uint64_t)15;
    return q + (uint64_t)n * (uint64_t)(cols / 32) * sizeof(float);
}

bool em_gpu_act_in_block(int wtype, const float *d_x, const float *d_up, int64_t ldx, int64_t cols, int n, int act,
                         float beta, float lin_beta, em_gpu_act *out) {
    if (!q8_act(wtype) || !d_x || cols <= 0 || cols % 32 || ldx < cols || n < 1 || n > EM_GPU_MAX_ROWS ||
        (int64_t)n * cols > EM_GPU_IN_BLOCK_MAX)
        return false;
    const bool situ_ok = act == EM_GPU_ACT_SITU && beta > 0.0f && isfinite(beta) && !isnan(lin_beta);
    if (d_up && act != EM_GPU_ACT_SWIGLU && !situ_ok) return false;
    *out = (em_gpu_act){ .type = EM_TYPE_Q8_0, .n = n, .cols = cols, .x = d_x, .ldx = ldx, .in_block = true,
                         .up = d_up, .glu = act, .situ_beta = beta, .situ_lin_beta = lin_beta };
    return true;
}
