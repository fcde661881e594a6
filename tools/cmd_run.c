/* `ember run -m TARGET.gguf [-p PROMPT | -f FILE] [-n N] [--chat] [--json] ...`: generates text
 * with the one decode loop (spec/), streaming it to stdout as it comes, a summary line on
 * stderr, and with --json one JSON object on the last line of stdout (docs/ARCHITECTURE.md).
 * Flags of features that do not exist yet (drafters, CUDA, SSD experts, the expert cache,
 * feature dtypes) are refused with exit 2, never ignored. Owns only argument handling and
 * output; the loop, the model and the tokenizer are the library's. */
#include "cli.h"

#include "format/gguf.h"
#include "model/model.h"
#include "spec/spec.h"
#include "text/text.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char run_usage[] =
    "usage: ember run -m TARGET.gguf [-p PROMPT | -f FILE] [flags]\n"
    "\n"
    "Generates text after PROMPT and streams it to stdout; a summary (tokens, tok/s of the\n"
    "prompt and of generation) goes to stderr. Generation ends at an end-of-generation token\n"
    "(\"finish\": \"stop\"), after N tokens or when the context is full (\"length\").\n"
    "\n"
    "  -m, --model FILE       the target model (GGUF). There is no default model yet (issue 7).\n"
    "  -p, --prompt TEXT      the prompt (special-token text such as <|im_end|> is parsed)\n"
    "  -f, --file FILE        the prompt, read from FILE\n"
    "  -n, --n-predict N      tokens to generate at most (default 256)\n"
    "      --chat             wrap the prompt as one user message in Kimi's chat format, with\n"
    "                         the assistant generation prompt after it\n"
    "      --temp T           temperature; 0 is greedy (default 0.8)\n"
    "      --top-k K          keep the K most likely tokens; 0 is off (default 40)\n"
    "      --top-p P          keep the most likely tokens up to probability P; 1 is off (0.95)\n"
    "      --min-p P          drop tokens below P times the most likely one; 0 is off (0.05)\n"
    "      --seed S           random seed of the sampler (default 0: runs are reproducible)\n"
    "      --threads N        compute threads (default: all CPUs)\n"
    "  -c, --ctx-size N       context positions (default: the model's, at most 4096)\n"
    "      --json             after the text, one JSON object on the last line of stdout:\n"
    "                         tokens, n_prompt, n_gen, tok_per_s, prompt_tok_per_s, finish,\n"
    "                         spec {passes, drafted, accepted, tau, fast_commits, full_replays,\n"
    "                         failed_fallbacks}, experts {bytes_read, hits, misses, cache_bytes}\n"
    "      --draft DRAFT.gguf the DSpark drafter; only `none` until drafting lands (issue 6)\n"
    "      --device D         where the target runs: cpu (cuda:N is not available yet)\n"
    "      --draft-device D   where the drafter runs: cpu (cuda:N is not available yet)\n"
    "      --moe-storage M    resident or auto (both keep every expert in memory); ssd is not\n"
    "                         available yet\n"
    "      --expert-cache B   expert cache budget (not available yet)\n"
    "      --verify-width N   rows per target pass: 1 (wider needs a drafter; not available yet)\n"
    "      --feature-dtype T  drafter feature type (not available yet)\n"
    "\n"
    "tok/s of generation counts the tokens after the first (which comes from the prompt's pass)\n"
    "over the time after the prompt.\n";

#define DEFAULT_N_PREDICT 256

typedef struct run_opts {
    const char *model, *prompt, *file;
    int n_max;
    bool chat, json;
    em_sampler_params sampling;
    int n_threads, n_ctx, verify_width;
} run_opts;

/* ---- arguments ------------------------------------------------------------------------- */

/* Prints "ember run: <message>" (which says what is not available yet) and returns
 * EM_EXIT_USAGE. */
static int not_yet(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int not_yet(const char *fmt, ...) {
    va_list ap;
    fputs("ember run: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EM_EXIT_USAGE;
}

static int parse_float(const char *flag, const char *text, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < lo || v > hi)
        return em_cli_usage_error(&em_cmd_run, "%s: '%s' is not a number in [%g, %g]", flag, text, lo, hi);
    *out = (float)v;
    return -1;
}

static int parse_int(const char *flag, const char *text, long long lo, long long hi, int *out) {
    long long v;
    em_err err = { 0 };
    if (em_parse_int(text, lo, hi, &v, flag, &err)) return em_cli_usage_error(&em_cmd_run, "%s", err.msg);
    *out = (int)v;
    return -1;
}

static int parse_seed(const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end || errno || text[0] == '-' || text[0] == '+')
        return em_cli_usage_error(&em_cmd_run, "--seed: '%s' is not an integer in [0, 2^64)", text);
    *out = v;
    return -1;
}

/* cpu is the only device so far; cuda[:N] is named as not yet available. */
static int check_device(const char *flag, const char *v) {
    if (!strcmp(v, "cpu")) return -1;
    if (!strncmp(v, "cuda", 4) && (v[4] == 0 || v[4] == ':'))
        return not_yet("%s %s: the CUDA backend is not available yet (use cpu)", flag, v);
    return em_cli_usage_error(&em_cmd_run, "%s: '%s' is not cpu or cuda:N", flag, v);
}

/* The flags of features still to come: checked for a well-formed value, then refused. */
static int check_future_flag(const char *a, const char *v) {
    if (!strcmp(a, "--draft")) {
        if (!strcmp(v, "none")) return -1;
        return not_yet("--draft %s: speculative decoding with a drafter is not available yet (issue 6); use --draft none", v);
    }
    if (!strcmp(a, "--device") || !strcmp(a, "--draft-device")) return check_device(a, v);
    if (!strcmp(a, "--moe-storage")) {
        if (!strcmp(v, "resident") || !strcmp(v, "auto")) return -1;
        if (!strcmp(v, "ssd")) return not_yet("--moe-storage ssd: streaming experts from SSD is not available yet (use resident or auto)");
        return em_cli_usage_error(&em_cmd_run, "--moe-storage: '%s' is not resident, ssd or auto", v);
    }
    if (!strcmp(a, "--expert-cache")) {
        uint64_t bytes;
        em_err err = { 0 };
        if (em_parse_size(v, &bytes, &err)) return em_cli_usage_error(&em_cmd_run, "--expert-cache: %s", err.msg);
        return not_yet("--expert-cache %s: the expert cache is not available yet (every expert is resident)", v);
    }
    return not_yet("--feature-dtype %s: drafter features are not available yet (there is no drafter)", v); /* --feature-dtype */
}

static bool takes_value(const char *a) {
    static const char *const flags[] = {
        "-m", "--model", "-p", "--prompt", "-f", "--file", "-n", "--n-predict", "--temp", "--top-k",
        "--top-p", "--min-p", "--seed", "--threads", "-c", "--ctx-size", "--draft", "--device",
        "--draft-device", "--moe-storage", "--expert-cache", "--verify-width", "--feature-dtype",
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(a, flags[i])) return true;
    return false;
}

/* Returns -1 when the run should go on, else the exit status. */
static int parse_value_flag(const char *a, const char *v, run_opts *o) {
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
    else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->file = v;
    else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) return parse_int(a, v, 1, 1 << 24, &o->n_max);
    else if (!strcmp(a, "--temp")) return parse_float(a, v, 0, 1e6, &o->sampling.temperature);
    else if (!strcmp(a, "--top-k")) return parse_int(a, v, 0, INT32_MAX, &o->sampling.top_k);
    else if (!strcmp(a, "--top-p")) return parse_float(a, v, 0, 1, &o->sampling.top_p);
    else if (!strcmp(a, "--min-p")) return parse_float(a, v, 0, 1, &o->sampling.min_p);
    else if (!strcmp(a, "--seed")) return parse_seed(v, &o->sampling.seed);
    else if (!strcmp(a, "--threads")) return parse_int(a, v, 1, 1024, &o->n_threads);
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) return parse_int(a, v, 1, 1 << 24, &o->n_ctx);
    else if (!strcmp(a, "--verify-width")) {
        int rc = parse_int(a, v, 0, 1 << 16, &o->verify_width);
        if (rc < 0 && o->verify_width > 1)
            return not_yet("--verify-width %d: verifying more than one row is not available yet (it needs a drafter, issue 6)", o->verify_width);
        return rc;
    } else return check_future_flag(a, v);
    return -1;
}

static int parse_args(int argc, char **argv, run_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--chat")) o->chat = true;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (takes_value(a)) {
            if (i + 1 >= argc) return em_cli_usage_error(&em_cmd_run, "%s needs a value", a);
            int rc = parse_value_flag(a, argv[++i], o);
            if (rc >= 0) return rc;
        } else if (a[0] == '-') return em_cli_usage_error(&em_cmd_run, "unknown flag '%s'", a);
        else return em_cli_usage_error(&em_cmd_run, "unexpected argument '%s'", a);
    }
    if (!o->model) {
        fprintf(stderr, "ember run: no model given, and there is no default model yet (the shipped default "
                        "model pair is issue 7): pass -m TARGET.gguf\n");
        return EM_EXIT_USAGE;
    }
    if ((o->prompt != NULL) + (o->file != NULL) != 1)
        return em_cli_usage_error(&em_cmd_run, "give exactly one of -p PROMPT, -f FILE");
    return -1;
}

/* ---- the run --------------------------------------------------------------------------- */

/* What the token callback collects. */
typedef struct sink {
    int32_t *tokens;
    size_t n, cap;
    bool wrote, ends_in_newline;
    int rc; /* first failure inside the callback */
    em_err *err;
} sink;

static int on_token(void *ud, int32_t token, const char *bytes, size_t len) {
    sink *k = ud;
    if (len) {
        if (fwrite(bytes, 1, len, stdout) != len || fflush(stdout) != 0) {
            k->rc = em_err_set(k->err, EM_EIO, "writing to standard output failed");
            return 1;
        }
        k->wrote = true;
        k->ends_in_newline = bytes[len - 1] == '\n';
    } else if (fflush(stdout) != 0) {
        k->rc = em_err_set(k->err, EM_EIO, "writing to standard output failed");
        return 1;
    }
    if (token < 0) return 0; /* the stream's final bytes */
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 256;
        int32_t *t = realloc(k->tokens, cap * sizeof *t);
        if (!t) {
            k->rc = em_err_set(k->err, EM_ENOMEM, "out of memory for the generated token list");
            return 1;
        }
        k->tokens = t;
        k->cap = cap;
    }
    k->tokens[k->n++] = token;
    return 0;
}

static int encode_prompt(const em_tok *tok, const run_opts *o, int32_t **ids, size_t *n, em_err *err) {
    char *text = NULL;
    size_t len;
    int rc = EM_OK;
    if (o->file) {
        rc = em_file_read_all(o->file, &text, &len, err);
        if (rc) return rc;
    } else len = strlen(o->prompt);
    const char *src = o->file ? text : o->prompt;
    if (o->chat) {
        if (memchr(src, '\0', len)) rc = em_err_set(err, EM_EINVAL, "--chat: the prompt holds a NUL byte");
        em_chat_msg m = { .role = "user", .content = src };
        if (!rc) rc = em_chat_encode_kimi(tok, &m, 1, true, ids, n, err);
    } else {
        rc = em_tok_encode(tok, src, len, EM_TOK_PARSE_SPECIAL | EM_TOK_ADD_SPECIAL, ids, n, err);
    }
    if (rc && o->file) em_err_prefix(err, "%s", o->file);
    free(text);
    if (!rc && *n == 0) {
        free(*ids);
        rc = em_err_set(err, EM_EINVAL, "the prompt is empty: it encodes to no tokens");
    }
    if (!rc && *n > INT32_MAX) {
        free(*ids);
        rc = em_err_set(err, EM_EINVAL, "the prompt has %zu tokens, too many", *n);
    }
    return rc;
}

static const char *finish_name(enum em_spec_finish f) { return f == EM_SPEC_LENGTH ? "length" : "stop"; }

static double gen_rate(const em_spec_result *r) {
    return r->n_gen > 1 && r->gen_seconds > 0 ? (double)(r->n_gen - 1) / r->gen_seconds : 0.0;
}

static double prompt_rate(const em_spec_result *r) {
    return r->prompt_seconds > 0 ? (double)r->n_prompt / r->prompt_seconds : 0.0;
}

static int print_json(const sink *k, const em_spec_result *r, em_err *err) {
    json_t *tokens = json_array();
    for (size_t i = 0; tokens && i < k->n; i++) json_array_append_new(tokens, json_integer(k->tokens[i]));
    double tau = r->passes ? (double)(r->passes + r->accepted) / (double)r->passes : 0.0;
    json_t *spec = json_pack("{s:I, s:I, s:I, s:f, s:I, s:I, s:I}", "passes", (json_int_t)r->passes, "drafted",
                             (json_int_t)r->drafted, "accepted", (json_int_t)r->accepted, "tau", tau,
                             "fast_commits", (json_int_t)r->fast_commits, "full_replays",
                             (json_int_t)r->full_replays, "failed_fallbacks", (json_int_t)r->failed_fallbacks);
    json_t *experts = json_pack("{s:I, s:I, s:I, s:I}", "bytes_read", (json_int_t)0, "hits", (json_int_t)0,
                                "misses", (json_int_t)0, "cache_bytes", (json_int_t)0);
    json_t *o = tokens && spec && experts
                    ? json_pack("{s:o, s:i, s:i, s:f, s:f, s:s, s:o, s:o}", "tokens", tokens, "n_prompt",
                                r->n_prompt, "n_gen", r->n_gen, "tok_per_s", gen_rate(r), "prompt_tok_per_s",
                                prompt_rate(r), "finish", finish_name(r->finish), "spec", spec, "experts", experts)
                    : NULL;
    if (!o) {
        json_decref(tokens);
        json_decref(spec);
        json_decref(experts);
        return em_err_set(err, EM_ENOMEM, "out of memory for the JSON summary");
    }
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) return em_err_set(err, EM_ENOMEM, "out of memory for the JSON summary");
    printf("%s\n", text);
    free(text);
    return EM_OK;
}

static int open_tokenizer(const char *path, em_tok **tok, em_err *err) {
    em_gguf *g;
    int rc = em_gguf_open(&g, path, err);
    if (rc) return rc;
    rc = em_tok_create(tok, g, NULL, err);
    em_gguf_close(g);
    return rc;
}

static int generate(em_target *t, const em_tok *tok, const run_opts *o, em_err *err) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = encode_prompt(tok, o, &ids, &n_ids, err);
    if (rc) return rc;
    em_spec *s = NULL;
    em_spec_opts so = { .tok = tok, .verify_width = o->verify_width };
    rc = em_spec_create(&s, t, &so, err);
    sink k = { .err = err };
    em_spec_result r = { 0 };
    if (!rc) {
        em_spec_params p = { .sampling = o->sampling, .n_max = o->n_max };
        rc = em_spec_generate(s, ids, (int)n_ids, &p, on_token, &k, &r, err);
        if (!rc) rc = k.rc;
    }
    if (k.wrote && !k.ends_in_newline) putchar('\n');
    fflush(stdout); /* the text before the summary on stderr, when both go to one terminal */
    if (!rc)
        fprintf(stderr, "ember run: prompt %d tokens (%.1f tok/s), generated %d tokens (%.1f tok/s), finish: %s\n",
                r.n_prompt, prompt_rate(&r), r.n_gen, gen_rate(&r), finish_name(r.finish));
    if (!rc && o->json) rc = print_json(&k, &r, err);
    if (!rc && (fflush(stdout) != 0 || ferror(stdout)))
        rc = em_err_set(err, EM_EIO, "writing to standard output failed");
    free(k.tokens);
    em_spec_free(s);
    free(ids);
    return rc;
}

static int run_main(int argc, char **argv) {
    run_opts o = { .n_max = DEFAULT_N_PREDICT, .sampling = em_sampler_default_params() };
    int usage = parse_args(argc, argv, &o);
    if (usage >= 0) return usage;
    em_err err = { 0 };
    em_tok *tok = NULL;
    if (open_tokenizer(o.model, &tok, &err)) return em_cli_fail(&em_cmd_run, &err);
    em_target *t = NULL;
    em_model_opts mo = { .n_threads = o.n_threads, .n_ctx = o.n_ctx };
    int rc = em_model_open(&t, o.model, &mo, &err);
    if (!rc) rc = generate(t, tok, &o, &err);
    em_target_close(t);
    em_tok_free(tok);
    return rc ? em_cli_fail(&em_cmd_run, &err) : EM_EXIT_OK;
}

const em_cmd em_cmd_run = {
    .name = "run",
    .summary = "generate text from a prompt (streamed; --json for the token ids and statistics)",
    .usage = run_usage,
    .main = run_main,
};
