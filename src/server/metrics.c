/* server/metrics.c: the server's counters and their Prometheus text exposition (GET /metrics).
 * Counters only grow; the two gauges (queued, processing) are read by the caller at render
 * time. One mutex guards everything here; updates are a handful per request, never per
 * token. Expert counters are the target's own totals (model.h em_target_expert_stats), copied
 * after each generation; resident experts count every use as a cache hit and read nothing. */
#include "server/server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const route_names[EM_ROUTE_COUNT] = {
    [EM_ROUTE_NONE] = "other",           [EM_ROUTE_HEALTH] = "/health",
    [EM_ROUTE_MODELS] = "/v1/models",    [EM_ROUTE_CHAT] = "/v1/chat/completions",
    [EM_ROUTE_COMPLETIONS] = "/v1/completions", [EM_ROUTE_TOKENIZE] = "/tokenize",
    [EM_ROUTE_DETOKENIZE] = "/detokenize", [EM_ROUTE_PROPS] = "/props",
    [EM_ROUTE_METRICS] = "/metrics",
};

const char *em_srv_route_name(int route) {
    return route >= 0 && route < EM_ROUTE_COUNT ? route_names[route] : "other";
}

void em_srv_metrics_init(em_srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void em_srv_metrics_destroy(em_srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void em_srv_metrics_response(em_srv_metrics *m, int route, int status) {
    if (route < 0 || route >= EM_ROUTE_COUNT) route = EM_ROUTE_NONE;
    int cls = status >= 500 ? 2 : status >= 400 ? 1 : 0;
    pthread_mutex_lock(&m->mu);
    m->c.http[route][cls]++;
    pthread_mutex_unlock(&m->mu);
}

void em_srv_metrics_rejected(em_srv_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->c.rejected++;
    pthread_mutex_unlock(&m->mu);
}

void em_srv_metrics_generation(em_srv_metrics *m, const em_decode_result *r, int n_gen, bool cancelled) {
    pthread_mutex_lock(&m->mu);
    m->c.gen_requests++;
    if (cancelled) m->c.cancelled++;
    m->c.prompt_tokens += (uint64_t)r->n_prompt;
    m->c.prompt_seconds += r->prompt_seconds;
    m->c.gen_tokens += (uint64_t)(n_gen > 0 ? n_gen : 0);
    m->c.gen_seconds += r->gen_seconds;
    m->c.passes += r->passes;
    m->c.drafted += r->drafted;
    m->c.accepted += r->accepted;
    m->c.draft_seconds += r->draft_seconds;
    m->c.target_seconds += r->target_seconds;
    m->c.expert_gen_bytes_read += r->gen_bytes_read;
    pthread_mutex_unlock(&m->mu);
}

void em_srv_metrics_devices(em_srv_metrics *m, const char *device, const char *draft_device) {
    pthread_mutex_lock(&m->mu);
    snprintf(m->device, sizeof m->device, "%s", device ? device : "");
    snprintf(m->draft_device, sizeof m->draft_device, "%s", draft_device ? draft_device : "");
    pthread_mutex_unlock(&m->mu);
}

void em_srv_metrics_experts(em_srv_metrics *m, const em_target *t) {
    em_target_expert_counts x;
    if (em_target_expert_stats(t, -1, &x, NULL)) return;
    pthread_mutex_lock(&m->mu);
    m->c.expert_bytes_read = x.bytes_read;
    m->c.expert_hits = x.hits;
    m->c.expert_misses = x.misses;
    pthread_mutex_unlock(&m->mu);
}

/* A growing text buffer; on failure it stays failed and render returns NULL. */
typedef struct out {
    char *buf;
    size_t len, cap;
    bool failed;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...) {
    if (o->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = true;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = 2 * o->cap + (size_t)n;
        char *b = realloc(o->buf, cap);
        if (!b) {
            o->failed = true;
            return;
        }
        o->buf = b;
        o->cap = cap;
    }
}

/* A label value, escaped as the text format asks (backslash, double quote, newline). */
static void label(out *o, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') put(o, "\\%c", *v);
        else if (*v == '\n') put(o, "\\n");
        else put(o, "%c", *v);
    }
}

static void counter(out *o, const char *name, const char *help, double v) {
    put(o, "# HELP ember_%s %s\n# TYPE ember_%s counter\nember_%s %.17g\n", name, help, name, name, v);
}

static void gauge(out *o, const char *name, const char *help, double v) {
    put(o, "# HELP ember_%s %s\n# TYPE ember_%s gauge\nember_%s %.17g\n", name, help, name, name, v);
}

char *em_srv_metrics_render(em_srv_metrics *m, int queued, int processing, bool ready) {
    out o = { .cap = 4096 };
    if (!(o.buf = malloc(o.cap))) return NULL;
    o.buf[0] = 0;
    pthread_mutex_lock(&m->mu);
    em_srv_counters c = m->c; /* a consistent snapshot */
    char device[sizeof m->device], draft_device[sizeof m->draft_device];
    memcpy(device, m->device, sizeof device), memcpy(draft_device, m->draft_device, sizeof draft_device);
    pthread_mutex_unlock(&m->mu);

    put(&o, "# HELP ember_http_responses_total HTTP responses by endpoint and status class.\n"
            "# TYPE ember_http_responses_total counter\n");
    static const char *const classes[3] = { "2xx", "4xx", "5xx" };
    for (int r = 0; r < EM_ROUTE_COUNT; r++)
        for (int k = 0; k < 3; k++)
            put(&o, "ember_http_responses_total{endpoint=\"%s\",class=\"%s\"} %llu\n", route_names[r], classes[k],
                (unsigned long long)c.http[r][k]);
    counter(&o, "requests_total", "Generation requests finished (chat and completions, any outcome).",
            (double)c.gen_requests);
    counter(&o, "requests_rejected_total", "Generation requests refused with 503 because the queue was full.",
            (double)c.rejected);
    counter(&o, "requests_cancelled_total", "Generations stopped early because the client went away.",
            (double)c.cancelled);
    gauge(&o, "requests_processing", "Generation requests being decoded now.", processing);
    gauge(&o, "requests_deferred", "Generation requests waiting in the queue.", queued);
    gauge(&o, "ready", "1 when the model is loaded and requests are served.", ready ? 1 : 0);
    counter(&o, "prompt_tokens_total", "Prompt tokens processed.", (double)c.prompt_tokens);
    counter(&o, "prompt_seconds_total", "Seconds spent on prompts (prefill).", c.prompt_seconds);
    counter(&o, "tokens_predicted_total", "Tokens generated.", (double)c.gen_tokens);
    counter(&o, "tokens_predicted_seconds_total", "Seconds spent generating after the prompt.", c.gen_seconds);
    counter(&o, "spec_passes_total", "Target passes (verify calls) of the decode loop.", (double)c.passes);
    counter(&o, "spec_drafted_total", "Draft tokens proposed for verification.", (double)c.drafted);
    counter(&o, "spec_accepted_total", "Draft tokens accepted by the target.", (double)c.accepted);
    counter(&o, "spec_draft_seconds_total", "Seconds in the drafter (proposals and its context), on its device.",
            c.draft_seconds);
    counter(&o, "spec_target_seconds_total",
            "Seconds in the target's verify and commit calls while generating (the passes), on its device.",
            c.target_seconds);
    if (device[0]) { /* known once the model is loaded */
        put(&o, "# HELP ember_device_info Where the target and the drafter run (drafter \"none\": plain decoding).\n"
                "# TYPE ember_device_info gauge\nember_device_info{target=\"");
        label(&o, device);
        put(&o, "\",drafter=\"");
        label(&o, draft_device[0] ? draft_device : "none");
        put(&o, "\"} 1\n");
    }
    counter(&o, "expert_bytes_read_total", "Bytes of routed experts read from storage.", (double)c.expert_bytes_read);
    counter(&o, "expert_cache_hits_total", "Routed-expert lookups served from the expert cache.", (double)c.expert_hits);
    counter(&o, "expert_cache_misses_total", "Routed-expert lookups that read storage.", (double)c.expert_misses);
    counter(&o, "expert_bytes_read_generating_total",
            "Bytes of routed experts read from storage while generating (after prompts); over spec_passes_total + "
            "spec_accepted_total (the tokens the passes committed), the bytes a generated token cost.",
            (double)c.expert_gen_bytes_read);
    if (o.failed) {
        free(o.buf);
        return NULL;
    }
    return o.buf;
}
