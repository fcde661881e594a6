/* compute/acts.c: products of weight matrices with one set of activation rows, the rows
 * converted at most once per activation type (em_acts), one product or several in one pool
 * run (em_mm, em_mm_many), and float scratch from an arena with a message that names it
 * (em_falloc). The model forwards and the drafter run every weight product through these.
 *
 * Invariants: an em_acts converts lazily, into its caller's arena, and keeps the converted
 * rows for as long as that arena is not reset; every output is exactly what em_matmul_act
 * gives for the same weights and rows (the cache changes when rows are converted, never
 * what they become). */
#include "compute/compute.h"

#include <stdint.h>

float *em_falloc(em_arena *arena, uint64_t count, const char *what, em_err *err) {
    float *p = count <= SIZE_MAX / sizeof(float) ? em_arena_alloc(arena, (size_t)count * sizeof(float)) : NULL;
    if (!p) em_err_set(err, EM_ENOMEM, "out of memory for %s (%llu floats)", what, (unsigned long long)count);
    return p;
}

void em_acts_init(em_acts *a, const float *x, int64_t ldx, int64_t cols, int64_t n) {
    *a = (em_acts){ .x = x, .ldx = ldx, .cols = cols, .n = n };
}

/* The cache slot of an activation type (the dot kernels take F32, Q8_0 or Q8_K rows). */
static int act_slot(int act_type) {
    switch (act_type) {
    case EM_TYPE_F32: return 0;
    case EM_TYPE_Q8_0: return 1;
    case EM_TYPE_Q8_K: return 2;
    default: return -1;
    }
}

int em_acts_for(em_acts *a, int wtype, em_pool *pool, em_arena *arena, const em_act **act, em_err *err) {
    int slot = act_slot(em_dot_act_type(wtype));
    if (slot < 0)
        return em_err_set(err, EM_EUNSUPPORTED, "no activation type for weights of type %s", em_type_name(wtype));
    if (!a->have[slot]) {
        uint64_t bytes;
        int rc = em_act_bytes(wtype, a->cols, a->n, &bytes, err);
        if (rc) return rc;
        void *buf = bytes ? em_arena_alloc(arena, (size_t)bytes) : NULL;
        if (bytes && !buf) return em_err_set(err, EM_ENOMEM, "out of memory for %llu activation bytes", (unsigned long long)bytes);
        rc = em_act_prepare(pool, wtype, a->x, a->ldx, a->cols, a->n, buf, &a->act[slot], err);
        if (rc) return rc;
        a->have[slot] = true;
    }
    *act = &a->act[slot];
    return EM_OK;
}

int em_mm(em_acts *a, const em_mat *w, float *y, int64_t ldy, em_pool *pool, em_arena *arena, em_err *err) {
    const em_act *act = NULL;
    int rc = em_acts_for(a, w->type, pool, arena, &act, err);
    return rc ? rc : em_matmul_act(pool, w, act, y, ldy, err);
}

int em_mm_many(const em_mm_out *out, int n_out, em_pool *pool, em_arena *arena, em_err *err) {
    em_mm_item items[EM_MATMUL_MULTI_MAX];
    if (n_out > EM_MATMUL_MULTI_MAX)
        return em_err_set(err, EM_EINVAL, "%d products in one run (at most %d)", n_out, EM_MATMUL_MULTI_MAX);
    for (int i = 0; i < n_out; i++) {
        int rc = em_acts_for(out[i].x, out[i].w->type, pool, arena, &items[i].act, err);
        if (rc) return rc;
        items[i].w = out[i].w;
        items[i].y = out[i].y;
        items[i].ldy = out[i].ldy;
    }
    return em_matmul_multi(pool, items, n_out, err);
}
