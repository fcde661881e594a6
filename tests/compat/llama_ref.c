/* tests/compat/llama_ref.c: llama.cpp as a reference, driven through its C API. It loads the
 * npm prebuilt's libllama (@node-llama-cpp/linux-x64@3.22.1, CPU-only) at run time with dlopen
 * and answers: does llama.cpp load this GGUF, what logits does it compute for these tokens,
 * how does it continue them greedily, how does it tokenize this text.
 *
 *   load BINS MODEL.gguf [--vocab-only] [--meta]   architecture and sizes as key=value lines
 *                           (--vocab-only: vocabulary and metadata only; --meta: every
 *                           metadata key llama.cpp keeps, as meta.KEY=VALUE)
 *   logits BINS MODEL.gguf --tokens LIST -o OUT.f32 [--threads N]
 *                           one decode of the whole sequence, logits of every position,
 *                           written as f32 [n_tokens][n_vocab]
 *   generate BINS MODEL.gguf --tokens LIST -n N [-o OUT.f32] [--threads N]
 *                           greedy continuation (argmax, lowest id on ties), token by token;
 *                           prints the N ids; -o writes the logits each pick came from
 *   tokenize BINS MODEL.gguf -p TEXT   llama_tokenize (add_special false, parse_special true)
 *   bench BINS MODEL.gguf [-p P] [-n N] [--threads T] [--reps R] [--warmup K]
 *                           [--verify-width W] [--seed S] [--json]
 *                           `ember bench`'s protocol through llama.cpp (tools/cmd_bench.c):
 *                           per repetition clear the memory, decode P pseudo-random ids in
 *                           one batch (timed), then N steps of W tokens (timed); prints
 *                           min/median/max prompt tok/s and decode tok/s (rows/s for W > 1).
 *                           llama.cpp's own speed defaults unless set: K/V cache F16,
 *                           flash attention auto, n_ubatch 512 (n_batch max(P, 512)),
 *                           n_threads = n_threads_batch = T, weights mmap'd and repacked
 *   make-llama-test BINS DIR [--writer ggml|ember] [--split-bytes N]
 *                           writes DIR/tiny-llama.gguf, a 2-layer "llama" model with random
 *                           F32 weights and a 273-token GPT-2 style vocabulary (see
 *                           tiny_build), through ggml's gguf writer or Ember's
 *   argmax OUT.f32 --n-vocab V          checks every value is finite; argmax of each row
 *   compare A.f32 B.f32 --n-vocab V [--rows R] [--tol T]   max |A-B| over the first R rows
 *
 * LIST is "1,2,3" or "@FILE" (the same text in a file). Model options: --flash-attn
 * on|off|auto (default off; bench: auto), --kv-type f32|f16 (K/V cache type, default f32: a
 * tight reference; bench: f16), --no-repack (use_extra_bufts = false), -v (all of llama.cpp's log; by default
 * only its warnings and errors reach stderr).
 *
 * Libraries: BINS/libggml-base.so, then libggml (libggml.so or libggml.v*.so), then libllama
 * (libllama.so or libllama.v*.so) are opened with RTLD_NOW | RTLD_GLOBAL in dependency order,
 * by full path; each later library's NEEDED entries then resolve to the already loaded ones
 * (the prebuilt also carries RUNPATH $ORIGIN), so callers need no LD_LIBRARY_PATH. The CPU
 * backend is a plugin: ggml_backend_load_all_from_path(BINS) picks the best libggml-cpu-*.so.
 *
 * Struct layouts: llama.h does not ship, so llama_model_params (80 bytes), llama_context_params
 * (160) and llama_batch (56) are declared here as recovered from the prebuilt (reference notes
 * llamacpp-formats.md §6, §8). They are checked at compile time (offsets) and at run time
 * (lref_check_layouts): every default of both *_default_params functions at its offset, the
 * number of bytes those functions and llama_batch_init write (x86-64: their hidden result
 * pointer is probed with canary bytes), llama_batch_init's pointer order, and after each
 * context is made, that llama.cpp reports back the n_ctx/n_batch/n_ubatch/n_seq_max/threads
 * and K/V cache types that were set.
 *
 * Exit status: 0 success; 1 llama.cpp refused (its reason is on stderr) or a check failed;
 * 2 usage or setup error (library missing, layout mismatch). A test tool: out of memory ends
 * the process with a message. */
#include "ggml_api.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "format/gguf.h"

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_SETUP = 2 };

/* ---- llama.h, the slice this harness calls ------------------------------------------- */

typedef int32_t llama_token;
struct llama_model;
struct llama_context;
struct llama_vocab;

/* ggml_log_level */
enum { LOG_NONE = 0, LOG_DEBUG = 1, LOG_INFO = 2, LOG_WARN = 3, LOG_ERROR = 4, LOG_CONT = 5 };
/* llama_flash_attn_type */
enum { FLASH_ATTN_AUTO = -1, FLASH_ATTN_OFF = 0, FLASH_ATTN_ON = 1 };

typedef void (*lref_log_fn)(int level, const char *text, void *user_data);

struct llama_model_params {
    void *devices;
    const void *tensor_buft_overrides;
    int32_t n_gpu_layers;
    int32_t split_mode;
    int32_t load_mode;
    int32_t lazy_mode;
    int32_t main_gpu;
    const float *tensor_split;
    void *progress_callback;
    void *progress_callback_user_data;
    const void *kv_overrides;
    bool vocab_only;
    bool check_tensors;
    bool use_extra_bufts;
    bool no_host;
    bool no_alloc;
    bool load_mtp;
};

struct llama_context_params {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    uint32_t n_seq_max;
    uint32_t n_rs_seq;
    uint32_t n_outputs_max;
    uint32_t n_outputs_max_per_seq;
    int32_t n_threads;
    int32_t n_threads_batch;
    int32_t ctx_type;
    int32_t rope_scaling_type;
    int32_t pooling_type;
    int32_t attention_type;
    int32_t flash_attn_type;
    float rope_freq_base;
    float rope_freq_scale;
    float yarn_ext_factor;
    float yarn_attn_factor;
    float yarn_beta_fast;
    float yarn_beta_slow;
    uint32_t yarn_orig_ctx;
    float defrag_thold;
    void *cb_eval;
    void *cb_eval_user_data;
    int32_t type_k;
    int32_t type_v;
    void *abort_callback;
    void *abort_callback_data;
    bool embeddings;
    bool offload_kqv;
    bool no_perf;
    bool op_offload;
    bool swa_full;
    bool kv_unified;
    void *samplers;
    size_t n_samplers;
    void *ctx_other;
};

struct llama_batch {
    int32_t n_tokens;
    llama_token *token;
    float *embd;
    int32_t *pos;
    int32_t *n_seq_id;
    int32_t **seq_id;
    int8_t *logits;
};

/* The layouts of llamacpp-formats.md §6/§8, fixed at compile time. */
#define LREF_AT(type, field, off) _Static_assert(offsetof(struct type, field) == (off), #type "." #field)
_Static_assert(sizeof(struct llama_model_params) == 80, "llama_model_params is 80 bytes");
LREF_AT(llama_model_params, n_gpu_layers, 16);
LREF_AT(llama_model_params, load_mode, 24);
LREF_AT(llama_model_params, main_gpu, 32);
LREF_AT(llama_model_params, tensor_split, 40);
LREF_AT(llama_model_params, kv_overrides, 64);
LREF_AT(llama_model_params, vocab_only, 72);
LREF_AT(llama_model_params, use_extra_bufts, 74);
LREF_AT(llama_model_params, load_mtp, 77);
_Static_assert(sizeof(struct llama_context_params) == 160, "llama_context_params is 160 bytes");
LREF_AT(llama_context_params, n_rs_seq, 16);
LREF_AT(llama_context_params, n_outputs_max_per_seq, 24);
LREF_AT(llama_context_params, n_threads, 28);
LREF_AT(llama_context_params, ctx_type, 36);
LREF_AT(llama_context_params, flash_attn_type, 52);
LREF_AT(llama_context_params, rope_freq_base, 56);
LREF_AT(llama_context_params, yarn_orig_ctx, 80);
LREF_AT(llama_context_params, cb_eval, 88);
LREF_AT(llama_context_params, type_k, 104);
LREF_AT(llama_context_params, type_v, 108);
LREF_AT(llama_context_params, abort_callback, 112);
LREF_AT(llama_context_params, embeddings, 128);
LREF_AT(llama_context_params, kv_unified, 133);
LREF_AT(llama_context_params, samplers, 136);
LREF_AT(llama_context_params, ctx_other, 152);
_Static_assert(sizeof(struct llama_batch) == 56, "llama_batch is 56 bytes");
LREF_AT(llama_batch, token, 8);
LREF_AT(llama_batch, logits, 48);

/* X(return type, name, parameters): libllama's functions this harness calls. */
#define LLAMA_FUNCS(X)                                                                        \
    X(void, llama_backend_init, (void))                                                       \
    X(void, llama_backend_free, (void))                                                       \
    X(void, llama_log_set, (lref_log_fn cb, void *user_data))                                 \
    X(struct llama_model_params, llama_model_default_params, (void))                          \
    X(struct llama_context_params, llama_context_default_params, (void))                      \
    X(struct llama_model *, llama_model_load_from_file,                                       \
      (const char *path, struct llama_model_params params))                                   \
    X(void, llama_model_free, (struct llama_model * model))                                   \
    X(struct llama_context *, llama_init_from_model,                                          \
      (struct llama_model * model, struct llama_context_params params))                       \
    X(void, llama_free, (struct llama_context * ctx))                                         \
    X(const struct llama_vocab *, llama_model_get_vocab, (const struct llama_model *model))   \
    X(int32_t, llama_vocab_n_tokens, (const struct llama_vocab *vocab))                       \
    X(int32_t, llama_model_n_embd, (const struct llama_model *model))                         \
    X(int32_t, llama_model_n_layer, (const struct llama_model *model))                        \
    X(int32_t, llama_model_n_head, (const struct llama_model *model))                         \
    X(int32_t, llama_model_n_ctx_train, (const struct llama_model *model))                    \
    X(uint64_t, llama_model_n_params, (const struct llama_model *model))                      \
    X(uint64_t, llama_model_size, (const struct llama_model *model))                          \
    X(bool, llama_model_is_recurrent, (const struct llama_model *model))                      \
    X(bool, llama_model_is_hybrid, (const struct llama_model *model))                         \
    X(int32_t, llama_model_desc, (const struct llama_model *model, char *buf, size_t size))   \
    X(int32_t, llama_model_meta_count, (const struct llama_model *model))                     \
    X(int32_t, llama_model_meta_val_str,                                                      \
      (const struct llama_model *model, const char *key, char *buf, size_t size))             \
    X(int32_t, llama_model_meta_key_by_index,                                                 \
      (const struct llama_model *model, int32_t i, char *buf, size_t size))                   \
    X(int32_t, llama_model_meta_val_str_by_index,                                             \
      (const struct llama_model *model, int32_t i, char *buf, size_t size))                   \
    X(uint32_t, llama_n_ctx, (const struct llama_context *ctx))                               \
    X(uint32_t, llama_n_batch, (const struct llama_context *ctx))                             \
    X(uint32_t, llama_n_ubatch, (const struct llama_context *ctx))                            \
    X(uint32_t, llama_n_seq_max, (const struct llama_context *ctx))                           \
    X(int32_t, llama_n_threads, (struct llama_context * ctx))                                 \
    X(int32_t, llama_n_threads_batch, (struct llama_context * ctx))                           \
    X(struct llama_batch, llama_batch_init, (int32_t n_tokens, int32_t embd, int32_t n_seq_max)) \
    X(void, llama_batch_free, (struct llama_batch batch))                                     \
    X(int32_t, llama_decode, (struct llama_context * ctx, struct llama_batch batch))          \
    X(void, llama_synchronize, (struct llama_context * ctx))                                  \
    X(void *, llama_get_memory, (const struct llama_context *ctx))                            \
    X(void, llama_memory_clear, (void *mem, bool data))                                       \
    X(float *, llama_get_logits_ith, (struct llama_context * ctx, int32_t i))                 \
    X(int32_t, llama_tokenize,                                                                \
      (const struct llama_vocab *vocab, const char *text, int32_t text_len,                   \
       llama_token *tokens, int32_t n_tokens_max, bool add_special, bool parse_special))

/* libggml's backend registry (the plugin loader) and libggml-base's device names. */
#define GGML_BACKEND_FUNCS(X)                                                                 \
    X(void, ggml_backend_load_all_from_path, (const char *dir_path))                          \
    X(size_t, ggml_backend_dev_count, (void))                                                 \
    X(void *, ggml_backend_dev_get, (size_t index))
#define GGML_BASE_DEV_FUNCS(X) X(const char *, ggml_backend_dev_name, (void *dev))

/* What the log callback saw; it decides what reaches stderr and notes the K/V cache types
 * llama.cpp reports, so that the type_k/type_v fields can be checked. */
typedef struct lref_log {
    int min_level;     /* levels below this are not printed */
    bool last_shown;   /* LOG_CONT continues the previous message */
    char kv_types[64];   /* "K (f32) V (f32)" from the K/V cache size line, if logged */
    char flash_attn[16]; /* "enabled"/"disabled"/"auto" from llama_context's settings */
    char fa_resolved[16]; /* "enabled"/"disabled": what flash attention "auto" became */
} lref_log;

#define LREF_MEMBER(ret, name, params) ret(*name) params;
typedef struct lref {
    void *h_base, *h_ggml, *h_llama;
    LLAMA_FUNCS(LREF_MEMBER)
    GGML_BACKEND_FUNCS(LREF_MEMBER)
    GGML_BASE_DEV_FUNCS(LREF_MEMBER)
    ggml_lib gg; /* libggml-base's gguf API (ggml_api.h), opened on demand */
    bool gg_open;
    lref_log log;
    struct llama_model *model;
    struct llama_context *ctx;
    const struct llama_vocab *vocab;
    int32_t n_vocab;
} lref;
#undef LREF_MEMBER

/* ---- small utilities ---------------------------------------------------------------- */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    fputs("compat_llama_ref: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(EXIT_SETUP);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die("out of memory (%zu bytes)", n);
    return q;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* mkdir -p */
static void make_dirs(const char *path) {
    char *p = xstrdup(path);
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c != 0) continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", p, strerror(errno));
        *s = c;
        if (!c) break;
    }
    free(p);
}

/* Writes n bytes to path (created or truncated); 0 or -1 with a message on stderr. */
static int write_all(const char *path, const void *data, size_t n) {
    em_err err = { 0 };
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "compat_llama_ref: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = em_write_full(fd, data, n, path, &err);
    if (close(fd) != 0 && rc == 0) rc = em_err_set(&err, EM_EIO, "%s: close failed", path);
    if (rc != 0) {
        fprintf(stderr, "compat_llama_ref: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void print_ids(const llama_token *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", (int)ids[i]);
    putchar('\n');
}

/* ---- command line ------------------------------------------------------------------- */

/* Options of every subcommand; each subcommand says which it takes. */
typedef struct opts {
    const char *pos[3]; /* positional arguments */
    int n_pos;
    const char *tokens, *out, *prompt, *writer;
    long long threads, n_gen, n_vocab, rows, split_bytes;
    long long reps, warmup, width, seed; /* bench */
    double tol;
    int flash_attn, kv_type;
    bool flash_attn_set, kv_type_set; /* given on the command line (bench keeps the defaults) */
    bool vocab_only, meta, no_repack, verbose, json;
} opts;

static long long parse_ll(const char *text, long long lo, long long hi, const char *name) {
    em_err err = { 0 };
    long long v;
    if (em_parse_int(text, lo, hi, &v, name, &err) != 0) die("%s", err.msg);
    return v;
}

static void parse_opts(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->threads = em_cpu_count();
    o->n_gen = -1;
    o->n_vocab = -1;
    o->rows = -1;
    o->flash_attn = FLASH_ATTN_OFF;
    o->kv_type = GGML_TYPE_F32;
    o->writer = "ggml";
    o->reps = 3;
    o->warmup = 1;
    o->width = 1;
    o->seed = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
#define VAL() (has_val ? argv[++i] : (die("%s needs a value", a), ""))
        if (!strcmp(a, "--tokens")) o->tokens = VAL();
        else if (!strcmp(a, "-o")) o->out = VAL();
        else if (!strcmp(a, "-p")) o->prompt = VAL();
        else if (!strcmp(a, "--writer")) o->writer = VAL();
        else if (!strcmp(a, "--threads")) o->threads = parse_ll(VAL(), 1, 512, "--threads");
        else if (!strcmp(a, "-n")) o->n_gen = parse_ll(VAL(), 0, 1 << 20, "-n");
        else if (!strcmp(a, "--n-vocab")) o->n_vocab = parse_ll(VAL(), 1, INT32_MAX, "--n-vocab");
        else if (!strcmp(a, "--rows")) o->rows = parse_ll(VAL(), 0, INT32_MAX, "--rows");
        else if (!strcmp(a, "--reps")) o->reps = parse_ll(VAL(), 1, 1000, "--reps");
        else if (!strcmp(a, "--warmup")) o->warmup = parse_ll(VAL(), 0, 1000, "--warmup");
        else if (!strcmp(a, "--verify-width")) o->width = parse_ll(VAL(), 1, 256, "--verify-width");
        else if (!strcmp(a, "--seed")) o->seed = parse_ll(VAL(), 0, INT64_MAX, "--seed");
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--split-bytes"))
            o->split_bytes = parse_ll(VAL(), 1, INT64_MAX, "--split-bytes");
        else if (!strcmp(a, "--tol")) {
            const char *v = VAL();
            char *end;
            o->tol = strtod(v, &end);
            if (*end || end == v || !(o->tol >= 0)) die("--tol: expected a number >= 0, got '%s'", v);
        } else if (!strcmp(a, "--flash-attn")) {
            const char *v = VAL();
            o->flash_attn_set = true;
            if (!strcmp(v, "on")) o->flash_attn = FLASH_ATTN_ON;
            else if (!strcmp(v, "off")) o->flash_attn = FLASH_ATTN_OFF;
            else if (!strcmp(v, "auto")) o->flash_attn = FLASH_ATTN_AUTO;
            else die("--flash-attn: expected on, off or auto, got '%s'", v);
        } else if (!strcmp(a, "--kv-type")) {
            const char *v = VAL();
            o->kv_type_set = true;
            if (!strcmp(v, "f32")) o->kv_type = GGML_TYPE_F32;
            else if (!strcmp(v, "f16")) o->kv_type = GGML_TYPE_F16;
            else die("--kv-type: expected f32 or f16, got '%s'", v);
        } else if (!strcmp(a, "--vocab-only")) o->vocab_only = true;
        else if (!strcmp(a, "--meta")) o->meta = true;
        else if (!strcmp(a, "--no-repack")) o->no_repack = true;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o->verbose = true;
        else if (a[0] == '-' && a[1]) die("unknown option %s", a);
        else if (o->n_pos < 3) o->pos[o->n_pos++] = a;
        else die("unexpected argument %s", a);
#undef VAL
    }
}

/* "1,2,3" or "@FILE" into a heap array of token ids; *n gets the count (at least 1). */
static llama_token *parse_tokens(const char *spec, int64_t *n) {
    char *text = NULL;
    if (spec[0] == '@') {
        em_err err = { 0 };
        size_t len;
        if (em_file_read_all(spec + 1, &text, &len, &err) != 0) die("--tokens: %s", err.msg);
    } else {
        text = xstrdup(spec);
    }
    llama_token *ids = NULL;
    int64_t count = 0, cap = 0;
    char *save = NULL;
    for (char *tok = strtok_r(text, ", \t\r\n", &save); tok; tok = strtok_r(NULL, ", \t\r\n", &save)) {
        if (count == cap) {
            cap = cap ? cap * 2 : 64;
            if (cap > (1 << 24)) die("--tokens: more than %d ids", 1 << 24);
            ids = xrealloc(ids, (size_t)cap * sizeof *ids);
        }
        ids[count++] = (llama_token)parse_ll(tok, 0, INT32_MAX, "--tokens");
    }
    free(text);
    if (count == 0) die("--tokens: no token ids in '%s'", spec);
    *n = count;
    return ids;
}

/* ---- loading the libraries ---------------------------------------------------------- */

/* BINS/exact if it exists, else the alphabetically first BINS/PREFIX*.so* (libllama.v0.5.0.so
 * in the npm package); the dot in the prefix keeps libllama-common and libggml-cpu-* out. */
static char *find_lib(const char *bins, const char *exact, const char *prefix) {
    char *path = path_join(bins, exact);
    if (access(path, R_OK) == 0) return path;
    free(path);
    DIR *d = opendir(bins);
    if (!d) die("cannot open the library folder %s: %s", bins, strerror(errno));
    char *best = NULL;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || !strstr(e->d_name, ".so")) continue;
        if (!best || strcmp(e->d_name, best) < 0) {
            free(best);
            best = xstrdup(e->d_name);
        }
    }
    closedir(d);
    if (!best) die("no %s or %s*.so in %s", exact, prefix, bins);
    path = path_join(bins, best);
    free(best);
    return path;
}

static void *open_lib(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) die("dlopen %s: %s", path, dlerror());
    return h;
}

/* dlsym, converted to a function pointer the way POSIX specifies (through memcpy). */
#define LREF_RESOLVE_FROM(handle, path)                                                       \
    {                                                                                         \
        void *sym_ = dlsym(handle, symbol_);                                                  \
        if (!sym_) die("%s: no symbol %s", path, symbol_);                                    \
        memcpy(slot_, &sym_, sizeof sym_);                                                    \
    }
#define LREF_RESOLVE_LLAMA(ret, name, params)                                                 \
    {                                                                                         \
        const char *symbol_ = #name;                                                          \
        void *slot_ = &L->name;                                                               \
        LREF_RESOLVE_FROM(L->h_llama, p_llama)                                                \
    }
#define LREF_RESOLVE_GGML(ret, name, params)                                                  \
    {                                                                                         \
        const char *symbol_ = #name;                                                          \
        void *slot_ = &L->name;                                                               \
        LREF_RESOLVE_FROM(L->h_ggml, p_ggml)                                                  \
    }
#define LREF_RESOLVE_BASE(ret, name, params)                                                  \
    {                                                                                         \
        const char *symbol_ = #name;                                                          \
        void *slot_ = &L->name;                                                               \
        LREF_RESOLVE_FROM(L->h_base, p_base)                                                  \
    }

/* Prints llama.cpp's and ggml's log lines at or above log->min_level to stderr and notes the
 * K/V cache types from the cache's size line. */
static void lref_log_cb(int level, const char *text, void *user_data) {
    lref_log *log = user_data;
    bool show = level == LOG_CONT ? log->last_shown : level >= log->min_level || level == LOG_NONE;
    log->last_shown = show;
    if (show) fputs(text, stderr);
    const char *fa = strstr(text, "flash_attn");
    fa = fa ? strstr(fa, "= ") : NULL;
    if (fa && !log->flash_attn[0]) sscanf(fa + 2, "%15[a-z]", log->flash_attn);
    const char *far = strstr(text, "Flash Attention ");
    if (far && !log->fa_resolved[0]) sscanf(far + 16, "%15[a-z]", log->fa_resolved);
    const char *k = strstr(text, "K (");
    const char *v = k ? strstr(k, "V (") : NULL;
    if (k && v && !log->kv_types[0]) {
        const char *ke = strchr(k, ')'), *ve = strchr(v, ')');
        if (ke && ve)
            snprintf(log->kv_types, sizeof log->kv_types, "%.*s %.*s", (int)(ke - k + 1), k,
                     (int)(ve - v + 1), v);
    }
}

/* Once main is done with lref (whose log state lives on its stack): errors only, no state. */
static void lref_log_quiet(int level, const char *text, void *user_data) {
    (void)user_data;
    if (level == LOG_ERROR) fputs(text, stderr);
}

static void lref_open(lref *L, const char *bins, bool verbose) {
    memset(L, 0, sizeof *L);
    L->log.min_level = verbose ? LOG_DEBUG : LOG_WARN;
    char *p_base = path_join(bins, "libggml-base.so");
    char *p_ggml = find_lib(bins, "libggml.so", "libggml.");
    char *p_llama = find_lib(bins, "libllama.so", "libllama.");
    L->h_base = open_lib(p_base);
    L->h_ggml = open_lib(p_ggml);
    L->h_llama = open_lib(p_llama);
    LLAMA_FUNCS(LREF_RESOLVE_LLAMA)
    GGML_BACKEND_FUNCS(LREF_RESOLVE_GGML)
    GGML_BASE_DEV_FUNCS(LREF_RESOLVE_BASE)
    free(p_base);
    free(p_ggml);
    free(p_llama);

    L->llama_log_set(lref_log_cb, &L->log); /* also ggml's log (llama_log_set forwards it) */
    L->ggml_backend_load_all_from_path(bins);
    if (L->ggml_backend_dev_count() == 0)
        die("no ggml backend device after ggml_backend_load_all_from_path(%s)", bins);
    L->llama_backend_init();
}

static void lref_close(lref *L) {
    if (L->ctx) L->llama_free(L->ctx);
    if (L->model) L->llama_model_free(L->model);
    L->ctx = NULL;
    L->model = NULL;
    if (L->h_llama) {
        L->llama_backend_free();
        L->llama_log_set(lref_log_quiet, NULL);
    }
    if (L->gg_open) ggml_lib_close(&L->gg);
    /* the libraries stay loaded: their static destructors run at exit */
}

static void lref_open_gguf(lref *L, const char *bins) {
    char msg[512];
    if (L->gg_open) return;
    if (ggml_lib_open(&L->gg, bins, msg, sizeof msg) != 0) die("%s", msg);
    if (ggml_lib_check_layout(&L->gg, msg, sizeof msg) != 0) die("%s", msg);
    L->gg_open = true;
}

/* ---- layout checks -------------------------------------------------------------------- */

/* Highest byte offset + 1 that fn writes through its hidden result pointer (x86-64 System V
 * returns structs over 16 bytes through a pointer passed in rdi, which is also the first
 * argument of void fn(void *, ...)). Two canaries, so no written value can hide as both. */
#if defined(__x86_64__) && defined(__linux__)
#define LREF_PROBE_SRET 1
typedef void (*sret0_fn)(void *out);
typedef void (*sret_batch_fn)(void *out, int32_t n_tokens, int32_t embd, int32_t n_seq_max);

static size_t written_extent(const uint8_t *a, const uint8_t *b, size_t n) {
    size_t end = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != 0xA5 || b[i] != 0x5A) end = i + 1;
    return end;
}

static size_t probe_sret0(void *fn_sym) {
    sret0_fn fn;
    memcpy(&fn, &fn_sym, sizeof fn);
    uint8_t a[512], b[512];
    memset(a, 0xA5, sizeof a);
    memset(b, 0x5A, sizeof b);
    fn(a);
    fn(b);
    return written_extent(a, b, sizeof a);
}
#endif

/* Checks one default value; on mismatch records the first difference in msg. */
#define LREF_EXPECT(cond, what)                                                               \
    do {                                                                                      \
        if (!(cond) && !bad) {                                                                \
            snprintf(msg, cap, "%s", what);                                                   \
            bad = true;                                                                       \
        }                                                                                     \
    } while (0)

static bool check_model_defaults(const struct llama_model_params *p, char *msg, size_t cap) {
    bool bad = false;
    LREF_EXPECT(p->devices == NULL && p->tensor_buft_overrides == NULL, "devices/tensor_buft_overrides not NULL");
    LREF_EXPECT(p->n_gpu_layers == -1, "n_gpu_layers (offset 16) is not -1");
    LREF_EXPECT(p->split_mode == 1, "split_mode (offset 20) is not 1 (layer)");
    LREF_EXPECT(p->load_mode == -1, "load_mode (offset 24) is not -1 (auto)");
    LREF_EXPECT(p->lazy_mode == 1, "lazy_mode (offset 28) is not 1");
    LREF_EXPECT(p->main_gpu == 0, "main_gpu (offset 32) is not 0");
    LREF_EXPECT(p->tensor_split == NULL && p->progress_callback == NULL &&
                    p->progress_callback_user_data == NULL && p->kv_overrides == NULL,
                "a pointer at offsets 40..64 is not NULL");
    LREF_EXPECT(!p->vocab_only && !p->check_tensors && p->use_extra_bufts && !p->no_host &&
                    !p->no_alloc && !p->load_mtp,
                "the bools at offsets 72..77 are not 0,0,1,0,0,0");
    return !bad;
}

static bool check_context_defaults(const struct llama_context_params *p, char *msg, size_t cap) {
    bool bad = false;
    LREF_EXPECT(p->n_ctx == 512 && p->n_batch == 2048 && p->n_ubatch == 512 && p->n_seq_max == 1,
                "n_ctx/n_batch/n_ubatch/n_seq_max (offsets 0..12) are not 512/2048/512/1");
    LREF_EXPECT(p->n_rs_seq == 0 && p->n_outputs_max == 0 && p->n_outputs_max_per_seq == 1,
                "n_rs_seq/n_outputs_max/n_outputs_max_per_seq (16..24) are not 0/0/1");
    LREF_EXPECT(p->n_threads > 0 && p->n_threads_batch == p->n_threads,
                "n_threads/n_threads_batch (28/32) are not equal and positive");
    LREF_EXPECT(p->ctx_type == 0, "ctx_type (36) is not 0");
    LREF_EXPECT(p->rope_scaling_type == -1 && p->pooling_type == -1 && p->attention_type == -1 &&
                    p->flash_attn_type == -1,
                "rope_scaling/pooling/attention/flash_attn types (40..52) are not -1");
    LREF_EXPECT(p->rope_freq_base == 0.0f && p->rope_freq_scale == 0.0f,
                "rope_freq_base/scale (56/60) are not 0");
    LREF_EXPECT(p->yarn_ext_factor == -1.0f && p->yarn_attn_factor == -1.0f &&
                    p->yarn_beta_fast == -1.0f && p->yarn_beta_slow == -1.0f,
                "yarn factors (64..76) are not -1");
    LREF_EXPECT(p->yarn_orig_ctx == 0 && p->defrag_thold == -1.0f,
                "yarn_orig_ctx/defrag_thold (80/84) are not 0/-1");
    LREF_EXPECT(p->cb_eval == NULL && p->cb_eval_user_data == NULL, "cb_eval (88/96) not NULL");
    LREF_EXPECT(p->type_k == GGML_TYPE_F16 && p->type_v == GGML_TYPE_F16,
                "type_k/type_v (104/108) are not F16");
    LREF_EXPECT(p->abort_callback == NULL && p->abort_callback_data == NULL,
                "abort_callback (112/120) not NULL");
    LREF_EXPECT(!p->embeddings && p->offload_kqv && p->no_perf && p->op_offload && p->swa_full &&
                    !p->kv_unified,
                "the bools at 128..133 are not 0,1,1,1,1,0");
    LREF_EXPECT(p->samplers == NULL && p->n_samplers == 0 && p->ctx_other == NULL,
                "samplers/n_samplers/ctx_other (136..152) are not NULL/0/NULL");
    return !bad;
}
#undef LREF_EXPECT

/* llama_batch_init allocates token xor embd depending on its embd argument, and seq_id ends
 * with a NULL sentinel: that pins the order of the pointer fields. */
static bool check_batch(const lref *L, char *msg, size_t cap) {
    struct llama_batch b = L->llama_batch_init(4, 0, 2);
    bool ok = b.n_tokens == 0 && b.token && !b.embd && b.pos && b.n_seq_id && b.seq_id &&
              b.logits && b.seq_id[0] && b.seq_id[3] && !b.seq_id[4];
    L->llama_batch_free(b);
    if (!ok) {
        snprintf(msg, cap, "llama_batch_init(4, 0, 2): fields not where struct llama_batch puts them");
        return false;
    }
    b = L->llama_batch_init(3, 8, 1);
    ok = b.n_tokens == 0 && !b.token && b.embd && b.pos && b.logits && !b.seq_id[3];
    L->llama_batch_free(b);
    if (!ok) snprintf(msg, cap, "llama_batch_init(3, 8, 1): token/embd not where expected");
    return ok;
}

/* Every check of the declared layouts that can run before a model is loaded. */
static void lref_check_layouts(const lref *L) {
    char msg[256];
#ifdef LREF_PROBE_SRET
    void *sym;
    memcpy(&sym, &L->llama_model_default_params, sizeof sym);
    size_t n = probe_sret0(sym);
    if (n > sizeof(struct llama_model_params) || n + 8 <= sizeof(struct llama_model_params))
        die("llama_model_default_params writes %zu bytes, declared struct is %zu", n,
            sizeof(struct llama_model_params));
    memcpy(&sym, &L->llama_context_default_params, sizeof sym);
    n = probe_sret0(sym);
    if (n > sizeof(struct llama_context_params) || n + 8 <= sizeof(struct llama_context_params))
        die("llama_context_default_params writes %zu bytes, declared struct is %zu", n,
            sizeof(struct llama_context_params));
    {
        sret_batch_fn fn;
        memcpy(&sym, &L->llama_batch_init, sizeof sym);
        memcpy(&fn, &sym, sizeof fn);
        uint8_t a[256], b[256];
        memset(a, 0xA5, sizeof a);
        memset(b, 0x5A, sizeof b);
        fn(a, 2, 0, 1);
        fn(b, 2, 0, 1);
        n = written_extent(a, b, sizeof a);
        if (n != sizeof(struct llama_batch)) /* its last field is a pointer: all 56 written */
            die("llama_batch_init writes %zu bytes, declared struct llama_batch is %zu", n,
                sizeof(struct llama_batch));
        struct llama_batch ba, bb;
        memcpy(&ba, a, sizeof ba);
        memcpy(&bb, b, sizeof bb);
        L->llama_batch_free(ba);
        L->llama_batch_free(bb);
    }
#endif
    struct llama_model_params mp = L->llama_model_default_params();
    if (!check_model_defaults(&mp, msg, sizeof msg))
        die("llama_model_params layout does not match the prebuilt: %s", msg);
    struct llama_context_params cp = L->llama_context_default_params();
    if (!check_context_defaults(&cp, msg, sizeof msg))
        die("llama_context_params layout does not match the prebuilt: %s", msg);
    if (!check_batch(L, msg, sizeof msg)) die("struct llama_batch layout: %s", msg);
}

/* ---- model and context -------------------------------------------------------------- */

/* Loads path (a split set by its first shard); 0, or EXIT_FAIL with llama.cpp's reason
 * already on stderr. */
static int lref_load(lref *L, const char *path, const opts *o, bool vocab_only) {
    struct llama_model_params mp = L->llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.vocab_only = vocab_only;
    if (o->no_repack) mp.use_extra_bufts = false;
    L->model = L->llama_model_load_from_file(path, mp);
    if (!L->model) {
        fprintf(stderr, "compat_llama_ref: llama.cpp could not load %s (its reason is above)\n", path);
        return EXIT_FAIL;
    }
    L->vocab = L->llama_model_get_vocab(L->model);
    L->n_vocab = L->vocab ? L->llama_vocab_n_tokens(L->vocab) : 0;
    if (L->n_vocab <= 0) {
        fprintf(stderr, "compat_llama_ref: %s: llama.cpp reports %d vocabulary entries\n", path,
                (int)L->n_vocab);
        return EXIT_FAIL;
    }
    return 0;
}

/* A context for sequences of up to n_ctx tokens decoded in batches of up to n_batch, with
 * every row of a batch able to output logits, an F32 K/V cache unless --kv-type says
 * otherwise. Checks that llama.cpp took the settings (which also checks the offsets they
 * were written at): through its getters, and through what it logs about the K/V cache types
 * and flash attention, when it logs them. */
static int lref_context(lref *L, uint32_t n_ctx, uint32_t n_batch, const opts *o) {
    struct llama_context_params cp = L->llama_context_default_params();
    cp.n_ctx = (uint32_t)em_align_up(n_ctx < 1 ? 1 : n_ctx, 256);
    cp.n_batch = cp.n_ubatch = n_batch;
    cp.n_seq_max = 1;
    cp.n_outputs_max = n_batch;
    cp.n_outputs_max_per_seq = n_batch;
    cp.n_threads = cp.n_threads_batch = (int32_t)o->threads;
    cp.flash_attn_type = o->flash_attn;
    cp.type_k = cp.type_v = o->kv_type;
    cp.no_perf = true;
    L->log.kv_types[0] = 0;
    L->log.flash_attn[0] = 0;
    L->ctx = L->llama_init_from_model(L->model, cp);
    if (!L->ctx) {
        fprintf(stderr, "compat_llama_ref: llama_init_from_model failed (n_ctx %u, n_batch %u)\n",
                cp.n_ctx, cp.n_batch);
        return EXIT_FAIL;
    }
    if (L->llama_n_ctx(L->ctx) < n_ctx || L->llama_n_batch(L->ctx) != n_batch ||
        L->llama_n_ubatch(L->ctx) != n_batch || L->llama_n_seq_max(L->ctx) != 1 ||
        L->llama_n_threads(L->ctx) != cp.n_threads ||
        L->llama_n_threads_batch(L->ctx) != cp.n_threads)
        die("llama.cpp did not take the context settings (n_ctx %u/%u, n_batch %u/%u, n_ubatch "
            "%u/%u, n_seq_max %u, threads %d/%d): llama_context_params layout mismatch?",
            L->llama_n_ctx(L->ctx), n_ctx, L->llama_n_batch(L->ctx), n_batch,
            L->llama_n_ubatch(L->ctx), n_batch, L->llama_n_seq_max(L->ctx),
            L->llama_n_threads(L->ctx), cp.n_threads);
    const char *kv = o->kv_type == GGML_TYPE_F32 ? "K (f32) V (f32)" : "K (f16) V (f16)";
    if (L->log.kv_types[0] && strcmp(L->log.kv_types, kv) != 0)
        die("llama.cpp made a %s cache, type_k/type_v (offsets 104/108) asked for %s",
            L->log.kv_types, kv);
    const char *fa = o->flash_attn == FLASH_ATTN_ON ? "enabled" : "disabled";
    if (L->log.flash_attn[0] && o->flash_attn != FLASH_ATTN_AUTO && strcmp(L->log.flash_attn, fa) != 0)
        die("llama.cpp says flash_attn = %s, flash_attn_type (offset 52) asked for %s",
            L->log.flash_attn, fa);
    return 0;
}

/* Decodes n tokens at positions pos0.. in one batch; row i outputs logits when
 * all_logits or i == n - 1. 0, or EXIT_FAIL with a message. */
static int lref_decode(lref *L, const llama_token *tok, int64_t n, int32_t pos0, bool all_logits) {
    struct llama_batch b = L->llama_batch_init((int32_t)n, 0, 1);
    for (int64_t i = 0; i < n; i++) {
        b.token[i] = tok[i];
        b.pos[i] = pos0 + (int32_t)i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = (int8_t)(all_logits || i == n - 1);
    }
    b.n_tokens = (int32_t)n;
    int32_t rc = L->llama_decode(L->ctx, b);
    L->llama_synchronize(L->ctx);
    L->llama_batch_free(b);
    if (rc != 0) {
        fprintf(stderr, "compat_llama_ref: llama_decode of %lld tokens at position %d returned %d\n",
                (long long)n, (int)pos0, (int)rc);
        return EXIT_FAIL;
    }
    return 0;
}

static const float *lref_logits(lref *L, int32_t i) {
    const float *row = L->llama_get_logits_ith(L->ctx, i);
    if (!row) die("llama_get_logits_ith(%d) returned NULL", (int)i);
    return row;
}

/* Streams the logits of batch rows 0..n-1 to path (f32 [n][n_vocab]); 0 or EXIT_FAIL. */
static int write_rows(lref *L, const char *path, int64_t n) {
    em_err err = { 0 };
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "compat_llama_ref: cannot create %s: %s\n", path, strerror(errno));
        return EXIT_FAIL;
    }
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++)
        rc = em_write_full(fd, lref_logits(L, (int32_t)i), (size_t)L->n_vocab * sizeof(float), path, &err);
    if (close(fd) != 0 && rc == 0) rc = em_err_set(&err, EM_EIO, "%s: close failed", path);
    if (rc != 0) fprintf(stderr, "compat_llama_ref: %s\n", err.msg);
    return rc ? EXIT_FAIL : 0;
}

static int32_t argmax_row(const float *row, int64_t n) {
    int64_t best = 0;
    for (int64_t j = 1; j < n; j++)
        if (row[j] > row[best]) best = j;
    return (int32_t)best;
}

static int check_token_ids(const lref *L, const llama_token *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= L->n_vocab) {
            fprintf(stderr, "compat_llama_ref: token %lld is %d, the vocabulary has %d entries\n",
                    (long long)i, (int)ids[i], (int)L->n_vocab);
            return EXIT_FAIL;
        }
    return 0;
}

/* ---- subcommands that run llama.cpp ---------------------------------------------------- */

static void print_meta(lref *L, const char *label, const char *key) {
    char buf[4096];
    if (L->llama_model_meta_val_str(L->model, key, buf, sizeof buf) >= 0) printf("%s=%s\n", label, buf);
}

/* gguf_n_kv and gguf_n_tensors as ggml's gguf reader sees the file (tensors summed over a
 * split set through split.tensors.count). */
static void print_gguf_counts(lref *L, const char *bins, const char *path) {
    lref_open_gguf(L, bins);
    struct gguf_init_params ip = { .no_alloc = true, .ctx = NULL };
    struct gguf_context *g = L->gg.gguf_init_from_file(path, ip);
    if (!g) return;
    int64_t n_tensors = L->gg.gguf_get_n_tensors(g);
    int64_t n_shards = 1;
    int64_t k = L->gg.gguf_find_key(g, "split.count");
    if (k >= 0 && L->gg.gguf_get_kv_type(g, k) == GGUF_TYPE_UINT16) n_shards = L->gg.gguf_get_val_u16(g, k);
    k = L->gg.gguf_find_key(g, "split.tensors.count");
    if (n_shards > 1 && k >= 0 && L->gg.gguf_get_kv_type(g, k) == GGUF_TYPE_INT32)
        n_tensors = L->gg.gguf_get_val_i32(g, k);
    printf("gguf_n_kv=%lld\ngguf_n_tensors=%lld\nn_shards=%lld\n",
           (long long)L->gg.gguf_get_n_kv(g), (long long)n_tensors, (long long)n_shards);
    L->gg.gguf_free(g);
}

static int cmd_load(lref *L, const opts *o) {
    const char *bins = o->pos[0], *path = o->pos[1];
    int rc = lref_load(L, path, o, o->vocab_only);
    if (rc) return rc;
    char desc[256];
    print_meta(L, "arch", "general.architecture");
    printf("n_vocab=%d\nmeta_count=%d\n", (int)L->n_vocab, (int)L->llama_model_meta_count(L->model));
    /* a vocab-only model has no hyperparameters: llama_model_n_head aborts on it */
    if (!o->vocab_only) {
        if (L->llama_model_desc(L->model, desc, sizeof desc) >= 0) printf("desc=%s\n", desc);
        printf("n_embd=%d\nn_layer=%d\nn_head=%d\nn_ctx_train=%d\n",
               (int)L->llama_model_n_embd(L->model), (int)L->llama_model_n_layer(L->model),
               (int)L->llama_model_n_head(L->model), (int)L->llama_model_n_ctx_train(L->model));
        printf("n_params=%llu\nsize_bytes=%llu\nrecurrent=%d\nhybrid=%d\n",
               (unsigned long long)L->llama_model_n_params(L->model),
               (unsigned long long)L->llama_model_size(L->model),
               (int)L->llama_model_is_recurrent(L->model), (int)L->llama_model_is_hybrid(L->model));
    }
    print_gguf_counts(L, bins, path);
    printf("backend=%s\n", L->ggml_backend_dev_name(L->ggml_backend_dev_get(0)));
    if (o->meta) {
        int32_t n = L->llama_model_meta_count(L->model);
        char key[512], *val = xmalloc(1 << 16);
        for (int32_t i = 0; i < n; i++)
            if (L->llama_model_meta_key_by_index(L->model, i, key, sizeof key) >= 0 &&
                L->llama_model_meta_val_str_by_index(L->model, i, val, 1 << 16) >= 0)
                printf("meta.%s=%s\n", key, val);
        free(val);
    }
    return 0;
}

static int cmd_logits(lref *L, const opts *o) {
    if (!o->tokens || !o->out) die("logits needs --tokens LIST and -o OUT.f32");
    int64_t n;
    llama_token *tok = parse_tokens(o->tokens, &n);
    int rc = lref_load(L, o->pos[1], o, false);
    if (!rc) rc = check_token_ids(L, tok, n);
    if (!rc) rc = lref_context(L, (uint32_t)n, (uint32_t)n, o);
    if (!rc) rc = lref_decode(L, tok, n, 0, true);
    if (!rc) rc = write_rows(L, o->out, n);
    free(tok);
    return rc;
}

static int cmd_generate(lref *L, const opts *o) {
    if (!o->tokens || o->n_gen < 0) die("generate needs --tokens LIST and -n N");
    int64_t n_prompt, n_gen = o->n_gen;
    llama_token *prompt = parse_tokens(o->tokens, &n_prompt);
    if (n_prompt + n_gen > INT32_MAX / 2) die("sequence too long");
    int rc = lref_load(L, o->pos[1], o, false);
    if (!rc) rc = check_token_ids(L, prompt, n_prompt);
    if (!rc) rc = lref_context(L, (uint32_t)(n_prompt + n_gen), (uint32_t)n_prompt, o);
    if (!rc) rc = lref_decode(L, prompt, n_prompt, 0, false);
    llama_token *gen = xmalloc((size_t)(n_gen ? n_gen : 1) * sizeof *gen);
    size_t row = (size_t)L->n_vocab * sizeof(float);
    uint8_t *used = o->out ? xmalloc((size_t)(n_gen ? n_gen : 1) * row) : NULL;
    for (int64_t k = 0; !rc && k < n_gen; k++) {
        const float *logits = lref_logits(L, -1);
        gen[k] = argmax_row(logits, L->n_vocab);
        if (used) memcpy(used + (size_t)k * row, logits, row);
        if (k + 1 < n_gen) rc = lref_decode(L, &gen[k], 1, (int32_t)(n_prompt + k), true);
    }
    if (!rc) print_ids(gen, n_gen);
    if (!rc && used) rc = write_all(o->out, used, (size_t)n_gen * row) ? EXIT_FAIL : 0;
    free(used);
    free(gen);
    free(prompt);
    return rc;
}

static int cmd_tokenize(lref *L, const opts *o) {
    if (!o->prompt) die("tokenize needs -p TEXT");
    size_t len = strlen(o->prompt);
    if (len > INT32_MAX / 2) die("-p: text too long");
    int rc = lref_load(L, o->pos[1], o, true);
    if (rc) return rc;
    int32_t cap = (int32_t)len + 16;
    llama_token *ids = xmalloc((size_t)cap * sizeof *ids);
    int32_t n = L->llama_tokenize(L->vocab, o->prompt, (int32_t)len, ids, cap, false, true);
    if (n < 0) { /* -n: the number of tokens it needs */
        cap = -n;
        ids = xrealloc(ids, (size_t)cap * sizeof *ids);
        n = L->llama_tokenize(L->vocab, o->prompt, (int32_t)len, ids, cap, false, true);
    }
    if (n < 0) {
        fprintf(stderr, "compat_llama_ref: llama_tokenize failed (%d)\n", (int)n);
        rc = EXIT_FAIL;
    } else {
        print_ids(ids, n);
    }
    free(ids);
    return rc;
}

/* ---- bench: tools/cmd_bench.c's protocol through llama.cpp ----------------------------- */

/* The prompt generator of tools/cmd_bench.c (xorshift64*, ids in [0, n_vocab)), so both
 * engines see the same ids. */
static llama_token bench_token(uint64_t *s, int32_t n_vocab) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (llama_token)(((*s * 2685821657736338717ull) >> 33) % (uint64_t)n_vocab);
}

/* A context for the benchmark: llama.cpp's own defaults for speed (F16 K/V cache, flash
 * attention auto, n_ubatch 512) unless --kv-type / --flash-attn say otherwise; checks that
 * the sizes and threads were taken. */
static int lref_bench_context(lref *L, uint32_t n_ctx, uint32_t n_batch, const opts *o) {
    struct llama_context_params cp = L->llama_context_default_params();
    cp.n_ctx = (uint32_t)em_align_up(n_ctx, 256);
    cp.n_batch = n_batch;
    if (cp.n_ubatch > n_batch) cp.n_ubatch = n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = (int32_t)o->threads;
    if (o->flash_attn_set) cp.flash_attn_type = o->flash_attn;
    if (o->kv_type_set) cp.type_k = cp.type_v = o->kv_type;
    cp.no_perf = true;
    L->log.kv_types[0] = L->log.flash_attn[0] = L->log.fa_resolved[0] = 0;
    L->ctx = L->llama_init_from_model(L->model, cp);
    if (!L->ctx) {
        fprintf(stderr, "compat_llama_ref: llama_init_from_model failed (n_ctx %u, n_batch %u)\n",
                cp.n_ctx, cp.n_batch);
        return EXIT_FAIL;
    }
    if (L->llama_n_ctx(L->ctx) < n_ctx || L->llama_n_batch(L->ctx) != n_batch ||
        L->llama_n_ubatch(L->ctx) != cp.n_ubatch || L->llama_n_threads(L->ctx) != cp.n_threads ||
        L->llama_n_threads_batch(L->ctx) != cp.n_threads)
        die("llama.cpp did not take the bench context settings (n_ctx %u/%u, n_batch %u/%u, "
            "n_ubatch %u/%u, threads %d/%d)", L->llama_n_ctx(L->ctx), n_ctx,
            L->llama_n_batch(L->ctx), n_batch, L->llama_n_ubatch(L->ctx), cp.n_ubatch,
            L->llama_n_threads(L->ctx), cp.n_threads);
    return 0;
}

/* Decodes n tokens at positions pos0.. through the reused batch b; logits of the last row
 * only, or of every row. */
static int bench_decode(lref *L, struct llama_batch *b, const llama_token *tok, int64_t n,
                        int32_t pos0, bool all_logits) {
    for (int64_t i = 0; i < n; i++) {
        b->token[i] = tok[i];
        b->pos[i] = pos0 + (int32_t)i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = (int8_t)(all_logits || i == n - 1);
    }
    b->n_tokens = (int32_t)n;
    int32_t rc = L->llama_decode(L->ctx, *b);
    L->llama_synchronize(L->ctx);
    if (rc != 0) {
        fprintf(stderr, "compat_llama_ref: llama_decode of %lld tokens at position %d returned %d\n",
                (long long)n, (int)pos0, (int)rc);
        return EXIT_FAIL;
    }
    return 0;
}

/* One repetition: clear, timed prompt, timed decode steps; seconds into *pp, *tg. */
static int bench_once(lref *L, struct llama_batch *b, const opts *o, const llama_token *prompt,
                      int64_t n_prompt, double *pp, double *tg) {
    const int64_t W = o->width;
    L->llama_memory_clear(L->llama_get_memory(L->ctx), true);
    double t0 = em_time_now();
    int rc = bench_decode(L, b, prompt, n_prompt, 0, false);
    if (rc) return rc;
    double t1 = em_time_now();
    uint64_t s = (uint64_t)o->seed ^ 0x9E3779B97F4A7C15ull; /* the extra rows of a wide step */
    llama_token block[256];
    block[0] = argmax_row(lref_logits(L, -1), L->n_vocab);
    int32_t pos = (int32_t)n_prompt;
    for (int64_t i = 0; i < o->n_gen && !rc; i++, pos += (int32_t)W) {
        for (int64_t j = 1; j < W; j++) block[j] = bench_token(&s, L->n_vocab);
        rc = bench_decode(L, b, block, W, pos, true);
        if (!rc) block[0] = argmax_row(lref_logits(L, -1), L->n_vocab);
    }
    double t2 = em_time_now();
    *pp = t1 - t0;
    *tg = t2 - t1;
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* min, median, max of v[0..n) (n >= 1) */
static void summarize(const double *v, int64_t n, double out[3]) {
    double *s = xmalloc((size_t)n * sizeof *s);
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    out[0] = s[0];
    out[1] = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    out[2] = s[n - 1];
    free(s);
}

static void bench_json_metric(const char *name, const char *unit, const double *v, int64_t n) {
    double m[3];
    summarize(v, n, m);
    printf(",\"%s\":{\"unit\":\"%s\",\"min\":%.17g,\"median\":%.17g,\"max\":%.17g,\"runs\":[", name,
           unit, m[0], m[1], m[2]);
    for (int64_t i = 0; i < n; i++) printf("%s%.17g", i ? "," : "", v[i]);
    printf("]}");
}

static void bench_text_metric(const char *name, int64_t count, const char *what, const char *unit,
                              const double *v, int64_t n) {
    double m[3];
    summarize(v, n, m);
    printf("%-9s %5lld %-7s %-7s min %9.2f  median %9.2f  max %9.2f\n", name, (long long)count,
           what, unit, m[0], m[1], m[2]);
}

static int cmd_bench(lref *L, const opts *o) {
    int64_t n_prompt = o->prompt ? parse_ll(o->prompt, 1, 1 << 24, "-p") : 512;
    int64_t n_gen = o->n_gen < 0 ? 64 : o->n_gen, W = o->width, R = o->reps;
    if (n_prompt + n_gen * W > (1 << 24)) die("bench: too many positions");
    int rc = lref_load(L, o->pos[1], o, false);
    uint32_t n_batch = (uint32_t)(n_prompt > 512 ? n_prompt : 512);
    uint32_t n_ctx = (uint32_t)(n_prompt + n_gen * W); /* llama.cpp caps n_batch at n_ctx */
    if (!rc) rc = lref_bench_context(L, n_ctx > n_batch ? n_ctx : n_batch, n_batch, o);
    if (rc) return rc;
    llama_token *prompt = xmalloc((size_t)n_prompt * sizeof *prompt);
    uint64_t s = o->seed ? (uint64_t)o->seed : 1;
    for (int64_t i = 0; i < n_prompt; i++) prompt[i] = bench_token(&s, L->n_vocab);
    struct llama_batch b = L->llama_batch_init((int32_t)n_batch, 0, 1);
    double *pp = xmalloc((size_t)R * sizeof *pp), *tg = xmalloc((size_t)R * sizeof *tg);
    for (int64_t i = 0; !rc && i < o->warmup + R; i++) {
        double p_s = 0, t_s = 0;
        rc = bench_once(L, &b, o, prompt, n_prompt, &p_s, &t_s);
        if (!rc && i >= o->warmup) {
            pp[i - o->warmup] = (double)n_prompt / p_s;
            tg[i - o->warmup] = t_s > 0 ? (double)(n_gen * W) / t_s : 0.0;
        }
    }
    const char *unit = W == 1 ? "tok/s" : "rows/s";
    const char *fa = L->log.fa_resolved[0] ? L->log.fa_resolved : L->log.flash_attn;
    if (!rc && o->json) {
        printf("{\"engine\":\"llama.cpp\",\"model\":\"%s\",\"threads\":%lld,\"n_prompt\":%lld,"
               "\"n_gen\":%lld,\"verify_width\":%lld,\"reps\":%lld,\"warmup\":%lld,\"n_vocab\":%d,"
               "\"seed\":%lld,\"n_batch\":%u,\"n_ubatch\":%u,\"flash_attn\":\"%s\",\"kv_types\":\"%s\"",
               o->pos[1], o->threads, (long long)n_prompt, (long long)n_gen, (long long)W,
               (long long)R, o->warmup, (int)L->n_vocab, o->seed, L->llama_n_batch(L->ctx),
               L->llama_n_ubatch(L->ctx), fa, L->log.kv_types);
        bench_json_metric("prompt", "tok/s", pp, R);
        if (n_gen > 0) bench_json_metric("decode", unit, tg, R);
        printf("}\n");
    } else if (!rc) {
        printf("llama.cpp bench: %s (vocab %d), %lld threads, %lld reps after %lld warm-up; n_batch %u, "
               "n_ubatch %u, flash attention %s, %s\n",
               o->pos[1], (int)L->n_vocab, o->threads, (long long)R, o->warmup,
               L->llama_n_batch(L->ctx), L->llama_n_ubatch(L->ctx), fa, L->log.kv_types);
        bench_text_metric("prompt", n_prompt, "tokens", "tok/s", pp, R);
        if (n_gen > 0) {
            char name[32];
            snprintf(name, sizeof name, W == 1 ? "decode" : "verify%lld", (long long)W);
            bench_text_metric(name, n_gen, "steps", unit, tg, R);
        }
    }
    L->llama_batch_free(b);
    free(pp);
    free(tg);
    free(prompt);
    return rc;
}

/* ---- raw f32 files (no llama.cpp) ---------------------------------------------------- */

static float *read_f32(const char *path, int64_t n_vocab, int64_t *rows) {
    em_err err = { 0 };
    char *data;
    size_t len;
    if (em_file_read_all(path, &data, &len, &err) != 0) die("%s", err.msg);
    uint64_t row_bytes = (uint64_t)n_vocab * sizeof(float);
    if (len % row_bytes != 0)
        die("%s: %zu bytes is not a whole number of rows of %lld floats", path, len, (long long)n_vocab);
    *rows = (int64_t)(len / row_bytes);
    return (float *)(void *)data; /* em_file_read_all's buffer is malloc-aligned */
}

static int cmd_argmax(const opts *o) {
    if (o->n_vocab < 1) die("argmax needs --n-vocab V");
    int64_t rows;
    float *x = read_f32(o->pos[0], o->n_vocab, &rows);
    int rc = 0;
    for (int64_t i = 0; i < rows * o->n_vocab && !rc; i++)
        if (!isfinite(x[i])) {
            fprintf(stderr, "compat_llama_ref: %s: row %lld column %lld is %g\n", o->pos[0],
                    (long long)(i / o->n_vocab), (long long)(i % o->n_vocab), (double)x[i]);
            rc = EXIT_FAIL;
        }
    if (!rc) {
        llama_token *ids = xmalloc((size_t)(rows ? rows : 1) * sizeof *ids);
        for (int64_t r = 0; r < rows; r++) ids[r] = argmax_row(x + r * o->n_vocab, o->n_vocab);
        print_ids(ids, rows);
        free(ids);
    }
    free(x);
    return rc;
}

static int cmd_compare(const opts *o) {
    if (o->n_vocab < 1 || o->n_pos < 2) die("compare needs A.f32 B.f32 --n-vocab V");
    int64_t ra, rb;
    float *a = read_f32(o->pos[0], o->n_vocab, &ra);
    float *b = read_f32(o->pos[1], o->n_vocab, &rb);
    int64_t rows = ra < rb ? ra : rb;
    if (o->rows >= 0) {
        if (o->rows > rows) die("--rows %lld: the files have %lld and %lld rows", o->rows,
                                (long long)ra, (long long)rb);
        rows = o->rows;
    }
    double worst = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < rows * o->n_vocab; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) { /* NaN counts as the worst */
            worst = isnan(d) ? INFINITY : d;
            at = i;
        }
    }
    printf("rows=%lld max_abs_diff=%.9g", (long long)rows, worst);
    if (at >= 0)
        printf(" at row %lld column %lld (%.9g vs %.9g)", (long long)(at / o->n_vocab),
               (long long)(at % o->n_vocab), (double)a[at], (double)b[at]);
    putchar('\n');
    free(a);
    free(b);
    return worst <= o->tol ? 0 : EXIT_FAIL;
}

/* ---- the tiny llama test model ------------------------------------------------------- */

/* A 2-layer "llama" model llama.cpp certainly supports: n_embd 64, 4 query heads over 2 K/V
 * heads (GQA), FFN 96, RoPE, all F32, weights from a PRNG seeded by each tensor's name. The
 * vocabulary is GPT-2 style byte-level BPE: ids 0..255 are the 256 bytes (in GPT-2's
 * byte-to-unicode spelling), 256.. the merges below in rank order, then <|endoftext|> (272,
 * CONTROL, also bos/eos; add_bos_token is true so a wrong add_special shows). */
enum { TINY_EMBD = 64, TINY_HEAD = 4, TINY_HEAD_KV = 2, TINY_FF = 96, TINY_LAYERS = 2, TINY_CTX = 512 };

static const char *const k_tiny_merges[][2] = {
    { " ", "t" },  { "h", "e" },   { " t", "he" }, { "i", "n" },   { "in", "g" },  { "l", "l" },
    { "he", "ll" }, { "hell", "o" }, { " ", "w" },  { "o", "r" },   { " w", "or" }, { "l", "d" },
    { " wor", "ld" }, { "e", "r" }, { " ", "s" },  { "a", "n" },
};
#define TINY_N_MERGES ((int)(sizeof k_tiny_merges / sizeof k_tiny_merges[0]))
#define TINY_VOCAB (256 + TINY_N_MERGES + 1)

/* GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the others
 * (controls, space, DEL, NBSP, soft hyphen) for U+0100 onwards in byte order. */
static bool gpt2_byte_is_direct(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

static uint32_t gpt2_byte_cp(int b) {
    if (gpt2_byte_is_direct(b)) return (uint32_t)b;
    uint32_t n = 0;
    for (int c = 0; c < b; c++) n += !gpt2_byte_is_direct(c);
    return 256 + n;
}

/* The GPT-2 spelling of raw bytes s, UTF-8 encoded (every code point is below U+0800). */
static char *gpt2_spell(const char *s) {
    size_t n = strlen(s);
    char *out = xmalloc(2 * n + 1), *p = out;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = gpt2_byte_cp((unsigned char)s[i]);
        if (cp < 0x80) {
            *p++ = (char)cp;
        } else {
            *p++ = (char)(0xC0 | (cp >> 6));
            *p++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *p = 0;
    return out;
}

enum tiny_kind { KV_U32, KV_F32, KV_BOOL, KV_STR, KV_ARR_STR, KV_ARR_I32 };

typedef struct tiny_kv {
    const char *key;
    int kind;
    uint32_t u32;
    float f32;
    const char *str;
    const char **strs; /* KV_ARR_STR */
    const int32_t *i32s; /* KV_ARR_I32 */
    size_t n;
} tiny_kv;

typedef struct tiny_tensor {
    char name[64];
    int n_dims;
    int64_t ne[4];
    uint64_t n;
    float *data;
} tiny_tensor;

typedef struct tiny_model {
    tiny_kv kv[32];
    int n_kv;
    tiny_tensor t[64];
    int n_t;
    const char *tokens[TINY_VOCAB];
    int32_t token_types[TINY_VOCAB];
    const char *merges[TINY_N_MERGES];
    uint64_t n_params;
} tiny_model;

static tiny_kv *tiny_add_kv(tiny_model *m, const char *key, int kind) {
    if (m->n_kv == (int)(sizeof m->kv / sizeof m->kv[0])) die("tiny model: too many keys");
    tiny_kv *kv = &m->kv[m->n_kv++];
    memset(kv, 0, sizeof *kv);
    kv->key = key;
    kv->kind = kind;
    return kv;
}

static uint64_t seed_of(const char *name) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return h | 1;
}

static float rng_unit(uint64_t *s) { /* xorshift64*, uniform in [-1, 1) */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((double)((*s * 2685821657736338717ull) >> 40) / 8388608.0 - 1.0);
}

/* A tensor of uniform values in [-scale, scale) around center. */
static void tiny_add_tensor(tiny_model *m, const char *name, int64_t ne0, int64_t ne1,
                            float center, float scale) {
    if (m->n_t == (int)(sizeof m->t / sizeof m->t[0])) die("tiny model: too many tensors");
    tiny_tensor *t = &m->t[m->n_t++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->ne[2] = t->ne[3] = 1;
    t->n = (uint64_t)(ne0 * t->ne[1]);
    t->data = xmalloc(t->n * sizeof(float));
    uint64_t s = seed_of(name);
    for (uint64_t i = 0; i < t->n; i++) t->data[i] = center + scale * rng_unit(&s);
    m->n_params += t->n;
}

static void tiny_vocab(tiny_model *m) {
    for (int b = 0; b < 256; b++) {
        char raw[2] = { (char)b, 0 };
        if (b == 0) { /* strlen-based spelling cannot see NUL: byte 0 maps to U+0100 */
            m->tokens[0] = xstrdup("\xC4\x80");
        } else {
            m->tokens[b] = gpt2_spell(raw);
        }
        m->token_types[b] = 1; /* NORMAL */
    }
    for (int i = 0; i < TINY_N_MERGES; i++) {
        char *l = gpt2_spell(k_tiny_merges[i][0]), *r = gpt2_spell(k_tiny_merges[i][1]);
        size_t n = strlen(l) + strlen(r) + 2;
        char *merge = xmalloc(n), *tok = xmalloc(n);
        snprintf(merge, n, "%s %s", l, r);
        snprintf(tok, n, "%s%s", l, r);
        m->merges[i] = merge;
        m->tokens[256 + i] = tok;
        m->token_types[256 + i] = 1;
        free(l);
        free(r);
    }
    m->tokens[TINY_VOCAB - 1] = xstrdup("<|endoftext|>");
    m->token_types[TINY_VOCAB - 1] = 3; /* CONTROL */
}

static void tiny_build(tiny_model *m) {
    memset(m, 0, sizeof *m);
    tiny_vocab(m);
    tiny_add_kv(m, "general.architecture", KV_STR)->str = "llama";
    tiny_add_kv(m, "general.name", KV_STR)->str = "ember tiny llama (random weights)";
    tiny_add_kv(m, "general.file_type", KV_U32)->u32 = 0; /* all F32 */
    tiny_add_kv(m, "llama.context_length", KV_U32)->u32 = TINY_CTX;
    tiny_add_kv(m, "llama.embedding_length", KV_U32)->u32 = TINY_EMBD;
    tiny_add_kv(m, "llama.block_count", KV_U32)->u32 = TINY_LAYERS;
    tiny_add_kv(m, "llama.feed_forward_length", KV_U32)->u32 = TINY_FF;
    tiny_add_kv(m, "llama.attention.head_count", KV_U32)->u32 = TINY_HEAD;
    tiny_add_kv(m, "llama.attention.head_count_kv", KV_U32)->u32 = TINY_HEAD_KV;
    tiny_add_kv(m, "llama.rope.dimension_count", KV_U32)->u32 = TINY_EMBD / TINY_HEAD;
    tiny_add_kv(m, "llama.rope.freq_base", KV_F32)->f32 = 10000.0f;
    tiny_add_kv(m, "llama.attention.layer_norm_rms_epsilon", KV_F32)->f32 = 1e-5f;
    tiny_add_kv(m, "llama.vocab_size", KV_U32)->u32 = TINY_VOCAB;
    tiny_add_kv(m, "tokenizer.ggml.model", KV_STR)->str = "gpt2";
    tiny_add_kv(m, "tokenizer.ggml.pre", KV_STR)->str = "gpt-2";
    tiny_kv *kv = tiny_add_kv(m, "tokenizer.ggml.tokens", KV_ARR_STR);
    kv->strs = m->tokens;
    kv->n = TINY_VOCAB;
    kv = tiny_add_kv(m, "tokenizer.ggml.token_type", KV_ARR_I32);
    kv->i32s = m->token_types;
    kv->n = TINY_VOCAB;
    kv = tiny_add_kv(m, "tokenizer.ggml.merges", KV_ARR_STR);
    kv->strs = m->merges;
    kv->n = TINY_N_MERGES;
    tiny_add_kv(m, "tokenizer.ggml.bos_token_id", KV_U32)->u32 = TINY_VOCAB - 1;
    tiny_add_kv(m, "tokenizer.ggml.eos_token_id", KV_U32)->u32 = TINY_VOCAB - 1;
    tiny_add_kv(m, "tokenizer.ggml.add_bos_token", KV_BOOL)->u32 = 1;

    /* scales: embeddings ~1, projections ~1/sqrt(fan_in), the LM head wide enough that the
     * logits spread over several units (greedy picks far from ties) */
    const int kv_dim = TINY_EMBD / TINY_HEAD * TINY_HEAD_KV;
    const float s_embd = 1.0f / sqrtf((float)TINY_EMBD) * 1.7f, s_ff = 1.0f / sqrtf((float)TINY_FF) * 1.7f;
    tiny_add_tensor(m, "token_embd.weight", TINY_EMBD, TINY_VOCAB, 0.0f, 1.0f);
    for (int il = 0; il < TINY_LAYERS; il++) {
        char name[64];
#define BLK(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, il), name)
        tiny_add_tensor(m, BLK("attn_norm.weight"), TINY_EMBD, 0, 1.0f, 0.2f);
        tiny_add_tensor(m, BLK("attn_q.weight"), TINY_EMBD, TINY_EMBD, 0.0f, s_embd);
        tiny_add_tensor(m, BLK("attn_k.weight"), TINY_EMBD, kv_dim, 0.0f, s_embd);
        tiny_add_tensor(m, BLK("attn_v.weight"), TINY_EMBD, kv_dim, 0.0f, s_embd);
        tiny_add_tensor(m, BLK("attn_output.weight"), TINY_EMBD, TINY_EMBD, 0.0f, s_embd);
        tiny_add_tensor(m, BLK("ffn_norm.weight"), TINY_EMBD, 0, 1.0f, 0.2f);
        tiny_add_tensor(m, BLK("ffn_gate.weight"), TINY_EMBD, TINY_FF, 0.0f, s_embd);
        tiny_add_tensor(m, BLK("ffn_up.weight"), TINY_EMBD, TINY_FF, 0.0f, s_embd);
        tiny_add_tensor(m, BLK("ffn_down.weight"), TINY_FF, TINY_EMBD, 0.0f, s_ff);
#undef BLK
    }
    tiny_add_tensor(m, "output_norm.weight", TINY_EMBD, 0, 1.0f, 0.2f);
    tiny_add_tensor(m, "output.weight", TINY_EMBD, TINY_VOCAB, 0.0f, 1.0f);
}

static void tiny_free(tiny_model *m) {
    for (int i = 0; i < TINY_VOCAB; i++) free((void *)m->tokens[i]);
    for (int i = 0; i < TINY_N_MERGES; i++) free((void *)m->merges[i]);
    for (int i = 0; i < m->n_t; i++) free(m->t[i].data);
}

/* Through ggml's own writer (gguf_init_empty / gguf_set_* / gguf_add_tensor). */
static void tiny_write_ggml(lref *L, const tiny_model *m, const char *path) {
    const ggml_lib *g = &L->gg;
    struct gguf_context *gc = g->gguf_init_empty();
    for (int i = 0; i < m->n_kv; i++) {
        const tiny_kv *kv = &m->kv[i];
        switch (kv->kind) {
        case KV_U32: g->gguf_set_val_u32(gc, kv->key, kv->u32); break;
        case KV_F32: g->gguf_set_val_f32(gc, kv->key, kv->f32); break;
        case KV_BOOL: g->gguf_set_val_bool(gc, kv->key, kv->u32 != 0); break;
        case KV_STR: g->gguf_set_val_str(gc, kv->key, kv->str); break;
        case KV_ARR_STR: g->gguf_set_arr_str(gc, kv->key, (const char **)kv->strs, kv->n); break;
        case KV_ARR_I32: g->gguf_set_arr_data(gc, kv->key, GGUF_TYPE_INT32, kv->i32s, kv->n); break;
        }
    }
    size_t mem = 1 << 16;
    for (int i = 0; i < m->n_t; i++) mem += g->ggml_tensor_overhead() + m->t[i].n * sizeof(float) + 64;
    struct ggml_init_params ip = { .mem_size = mem, .mem_buffer = NULL, .no_alloc = false };
    struct ggml_context *ctx = g->ggml_init(ip);
    if (!ctx) die("ggml_init(%zu bytes) failed", mem);
    for (int i = 0; i < m->n_t; i++) {
        const tiny_tensor *t = &m->t[i];
        struct ggml_tensor *gt = g->ggml_new_tensor(ctx, GGML_TYPE_F32, t->n_dims, t->ne);
        g->ggml_set_name(gt, t->name);
        memcpy(g->ggml_get_data(gt), t->data, t->n * sizeof(float));
        g->gguf_add_tensor(gc, gt);
    }
    if (!g->gguf_write_to_file(gc, path, false)) die("gguf_write_to_file %s failed", path);
    g->gguf_free(gc);
    g->ggml_free(ctx);
    printf("%s\n", path);
}

/* Through Ember's writer (format/gguf.h), split into shards when split_bytes > 0. */
static void tiny_write_ember(const tiny_model *m, const char *path, uint64_t split_bytes) {
    em_err err = { 0 };
    em_gguf_write_opts wo = { .max_shard_bytes = split_bytes };
    em_gguf_writer *w = NULL;
    int rc = em_gguf_writer_create(&w, path, &wo, &err);
    for (int i = 0; !rc && i < m->n_kv; i++) {
        const tiny_kv *kv = &m->kv[i];
        switch (kv->kind) {
        case KV_U32: rc = em_gguf_writer_set_u32(w, kv->key, kv->u32, &err); break;
        case KV_F32: rc = em_gguf_writer_set_f32(w, kv->key, kv->f32, &err); break;
        case KV_BOOL: rc = em_gguf_writer_set_bool(w, kv->key, kv->u32 != 0, &err); break;
        case KV_STR: rc = em_gguf_writer_set_str(w, kv->key, kv->str, &err); break;
        case KV_ARR_STR:
            rc = em_gguf_writer_set_arr_str(w, kv->key, (const char *const *)kv->strs, kv->n, &err);
            break;
        case KV_ARR_I32: rc = em_gguf_writer_set_arr(w, kv->key, EM_GGUF_I32, kv->i32s, kv->n, &err); break;
        }
    }
    for (int i = 0; !rc && i < m->n_t; i++)
        rc = em_gguf_writer_add_tensor(w, m->t[i].name, GGML_TYPE_F32, m->t[i].n_dims, m->t[i].ne, &err);
    for (int i = 0; !rc && i < m->n_t; i++)
        rc = em_gguf_writer_write_tensor(w, m->t[i].name, m->t[i].data, m->t[i].n * sizeof(float), &err);
    if (!rc) rc = em_gguf_writer_finish(w, &err);
    if (rc) {
        em_gguf_writer_free(w);
        die("Ember's writer: %s", err.msg);
    }
    printf("%s\n", em_gguf_writer_shard_path(w, 0));
    em_gguf_writer_free(w);
}

static int cmd_make_llama_test(lref *L, const opts *o) {
    const char *bins = o->pos[0], *dir = o->pos[1];
    bool ember = !strcmp(o->writer, "ember");
    if (!ember && strcmp(o->writer, "ggml")) die("--writer: expected ggml or ember, got '%s'", o->writer);
    if (!ember && o->split_bytes) die("--split-bytes needs --writer ember");
    make_dirs(dir);
    tiny_model *m = xmalloc(sizeof *m);
    tiny_build(m);
    char *path = path_join(dir, "tiny-llama.gguf");
    if (ember) {
        tiny_write_ember(m, path, (uint64_t)o->split_bytes);
    } else {
        lref_open_gguf(L, bins);
        tiny_write_ggml(L, m, path);
    }
    printf("n_params=%llu\nn_tensors=%d\nn_vocab=%d\n", (unsigned long long)m->n_params, m->n_t, TINY_VOCAB);
    free(path);
    tiny_free(m);
    free(m);
    return 0;
}

/* ---- main ----------------------------------------------------------------------------- */

static void usage(void) __attribute__((noreturn));
static void usage(void) {
    fputs("usage: compat_llama_ref load BINS MODEL.gguf [--vocab-only] [--meta]\n"
          "       compat_llama_ref logits BINS MODEL.gguf --tokens LIST -o OUT.f32 [--threads N]\n"
          "       compat_llama_ref generate BINS MODEL.gguf --tokens LIST -n N [-o OUT.f32]\n"
          "       compat_llama_ref tokenize BINS MODEL.gguf -p TEXT\n"
          "       compat_llama_ref bench BINS MODEL.gguf [-p P] [-n N] [--reps R] [--warmup K]\n"
          "                        [--verify-width W] [--seed S] [--json]\n"
          "       compat_llama_ref make-llama-test BINS DIR [--writer ggml|ember] [--split-bytes N]\n"
          "       compat_llama_ref argmax OUT.f32 --n-vocab V\n"
          "       compat_llama_ref compare A.f32 B.f32 --n-vocab V [--rows R] [--tol T]\n"
          "model options: --threads N, --flash-attn on|off|auto (off; bench: auto),\n"
          "               --kv-type f32|f16 (f32; bench: f16),\n"
          "               --no-repack, -v\n"
          "LIST: 1,2,3 or @FILE\n",
          stderr);
    exit(EXIT_SETUP);
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    const char *cmd = argv[1];
    opts o;
    parse_opts(argc, argv, &o);
    if (!strcmp(cmd, "argmax")) return o.n_pos == 1 ? cmd_argmax(&o) : (usage(), 0);
    if (!strcmp(cmd, "compare")) return o.n_pos == 2 ? cmd_compare(&o) : (usage(), 0);

    int (*run)(lref *, const opts *) = NULL;
    if (!strcmp(cmd, "load")) run = cmd_load;
    else if (!strcmp(cmd, "logits")) run = cmd_logits;
    else if (!strcmp(cmd, "generate")) run = cmd_generate;
    else if (!strcmp(cmd, "tokenize")) run = cmd_tokenize;
    else if (!strcmp(cmd, "bench")) run = cmd_bench;
    else if (!strcmp(cmd, "make-llama-test")) run = cmd_make_llama_test;
    else usage();
    if (o.n_pos != 2) usage();

    lref L;
    if (run == cmd_make_llama_test) { /* needs ggml's gguf writer at most, not llama.cpp */
        memset(&L, 0, sizeof L);
    } else {
        lref_open(&L, o.pos[0], o.verbose);
        lref_check_layouts(&L);
    }
    int rc = run(&L, &o);
    fflush(stdout);
    lref_close(&L);
    return rc;
}
