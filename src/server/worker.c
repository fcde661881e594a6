/* server/worker.c: the request queue and the one decode worker. Connections submit jobs
 * (parsed, tokenized requests); the worker takes them in order and runs each through the
 * decode loop (decode/), turning tokens into text (its own stream decoder, invalid UTF-8 as
 * U+FFFD, special tokens skipped), cutting at stop strings, and either queueing SSE events
 * for the connection to send (streaming) or building the whole response.
 *
 * Invariants: the server mutex guards the queue, every job's state, refs and output; the
 * worker never holds it while decoding. A job is freed by whoever drops its last reference
 * (connection, streaming response, worker, queue). Before each decode step's token is
 * accepted the worker checks whether the client is still there (cancel flag, socket
 * hang-up), so a vanished client stops its generation within one step. After each job it
 * checks that the model's files are still what was mapped: once one changed on disk the model
 * is lost (every later request, and /health, is 503 saying so). Must not: touch MHD (http.c
 * owns the connections). */
#include "server/server_impl.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- ids ------------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t em_srv_random(em_server *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t x = splitmix64(&s->id_state);
    pthread_mutex_unlock(&s->mu);
    return x;
}

void em_srv_make_id(em_server *s, const char *prefix, char *out, size_t cap) {
    uint64_t a = em_srv_random(s), b = em_srv_random(s);
    snprintf(out, cap, "%s%016llx%016llx", prefix, (unsigned long long)a, (unsigned long long)b);
}

/* ---- jobs ----------------------------------------------------------------------------- */

em_srv_job *em_srv_job_create(em_server *s, em_srv_req *req, int client_fd) {
    em_srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->srv = s;
    j->refs = 1;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->client_fd = client_fd;
    atomic_init(&j->cancel, false);
    pthread_cond_init(&j->cv, NULL);
    em_srv_make_id(s, j->req.kind == EM_SRV_CHAT ? "chatcmpl-" : "cmpl-", j->id, sizeof j->id);
    j->meta = (em_srv_meta){ .kind = j->req.kind, .id = j->id, .created = (int64_t)time(NULL), .model = s->model_id };
    return j;
}

static void job_free(em_srv_job *j) {
    em_srv_req_free(&j->req);
    pthread_cond_destroy(&j->cv);
    free(j->out);
    free(j->body);
    free(j);
}

void em_srv_job_ref(em_srv_job *j) {
    pthread_mutex_lock(&j->srv->mu);
    j->refs++;
    pthread_mutex_unlock(&j->srv->mu);
}

/* Drops a reference with s->mu held; true when the caller must free the job (after unlocking). */
static bool job_release_locked(em_srv_job *j) { return --j->refs == 0; }

void em_srv_job_unref(em_srv_job *j) {
    if (!j) return;
    em_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    bool last = job_release_locked(j);
    pthread_mutex_unlock(&s->mu);
    if (last) job_free(j);
}

/* SSE bytes a stream may have waiting for its client; a client that reads nothing while more
 * piles up is treated as gone (its generation stops) rather than buffered without bound. */
#define MAX_PENDING_OUT (64u << 20)

/* Appends SSE bytes for the connection (s->mu held). */
static void out_append_locked(em_srv_job *j, const char *a, size_t na, const char *b, size_t nb, const char *c,
                              size_t nc) {
    if (j->out_failed) return;
    if (j->out_len - j->out_pos > MAX_PENDING_OUT) {
        atomic_store(&j->cancel, true);
        return;
    }
    size_t need = j->out_len + na + nb + nc;
    if (need == j->out_len) return; /* nothing to add (and out may still be NULL) */
    if (need > j->out_cap) {
        size_t cap = j->out_cap ? j->out_cap : 1024;
        while (cap < need) cap *= 2;
        char *o = realloc(j->out, cap);
        if (!o) {
            j->out_failed = true;
            pthread_cond_broadcast(&j->cv);
            return;
        }
        j->out = o;
        j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, a, na);
    memcpy(j->out + j->out_len + na, b, nb);
    memcpy(j->out + j->out_len + na + nb, c, nc);
    j->out_len = need;
    pthread_cond_broadcast(&j->cv);
}

/* One Server-Sent Event: "data: JSON\n\n" (json NULL: memory ran out, the stream ends). */
static void send_event(em_srv_job *j, char *json) {
    em_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    if (json) out_append_locked(j, "data: ", 6, json, strlen(json), "\n\n", 2);
    else {
        j->out_failed = true;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&s->mu);
    free(json);
}

/* Finishes a job that will not run (s->mu held): an error response, or an error event. */
static void fail_job_locked(em_srv_job *j, int status, const char *type, const char *msg) {
    em_srv_error e;
    em_srv_fail(&e, status, type, NULL, "%s", msg);
    char *json = em_srv_error_json(&e);
    if (j->req.stream && json) out_append_locked(j, "data: ", 6, json, strlen(json), "\n\n", 2);
    free(j->body);
    j->body = json;
    j->status = status;
    j->state = EM_JOB_DONE;
    pthread_cond_broadcast(&j->cv);
}

/* The model's files changed on disk (s->mu held): e filled with the 503 every request gets. */
static bool model_lost_locked(em_server *s, em_srv_error *e) {
    if (!s->model_lost) return false;
    em_srv_fail(e, 503, "unavailable_error", NULL, "%s", s->model_lost_msg);
    return true;
}

bool em_srv_model_lost(em_server *s, em_srv_error *e) {
    pthread_mutex_lock(&s->mu);
    bool lost = model_lost_locked(s, e);
    pthread_mutex_unlock(&s->mu);
    return lost;
}

/* After each job: whether the model's files are still what was mapped (a file truncated or
 * rewritten under the server fails the job that ran into it with 500 through the target's own
 * checks); once not, the model is lost for good and every later request is 503. */
static void check_model_files(em_server *s) {
    em_err err = { 0 };
    if (!em_model_files_check(true, &err)) return;
    pthread_mutex_lock(&s->mu);
    bool first = !s->model_lost;
    s->model_lost = true;
    snprintf(s->model_lost_msg, sizeof s->model_lost_msg, "%s", err.msg);
    pthread_mutex_unlock(&s->mu);
    if (first) em_log(EM_LOG_ERROR, "serve: %s; every request fails (503) until the server is restarted", err.msg);
}

int em_srv_job_submit(em_srv_job *j, em_srv_error *e) {
    em_server *s = j->srv;
    int cap = s->opts.queue < 0 ? 0 : s->opts.queue;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return em_srv_fail(e, 503, "unavailable_error", NULL, "the server is shutting down");
    }
    if (model_lost_locked(s, e)) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (s->n_queued + (s->running ? 1 : 0) >= cap + 1) {
        int queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        em_srv_metrics_rejected(&s->metrics);
        return em_srv_fail(e, 503, "unavailable_error", NULL,
                           "the server is busy: %d requests are waiting (--queue %d); retry later", queued, cap);
    }
    j->refs++;
    j->state = EM_JOB_QUEUED;
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->n_queued++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void em_srv_job_wait(em_srv_job *j) {
    em_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    while (j->state != EM_JOB_DONE) pthread_cond_wait(&j->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

size_t em_srv_job_read(em_srv_job *j, char *buf, size_t max) {
    em_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    while (j->out_pos == j->out_len && j->state != EM_JOB_DONE && !j->out_failed)
        pthread_cond_wait(&j->cv, &s->mu);
    size_t n = j->out_len - j->out_pos;
    if (n > max) n = max;
    if (n) memcpy(buf, j->out + j->out_pos, n); /* n == 0: out may be NULL (nothing was ever sent) */
    j->out_pos += n;
    if (j->out_pos == j->out_len) j->out_pos = j->out_len = 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---- one generation ------------------------------------------------------------------- */

typedef struct gen {
    em_srv_job *job;
    em_tok_stream *ts;
    em_srv_text text;
    int n_gen;
    int32_t *tokens;   /* with return_tokens */
    size_t n_tokens, cap_tokens;
    bool cancelled;
    int rc;            /* first failure inside the callback */
    em_err err;
} gen;

/* The client closed its end (or the stream broke, or the server is stopping). */
static bool client_gone(em_srv_job *j) {
    if (atomic_load(&j->cancel)) return true;
    if (j->client_fd < 0) return false;
    struct pollfd p = { .fd = j->client_fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Streams the text that is safe to hand out (all of it when final). */
static void stream_text(gen *g, bool final) {
    size_t end = em_srv_text_ready(&g->text, final);
    if (end <= g->text.sent) return;
    em_srv_job *j = g->job;
    send_event(j, em_srv_chunk_json(&j->meta, false, g->text.buf + g->text.sent, end - g->text.sent, NULL, NULL,
                                    j->req.include_usage));
    g->text.sent = end;
}

static int keep_token(gen *g, int32_t token) {
    if (g->n_tokens == g->cap_tokens) {
        size_t cap = g->cap_tokens ? 2 * g->cap_tokens : 256;
        int32_t *t = realloc(g->tokens, cap * sizeof *t);
        if (!t) return em_err_set(&g->err, EM_ENOMEM, "out of memory for the generated token list");
        g->tokens = t;
        g->cap_tokens = cap;
    }
    g->tokens[g->n_tokens++] = token;
    return EM_OK;
}

static int on_token(void *ud, int32_t token, const char *bytes, size_t len) {
    gen *g = ud;
    (void)bytes, (void)len; /* the text comes from this request's own stream decoder */
    if (token < 0) return 0;  /* the loop's final held-back bytes: ours are flushed after */
    g->n_gen++;
    const char *b = NULL;
    size_t n = 0;
    if ((g->job->req.return_tokens && (g->rc = keep_token(g, token))) ||
        (g->rc = em_tok_stream_push(g->ts, token, &b, &n, &g->err)) ||
        (g->rc = em_srv_text_push(&g->text, b, n, &g->err)))
        return 1;
    if (g->job->req.stream) stream_text(g, false);
    if (g->text.matched) return 1;
    if (client_gone(g->job)) {
        g->cancelled = true;
        return 1;
    }
    return 0;
}

static void finish_stream(gen *g, const char *finish, const em_srv_stats *st) {
    em_srv_job *j = g->job;
    stream_text(g, true);
    send_event(j, em_srv_chunk_json(&j->meta, false, "", 0, finish, st, j->req.include_usage));
    if (j->req.include_usage) send_event(j, em_srv_usage_chunk_json(&j->meta, st));
    em_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    out_append_locked(j, "data: [DONE]\n\n", 14, "", 0, "", 0);
    pthread_mutex_unlock(&s->mu);
}

/* The request was validated before it was queued, so whatever fails now (the model's logits
 * all NaN, memory, a model file changed on disk) is the server's fault: 500, with the engine's
 * message as it is (it names what failed). */
static void finish_error(em_srv_job *j, const em_err *err) {
    em_server *s = j->srv;
    em_log(EM_LOG_ERROR, "serve: %s: generation failed: %s", j->id, err->msg);
    pthread_mutex_lock(&s->mu);
    fail_job_locked(j, 500, "server_error", err->msg);
    pthread_mutex_unlock(&s->mu);
}

/* A generation the server stopped (SIGTERM) rather than its client: the client is told. */
static bool stopped_by_server(em_srv_job *j) {
    em_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    if (stopping) fail_job_locked(j, 503, "unavailable_error", "the server is shutting down");
    pthread_mutex_unlock(&s->mu);
    return stopping;
}

/* Runs j through the decode loop and leaves its response (or events) behind; the caller
 * marks it DONE. */
static void run_job(em_server *s, em_srv_job *j) {
    gen g = { .job = j };
    em_decode_result res = { 0 };
    if (client_gone(j)) {
        em_srv_metrics_generation(&s->metrics, &res, 0, true);
        return;
    }
    em_srv_text_init(&g.text, j->req.stop, j->req.n_stop);
    int rc = em_tok_stream_create(&g.ts, s->model.tok, EM_TOK_STREAM_SKIP_SPECIAL | EM_TOK_STREAM_REPLACE, &g.err);
    if (!rc && j->req.stream && j->req.kind == EM_SRV_CHAT)
        send_event(j, em_srv_chunk_json(&j->meta, true, "", 0, NULL, NULL, j->req.include_usage));
    if (!rc) {
        em_decode_params p = { .sampling = j->req.sampling, .n_max = j->req.n_max, .ignore_eog = j->req.ignore_eos };
        em_err err = { 0 };
        rc = em_decode_generate(s->model.spec, j->req.prompt, j->req.n_prompt, &p, on_token, &g, &res, &err);
        if (rc && !g.rc) g.err = err;
        if (g.rc) rc = g.rc;
    }
    if (!rc && !g.text.matched) { /* bytes the decoder held back (an unfinished UTF-8 sequence) */
        const char *b;
        size_t n;
        em_tok_stream_flush(g.ts, &b, &n);
        rc = em_srv_text_push(&g.text, b, n, &g.err);
    }
    em_srv_metrics_generation(&s->metrics, &res, g.n_gen, g.cancelled);
    if (s->model.target) em_srv_metrics_experts(&s->metrics, s->model.target);
    em_srv_stats st = { .n_prompt = res.n_prompt, .n_gen = g.n_gen, .prompt_s = res.prompt_seconds,
                        .gen_s = res.gen_seconds, .drafted = res.drafted, .accepted = res.accepted,
                        .draft_s = res.draft_seconds, .target_s = res.target_seconds, .device = s->model.info.device,
                        .draft_device = s->model.draft_device };
    const char *finish = !g.text.matched && res.finish == EM_DECODE_LENGTH ? EM_SRV_FINISH_LENGTH : EM_SRV_FINISH_STOP;
    if (rc) finish_error(j, &g.err);
    else if (g.cancelled && stopped_by_server(j))
        em_log(EM_LOG_INFO, "serve: %s: stopped by the server after %d tokens", j->id, g.n_gen);
    else if (g.cancelled) em_log(EM_LOG_INFO, "serve: %s: client went away after %d tokens", j->id, g.n_gen);
    else if (j->req.stream) finish_stream(&g, finish, &st);
    else {
        size_t len = em_srv_text_ready(&g.text, true);
        char *body = em_srv_response_json(&j->meta, g.text.buf, len, finish, &st, j->req.return_tokens ? g.tokens : NULL,
                                          g.n_tokens);
        pthread_mutex_lock(&s->mu);
        j->status = body ? 200 : 500;
        j->body = body;
        pthread_mutex_unlock(&s->mu);
    }
    em_tok_stream_free(g.ts);
    em_srv_text_free(&g.text);
    free(g.tokens);
}

/* ---- the worker thread ------------------------------------------------------------------ */

static void *worker_main(void *arg) {
    em_server *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping) pthread_cond_wait(&s->work_cv, &s->mu);
        if (s->stopping) break;
        em_srv_job *j = s->head;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->n_queued--;
        em_srv_error lost;
        if (model_lost_locked(s, &lost)) { /* queued before the model was lost */
            fail_job_locked(j, lost.status, lost.type, lost.message);
            if (job_release_locked(j)) {
                pthread_mutex_unlock(&s->mu);
                job_free(j);
                pthread_mutex_lock(&s->mu);
            }
            continue;
        }
        j->state = EM_JOB_RUNNING;
        s->running = j;
        pthread_mutex_unlock(&s->mu);

        run_job(s, j);
        check_model_files(s);

        pthread_mutex_lock(&s->mu);
        s->running = NULL;
        j->state = EM_JOB_DONE;
        pthread_cond_broadcast(&j->cv);
        if (job_release_locked(j)) {
            pthread_mutex_unlock(&s->mu);
            job_free(j);
            pthread_mutex_lock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int em_srv_worker_start(em_server *s, em_err *err) {
    int rc = pthread_create(&s->worker, NULL, worker_main, s);
    if (rc) return em_err_set(err, EM_EIO, "serve: cannot start the decode worker: %s", strerror(rc));
    s->worker_started = true;
    return EM_OK;
}

void em_srv_worker_stop(em_server *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    em_srv_job *free_list = NULL;
    while (s->head) {
        em_srv_job *j = s->head;
        s->head = j->next;
        fail_job_locked(j, 503, "unavailable_error", "the server is shutting down");
        if (job_release_locked(j)) {
            j->next = free_list;
            free_list = j;
        }
    }
    s->tail = NULL;
    s->n_queued = 0;
    if (s->running) atomic_store(&s->running->cancel, true);
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    while (free_list) {
        em_srv_job *next = free_list->next;
        job_free(free_list);
        free_list = next;
    }
    if (s->worker_started) pthread_join(s->worker, NULL);
    s->worker_started = false;
}
