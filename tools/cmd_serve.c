/* `ember serve [-m TARGET.gguf] [--host H] [--port N] ...`: the OpenAI-compatible HTTP server
 * (server/, docs/server.md). Binds first (so /health answers 503 while the model loads),
 * loads the model on a second thread, then serves until SIGINT or SIGTERM, which stop it
 * gracefully (queued requests get 503, the running one is stopped, connections close).
 * Signals are blocked in every thread and taken with sigtimedwait here, so no handler and
 * no global flag are needed. Owns only argument handling, loading and the life cycle. */
#include "cli.h"
#include "model_flags.h"

#include "format/gguf.h"
#include "server/server.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef EMBER_VERSION
#define EMBER_VERSION "0.1.0"
#endif

static const char serve_usage[] =
    "usage: ember serve [-m TARGET.gguf] [flags]\n"
    "\n"
    "Without -m it serves the default pair shipped in models/ (speculative decoding; --draft\n"
    "none decodes plainly).\n"
    "Serves the model over an OpenAI-compatible HTTP API (docs/server.md): GET /health,\n"
    "GET /v1/models, POST /v1/chat/completions, POST /v1/completions (streaming or not),\n"
    "POST /tokenize, POST /detokenize, GET /props, GET /metrics. Requests wait in a queue for\n"
    "the one decode worker. SIGINT or SIGTERM stop the server.\n"
    "\n"
    "model flags (as for ember run):\n" EM_MODEL_FLAGS_USAGE
    "\n"
    "server flags:\n"
    "      --host H           address or name to bind (default 127.0.0.1)\n"
    "      --port N           TCP port (default 8080; 0 picks a free one, printed at start)\n"
    "  -a, --alias NAME       the model id /v1/models lists (default: the file name); requests\n"
    "                         may name any model, the one loaded serves them\n"
    "      --api-key KEY      require \"Authorization: Bearer KEY\" on every endpoint but /health;\n"
    "                         an empty KEY is refused, spaces around it are removed (with a note)\n"
    "      --api-key-file F   the same, KEY being the first line of file F (no NUL bytes)\n"
    "      --queue N          requests that may wait besides the running one (default 64);\n"
    "                         beyond that, 503 with Retry-After\n"
    "      --max-body B       request body limit, e.g. 16MiB (default); larger bodies get 413\n"
    "      --max-connections N  open connections at most (default 256)\n"
    "      --max-connections-per-ip N  open connections from one client address (default 64)\n"
    "      --request-timeout S  a request's headers and body must arrive within S seconds of the\n"
    "                         connection opening or of the previous response, else the\n"
    "                         connection is closed (default 10; idle keep-alive too)\n"
    "      --timeout S        a response whose client reads nothing for S seconds is dropped\n"
    "                         (default 600)\n"
    "  -v, --verbose          log every request\n";

typedef struct serve_opts {
    em_model_flags mf;
    const char *alias, *api_key_file;
    em_server_opts so;
    bool verbose;
} serve_opts;

/* ---- arguments ------------------------------------------------------------------------- */

static int parse_server_flag(const char *a, const char *v, serve_opts *o) {
    const em_cmd *cmd = &em_cmd_serve;
    em_err err = { 0 };
    long long n;
    if (!strcmp(a, "--host")) o->so.host = v;
    else if (!strcmp(a, "-a") || !strcmp(a, "--alias")) o->alias = v;
    else if (!strcmp(a, "--api-key")) {
        /* "" would mean no authentication: an unset variable must not open the server */
        if (!v[0]) return em_cli_usage_error(cmd, "--api-key: the key is empty (leave the flag out for a server without one)");
        o->so.api_key = v;
    }
    else if (!strcmp(a, "--api-key-file")) o->api_key_file = v;
    else if (!strcmp(a, "--port")) {
        if (em_parse_int(v, 0, 65535, &n, a, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
        o->so.port = (int)n;
    } else if (!strcmp(a, "--queue")) {
        if (em_parse_int(v, 0, 1 << 20, &n, a, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
        o->so.queue = n ? (int)n : -1; /* 0 in the options means the default; -1 is none */
    } else if (!strcmp(a, "--max-body")) {
        uint64_t bytes;
        if (em_parse_size(v, &bytes, &err)) return em_cli_usage_error(cmd, "--max-body: %s", err.msg);
        if (bytes < 1024 || bytes > (1ull << 32))
            return em_cli_usage_error(cmd, "--max-body: %s is not between 1KiB and 4GiB", v);
        o->so.max_body = (size_t)bytes;
    } else if (!strcmp(a, "--max-connections")) {
        if (em_parse_int(v, 1, 1 << 16, &n, a, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
        o->so.connections = (unsigned)n;
    } else if (!strcmp(a, "--max-connections-per-ip")) {
        if (em_parse_int(v, 1, 1 << 16, &n, a, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
        o->so.connections_per_ip = (unsigned)n;
    } else if (!strcmp(a, "--request-timeout")) {
        if (em_parse_int(v, 1, 1 << 24, &n, a, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
        o->so.request_timeout_s = (unsigned)n;
    } else if (!strcmp(a, "--timeout")) {
        if (em_parse_int(v, 1, 1 << 24, &n, a, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
        o->so.timeout_s = (unsigned)n;
    }
    return -1;
}

static bool server_flag(const char *a) {
    static const char *const flags[] = {
        "--host", "--port", "-a", "--alias", "--api-key", "--api-key-file", "--queue", "--max-body",
        "--max-connections", "--max-connections-per-ip", "--request-timeout", "--timeout",
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(a, flags[i])) return true;
    return false;
}

static int parse_args(int argc, char **argv, serve_opts *o) {
    const em_cmd *cmd = &em_cmd_serve;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbose = true;
            continue;
        }
        bool model = em_model_flag(a);
        if (!model && !server_flag(a)) {
            if (a[0] == '-') return em_cli_usage_error(cmd, "unknown flag '%s'", a);
            return em_cli_usage_error(cmd, "unexpected argument '%s'", a);
        }
        if (i + 1 >= argc) return em_cli_usage_error(cmd, "%s needs a value", a);
        const char *v = argv[++i];
        int rc = model ? em_model_flag_parse(cmd, a, v, &o->mf) : parse_server_flag(a, v, o);
        if (rc >= 0) return rc;
    }
    if (o->so.api_key && o->api_key_file) return em_cli_usage_error(cmd, "give --api-key or --api-key-file, not both");
    return em_model_flags_need_model(cmd, &o->mf);
}

/* Clients send keys without surrounding whitespace (HTTP trims header values), so a key that
 * has some could never match: it is removed, with a note on stderr. A control byte inside
 * cannot be sent in a header at all: refused. what names the key's source in messages; key
 * (n bytes, NUL-terminated) is trimmed in place. */
static int trim_key(const char *what, char *key, size_t n, em_err *err) {
    size_t lead = strspn(key, " \t\v\f\r\n"), end = n;
    while (end > lead && strchr(" \t\v\f\r\n", key[end - 1])) end--;
    if (end == lead) return em_err_set(err, EM_EINVAL, "%s: the API key is empty", what);
    for (size_t i = lead; i < end; i++)
        if ((unsigned char)key[i] < 0x20 || key[i] == 0x7f)
            return em_err_set(err, EM_EINVAL, "%s: the API key has a control byte (0x%02x) at offset %zu; no client "
                              "can send it", what, (unsigned char)key[i], i);
    if (lead || end < n)
        fprintf(stderr, "ember serve: note: %s: removed whitespace around the API key (%zu bytes before, %zu after); "
                "clients send keys without it\n", what, lead, n - end);
    memmove(key, key + lead, end - lead);
    key[end - lead] = 0;
    return EM_OK;
}

/* The first line of path (without its line end) into *key (free()). A NUL byte anywhere is
 * refused: the key would silently end there. */
static int read_key_file(const char *path, char **key, em_err *err) {
    char *text;
    size_t len;
    int rc = em_file_read_all(path, &text, &len, err);
    if (rc) return rc;
    const char *nul = memchr(text, 0, len);
    if (nul) {
        rc = em_err_set(err, EM_EINVAL, "%s: a NUL byte at offset %zu (an API key file holds the key as text)", path,
                        (size_t)(nul - text));
        free(text);
        return rc;
    }
    size_t n = strcspn(text, "\n");
    text[n] = 0;
    if (!text[0]) {
        free(text);
        return em_err_set(err, EM_EINVAL, "%s: the first line (the API key) is empty", path);
    }
    if ((rc = trim_key(path, text, n, err))) {
        free(text);
        return rc;
    }
    *key = text;
    return EM_OK;
}

/* ---- loading ---------------------------------------------------------------------------- */

typedef struct loader {
    const serve_opts *o;
    em_tok *tok;
    em_target *target;
    em_drafter *drafter;
    em_decode *spec;
    char *chat_template, *arch;
    em_server_model m;
    int rc;
    em_err err;
    atomic_bool done;
} loader;

/* What /v1/models and /props report that only the file knows. */
static int read_file_info(loader *L, const em_gguf *g, em_err *err) {
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        L->m.n_params += t->n_elements;
        L->m.size += t->bytes;
    }
    em_gguf_str s;
    if (!em_gguf_get_str(g, "tokenizer.chat_template", &s, NULL) && s.len < (1u << 20)) {
        if (!(L->chat_template = em_malloc((size_t)s.len + 1, "chat template", err))) return EM_ENOMEM;
        memcpy(L->chat_template, s.ptr, (size_t)s.len);
        L->chat_template[s.len] = 0;
    }
    if (!em_gguf_get_str(g, "general.architecture", &s, NULL) && s.len < 64) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.context_length", (int)s.len, s.ptr);
        int64_t n;
        if (!em_gguf_get_int(g, key, &n, NULL)) L->m.n_ctx_train = n;
    }
    return EM_OK;
}

static int load(loader *L, em_err *err) {
    const char *path = L->o->mf.model;
    em_gguf *g;
    int rc = em_gguf_open(&g, path, err);
    if (rc) return rc;
    rc = em_tok_create(&L->tok, g, NULL, err);
    if (!rc) rc = read_file_info(L, g, err);
    em_gguf_close(g);
    if (rc) return rc;
    if ((rc = em_model_flags_open(&L->o->mf, &L->target, &L->drafter, err))) return rc;
    em_decode_opts so = em_model_flags_decode_opts(&L->o->mf, L->tok, L->drafter);
    if ((rc = em_decode_create(&L->spec, L->target, &so, err))) return rc;
    L->m.draft = L->o->mf.draft;
    L->m.draft_device = L->drafter ? em_draft_get_info(L->drafter)->device : NULL;
    const char *slash = strrchr(path, '/');
    L->m.id = L->o->alias ? L->o->alias : slash ? slash + 1 : path;
    L->m.path = path;
    L->m.spec = L->spec;
    L->m.target = L->target;
    L->m.tok = L->tok;
    L->m.info = *em_target_get_info(L->target);
    L->m.chat_template = L->chat_template;
    return EM_OK;
}

static void *loader_main(void *arg) {
    loader *L = arg;
    L->rc = load(L, &L->err);
    atomic_store(&L->done, true);
    return NULL;
}

static void loader_free(loader *L) {
    em_decode_free(L->spec);
    em_draft_close(L->drafter); /* before the target it borrows from */
    em_target_close(L->target);
    em_tok_free(L->tok);
    free(L->chat_template);
}

/* ---- serving ------------------------------------------------------------------------------ */

static void print_address(const em_server_opts *so, int port) {
    const char *host = so->host ? so->host : EM_SERVER_DEFAULT_HOST;
    bool v6 = strchr(host, ':') != NULL;
    fprintf(stderr, "ember serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

/* Waits for the model and then for a stop signal; returns the exit status. */
static int serve_until_signal(em_server *srv, loader *L, const sigset_t *sigs) {
    bool loaded = false;
    for (;;) {
        struct timespec tick = { .tv_sec = 0, .tv_nsec = 50 * 1000 * 1000 };
        int sig = sigtimedwait(sigs, NULL, loaded ? NULL : &tick);
        if (sig == SIGINT || sig == SIGTERM) {
            if (!loaded) { /* the load cannot be interrupted: leave at once */
                fprintf(stderr, "ember serve: %s while loading the model; exiting\n", strsignal(sig));
                _exit(128 + sig);
            }
            fprintf(stderr, "ember serve: %s: stopping\n", strsignal(sig));
            return EM_EXIT_OK;
        }
        if (loaded || !atomic_load(&L->done)) continue;
        loaded = true;
        if (L->rc) return em_cli_fail(&em_cmd_serve, &L->err);
        em_err err = { 0 };
        if (em_server_set_model(srv, &L->m, &err)) return em_cli_fail(&em_cmd_serve, &err);
        fprintf(stderr, "ember serve: ready: model '%s', %d context positions, %s%s\n", L->m.id, L->m.info.n_ctx,
                L->m.draft ? "speculative decoding with drafter " : "plain decoding (no drafter)",
                L->m.draft ? L->m.draft : "");
    }
}

static int serve_main(int argc, char **argv) {
    serve_opts o = { .so.port = EM_SERVER_DEFAULT_PORT };
    int usage = parse_args(argc, argv, &o);
    if (usage >= 0) return usage;
    em_err err = { 0 };
    char *key = NULL;
    if (o.api_key_file) {
        if (read_key_file(o.api_key_file, &key, &err)) return em_cli_fail(&em_cmd_serve, &err);
        o.so.api_key = key;
    } else if (o.so.api_key) {
        if (!(key = strdup(o.so.api_key))) return em_cli_fail(&em_cmd_serve, &(em_err){ EM_ENOMEM, "out of memory" });
        if (trim_key("--api-key", key, strlen(key), &err)) {
            free(key);
            return em_cli_usage_error(&em_cmd_serve, "%s", err.msg);
        }
        o.so.api_key = key;
    }
    if (o.verbose) em_log_set_level(EM_LOG_DEBUG);
    o.so.build_info = "ember " EMBER_VERSION;
    if (!o.so.host) o.so.host = EM_SERVER_DEFAULT_HOST;

    /* Blocked before any thread starts, so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    em_server *srv;
    int rc = em_server_start(&srv, &o.so, &err);
    free(key);
    if (rc) return em_cli_fail(&em_cmd_serve, &err);
    print_address(&o.so, em_server_port(srv));
    fprintf(stderr, "ember serve: loading %s\n", o.mf.model);

    loader L = { .o = &o };
    atomic_init(&L.done, false);
    pthread_t th;
    if ((rc = pthread_create(&th, NULL, loader_main, &L))) {
        em_server_free(srv);
        em_err_set(&err, EM_EIO, "cannot start the loading thread: %s", strerror(rc));
        return em_cli_fail(&em_cmd_serve, &err);
    }
    int status = serve_until_signal(srv, &L, &sigs);
    pthread_join(th, NULL);
    em_server_free(srv); /* before the model it borrows */
    loader_free(&L);
    return status;
}

const em_cmd em_cmd_serve = {
    .name = "serve",
    .summary = "OpenAI-compatible HTTP server (chat, completions, streaming, metrics)",
    .usage = serve_usage,
    .main = serve_main,
};
