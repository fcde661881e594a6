/* server/: the OpenAI-compatible HTTP server behind `ember serve`. Endpoints (docs/server.md):
 * GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions (plain JSON or
 * Server-Sent Events), POST /tokenize, POST /detokenize, GET /props, GET /metrics
 * (Prometheus). Where OpenAI's API says nothing, llama-server's conventions hold (timings,
 * /health while loading, /tokenize shapes).
 *
 * Threads: HTTP runs on libmicrohttpd with one thread per connection, so a slow client only
 * ever stalls its own thread. Generation requests are parsed, templated and tokenized on the
 * connection's thread, then queued (bounded: a full queue is 503 with Retry-After) for the
 * one decode worker, which owns the decode loop (decode/) and runs one request at a time. A
 * client that goes away (its socket hangs up, or its stream breaks) stops its generation
 * within one decode step.
 *
 * Life cycle: em_server_start binds and serves at once (503 "Loading model" everywhere but
 * the 404s); em_server_set_model makes it ready (starts the worker); em_server_stop fails what
 * is queued and the running request (503; a stream gets that error as its last event), joins
 * the worker, gives streams up to 2 s to reach their clients and closes every connection;
 * em_server_free releases it. The server borrows the model (spec, tokenizer) for its whole
 * life: free those only after em_server_free. */
#ifndef EM_SERVER_H
#define EM_SERVER_H

#include "base/base.h"
#include "model/model.h"
#include "decode/decode.h"
#include "text/text.h"

typedef struct em_server em_server;

#define EM_SERVER_DEFAULT_HOST "127.0.0.1"
#define EM_SERVER_DEFAULT_PORT 8080
#define EM_SERVER_DEFAULT_QUEUE 64
#define EM_SERVER_DEFAULT_MAX_BODY (16u << 20)
#define EM_SERVER_DEFAULT_CONNECTIONS 256
#define EM_SERVER_DEFAULT_TIMEOUT 600
#define EM_SERVER_DEFAULT_REQUEST_TIMEOUT 10
#define EM_SERVER_DEFAULT_CONNECTIONS_PER_IP 64

typedef struct em_server_opts {
    const char *host;     /* address or name to bind; NULL: EM_SERVER_DEFAULT_HOST */
    int port;             /* 0: a free port the system picks (see em_server_port) */
    const char *api_key;  /* NULL or "": no authentication; else every endpoint but /health
                             wants "Authorization: Bearer KEY" (401 otherwise) */
    int queue;            /* requests that may wait for the worker besides the one it runs;
                             0: EM_SERVER_DEFAULT_QUEUE; < 0: none may wait */
    size_t max_body;      /* request body bytes (413 beyond); 0: EM_SERVER_DEFAULT_MAX_BODY */
    unsigned connections; /* open connections at most; 0: EM_SERVER_DEFAULT_CONNECTIONS */
    unsigned connections_per_ip; /* open connections from one client address at most (beyond:
                             refused at once); 0: EM_SERVER_DEFAULT_CONNECTIONS_PER_IP */
    unsigned request_timeout_s; /* a request's headers and body must arrive within this many
                             seconds of the connection opening or of the previous response
                             (so also: idle keep-alive connections close after it); the
                             connection is closed otherwise, without an answer. Responses are
                             not bounded by it. 0: EM_SERVER_DEFAULT_REQUEST_TIMEOUT */
    unsigned timeout_s;   /* a response whose client reads nothing for this long is dropped;
                             0: EM_SERVER_DEFAULT_TIMEOUT */
    const char *build_info; /* shown by /props; NULL: "ember" */
} em_server_opts;

/* What is served. Strings are copied; spec and tok are borrowed until em_server_free. */
typedef struct em_server_model {
    const char *id;            /* the model name clients see in /v1/models and responses */
    const char *path;          /* the model file */
    em_decode *spec;             /* the decode loop over the loaded target (used by the worker only) */
    const em_target *target;   /* that target, for its expert counters (worker only); may be NULL */
    const em_tok *tok;         /* the target's tokenizer (thread-safe) */
    em_target_info info;       /* n_vocab, n_embd, n_ctx, ... */
    int64_t n_ctx_train;       /* the file's context length; 0: unknown */
    uint64_t n_params;         /* parameters (tensor elements) */
    uint64_t size;             /* bytes of tensor data */
    const char *chat_template; /* tokenizer.chat_template, or NULL */
    const char *draft;         /* the drafter model, or NULL (plain decoding) */
    const char *draft_device;  /* where the drafter runs ("cpu"), or NULL */
} em_server_model;

int em_server_start(em_server **out, const em_server_opts *opts, em_err *err);
/* The port the server listens on (the chosen one when opts.port was 0). */
int em_server_port(const em_server *s);
/* Starts serving generation requests with m (once). */
int em_server_set_model(em_server *s, const em_server_model *m, em_err *err);
/* Idempotent; blocks until the worker and every connection are done. */
void em_server_stop(em_server *s);
/* Stops (if not yet) and frees; NULL-safe. */
void em_server_free(em_server *s);

#endif
