/* tools/model_flags: the model flags `ember serve` takes exactly as `ember run` does (-m,
 * --draft, --device, --draft-device, --moe-storage, --expert-cache, --threads,
 * --feature-dtype, --verify-width, -c/--ctx-size): parsed once here, with the same checks and
 * the same "not available yet" refusals (exit 2) for features still to come. */
#ifndef EM_TOOLS_MODEL_FLAGS_H
#define EM_TOOLS_MODEL_FLAGS_H

#include "cli.h"
#include "model/model.h"

typedef struct em_model_flags {
    const char *model;  /* -m; NULL: not given (there is no default model yet, issue 7) */
    int n_threads;      /* 0: all CPUs */
    int n_ctx;          /* 0: the model's, at most EM_MODEL_DEFAULT_CTX */
    int verify_width;   /* 0: automatic */
} em_model_flags;

/* The flags' lines for a command's --help. */
#define EM_MODEL_FLAGS_USAGE                                                                           \
    "  -m, --model FILE       the target model (GGUF). There is no default model yet (issue 7).\n"     \
    "      --threads N        compute threads (default: all CPUs)\n"                                     \
    "  -c, --ctx-size N       context positions (default: the model's, at most 4096)\n"                  \
    "      --draft DRAFT.gguf the DSpark drafter; only `none` until drafting lands (issue 6)\n"          \
    "      --device D         where the target runs: cpu (cuda:N is not available yet)\n"               \
    "      --draft-device D   where the drafter runs: cpu (cuda:N is not available yet)\n"              \
    "      --moe-storage M    resident or auto (both keep every expert in memory); ssd is not\n"         \
    "                         available yet\n"                                                           \
    "      --expert-cache B   expert cache budget (not available yet)\n"                                \
    "      --verify-width N   rows per target pass: 1 (wider needs a drafter; not available yet)\n"     \
    "      --feature-dtype T  drafter feature type (not available yet)\n"

/* True when a is one of the model flags (each takes a value). */
bool em_model_flag(const char *a);
/* Takes model flag a with its value v into f. Returns -1 to go on, or an exit status after
 * printing why on stderr (EM_EXIT_USAGE for a malformed value or a feature not available
 * yet). */
int em_model_flag_parse(const em_cmd *cmd, const char *a, const char *v, em_model_flags *f);
/* -1 when a model was given; else prints that there is no default model yet and returns
 * EM_EXIT_USAGE. */
int em_model_flags_need_model(const em_cmd *cmd, const em_model_flags *f);
/* The model options the flags ask for. */
em_model_opts em_model_flags_opts(const em_model_flags *f);

#endif
