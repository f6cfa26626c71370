/* test_serve_http.c: the pieces of `dflash serve` that need no socket: the strict HTTP/1.1 request
 * parser (complete, incremental and pipelined requests; every rejection with its status) and the
 * OpenAI request mapping (fields, defaults, types and ranges: a wrong one is a 400 naming the
 * field), plus the shape of the response objects. */
#include "test.h"
#include "../tools/serve/api.h"
#include "../tools/serve/http.h"

#include <stdlib.h>
#include <string.h>

static http_parse_result parse(const char *s, size_t max_body, http_request *r, int *status) {
    const char *why;
    return http_parse(s, strlen(s), max_body, r, status, &why);
}

TEST(serve_http_parses_requests) {
    http_request r;
    int st;
    const char *get = "GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k\r\nX-Api-Key:  z \r\n\r\n";
    REQUIRE(parse(get, 100, &r, &st) == HTTP_DONE);
    CHECK(strcmp(r.method, "GET") == 0);
    CHECK(strcmp(r.path, "/v1/models") == 0);
    CHECK(strcmp(r.query, "x=1") == 0);
    CHECK(strcmp(r.authorization, "Bearer k") == 0);
    CHECK(strcmp(r.x_api_key, "z") == 0);
    CHECK(r.keep_alive);
    CHECK_EQ_INT(r.consumed, strlen(get));
    CHECK_EQ_INT(r.body_len, 0);

    /* every prefix of a request with a body is incomplete; pipelined bytes are not consumed */
    const char *post = "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\nConnection: close\r\n\r\n"
                       "{\"a\": true}GET / HTTP/1.1\r\n";
    const size_t one = strlen(post) - strlen("GET / HTTP/1.1\r\n");
    for (size_t n = 0; n < one; n++) {
        const char *why;
        CHECK_MSG(http_parse(post, n, 100, &r, &st, &why) == HTTP_INCOMPLETE, "prefix %zu", n);
    }
    const char *why;
    REQUIRE(http_parse(post, strlen(post), 100, &r, &st, &why) == HTTP_DONE);
    CHECK_EQ_INT(r.consumed, one);
    CHECK_EQ_INT(r.body_len, 11);
    CHECK(memcmp(r.body, "{\"a\": true}", 11) == 0);
    CHECK(!r.keep_alive);

    /* HTTP/1.0: no keep-alive unless asked; no Host needed */
    REQUIRE(parse("GET /health HTTP/1.0\r\n\r\n", 0, &r, &st) == HTTP_DONE);
    CHECK(!r.keep_alive);
    REQUIRE(parse("GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 0, &r, &st) == HTTP_DONE);
    CHECK(r.keep_alive);
    /* a complete head with a body to come tells the length (for Expect: 100-continue) */
    REQUIRE(parse("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", 10, &r, &st) ==
            HTTP_INCOMPLETE);
    CHECK(r.expect_continue);
    CHECK_EQ_INT(r.content_length, 5);
}

TEST(serve_http_rejects_bad_requests) {
    const struct { const char *req; int status; } cases[] = {
        {"GET / HTTP/1.1\nHost: a\n\n", 400},                                   /* bare LF */
        {"GET / HTTP/1.1\r\n\r\n", 400},                                        /* no Host */
        {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
        {"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505},
        {"GET / HTTX/1.1\r\nHost: a\r\n\r\n", 400},
        {"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400},                            /* empty target */
        {"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400},                          /* four parts */
        {"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400},                             /* not a token */
        {"GET x HTTP/1.1\r\nHost: a\r\n\r\n", 400},                             /* not origin-form */
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", 413},    /* before the body */
        {"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n folded\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01 b\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", 400},
        {"\r\n\r\n", 400},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        http_request r;
        int st = 0;
        const char *why = NULL;
        http_parse_result pr = http_parse(cases[i].req, strlen(cases[i].req), 100, &r, &st, &why);
        CHECK_MSG(pr == HTTP_ERROR && st == cases[i].status, "case %zu: result %d status %d (want %d)", i, pr, st,
                  cases[i].status);
        CHECK_MSG(why != NULL && why[0] != '\0', "case %zu: no reason", i);
    }
    /* a NUL in the head, a head over 16 KiB, a target over 2 KiB */
    http_request r;
    int st;
    const char *why;
    const char nul[] = "GET / HTTP/1.1\r\nHost: a\0\r\n\r\n";
    CHECK(http_parse(nul, sizeof(nul) - 1, 0, &r, &st, &why) == HTTP_ERROR && st == 400);
    char *big = malloc(HTTP_MAX_HEAD + 64);
    REQUIRE(big != NULL);
    memset(big, 'a', HTTP_MAX_HEAD + 64);
    memcpy(big, "GET / HTTP/1.1\r\nHost: a\r\nX: ", 28);
    CHECK(http_parse(big, HTTP_MAX_HEAD + 64, 0, &r, &st, &why) == HTTP_ERROR && st == 431);
    memset(big, 'a', HTTP_MAX_HEAD + 64);
    memcpy(big, "GET /", 5);
    memcpy(big + 5 + HTTP_MAX_TARGET, " HTTP/1.1\r\nHost: a\r\n\r\n", 22);
    CHECK(http_parse(big, 5 + HTTP_MAX_TARGET + 22, 0, &r, &st, &why) == HTTP_ERROR && st == 414);
    free(big);
}

static int gen(const char *body, bool chat, api_gen *g, api_error *e) {
    dfl_sampler_params d = dfl_sampler_default_params();
    d.temp = 0.25f;
    return api_parse_gen(body, strlen(body), chat, NULL, &d, g, e);
}

TEST(serve_api_maps_request_fields) {
    api_gen g;
    api_error e;
    REQUIRE(gen("{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\","
                "\"content\":[{\"type\":\"text\",\"text\":\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]}],"
                "\"max_tokens\":7,\"max_completion_tokens\":9,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":5,"
                "\"min_p\":0.1,\"seed\":-3,\"stop\":\"END\",\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
                "\"repetition_penalty\":1.1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                "\"n\":1,\"logprobs\":false,\"unknown_field\":{\"x\":[1,2]}}",
                true, &g, &e) == 0);
    CHECK(g.chat && g.stream && g.include_usage);
    CHECK_EQ_INT(g.max_tokens, 9); /* max_completion_tokens wins */
    CHECK_NEAR(g.sampler.temp, 0.5, 1e-6);
    CHECK_NEAR(g.sampler.top_p, 0.9, 1e-6);
    CHECK_EQ_INT(g.sampler.top_k, 5);
    CHECK_NEAR(g.sampler.min_p, 0.1, 1e-6);
    CHECK_NEAR(g.sampler.presence_penalty, 0.5, 1e-6);
    CHECK_NEAR(g.sampler.frequency_penalty, -0.5, 1e-6);
    CHECK_NEAR(g.sampler.repeat_penalty, 1.1, 1e-6);
    CHECK(g.has_seed && g.sampler.seed == (uint64_t)(int64_t)-3);
    CHECK_EQ_INT(g.n_stop, 1);
    CHECK(g.n_stop == 1 && strcmp(g.stop[0], "END") == 0);
    CHECK(strcmp(g.model, "m") == 0);
    CHECK_STR_CONTAINS(g.prompt, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
                                 "<|im_start|>assistant\n");
    api_gen_free(&g);

    /* defaults come from the server; prompt as text or token ids; a list of stops */
    REQUIRE(gen("{\"prompt\":\"abc\",\"stop\":[\"x\",\"yy\"],\"ignore_eos\":true}", false, &g, &e) == 0);
    CHECK_NEAR(g.sampler.temp, 0.25, 1e-6);
    CHECK(!g.has_seed && g.ignore_eos);
    CHECK(g.prompt != NULL && strcmp(g.prompt, "abc") == 0);
    CHECK(g.n_stop == 2 && strcmp(g.stop[1], "yy") == 0);
    CHECK_EQ_INT(g.max_tokens, 0);
    api_gen_free(&g);
    REQUIRE(gen("{\"prompt\":[1,2,3],\"temperature\":null,\"logprobs\":2}", false, &g, &e) == 0);
    CHECK(g.prompt == NULL && g.n_prompt_tokens == 3 && g.prompt_tokens[2] == 3);
    CHECK(g.logprobs && g.top_logprobs == 2);
    api_gen_free(&g);
    REQUIRE(gen("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":3}", true,
                &g, &e) == 0);
    CHECK(g.logprobs && g.top_logprobs == 3);
    api_gen_free(&g);
}

TEST(serve_api_rejects_bad_fields) {
    const struct { const char *body; bool chat; const char *param; const char *msg; } cases[] = {
        {"{\"prompt\":\"a\",\"temperature\":\"hot\"}", false, "temperature", "must be a number"},
        {"{\"prompt\":\"a\",\"temperature\":2.5}", false, "temperature", "[0, 2]"},
        {"{\"prompt\":\"a\",\"max_tokens\":0}", false, "max_tokens", "[1,"},
        {"{\"prompt\":\"a\",\"max_tokens\":1.5}", false, "max_tokens", "integer"},
        {"{\"prompt\":\"a\",\"top_k\":-1}", false, "top_k", "[0,"},
        {"{\"prompt\":\"a\",\"stop\":5}", false, "stop", "string"},
        {"{\"prompt\":\"a\",\"stop\":[\"\"]}", false, "stop", "1..256"},
        {"{\"prompt\":\"a\",\"n\":2}", false, "n", "only n = 1"},
        {"{\"prompt\":\"a\",\"stream\":1}", false, "stream", "boolean"},
        {"{\"prompt\":\"a\",\"logprobs\":6}", false, "logprobs", "[0, 5]"},
        {"{\"prompt\":\"\"}", false, "prompt", "empty"},
        {"{\"prompt\":[1,-2]}", false, "prompt", "token id"},
        {"{\"prompt\":{}}", false, "prompt", "non-empty"},
        {"{}", false, "prompt", "required"},
        {"{}", true, "messages", "required"},
        {"{\"messages\":[]}", true, "messages", "non-empty"},
        {"{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", true, "messages", "robot"},
        {"{\"messages\":[{\"role\":\"user\"}]}", true, "messages", "content is required"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", true, "messages", "only text"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", true, "top_logprobs", "needs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", true,
         "top_logprobs", "[0, 20]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":3}", true, "stream_options", "object"},
        {"{\"model\":3,\"prompt\":\"a\"}", false, "model", "string"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        api_gen g;
        api_error e;
        memset(&e, 0, sizeof(e));
        CHECK_MSG(gen(cases[i].body, cases[i].chat, &g, &e) == -1, "case %zu accepted", i);
        CHECK_MSG(e.status == 400 && e.param != NULL && strcmp(e.param, cases[i].param) == 0, "case %zu: %d %s", i,
                  e.status, e.param ? e.param : "(null)");
        CHECK_MSG(strstr(e.message, cases[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, e.message, cases[i].msg);
    }
    api_gen g;
    api_error e;
    CHECK(gen("{\"prompt\": \n  tru}", false, &g, &e) == -1 && e.status == 400);
    CHECK_STR_CONTAINS(e.message, "line 2");
    CHECK(gen("[1]", false, &g, &e) == -1 && e.status == 400);
    CHECK(gen("{\"prompt\":\"a\",\"prompt\":\"b\"}", false, &g, &e) == -1 && e.status == 400);
    char *j = api_error_json(&e);
    REQUIRE(j != NULL);
    CHECK_STR_CONTAINS(j, "{\"error\":{\"message\":");
    CHECK_STR_CONTAINS(j, "\"type\":\"invalid_request_error\"");
    free(j);
    /* found by fuzz_serve: a JSON error quoting the client's bytes (an invalid escape followed by
     * a cut UTF-8 sequence) made the message invalid UTF-8, the error body could not be built and
     * the client got a bare 500; the message is now sanitized: 400 with a message */
    CHECK(gen("{\"prompt\":\"te\\\xcd\x88\"}", false, &g, &e) == -1 && e.status == 400);
    j = api_error_json(&e);
    CHECK_MSG(j != NULL, "no error body for '%s'", e.message);
    free(j);
    const char *bad[] = {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        api_error_set(&e, 400, "invalid_request_error", NULL, NULL, "quoted '%s' and \xc3\xa9 (valid)", bad[i]);
        CHECK_STR_CONTAINS(e.message, "\xc3\xa9 (valid)");
        j = api_error_json(&e);
        CHECK_MSG(j != NULL, "no error body for case %zu", i);
        free(j);
    }
}

TEST(serve_api_response_shapes) {
    api_ids ids = {"chatcmpl-1", 123, "m", true};
    api_usage u;
    memset(&u, 0, sizeof(u));
    u.prompt_tokens = 5;
    u.completion_tokens = 3;
    u.n_steps = 2;
    u.n_accepted = 1;
    char *r = api_response_json(&ids, "h\"i", 3, "length", &u, NULL);
    REQUIRE(r != NULL);
    CHECK_STR_CONTAINS(r, "\"object\":\"chat.completion\"");
    CHECK_STR_CONTAINS(r, "\"message\":{\"role\":\"assistant\",\"content\":\"h\\\"i\"}");
    CHECK_STR_CONTAINS(r, "\"finish_reason\":\"length\"");
    CHECK_STR_CONTAINS(r, "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8");
    CHECK_STR_CONTAINS(r, "\"tau\":1.5");
    free(r);
    r = api_chunk_json(&ids, true, "", 0, NULL, true, NULL);
    REQUIRE(r != NULL);
    CHECK_STR_CONTAINS(r, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}");
    CHECK_STR_CONTAINS(r, "\"finish_reason\":null");
    CHECK_STR_CONTAINS(r, "\"usage\":null");
    free(r);
    r = api_chunk_json(&ids, false, "x", 1, "stop", false, NULL);
    REQUIRE(r != NULL);
    CHECK_STR_CONTAINS(r, "\"delta\":{}");
    CHECK(strstr(r, "usage") == NULL);
    free(r);
    r = api_usage_chunk_json(&ids, &u);
    REQUIRE(r != NULL);
    CHECK_STR_CONTAINS(r, "\"choices\":[]");
    free(r);
    ids.chat = false;
    r = api_chunk_json(&ids, false, "ab", 2, NULL, false, NULL);
    REQUIRE(r != NULL);
    CHECK_STR_CONTAINS(r, "\"object\":\"text_completion\"");
    CHECK_STR_CONTAINS(r, "\"text\":\"ab\"");
    free(r);
    r = api_models_json("m", 1, true);
    REQUIRE(r != NULL);
    CHECK_STR_CONTAINS(r, "{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\"");
    free(r);
}
