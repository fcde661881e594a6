/* model/weights: the one weight loader every model file goes through (the kimi targets,
 * model/kimi_load.c, and the DSpark/DFlash drafter, draft/dspark_load.c). It reads typed GGUF
 * keys (defaults, ranges) and tensors, checked for presence, shape and type before use: a
 * matrix becomes an em_mat view over the mapping, a vector an f32 copy in the loader's store.
 * Every message names the file and the key or tensor (and the shape found and wanted).
 *
 * Why model/: a loader needs em_mat (compute/) and the GGUF reader (format/), which both lie
 * below model/, and neither of them may hold it (format/ knows nothing of compute, compute/
 * nothing of files). draft/ sits above model/, so both loaders reach it here. This header is
 * model/'s second interface, the one for code that loads weights; model.h stays the one for
 * code that runs a target.
 *
 * The device seam: every matrix a forward pass uses is made by em_wload_mat or
 * em_wload_mat_float, and each passes it, checked and final (a converted router included),
 * to the loader's hook exactly once; every vector made by em_wload_vec passes it too, as the
 * f32 values the forward reads. A device target uploads there, once per weight, and may
 * refuse (out of device memory) with a message: the load then fails naming the tensor.
 * Matrices a model borrows from another one (the drafter's use of its target's token_embd
 * and output, model.h em_target_shared) were made, and hooked, by that model's loader and do
 * not pass again. */
#ifndef EM_MODEL_WEIGHTS_H
#define EM_MODEL_WEIGHTS_H

#include <stdio.h>

#include "compute/compute.h"
#include "format/gguf.h"

/* Bounds every loader applies before a size is used. */
#define EM_WLOAD_MAX_DIM (1 << 20)  /* any single width (heads, hidden, FFN) */
#define EM_WLOAD_MAX_VOCAB (1 << 24)
#define EM_WLOAD_MAX_LAYERS 4096

/* A tensor name built in buf (a char array) with printf arguments; evaluates to buf. */
#define EM_WLOAD_NAME(buf, fmt, ...) (snprintf(buf, sizeof buf, fmt, __VA_ARGS__), buf)

/* Called once per weight made, after its checks; name is the tensor's. mat: m->data is NULL
 * when the file was cut short (opened with allow_missing_data): nothing may read it then.
 * vec: the n f32 values in the store. A nonzero return fails the load with that status and
 * message (prefixed with file and tensor). Either may be NULL. */
typedef struct em_wload_hook {
    int (*mat)(void *ud, const char *name, em_mat *m, em_err *err);
    int (*vec)(void *ud, const char *name, const float *v, int64_t n, em_err *err);
    void *ud;
} em_wload_hook;

typedef struct em_wload {
    const em_gguf *g;
    const char *path;      /* em_gguf_path(g), for messages */
    em_arena *store;       /* f32 vectors and converted matrices (owned by the caller) */
    em_wload_hook hook;    /* members NULL: none */
    const char *arch;      /* the key prefix of em_wload_akey (NULL: none) */
    uint64_t pack_budget;  /* CPU products: bytes of Q8_0 matrices to pack (em_mat_pack) */
    uint64_t packed_bytes; /* bytes of those packed copies so far (in store) */
    int64_t n_mats;        /* matrices made so far */
    uint64_t mat_bytes;    /* their bytes (as stored, or as converted) */
    int64_t n_vecs;        /* vectors made so far */
    char key[128];         /* em_wload_akey's result */
} em_wload;

/* A loader over g, allocating into store; hook may be NULL. Nothing is owned. With a
 * pack_budget (a model whose products run on this CPU: em_mat_pack_budget), em_wload_mat
 * packs each Q8_0 matrix that is one matrix (not stacked experts or heads, whose slices the
 * expert cache and MLA read as stored) and not token_embd (a table rows are gathered from),
 * in load order while the budget lasts: a copy in store, which that model's products read
 * at every width. */
void em_wload_init(em_wload *L, const em_gguf *g, em_arena *store, const em_wload_hook *hook);

/* ---- keys ------------------------------------------------------------------------------
 * key is the full name. A missing key gives def unless required (then EM_ENOTFOUND naming
 * file and key); a key of another type is EM_EFORMAT (the reader names file, key, types). */

/* "ARCH.suffix" (ARCH = L->arch; suffix alone when NULL) in L->key, which it returns: valid
 * until the next call. */
const char *em_wload_akey(em_wload *L, const char *suffix);
/* An integer in [lo, hi]. */
int em_wload_int(const em_wload *L, const char *key, bool required, int64_t def, int64_t lo, int64_t hi,
                 int *out, em_err *err);
/* A finite number, |v| <= 1e30; em_wload_f32 stores it as a float. */
int em_wload_float(const em_wload *L, const char *key, bool required, double def, double *out, em_err *err);
int em_wload_f32(const em_wload *L, const char *key, bool required, double def, float *out, em_err *err);
int em_wload_bool(const em_wload *L, const char *key, bool def, bool *out, em_err *err);
/* A string into buf (cap bytes); "" when absent. */
int em_wload_str(const em_wload *L, const char *key, char *buf, size_t cap, em_err *err);

/* ---- tensors --------------------------------------------------------------------------- */

bool em_wload_has(const em_wload *L, const char *name);
/* The tensor `name` of exactly the shape ne[0..nd) (its other dimensions 1). */
int em_wload_find_shaped(const em_wload *L, const char *name, int nd, const int64_t *ne,
                         const em_gguf_tensor **out, em_err *err);
/* A matrix the dot kernels take: `rows` rows of `cols` values, stacked `extra` times (ne
 * [cols, rows, extra]; extra 1: a 2-D tensor), so rows * extra rows in all; then hooked. */
int em_wload_mat(em_wload *L, const char *name, int64_t cols, int64_t rows, int64_t extra, em_mat *m,
                 em_err *err);
/* As em_wload_mat (2-D), then in f32 in the store unless stored as F32, F16 or BF16 (whose
 * dots take f32 activations): products with it are then exact fp32 dots. */
int em_wload_mat_float(em_wload *L, const char *name, int64_t cols, int64_t rows, em_mat *m, em_err *err);
/* EM_EUNSUPPORTED unless values of type can be read as floats (a matrix read by rows, as an
 * embedding is, needs it on top of em_wload_mat's checks). */
int em_wload_readable(const em_wload *L, const char *name, int type, em_err *err);
/* n values of a tensor as f32 in the store: exactly n values, all in one dimension (the others
 * 1), unless lead > 0: then ne[0] must be lead (conv taps first). A tensor whose data is
 * missing (a file cut short) gives zeros: nothing runs on such a file (model/target.c).
 * Then hooked. */
int em_wload_vec(em_wload *L, const char *name, int64_t n, int64_t lead, const float **out, em_err *err);
/* As em_wload_vec (lead 0); *out NULL when the file has no such tensor. */
int em_wload_vec_opt(em_wload *L, const char *name, int64_t n, const float **out, em_err *err);

#endif
