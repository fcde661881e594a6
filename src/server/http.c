/* server/http.c: HTTP through libmicrohttpd (thread per connection): the listening socket,
 * routing, API-key checks, body limits, CORS, and turning results into responses (JSON, or
 * Server-Sent Events read from a job as the worker produces them).
 *
 * MHD calls the access handler several times per request: once with the headers (where
 * everything that needs no body is decided: route, method, key, content type, declared
 * length), once per piece of body, and once more when the body is complete (dispatch).
 * Non-streaming generation requests block their connection's thread until the worker is
 * done; streaming ones hand MHD a reader that blocks until the next event. Either way only
 * that connection waits. Must not: decode (worker.c) or parse request JSON (openai.c). */
#include "server/server_impl.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SSE_BLOCK (16u << 10)
#define LISTEN_BACKLOG 512

/* One request's state, kept by MHD in *con_cls between calls. */
typedef struct http_req {
    const char *method, *url; /* MHD's, valid while the request lasts */
    int route;
    char *body;
    size_t len, cap;
    bool too_big;
    uint64_t discarded;
    bool refused;     /* the headers decided the answer (err), given once the request is in */
    bool close;       /* the connection cannot be trusted with another request: close it */
    em_srv_error err;
    em_srv_job *job; /* a generation request's job, while this request lasts */
} http_req;

typedef struct route_def {
    const char *path;
    int route;
    bool post;
} route_def;

static const route_def routes[] = {
    { "/health", EM_ROUTE_HEALTH, false },
    { "/v1/health", EM_ROUTE_HEALTH, false },
    { "/v1/models", EM_ROUTE_MODELS, false },
    { "/models", EM_ROUTE_MODELS, false },
    { "/v1/chat/completions", EM_ROUTE_CHAT, true },
    { "/chat/completions", EM_ROUTE_CHAT, true },
    { "/v1/completions", EM_ROUTE_COMPLETIONS, true },
    { "/completions", EM_ROUTE_COMPLETIONS, true },
    { "/tokenize", EM_ROUTE_TOKENIZE, true },
    { "/detokenize", EM_ROUTE_DETOKENIZE, true },
    { "/props", EM_ROUTE_PROPS, false },
    { "/metrics", EM_ROUTE_METRICS, false },
};

static const route_def *find_route(const char *url) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) return &routes[i];
    return NULL;
}

/* ---- responses ---------------------------------------------------------------------------- */

static void add_common_headers(struct MHD_Response *resp, const char *content_type) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
}

/* Counts a response, and logs it with -v. */
static void note_response(em_server *s, const http_req *r, int status) {
    em_srv_metrics_response(&s->metrics, r->route, status);
    em_log(EM_LOG_DEBUG, "serve: %.16s %.200s -> %d", r->method ? r->method : "?", r->url ? r->url : "?", status);
}

/* Queues body (malloc'd, taken; NULL: out of memory, a 500) with status. */
static enum MHD_Result respond(em_server *s, struct MHD_Connection *c, http_req *r, int status, char *body,
                               const char *content_type) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":null}}";
    struct MHD_Response *resp =
        body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    if (!body) status = 500, content_type = "application/json";
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    add_common_headers(resp, content_type);
    if (r->close) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405) {
        const route_def *def = NULL;
        for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
            if (routes[i].route == r->route) def = &routes[i];
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, def && def->post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    note_response(s, r, status);
    return ret;
}

static enum MHD_Result respond_json(em_server *s, struct MHD_Connection *c, http_req *r, int status, char *body) {
    return respond(s, c, r, status, body, "application/json; charset=utf-8");
}

static enum MHD_Result respond_error(em_server *s, struct MHD_Connection *c, http_req *r, const em_srv_error *e) {
    if (e->status >= 500) em_log(EM_LOG_WARN, "serve: %d: %s", e->status, e->message);
    return respond_json(s, c, r, e->status, em_srv_error_json(e));
}

static enum MHD_Result respond_cors_preflight(em_server *s, struct MHD_Connection *c, http_req *r) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, resp);
    MHD_destroy_response(resp);
    note_response(s, r, MHD_HTTP_NO_CONTENT);
    return ret;
}

/* ---- message framing ------------------------------------------------------------------------ */

/* How the headers say the body ends. libmicrohttpd takes the first Content-Length and knows
 * only "chunked" as a transfer coding (others make it read until the client closes), so a
 * request it would frame differently from another server (request smuggling) or never finish
 * is refused here with 400, and its connection closed (RFC 9112 6.1, 6.3). */
typedef struct framing {
    int n_length;           /* Content-Length headers */
    const char *length;     /* the first one's value */
    const char *other_length; /* a later one that differs from it, or NULL */
    int n_te;               /* Transfer-Encoding headers */
    int n_codings;          /* transfer codings they list */
    char coding[32];        /* the last one */
    char unsupported[32];   /* a coding other than chunked before the last, or "" */
    bool chunked_early;     /* chunked before the last coding */
} framing;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    if (!value) value = "";
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (f->n_length++ == 0) f->length = value;
        else if (strcmp(f->length, value) && !f->other_length) f->other_length = value;
        return MHD_YES;
    }
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) return MHD_YES;
    f->n_te++;
    for (const char *p = value; *p;) { /* a comma-separated list; repeated headers continue it */
        p += strspn(p, " \t,");
        size_t n = strcspn(p, ",");
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (!n) continue;
        if (f->n_codings++) {
            if (!strcasecmp(f->coding, "chunked")) f->chunked_early = true;
            else if (!f->unsupported[0]) snprintf(f->unsupported, sizeof f->unsupported, "%s", f->coding);
        }
        snprintf(f->coding, sizeof f->coding, "%.*s", (int)(n < 31 ? n : 31), p);
        p += n;
    }
    return MHD_YES;
}

/* -1 with e filled when the request's framing is refused. */
static int check_framing(struct MHD_Connection *c, em_srv_error *e) {
    framing f = { 0 };
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
    if (f.n_te && f.n_length)
        return em_srv_fail(e, 400, "invalid_request_error", NULL,
                           "the request has both Transfer-Encoding and Content-Length; send one");
    if (f.other_length)
        return em_srv_fail(e, 400, "invalid_request_error", NULL,
                           "the request has two different Content-Length headers ('%.40s' and '%.40s')", f.length,
                           f.other_length);
    if (!f.n_te) return 0;
    if (!f.n_codings) return em_srv_fail(e, 400, "invalid_request_error", NULL, "Transfer-Encoding is empty");
    if (strcasecmp(f.coding, "chunked") || f.chunked_early)
        return em_srv_fail(e, 400, "invalid_request_error", NULL,
                           "Transfer-Encoding '%s' does not end with one 'chunked': the body's length cannot be "
                           "determined",
                           f.coding);
    if (f.unsupported[0])
        return em_srv_fail(e, 400, "invalid_request_error", NULL,
                           "transfer coding '%s' is not supported (only chunked)", f.unsupported);
    return 0;
}

/* ---- checks made on the headers ------------------------------------------------------------ */

/* "Bearer KEY" against the server's key, in time independent of where they differ. */
static bool api_key_ok(const char *want, const char *header) {
    if (!header) return false;
    while (*header == ' ' || *header == '\t') header++;
    if (strncasecmp(header, "Bearer", 6) || (header[6] != ' ' && header[6] != '\t')) return false;
    const char *key = header + 7;
    while (*key == ' ' || *key == '\t') key++;
    size_t n = strlen(key);
    while (n && (key[n - 1] == ' ' || key[n - 1] == '\t')) n--;
    size_t wn = strlen(want);
    unsigned diff = n != wn;
    for (size_t i = 0; i < wn; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < n ? key[i] : 0);
    return diff == 0;
}

/* JSON bodies only: application/json or application/...+json (parameters allowed), or no
 * content type at all. */
static bool json_content_type(const char *ct) {
    if (!ct) return true;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, "; \t");
    if (n == 16 && !strncasecmp(ct, "application/json", 16)) return true;
    return n > 17 && !strncasecmp(ct, "application/", 12) && !strncasecmp(ct + n - 5, "+json", 5);
}

/* What can be decided from the method, path and headers alone; -1 with e filled to refuse. */
static int check_headers(em_server *s, struct MHD_Connection *c, const char *url, const char *method,
                         http_req *r, em_srv_error *e) {
    const route_def *def = find_route(url);
    r->route = def ? def->route : EM_ROUTE_NONE;
    if (!def) return em_srv_fail(e, 404, "not_found_error", NULL, "File Not Found: %.200s", url);
    bool is_get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    bool is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
    if (def->post ? !is_post : !is_get)
        return em_srv_fail(e, 405, "invalid_request_error", NULL, "%.20s is not allowed on %s (use %s)", method, def->path,
                           def->post ? "POST" : "GET");
    if (def->route != EM_ROUTE_HEALTH && s->opts.api_key &&
        !api_key_ok(s->opts.api_key, MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION))) {
        em_srv_fail(e, 401, "authentication_error", NULL, "Invalid API Key");
        e->code = "invalid_api_key";
        return -1;
    }
    if (!is_post) return 0;
    if (!json_content_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE)))
        return em_srv_fail(e, 415, "invalid_request_error", NULL,
                           "unsupported content type '%.100s': send Content-Type: application/json",
                           MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE));
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || end == cl || n > s->opts.max_body)
            return em_srv_fail(e, 413, "invalid_request_error", NULL,
                               "the request body is larger than %zu bytes (--max-body)", s->opts.max_body);
    }
    return 0;
}

/* ---- endpoints ------------------------------------------------------------------------------ */

static char *dup_text(const char *text) {
    size_t n = strlen(text) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, text, n);
    return p;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    size_t n = em_srv_job_read(cls, buf, max);
    return n ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

/* Streams being sent are counted so that stopping can let them finish (em_srv_http_drain). */
static void streams_add(em_server *s, int d) {
    pthread_mutex_lock(&s->conn_mu);
    s->n_streams += d;
    pthread_cond_broadcast(&s->conn_cv);
    pthread_mutex_unlock(&s->conn_mu);
}

static void sse_free(void *cls) {
    em_srv_job *j = cls;
    em_server *s = j->srv;
    em_srv_job_unref(j);
    streams_add(s, -1);
}

static enum MHD_Result stream_job(em_server *s, struct MHD_Connection *c, http_req *r) {
    em_srv_job_ref(r->job); /* the response's own reference, dropped by sse_free */
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_read, r->job, sse_free);
    if (!resp) {
        em_srv_job_unref(r->job);
        return MHD_NO;
    }
    streams_add(s, 1);
    add_common_headers(resp, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    note_response(s, r, MHD_HTTP_OK);
    return ret;
}

static enum MHD_Result generate(em_server *s, struct MHD_Connection *c, http_req *r) {
    em_srv_error e;
    em_srv_req req;
    int kind = r->route == EM_ROUTE_CHAT ? EM_SRV_CHAT : EM_SRV_COMPLETION;
    if (em_srv_parse_generate(&s->mctx, kind, r->body ? r->body : "", r->len, em_srv_random(s), &req, &e))
        return respond_error(s, c, r, &e);
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    em_srv_job *job = em_srv_job_create(s, &req, info ? info->connect_fd : -1);
    if (!job) {
        em_srv_req_free(&req);
        em_srv_fail(&e, 500, "server_error", NULL, "out of memory");
        return respond_error(s, c, r, &e);
    }
    if (em_srv_job_submit(job, &e)) {
        em_srv_job_unref(job);
        return respond_error(s, c, r, &e);
    }
    r->job = job;
    if (job->req.stream) return stream_job(s, c, r);
    em_srv_job_wait(job);
    pthread_mutex_lock(&s->mu);
    char *body = job->body;
    int status = job->status;
    job->body = NULL;
    pthread_mutex_unlock(&s->mu);
    if (!body) { /* cancelled: the client is gone, but answer in case it is not */
        em_srv_fail(&e, 500, "server_error", NULL, "the generation was cancelled");
        return respond_error(s, c, r, &e);
    }
    return respond_json(s, c, r, status, body);
}

static enum MHD_Result dispatch(em_server *s, struct MHD_Connection *c, http_req *r) {
    em_srv_error e;
    bool ready = atomic_load(&s->ready);
    if (r->route == EM_ROUTE_HEALTH && ready && em_srv_model_lost(s, &e)) return respond_error(s, c, r, &e);
    if (r->route == EM_ROUTE_HEALTH)
        return ready ? respond_json(s, c, r, 200, dup_text("{\"status\":\"ok\"}"))
                     : (em_srv_fail(&e, 503, "unavailable_error", NULL, "Loading model"), respond_error(s, c, r, &e));
    if (r->route == EM_ROUTE_METRICS) {
        pthread_mutex_lock(&s->mu);
        int queued = s->n_queued, processing = s->running != NULL;
        pthread_mutex_unlock(&s->mu);
        return respond(s, c, r, 200, em_srv_metrics_render(&s->metrics, queued, processing, ready),
                       "text/plain; version=0.0.4; charset=utf-8");
    }
    if (!ready) {
        em_srv_fail(&e, 503, "unavailable_error", NULL, "Loading model");
        return respond_error(s, c, r, &e);
    }
    char *out = NULL;
    switch (r->route) {
    case EM_ROUTE_MODELS: return respond_json(s, c, r, 200, em_srv_models_json(s));
    case EM_ROUTE_PROPS: return respond_json(s, c, r, 200, em_srv_props_json(s));
    case EM_ROUTE_TOKENIZE:
    case EM_ROUTE_DETOKENIZE:
        out = r->route == EM_ROUTE_TOKENIZE ? em_srv_tokenize(&s->mctx, r->body ? r->body : "", r->len, &e)
                                            : em_srv_detokenize(&s->mctx, r->body ? r->body : "", r->len, &e);
        return out ? respond_json(s, c, r, 200, out) : respond_error(s, c, r, &e);
    default: return generate(s, c, r);
    }
}

/* ---- connections and the request timeout ------------------------------------------------------- */

/* libmicrohttpd's own timeout (--timeout) counts idle time, so a client that sends a header
 * byte now and then would hold its connection (and a thread, and a slot of
 * --max-connections) for ever. Each connection is therefore tracked from MHD's "started" to
 * its "closed" notification: while a request is due (from the connection's start or the end of
 * the previous response until the request's last body byte) it has a deadline, and the reaper
 * shuts the socket down once the deadline passes. MHD then sees the client gone and closes the
 * connection (no answer is sent: MHD may be in the middle of reading). Once a request is in,
 * its answer, however long it takes to generate or stream, has no such deadline. */

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    em_server *s = cls;
    em_srv_conn *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!info || !(k = calloc(1, sizeof *k))) return; /* untracked: only MHD's idle timeout applies */
        k->fd = info->connect_fd;
        k->receiving = true;
        k->deadline = mono_now() + s->opts.request_timeout_s;
        pthread_mutex_lock(&s->conn_mu);
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = k;
        return;
    }
    if (code != MHD_CONNECTION_NOTIFY_CLOSED || !k) return;
    pthread_mutex_lock(&s->conn_mu);
    if (k->prev) k->prev->next = k->next;
    else s->conns = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&s->conn_mu);
    free(k);
    *socket_context = NULL;
}

static void set_due(em_server *s, struct MHD_Connection *c, bool due) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    em_srv_conn *k = info ? info->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&s->conn_mu);
    k->receiving = due;
    if (due) k->deadline = mono_now() + s->opts.request_timeout_s;
    pthread_mutex_unlock(&s->conn_mu);
}

/* The request is in (or answered before its body): its answer has no deadline. */
static void request_received(em_server *s, struct MHD_Connection *c) { set_due(s, c, false); }
/* A response is done: the next request on this connection is due within the timeout. */
static void next_request_due(em_server *s, struct MHD_Connection *c) { set_due(s, c, true); }

static void *reaper_main(void *arg) {
    em_server *s = arg;
    pthread_mutex_lock(&s->conn_mu);
    while (!s->reaper_stop) {
        double now = mono_now(), next = now + s->opts.request_timeout_s;
        for (em_srv_conn *k = s->conns; k; k = k->next) {
            if (!k->receiving) continue;
            if (k->deadline <= now) {
                em_log(EM_LOG_DEBUG, "serve: http: no complete request within %u s (--request-timeout): closing",
                       s->opts.request_timeout_s);
                shutdown(k->fd, SHUT_RDWR); /* fd is still this connection's: see em_srv_conn */
                k->receiving = false;
            } else if (k->deadline < next) next = k->deadline;
        }
        /* new deadlines are at least now + the timeout, never before the one waited for */
        struct timespec until = { .tv_sec = (time_t)next, .tv_nsec = (long)((next - (double)(time_t)next) * 1e9) };
        pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &until);
    }
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

/* ---- MHD callbacks ---------------------------------------------------------------------------- */

/* Keeps body bytes up to the limit; past it, counts and drops them (the answer is 413), and
 * gives up on the connection when a client keeps sending far more. */
static enum MHD_Result take_body(em_server *s, http_req *r, const char *data, size_t n) {
    if (!r->too_big && r->len + n <= s->opts.max_body) {
        if (r->len + n + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < r->len + n + 1) cap *= 2;
            char *b = realloc(r->body, cap);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->len, data, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    r->too_big = true;
    r->discarded += n;
    return r->discarded > 4 * (uint64_t)s->opts.max_body + (64u << 20) ? MHD_NO : MHD_YES;
}

/* Whether the request announces a body (a length above 0, or chunked transfer). */
static bool has_body(struct MHD_Connection *c) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING)) return true;
    return cl && strspn(cl, " 0") != strlen(cl);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    em_server *s = cls;
    http_req *r = *con_cls;
    if (!r) { /* the headers are in */
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *con_cls = r;
        r->method = method;
        r->url = url;
        r->route = find_route(url) ? find_route(url)->route : EM_ROUTE_NONE;
        if (check_framing(c, &r->err)) {
            r->close = true;
            request_received(s, c);
            return respond_error(s, c, r, &r->err);
        }
        if (!strcmp(method, MHD_HTTP_METHOD_OPTIONS)) {
            if (!has_body(c)) return MHD_YES;
            request_received(s, c);
            return respond_cors_preflight(s, c, r);
        }
        if (check_headers(s, c, url, method, r, &r->err)) {
            r->refused = true;
            /* refusing before a body arrives skips it (MHD then closes the connection);
             * without a body, answer once the request is complete and keep the connection */
            if (has_body(c)) {
                request_received(s, c);
                return respond_error(s, c, r, &r->err);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        enum MHD_Result ret = take_body(s, r, upload_data, *upload_size);
        *upload_size = 0;
        return ret;
    }
    request_received(s, c); /* before dispatch, which may wait for the worker */
    if (!strcmp(method, MHD_HTTP_METHOD_OPTIONS)) return respond_cors_preflight(s, c, r);
    if (r->refused) return respond_error(s, c, r, &r->err);
    if (r->too_big) {
        em_srv_error e;
        em_srv_fail(&e, 413, "invalid_request_error", NULL, "the request body is larger than %zu bytes (--max-body)",
                    s->opts.max_body);
        return respond_error(s, c, r, &e);
    }
    return dispatch(s, c, r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    em_server *s = cls;
    next_request_due(s, c);
    http_req *r = *con_cls;
    if (!r) return;
    if (r->job) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) atomic_store(&r->job->cancel, true);
        em_srv_job_unref(r->job);
    }
    free(r->body);
    free(r);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (em_log_get_level() < EM_LOG_DEBUG) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    em_log(EM_LOG_DEBUG, "serve: http: %s", line);
}

/* ---- the listening socket and the daemon --------------------------------------------------------- */

static int listen_on(const char *host, int port, int *fd_out, int *family, em_err *err) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo *list;
    int gai = getaddrinfo(host, service, &hints, &list);
    if (gai) return em_err_set(err, EM_EINVAL, "cannot resolve --host %s: %s", host, gai_strerror(gai));
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = list; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, LISTEN_BACKLOG)) {
            last_errno = errno;
            close(fd);
            fd = -1;
            continue;
        }
        *family = a->ai_family;
    }
    freeaddrinfo(list);
    if (fd < 0)
        return em_err_set(err, EM_EIO, "cannot listen on %s port %d: %s", host, port, strerror(last_errno));
    *fd_out = fd;
    return EM_OK;
}

static int bound_port(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len)) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

static int start_reaper(em_server *s, em_err *err) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_cond_init(&s->conn_cv, &attr);
    pthread_condattr_destroy(&attr);
    int rc = pthread_create(&s->reaper, NULL, reaper_main, s);
    if (rc) {
        pthread_cond_destroy(&s->conn_cv);
        pthread_mutex_destroy(&s->conn_mu);
        return em_err_set(err, EM_EIO, "serve: cannot start the request-timeout thread: %s", strerror(rc));
    }
    s->reaper_started = true;
    return EM_OK;
}

static void stop_reaper(em_server *s) {
    if (!s->reaper_started) return;
    pthread_mutex_lock(&s->conn_mu);
    s->reaper_stop = true;
    pthread_cond_broadcast(&s->conn_cv);
    pthread_mutex_unlock(&s->conn_mu);
    pthread_join(s->reaper, NULL);
    s->reaper_started = false;
    pthread_cond_destroy(&s->conn_cv);
    pthread_mutex_destroy(&s->conn_mu);
}

int em_srv_http_start(em_server *s, em_err *err) {
    int fd = -1, family = AF_INET;
    int rc = start_reaper(s, err);
    if (rc) return rc;
    rc = listen_on(s->opts.host, s->opts.port, &fd, &family, err);
    if (rc) {
        stop_reaper(s);
        return rc;
    }
    s->port = bound_port(fd);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES) flags |= MHD_USE_POLL;
    if (family == AF_INET6) flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                              MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_CONNECTION_LIMIT, s->opts.connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                              s->opts.connections_per_ip, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                              MHD_OPTION_CONNECTION_TIMEOUT, s->opts.timeout_s, MHD_OPTION_END);
    if (!s->mhd) {
        close(fd);
        stop_reaper(s);
        return em_err_set(err, EM_EIO, "libmicrohttpd could not start on %s port %d", s->opts.host, s->port);
    }
    return EM_OK;
}

void em_srv_http_drain(em_server *s, double seconds) {
    if (!s->reaper_started) return;
    double end = mono_now() + seconds;
    struct timespec until = { .tv_sec = (time_t)end, .tv_nsec = (long)((end - (double)(time_t)end) * 1e9) };
    pthread_mutex_lock(&s->conn_mu);
    while (s->n_streams > 0 && pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &until) == 0) {}
    pthread_mutex_unlock(&s->conn_mu);
}

void em_srv_http_stop(em_server *s) {
    if (s->mhd) MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    stop_reaper(s); /* after MHD: its last "closed" notifications take conn_mu */
}
