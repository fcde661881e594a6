/* server/ internals shared by http.c, openai.c, stop.c, worker.c and metrics.c (and
 * tests/test_server.c); not an interface for other layers (they use server.h). */
#ifndef EM_SERVER_IMPL_H
#define EM_SERVER_IMPL_H

#include "server/server.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- errors: OpenAI's error object {"error": {message, type, param, code}} --------------- */

typedef struct em_srv_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "authentication_error", "not_found_error",
                         "server_error", "unavailable_error" */
    const char *code; /* OpenAI's code ("model_not_found", "context_length_exceeded", ...) or NULL */
    char param[64];   /* the offending request field; "" when none */
    char message[512];
} em_srv_error;

/* Fills e (status, type, param may be NULL, message) and returns -1. */
int em_srv_fail(em_srv_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error": {...}} as a new string (free()); NULL when memory runs out. */
char *em_srv_error_json(const em_srv_error *e);

/* ---- requests (openai.c) --------------------------------------------------------------- */

enum em_srv_kind { EM_SRV_CHAT = 0, EM_SRV_COMPLETION };

/* What request parsing needs to know of the model. */
typedef struct em_srv_model_ctx {
    const em_tok *tok;
    const char *id;   /* model id clients see */
    const char *path; /* the model file */
    int n_ctx;        /* positions the target holds */
} em_srv_model_ctx;

#define EM_SRV_MAX_STOP 16       /* stop strings per request */
#define EM_SRV_MAX_STOP_LEN 256  /* bytes per stop string */
#define EM_SRV_MAX_DEPTH 64      /* JSON nesting accepted (checked before parsing) */

/* A parsed, validated generation request. */
typedef struct em_srv_req {
    int kind;          /* enum em_srv_kind */
    int32_t *prompt;   /* token ids (malloc'd), n_prompt >= 1, n_prompt < n_ctx */
    int n_prompt;
    int n_max;         /* tokens to generate at most: 1 <= n_max <= n_ctx - n_prompt */
    em_sampler_params sampling;
    bool stream, include_usage, ignore_eos, return_tokens;
    char *stop[EM_SRV_MAX_STOP]; /* non-empty strings (malloc'd) */
    int n_stop;
} em_srv_req;

/* Parses and validates a chat (messages, Kimi's chat format) or completion (prompt) request
 * body of len bytes, tokenizing its prompt. seed: used when the request gives none. On error
 * fills e (4xx) and returns -1; *out is then empty. */
int em_srv_parse_generate(const em_srv_model_ctx *m, int kind, const char *body, size_t len, uint64_t seed,
                          em_srv_req *out, em_srv_error *e);
void em_srv_req_free(em_srv_req *r);

/* POST /tokenize and /detokenize: the response body (free()), or NULL with e filled. */
char *em_srv_tokenize(const em_srv_model_ctx *m, const char *body, size_t len, em_srv_error *e);
char *em_srv_detokenize(const em_srv_model_ctx *m, const char *body, size_t len, em_srv_error *e);

/* ---- responses (openai.c) -------------------------------------------------------------- */

/* What every response object of one request repeats. */
typedef struct em_srv_meta {
    int kind;
    const char *id;    /* "chatcmpl-..." or "cmpl-..." */
    int64_t created;   /* Unix seconds */
    const char *model;
} em_srv_meta;

/* Counters of one finished generation: usage and llama-server's timings. */
typedef struct em_srv_stats {
    int n_prompt, n_gen;
    double prompt_s, gen_s;
    uint64_t drafted, accepted;
    double draft_s;            /* in the drafter (proposals and its context) */
    double target_s;           /* in the target's verify and commit calls after the prompt */
    const char *device;        /* where the target runs, or NULL */
    const char *draft_device;  /* where the drafter runs, or NULL: no drafter */
} em_srv_stats;

/* Finish reasons clients see. */
#define EM_SRV_FINISH_STOP "stop"
#define EM_SRV_FINISH_LENGTH "length"

/* The non-streaming response; tokens may be NULL (then no "tokens" field). text is valid UTF-8. */
char *em_srv_response_json(const em_srv_meta *mt, const char *text, size_t len, const char *finish,
                           const em_srv_stats *st, const int32_t *tokens, size_t n_tokens);
/* One streamed chunk: role (chat: the first chunk's {"role":"assistant"}), text (may be
 * empty), finish (NULL but in the last chunk, which also carries timings from st),
 * usage_null (stream_options.include_usage: every chunk has "usage": null). */
char *em_srv_chunk_json(const em_srv_meta *mt, bool role, const char *text, size_t len, const char *finish,
                        const em_srv_stats *st, bool usage_null);
/* The chunk that carries usage after the last one (choices: []). */
char *em_srv_usage_chunk_json(const em_srv_meta *mt, const em_srv_stats *st);

/* GET /v1/models and GET /props of a ready server (free()); NULL when memory runs out. */
char *em_srv_models_json(const em_server *s);
char *em_srv_props_json(const em_server *s);

/* ---- stop strings (stop.c) ------------------------------------------------------------- */

/* Generated text with stop strings: text is appended as it comes; once a stop string shows
 * up the text is cut right before it (llama-server: the stop string is not part of the
 * output) and matched is set. Bytes that could still be the beginning of a stop string are
 * held back from streaming until they are not (or generation ends). */
typedef struct em_srv_text {
    char *buf;
    size_t len, cap;
    size_t sent;             /* bytes handed out so far */
    char *const *stop;       /* borrowed */
    int n_stop;
    bool matched;
} em_srv_text;

void em_srv_text_init(em_srv_text *t, char *const *stop, int n_stop);
void em_srv_text_free(em_srv_text *t);
/* Appends n bytes (ignored once matched); EM_ENOMEM when memory runs out. */
int em_srv_text_push(em_srv_text *t, const char *bytes, size_t n, em_err *err);
/* End of the bytes that may be handed out now ([sent, end) are new); final: generation is
 * over, nothing is held back. */
size_t em_srv_text_ready(const em_srv_text *t, bool final);

/* ---- metrics (metrics.c) --------------------------------------------------------------- */

enum em_srv_route {
    EM_ROUTE_NONE = 0, /* unknown path */
    EM_ROUTE_HEALTH,
    EM_ROUTE_MODELS,
    EM_ROUTE_CHAT,
    EM_ROUTE_COMPLETIONS,
    EM_ROUTE_TOKENIZE,
    EM_ROUTE_DETOKENIZE,
    EM_ROUTE_PROPS,
    EM_ROUTE_METRICS,
    EM_ROUTE_COUNT,
};
const char *em_srv_route_name(int route);

typedef struct em_srv_counters {
    uint64_t http[EM_ROUTE_COUNT][3]; /* responses per route: 2xx/3xx, 4xx, 5xx */
    uint64_t rejected;                /* 503 because the queue was full */
    uint64_t cancelled;               /* generations stopped because the client went away */
    uint64_t gen_requests;            /* generations finished (any reason) */
    uint64_t prompt_tokens, gen_tokens;
    double prompt_seconds, gen_seconds;
    uint64_t passes, drafted, accepted;
    double draft_seconds, target_seconds;
    uint64_t expert_bytes_read, expert_hits, expert_misses;
    uint64_t expert_gen_bytes_read;   /* of those, read while generating (after prompts) */
} em_srv_counters;

typedef struct em_srv_metrics {
    pthread_mutex_t mu;
    em_srv_counters c;
    char device[96], draft_device[96]; /* where the target and the drafter run ("": not known, none) */
} em_srv_metrics;

void em_srv_metrics_init(em_srv_metrics *m);
void em_srv_metrics_destroy(em_srv_metrics *m);
void em_srv_metrics_response(em_srv_metrics *m, int route, int status);
void em_srv_metrics_rejected(em_srv_metrics *m);
/* One finished generation's counters. */
void em_srv_metrics_generation(em_srv_metrics *m, const em_decode_result *r, int n_gen, bool cancelled);
/* The target's routed-expert counters (totals since it was opened); call from the worker. */
void em_srv_metrics_experts(em_srv_metrics *m, const em_target *t);
/* Where the target and the drafter (NULL: none) run, for ember_device_info. */
void em_srv_metrics_devices(em_srv_metrics *m, const char *device, const char *draft_device);
/* The Prometheus text exposition (free()); queued/processing are gauges read by the caller. */
char *em_srv_metrics_render(em_srv_metrics *m, int queued, int processing, bool ready);

/* ---- the server: queue and decode worker (worker.c), HTTP (http.c) ---------------------- */

enum em_srv_job_state { EM_JOB_QUEUED = 0, EM_JOB_RUNNING, EM_JOB_DONE };

/* One generation request between its connection and the worker. Shared by the connection
 * (request context, streaming response) and the worker: refcounted under the server mutex,
 * which also guards state, out and the result. */
typedef struct em_srv_job em_srv_job;
struct em_srv_job {
    em_server *srv;
    int refs;
    em_srv_req req;
    em_srv_meta meta;
    char id[48];
    int client_fd;          /* the connection's socket, polled for hang-ups; -1: none */
    atomic_bool cancel;     /* the client went away */
    int state;              /* enum em_srv_job_state */
    pthread_cond_t cv;      /* signalled on state changes and new output */
    em_srv_job *next;       /* queue link */
    /* streaming: SSE bytes not yet taken by the connection */
    char *out;
    size_t out_len, out_pos, out_cap;
    bool out_failed;        /* memory ran out: the stream ends */
    /* when DONE: the status and body of a non-streaming response (body malloc'd) */
    int status;
    char *body;
};

/* A connection while libmicrohttpd has it (http.c): from its notification that the
 * connection started to the one that it closed, which comes before MHD closes the socket, so
 * fd is never another connection's socket while the record exists. */
typedef struct em_srv_conn em_srv_conn;
struct em_srv_conn {
    int fd;
    bool receiving;         /* a request's headers or body are due ... */
    double deadline;        /* ... by this time (CLOCK_MONOTONIC seconds) */
    em_srv_conn *prev, *next;
};

struct em_server {
    em_server_opts opts;      /* strings point into the copies below */
    char *host, *api_key, *build_info;
    struct MHD_Daemon *mhd;
    int port;

    /* http.c: open connections and the reaper thread that closes those whose request is
     * late (--request-timeout); streams still being sent (drained before stopping) */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;   /* the reaper's sleep; signalled to stop it */
    em_srv_conn *conns;
    bool reaper_started, reaper_stop;
    pthread_t reaper;
    int n_streams;            /* SSE responses not yet finished, under conn_mu */
    int64_t started;          /* Unix seconds */

    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* the worker waits here for jobs */
    atomic_bool ready;        /* a model is set */
    bool stopping;            /* under mu */
    bool stopped;             /* em_server_stop ran */
    em_server_model model;    /* strings are the copies below */
    char *model_id, *model_path, *chat_template, *draft, *device, *draft_device;
    em_srv_model_ctx mctx;
    em_srv_job *head, *tail;  /* queued jobs */
    int n_queued;
    em_srv_job *running;
    bool worker_started;
    pthread_t worker;
    uint64_t id_state;        /* response ids, under mu */
    bool model_lost;          /* a model file changed on disk (worker.c), under mu */
    char model_lost_msg[EM_ERR_MSG];
    em_srv_metrics metrics;
};

/* worker.c */
int em_srv_worker_start(em_server *s, em_err *err);
/* Fails every queued job with 503 and cancels the running one; the worker then exits. */
void em_srv_worker_stop(em_server *s);
/* A new job for req (taken over: req is left empty), one reference held by the caller. */
em_srv_job *em_srv_job_create(em_server *s, em_srv_req *req, int client_fd);
void em_srv_job_ref(em_srv_job *j);
void em_srv_job_unref(em_srv_job *j);
/* Queues j (taking a reference for the worker); -1 when the queue is full or stopping. */
int em_srv_job_submit(em_srv_job *j, em_srv_error *e);
/* Waits until the job is DONE (non-streaming); returns with s->mu unlocked. */
void em_srv_job_wait(em_srv_job *j);
/* Streaming: copies up to max pending bytes into buf, waiting for some; 0 when the stream
 * is over and drained. */
size_t em_srv_job_read(em_srv_job *j, char *buf, size_t max);
/* Whether the model was lost (its file changed on disk while mapped): then e holds the 503
 * every generation request and /health get, naming the file. */
bool em_srv_model_lost(em_server *s, em_srv_error *e);
/* A fresh random-looking id with prefix into out[cap]; em_srv_random: 64 such bits (a
 * request's seed when it gives none). Not cryptographic. */
void em_srv_make_id(em_server *s, const char *prefix, char *out, size_t cap);
uint64_t em_srv_random(em_server *s);

/* http.c */
int em_srv_http_start(em_server *s, em_err *err);
/* Waits (at most seconds) until every streaming response has been sent to its client; the
 * worker must be stopped first, so that every stream has its last event. */
void em_srv_http_drain(em_server *s, double seconds);
void em_srv_http_stop(em_server *s);

#endif
