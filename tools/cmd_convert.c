/* `ember convert SRC_DIR -o OUT.gguf`: a Hugging Face checkpoint to GGUF (convert/convert.h),
 * with the validation report printed and optionally written as JSON. Owns the command line,
 * the progress bar (only when stderr is a terminal) and the SIGINT/SIGTERM handling: the
 * signal only sets a flag the converter polls between chunks, so an interrupted conversion
 * fails cleanly and leaves no output (the flag is the one piece of global state here; a
 * signal handler can reach nothing else). The GGUF and the --report file appear together or
 * not at all (em_convert stages both); an output that is the report or an input file is a
 * usage error (exit 2), any other failure exit 1. */
#include "cli.h"

#include "convert/convert.h"
#include "quant/quant.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char convert_usage[] =
    "usage: ember convert SRC_DIR -o OUT.gguf [--type q8_0|bf16|f16|f32] [--report REPORT.json]\n"
    "                     [--split-max-size BYTES] [--threads N] [--tokenizer-from DIR]\n"
    "\n"
    "Converts a Hugging Face checkpoint (config.json, *.safetensors, tokenizer files) into a\n"
    "GGUF file that Ember runs and llama.cpp loads: Kimi-Linear (kimi-linear) and Kimi-K3\n"
    "(kimi-k3) targets, DFlash/DSpark drafters (dflash). Prints a validation report; fails, leaving no output\n"
    "(and the files it would replace untouched), when any tensor does not map or does not\n"
    "match config.json. An output that is the report or an input file is refused (exit 2).\n"
    "\n"
    "  -o, --output OUT.gguf     the file to write (required)\n"
    "  --type T                  q8_0 (default), bf16, f16 or f32; see docs/convert.md\n"
    "  --report FILE             also write the report as JSON (with the GGUF, or neither)\n"
    "  --split-max-size BYTES    split into shards of at most BYTES (e.g. 4GiB), named\n"
    "                            OUT-00001-of-0000N.gguf as gguf-split does\n"
    "  --threads N               quantization threads (default: one per CPU)\n"
    "  --tokenizer-from DIR      take the tokenizer from DIR (a drafter borrows its target's);\n"
    "                            default SRC_DIR; without tokenizer files the GGUF has none\n"
    "  --rmse-rows N             rows sampled per tensor for the error report (default 64)\n";

static volatile sig_atomic_t g_interrupted;

static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
}

typedef struct progress_bar {
    double last;
    bool drawn;
} progress_bar;

static void draw_progress(void *user, const em_convert_progress *p) {
    progress_bar *bar = user;
    double now = p->seconds;
    bool done = p->tensors_done == p->tensors_total;
    if (!done && now - bar->last < 0.1 && bar->drawn) return;
    bar->last = now;
    bar->drawn = true;
    double frac = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1.0;
    int width = 30, fill = (int)(frac * width + 0.5);
    char bytes_done[32], bytes_total[32], rate[32];
    em_format_size(p->bytes_done, bytes_done, sizeof bytes_done);
    em_format_size(p->bytes_total, bytes_total, sizeof bytes_total);
    em_format_size(now > 0 ? (uint64_t)((double)p->bytes_done / now) : 0, rate, sizeof rate);
    fprintf(stderr, "\r[%.*s%*s] %lld/%lld tensors  %s / %s  %s/s \033[K",
            fill, "##############################", width - fill, "",
            (long long)p->tensors_done, (long long)p->tensors_total, bytes_done, bytes_total, rate);
    if (done) fputc('\n', stderr);
    fflush(stderr);
}

typedef struct convert_args {
    em_convert_opts opts;
} convert_args;

static int parse_value(const char *flag, const char *val, convert_args *a) {
    em_err err = { 0 };
    long long n;
    if (!strcmp(flag, "-o") || !strcmp(flag, "--output")) a->opts.out_path = val;
    else if (!strcmp(flag, "--report")) a->opts.report_path = val;
    else if (!strcmp(flag, "--tokenizer-from")) a->opts.tokenizer_dir = val;
    else if (!strcmp(flag, "--type")) {
        int t = em_type_from_name(val);
        if (t < 0 || !em_convert_policy(t))
            return em_cli_usage_error(&em_cmd_convert, "--type %s: use q8_0, bf16, f16 or f32", val);
        a->opts.type = t;
    } else if (!strcmp(flag, "--split-max-size")) {
        if (em_parse_size(val, &a->opts.max_shard_bytes, &err) || a->opts.max_shard_bytes == 0)
            return em_cli_usage_error(&em_cmd_convert, "--split-max-size %s: %s", val,
                                      err.msg[0] ? err.msg : "must be positive");
    } else if (!strcmp(flag, "--threads")) {
        if (em_parse_int(val, 1, 1024, &n, "--threads", &err))
            return em_cli_usage_error(&em_cmd_convert, "%s", err.msg);
        a->opts.n_threads = (int)n;
    } else if (!strcmp(flag, "--rmse-rows")) {
        if (em_parse_int(val, 1, 1 << 20, &n, "--rmse-rows", &err))
            return em_cli_usage_error(&em_cmd_convert, "%s", err.msg);
        a->opts.rmse_rows = (int)n;
    } else {
        return -1;
    }
    return EM_EXIT_OK;
}

static int parse_args(int argc, char **argv, convert_args *a) {
    bool flags_done = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!flags_done && !strcmp(arg, "--")) {
            flags_done = true;
        } else if (!flags_done && arg[0] == '-' && arg[1]) {
            if (i + 1 >= argc)
                return em_cli_usage_error(&em_cmd_convert, "%s needs a value (or is unknown)", arg);
            int rc = parse_value(arg, argv[i + 1], a);
            if (rc < 0) return em_cli_usage_error(&em_cmd_convert, "unknown flag '%s'", arg);
            if (rc) return rc;
            i++;
        } else if (a->opts.src_dir) {
            return em_cli_usage_error(&em_cmd_convert, "unexpected argument '%s'", arg);
        } else {
            a->opts.src_dir = arg;
        }
    }
    if (!a->opts.src_dir) return em_cli_usage_error(&em_cmd_convert, "missing SRC_DIR");
    if (!a->opts.out_path) return em_cli_usage_error(&em_cmd_convert, "missing -o OUT.gguf");
    /* an output that is the report or an input file: a usage error, before any work */
    em_err err = { 0 };
    if (em_convert_check_paths(&a->opts, &err) == EM_EINVAL)
        return em_cli_usage_error(&em_cmd_convert, "%s", err.msg);
    return EM_EXIT_OK;
}

static void set_handlers(struct sigaction *old_int, struct sigaction *old_term) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, old_int);
    sigaction(SIGTERM, &sa, old_term);
}

static int convert_main(int argc, char **argv) {
    convert_args a = { .opts = { .type = EM_TYPE_Q8_0 } };
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    progress_bar bar = { 0 };
    if (isatty(STDERR_FILENO)) {
        a.opts.progress = draw_progress;
        a.opts.progress_user = &bar;
    }
    struct sigaction old_int, old_term;
    g_interrupted = 0;
    a.opts.cancel = &g_interrupted;
    set_handlers(&old_int, &old_term);
    em_err err = { 0 };
    em_convert_report rep;
    rc = em_convert(&a.opts, &rep, &err);
    if (bar.drawn && rc) fputc('\n', stderr);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (!rc) em_convert_report_print(&rep, stdout);
    em_convert_report_free(&rep);
    return rc ? em_cli_fail(&em_cmd_convert, &err) : EM_EXIT_OK;
}

const em_cmd em_cmd_convert = {
    .name = "convert",
    .summary = "convert a Hugging Face checkpoint (Kimi-Linear, Kimi-K3, DFlash/DSpark) to GGUF",
    .usage = convert_usage,
    .main = convert_main,
};
