/* format/gguf: GGUF files as llama.cpp reads and writes them.
 *
 * Reading: GGUF v2 and v3, little-endian (v1 and big-endian files are refused). The whole
 * file is mapped read-only; metadata values, string bytes and tensor data point into the
 * mapping, so everything handed out lives until em_gguf_close. Every count, length, offset
 * and size is checked against the file before it is used; errors name the file, the byte
 * offset and the key or tensor. A split model (NAME-00001-of-00014.gguf ...) opens as one
 * model: metadata from shard 0, tensors from all shards in shard order.
 *
 * Writing: metadata of any type (nested arrays included), tensors declared first (name,
 * type, shape) and then streamed in declaration order, so memory stays bounded; output is
 * deterministic, padded with zeros to `general.alignment` (default 32), optionally split
 * into shards by a byte budget, and appears only when complete (temp file, fsync, rename).
 *
 * Compatibility notes (ggml's gguf.cpp): ggml refuses arrays of arrays; Ember reads and
 * writes them (the spec allows them) but a file meant for llama.cpp should not carry any.
 * Tensor names are at most EM_GGUF_MAX_NAME bytes, tensors at most 4 dimensions. */
#ifndef EM_FORMAT_GGUF_H
#define EM_FORMAT_GGUF_H

#include "base/base.h"

#define EM_GGUF_MAGIC "GGUF"
#define EM_GGUF_VERSION 3           /* what the writer produces */
#define EM_GGUF_DEFAULT_ALIGNMENT 32
#define EM_GGUF_MAX_DIMS 4
#define EM_GGUF_MAX_NAME 63         /* bytes in a tensor name (ggml: GGML_MAX_NAME - 1) */
#define EM_GGUF_MAX_DEPTH 8         /* array nesting levels the reader accepts */

#define EM_GGUF_KEY_ALIGNMENT "general.alignment"
#define EM_GGUF_KEY_SPLIT_NO "split.no"                     /* u16, 0-based */
#define EM_GGUF_KEY_SPLIT_COUNT "split.count"               /* u16 */
#define EM_GGUF_KEY_SPLIT_TENSORS "split.tensors.count"     /* i32, total over all shards */

/* Metadata value types, as numbered in the file. */
enum em_gguf_type {
    EM_GGUF_U8 = 0,
    EM_GGUF_I8 = 1,
    EM_GGUF_U16 = 2,
    EM_GGUF_I16 = 3,
    EM_GGUF_U32 = 4,
    EM_GGUF_I32 = 5,
    EM_GGUF_F32 = 6,
    EM_GGUF_BOOL = 7,
    EM_GGUF_STR = 8,
    EM_GGUF_ARRAY = 9,
    EM_GGUF_U64 = 10,
    EM_GGUF_I64 = 11,
    EM_GGUF_F64 = 12,
    EM_GGUF_TYPE_COUNT = 13,
};

/* "u8" "i8" "u16" "i16" "u32" "i32" "f32" "bool" "str" "array" "u64" "i64" "f64";
 * "unknown" otherwise. */
const char *em_gguf_type_name(int type);
/* Bytes of one element of a fixed-size type; 0 for str, array and unknown types. */
int em_gguf_type_size(int type);

/* A string inside the file: not NUL-terminated, may hold any bytes. */
typedef struct em_gguf_str {
    const char *ptr;
    uint64_t len;
} em_gguf_str;

/* An array value (opaque; see em_gguf_arr_*). */
typedef struct em_gguf_arr em_gguf_arr;

/* One metadata value, decoded. Unsigned types widen into u, signed into i. */
typedef struct em_gguf_value {
    int type; /* enum em_gguf_type */
    union {
        uint64_t u;             /* u8 u16 u32 u64 */
        int64_t i;              /* i8 i16 i32 i64 */
        float f32;
        double f64;
        bool b;                 /* any nonzero byte reads as true, as in ggml */
        em_gguf_str str;
        const em_gguf_arr *arr;
    };
} em_gguf_value;

/* One tensor of the model. Unused dimensions of ne are 1. */
typedef struct em_gguf_tensor {
    const char *name;      /* NUL-terminated */
    int type;              /* ggml type id (quant/quant.h enum em_type) */
    int n_dims;            /* as stored, 0..4 */
    int64_t ne[EM_GGUF_MAX_DIMS]; /* ne[0] is the fastest-varying dimension */
    uint64_t n_elements;
    uint64_t bytes;
    int shard;             /* index of the file holding the data */
    uint64_t offset;       /* relative to the shard's data section */
    uint64_t file_offset;  /* absolute, in the shard file (for pread / O_DIRECT) */
    const void *data;      /* in the mapping; bytes long (NULL when missing) */
    bool missing;          /* its data lies past the end of the file (opened with
                              allow_missing_data only; never true otherwise) */
} em_gguf_tensor;

/* One file of a (possibly split) model. */
typedef struct em_gguf_shard {
    const char *path;
    uint32_t version;
    uint32_t alignment;
    uint64_t file_size;
    uint64_t data_offset;  /* start of the data section */
    int64_t n_tensors;     /* tensors stored in this file */
    uint64_t missing_bytes; /* allow_missing_data: how far the tensor data the infos describe
                               runs past the end of the file (0: complete) */
} em_gguf_shard;

typedef struct em_gguf em_gguf;

/* ---- reading ----------------------------------------------------------------------- */

/* Opens a GGUF file. When the file is a shard of a split model (split.count > 1) and is
 * named PREFIX-NNNNN-of-MMMMM.gguf, all shards are opened (any shard's name will do) and
 * checked against each other; a missing shard is EM_ENOTFOUND, a shard whose split.no,
 * split.count or split.tensors.count disagrees is EM_EFORMAT. */
int em_gguf_open(em_gguf **out, const char *path, em_err *err);
/* Options of em_gguf_open_ex. allow_missing_data: a tensor whose data runs past the end of
 * its file (a file cut short, as by an interrupted download) is kept, marked missing with
 * data NULL, instead of failing the open; everything else is checked as by em_gguf_open
 * (alignment, overlaps, overflow). For callers that only need metadata and tensor infos,
 * or that check em_gguf_missing before reading data. */
typedef struct em_gguf_open_opts {
    bool allow_missing_data;
    bool guard_mapping; /* map every file guarded (em_mmap_open_guarded): a file that shrinks
                           while open gives zeros and em_mmap_check's error, not SIGBUS */
} em_gguf_open_opts;
/* em_gguf_open with options (NULL: as em_gguf_open). */
int em_gguf_open_ex(em_gguf **out, const char *path, const em_gguf_open_opts *opts, em_err *err);
/* Missing tensor data (allow_missing_data): bytes missing over all shards, the number of
 * missing tensors (if n non-NULL) and the first missing tensor in file order (if first
 * non-NULL; NULL when none). Returns the byte count (0: nothing missing). */
uint64_t em_gguf_missing(const em_gguf *g, int64_t *n, const em_gguf_tensor **first);
/* Opens exactly one file, even if it is a shard (split.* keys are then plain metadata). */
int em_gguf_open_single(em_gguf **out, const char *path, em_err *err);
/* Parses a GGUF held in memory (one file, no shards); name is used in messages. Nothing
 * is copied: data must stay valid and unchanged until em_gguf_close. */
int em_gguf_open_mem(em_gguf **out, const void *data, size_t size, const char *name,
                     em_err *err);
void em_gguf_close(em_gguf *g);

/* Path given to open (the name given to open_mem). */
const char *em_gguf_path(const em_gguf *g);
/* Version and alignment of shard 0. */
uint32_t em_gguf_version(const em_gguf *g);
uint32_t em_gguf_alignment(const em_gguf *g);
int em_gguf_n_shards(const em_gguf *g);
const em_gguf_shard *em_gguf_shard_at(const em_gguf *g, int i); /* 0 <= i < n_shards */

/* ---- metadata (shard 0's, in file order) ------------------------------------------- */

int64_t em_gguf_n_keys(const em_gguf *g);
const char *em_gguf_key(const em_gguf *g, int64_t i);        /* NUL-terminated */
em_gguf_value em_gguf_value_at(const em_gguf *g, int64_t i); /* 0 <= i < n_keys */
int64_t em_gguf_find_key(const em_gguf *g, const char *key); /* -1 when absent */

/* Typed getters. A missing key is EM_ENOTFOUND; a key of another type is EM_EFORMAT with a
 * message naming the key, the type wanted and the type found. No conversions. */
int em_gguf_get_u8(const em_gguf *g, const char *key, uint8_t *out, em_err *err);
int em_gguf_get_i8(const em_gguf *g, const char *key, int8_t *out, em_err *err);
int em_gguf_get_u16(const em_gguf *g, const char *key, uint16_t *out, em_err *err);
int em_gguf_get_i16(const em_gguf *g, const char *key, int16_t *out, em_err *err);
int em_gguf_get_u32(const em_gguf *g, const char *key, uint32_t *out, em_err *err);
int em_gguf_get_i32(const em_gguf *g, const char *key, int32_t *out, em_err *err);
int em_gguf_get_u64(const em_gguf *g, const char *key, uint64_t *out, em_err *err);
int em_gguf_get_i64(const em_gguf *g, const char *key, int64_t *out, em_err *err);
int em_gguf_get_f32(const em_gguf *g, const char *key, float *out, em_err *err);
int em_gguf_get_f64(const em_gguf *g, const char *key, double *out, em_err *err);
int em_gguf_get_bool(const em_gguf *g, const char *key, bool *out, em_err *err);
int em_gguf_get_str(const em_gguf *g, const char *key, em_gguf_str *out, em_err *err);
/* Copies a string value into buf (cap bytes, NUL-terminated); EM_EOVERFLOW if it does not
 * fit, EM_EFORMAT if it holds a NUL byte. */
int em_gguf_get_cstr(const em_gguf *g, const char *key, char *buf, size_t cap, em_err *err);
int em_gguf_get_arr(const em_gguf *g, const char *key, const em_gguf_arr **out, em_err *err);
/* Any integer type (u8..i64) as int64; a u64 above INT64_MAX is EM_EOVERFLOW. */
int em_gguf_get_int(const em_gguf *g, const char *key, int64_t *out, em_err *err);
/* f32 or f64 as double. */
int em_gguf_get_float(const em_gguf *g, const char *key, double *out, em_err *err);

/* ---- arrays ------------------------------------------------------------------------ */

int em_gguf_arr_type(const em_gguf_arr *a);   /* element type */
uint64_t em_gguf_arr_count(const em_gguf_arr *a);
const char *em_gguf_arr_key(const em_gguf_arr *a); /* the key it belongs to */
em_gguf_value em_gguf_arr_at(const em_gguf_arr *a, uint64_t i); /* i < count */
/* Element i as int64, for any integer element type (EM_EFORMAT otherwise). */
int em_gguf_arr_get_int(const em_gguf_arr *a, uint64_t i, int64_t *out, em_err *err);
/* Copies all elements into dst, which holds n elements of the C type matching elem_type
 * (uint8_t .. double, bool for BOOL). The element type must equal elem_type and n must equal
 * the count; fixed-size types only. */
int em_gguf_arr_copy(const em_gguf_arr *a, int elem_type, void *dst, uint64_t n, em_err *err);

/* ---- tensors (all shards, shard order, then file order) ---------------------------- */

int64_t em_gguf_n_tensors(const em_gguf *g);
const em_gguf_tensor *em_gguf_tensor_at(const em_gguf *g, int64_t i);
const em_gguf_tensor *em_gguf_find_tensor(const em_gguf *g, const char *name); /* or NULL */
/* As find, but a missing tensor is EM_ENOTFOUND naming it and the file. */
int em_gguf_get_tensor(const em_gguf *g, const char *name, const em_gguf_tensor **out,
                       em_err *err);

/* ---- writing ----------------------------------------------------------------------- */

/* Array values under construction, for arrays of arrays (and any array built piecewise). */
typedef struct em_gguf_abuf em_gguf_abuf;

int em_gguf_abuf_create(em_gguf_abuf **out, int elem_type, em_err *err);
void em_gguf_abuf_free(em_gguf_abuf *a);
/* Appends one element of a fixed-size type; elem points at the C value (bool for BOOL). */
int em_gguf_abuf_push(em_gguf_abuf *a, const void *elem, em_err *err);
int em_gguf_abuf_push_str(em_gguf_abuf *a, const char *s, uint64_t len, em_err *err);
/* Appends a copy of sub as one element (a's element type must be EM_GGUF_ARRAY). */
int em_gguf_abuf_push_arr(em_gguf_abuf *a, const em_gguf_abuf *sub, em_err *err);

typedef struct em_gguf_writer em_gguf_writer;

typedef struct em_gguf_write_opts {
    /* 0: write one file at path. Otherwise the model is split into shards of at most this
     * many bytes each (whole files, headers included; a tensor is never split, so a shard
     * holding one tensor bigger than the budget is bigger). More than one shard are named
     * PREFIX-00001-of-0000N.gguf (PREFIX = path without ".gguf") and carry split.no,
     * split.count and split.tensors.count; the other metadata goes to shard 0 only, as
     * gguf-split does (general.alignment, when set, goes to every shard). When everything
     * fits in one shard, that file is written at path without split keys. */
    uint64_t max_shard_bytes;
} em_gguf_write_opts;

/* Starts a model to be written at path; opts may be NULL. Nothing touches the disk until
 * the first tensor data is written (or finish is called). */
int em_gguf_writer_create(em_gguf_writer **out, const char *path,
                          const em_gguf_write_opts *opts, em_err *err);
/* Frees the writer; if finish did not succeed, every file it created is removed. */
void em_gguf_writer_free(em_gguf_writer *w);

/* Metadata, written in the order it is set. A key may be set once; `general.alignment`
 * must be a u32 power of two and sets the alignment; split.* keys are the writer's own.
 * All metadata must be set before the first tensor data is written. */
int em_gguf_writer_set_u8(em_gguf_writer *w, const char *key, uint8_t v, em_err *err);
int em_gguf_writer_set_i8(em_gguf_writer *w, const char *key, int8_t v, em_err *err);
int em_gguf_writer_set_u16(em_gguf_writer *w, const char *key, uint16_t v, em_err *err);
int em_gguf_writer_set_i16(em_gguf_writer *w, const char *key, int16_t v, em_err *err);
int em_gguf_writer_set_u32(em_gguf_writer *w, const char *key, uint32_t v, em_err *err);
int em_gguf_writer_set_i32(em_gguf_writer *w, const char *key, int32_t v, em_err *err);
int em_gguf_writer_set_u64(em_gguf_writer *w, const char *key, uint64_t v, em_err *err);
int em_gguf_writer_set_i64(em_gguf_writer *w, const char *key, int64_t v, em_err *err);
int em_gguf_writer_set_f32(em_gguf_writer *w, const char *key, float v, em_err *err);
int em_gguf_writer_set_f64(em_gguf_writer *w, const char *key, double v, em_err *err);
int em_gguf_writer_set_bool(em_gguf_writer *w, const char *key, bool v, em_err *err);
int em_gguf_writer_set_str(em_gguf_writer *w, const char *key, const char *s, em_err *err);
int em_gguf_writer_set_strn(em_gguf_writer *w, const char *key, const char *s, uint64_t len,
                            em_err *err);
/* An array of a fixed-size type from a C array of n elements (bool for BOOL). */
int em_gguf_writer_set_arr(em_gguf_writer *w, const char *key, int elem_type,
                           const void *elems, uint64_t n, em_err *err);
int em_gguf_writer_set_arr_str(em_gguf_writer *w, const char *key, const char *const *strs,
                               uint64_t n, em_err *err);
int em_gguf_writer_set_abuf(em_gguf_writer *w, const char *key, const em_gguf_abuf *a,
                            em_err *err);
/* A value read from another GGUF (any type, arrays included), copied byte for byte. */
int em_gguf_writer_set_value(em_gguf_writer *w, const char *key, const em_gguf_value *v,
                             em_err *err);

/* Declares the next tensor: n_dims in 0..4 entries of ne (each >= 0, ne[0] a multiple of the
 * type's block size). All tensors must be declared before the first data is written. */
int em_gguf_writer_add_tensor(em_gguf_writer *w, const char *name, int type, int n_dims,
                              const int64_t *ne, em_err *err);
/* Writes the data of the next declared tensor, which must be `name` and `bytes` long. */
int em_gguf_writer_write_tensor(em_gguf_writer *w, const char *name, const void *data,
                                uint64_t bytes, em_err *err);
/* Streams the next n bytes of tensor data, in declaration order; a chunk may span tensor
 * boundaries. Alignment padding is inserted automatically. */
int em_gguf_writer_write_data(em_gguf_writer *w, const void *data, uint64_t n, em_err *err);
/* Like em_gguf_writer_write_data, but the next n bytes of tensor data are not written: the
 * file position moves past them (lseek), so they are a hole that reads as zeros and takes no
 * disk space on file systems with sparse files. For shape-only files (the real geometry of a
 * model too large for the disk, metadata and tensor infos intact); padding and headers are
 * still written, and a shard that ends in a hole is extended to its full size (ftruncate). */
int em_gguf_writer_skip_data(em_gguf_writer *w, uint64_t n, em_err *err);
/* Checks that every tensor's data was written, flushes, fsyncs and renames the files into
 * place. */
int em_gguf_writer_finish(em_gguf_writer *w, em_err *err);
/* Files of the model (known once the first data is written or finish has run). */
int em_gguf_writer_n_shards(const em_gguf_writer *w);
const char *em_gguf_writer_shard_path(const em_gguf_writer *w, int i);

#endif
