/* ember: subcommand dispatch. Each subcommand lives in its own tools/cmd_*.c and is listed
 * in the table below; this file owns only the table, global help and the shared error
 * printers. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#ifndef EMBER_VERSION
#define EMBER_VERSION "0.1.0"
#endif

static const em_cmd *const commands[] = {
    &em_cmd_inspect,
    &em_cmd_tensor,
    &em_cmd_convert,
    &em_cmd_logits,
    &em_cmd_tokenize,
    &em_cmd_run,
    &em_cmd_serve,
    &em_cmd_bench,
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void print_help(FILE *out) {
    fprintf(out,
            "ember %s: inference engine for hybrid MoE models (Kimi-Linear, Kimi-K3)\n\n"
            "usage: ember COMMAND [ARGS]   (ember COMMAND --help for its flags)\n\ncommands:\n",
            EMBER_VERSION);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
}

int em_cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

int em_cli_usage_error(const em_cmd *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "ember %s: ", cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s", cmd->usage);
    return EM_EXIT_USAGE;
}

int em_cli_fail(const em_cmd *cmd, const em_err *err) {
    fprintf(stderr, "ember %s: %s\n", cmd->name, err && err->msg[0] ? err->msg : "failed");
    return EM_EXIT_FAIL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_help(stderr);
        return EM_EXIT_USAGE;
    }
    if (em_cli_is_help(argv[1]) || !strcmp(argv[1], "help")) {
        print_help(stdout);
        return EM_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("ember %s\n", EMBER_VERSION);
        return EM_EXIT_OK;
    }
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(argv[1], commands[i]->name)) continue;
        for (int a = 2; a < argc; a++) {
            if (!strcmp(argv[a], "--")) break;
            if (em_cli_is_help(argv[a])) {
                fputs(commands[i]->usage, stdout);
                return EM_EXIT_OK;
            }
        }
        return commands[i]->main(argc - 1, argv + 1);
    }
    fprintf(stderr, "ember: unknown command '%s'\n\n", argv[1]);
    print_help(stderr);
    return EM_EXIT_USAGE;
}
