/* base/: the floor every other layer stands on. Status codes and error messages, logging,
 * allocation and arenas, the thread pool, files (mmap, pread, O_DIRECT), SHA-256, timers and
 * byte-size parsing. Knows nothing of models or formats.
 *
 * Error convention: a function that can fail returns int (0 = EM_OK, negative = EM_E*) and
 * takes an `em_err *` as its last argument (NULL allowed). On failure it writes a message
 * that names what failed and where (file, key, tensor, byte offset). */
#ifndef EM_BASE_H
#define EM_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- status and errors ------------------------------------------------------------- */

enum {
    EM_OK = 0,
    EM_EINVAL = -1,       /* bad argument or flag */
    EM_ENOMEM = -2,       /* allocation failed */
    EM_EIO = -3,          /* the OS said no: open, read, write, mmap */
    EM_EFORMAT = -4,      /* file contents are malformed or inconsistent */
    EM_ENOTFOUND = -5,    /* no such key, tensor, file */
    EM_EUNSUPPORTED = -6, /* well-formed but not something Ember handles */
    EM_EOVERFLOW = -7,    /* a size or count would overflow */
};

#define EM_ERR_MSG 512

typedef struct em_err {
    int code;
    char msg[EM_ERR_MSG];
} em_err;

/* Records code and a printf-style message in err (if non-NULL); returns code, so callers
 * can write `return em_err_set(err, EM_EFORMAT, "%s: ...", path);`. */
int em_err_set(em_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to an existing message (context added on the way up). */
int em_err_prefix(em_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *em_status_name(int code);

/* ---- logging ----------------------------------------------------------------------- */

enum em_log_level { EM_LOG_ERROR = 0, EM_LOG_WARN, EM_LOG_INFO, EM_LOG_DEBUG };

void em_log_set_level(enum em_log_level level);
enum em_log_level em_log_get_level(void);
void em_log(enum em_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- checked arithmetic and allocation --------------------------------------------- */

/* Return false on overflow (and leave *out unspecified). */
static inline bool em_add_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool em_mul_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline uint64_t em_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* malloc/calloc that report failure through err with what was being allocated. */
void *em_malloc(size_t n, const char *what, em_err *err);
void *em_calloc(size_t count, size_t size, const char *what, em_err *err);
/* Aligned allocation (alignment a power of two); free with free(). */
void *em_aligned_alloc(size_t alignment, size_t n, const char *what, em_err *err);
char *em_strdup(const char *s, em_err *err);

/* ---- arenas: per-step scratch, freed all at once --------------------------------------- */

typedef struct em_arena em_arena;

int em_arena_create(em_arena **out, size_t block_bytes, em_err *err);
void em_arena_free(em_arena *a);
/* 64-byte aligned; NULL when memory runs out. */
void *em_arena_alloc(em_arena *a, size_t n);
/* Forget everything allocated so far; keeps the first block for reuse. */
void em_arena_reset(em_arena *a);
size_t em_arena_used(const em_arena *a);

/* ---- thread pool ------------------------------------------------------------------- */

typedef struct em_pool em_pool;
/* fn(ctx, task, thread) is called once for every task in [0, n_tasks), spread over the
 * pool's threads (thread in [0, n_threads)); em_pool_run returns when all are done. */
typedef void (*em_pool_fn)(void *ctx, int task, int thread);

int em_pool_create(em_pool **out, int n_threads, em_err *err);
void em_pool_free(em_pool *p);
int em_pool_threads(const em_pool *p);
void em_pool_run(em_pool *p, int n_tasks, em_pool_fn fn, void *ctx);
/* Runs handed to the pool's threads since create (runs done on the caller alone: one task,
 * one thread, do not count). */
uint64_t em_pool_runs(const em_pool *p);
/* Number of online CPUs (at least 1). */
int em_cpu_count(void);

/* ---- phase timing (phases.c) -------------------------------------------------------- */

#define EM_PHASES_MAX 24

typedef struct em_phase_sum {
    double seconds;     /* wall-clock time charged to the phase */
    uint64_t laps;      /* times it ended */
    uint64_t bytes;     /* weight bytes it streamed, as the caller counted them */
    uint64_t pool_runs; /* pool hand-offs made during it */
} em_phase_sum;

/* A computation's time by phase (see phases.c). Embedded by value; off until enabled. */
typedef struct em_phases {
    const char *const *names; /* [n] */
    int n;
    bool on;
    const em_pool *pool; /* whose hand-offs are counted, or NULL */
    double last;         /* time of the last lap or start; 0: not started */
    uint64_t runs;       /* em_pool_runs at that time */
    em_phase_sum sum[EM_PHASES_MAX];
} em_phases;

void em_phases_init(em_phases *p, const char *const *names, int n, const em_pool *pool);
/* Turns timing on or off and clears the sums. */
void em_phases_enable(em_phases *p, bool on);
void em_phases_clear(em_phases *p);
/* Begins timing a computation (its first phase starts now). NULL-safe, as em_phases_lap. */
void em_phases_start(em_phases *p);
/* Ends `phase`: the time since the last lap or start is charged to it, with `bytes`. */
void em_phases_lap(em_phases *p, int phase, uint64_t bytes);

/* ---- files ------------------------------------------------------------------------- */

/* A read-only mapping of a whole file. An empty file maps to data = NULL, size = 0. */
typedef struct em_mmap {
    const uint8_t *data;
    uint64_t size;
    int guard;          /* guarded mappings: registry slot + 1; 0: not guarded */
} em_mmap;

/* Reading a page of a plain mapping past the end of a file that shrank since raises SIGBUS
 * (the process dies). A guarded mapping (em_mmap_open_guarded: files a long-running process
 * computes from, like model weights) survives that: a SIGBUS handler (installed with the first
 * guarded mapping; faults elsewhere go to the handler that was there before) replaces the
 * lost pages with zero pages and marks the mapping damaged, and the read goes on, on zeros.
 * Whoever computed from it must then call em_mmap_check and discard the result. */
int em_mmap_open(em_mmap *m, const char *path, em_err *err);
int em_mmap_open_guarded(em_mmap *m, const char *path, em_err *err);
void em_mmap_close(em_mmap *m);
/* Every guarded mapping that is open: EM_EIO, naming the first that lost pages ("PATH changed
 * on disk while mapped (N bytes now, M mapped)"), else EM_OK. check_files: also fstat each
 * file, so a size or modification time that changed since mapping counts as damage before any
 * fault (a system call per mapping; without it the check is a single atomic load while
 * nothing is damaged). Damage is permanent for the mapping's life. Thread-safe. */
int em_mmap_check(bool check_files, em_err *err);
bool em_mmap_damaged(const em_mmap *m);
/* mapguard.c's registry (file.c calls these): fd is kept open (closed by remove). */
int em_mmap_guard_add(em_mmap *m, int fd, const char *path, em_err *err);
void em_mmap_guard_remove(em_mmap *m);

/* Reads exactly n bytes at offset, retrying on EINTR and short reads; a read that hits end
 * of file first is EM_EFORMAT ("truncated"), naming path and offset. */
int em_pread_full(int fd, void *buf, size_t n, uint64_t offset, const char *path, em_err *err);
/* Writes all n bytes, retrying on EINTR and short writes. */
int em_write_full(int fd, const void *buf, size_t n, const char *path, em_err *err);

/* A file opened for direct (page-cache-bypassing) reads when the file system allows it. */
typedef struct em_dfile {
    int fd;          /* O_DIRECT descriptor when direct, else buffered */
    int fd_buffered; /* always a buffered descriptor, for unaligned requests */
    bool direct;
    uint64_t size;
    char *path;
} em_dfile;

#define EM_DIRECT_ALIGN 4096

int em_dfile_open(em_dfile *f, const char *path, em_err *err);
void em_dfile_close(em_dfile *f);
/* Reads n bytes at offset into buf. When the file is direct and buf, offset and n are all
 * EM_DIRECT_ALIGN-aligned the read bypasses the page cache; otherwise it is buffered. */
int em_dfile_read(em_dfile *f, void *buf, size_t n, uint64_t offset, em_err *err);

/* Reads a whole (small) file into a NUL-terminated heap buffer. */
int em_file_read_all(const char *path, char **out, size_t *len, em_err *err);
bool em_file_exists(const char *path);

/* ---- SHA-256 (OpenSSL EVP) --------------------------------------------------------- */

typedef struct em_sha256 em_sha256;

int em_sha256_create(em_sha256 **out, em_err *err);
void em_sha256_update(em_sha256 *s, const void *data, size_t n);
/* Writes 32 bytes; the context can then only be freed. */
void em_sha256_final(em_sha256 *s, uint8_t digest[32]);
void em_sha256_free(em_sha256 *s);
/* Lowercase hex of a 32-byte digest into hex[65]. */
void em_sha256_hex(const uint8_t digest[32], char hex[65]);
int em_sha256_file(const char *path, char hex[65], em_err *err);

/* ---- time and sizes ---------------------------------------------------------------- */

/* Monotonic seconds. */
double em_time_now(void);

/* Parses a byte size: "123", "8GiB", "512MiB", "1.5GiB". KiB/MiB/GiB/TiB and the bare
 * K/M/G/T are powers of 1024; KB/MB/GB/TB are powers of 1000. Case-insensitive. */
int em_parse_size(const char *text, uint64_t *out, em_err *err);
/* Formats bytes as "1.50 GiB" into buf. */
const char *em_format_size(uint64_t bytes, char *buf, size_t cap);
/* Parses a whole decimal integer in [lo, hi]; name is the flag or key for the message. */
int em_parse_int(const char *text, long long lo, long long hi, long long *out, const char *name,
                 em_err *err);

/* ---- half precision ---------------------------------------------------------------- */

float em_fp16_to_fp32(uint16_t h);
uint16_t em_fp32_to_fp16(float f); /* round to nearest even; NaN -> 0x7e00|sign (ggml ref) */
static inline float em_bf16_to_fp32(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
uint16_t em_fp32_to_bf16(float f); /* round to nearest even; NaN stays NaN (ggml semantics) */

#endif
