/* server/server.c: the server's life cycle (server.h): options with their defaults, the model
 * handed over once it is loaded, and the order of shutting down (worker first, so that no
 * connection thread still waits on a job when the HTTP daemon joins them). */
#include "server/server_impl.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How long stopping waits for streams to reach their clients before closing them. */
#define EM_SRV_DRAIN_SECONDS 2.0

/* A copy of s in which bytes that are not valid UTF-8 become '?' (names end up in JSON). */
static char *utf8_copy(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (!c) return NULL;
    memcpy(c, s, n + 1);
    for (size_t i = 0; i < n;) {
        size_t ok = em_utf8_valid_prefix(c + i, n - i);
        i += ok;
        if (i < n) c[i++] = '?';
    }
    return c;
}

static void free_server(em_server *s) {
    em_srv_metrics_destroy(&s->metrics);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(s->host);
    free(s->api_key);
    free(s->build_info);
    free(s->model_id);
    free(s->model_path);
    free(s->chat_template);
    free(s->draft);
    free(s->device);
    free(s->draft_device);
    free(s);
}

int em_server_start(em_server **out, const em_server_opts *opts, em_err *err) {
    *out = NULL;
    em_server_opts o = opts ? *opts : (em_server_opts){ 0 };
    if (o.port < 0 || o.port > 65535) return em_err_set(err, EM_EINVAL, "serve: port %d is not in [0, 65535]", o.port);
    em_server *s = em_calloc(1, sizeof *s, "server", err);
    if (!s) return EM_ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    em_srv_metrics_init(&s->metrics);
    atomic_init(&s->ready, false);
    s->host = strdup(o.host ? o.host : EM_SERVER_DEFAULT_HOST);
    s->api_key = o.api_key && o.api_key[0] ? strdup(o.api_key) : NULL;
    s->build_info = utf8_copy(o.build_info ? o.build_info : "ember");
    if (!s->host || !s->build_info || (o.api_key && o.api_key[0] && !s->api_key)) {
        free_server(s);
        return em_err_set(err, EM_ENOMEM, "serve: out of memory");
    }
    o.host = s->host;
    o.api_key = s->api_key;
    o.build_info = s->build_info;
    if (o.queue == 0) o.queue = EM_SERVER_DEFAULT_QUEUE;
    if (o.max_body == 0) o.max_body = EM_SERVER_DEFAULT_MAX_BODY;
    if (o.connections == 0) o.connections = EM_SERVER_DEFAULT_CONNECTIONS;
    if (o.timeout_s == 0) o.timeout_s = EM_SERVER_DEFAULT_TIMEOUT;
    if (o.request_timeout_s == 0) o.request_timeout_s = EM_SERVER_DEFAULT_REQUEST_TIMEOUT;
    if (o.connections_per_ip == 0) o.connections_per_ip = EM_SERVER_DEFAULT_CONNECTIONS_PER_IP;
    if (o.connections_per_ip > o.connections) o.connections_per_ip = o.connections;
    s->opts = o;
    s->started = (int64_t)time(NULL);
    s->id_state = (uint64_t)s->started * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)s ^
                  (uint64_t)(em_time_now() * 1e9);
    int rc = em_srv_http_start(s, err);
    if (rc) {
        free_server(s);
        return rc;
    }
    *out = s;
    return EM_OK;
}

int em_server_port(const em_server *s) { return s->port; }

int em_server_set_model(em_server *s, const em_server_model *m, em_err *err) {
    if (atomic_load(&s->ready) || s->worker_started)
        return em_err_set(err, EM_EINVAL, "serve: the model is already set");
    if (!m || !m->spec || !m->tok || !m->id || !m->path || m->info.n_ctx < 2)
        return em_err_set(err, EM_EINVAL, "serve: incomplete model (spec, tokenizer, id, path and a context of at "
                                          "least 2 positions are needed)");
    s->model = *m;
    s->model_id = utf8_copy(m->id);
    s->model_path = utf8_copy(m->path);
    s->chat_template = utf8_copy(m->chat_template);
    s->draft = utf8_copy(m->draft);
    s->device = utf8_copy(m->info.device);
    s->draft_device = utf8_copy(m->draft_device);
    if (!s->model_id || !s->model_path || (m->chat_template && !s->chat_template) || (m->draft && !s->draft) ||
        (m->info.device && !s->device) || (m->draft_device && !s->draft_device))
        return em_err_set(err, EM_ENOMEM, "serve: out of memory");
    s->model.id = s->model_id;
    s->model.path = s->model_path;
    s->model.chat_template = s->chat_template;
    s->model.draft = s->draft;
    s->model.info.device = s->device;
    s->model.draft_device = s->draft_device;
    em_srv_metrics_devices(&s->metrics, s->device, s->draft_device);
    s->mctx = (em_srv_model_ctx){ .tok = m->tok, .id = s->model_id, .path = s->model_path, .n_ctx = m->info.n_ctx };
    int rc = em_srv_worker_start(s, err);
    if (rc) return rc;
    atomic_store(&s->ready, true);
    return EM_OK;
}

void em_server_stop(em_server *s) {
    if (!s || s->stopped) return;
    atomic_store(&s->ready, false);
    em_srv_worker_stop(s);
    em_srv_http_drain(s, EM_SRV_DRAIN_SECONDS); /* streams send their last event (an error) */
    em_srv_http_stop(s);
    s->stopped = true;
}

void em_server_free(em_server *s) {
    if (!s) return;
    em_server_stop(s);
    free_server(s);
}
