/* fuzz_serve.c: libFuzzer target for `dflash serve`'s request path without sockets: the input is
 * parsed as HTTP/1.1 request(s) (tools/serve/http.c; pipelined requests one after another), and
 * each complete request's body goes through the OpenAI mapping (tools/serve/api.c) for chat,
 * completions, tokenize and detokenize, then through the response builders. Checks: consumed
 * bytes stay inside the input, a rejection has a known status and a reason, a refused body has
 * a 400/500 error with a message, an accepted one has a prompt and sane limits. ASan/UBSan catch
 * the rest. Build with `make fuzz`. */
#include "../../tools/serve/api.h"
#include "../../tools/serve/http.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_body(const char *body, size_t len) {
    api_error e;
    for (int chat = 0; chat < 2; chat++) {
        api_gen g;
        memset(&e, 0, sizeof(e));
        dfl_sampler_params d = dfl_sampler_default_params();
        if (api_parse_gen(body, len, chat != 0, NULL, &d, &g, &e) != 0) {
            if ((e.status != 400 && e.status != 500) || e.message[0] == '\0') abort();
            char *j = api_error_json(&e);
            if (j == NULL) abort();
            free(j);
            continue;
        }
        if (g.n_stop < 0 || g.n_stop > API_MAX_STOP || g.max_tokens < 0) abort();
        if (g.prompt == NULL && (g.prompt_tokens == NULL || g.n_prompt_tokens <= 0)) abort();
        for (int32_t i = 0; i < g.n_stop; i++) {
            if (g.stop[i] == NULL || strlen(g.stop[i]) == 0 || strlen(g.stop[i]) > API_MAX_STOP_LEN) abort();
        }
        if (!(g.sampler.temp >= 0 && g.sampler.temp <= 2 && g.sampler.top_p >= 0 && g.sampler.top_p <= 1)) abort();
        /* the response builders take what the mapping produced */
        api_ids ids = {"cmpl-x", 1, g.model, chat != 0};
        api_usage u;
        memset(&u, 0, sizeof(u));
        const char *txt = g.prompt ? g.prompt : "";
        char *r = api_response_json(&ids, txt, strlen(txt), "stop", &u, NULL);
        char *c = api_chunk_json(&ids, true, txt, strlen(txt), NULL, g.include_usage, NULL);
        /* NULL is allowed only where the text is not valid UTF-8 (jansson refuses it) */
        free(r);
        free(c);
        api_gen_free(&g);
    }
    char *content;
    bool a, w;
    if (api_parse_tokenize(body, len, &content, &a, &w, &e) == 0) free(content);
    int32_t *toks;
    int64_t n;
    if (api_parse_detokenize(body, len, &toks, &n, &e) == 0) {
        if (n < 0 || (n > 0 && toks == NULL)) abort();
        free(toks);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *buf = (const char *)data;
    size_t off = 0;
    for (int i = 0; i < 8 && off < size; i++) {
        http_request r;
        int status = 0;
        const char *why = NULL;
        const http_parse_result pr = http_parse(buf + off, size - off, 1 << 16, &r, &status, &why);
        if (pr == HTTP_INCOMPLETE) break;
        if (pr == HTTP_ERROR) {
            if (why == NULL || why[0] == '\0') abort();
            if (status != 400 && status != 413 && status != 414 && status != 431 && status != 501 && status != 505)
                abort();
            break;
        }
        if (r.consumed == 0 || r.consumed > size - off || r.head_len + r.body_len != r.consumed) abort();
        if (r.body_len > 0 && (r.body < buf + off || r.body + r.body_len > buf + size)) abort();
        if (r.path[0] != '/' && r.path[0] != '*') abort();
        check_body(r.body_len > 0 ? r.body : "", r.body_len);
        off += r.consumed;
    }
    /* the raw input as a body too (most of the mapping's inputs are not valid HTTP) */
    check_body(buf, size);
    return 0;
}
