/* format/safetensors: read-only access to Hugging Face safetensors checkpoints, a single
 * `.safetensors` file or a sharded set described by `model.safetensors.index.json`.
 *
 * File layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the data
 * buffer. The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)}
 * (offsets relative to the first byte after the header); the optional "__metadata__" key
 * holds a string-to-string map.
 *
 * Validation follows the reference implementation (the Rust `safetensors` crate): N at
 * most 100,000,000 and 8 + N within the file; sorted by offset, the tensors tile the data
 * buffer exactly (the first begins at 0, each begins where the previous ends, the last ends
 * at the end of the file: no gaps, no overlaps, no trailing bytes); end - begin equals
 * product(shape) * dtype size (overflow-checked). Duplicate names are rejected, within a
 * file (duplicate JSON keys) and across shards.
 *
 * Shards are mapped read-only (em_mmap_open); tensor data pointers stay valid until
 * em_safetensors_close. */
#ifndef EM_FORMAT_SAFETENSORS_H
#define EM_FORMAT_SAFETENSORS_H

#include "base/base.h"

/* Element types. The byte-sized set of the safetensors crate, plus F8_E8M0 (the shared
 * exponents of MXFP4 scales); sub-byte and exotic types (F4, F6_*, C64, ...) are refused at
 * open with EM_EUNSUPPORTED. */
enum em_st_dtype {
    EM_ST_F32 = 0,
    EM_ST_F16,
    EM_ST_BF16,
    EM_ST_F8_E4M3, /* OCP E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN, max 448 */
    EM_ST_F8_E5M2, /* IEEE-like: bias 15, infinities and NaNs */
    EM_ST_F64,
    EM_ST_I64,
    EM_ST_I32,
    EM_ST_I16,
    EM_ST_I8,
    EM_ST_U64,
    EM_ST_U32,
    EM_ST_U16,
    EM_ST_U8,
    EM_ST_BOOL,
    EM_ST_F8_E8M0, /* OCP E8M0: an exponent only, 2^(v - 127); 0xff is NaN */
    EM_ST_DTYPE_COUNT
};

/* "F32", "BF16", ... as written in the header; "?" for an out-of-range value. */
const char *em_st_dtype_name(enum em_st_dtype t);
/* Bytes per element (1, 2, 4 or 8); 0 for an out-of-range value. */
size_t em_st_dtype_size(enum em_st_dtype t);
/* Parses a header dtype string; EM_EUNSUPPORTED (message names the dtype) when unknown. */
int em_st_dtype_parse(const char *name, enum em_st_dtype *out, em_err *err);

#define EM_ST_MAX_DIMS 8
/* Largest accepted header (the safetensors crate's limit). */
#define EM_ST_MAX_HEADER ((uint64_t)100000000)

typedef struct em_safetensors_tensor {
    const char *name;
    enum em_st_dtype dtype;
    int n_dims;                     /* 0 for a scalar */
    uint64_t shape[EM_ST_MAX_DIMS]; /* as in the header: outermost first (row-major) */
    uint64_t n_elements;            /* product of shape (1 for a scalar) */
    uint64_t n_bytes;               /* n_elements * dtype size */
    const uint8_t *data;            /* into the mapping; NOT aligned in general */
    uint64_t file_offset;           /* of the first data byte, from the start of the file */
    int shard;                      /* index into the shard list */
    const char *path;               /* the shard's file path (or the memory name) */
} em_safetensors_tensor;

typedef struct em_safetensors em_safetensors;

/* Opens `path`, which may be:
 *   - a `.safetensors` file;
 *   - an index file (name ends in `.json`): every shard in its weight_map is opened once,
 *     resolved relative to the index's folder; every listed tensor must be in the shard the
 *     index names;
 *   - a folder: its `model.safetensors.index.json` if present, else `model.safetensors`,
 *     else all `*.safetensors` files in it (sorted by name) as shards.
 * Tensors are ordered by shard (shards sorted by file name), then by data offset. */
int em_safetensors_open(em_safetensors **out, const char *path, em_err *err);
/* Parses a whole safetensors file held in memory (not copied: `data` must outlive the
 * handle). `name` is used in messages and as the tensor path. For fuzzing and tests. */
int em_safetensors_open_memory(em_safetensors **out, const void *data, size_t size,
                               const char *name, em_err *err);
void em_safetensors_close(em_safetensors *st);

size_t em_safetensors_count(const em_safetensors *st);
/* i in [0, count); NULL when out of range. */
const em_safetensors_tensor *em_safetensors_at(const em_safetensors *st, size_t i);
/* Hash lookup; NULL when absent. */
const em_safetensors_tensor *em_safetensors_find(const em_safetensors *st, const char *name);
/* Like find, but a missing tensor is EM_ENOTFOUND with a message naming it and the path. */
int em_safetensors_get(const em_safetensors *st, const char *name,
                       const em_safetensors_tensor **out, em_err *err);

int em_safetensors_shard_count(const em_safetensors *st);
const char *em_safetensors_shard_path(const em_safetensors *st, int shard);
/* The path passed to open (file, index or folder). */
const char *em_safetensors_path(const em_safetensors *st);

/* `__metadata__` entries of all shards, shard by shard in header order. */
size_t em_safetensors_metadata_count(const em_safetensors *st);
/* Fills key/value (and shard when non-NULL) for entry i; false when i is out of range. */
bool em_safetensors_metadata_at(const em_safetensors *st, size_t i, const char **key,
                                const char **value, int *shard);
/* The first value for key over all shards, or NULL. */
const char *em_safetensors_metadata_get(const em_safetensors *st, const char *key);

/* ---- element conversion ----------------------------------------------------------------- */

/* Exact decodes of the 8-bit floats (every value is representable in f32). */
float em_st_f8_e4m3_to_f32(uint8_t v);
float em_st_f8_e5m2_to_f32(uint8_t v);
float em_st_f8_e8m0_to_f32(uint8_t v);

/* Converts n elements of type `dtype` from `src` (unaligned, little-endian) to f32. Floats
 * widen exactly (F64 rounds to nearest); integers convert with C rounding to nearest
 * (exact up to 2^24 in magnitude); BOOL gives 0 or 1. */
void em_st_convert_f32(enum em_st_dtype dtype, const void *src, float *dst, size_t n);

/* Converts elements [first, first + count) of tensor t to f32 into dst (count floats).
 * EM_EINVAL when the range is outside the tensor (message names the tensor and file). */
int em_safetensors_to_f32_range(const em_safetensors_tensor *t, uint64_t first, uint64_t count,
                                float *dst, em_err *err);
/* The whole tensor; dst_count must be at least t->n_elements. */
int em_safetensors_to_f32(const em_safetensors_tensor *t, float *dst, uint64_t dst_count,
                          em_err *err);

#endif
