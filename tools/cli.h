/* The `ember` command line: one function per subcommand, each taking the arguments after
 * the subcommand name (argv[0] is the subcommand). Exit status: 0 done, 1 failed (bad input
 * file, I/O), 2 usage error (unknown flag, missing argument). */
#ifndef EM_CLI_H
#define EM_CLI_H

#include "base/base.h"

enum { EM_EXIT_OK = 0, EM_EXIT_FAIL = 1, EM_EXIT_USAGE = 2 };

typedef struct em_cmd {
    const char *name;
    const char *summary;
    const char *usage; /* full help text printed by `ember NAME --help` */
    int (*main)(int argc, char **argv);
} em_cmd;

/* Prints "ember NAME: msg" and the command's usage on stderr; returns EM_EXIT_USAGE. */
int em_cli_usage_error(const em_cmd *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "ember NAME: <err message>" on stderr; returns EM_EXIT_FAIL. */
int em_cli_fail(const em_cmd *cmd, const em_err *err);
/* True when arg is -h or --help. */
int em_cli_is_help(const char *arg);

extern const em_cmd em_cmd_inspect;
extern const em_cmd em_cmd_tensor;
extern const em_cmd em_cmd_convert;
extern const em_cmd em_cmd_logits;
extern const em_cmd em_cmd_tokenize;
extern const em_cmd em_cmd_run;
extern const em_cmd em_cmd_serve;
extern const em_cmd em_cmd_bench;

#endif
