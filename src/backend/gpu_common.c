/* backend/gpu_common.c: the host-only part of the GPU op layer, compiled in every build (with
 * or without CUDA): device-name parsing and the byte sizes of device layouts. Owns no device
 * state and calls no CUDA. */
#include "backend/gpu.h"

#include "quant/quant.h"

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

bool em_gpu_mat_type_ok(int type) {
    return type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16 || type == EM_TYPE_Q8_0;
}

int em_gpu_mat_bytes(int type, int64_t rows, int64_t cols, uint64_t *bytes, em_err *err) {
    if (!em_gpu_mat_type_ok(type))
        return em_err_set(err, EM_EUNSUPPORTED, "GPU matrices of type %s are not supported yet (F32, F16, BF16, Q8_0 are)",
                          em_type_name(type));
    if (rows <= 0 || cols <= 0) return em_err_set(err, EM_EINVAL, "GPU matrix of %lld x %lld values", (long long)rows, (long long)cols);
    uint64_t row = 0;
    int rc = em_type_row_bytes(type, (uint64_t)cols, &row, err);
    if (rc) return em_err_prefix(err, "GPU matrix");
    if ((uint64_t)rows > UINT64_MAX / row) return em_err_set(err, EM_EOVERFLOW, "GPU matrix of %lld rows overflows", (long long)rows);
    *bytes = row * (uint64_t)rows;
    return 0;
}

uint64_t em_gpu_act_bytes(int wtype, int64_t cols, int n) {
    if (wtype != EM_TYPE_Q8_0 || cols <= 0 || n <= 0) return 0;
    /* int8 quants, padded to 16 bytes, then one float scale per 32 values */
    uint64_t q = ((uint64_t)n * (uint64_t)cols + 15) & ~(uint64_t)15;
    return q + (uint64_t)n * (uint64_t)(cols / 32) * sizeof(float);
}
