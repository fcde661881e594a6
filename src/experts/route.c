/* experts/route: the route-batch union. n rows x k expert choices of one layer become the
 * list of distinct experts (ascending), each with the rows and weights routed to it, so an
 * expert is read once and computed once over all its rows. Counting sort: O(n k + X) with X
 * the layer's expert count. All output lives in the caller's arena. */
#include "experts/experts.h"

#include <string.h>

int em_route_union_build(em_route_union *u, const int *ids, const float *weights, int n_rows,
                         int k, int n_expert, em_arena *arena, em_err *err) {
    memset(u, 0, sizeof *u);
    uint64_t nk;
    if (n_rows < 0 || k < 0 || n_expert <= 0 || em_mul_overflow((uint64_t)n_rows, (uint64_t)k, &nk) ||
        nk > INT32_MAX)
        return em_err_set(err, EM_EINVAL, "route union: bad shape (%d rows x %d of %d experts)",
                          n_rows, k, n_expert);
    for (uint64_t i = 0; i < nk; i++)
        if (ids[i] < 0 || ids[i] >= n_expert)
            return em_err_set(err, EM_EINVAL, "route union: row %llu routes to expert %d of %d",
                              (unsigned long long)(i / (uint64_t)k), ids[i], n_expert);
    int *count = em_arena_alloc(arena, ((size_t)n_expert + 1) * sizeof *count);
    u->row = em_arena_alloc(arena, (nk ? nk : 1) * sizeof *u->row);
    u->weight = em_arena_alloc(arena, (nk ? nk : 1) * sizeof *u->weight);
    if (!count || !u->row || !u->weight)
        return em_err_set(err, EM_ENOMEM, "route union: out of scratch for %d rows", n_rows);
    memset(count, 0, ((size_t)n_expert + 1) * sizeof *count);
    for (uint64_t i = 0; i < nk; i++) count[ids[i]]++;
    int n = 0;
    for (int e = 0; e < n_expert; e++) n += count[e] > 0;
    u->expert = em_arena_alloc(arena, ((size_t)n + 1) * sizeof *u->expert);
    u->start = em_arena_alloc(arena, ((size_t)n + 1) * sizeof *u->start);
    if (!u->expert || !u->start)
        return em_err_set(err, EM_ENOMEM, "route union: out of scratch for %d experts", n);
    /* count[e] becomes the next write position of expert e's rows */
    int pos = 0, j = 0;
    for (int e = 0; e < n_expert; e++) {
        if (!count[e]) continue;
        u->expert[j] = e;
        u->start[j++] = pos;
        int c = count[e];
        count[e] = pos;
        pos += c;
    }
    u->start[n] = pos;
    for (uint64_t i = 0; i < nk; i++) { /* rows in ascending order within each expert */
        int at = count[ids[i]]++;
        u->row[at] = (int)(i / (uint64_t)k);
        u->weight[at] = weights ? weights[i] : 0.0f;
    }
    u->n = n;
    return EM_OK;
}
