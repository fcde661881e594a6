/* tools/model_flags: the model flags `ember serve` takes exactly as `ember run` does (-m,
 * --draft, --device, --draft-device, --moe-storage, --expert-cache, --threads,
 * --feature-dtype, --verify-width, --spec-policy, -c/--ctx-size): parsed once here, with the same checks and
 * the same "not available yet" refusals (exit 2) for features still to come; and the default
 * model pair (models/ of the source tree, or $EMBER_MODELS) used when -m is not given. */
#ifndef EM_TOOLS_MODEL_FLAGS_H
#define EM_TOOLS_MODEL_FLAGS_H

#include "backend/gpu.h"
#include "cli.h"
#include "draft/draft.h"
#include "model/model.h"
#include "decode/decode.h"

/* The default model pair: these two files in $EMBER_MODELS when that is set, else in
 * EMBER_MODELS_DIR (the source tree's models/, set by CMake), else in models/ beside or above
 * the executable's folder (a build folder inside a moved source tree). */
#define EM_DEFAULT_TARGET_FILE "kimi-linear-19m-q8_0.gguf"
#define EM_DEFAULT_DRAFT_FILE "dspark-kimi-linear-19m-q8_0.gguf"
#ifndef EMBER_MODELS_DIR
#define EMBER_MODELS_DIR "models"
#endif

typedef struct em_model_flags {
    const char *model;  /* -m; NULL until em_model_flags_need_model puts the default there */
    const char *draft;  /* --draft (NULL: none); with no -m and no --draft, the default drafter */
    bool draft_given;   /* --draft was given (also as "none") */
    char default_model[4096], default_draft[4096]; /* storage for the default pair's paths */
    int n_threads;      /* 0: all CPUs */
    int n_ctx;          /* 0: the model's, at most EM_MODEL_DEFAULT_CTX */
    int verify_width;   /* --verify-width: 0 automatic; > 1 needs a drafter */
    const char *spec_policy;   /* --spec-policy: auto, nominal or always (NULL: auto) */
    const char *moe_storage;   /* --moe-storage: "resident", "ssd" or "auto" (NULL: auto) */
    uint64_t expert_cache;     /* --expert-cache bytes; 0: derived from available memory */
    bool expert_no_prefetch;   /* --expert-prefetch off */
    const char *feature_dtype; /* --feature-dtype: f32, f16, bf16 or q8_0 (NULL: default) */
    int device;         /* --device: enum em_device_kind (0: auto) */
    int cuda_index;     /* --device cuda:N */
    int cuda_devices[EM_GPU_MAX_SHARES]; /* --devices: the routed experts over these */
    int n_cuda_devices;
    const char *draft_device; /* --draft-device cuda:N as given; NULL: cpu */
} em_model_flags;

/* The flags' lines for a command's --help. */
#define EM_MODEL_FLAGS_USAGE                                                                           \
    "  -m, --model FILE       the target model (GGUF). Default: the shipped pair " EM_DEFAULT_TARGET_FILE \
    "\n                         with its drafter " EM_DEFAULT_DRAFT_FILE ", from $EMBER_MODELS\n"        \
    "                         when set, else " EMBER_MODELS_DIR "\n"                                      \
    "                         (else models/ next to or above the executable's folder)\n"                 \
    "      --threads N        compute threads (default: all CPUs)\n"                                     \
    "  -c, --ctx-size N       context positions (default: the model's, at most 4096)\n"                  \
    "      --draft DRAFT.gguf the DSpark/DFlash drafter (speculative decoding); none: plain. With\n"   \
    "                         -m and no --draft: plain; with neither: the default drafter\n"            \
    "      --device D         where the target runs: cpu, cuda:N (cuda = cuda:0) or auto (default:\n"   \
    "                         cuda:0 when a usable GPU is there and the model fits, else cpu)\n"       \
    "      --devices L        spread the routed experts over several GPUs of this host, e.g.\n"        \
    "                         cuda:0,cuda:1 (the first holds the rest of the model; NCCL)\n"          \
    "      --draft-device D   where the drafter runs: cpu (default) or cuda:N (greedy drafting)\n"     \
    "      --moe-storage M    routed experts resident (mapped), ssd (read on demand through the\n"      \
    "                         expert cache) or auto (resident when the model fits in memory)\n"         \
    "      --expert-cache B   ssd: expert cache budget, e.g. 8GiB (default: half the free memory)\n"   \
    "      --expert-prefetch P  ssd with --draft: on (default) reads ahead, while the drafter\n"   \
    "                         works, the experts the next verify's first token was routed to\n"    \
    "                         last time; off reads only what a layer asks for\n"                   \
    "      --verify-width N   rows per target pass with --draft (the anchor and N-1 drafts); default\n" \
    "                         0: chosen per pass from the drafter's confidence and the target's cost\n" \
    "      --spec-policy P    when passes draft: auto (default: only while speculation is faster\n"    \
    "                         than plain decoding on this machine, timed; seeded sampling then\n"      \
    "                         depends on the timings and what earlier runs or requests showed),\n"    \
    "                         nominal (the same from nominal costs:\n"                                  \
    "                         seeded runs reproducible) or always\n"                                    \
    "      --feature-dtype T  storage of the target features the drafter reads: f32 (default), f16,\n"  \
    "                         bf16 or q8_0\n"

/* A device name for flag (cpu, auto, cuda, cuda:N) into *device (enum em_device_kind) and
 * *cuda_index. Returns -1 to go on, or EM_EXIT_USAGE after saying what is wrong. */
int em_cli_device(const em_cmd *cmd, const char *flag, const char *v, int *device, int *cuda_index);
/* A --devices list (cuda:N,cuda:M,...; at most EM_GPU_MAX_SHARES, none twice) into list / *n.
 * Returns -1 to go on, or EM_EXIT_USAGE after saying what is wrong. */
int em_cli_devices(const em_cmd *cmd, const char *flag, const char *v, int *list, int *n);
/* True when a is one of the model flags (each takes a value). */
bool em_model_flag(const char *a);
/* Takes model flag a with its value v into f. Returns -1 to go on, or an exit status after
 * printing why on stderr (EM_EXIT_USAGE for a malformed value or a feature not available
 * yet). */
int em_model_flag_parse(const em_cmd *cmd, const char *a, const char *v, em_model_flags *f);
/* Without -m, puts the default pair's paths into f (the drafter only without --draft), after
 * checking that the files exist (else prints where it looked and returns EM_EXIT_FAIL). Then
 * checks that the flags fit together (--verify-width > 1 needs a drafter: EM_EXIT_USAGE).
 * Returns -1 to go on. */
int em_model_flags_need_model(const em_cmd *cmd, em_model_flags *f);
/* The model options the flags ask for. */
em_model_opts em_model_flags_opts(const em_model_flags *f);
/* Opens the target, and with --draft the drafter first: its tap layers become the target's
 * feature layers, and its feature width must equal the target's (an error naming both files
 * otherwise). *drafter is NULL without --draft. On failure both are NULL. */
int em_model_flags_open(const em_model_flags *f, em_target **target, em_drafter **drafter, em_err *err);
/* The decode loop options the flags ask for, with tok and the drafter (NULL: plain). */
em_decode_opts em_model_flags_decode_opts(const em_model_flags *f, const em_tok *tok, em_drafter *drafter);

#endif
