/* decode/ring.c: the feature ring. Holds the target's captured features (its tap layers'
 * outputs, concatenated) for the most recent `cap` committed positions, in one storage type
 * chosen at create (F32, F16, BF16 or Q8_0), so the drafter's context can be extended from
 * rows the target computed during its own verify/prefill, never from an extra pass.
 *
 * Invariants: position p lives in slot p % cap; rows [end - held, end) are valid, held =
 * min(end, cap); a stored row is row_vals values (n_feat rounded up to the type's block, the
 * padding zero) quantized with quant/ (bit-identical to ggml's from_float), so reading it back
 * is em_dequantize of the slot. The two scratch rows are the only buffers besides storage:
 * nothing is allocated after create. Must not: know the drafter or the target. */
#include "decode/decode_impl.h"

#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

struct em_decode_ring {
    int type;
    int n_feat;
    int row_vals;      /* n_feat rounded up to the type's block size */
    size_t row_bytes;  /* bytes of one stored row */
    int cap;           /* rows held at most */
    int64_t end;       /* position after the last row pushed */
    uint8_t *data;     /* [cap][row_bytes] */
    float *pad;        /* [row_vals]: a row with its zero padding, for quantize/dequantize */
};

static bool type_allowed(int type) {
    return type == EM_TYPE_F32 || type == EM_TYPE_F16 || type == EM_TYPE_BF16 || type == EM_TYPE_Q8_0;
}

int em_decode_ring_create(em_decode_ring **out, int n_feat, int cap, int type, em_err *err) {
    *out = NULL;
    if (n_feat < 1 || cap < 1)
        return em_err_set(err, EM_EINVAL, "feature ring: %d floats per row, %d rows (both must be >= 1)", n_feat, cap);
    if (!type_allowed(type))
        return em_err_set(err, EM_EINVAL, "feature ring: storage type %s is not one of f32, f16, bf16, q8_0",
                          em_type_name(type));
    const em_type_info *ti = em_type_get(type);
    uint64_t block = (uint64_t)ti->block_elems, vals = ((uint64_t)n_feat + block - 1) / block * block, row_bytes, total;
    int rc = em_type_row_bytes(type, vals, &row_bytes, err);
    if (rc) return em_err_prefix(err, "feature ring");
    if (em_mul_overflow(row_bytes, (uint64_t)cap, &total) || total > SIZE_MAX || vals > INT32_MAX)
        return em_err_set(err, EM_EOVERFLOW, "feature ring: %d rows of %d features do not fit in memory", cap, n_feat);
    em_decode_ring *r = em_calloc(1, sizeof *r, "feature ring", err);
    if (!r) return EM_ENOMEM;
    r->type = type;
    r->n_feat = n_feat;
    r->row_vals = (int)vals;
    r->row_bytes = (size_t)row_bytes;
    r->cap = cap;
    r->data = em_malloc((size_t)total, "feature ring rows", err);
    r->pad = r->data ? em_calloc((size_t)vals, sizeof *r->pad, "feature ring row", err) : NULL;
    if (!r->pad) {
        em_decode_ring_free(r);
        return EM_ENOMEM;
    }
    /* written once now: a decode loop writes every slot within its first cap positions, and
     * a first write to a fresh page is a fault (several microseconds each on virtual machines)
     * that a pass should not pay */
    memset(r->data, 0, (size_t)total);
    *out = r;
    return EM_OK;
}

void em_decode_ring_free(em_decode_ring *r) {
    if (!r) return;
    free(r->data);
    free(r->pad);
    free(r);
}

void em_decode_ring_reset(em_decode_ring *r) { r->end = 0; }

int64_t em_decode_ring_end(const em_decode_ring *r) { return r->end; }

size_t em_decode_ring_row_bytes(const em_decode_ring *r) { return r->row_bytes; }

static uint8_t *slot(const em_decode_ring *r, int64_t pos) {
    return r->data + (size_t)(pos % r->cap) * r->row_bytes;
}

static int store_row(em_decode_ring *r, int64_t pos, const float *row, em_err *err) {
    if (r->type == EM_TYPE_F32) {
        memcpy(slot(r, pos), row, (size_t)r->n_feat * sizeof *row);
        return EM_OK;
    }
    memcpy(r->pad, row, (size_t)r->n_feat * sizeof *row); /* the tail past n_feat stays zero */
    return em_quantize(r->type, r->pad, slot(r, pos), r->row_vals, err);
}

int em_decode_ring_push(em_decode_ring *r, int64_t pos, const float *rows, int n, em_err *err) {
    if (n < 0 || (n > 0 && !rows))
        return em_err_set(err, EM_EINVAL, "feature ring: push of %d rows%s", n, rows ? "" : " from NULL");
    if (pos != r->end)
        return em_err_set(err, EM_EINVAL, "feature ring: push at position %lld, but the next position is %lld",
                          (long long)pos, (long long)r->end);
    if (n > INT64_MAX - r->end) return em_err_set(err, EM_EOVERFLOW, "feature ring: position overflow");
    int first = n > r->cap ? n - r->cap : 0; /* rows that would be overwritten at once */
    for (int i = first; i < n; i++) {
        int rc = store_row(r, pos + i, rows + (size_t)i * (size_t)r->n_feat, err);
        if (rc) return em_err_prefix(err, "feature ring: row of position %lld", (long long)(pos + i));
    }
    r->end += n;
    return EM_OK;
}

int em_decode_ring_read(em_decode_ring *r, int64_t pos, int n, float *out, em_err *err) {
    int64_t held_from = r->end > r->cap ? r->end - r->cap : 0;
    if (n < 0 || (n > 0 && !out) || pos < held_from || pos > r->end - n)
        return em_err_set(err, EM_EINVAL, "feature ring: read of %d rows at position %lld, but it holds [%lld, %lld)", n,
                          (long long)pos, (long long)held_from, (long long)r->end);
    for (int i = 0; i < n; i++) {
        float *dst = out + (size_t)i * (size_t)r->n_feat;
        if (r->type == EM_TYPE_F32) {
            memcpy(dst, slot(r, pos + i), (size_t)r->n_feat * sizeof *dst);
            continue;
        }
        int rc = em_dequantize(r->type, slot(r, pos + i), r->pad, r->row_vals, err);
        if (rc) return em_err_prefix(err, "feature ring: row of position %lld", (long long)(pos + i));
        memcpy(dst, r->pad, (size_t)r->n_feat * sizeof *dst);
    }
    return EM_OK;
}
