/* chat.c: the chat template: ChatML as Qwen3's Jinja template (tokenizer_config.json of
 * Qwen3) renders a list of messages, step by step:
 *   1. a first system message: "<|im_start|>system\nCONTENT<|im_end|>\n";
 *   2. last_query = the index of the last user message that is not a tool response
 *      ("<tool_response>...</tool_response>"); n - 1 if there is none;
 *   3. per message: user (and a later system): "<|im_start|>ROLE\nCONTENT<|im_end|>\n";
 *      assistant: reasoning = reasoning_content, or the text inside <think>...</think> of the
 *      content, which then keeps only what follows </think>; after last_query, when it is the last
 *      message or has reasoning: "<|im_start|>assistant\n<think>\nREASONING\n</think>\n\nCONTENT",
 *      else "<|im_start|>assistant\nCONTENT"; then "<|im_end|>\n";
 *      tool: "<|im_start|>user" before the first of a run of tool messages,
 *      "\n<tool_response>\nCONTENT\n</tool_response>", "<|im_end|>\n" after the last of the run;
 *      other roles: nothing;
 *   4. add_generation_prompt: "<|im_start|>assistant\n", plus "<think>\n\n</think>\n\n" when
 *      enable_thinking is false.
 * (Tool definitions and assistant tool calls are not rendered.) */
#include "vocab/vocab.h"

#include "base/error.h"

#include <string.h>

typedef struct out_buf {
    char *buf;
    size_t cap;
    size_t n;
} out_buf;

static void put(out_buf *o, const char *s, size_t n) {
    if (o->n + n < o->cap && n > 0) memcpy(o->buf + o->n, s, n);
    o->n += n;
}

static void puts_(out_buf *o, const char *s) { put(o, s, strlen(s)); }

typedef struct span {
    const char *p;
    size_t n;
} span;

static span span_of(const char *s) { return (span){s, strlen(s)}; }

static span lstrip_nl(span s) {
    while (s.n > 0 && s.p[0] == '\n') {
        s.p++;
        s.n--;
    }
    return s;
}

static span rstrip_nl(span s) {
    while (s.n > 0 && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* first / last occurrence of needle in s, or NULL */
static const char *find_first(span s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= s.n; i++) {
        if (memcmp(s.p + i, needle, m) == 0) return s.p + i;
    }
    return NULL;
}

static const char *find_last(span s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = s.n >= m ? s.n - m + 1 : 0; i-- > 0;) {
        if (memcmp(s.p + i, needle, m) == 0) return s.p + i;
    }
    return NULL;
}

static bool starts_with(span s, const char *p) { return s.n >= strlen(p) && memcmp(s.p, p, strlen(p)) == 0; }
static bool ends_with(span s, const char *p) {
    size_t m = strlen(p);
    return s.n >= m && memcmp(s.p + s.n - m, p, m) == 0;
}

static bool is_role(const dfl_chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

static void render_assistant(out_buf *o, const dfl_chat_msg *m, bool after_query, bool last) {
    span content = span_of(m->content), reasoning = {"", 0};
    if (m->reasoning_content != NULL) {
        reasoning = span_of(m->reasoning_content);
    } else {
        const char *end_think = find_first(content, "</think>");
        if (end_think != NULL) {
            /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
            span before = rstrip_nl((span){content.p, (size_t)(end_think - content.p)});
            const char *open = find_last(before, "<think>");
            if (open != NULL) before = (span){open + 7, (size_t)(before.p + before.n - (open + 7))};
            reasoning = lstrip_nl(before);
            /* content.split('</think>')[-1].lstrip('\n') */
            const char *last_end = find_last(content, "</think>");
            content = lstrip_nl((span){last_end + 8, (size_t)(content.p + content.n - (last_end + 8))});
        }
    }
    if (after_query && (last || reasoning.n > 0)) {
        span r = rstrip_nl(lstrip_nl(reasoning));
        puts_(o, "<|im_start|>assistant\n<think>\n");
        put(o, r.p, r.n);
        puts_(o, "\n</think>\n\n");
        content = lstrip_nl(content);
    } else {
        puts_(o, "<|im_start|>assistant\n");
    }
    put(o, content.p, content.n);
    puts_(o, "<|im_end|>\n");
}

int64_t dfl_chat_render(const dfl_vocab *vocab, const dfl_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
                        bool enable_thinking, char *buf, size_t cap, dfl_error *err) {
    error_clear(err);
    if ((msgs == NULL && n_msgs > 0) || (buf == NULL && cap > 0)) {
        error_set(err, DFL_ERR_INVALID, "chat template: no messages or no output buffer");
        return DFL_VOCAB_FAIL;
    }
    for (size_t i = 0; i < n_msgs; i++) {
        if (msgs[i].role == NULL || msgs[i].content == NULL) {
            error_set(err, DFL_ERR_INVALID, "chat template: message %zu has no %s", i, msgs[i].role ? "content" : "role");
            return DFL_VOCAB_FAIL;
        }
    }
    if (vocab != NULL && (dfl_vocab_find(vocab, "<|im_start|>", 12) < 0 || dfl_vocab_find(vocab, "<|im_end|>", 10) < 0)) {
        error_set(err, DFL_ERR_UNSUPPORTED,
                  "chat template: the vocabulary has no <|im_start|>/<|im_end|> tokens (dflash renders ChatML only)");
        return DFL_VOCAB_FAIL;
    }
    out_buf o = {buf, cap, 0};
    if (n_msgs > 0 && is_role(&msgs[0], "system")) {
        puts_(&o, "<|im_start|>system\n");
        puts_(&o, msgs[0].content);
        puts_(&o, "<|im_end|>\n");
    }
    size_t last_query = n_msgs > 0 ? n_msgs - 1 : 0;
    for (size_t i = n_msgs; i-- > 0;) {
        span c = span_of(msgs[i].content);
        if (is_role(&msgs[i], "user") && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n_msgs; i++) {
        const dfl_chat_msg *m = &msgs[i];
        if (is_role(m, "user") || (is_role(m, "system") && i > 0)) {
            puts_(&o, "<|im_start|>");
            puts_(&o, m->role);
            puts_(&o, "\n");
            puts_(&o, m->content);
            puts_(&o, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            render_assistant(&o, m, i > last_query, i + 1 == n_msgs);
        } else if (is_role(m, "tool")) {
            if (i == 0 || !is_role(&msgs[i - 1], "tool")) puts_(&o, "<|im_start|>user");
            puts_(&o, "\n<tool_response>\n");
            puts_(&o, m->content);
            puts_(&o, "\n</tool_response>");
            if (i + 1 == n_msgs || !is_role(&msgs[i + 1], "tool")) puts_(&o, "<|im_end|>\n");
        }
    }
    if (add_generation_prompt) {
        puts_(&o, "<|im_start|>assistant\n");
        if (!enable_thinking) puts_(&o, "<think>\n\n</think>\n\n");
    }
    if (o.n + 1 > cap) return -(int64_t)(o.n + 1);
    buf[o.n] = '\0';
    return (int64_t)o.n;
}
