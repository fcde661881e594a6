/* Internal to format/gguf_*.c: little-endian loads and stores, and the layout of an array
 * value as the reader keeps it (the writer copies arrays byte for byte from it). */
#ifndef EM_FORMAT_GGUF_IMPL_H
#define EM_FORMAT_GGUF_IMPL_H

#include "format/gguf.h"

#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "format/gguf assumes a little-endian host (GGUF files are little-endian)"
#endif

static inline uint16_t em_gguf_ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t em_gguf_ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t em_gguf_ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* The fixed-size value types as (suffix, C type, GGUF type, em_gguf_value field): one list
 * for the reader's typed getters and the writer's setters, so the two cannot drift apart. */
#define EM_GGUF_FIXED_TYPES(X)              \
    X(u8, uint8_t, EM_GGUF_U8, u)          \
    X(i8, int8_t, EM_GGUF_I8, i)           \
    X(u16, uint16_t, EM_GGUF_U16, u)       \
    X(i16, int16_t, EM_GGUF_I16, i)        \
    X(u32, uint32_t, EM_GGUF_U32, u)       \
    X(i32, int32_t, EM_GGUF_I32, i)        \
    X(u64, uint64_t, EM_GGUF_U64, u)       \
    X(i64, int64_t, EM_GGUF_I64, i)        \
    X(f32, float, EM_GGUF_F32, f32)        \
    X(f64, double, EM_GGUF_F64, f64)       \
    X(bool, bool, EM_GGUF_BOOL, b)

/* Bytes of the file header before the first key: magic, version, n_tensors, n_kv. */
#define EM_GGUF_HEADER_BYTES 24

struct em_gguf_arr {
    int elem_type;
    uint64_t count;
    const uint8_t *data;      /* first element */
    const uint8_t *raw;       /* the element-type field: raw..raw+raw_len is the whole array */
    uint64_t raw_len;
    uint64_t *str_off;        /* STR: offset from data of element i's length field */
    struct em_gguf_arr *sub;  /* ARRAY: the count nested arrays */
    const char *key;          /* the key this array belongs to (for messages) */
};

/* A hash index over byte-string names (FNV-1a, open addressing, linear probing). The names
 * are not copied: they must outlive the index. It grows itself, so inserts never fail for
 * want of room, only for want of memory. */
typedef struct em_gguf_ix_slot {
    const char *s;
    uint64_t len;
    int64_t idx; /* -1: empty */
} em_gguf_ix_slot;

typedef struct em_gguf_ix {
    em_gguf_ix_slot *slots;
    uint64_t mask;
    uint64_t used;
} em_gguf_ix;

static inline uint64_t em_gguf_ix_hash(const char *s, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

/* Room for n names without growing. */
static inline int em_gguf_ix_init(em_gguf_ix *ix, uint64_t n, em_err *err) {
    uint64_t cap = 8;
    while (cap / 2 < n) cap *= 2;
    ix->slots = em_calloc((size_t)cap, sizeof *ix->slots, "GGUF name index", err);
    if (!ix->slots) return EM_ENOMEM;
    for (uint64_t i = 0; i < cap; i++) ix->slots[i].idx = -1;
    ix->mask = cap - 1;
    ix->used = 0;
    return EM_OK;
}

static inline void em_gguf_ix_free(em_gguf_ix *ix) {
    free(ix->slots);
    ix->slots = NULL;
    ix->mask = ix->used = 0;
}

static inline em_gguf_ix_slot *em_gguf_ix_slot_of(const em_gguf_ix *ix, const char *s, uint64_t len) {
    uint64_t i = em_gguf_ix_hash(s, len) & ix->mask;
    for (;;) {
        em_gguf_ix_slot *slot = &ix->slots[i];
        if (slot->idx < 0 || (slot->len == len && !memcmp(slot->s, s, len))) return slot;
        i = (i + 1) & ix->mask;
    }
}

/* Index of name (s, len), or -1. */
static inline int64_t em_gguf_ix_find(const em_gguf_ix *ix, const char *s, uint64_t len) {
    return ix->slots ? em_gguf_ix_slot_of(ix, s, len)->idx : -1;
}

/* Inserts (s, len) -> idx. *dup gets the index already holding that name (nothing is then
 * inserted), or -1. */
static inline int em_gguf_ix_insert(em_gguf_ix *ix, const char *s, uint64_t len, int64_t idx,
                                    int64_t *dup, em_err *err) {
    if (!ix->slots || (ix->used + 1) * 2 > ix->mask + 1) {
        em_gguf_ix bigger;
        int rc = em_gguf_ix_init(&bigger, (ix->used + 1) * 2, err);
        if (rc) return rc;
        for (uint64_t i = 0; ix->slots && i <= ix->mask; i++)
            if (ix->slots[i].idx >= 0)
                *em_gguf_ix_slot_of(&bigger, ix->slots[i].s, ix->slots[i].len) = ix->slots[i];
        bigger.used = ix->used;
        em_gguf_ix_free(ix);
        *ix = bigger;
    }
    em_gguf_ix_slot *slot = em_gguf_ix_slot_of(ix, s, len);
    *dup = slot->idx;
    if (slot->idx < 0) {
        *slot = (em_gguf_ix_slot){ s, len, idx };
        ix->used++;
    }
    return EM_OK;
}

#endif
