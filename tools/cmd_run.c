/* `ember run [-m TARGET.gguf] [-p PROMPT | -f FILE] [-n N] [--chat] [--json] ...` (without -m: the
 * default pair shipped in models/, tools/model_flags.h): generates text
 * with the one decode loop (decode/), streaming it to stdout as it comes, a summary line on
 * stderr, and with --json one JSON object on the last line of stdout (docs/ARCHITECTURE.md).
 * With --draft the loop speculates (DSpark/DFlash drafter; --json adds its statistics). Flags
 * of features that do not exist yet (CUDA devices) are refused with exit 2, never ignored. Owns only argument handling and
 * output; the loop, the model and the tokenizer are the library's. */
#include "cli.h"
#include "model_flags.h"
#include "spec_memory.h"

#include "format/gguf.h"
#include "model/model.h"
#include "decode/decode.h"
#include "text/text.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char run_usage[] =
    "usage: ember run [-m TARGET.gguf] [-p PROMPT | -f FILE] [flags]\n"
    "\n"
    "Without -m it runs the default pair shipped in models/ (a small Kimi-Linear target and its\n"
    "DSpark drafter: speculative decoding; --draft none decodes plainly).\n"
    "Generates text after PROMPT and streams it to stdout; a summary (tokens, tok/s of the\n"
    "prompt and of generation) goes to stderr. Generation ends at an end-of-generation token\n"
    "(\"finish\": \"stop\"), after N tokens or when the context is full (\"length\"). With a\n"
    "drafter, a second summary line: target passes, drafts accepted of drafted, tokens per pass.\n"
    "\n"
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
    "      --json             after the text, one JSON object on the last line of stdout:\n"
    "                         tokens, n_prompt, n_gen, tok_per_s, prompt_tok_per_s, finish,\n"
    "                         spec {passes, drafted, accepted, tau, fast_commits, full_replays,\n"
    "                         failed_fallbacks, accept_hist, mean_verify_width, draft_seconds,\n"
    "                         target_seconds (verify and commit), plain_passes},\n"
    "                         experts {bytes_read, read_seconds (waiting for them), hits, misses,\n"
    "                         prefetched, prefetch_used (experts read ahead; of them used),\n"
    "                         cache_bytes, gen_bytes_read, gen_bytes_per_token: read from\n"
    "                         storage after the prompt, and that over the tokens the passes\n"
    "                         committed}, device and draft_device (where the target and the\n"
    "                         drafter ran; draft_device null without a drafter)\n"
    EM_MODEL_FLAGS_USAGE
    "      --spec-memory F    with a drafter and --spec-policy auto: where what the governor\n"
    "                         learnt (whether speculation pays on this machine) is kept between\n"
    "                         runs of the same setup, so a run does not probe afresh; off: not\n"
    "                         kept (default: $XDG_CACHE_HOME/ember/spec-memory, else\n"
    "                         ~/.cache/ember/spec-memory)\n"
    "\n"
    "tok/s of generation counts the tokens after the first (which comes from the prompt's pass)\n"
    "over the time after the prompt.\n";

#define DEFAULT_N_PREDICT 256

typedef struct run_opts {
    em_model_flags mf;
    const char *prompt, *file;
    int n_max;
    bool chat, json;
    em_sampler_params sampling;
    const char *spec_memory; /* --spec-memory: a file, "off", or NULL (the default file) */
} run_opts;

/* ---- arguments ------------------------------------------------------------------------- */

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

static bool takes_value(const char *a) {
    static const char *const flags[] = {
        "-p", "--prompt", "-f", "--file", "-n", "--n-predict", "--temp", "--top-k", "--top-p",
        "--min-p", "--seed", "--spec-memory",
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(a, flags[i])) return true;
    return em_model_flag(a);
}

/* Returns -1 when the run should go on, else the exit status. */
static int parse_value_flag(const char *a, const char *v, run_opts *o) {
    if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
    else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->file = v;
    else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) return parse_int(a, v, 1, 1 << 24, &o->n_max);
    else if (!strcmp(a, "--temp")) return parse_float(a, v, 0, 1e6, &o->sampling.temperature);
    else if (!strcmp(a, "--top-k")) return parse_int(a, v, 0, INT32_MAX, &o->sampling.top_k);
    else if (!strcmp(a, "--top-p")) return parse_float(a, v, 0, 1, &o->sampling.top_p);
    else if (!strcmp(a, "--min-p")) return parse_float(a, v, 0, 1, &o->sampling.min_p);
    else if (!strcmp(a, "--seed")) return parse_seed(v, &o->sampling.seed);
    else if (!strcmp(a, "--spec-memory")) o->spec_memory = v;
    else return em_model_flag_parse(&em_cmd_run, a, v, &o->mf);
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
    int rc = em_model_flags_need_model(&em_cmd_run, &o->mf);
    if (rc >= 0) return rc;
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

static const char *finish_name(enum em_decode_finish f) { return f == EM_DECODE_LENGTH ? "length" : "stop"; }

static double gen_rate(const em_decode_result *r) {
    return r->n_gen > 1 && r->gen_seconds > 0 ? (double)(r->n_gen - 1) / r->gen_seconds : 0.0;
}

static double prompt_rate(const em_decode_result *r) {
    return r->prompt_seconds > 0 ? (double)r->n_prompt / r->prompt_seconds : 0.0;
}

/* The speculation statistics: tau is the mean of tokens committed per target pass (the
 * accepted drafts plus the target's own token); accept_hist[i] counts passes that accepted i
 * drafts (up to the widest verify). */
static json_t *spec_json(const em_decode_result *r) {
    double tau = r->passes ? (double)(r->passes + r->accepted) / (double)r->passes : 0.0;
    int top = 0;
    for (int i = 0; i < EM_DECODE_MAX_WIDTH; i++)
        if (r->accept_hist[i]) top = i;
    json_t *hist = json_array();
    for (int i = 0; hist && i <= top; i++) json_array_append_new(hist, json_integer((json_int_t)r->accept_hist[i]));
    if (!hist) return NULL;
    return json_pack("{s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:o, s:f, s:f, s:f, s:I}", "passes", (json_int_t)r->passes,
                     "drafted", (json_int_t)r->drafted, "accepted", (json_int_t)r->accepted, "tau", tau,
                     "fast_commits", (json_int_t)r->fast_commits, "full_replays", (json_int_t)r->full_replays,
                     "failed_fallbacks", (json_int_t)r->failed_fallbacks, "accept_hist", hist, "mean_verify_width",
                     r->mean_verify_width, "draft_seconds", r->draft_seconds, "target_seconds",
                     r->target_seconds, "plain_passes", (json_int_t)r->plain_passes);
}

static int print_json(const sink *k, const em_decode_result *r, const em_target *t, const em_drafter *d, em_err *err) {
    json_t *tokens = json_array();
    for (size_t i = 0; tokens && i < k->n; i++) json_array_append_new(tokens, json_integer(k->tokens[i]));
    json_t *spec = spec_json(r);
    em_target_expert_counts xc;
    int rc = em_target_expert_stats(t, -1, &xc, err);
    if (rc) return rc;
    /* bytes a committed token cost: what generation read over the rows it committed */
    const uint64_t committed = r->passes + r->accepted;
    json_t *experts = json_pack("{s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "bytes_read",
                                (json_int_t)xc.bytes_read, "read_seconds", xc.read_seconds, "hits",
                                (json_int_t)xc.hits, "misses", (json_int_t)xc.misses, "prefetched",
                                (json_int_t)xc.prefetched, "prefetch_used", (json_int_t)xc.prefetch_used,
                                "cache_bytes",
                                (json_int_t)xc.cache_bytes, "gen_bytes_read", (json_int_t)r->gen_bytes_read,
                                "gen_bytes_per_token", committed ? (double)r->gen_bytes_read / (double)committed : 0.0);
    json_t *o = tokens && spec && experts
                    ? json_pack("{s:o, s:i, s:i, s:f, s:f, s:s, s:o, s:o, s:s, s:o}", "tokens", tokens, "n_prompt",
                                r->n_prompt, "n_gen", r->n_gen, "tok_per_s", gen_rate(r), "prompt_tok_per_s",
                                prompt_rate(r), "finish", finish_name(r->finish), "spec", spec, "experts", experts,
                                "device", em_target_get_info(t)->device, "draft_device",
                                d ? json_string(em_draft_get_info(d)->device) : json_null())
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

/* The tokenizer needs only metadata: a file cut short (an unfinished download) still opens
 * here, and the model's open then says what is missing. */
static int open_tokenizer(const char *path, em_tok **tok, em_err *err) {
    em_gguf *g;
    int rc = em_gguf_open_ex(&g, path, &(em_gguf_open_opts){ .allow_missing_data = true }, err);
    if (rc) return rc;
    rc = em_tok_create(tok, g, NULL, err);
    em_gguf_close(g);
    return rc;
}

/* The governor's memory for this setup: its file and key (false: none, --spec-memory off). */
static bool memory_file(const run_opts *o, char *path, size_t cap, char key[65]) {
    if (o->spec_memory && !strcmp(o->spec_memory, "off")) return false;
    if (o->spec_memory) {
        if (snprintf(path, cap, "%s", o->spec_memory) >= (int)cap) return false;
    } else if (!em_spec_memory_default(path, cap)) {
        return false;
    }
    em_err err = { 0 };
    if (em_spec_memory_key(&o->mf, key, &err)) {
        em_log(EM_LOG_WARN, "spec memory not used: %s", err.msg);
        return false;
    }
    return true;
}

static int generate(em_target *t, em_drafter *d, const em_tok *tok, const run_opts *o, em_err *err) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = encode_prompt(tok, o, &ids, &n_ids, err);
    if (rc) return rc;
    em_decode *s = NULL;
    em_decode_opts so = em_model_flags_decode_opts(&o->mf, tok, d);
    rc = em_decode_create(&s, t, &so, err);
    sink k = { .err = err };
    em_decode_result r = { 0 };
    char mem[4096], key[65];
    const bool remember = !rc && d && so.spec_policy == EM_DECODE_SPEC_TIMED && memory_file(o, mem, sizeof mem, key);
    if (remember) em_spec_memory_load(mem, key, s);
    if (!rc) {
        em_decode_params p = { .sampling = o->sampling, .n_max = o->n_max };
        rc = em_decode_generate(s, ids, (int)n_ids, &p, on_token, &k, &r, err);
        if (!rc && remember) em_spec_memory_save(mem, key, s);
        /* the engine's own failure (say, logits that are all NaN: broken weights) names the model */
        if (rc && !k.rc) em_err_prefix(err, "%s: generation failed", o->mf.model);
        if (!rc) rc = k.rc;
    }
    if (k.wrote && !k.ends_in_newline) putchar('\n');
    fflush(stdout); /* the text before the summary on stderr, when both go to one terminal */
    if (!rc)
        fprintf(stderr, "ember run: prompt %d tokens (%.1f tok/s), generated %d tokens (%.1f tok/s), finish: %s\n",
                r.n_prompt, prompt_rate(&r), r.n_gen, gen_rate(&r), finish_name(r.finish));
    if (!rc && d)
        fprintf(stderr, "ember run: speculative: %llu passes, %llu of %llu drafts accepted, %.2f tokens per pass, "
                "mean verify width %.2f, drafter %.3f s, %llu passes plain (speculation did not pay)\n",
                (unsigned long long)r.passes, (unsigned long long)r.accepted, (unsigned long long)r.drafted,
                r.passes ? (double)(r.passes + r.accepted) / (double)r.passes : 0.0, r.mean_verify_width,
                r.draft_seconds, (unsigned long long)r.plain_passes);
    if (!rc && o->json) rc = print_json(&k, &r, t, d, err);
    if (!rc && (fflush(stdout) != 0 || ferror(stdout)))
        rc = em_err_set(err, EM_EIO, "writing to standard output failed");
    free(k.tokens);
    em_decode_free(s);
    free(ids);
    return rc;
}

static int run_main(int argc, char **argv) {
    run_opts o = { .n_max = DEFAULT_N_PREDICT, .sampling = em_sampler_default_params() };
    int usage = parse_args(argc, argv, &o);
    if (usage >= 0) return usage;
    em_err err = { 0 };
    em_tok *tok = NULL;
    if (open_tokenizer(o.mf.model, &tok, &err)) return em_cli_fail(&em_cmd_run, &err);
    em_target *t = NULL;
    em_drafter *d = NULL;
    int rc = em_model_flags_open(&o.mf, &t, &d, &err);
    if (!rc) rc = generate(t, d, tok, &o, &err);
    em_draft_close(d); /* before the target it borrows from */
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
