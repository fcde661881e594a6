/* Allocation that reports what it was for, and arenas for per-step scratch.
 * An arena is a chain of blocks; allocations are 64-byte aligned (cache lines, AVX-512
 * loads); reset keeps the first block so a steady-state step allocates nothing. */
#include "base.h"

#include <stdlib.h>
#include <string.h>

void *em_malloc(size_t n, const char *what, em_err *err) {
    void *p = malloc(n ? n : 1);
    if (!p) em_err_set(err, EM_ENOMEM, "out of memory allocating %zu bytes for %s", n, what);
    return p;
}

void *em_calloc(size_t count, size_t size, const char *what, em_err *err) {
    uint64_t total;
    if (em_mul_overflow(count, size, &total)) {
        em_err_set(err, EM_EOVERFLOW, "allocation size overflow for %s (%zu x %zu)", what, count,
                   size);
        return NULL;
    }
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) em_err_set(err, EM_ENOMEM, "out of memory allocating %zu bytes for %s", (size_t)total,
                       what);
    return p;
}

void *em_aligned_alloc(size_t alignment, size_t n, const char *what, em_err *err) {
    void *p = NULL;
    if (posix_memalign(&p, alignment, n ? n : 1) != 0) {
        em_err_set(err, EM_ENOMEM, "out of memory allocating %zu aligned bytes for %s", n, what);
        return NULL;
    }
    return p;
}

char *em_strdup(const char *s, em_err *err) {
    size_t n = strlen(s) + 1;
    char *p = em_malloc(n, "string", err);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- arena ---- */

#define ARENA_ALIGN 64

typedef struct arena_block {
    struct arena_block *next;
    size_t cap, used;
    uint8_t *data;
} arena_block;

struct em_arena {
    arena_block *head; /* current block (most recent); the first block is at the tail */
    size_t block_bytes;
    size_t total_used;
};

static arena_block *block_new(size_t cap) {
    arena_block *b = malloc(sizeof *b);
    if (!b) return NULL;
    if (posix_memalign((void **)&b->data, ARENA_ALIGN, cap) != 0) {
        free(b);
        return NULL;
    }
    b->next = NULL;
    b->cap = cap;
    b->used = 0;
    return b;
}

int em_arena_create(em_arena **out, size_t block_bytes, em_err *err) {
    *out = NULL;
    em_arena *a = em_calloc(1, sizeof *a, "arena", err);
    if (!a) return EM_ENOMEM;
    a->block_bytes = block_bytes < 4096 ? 4096 : em_align_up(block_bytes, ARENA_ALIGN);
    a->head = block_new(a->block_bytes);
    if (!a->head) {
        free(a);
        return em_err_set(err, EM_ENOMEM, "out of memory creating a %zu-byte arena", block_bytes);
    }
    *out = a;
    return EM_OK;
}

void em_arena_free(em_arena *a) {
    if (!a) return;
    for (arena_block *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b->data);
        free(b);
    }
    free(a);
}

void *em_arena_alloc(em_arena *a, size_t n) {
    size_t need = em_align_up(n ? n : 1, ARENA_ALIGN);
    if (need < n) return NULL; /* overflow */
    arena_block *b = a->head;
    if (b->cap - b->used < need) {
        size_t cap = need > a->block_bytes ? need : a->block_bytes;
        arena_block *nb = block_new(cap);
        if (!nb) return NULL;
        nb->next = b;
        a->head = b = nb;
    }
    void *p = b->data + b->used;
    b->used += need;
    a->total_used += need;
    return p;
}

void em_arena_reset(em_arena *a) {
    /* keep the largest block so the next step of the same shape fits without malloc */
    arena_block *keep = a->head;
    for (arena_block *b = a->head; b; b = b->next)
        if (b->cap > keep->cap) keep = b;
    for (arena_block *b = a->head, *next; b; b = next) {
        next = b->next;
        if (b == keep) continue;
        free(b->data);
        free(b);
    }
    keep->next = NULL;
    keep->used = 0;
    a->head = keep;
    a->total_used = 0;
}

size_t em_arena_used(const em_arena *a) { return a->total_used; }
