/* Tests of server/'s JSON layer and stop strings (no sockets: tests/server_*.sh run the real
 * server). Stop strings are checked against a brute-force reference over random texts, stops
 * and chunkings; request parsing against the tokenizer's own encodings (text/) and a table of
 * bad requests with the status and field each must name; responses by parsing them back. */
#include "testutil.h"

#include "server/server_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char model_path[4096];
static em_tok *tok;

static int setup(void **state) {
    (void)state;
    const char *bin = getenv("EMBER_BIN");
    if (!bin || !*bin) return 0; /* the model tests skip */
    if (em_test_convert_fixture(bin, "kimi_a", "f32", model_path, sizeof model_path)) return -1;
    em_gguf *g;
    em_err err = { 0 };
    if (em_gguf_open(&g, model_path, &err)) return -1;
    int rc = em_tok_create(&tok, g, NULL, &err);
    em_gguf_close(g);
    return rc ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    em_tok_free(tok);
    return 0;
}

/* ---- stop strings ----------------------------------------------------------------------- */

/* The reference: text cut before the earliest occurrence of any stop string. */
static size_t reference_cut(const char *text, size_t len, char *const *stop, int n_stop, bool *matched) {
    size_t best = len;
    *matched = false;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        for (size_t p = 0; p + sl <= len; p++)
            if (!memcmp(text + p, stop[i], sl)) {
                if (p < best) best = p;
                *matched = true;
                break;
            }
    }
    return best;
}

static void test_stop_examples(void **state) {
    (void)state;
    char *stop[] = { "o w", "xyz" };
    em_srv_text t;
    em_srv_text_init(&t, stop, 2);
    assert_int_equal(em_srv_text_push(&t, "Hel", 3, NULL), 0);
    assert_int_equal(em_srv_text_ready(&t, false), 3);
    assert_int_equal(em_srv_text_push(&t, "lo", 2, NULL), 0);
    assert_int_equal(em_srv_text_ready(&t, false), 4); /* "o" may begin "o w" */
    t.sent = 4;
    assert_int_equal(em_srv_text_push(&t, " wor", 4, NULL), 0);
    assert_true(t.matched);
    assert_int_equal(t.len, 4);
    assert_memory_equal(t.buf, "Hell", 4);
    assert_int_equal(em_srv_text_push(&t, "more", 4, NULL), 0); /* ignored once matched */
    assert_int_equal(t.len, 4);
    em_srv_text_free(&t);

    em_srv_text_init(&t, stop, 2);
    assert_int_equal(em_srv_text_push(&t, "Hello", 5, NULL), 0);
    assert_int_equal(em_srv_text_ready(&t, true), 5); /* final: nothing held back */
    em_srv_text_free(&t);
}

/* Random texts over {a,b,c}, random stops, random chunkings (tokens), against a brute-force
 * reference: generation stops at the first chunk after which some stop string occurs in the
 * text so far, and the text is cut at the earliest occurrence then. While streaming, no byte
 * past the final cut is ever released. */
static void test_stop_random(void **state) {
    (void)state;
    uint64_t rng = 12345;
    for (int round = 0; round < 5000; round++) {
        char text[64], stops[3][6];
        size_t len = 1 + em_test_rand(&rng) % 60, ends[64], n_chunks = 0;
        for (size_t i = 0; i < len; i++) text[i] = "abc"[em_test_rand(&rng) % 3];
        for (size_t pos = 0; pos < len;) {
            pos += 1 + em_test_rand(&rng) % 4;
            ends[n_chunks++] = pos < len ? pos : len;
        }
        int n_stop = (int)(em_test_rand(&rng) % 4);
        char *stop[3];
        for (int s = 0; s < n_stop; s++) {
            size_t sl = 1 + em_test_rand(&rng) % 5;
            for (size_t i = 0; i < sl; i++) stops[s][i] = "abc"[em_test_rand(&rng) % 3];
            stops[s][sl] = 0;
            stop[s] = stops[s];
        }
        bool want_matched = false;
        size_t want = len;
        for (size_t c = 0; c < n_chunks && !want_matched; c++) want = reference_cut(text, ends[c], stop, n_stop, &want_matched);
        if (!want_matched) want = len;
        em_srv_text t;
        em_srv_text_init(&t, stop, n_stop);
        for (size_t c = 0, pos = 0; c < n_chunks && !t.matched; pos = ends[c++]) {
            assert_int_equal(em_srv_text_push(&t, text + pos, ends[c] - pos, NULL), 0);
            size_t ready = em_srv_text_ready(&t, false);
            assert_true(ready >= t.sent);
            if (ready > want)
                fail_msg("text '%.*s', %d stops '%s' '%s' '%s': %zu bytes in, %zu released, cut at %zu", (int)len, text,
                         n_stop, n_stop > 0 ? stop[0] : "", n_stop > 1 ? stop[1] : "", n_stop > 2 ? stop[2] : "",
                         ends[c], ready, want);
            t.sent = ready;
        }
        size_t end = em_srv_text_ready(&t, true);
        assert_int_equal(t.matched, want_matched);
        assert_int_equal(end, want);
        assert_memory_equal(t.buf, text, want);
        em_srv_text_free(&t);
    }
}

/* ---- requests ---------------------------------------------------------------------------- */

#define N_CTX 256

static em_srv_model_ctx model_ctx(void) {
    return (em_srv_model_ctx){ .tok = tok, .id = "kimi-test", .path = "/models/kimi_a.gguf", .n_ctx = N_CTX };
}

static int parse(int kind, const char *body, em_srv_req *r, em_srv_error *e) {
    em_srv_model_ctx m = model_ctx();
    memset(e, 0, sizeof *e);
    return em_srv_parse_generate(&m, kind, body, strlen(body), 77, r, e);
}

static void test_parse_chat(void **state) {
    (void)state;
    if (!tok) skip();
    em_srv_req r;
    em_srv_error e;
    const char *body = "{\"model\":\"kimi-test\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},{\"type\":\"text\",\"text\":\"lo\"}]}],"
                       "\"max_tokens\":10,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"stop\":[\"a\",\"\",\"bc\"]}";
    assert_int_equal(parse(EM_SRV_CHAT, body, &r, &e), 0);
    em_chat_msg msgs[] = { { .role = "system", .content = "Be brief." }, { .role = "user", .content = "Hel\nlo" } };
    int32_t *ids;
    size_t n;
    assert_int_equal(em_chat_encode_kimi(tok, msgs, 2, true, &ids, &n, NULL), 0);
    assert_int_equal(r.n_prompt, (int)n);
    assert_memory_equal(r.prompt, ids, n * sizeof *ids);
    free(ids);
    assert_int_equal(r.n_max, 10);
    assert_true(r.sampling.temperature == 0.0f);
    assert_int_equal(r.sampling.seed, 77); /* the server's seed when none is given */
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.n_stop, 2); /* the empty stop string is dropped */
    assert_string_equal(r.stop[0], "a");
    assert_string_equal(r.stop[1], "bc");
    em_srv_req_free(&r);

    /* defaults: llama-server's sampling, generation up to the end of the context */
    assert_int_equal(parse(EM_SRV_CHAT, "{\"messages\":[{\"role\":\"developer\",\"content\":\"x\"}],\"seed\":5,"
                                        "\"max_tokens\":null}", &r, &e), 0);
    em_sampler_params d = em_sampler_default_params();
    assert_true(r.sampling.temperature == d.temperature && r.sampling.top_k == d.top_k);
    assert_int_equal(r.sampling.seed, 5);
    assert_int_equal(r.n_max, N_CTX - r.n_prompt);
    assert_false(r.stream || r.include_usage);
    em_srv_req_free(&r);

    /* max_tokens past the room left is clamped to it */
    assert_int_equal(parse(EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":256}", &r, &e), 0);
    assert_int_equal(r.n_max, N_CTX - r.n_prompt);
    em_srv_req_free(&r);
}

static void test_parse_completion(void **state) {
    (void)state;
    if (!tok) skip();
    em_srv_req r;
    em_srv_error e;
    assert_int_equal(parse(EM_SRV_COMPLETION, "{\"prompt\":\"Hello <|im_end|> world\",\"max_completion_tokens\":3,"
                                              "\"max_tokens\":100,\"top_k\":7,\"top_p\":0.5,\"min_p\":0.25}", &r, &e), 0);
    int32_t *ids;
    size_t n;
    const char *text = "Hello <|im_end|> world";
    assert_int_equal(em_tok_encode(tok, text, strlen(text), EM_TOK_PARSE_SPECIAL | EM_TOK_ADD_SPECIAL, &ids, &n, NULL), 0);
    assert_int_equal(r.n_prompt, (int)n);
    assert_memory_equal(r.prompt, ids, n * sizeof *ids);
    free(ids);
    assert_int_equal(r.n_max, 3); /* max_completion_tokens wins */
    assert_int_equal(r.sampling.top_k, 7);
    assert_true(r.sampling.top_p == 0.5f && r.sampling.min_p == 0.25f);
    em_srv_req_free(&r);

    static const char *const same[] = { "{\"prompt\":[5,6,7]}", "{\"prompt\":[[5,6,7]]}", "{\"prompt\":[5,6,7.0]}" };
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(parse(EM_SRV_COMPLETION, same[i], &r, &e), 0);
        assert_int_equal(r.n_prompt, 3);
        assert_int_equal(r.prompt[2], 7);
        em_srv_req_free(&r);
    }
    assert_int_equal(parse(EM_SRV_COMPLETION, same[2], &r, &e), -1); /* ids must be integers */
    /* any model name is served (a one-model server, as llama-server): the id, the path, the
     * file name, and names clients send fixed; the request is the same as without one */
    static const char *const names[] = { "kimi-test", "kimi_a.gguf", "/models/kimi_a.gguf", "default", "gpt-4o-mini", "" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"prompt\":[5,6],\"max_tokens\":3,\"model\":\"%s\"}", names[i]);
        if (parse(EM_SRV_COMPLETION, body, &r, &e)) fail_msg("model '%s' refused: %d %s", names[i], e.status, e.message);
        assert_int_equal(r.n_prompt, 2);
        assert_int_equal(r.prompt[1], 6);
        assert_int_equal(r.n_max, 3);
        em_srv_req_free(&r);
    }
}

typedef struct bad_case {
    int kind;
    const char *body;
    int status;
    const char *param; /* "" when none */
} bad_case;

static void test_parse_errors(void **state) {
    (void)state;
    if (!tok) skip();
    char long_prompt[8 * N_CTX + 32];
    strcpy(long_prompt, "{\"prompt\":[");
    for (int i = 0; i < N_CTX; i++) strcat(long_prompt, i ? ",1" : "1");
    strcat(long_prompt, "]}");
    const bad_case cases[] = {
        { EM_SRV_CHAT, "", 400, "" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]", 400, "" },
        { EM_SRV_CHAT, "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", 400, "" },
        { EM_SRV_CHAT, "{}", 400, "messages" },
        { EM_SRV_CHAT, "{\"messages\":[]}", 400, "messages" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "messages" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "messages" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", 400, "n" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":5}", 400, "model" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":[\"a\"]}", 400, "model" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400, "max_tokens" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":257}", 400, "max_tokens" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":-1}", 400, "max_completion_tokens" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"1\"}", 400, "temperature" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":2}", 400, "top_p" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", 400, "stop" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", 400, "stream" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true}", 400, "logprobs" },
        { EM_SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", 400, "tools" },
        { EM_SRV_COMPLETION, "{}", 400, "prompt" },
        { EM_SRV_COMPLETION, "{\"prompt\":\"\"}", 400, "prompt" },
        { EM_SRV_COMPLETION, "{\"prompt\":[512]}", 400, "prompt" },
        { EM_SRV_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt" },
        { EM_SRV_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo" },
        { EM_SRV_COMPLETION, long_prompt, 400, "prompt" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_srv_req r;
        em_srv_error e;
        if (parse(cases[i].kind, cases[i].body, &r, &e) != -1) fail_msg("case %zu was accepted: %.80s", i, cases[i].body);
        if (e.status != cases[i].status || strcmp(e.param, cases[i].param))
            fail_msg("case %zu (%.60s): status %d param '%s', want %d '%s' (%s)", i, cases[i].body, e.status, e.param,
                     cases[i].status, cases[i].param, e.message);
        assert_null(r.prompt);
        assert_true(strlen(e.message) > 0);
        char *json = em_srv_error_json(&e);
        json_t *o = json_loads(json, 0, NULL);
        assert_non_null(o);
        json_t *err = json_object_get(o, "error");
        assert_string_equal(json_string_value(json_object_get(err, "message")), e.message);
        assert_true(json_is_string(json_object_get(err, "type")));
        assert_true(json_object_get(err, "param") && json_object_get(err, "code"));
        json_decref(o);
        free(json);
    }
}

/* ---- responses --------------------------------------------------------------------------- */

static json_t *load(char *text) {
    assert_non_null(text);
    json_t *o = json_loads(text, 0, NULL);
    free(text);
    assert_non_null(o);
    return o;
}

static void test_responses(void **state) {
    (void)state;
    em_srv_meta mt = { .kind = EM_SRV_CHAT, .id = "chatcmpl-1", .created = 1700000000, .model = "m" };
    em_srv_stats st = { .n_prompt = 10, .n_gen = 5, .prompt_s = 0.5, .gen_s = 2.0, .drafted = 8, .accepted = 3,
                        .draft_s = 0.25, .target_s = 0.5, .device = "cuda:0 (X)", .draft_device = "cpu" };
    int32_t toks[] = { 1, 2, 3 };
    /* invalid UTF-8 in the text comes out as U+FFFD */
    json_t *o = load(em_srv_response_json(&mt, "ab\xff" "c", 4, "length", &st, toks, 3));
    assert_string_equal(json_string_value(json_object_get(o, "object")), "chat.completion");
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "message"), "content")), "ab\xEF\xBF\xBD" "c");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    assert_int_equal(json_array_size(json_object_get(c, "tokens")), 3);
    json_t *u = json_object_get(o, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 15);
    json_t *t = json_object_get(o, "timings");
    assert_int_equal(json_integer_value(json_object_get(t, "draft_n")), 8);
    assert_int_equal(json_integer_value(json_object_get(t, "draft_n_accepted")), 3);
    assert_true(json_real_value(json_object_get(t, "prompt_per_second")) == 20.0);
    assert_true(json_real_value(json_object_get(t, "predicted_per_second")) == 2.0); /* 4 tokens after the first */
    assert_true(json_real_value(json_object_get(t, "draft_ms")) == 250.0);
    assert_true(json_real_value(json_object_get(t, "target_ms")) == 500.0);
    assert_string_equal(json_string_value(json_object_get(t, "device")), "cuda:0 (X)");
    assert_string_equal(json_string_value(json_object_get(t, "draft_device")), "cpu");
    json_decref(o);

    o = load(em_srv_chunk_json(&mt, true, "", 0, NULL, NULL, true));
    assert_string_equal(json_string_value(json_object_get(o, "object")), "chat.completion.chunk");
    c = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(c, "delta"), "role")), "assistant");
    assert_true(json_is_null(json_object_get(c, "finish_reason")));
    assert_true(json_is_null(json_object_get(o, "usage")));
    json_decref(o);

    o = load(em_srv_chunk_json(&mt, false, "", 0, "stop", &st, false));
    c = json_array_get(json_object_get(o, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(c, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "stop");
    assert_non_null(json_object_get(o, "timings"));
    assert_null(json_object_get(o, "usage"));
    json_decref(o);

    mt.kind = EM_SRV_COMPLETION;
    o = load(em_srv_chunk_json(&mt, false, "xy", 2, NULL, NULL, false));
    assert_string_equal(json_string_value(json_object_get(o, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "text")), "xy");
    json_decref(o);
    o = load(em_srv_usage_chunk_json(&mt, &st));
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "usage"), "completion_tokens")), 5);
    json_decref(o);
}

static void test_tokenize(void **state) {
    (void)state;
    if (!tok) skip();
    em_srv_model_ctx m = model_ctx();
    em_srv_error e;
    const char *body = "{\"content\":\"Hello world\",\"with_pieces\":true}";
    json_t *o = load(em_srv_tokenize(&m, body, strlen(body), &e));
    json_t *list = json_object_get(o, "tokens");
    int32_t *ids;
    size_t n;
    assert_int_equal(em_tok_encode(tok, "Hello world", 11, EM_TOK_PARSE_SPECIAL, &ids, &n, NULL), 0);
    assert_int_equal(json_array_size(list), n);
    char joined[64] = "";
    char ids_json[256] = "{\"tokens\":[";
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(list, i);
        assert_int_equal(json_integer_value(json_object_get(p, "id")), ids[i]);
        strcat(joined, json_string_value(json_object_get(p, "piece")));
        snprintf(ids_json + strlen(ids_json), sizeof ids_json - strlen(ids_json), i ? ",%d" : "%d", ids[i]);
    }
    strcat(ids_json, "]}");
    assert_string_equal(joined, "Hello world");
    json_decref(o);
    free(ids);
    o = load(em_srv_detokenize(&m, ids_json, strlen(ids_json), &e));
    assert_string_equal(json_string_value(json_object_get(o, "content")), "Hello world");
    json_decref(o);
    assert_null(em_srv_detokenize(&m, "{\"tokens\":[9999]}", 17, &e));
    assert_int_equal(e.status, 400);
    assert_null(em_srv_tokenize(&m, "{\"content\":1}", 13, &e));
    assert_string_equal(e.param, "content");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_examples),
        cmocka_unit_test(test_stop_random),
        cmocka_unit_test(test_parse_chat),
        cmocka_unit_test(test_parse_completion),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_tokenize),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
