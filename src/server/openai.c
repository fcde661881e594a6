/* server/openai.c: OpenAI's JSON (through jansson). Parses and validates generation requests
 * (chat: messages rendered with Kimi's chat format; completions: prompt as text or token ids)
 * into token ids and sampling parameters, and builds the response objects: whole responses,
 * streamed chunks, usage and llama-server's timings, errors, /tokenize and /detokenize.
 *
 * Invariants: every field a request gives is type- and range-checked (null counts as absent);
 * a bad field is a 4xx error naming it, never a crash; unknown fields are ignored (as OpenAI
 * and llama-server do). Strings put into responses are valid UTF-8 (invalid bytes become
 * U+FFFD). Must not: touch sockets or the model (only the tokenizer, which is thread-safe). */
#include "server/server_impl.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"
#define FINGERPRINT "ember"
#define JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* ---- errors -------------------------------------------------------------------------- */

int em_srv_fail(em_srv_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* n bytes of s as a new string where every byte that is not part of valid UTF-8 is U+FFFD. */
static char *utf8_repair(const char *s, size_t n, size_t *out_len) {
    if (n > (SIZE_MAX - 1) / 3) return NULL;
    char *out = malloc(3 * n + 1), *w = out;
    if (!out) return NULL;
    while (n) {
        size_t ok = em_utf8_valid_prefix(s, n);
        memcpy(w, s, ok);
        w += ok, s += ok, n -= ok;
        if (n) {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3, s++, n--;
        }
    }
    *w = 0;
    *out_len = (size_t)(w - out);
    return out;
}

/* A JSON string of s[0..n), repaired when it is not valid UTF-8; NULL when memory runs out. */
static json_t *jstr(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    if (v || !s) return v;
    size_t m;
    char *fixed = utf8_repair(s, n, &m);
    if (!fixed) return NULL;
    v = json_stringn(fixed, m);
    free(fixed);
    return v;
}

static char *dump(json_t *o) {
    char *text = o ? json_dumps(o, JSON_FLAGS) : NULL;
    json_decref(o);
    return text;
}

char *em_srv_error_json(const em_srv_error *e) {
    json_t *err = json_object();
    if (!err) return NULL;
    json_object_set_new(err, "message", jstr(e->message, strlen(e->message)));
    json_object_set_new(err, "type", json_string(e->type ? e->type : "server_error"));
    json_object_set_new(err, "param", e->param[0] ? jstr(e->param, strlen(e->param)) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    return dump(json_pack("{s:o}", "error", err));
}

/* ---- reading fields ------------------------------------------------------------------ */

/* Bodies nested deeper than EM_SRV_MAX_DEPTH are refused before jansson sees them (its
 * parser recurses once per level). */
static bool depth_ok(const char *s, size_t n) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false;
        } else if (c == '"') in_string = true;
        else if (c == '[' || c == '{') {
            if (++depth > EM_SRV_MAX_DEPTH) return false;
        } else if (c == ']' || c == '}') depth--;
    }
    return true;
}

static json_t *load_object(const char *body, size_t len, em_srv_error *e) {
    if (!depth_ok(body, len)) {
        em_srv_fail(e, 400, INVALID, NULL, "the request body nests deeper than %d levels", EM_SRV_MAX_DEPTH);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root) {
        em_srv_fail(e, 400, INVALID, NULL, "the request body is not valid JSON (line %d, column %d): %s", je.line,
                    je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        em_srv_fail(e, 400, INVALID, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* The value of key; NULL when absent or null (optional fields may be sent as null). */
static json_t *field(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int get_bool(const json_t *o, const char *key, bool *out, em_srv_error *e) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return em_srv_fail(e, 400, INVALID, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* An integer (or a number with an integral value) in [lo, hi]; *present says whether given. */
static int get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, bool *present,
                   em_srv_error *e) {
    json_t *v = field(o, key);
    if (present) *present = v != NULL;
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e18)
        x = (long long)json_real_value(v);
    else return em_srv_fail(e, 400, INVALID, key, "'%s' must be an integer", key);
    if (x < lo || x > hi)
        return em_srv_fail(e, 400, INVALID, key, "'%s' is %lld; it must be between %lld and %lld", key, x, lo, hi);
    *out = x;
    return 0;
}

static int get_number(const json_t *o, const char *key, double lo, double hi, double *out, em_srv_error *e) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return em_srv_fail(e, 400, INVALID, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return em_srv_fail(e, 400, INVALID, key, "'%s' is %g; it must be between %g and %g", key, x, lo, hi);
    *out = x;
    return 0;
}

/* ---- the fields both kinds share -------------------------------------------------------- */

/* Any model name is served: a one-model server answers whatever a client calls it (as
 * llama-server does; many clients send a fixed name such as "gpt-4o-mini"). Responses name
 * the served model (the id /v1/models lists), not the one asked for. Absent is fine too. */
static int check_model(const json_t *root, em_srv_error *e) {
    json_t *v = field(root, "model");
    if (v && !json_is_string(v)) return em_srv_fail(e, 400, INVALID, "model", "'model' must be a string");
    return 0;
}

static int parse_stop(const json_t *root, em_srv_req *r, em_srv_error *e) {
    json_t *v = field(root, "stop");
    if (!v) return 0;
    json_t *single = json_is_string(v) ? v : NULL;
    if (!single && !json_is_array(v))
        return em_srv_fail(e, 400, INVALID, "stop", "'stop' must be a string or an array of strings");
    size_t n = single ? 1 : json_array_size(v);
    if (n > EM_SRV_MAX_STOP)
        return em_srv_fail(e, 400, INVALID, "stop", "'stop' has %zu strings; at most %d are supported", n,
                           EM_SRV_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *s = single ? single : json_array_get(v, i);
        if (!json_is_string(s))
            return em_srv_fail(e, 400, INVALID, "stop", "'stop' must be a string or an array of strings");
        size_t len = json_string_length(s);
        if (len > EM_SRV_MAX_STOP_LEN)
            return em_srv_fail(e, 400, INVALID, "stop", "a stop string has %zu bytes; at most %d are supported", len,
                               EM_SRV_MAX_STOP_LEN);
        if (len == 0) continue; /* an empty stop string would end every generation at once */
        char *copy = malloc(len + 1);
        if (!copy) return em_srv_fail(e, 500, "server_error", NULL, "out of memory");
        memcpy(copy, json_string_value(s), len + 1);
        r->stop[r->n_stop++] = copy;
    }
    return 0;
}

/* Fields that ask for something the server does not do: an error rather than a silent
 * difference. */
static int refuse_unsupported(const json_t *root, int kind, em_srv_error *e) {
    long long n = 1;
    if (get_int(root, "n", 1, INT_MAX, &n, NULL, e)) return -1;
    if (n != 1)
        return em_srv_fail(e, 400, INVALID, "n", "'n' is %lld; only one choice per request is supported", n);
    json_t *lp = field(root, "logprobs");
    if (lp && !json_is_boolean(lp) && !json_is_integer(lp))
        return em_srv_fail(e, 400, INVALID, "logprobs", "'logprobs' must be a boolean or an integer");
    if (lp && (json_is_true(lp) || (json_is_integer(lp) && json_integer_value(lp) > 0)))
        return em_srv_fail(e, 400, INVALID, "logprobs", "'logprobs' are not supported");
    long long top = 0;
    if (get_int(root, "top_logprobs", 0, 20, &top, NULL, e)) return -1;
    if (top > 0) return em_srv_fail(e, 400, INVALID, "top_logprobs", "'top_logprobs' are not supported");
    json_t *tools = field(root, "tools");
    if (tools && (!json_is_array(tools) || json_array_size(tools) > 0))
        return em_srv_fail(e, 400, INVALID, "tools", "'tools' are not supported");
    json_t *fmt = field(root, "response_format");
    if (fmt) {
        json_t *type = json_is_object(fmt) ? json_object_get(fmt, "type") : NULL;
        if (!json_is_string(type))
            return em_srv_fail(e, 400, INVALID, "response_format", "'response_format' must be an object with a 'type'");
        if (strcmp(json_string_value(type), "text"))
            return em_srv_fail(e, 400, INVALID, "response_format", "'response_format' '%.40s' is not supported (only 'text')",
                               json_string_value(type));
    }
    if (kind == EM_SRV_COMPLETION) {
        bool echo = false;
        if (get_bool(root, "echo", &echo, e)) return -1;
        if (echo) return em_srv_fail(e, 400, INVALID, "echo", "'echo' is not supported");
        long long best_of = 1;
        if (get_int(root, "best_of", 1, INT_MAX, &best_of, NULL, e)) return -1;
        if (best_of != 1) return em_srv_fail(e, 400, INVALID, "best_of", "'best_of' other than 1 is not supported");
        json_t *suffix = field(root, "suffix");
        if (suffix && !json_is_string(suffix))
            return em_srv_fail(e, 400, INVALID, "suffix", "'suffix' must be a string");
        if (suffix && json_string_length(suffix) > 0)
            return em_srv_fail(e, 400, INVALID, "suffix", "'suffix' is not supported");
    }
    return 0;
}

static int parse_sampling(const json_t *root, uint64_t seed, em_sampler_params *sp, em_srv_error *e) {
    *sp = em_sampler_default_params(); /* llama-server's defaults */
    sp->seed = seed;
    double temp = sp->temperature, top_p = sp->top_p, min_p = sp->min_p, ignored;
    long long top_k = sp->top_k, s;
    bool has_seed;
    if (get_number(root, "temperature", 0, 2, &temp, e) || get_number(root, "top_p", 0, 1, &top_p, e) ||
        get_number(root, "min_p", 0, 1, &min_p, e) || get_int(root, "top_k", 0, INT32_MAX, &top_k, NULL, e) ||
        get_int(root, "seed", LLONG_MIN, LLONG_MAX, &s, &has_seed, e) ||
        get_number(root, "presence_penalty", -2, 2, &ignored, e) ||
        get_number(root, "frequency_penalty", -2, 2, &ignored, e))
        return -1;
    sp->temperature = (float)temp;
    sp->top_p = (float)top_p;
    sp->min_p = (float)min_p;
    sp->top_k = (int32_t)top_k;
    if (has_seed) sp->seed = (uint64_t)s;
    return 0;
}

/* max_completion_tokens (OpenAI's current name) or max_tokens: 1 .. n_ctx; 0 when absent. */
static int parse_max_tokens(const json_t *root, int n_ctx, long long *out, em_srv_error *e) {
    const char *key = field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    bool present;
    long long v = 0;
    if (get_int(root, key, LLONG_MIN, LLONG_MAX, &v, &present, e)) return -1;
    if (!present) {
        *out = 0;
        return 0;
    }
    if (v < 1) return em_srv_fail(e, 400, INVALID, key, "'%s' is %lld; it must be at least 1", key, v);
    if (v > n_ctx)
        return em_srv_fail(e, 400, INVALID, key,
                           "'%s' is %lld, more than the %d positions of this server's context (--ctx-size)", key, v,
                           n_ctx);
    *out = v;
    return 0;
}

/* ---- prompts ------------------------------------------------------------------------- */

/* The text of a message's content: a string, or OpenAI's list of parts, whose text parts
 * are joined with newlines. *owned is set when the text had to be assembled (free()). */
static int message_content(const json_t *content, size_t i, const char **text, char **owned, em_srv_error *e) {
    *owned = NULL;
    if (!content) {
        *text = "";
        return 0;
    }
    if (json_is_string(content)) {
        *text = json_string_value(content);
        return 0;
    }
    if (!json_is_array(content))
        return em_srv_fail(e, 400, INVALID, "messages", "messages[%zu].content must be a string or an array of parts", i);
    size_t total = 1;
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *part = json_array_get(content, k);
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        json_t *t = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!json_is_string(type))
            return em_srv_fail(e, 400, INVALID, "messages", "messages[%zu].content[%zu] must be an object with a 'type'",
                               i, k);
        if (strcmp(json_string_value(type), "text"))
            return em_srv_fail(e, 400, INVALID, "messages",
                               "messages[%zu].content[%zu]: parts of type '%.40s' are not supported (only text)", i, k,
                               json_string_value(type));
        if (!json_is_string(t))
            return em_srv_fail(e, 400, INVALID, "messages", "messages[%zu].content[%zu].text must be a string", i, k);
        total += json_string_length(t) + 1;
    }
    char *buf = malloc(total), *w = buf;
    if (!buf) return em_srv_fail(e, 500, "server_error", NULL, "out of memory");
    for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *t = json_object_get(json_array_get(content, k), "text");
        if (k) *w++ = '\n';
        memcpy(w, json_string_value(t), json_string_length(t));
        w += json_string_length(t);
    }
    *w = 0;
    *text = *owned = buf;
    return 0;
}

/* Kimi's chat format knows these roles; OpenAI's "developer" is its system role. */
static const char *chat_role(const char *role) {
    if (!strcmp(role, "system") || !strcmp(role, "developer")) return "system";
    if (!strcmp(role, "user")) return "user";
    if (!strcmp(role, "assistant")) return "assistant";
    return NULL;
}

#define MAX_MESSAGES 65536

static int chat_prompt(const em_srv_model_ctx *m, const json_t *root, int32_t **ids, size_t *n_ids,
                       em_srv_error *e) {
    json_t *msgs = field(root, "messages");
    if (!msgs) return em_srv_fail(e, 400, INVALID, "messages", "'messages' is required");
    if (!json_is_array(msgs)) return em_srv_fail(e, 400, INVALID, "messages", "'messages' must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return em_srv_fail(e, 400, INVALID, "messages", "'messages' must not be empty");
    if (n > MAX_MESSAGES) return em_srv_fail(e, 400, INVALID, "messages", "'messages' has more than %d entries", MAX_MESSAGES);
    em_chat_msg *cm = calloc(n, sizeof *cm);
    char **owned = calloc(n, sizeof *owned);
    int rc = cm && owned ? 0 : em_srv_fail(e, 500, "server_error", NULL, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *msg = json_array_get(msgs, i);
        json_t *role = json_is_object(msg) ? json_object_get(msg, "role") : NULL;
        json_t *name = json_is_object(msg) ? field(msg, "name") : NULL;
        if (!json_is_object(msg)) rc = em_srv_fail(e, 400, INVALID, "messages", "messages[%zu] must be an object", i);
        else if (!json_is_string(role))
            rc = em_srv_fail(e, 400, INVALID, "messages", "messages[%zu].role must be a string", i);
        else if (!(cm[i].role = chat_role(json_string_value(role))))
            rc = em_srv_fail(e, 400, INVALID, "messages",
                             "messages[%zu].role '%.40s' is not supported (system, user, assistant or developer)", i,
                             json_string_value(role));
        else if (name && !json_is_string(name))
            rc = em_srv_fail(e, 400, INVALID, "messages", "messages[%zu].name must be a string", i);
        else rc = message_content(field(msg, "content"), i, &cm[i].content, &owned[i], e);
        if (!rc && name && json_string_length(name) > 0) cm[i].name = json_string_value(name);
    }
    if (!rc) {
        em_err err = { 0 };
        if (em_chat_encode_kimi(m->tok, cm, n, true, ids, n_ids, &err))
            rc = em_srv_fail(e, err.code == EM_ENOMEM ? 500 : 400, err.code == EM_ENOMEM ? "server_error" : INVALID,
                             "messages", "%s", err.msg);
    }
    for (size_t i = 0; owned && i < n; i++) free(owned[i]);
    free(owned);
    free(cm);
    return rc;
}

/* Token ids given directly: each must be in the vocabulary. */
static int id_list(const em_srv_model_ctx *m, const json_t *arr, const char *what, int32_t **ids, size_t *n_ids,
                   em_srv_error *e) {
    size_t n = json_array_size(arr);
    int32_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return em_srv_fail(e, 500, "server_error", NULL, "out of memory");
    int32_t n_vocab = em_tok_n_vocab(m->tok);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= n_vocab) {
            free(v);
            return em_srv_fail(e, 400, INVALID, what, "'%s'[%zu] is not a token id in [0, %d)", what, i, n_vocab);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    *ids = v;
    *n_ids = n;
    return 0;
}

static int encode_text(const em_srv_model_ctx *m, const json_t *s, unsigned flags, const char *what, int32_t **ids,
                       size_t *n_ids, em_srv_error *e) {
    em_err err = { 0 };
    if (em_tok_encode(m->tok, json_string_value(s), json_string_length(s), flags, ids, n_ids, &err))
        return em_srv_fail(e, err.code == EM_ENOMEM ? 500 : 400, err.code == EM_ENOMEM ? "server_error" : INVALID,
                           what, "%s", err.msg);
    return 0;
}

/* prompt: a string, token ids, or a list holding one of those (several prompts per request
 * are refused like n > 1). Text is encoded as `ember run -p` does: specials parsed, BOS/EOS
 * as the model asks. */
static int completion_prompt(const em_srv_model_ctx *m, const json_t *root, int32_t **ids, size_t *n_ids,
                             em_srv_error *e) {
    const unsigned flags = EM_TOK_PARSE_SPECIAL | EM_TOK_ADD_SPECIAL;
    json_t *p = field(root, "prompt");
    if (!p) return em_srv_fail(e, 400, INVALID, "prompt", "'prompt' is required");
    if (json_is_string(p)) return encode_text(m, p, flags, "prompt", ids, n_ids, e);
    if (!json_is_array(p))
        return em_srv_fail(e, 400, INVALID, "prompt", "'prompt' must be a string, an array of token ids or a list of one prompt");
    json_t *first = json_array_get(p, 0);
    if (!first || json_is_integer(first)) return id_list(m, p, "prompt", ids, n_ids, e);
    if (json_array_size(p) > 1)
        return em_srv_fail(e, 400, INVALID, "prompt", "several prompts in one request are not supported; send one per request");
    if (json_is_string(first)) return encode_text(m, first, flags, "prompt", ids, n_ids, e);
    if (json_is_array(first)) return id_list(m, first, "prompt", ids, n_ids, e);
    return em_srv_fail(e, 400, INVALID, "prompt", "'prompt' must be a string, an array of token ids or a list of one prompt");
}

/* ---- generation requests ---------------------------------------------------------------- */

void em_srv_req_free(em_srv_req *r) {
    if (!r) return;
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

static int parse_fields(const em_srv_model_ctx *m, const json_t *root, int kind, uint64_t seed, em_srv_req *r,
                        long long *max_tokens, em_srv_error *e) {
    if (check_model(root, e) || refuse_unsupported(root, kind, e)) return -1;
    if (get_bool(root, "stream", &r->stream, e) || get_bool(root, "ignore_eos", &r->ignore_eos, e) ||
        get_bool(root, "return_tokens", &r->return_tokens, e))
        return -1;
    json_t *so = field(root, "stream_options");
    if (so && !json_is_object(so))
        return em_srv_fail(e, 400, INVALID, "stream_options", "'stream_options' must be an object");
    if (so && get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    if (!r->stream) r->include_usage = false;
    return parse_sampling(root, seed, &r->sampling, e) || parse_max_tokens(root, m->n_ctx, max_tokens, e) ||
                   parse_stop(root, r, e)
               ? -1
               : 0;
}

int em_srv_parse_generate(const em_srv_model_ctx *m, int kind, const char *body, size_t len, uint64_t seed,
                          em_srv_req *out, em_srv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    json_t *root = load_object(body, len, e);
    if (!root) return -1;
    long long max_tokens = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = parse_fields(m, root, kind, seed, out, &max_tokens, e);
    if (!rc)
        rc = kind == EM_SRV_CHAT ? chat_prompt(m, root, &ids, &n_ids, e) : completion_prompt(m, root, &ids, &n_ids, e);
    json_decref(root);
    if (!rc && n_ids == 0)
        rc = em_srv_fail(e, 400, INVALID, kind == EM_SRV_CHAT ? "messages" : "prompt", "the prompt is empty (no tokens)");
    if (!rc && n_ids >= (size_t)m->n_ctx) {
        rc = em_srv_fail(e, 400, INVALID, kind == EM_SRV_CHAT ? "messages" : "prompt",
                         "the prompt has %zu tokens; this server's context holds %d positions, and at least one "
                         "must stay free for the reply",
                         n_ids, m->n_ctx);
        e->code = "context_length_exceeded";
    }
    if (rc) {
        free(ids);
        em_srv_req_free(out);
        out->kind = kind;
        return -1;
    }
    out->prompt = ids;
    out->n_prompt = (int)n_ids;
    int room = m->n_ctx - out->n_prompt;
    out->n_max = max_tokens > 0 && max_tokens < room ? (int)max_tokens : room;
    return 0;
}

/* ---- /tokenize and /detokenize ------------------------------------------------------------ */

/* A piece as llama-server gives it: a string when it is valid UTF-8, else its bytes. */
static json_t *piece_json(const char *p, size_t n) {
    if (em_utf8_valid_prefix(p, n) == n) return json_stringn(p, n);
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

char *em_srv_tokenize(const em_srv_model_ctx *m, const char *body, size_t len, em_srv_error *e) {
    json_t *root = load_object(body, len, e);
    if (!root) return NULL;
    bool add_special = false, parse_special = true, with_pieces = false;
    json_t *content = field(root, "content");
    int rc = get_bool(root, "add_special", &add_special, e) || get_bool(root, "parse_special", &parse_special, e) ||
                     get_bool(root, "with_pieces", &with_pieces, e)
                 ? -1
                 : 0;
    if (!rc && !json_is_string(content))
        rc = em_srv_fail(e, 400, INVALID, "content", "'content' must be a string");
    int32_t *ids = NULL;
    size_t n = 0;
    unsigned flags = (add_special ? EM_TOK_ADD_SPECIAL : 0) | (parse_special ? EM_TOK_PARSE_SPECIAL : 0);
    if (!rc) rc = encode_text(m, content, flags, "content", &ids, &n, e);
    json_decref(root);
    if (rc) return NULL;
    json_t *tokens = json_array();
    for (size_t i = 0; tokens && i < n; i++) {
        if (!with_pieces) {
            json_array_append_new(tokens, json_integer(ids[i]));
            continue;
        }
        size_t plen;
        const char *piece = em_tok_piece(m->tok, ids[i], &plen);
        json_array_append_new(tokens, json_pack("{s:i, s:o}", "id", ids[i], "piece", piece_json(piece, plen)));
    }
    free(ids);
    char *text = tokens ? dump(json_pack("{s:o}", "tokens", tokens)) : NULL;
    if (!text) em_srv_fail(e, 500, "server_error", NULL, "out of memory");
    return text;
}

char *em_srv_detokenize(const em_srv_model_ctx *m, const char *body, size_t len, em_srv_error *e) {
    json_t *root = load_object(body, len, e);
    if (!root) return NULL;
    json_t *tokens = field(root, "tokens");
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = json_is_array(tokens) ? id_list(m, tokens, "tokens", &ids, &n, e)
                                   : em_srv_fail(e, 400, INVALID, "tokens", "'tokens' must be an array of token ids");
    json_decref(root);
    if (rc) return NULL;
    char *text = NULL;
    size_t tlen = 0;
    em_err err = { 0 };
    rc = em_tok_decode(m->tok, ids, n, 0, &text, &tlen, &err);
    free(ids);
    if (rc) {
        em_srv_fail(e, 500, "server_error", NULL, "%s", err.msg);
        return NULL;
    }
    json_t *s = jstr(text, tlen);
    free(text);
    char *out = s ? dump(json_pack("{s:o}", "content", s)) : NULL;
    if (!out) em_srv_fail(e, 500, "server_error", NULL, "out of memory");
    return out;
}

/* ---- responses ----------------------------------------------------------------------------- */

static json_t *usage_json(const em_srv_stats *st) {
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", st->n_prompt, "completion_tokens", st->n_gen,
                     "total_tokens", st->n_prompt + st->n_gen);
}

/* llama-server's timings. Generation rates count the tokens after the first (which comes from
 * the prompt's pass) over the time after the prompt, as `ember run` reports them. */
static json_t *timings_json(const em_srv_stats *st) {
    double prompt_ms = st->prompt_s * 1e3, gen_ms = st->gen_s * 1e3;
    int after_first = st->n_gen > 1 ? st->n_gen - 1 : 0;
    json_t *t = json_object();
    if (!t) return NULL;
    json_object_set_new(t, "cache_n", json_integer(0));
    json_object_set_new(t, "prompt_n", json_integer(st->n_prompt));
    json_object_set_new(t, "prompt_ms", json_real(prompt_ms));
    json_object_set_new(t, "prompt_per_token_ms", json_real(st->n_prompt ? prompt_ms / st->n_prompt : 0.0));
    json_object_set_new(t, "prompt_per_second", json_real(st->prompt_s > 0 ? st->n_prompt / st->prompt_s : 0.0));
    json_object_set_new(t, "predicted_n", json_integer(st->n_gen));
    json_object_set_new(t, "predicted_ms", json_real(gen_ms));
    json_object_set_new(t, "predicted_per_token_ms", json_real(after_first ? gen_ms / after_first : 0.0));
    json_object_set_new(t, "predicted_per_second", json_real(st->gen_s > 0 ? after_first / st->gen_s : 0.0));
    json_object_set_new(t, "draft_n", json_integer((json_int_t)st->drafted));
    json_object_set_new(t, "draft_n_accepted", json_integer((json_int_t)st->accepted));
    /* Ember's own: where the target and the drafter ran, the drafter's time and the target's
     * verify and commit time after the prompt (the rest of predicted_ms is the loop's) */
    json_object_set_new(t, "draft_ms", json_real(st->draft_s * 1e3));
    json_object_set_new(t, "target_ms", json_real(st->target_s * 1e3));
    json_object_set_new(t, "device", st->device ? json_string(st->device) : json_null());
    json_object_set_new(t, "draft_device", st->draft_device ? json_string(st->draft_device) : json_null());
    return t;
}

static json_t *envelope(const em_srv_meta *mt, bool chunk) {
    const char *object = mt->kind == EM_SRV_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                 : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", mt->id, "object", object, "created", (json_int_t)mt->created,
                     "model", mt->model, "system_fingerprint", FINGERPRINT);
}

char *em_srv_response_json(const em_srv_meta *mt, const char *text, size_t len, const char *finish,
                           const em_srv_stats *st, const int32_t *tokens, size_t n_tokens) {
    json_t *root = envelope(mt, false);
    json_t *choice = json_pack("{s:i, s:n, s:s}", "index", 0, "logprobs", "finish_reason", finish);
    if (!root || !choice) {
        json_decref(root);
        json_decref(choice);
        return NULL;
    }
    if (mt->kind == EM_SRV_CHAT)
        json_object_set_new(choice, "message", json_pack("{s:s, s:o}", "role", "assistant", "content", jstr(text, len)));
    else json_object_set_new(choice, "text", jstr(text, len));
    if (tokens) {
        json_t *ids = json_array();
        for (size_t i = 0; ids && i < n_tokens; i++) json_array_append_new(ids, json_integer(tokens[i]));
        json_object_set_new(choice, "tokens", ids);
    }
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    json_object_set_new(root, "usage", usage_json(st));
    json_object_set_new(root, "timings", timings_json(st));
    return dump(root);
}

char *em_srv_chunk_json(const em_srv_meta *mt, bool role, const char *text, size_t len, const char *finish,
                        const em_srv_stats *st, bool usage_null) {
    json_t *root = envelope(mt, true);
    json_t *choice = json_pack("{s:i, s:n, s:o}", "index", 0, "logprobs", "finish_reason",
                               finish ? json_string(finish) : json_null());
    if (!root || !choice) {
        json_decref(root);
        json_decref(choice);
        return NULL;
    }
    if (mt->kind == EM_SRV_CHAT) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (role || len) json_object_set_new(delta, "content", jstr(text, len));
        json_object_set_new(choice, "delta", delta);
    } else json_object_set_new(choice, "text", jstr(text, len));
    json_object_set_new(root, "choices", json_pack("[o]", choice));
    if (usage_null) json_object_set_new(root, "usage", json_null());
    if (finish && st) json_object_set_new(root, "timings", timings_json(st));
    return dump(root);
}

char *em_srv_usage_chunk_json(const em_srv_meta *mt, const em_srv_stats *st) {
    json_t *root = envelope(mt, true);
    if (!root) return NULL;
    json_object_set_new(root, "choices", json_array());
    json_object_set_new(root, "usage", usage_json(st));
    json_object_set_new(root, "timings", timings_json(st));
    return dump(root);
}

/* ---- GET /v1/models and GET /props -------------------------------------------------------- */

char *em_srv_models_json(const em_server *s) {
    const em_server_model *m = &s->model;
    json_t *meta = json_pack("{s:i, s:s, s:i, s:I, s:i, s:i, s:i, s:I, s:I}", "vocab_type", 2, "arch",
                             m->info.arch ? m->info.arch : "", "n_vocab", m->info.n_vocab, "n_ctx_train",
                             (json_int_t)m->n_ctx_train, "n_ctx", m->info.n_ctx, "n_embd", m->info.n_embd, "n_layer",
                             m->info.n_layer, "n_params", (json_int_t)m->n_params, "size", (json_int_t)m->size);
    json_t *model = meta ? json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", s->model_id, "object", "model", "created",
                                     (json_int_t)s->started, "owned_by", "ember", "meta", meta)
                         : NULL;
    return model ? dump(json_pack("{s:s, s:[o]}", "object", "list", "data", model)) : NULL;
}

char *em_srv_props_json(const em_server *s) {
    const em_server_model *m = &s->model;
    em_sampler_params d = em_sampler_default_params();
    json_t *params = json_pack("{s:f, s:i, s:f, s:f, s:i, s:i, s:[], s:b}", "temperature", (double)d.temperature,
                               "top_k", d.top_k, "top_p", (double)d.top_p, "min_p", (double)d.min_p, "seed", -1,
                               "n_predict", -1, "stop", "ignore_eos", 0);
    json_t *gen = params ? json_pack("{s:i, s:o}", "n_ctx", m->info.n_ctx, "params", params) : NULL;
    json_t *spec = json_pack("{s:o, s:o}", "draft", s->draft ? json_string(s->draft) : json_null(), "draft_device",
                             s->draft_device ? json_string(s->draft_device) : json_null());
    if (!gen || !spec) {
        json_decref(gen);
        json_decref(spec);
        return NULL;
    }
    json_t *root = json_pack("{s:o, s:i, s:i, s:s, s:s, s:s, s:s, s:o, s:{s:b, s:b}, s:s}",
                             "default_generation_settings", gen, "total_slots", 1, "queue",
                             s->opts.queue < 0 ? 0 : s->opts.queue, "model_path", s->model_path, "model_alias",
                             s->model_id, "device", s->device ? s->device : "", "chat_template",
                             s->chat_template ? s->chat_template : "", "speculative", spec, "modalities", "vision", 0,
                             "audio", 0, "build_info", s->opts.build_info);
    return dump(root);
}
