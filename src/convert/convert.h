/* convert/: Hugging Face checkpoints (config.json + safetensors + tokenizer files) to GGUF
 * files that Ember runs and llama.cpp loads. The only interface of the layer.
 *
 * What is converted: Kimi-Linear targets (architecture "kimi-linear", Moonshot and
 * transformers-5 tensor names), Kimi-K3 targets (architecture "kimi-k3", the
 * KimiK3ForConditionalGeneration release with compressed-tensors MXFP4 experts kept as ggml
 * MXFP4) and DFlash/DSpark drafters (architecture "dflash"; DSpark is
 * the mode with Markov tensors) in the z-lab, DeepSpec and SpecForge layouts. Names, shapes,
 * keys and transforms follow llama.cpp's converter (docs/convert.md has the tables).
 *
 * Guarantees:
 *   - every source tensor maps (or is a documented training-only tensor that is dropped) and
 *     every required GGUF tensor is produced, else the conversion fails naming the tensor;
 *     each source shape is checked against config.json;
 *   - output appears only when complete: the GGUF (every shard) and the JSON report are
 *     written under temporary names next to their final ones, fsynced, and renamed into place
 *     only when all of them are complete; a failed, cancelled or interrupted conversion leaves
 *     no new file behind and whatever was at the output names untouched;
 *   - no output is an input: the GGUF (every shard name) and the report must be different
 *     files from each other and from every file the conversion reads (compared by device and
 *     inode, or by folder and name for files not yet there), else EM_EINVAL naming both;
 *   - memory is bounded by a few row chunks (about 64 MiB at most), never a whole tensor:
 *     source bytes are read with pread into bounded buffers, not mapped, so they never count
 *     in the resident set;
 *   - the result is deterministic: the same input and options give the same bytes, whatever
 *     the thread count. */
#ifndef EM_CONVERT_H
#define EM_CONVERT_H

#include <signal.h>
#include <stdio.h>

#include "base/base.h"
#include "quant/quant.h"

#define EM_CONVERT_NAME 64 /* GGUF tensor names are shorter (EM_GGUF_MAX_NAME) */
#define EM_CONVERT_RMSE_ROWS 64 /* default number of rows sampled per tensor for the RMSE */

/* Where a conversion stands; handed to the progress callback after every chunk. */
typedef struct em_convert_progress {
    int64_t tensors_done, tensors_total; /* GGUF tensors */
    uint64_t bytes_done, bytes_total;    /* source tensor bytes read */
    double seconds;                      /* since the conversion began */
    const char *tensor;                  /* GGUF tensor being written */
} em_convert_progress;

typedef void (*em_convert_progress_fn)(void *user, const em_convert_progress *p);

typedef struct em_convert_opts {
    const char *src_dir;  /* config.json, *.safetensors (single or sharded), tokenizer files */
    const char *out_path; /* OUT.gguf (shards: OUT-00001-of-0000N.gguf) */
    const char *report_path; /* NULL, or where the JSON report goes (with the GGUF, or not at all) */
    int type;             /* EM_TYPE_Q8_0, EM_TYPE_BF16, EM_TYPE_F16 or EM_TYPE_F32 */
    /* Folder whose tokenizer files (tokenizer.json, or tiktoken.model + tokenizer_config.json)
     * give the vocabulary; NULL: src_dir. A drafter normally borrows its target's. Without
     * tokenizer files the GGUF says tokenizer.ggml.model = "none". */
    const char *tokenizer_dir;
    uint64_t max_shard_bytes; /* 0: one file; else split as gguf-split does */
    int n_threads;            /* quantization threads; 0: one per CPU */
    int rmse_rows;            /* rows sampled per lossy tensor; 0: EM_CONVERT_RMSE_ROWS */
    /* Checked between chunks; when it becomes nonzero the conversion stops and fails with
     * EM_EIO ("interrupted"), leaving nothing behind. May be NULL. */
    const volatile sig_atomic_t *cancel;
    em_convert_progress_fn progress; /* may be NULL */
    void *progress_user;
} em_convert_opts;

/* The error measured on one lossy tensor (output type other than F32/I64). */
typedef struct em_convert_qstat {
    char name[EM_CONVERT_NAME];
    int type;        /* ggml type written */
    double rel_rmse; /* sqrt(sum (x - deq(q(x)))^2 / sum x^2) over the sampled rows */
    uint64_t rows;   /* rows sampled */
} em_convert_qstat;

typedef struct em_convert_shard {
    char *path;
    uint64_t bytes;
    char sha256[65];
} em_convert_shard;

/* The validation report of one conversion. */
typedef struct em_convert_report {
    char arch[32];     /* "kimi-linear", "kimi-k3" or "dflash" */
    char mode[16];     /* drafters: "dspark" (Markov head) or "dflash"; targets: "" */
    char layout[32];   /* "moonshot", "transformers", "z-lab", "deepspec", "specforge", ... */
    char markov[16];   /* drafters: "vanilla", "gated", "rnn" or "none" */
    char src_dir[512];
    char note[160];    /* an architecture's remark ("" when none; K3: MXFP4 experts kept) */
    int type;          /* the requested --type */
    int n_threads;
    int rmse_rows;
    uint64_t n_params;        /* elements of all GGUF tensors (= of all mapped source tensors) */
    int64_t n_src_tensors;    /* tensors in the checkpoint */
    int64_t n_src_mapped;     /* of them, mapped into the GGUF */
    int64_t n_src_dropped;    /* of them, training-only tensors left out on purpose (t2d) */
    int64_t n_src_skipped;    /* of them, parts of the release the GGUF leaves out (K3's vision
                                 tower and projector: text only) */
    int64_t n_out_tensors;    /* tensors in the GGUF */
    uint64_t src_bytes;        /* sizes of the safetensors files */
    uint64_t src_tensor_bytes; /* bytes of tensor data in them */
    uint64_t out_bytes;        /* sizes of the GGUF files */
    double ratio;              /* out_bytes / src_bytes */
    int64_t type_counts[EM_TYPE_COUNT]; /* GGUF tensors per ggml type id */
    int n_quant;               /* lossy tensors, in file order */
    em_convert_qstat *quant;
    double rmse_rms;           /* sqrt(mean of rel_rmse^2) over them; 0 when none */
    int worst;                 /* index into quant of the largest rel_rmse; -1 when none */
    int n_shards;
    em_convert_shard *shards;
    char tokenizer[64];        /* "gpt2/kimi-k2", "gpt2/gpt-2", or "none" */
    char tokenizer_dir[512];   /* where it came from ("" for none) */
    char chat_template[32];    /* "checkpoint", "ember kimi-k3" (K3 ships none), or "" (none) */
    int64_t n_tokens;          /* tokens written (0 for none) */
    double seconds;
} em_convert_report;

/* Converts o->src_dir into o->out_path and fills *rep (zeroed first; free it with
 * em_convert_report_free, also after a failure). */
int em_convert(const em_convert_opts *o, em_convert_report *rep, em_err *err);
void em_convert_report_free(em_convert_report *rep);

/* The output checks em_convert makes first (EM_EINVAL naming both files when the output or the
 * report is the other, or is an input file), for a caller that treats them as usage errors.
 * Split shard names are checked by em_convert once they are known. */
int em_convert_check_paths(const em_convert_opts *o, em_err *err);

/* The report as one JSON object (docs/convert.md lists the fields); *json is malloc'ed. */
int em_convert_report_json(const em_convert_report *rep, char **json, em_err *err);
/* Writes the JSON report to path (temporary file, fsync, rename). */
int em_convert_report_write(const em_convert_report *rep, const char *path, em_err *err);
/* The report as text, for people. */
void em_convert_report_print(const em_convert_report *rep, FILE *f);

/* The type policy for --type `type`, one line ("2-D matrices with rows of a multiple of 32:
 * q8_0; ..."); NULL when type is not one the converter writes. */
const char *em_convert_policy(int type);
/* llama_ftype for general.file_type (q8_0 7, bf16 32, f16 1, f32 0); -1 otherwise. */
int em_convert_file_type(int type);

#endif
