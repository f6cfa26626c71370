/* server.c: the `dflash serve` event loop and scheduler (see server.h). Connections own their
 * byte buffers; a generation request becomes a task that waits in a FIFO queue until a sequence
 * of the engine is free, then runs until the engine finishes it or its connection goes away. */
#include "server.h"
#include "api.h"
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SRV_MAX_OUT (16u << 20)   /* pending output bytes per connection before it counts as stalled */
#define SRV_READ_CHUNK 65536
#define SRV_TTFT_BUCKETS 12

static const double k_ttft_bounds[SRV_TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                       0.5,   1.0,  2.5,   5.0,  10.0, 30.0};

typedef struct srv_task srv_task;

typedef struct srv_conn {
    int fd;
    uint64_t id;
    char peer[64];
    char *in;                 /* received, not yet consumed bytes */
    size_t in_len, in_cap;
    char *out;                /* bytes to send: out[out_off..out_len) */
    size_t out_len, out_off, out_cap;
    bool close_after;         /* close once out is sent */
    bool reading;             /* EPOLLIN registered */
    bool want_out;            /* EPOLLOUT registered */
    bool sent_continue;
    bool draining;            /* response sent, our side shut: discarding input until EOF */
    double t_active;          /* last progress (read or write), ms */
    srv_task *task;           /* the generation this connection waits for */
    struct srv_conn *prev, *next;
} srv_conn;

typedef enum task_state { TASK_QUEUED, TASK_RUNNING } task_state;

struct srv_task {
    srv_conn *conn;
    uint64_t no;              /* request number, for the log */
    char path[64];
    api_gen gen;
    api_ids ids;
    int32_t *prompt;
    int64_t n_prompt;
    bool keep_alive, chunked;
    task_state state;
    int32_t seq;              /* engine sequence while running */
    double t_arrive, t_start, t_first;
    char *text;               /* non-streamed: the whole text */
    size_t text_len, text_cap;
    int64_t n_out;            /* tokens delivered */
    bool sent_first;
    api_lp *lp;               /* non-streamed with logprobs: the whole response's */
    srv_task *next;           /* queue link */
};

typedef struct srv_slot {
    srv_task *task;           /* NULL: free */
    int32_t *hist;            /* the prompt it last ran (for prefix reuse) */
    int64_t n_hist, cap_hist;
} srv_slot;

typedef struct srv_metrics {
    uint64_t n_requests, n_success, n_cancelled, n_errors, n_rejected;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t ttft_bucket[SRV_TTFT_BUCKETS];
    uint64_t ttft_count;
    double ttft_sum;
    double latency_sum;
} srv_metrics;

typedef struct srv {
    const srv_opts *o;
    int ep, lfd, sfd, efd;
    char model_id[256];
    int64_t created;
    /* loading */
    pthread_t loader;
    bool loader_started, loaded;
    dfl_engine *engine;
    dfl_error load_err;
    /* state */
    bool stopping;
    double t_stop;
    srv_conn *conns;
    srv_conn *dead;           /* closed this iteration; freed at its end */
    int32_t n_conns;
    uint64_t next_conn_id, next_task_no;
    srv_task *q_head, *q_tail;
    int32_t n_queued;
    srv_slot *slots;
    int32_t n_slots, n_running;
    srv_metrics m;
    uint64_t seed_state;
    char *scratch;            /* response formatting */
    size_t scratch_cap;
} srv;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void srv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void srv_log(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "dflash serve: %s\n", buf);
    fflush(stderr);
}

void srv_opts_default(srv_opts *o) {
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = 8080;
    o->engine = dfl_engine_default_params();
    o->engine.n_seq = 4;
    o->sampler = dfl_sampler_default_params();
    o->max_queue = 256;
    o->timeout_s = 600;
    o->max_body = 8u << 20;
    o->prefill_chunk = 256;
    o->max_conns = 1024;
}

/* ---- connection output ------------------------------------------------------------------ */

static bool out_reserve(srv_conn *c, size_t extra) {
    if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_len + extra <= c->out_cap) return true;
    if (c->out_off > 0) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
        if (c->out_len + extra <= c->out_cap) return true;
    }
    size_t cap = c->out_cap ? c->out_cap : 4096;
    while (cap < c->out_len + extra) cap *= 2;
    char *p = realloc(c->out, cap);
    if (p == NULL) return false;
    c->out = p;
    c->out_cap = cap;
    return true;
}

static void out_put(srv_conn *c, const char *s, size_t n) {
    if (c->fd < 0 || !out_reserve(c, n)) {
        c->close_after = true;
        return;
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
}

static void out_printf(srv_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(srv_conn *c, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0) out_put(c, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

static void conn_update_events(srv *s, srv_conn *c) {
    struct epoll_event ev = {0};
    ev.events = EPOLLRDHUP | (c->reading ? EPOLLIN : 0u) | (c->want_out ? EPOLLOUT : 0u);
    ev.data.ptr = c;
    epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_close(srv *s, srv_conn *c);

/* Sends what can be sent now; registers for EPOLLOUT if something is left. */
static void conn_flush(srv *s, srv_conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            c->t_active = now_ms();
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        conn_close(s, c); /* the peer is gone */
        return;
    }
    const bool pending = c->out_off < c->out_len;
    if (!pending && c->close_after && c->task == NULL) {
        /* lingering close: shut our side and read until the client's EOF (at most 2 s), so
         * that a client still sending (a body we refused) reads the answer instead of a reset */
        if (!c->draining) {
            c->draining = true;
            c->t_active = now_ms();
            shutdown(c->fd, SHUT_WR);
            c->in_len = 0;
            if (!c->reading) {
                c->reading = true;
                conn_update_events(s, c);
            }
        }
        return;
    }
    if (pending != c->want_out) {
        c->want_out = pending;
        conn_update_events(s, c);
    }
    if (pending && c->out_len - c->out_off > SRV_MAX_OUT) conn_close(s, c); /* the client stopped reading */
}

static void put_common_headers(srv *s, srv_conn *c, bool keep_alive) {
    out_printf(c, "Server: dflash/%s\r\n", DFL_VERSION);
    if (s->o->cors_origin != NULL) {
        out_printf(c, "Access-Control-Allow-Origin: %s\r\n", s->o->cors_origin);
        if (strcmp(s->o->cors_origin, "*") != 0) out_printf(c, "Vary: Origin\r\n");
    }
    out_printf(c, "Connection: %s\r\n", keep_alive ? "keep-alive" : "close");
}

/* A complete response with a body. */
static void send_body(srv *s, srv_conn *c, int status, const char *ctype, const char *body, size_t len,
                      bool keep_alive, const char *extra_headers) {
    out_printf(c, "HTTP/1.1 %d %s\r\n", status, http_reason(status));
    put_common_headers(s, c, keep_alive);
    if (extra_headers != NULL) out_put(c, extra_headers, strlen(extra_headers));
    out_printf(c, "Content-Type: %s\r\nContent-Length: %zu\r\n\r\n", ctype, len);
    out_put(c, body, len);
    if (!keep_alive) c->close_after = true;
}

static void send_json(srv *s, srv_conn *c, int status, char *json, bool keep_alive) {
    if (json == NULL) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":null}}";
        send_body(s, c, 500, "application/json", oom, sizeof(oom) - 1, false, NULL);
        return;
    }
    send_body(s, c, status, "application/json", json, strlen(json), keep_alive, NULL);
    free(json);
}

static void send_error(srv *s, srv_conn *c, const api_error *e, bool keep_alive) {
    char hdr[96] = "";
    if (e->status == 503) snprintf(hdr, sizeof(hdr), "Retry-After: 1\r\n");
    if (e->status == 401) snprintf(hdr, sizeof(hdr), "WWW-Authenticate: Bearer\r\n");
    char *j = api_error_json(e);
    if (j == NULL) {
        send_json(s, c, 500, NULL, false);
        return;
    }
    send_body(s, c, e->status, "application/json", j, strlen(j), keep_alive && e->status < 500, hdr);
    free(j);
    if (e->status >= 400) s->m.n_errors++;
}

/* One SSE event "data: JSON\n\n", in a chunk when the response is chunked. */
static void send_event(srv_conn *c, bool chunked, const char *json, size_t len) {
    if (chunked) out_printf(c, "%zx\r\n", len + 8);
    out_put(c, "data: ", 6);
    out_put(c, json, len);
    out_put(c, "\n\n", 2);
    if (chunked) out_put(c, "\r\n", 2);
}

/* ---- connections ------------------------------------------------------------------------ */

static void task_free(srv_task *t) {
    if (t == NULL) return;
    api_gen_free(&t->gen);
    api_lp_free(t->lp);
    free(t->prompt);
    free(t->text);
    free(t);
}

static void queue_remove(srv *s, srv_task *t) {
    srv_task **pp = &s->q_head, *prev = NULL;
    while (*pp != NULL && *pp != t) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp == NULL) return;
    *pp = t->next;
    if (s->q_tail == t) s->q_tail = prev;
    s->n_queued--;
}

static void slot_release(srv *s, srv_task *t) {
    if (t->state != TASK_RUNNING) return;
    s->slots[t->seq].task = NULL;
    s->n_running--;
}

/* The connection is gone: its task (queued or running) ends now. */
static void conn_close(srv *s, srv_conn *c) {
    if (c->fd < 0) return;
    srv_task *t = c->task;
    if (t != NULL) {
        if (t->state == TASK_QUEUED) {
            queue_remove(s, t);
        } else {
            dfl_error err = {0};
            dfl_engine_seq_cancel(s->engine, t->seq, &err);
            slot_release(s, t);
        }
        s->m.n_cancelled++;
        srv_log("req %llu %s cancelled: client closed the connection after %lld tokens (%.1f ms)",
                (unsigned long long)t->no, t->path, (long long)t->n_out, now_ms() - t->t_arrive);
        task_free(t);
        c->task = NULL;
    }
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    /* unlinked now; freed by the loop after the event batch (events may still point at it) */
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = NULL;
    c->next = s->dead;
    s->dead = c;
    s->n_conns--;
}

static void free_dead(srv *s) {
    while (s->dead != NULL) {
        srv_conn *c = s->dead;
        s->dead = c->next;
        free(c->in);
        free(c->out);
        free(c);
    }
}

/* ---- requests --------------------------------------------------------------------------- */

static bool auth_ok(const srv *s, const http_request *r) {
    const char *key = s->o->api_key;
    if (key == NULL) return true;
    const char *given = NULL;
    if (strncasecmp(r->authorization, "Bearer ", 7) == 0) given = r->authorization + 7;
    else if (r->x_api_key[0] != '\0') given = r->x_api_key;
    if (given == NULL) return false;
    const size_t a = strlen(given), b = strlen(key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)given[i] ^ (unsigned char)key[i % (b ? b : 1)];
    return diff == 0;
}

static void log_simple(srv *s, const char *method, const char *path, int status, double t0) {
    (void)s;
    srv_log("req - %s %s %d (%.1f ms)", method, path, status, now_ms() - t0);
}

static void answer_error(srv *s, srv_conn *c, const http_request *r, int status, const char *type,
                         const char *code, const char *msg, double t0) {
    api_error e;
    api_error_set(&e, status, type, code, NULL, "%s", msg);
    send_error(s, c, &e, r->keep_alive);
    log_simple(s, r->method, r->path, status, t0);
}

static void handle_metrics(srv *s, srv_conn *c, const http_request *r) {
    dfl_engine_stats es;
    memset(&es, 0, sizeof(es));
    if (s->loaded) es = dfl_engine_get_stats(s->engine);
    const int32_t n_draft = s->loaded ? dfl_engine_n_draft(s->engine) : 0;
    size_t cap = 16384 + (size_t)n_draft * 128, len = 0;
    char *b = malloc(cap);
    if (b == NULL) {
        send_json(s, c, 500, NULL, false);
        return;
    }
#define P(...) len += (size_t)snprintf(b + len, cap - len, __VA_ARGS__)
#define METRIC(name, type, help, fmt, val) \
    P("# HELP dflash:%s %s\n# TYPE dflash:%s %s\ndflash:%s " fmt "\n", name, help, name, type, name, val)
    METRIC("num_requests_running", "gauge", "Requests generating now.", "%d", s->n_running);
    METRIC("num_requests_waiting", "gauge", "Requests waiting for a free sequence.", "%d", s->n_queued);
    METRIC("num_sequences", "gauge", "Concurrent sequences of the engine (-np).", "%d", s->n_slots);
    METRIC("requests_total", "counter", "Generation requests received.", "%llu", (unsigned long long)s->m.n_requests);
    METRIC("request_success_total", "counter", "Generation requests finished.", "%llu",
           (unsigned long long)s->m.n_success);
    METRIC("request_cancelled_total", "counter", "Generation requests whose client went away.", "%llu",
           (unsigned long long)s->m.n_cancelled);
    METRIC("request_rejected_total", "counter", "Requests answered 503 (queue full, loading, stopping).", "%llu",
           (unsigned long long)s->m.n_rejected);
    METRIC("http_errors_total", "counter", "Error responses (4xx and 5xx).", "%llu", (unsigned long long)s->m.n_errors);
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", "%llu",
           (unsigned long long)s->m.prompt_tokens);
    METRIC("generation_tokens_total", "counter", "Generated tokens of finished requests.", "%llu",
           (unsigned long long)s->m.generation_tokens);
    METRIC("prompt_tokens_processed_total", "counter", "Prompt tokens decoded (prefix-cache hits excluded).", "%lld",
           (long long)es.n_prompt_tokens);
    METRIC("engine_steps_total", "counter", "Engine steps (one drafter pass + one verify batch for all).", "%lld",
           (long long)es.n_steps);
    P("# HELP dflash:time_to_first_token_seconds Time from arrival to the first generated token.\n"
      "# TYPE dflash:time_to_first_token_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < SRV_TTFT_BUCKETS; i++) {
        cum += s->m.ttft_bucket[i];
        P("dflash:time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n", k_ttft_bounds[i], (unsigned long long)cum);
    }
    P("dflash:time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)s->m.ttft_count);
    P("dflash:time_to_first_token_seconds_sum %.6f\n", s->m.ttft_sum / 1e3);
    P("dflash:time_to_first_token_seconds_count %llu\n", (unsigned long long)s->m.ttft_count);
    METRIC("spec_decode_num_drafts_total", "counter", "Sequence steps that verified at least one draft token.",
           "%lld", (long long)es.n_drafts);
    METRIC("spec_decode_draft_tokens_total", "counter", "Draft tokens verified.", "%lld", (long long)es.n_draft_tokens);
    METRIC("spec_decode_accepted_tokens_total", "counter", "Draft tokens accepted.", "%lld", (long long)es.n_accepted);
    P("# HELP dflash:spec_decode_accepted_tokens_per_pos_total Accepted draft tokens by position in the draft.\n"
      "# TYPE dflash:spec_decode_accepted_tokens_per_pos_total counter\n");
    for (int32_t j = 0; j < n_draft && j < DFL_MAX_DRAFT; j++) {
        P("dflash:spec_decode_accepted_tokens_per_pos_total{position=\"%d\"} %lld\n", j,
          (long long)es.accepted_per_pos[j]);
    }
#undef METRIC
#undef P
    send_body(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", b, len < cap ? len : cap - 1, r->keep_alive,
              NULL);
    free(b);
}

static void handle_tokenize(srv *s, srv_conn *c, const http_request *r, double t0) {
    char *content;
    bool add_special, with_pieces;
    api_error e;
    if (api_parse_tokenize(r->body, r->body_len, &content, &add_special, &with_pieces, &e) != 0) {
        send_error(s, c, &e, r->keep_alive);
        log_simple(s, r->method, r->path, e.status, t0);
        return;
    }
    const dfl_vocab *v = dfl_engine_vocab(s->engine);
    const size_t len = strlen(content);
    const int64_t n_max = 3 * (int64_t)len + 2;
    int32_t *toks = malloc((size_t)n_max * sizeof(int32_t));
    int64_t n = toks ? dfl_tokenize(v, content, len, toks, n_max, add_special, true) : DFL_VOCAB_FAIL;
    free(content);
    if (n < 0) {
        free(toks);
        api_error_set(&e, 400, "invalid_request_error", NULL, "content", "the content cannot be tokenized");
        send_error(s, c, &e, r->keep_alive);
        log_simple(s, r->method, r->path, 400, t0);
        return;
    }
    char *j = api_tokens_json(v, toks, n, with_pieces);
    free(toks);
    send_json(s, c, 200, j, r->keep_alive);
    log_simple(s, r->method, r->path, j ? 200 : 500, t0);
}

static void handle_detokenize(srv *s, srv_conn *c, const http_request *r, double t0) {
    int32_t *toks;
    int64_t n;
    api_error e;
    if (api_parse_detokenize(r->body, r->body_len, &toks, &n, &e) != 0) {
        send_error(s, c, &e, r->keep_alive);
        log_simple(s, r->method, r->path, e.status, t0);
        return;
    }
    const dfl_vocab *v = dfl_engine_vocab(s->engine);
    const int64_t nv = dfl_vocab_n_tokens(v);
    for (int64_t i = 0; i < n; i++) {
        if (toks[i] >= nv) {
            api_error_set(&e, 400, "invalid_request_error", NULL, "tokens",
                          "tokens[%lld] is %d, outside the vocabulary of %lld", (long long)i, toks[i], (long long)nv);
            free(toks);
            send_error(s, c, &e, r->keep_alive);
            log_simple(s, r->method, r->path, 400, t0);
            return;
        }
    }
    /* through the streaming detokenizer: the text is valid UTF-8 (U+FFFD for broken bytes) */
    dfl_error derr = {0};
    dfl_detok *dt = dfl_detok_new(v, true, &derr);
    char *txt = NULL;
    size_t len = 0, cap = 0;
    bool ok = dt != NULL;
    for (int64_t i = 0; ok && i <= n; i++) {
        const char *piece;
        size_t pl;
        if (i < n) ok = dfl_detok_push(dt, toks[i], &piece, &pl) == DFL_OK;
        else dfl_detok_flush(dt, &piece, &pl);
        if (ok && len + pl + 1 > cap) {
            cap = (len + pl + 1) * 2;
            char *p = realloc(txt, cap);
            ok = p != NULL;
            if (ok) txt = p;
        }
        if (ok && pl > 0) {
            memcpy(txt + len, piece, pl);
            len += pl;
        }
    }
    dfl_detok_free(dt);
    free(toks);
    char *j = ok ? api_content_json(txt ? txt : "", len) : NULL;
    free(txt);
    send_json(s, c, 200, j, r->keep_alive);
    log_simple(s, r->method, r->path, j ? 200 : 500, t0);
}

static uint64_t next_seed(srv *s) {
    /* splitmix64 over a counter seeded from the clock at start-up */
    uint64_t z = (s->seed_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void handle_generate(srv *s, srv_conn *c, const http_request *r, bool chat, double t0) {
    api_error e;
    if (!s->loaded || s->stopping) {
        s->m.n_rejected++;
        answer_error(s, c, r, 503, "server_error", s->stopping ? "shutting_down" : "model_loading",
                     s->stopping ? "the server is shutting down" : "the model is loading", t0);
        return;
    }
    srv_task *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        send_json(s, c, 500, NULL, false);
        return;
    }
    t->no = ++s->next_task_no;
    t->t_arrive = t0;
    t->keep_alive = r->keep_alive;
    t->chunked = r->version_minor >= 1;
    snprintf(t->path, sizeof(t->path), "%.63s", r->path);
    s->m.n_requests++;
    if (api_parse_gen(r->body, r->body_len, chat, dfl_engine_vocab(s->engine), &s->o->sampler, &t->gen, &e) != 0)
        goto reject;
    if (!t->gen.has_seed && !s->o->fixed_seed) t->gen.sampler.seed = next_seed(s);
    const dfl_vocab *v = dfl_engine_vocab(s->engine);
    if (t->gen.prompt_tokens != NULL) {
        t->prompt = t->gen.prompt_tokens;
        t->n_prompt = t->gen.n_prompt_tokens;
        t->gen.prompt_tokens = NULL;
        const int64_t nv = dfl_vocab_n_tokens(v);
        for (int64_t i = 0; i < t->n_prompt; i++) {
            if (t->prompt[i] >= nv) {
                api_error_set(&e, 400, "invalid_request_error", NULL, "prompt",
                              "prompt token %lld is %d, outside the vocabulary of %lld", (long long)i, t->prompt[i],
                              (long long)nv);
                goto reject;
            }
        }
    } else {
        const size_t len = strlen(t->gen.prompt);
        const int64_t n_max = 3 * (int64_t)len + 2;
        t->prompt = malloc((size_t)n_max * sizeof(int32_t));
        t->n_prompt = t->prompt ? dfl_tokenize(v, t->gen.prompt, len, t->prompt, n_max, true, chat) : DFL_VOCAB_FAIL;
        if (t->n_prompt <= 0) {
            api_error_set(&e, 400, "invalid_request_error", NULL, chat ? "messages" : "prompt",
                          "the prompt cannot be tokenized (or is empty)");
            goto reject;
        }
    }
    {
        const int64_t n_ctx = dfl_engine_n_ctx(s->engine);
        const int64_t room = (int64_t)dfl_engine_n_draft(s->engine) + 2;
        if (t->n_prompt + room > n_ctx) {
            api_error_set(&e, 400, "invalid_request_error", "context_length_exceeded", chat ? "messages" : "prompt",
                          "this model's context is %lld tokens per sequence; the prompt has %lld tokens and generating "
                          "needs at least %lld more", (long long)n_ctx, (long long)t->n_prompt, (long long)room);
            goto reject;
        }
    }
    if (s->n_queued >= s->n_slots - s->n_running + s->o->max_queue) {
        s->m.n_rejected++;
        api_error_set(&e, 503, "server_error", "queue_full", NULL,
                      "the server is busy (%d requests waiting, --max-queue %d); retry later", s->n_queued,
                      s->o->max_queue);
        goto reject;
    }
    /* identity of the response */
    snprintf(t->ids.id, sizeof(t->ids.id), "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)s->created, (unsigned long long)t->no);
    t->ids.created = (int64_t)time(NULL);
    t->ids.model = s->model_id;
    t->ids.chat = chat;
    /* queue it; a streamed response starts now */
    t->conn = c;
    t->state = TASK_QUEUED;
    t->seq = -1;
    c->task = t;
    if (s->q_tail) s->q_tail->next = t;
    else s->q_head = t;
    s->q_tail = t;
    s->n_queued++;
    if (t->gen.stream) {
        out_printf(c, "HTTP/1.1 200 OK\r\n");
        put_common_headers(s, c, t->keep_alive && t->chunked);
        out_printf(c, "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n%s\r\n",
                   t->chunked ? "Transfer-Encoding: chunked\r\n" : "");
        conn_flush(s, c);
    }
    return;
reject:
    srv_log("req %llu %s %d: %s", (unsigned long long)t->no, r->path, e.status, e.message);
    send_error(s, c, &e, r->keep_alive);
    task_free(t);
}

/* Routes one parsed request. */
static void handle_request(srv *s, srv_conn *c, const http_request *r) {
    const double t0 = now_ms();
    const char *p = r->path;
    const bool get = strcmp(r->method, "GET") == 0;
    const bool post = strcmp(r->method, "POST") == 0;
    if (strcmp(r->method, "OPTIONS") == 0) {
        char hdr[512] = "";
        if (s->o->cors_origin != NULL)
            snprintf(hdr, sizeof(hdr), "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
                                       "Access-Control-Allow-Headers: Authorization, Content-Type, X-Api-Key\r\n"
                                       "Access-Control-Max-Age: 600\r\n");
        strncat(hdr, "Allow: GET, POST, OPTIONS\r\n", sizeof(hdr) - strlen(hdr) - 1);
        send_body(s, c, 204, "text/plain", "", 0, r->keep_alive, hdr);
        log_simple(s, r->method, p, 204, t0);
        return;
    }
    if (strcmp(p, "/health") == 0 || strcmp(p, "/v1/health") == 0) {
        if (!get) goto method;
        const bool ok = s->loaded && !s->stopping;
        const char *body = ok ? "{\"status\":\"ok\"}"
                              : (s->stopping ? "{\"error\":{\"message\":\"the server is shutting down\",\"type\":"
                                               "\"unavailable_error\",\"code\":503}}"
                                             : "{\"error\":{\"message\":\"Loading model\",\"type\":"
                                               "\"unavailable_error\",\"code\":503}}");
        send_body(s, c, ok ? 200 : 503, "application/json", body, strlen(body), r->keep_alive, NULL);
        return; /* health checks are not logged (load balancers poll them) */
    }
    if (!auth_ok(s, r)) {
        answer_error(s, c, r, 401, "authentication_error", "invalid_api_key", "invalid or missing API key", t0);
        return;
    }
    if (strcmp(p, "/metrics") == 0) {
        if (!get) goto method;
        handle_metrics(s, c, r);
        return;
    }
    const bool models = strcmp(p, "/v1/models") == 0 || strcmp(p, "/models") == 0;
    if (models || strncmp(p, "/v1/models/", 11) == 0 || strncmp(p, "/models/", 8) == 0) {
        if (!get) goto method;
        if (models) {
            send_json(s, c, 200, api_models_json(s->model_id, s->created, true), r->keep_alive);
        } else {
            const char *id = strchr(p + 1, '/') + 1;
            if (strncmp(p, "/v1/", 4) == 0) id = p + 11;
            if (strcmp(id, s->model_id) != 0) {
                char msg[600];
                snprintf(msg, sizeof(msg), "The model '%.256s' does not exist", id);
                answer_error(s, c, r, 404, "invalid_request_error", "model_not_found", msg, t0);
                return;
            }
            send_json(s, c, 200, api_models_json(s->model_id, s->created, false), r->keep_alive);
        }
        log_simple(s, r->method, p, 200, t0);
        return;
    }
    const bool chat = strcmp(p, "/v1/chat/completions") == 0 || strcmp(p, "/chat/completions") == 0;
    const bool cmpl = strcmp(p, "/v1/completions") == 0 || strcmp(p, "/completions") == 0;
    const bool tok = strcmp(p, "/tokenize") == 0, detok = strcmp(p, "/detokenize") == 0;
    if (chat || cmpl || tok || detok) {
        if (!post) goto method;
        if ((tok || detok) && !s->loaded) {
            answer_error(s, c, r, 503, "server_error", "model_loading", "the model is loading", t0);
            return;
        }
        if (tok) handle_tokenize(s, c, r, t0);
        else if (detok) handle_detokenize(s, c, r, t0);
        else handle_generate(s, c, r, chat, t0);
        return;
    }
    {
        char msg[600];
        snprintf(msg, sizeof(msg), "no route for %s %.256s", r->method, p);
        answer_error(s, c, r, 404, "invalid_request_error", "not_found", msg, t0);
        return;
    }
method:
    answer_error(s, c, r, 405, "invalid_request_error", "method_not_allowed", "method not allowed for this path", t0);
}

/* Parses and handles the requests buffered on c (one at a time: a connection waiting for a
 * generation parses nothing more until it is answered). */
static void conn_process(srv *s, srv_conn *c) {
    while (c->fd >= 0 && c->task == NULL && !c->close_after && c->in_len > 0) {
        http_request r;
        int status;
        const char *why;
        http_parse_result pr = http_parse(c->in, c->in_len, s->o->max_body, &r, &status, &why);
        if (pr == HTTP_INCOMPLETE) {
            if (r.head_len > 0 && r.expect_continue && !c->sent_continue) {
                out_printf(c, "HTTP/1.1 100 Continue\r\n\r\n");
                c->sent_continue = true;
            }
            break;
        }
        if (pr == HTTP_ERROR) {
            api_error e;
            api_error_set(&e, status, "invalid_request_error", status == 413 ? "request_too_large" : "bad_request",
                          NULL, "%s", why);
            if (status == 413) {
                snprintf(e.message, sizeof(e.message), "request body too large (more than %zu bytes; see --max-body)",
                         s->o->max_body);
            }
            send_error(s, c, &e, false);
            srv_log("req - %s %s %d: %s", r.method[0] ? r.method : "-", r.path[0] ? r.path : "-", status, why);
            c->close_after = true;
            c->in_len = 0;
            break;
        }
        c->sent_continue = false;
        handle_request(s, c, &r);
        memmove(c->in, c->in + r.consumed, c->in_len - r.consumed);
        c->in_len -= r.consumed;
        if (!r.keep_alive && c->task == NULL) c->close_after = true;
    }
    if (c->fd >= 0) conn_flush(s, c);
}

static void conn_readable(srv *s, srv_conn *c) {
    if (c->draining) {
        char sink[16384];
        for (;;) {
            ssize_t n = recv(c->fd, sink, sizeof(sink), 0);
            if (n > 0) continue;
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            conn_close(s, c);
            return;
        }
    }
    for (;;) {
        const size_t limit = HTTP_MAX_HEAD + s->o->max_body + 1;
        if (c->in_len >= limit) {
            /* a waiting connection pipelined too much, or a body beyond what parse accepts */
            if (c->reading) {
                c->reading = false;
                conn_update_events(s, c);
            }
            break;
        }
        if (c->in_cap - c->in_len < SRV_READ_CHUNK / 4) {
            size_t cap = c->in_cap ? c->in_cap * 2 : SRV_READ_CHUNK;
            if (cap > limit + SRV_READ_CHUNK) cap = limit + SRV_READ_CHUNK;
            char *p = realloc(c->in, cap);
            if (p == NULL) {
                conn_close(s, c);
                return;
            }
            c->in = p;
            c->in_cap = cap;
        }
        size_t want = c->in_cap - c->in_len;
        if (want > limit - c->in_len) want = limit - c->in_len;
        ssize_t n = recv(c->fd, c->in + c->in_len, want, 0);
        if (n > 0) {
            c->in_len += (size_t)n;
            c->t_active = now_ms();
            if ((size_t)n < want) break;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n == 0 && c->in_len > 0 && c->task == NULL) {
            /* the client sent a request and shut its side: answer what is complete, then close
             * (a generation it started this way counts as abandoned) */
            c->close_after = true;
            conn_process(s, c);
            if (c->fd >= 0 && c->task != NULL) conn_close(s, c);
            return;
        }
        conn_close(s, c); /* EOF or error: the client is gone */
        return;
    }
    conn_process(s, c);
}

static void accept_all(srv *s) {
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) srv_log("accept: %s", strerror(errno));
            return;
        }
        if (s->n_conns >= s->o->max_conns) {
            close(fd);
            continue;
        }
        srv_conn *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->fd = fd;
        c->id = ++s->next_conn_id;
        c->reading = true;
        c->t_active = now_ms();
        getnameinfo((struct sockaddr *)&sa, sl, c->peer, sizeof(c->peer), NULL, 0, NI_NUMERICHOST);
        struct epoll_event ev = {0};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.ptr = c;
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->n_conns++;
    }
}

/* ---- the scheduler ---------------------------------------------------------------------- */

static void task_append_text(srv_task *t, const char *txt, size_t n) {
    if (n == 0) return;
    if (t->text_len + n + 1 > t->text_cap) {
        size_t cap = (t->text_len + n + 1) * 2;
        char *p = realloc(t->text, cap);
        if (p == NULL) return;
        t->text = p;
        t->text_cap = cap;
    }
    memcpy(t->text + t->text_len, txt, n);
    t->text_len += n;
    t->text[t->text_len] = '\0';
}

static void emit_json_event(srv_task *t, char *json) {
    if (json == NULL) return;
    send_event(t->conn, t->chunked, json, strlen(json));
    free(json);
}

/* Ends a running task: the finish chunk / the whole response, usage, the log line. */
static void task_finish(srv *s, srv_task *t, dfl_finish_reason fin) {
    srv_conn *c = t->conn;
    dfl_seq_stats st;
    memset(&st, 0, sizeof(st));
    dfl_error err = {0};
    dfl_engine_seq_stats(s->engine, t->seq, &st, &err);
    const double t_end = now_ms();
    api_usage u;
    memset(&u, 0, sizeof(u));
    u.prompt_tokens = t->n_prompt;
    u.cached_tokens = st.n_reused;
    u.completion_tokens = st.n_generated;
    u.prompt_ms = st.t_prefill_ms;
    u.ttft_ms = t->sent_first ? t->t_first - t->t_arrive : 0.0;
    u.predicted_ms = t->sent_first ? t_end - t->t_first : 0.0;
    u.n_steps = st.n_steps;
    u.n_drafts = st.n_drafts;
    u.n_draft_tokens = st.n_draft_tokens;
    u.n_accepted = st.n_accepted;
    const char *fname = api_finish_name(fin);
    if (t->gen.stream) {
        emit_json_event(t, api_chunk_json(&t->ids, false, "", 0, fname ? fname : "stop", t->gen.include_usage, NULL));
        if (t->gen.include_usage) emit_json_event(t, api_usage_chunk_json(&t->ids, &u));
        if (t->chunked) out_printf(c, "%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n", 14);
        else out_printf(c, "data: [DONE]\n\n");
        if (!(t->keep_alive && t->chunked)) c->close_after = true;
    } else {
        send_json(s, c, 200,
                  api_response_json(&t->ids, t->text ? t->text : "", t->text_len, fname ? fname : "stop", &u, t->lp),
                  t->keep_alive);
    }
    s->m.n_success++;
    s->m.prompt_tokens += (uint64_t)t->n_prompt;
    s->m.generation_tokens += (uint64_t)st.n_generated;
    s->m.latency_sum += t_end - t->t_arrive;
    const double tau = st.n_steps > 0 ? (double)(st.n_accepted + st.n_steps) / (double)st.n_steps : 0.0;
    srv_log("req %llu %s 200 seq %d prompt %lld (cached %lld) gen %lld finish %s tau %.2f ttft %.1f ms total %.1f ms%s",
            (unsigned long long)t->no, t->path, t->seq, (long long)t->n_prompt, (long long)st.n_reused,
            (long long)st.n_generated, fname ? fname : "stop", tau, u.ttft_ms, t_end - t->t_arrive,
            t->gen.stream ? " stream" : "");
    slot_release(s, t);
    c->task = NULL;
    task_free(t);
    conn_flush(s, c);
    if (c->fd >= 0) conn_process(s, c); /* pipelined requests */
}

/* A task that cannot continue (engine error): an error response or event. */
static void task_fail(srv *s, srv_task *t, const char *msg) {
    srv_conn *c = t->conn;
    api_error e;
    api_error_set(&e, 500, "server_error", NULL, NULL, "%s", msg);
    srv_log("req %llu %s 500: %s", (unsigned long long)t->no, t->path, msg);
    if (t->state == TASK_RUNNING) {
        dfl_error err = {0};
        dfl_engine_seq_cancel(s->engine, t->seq, &err);
        dfl_engine_seq_reset(s->engine, t->seq, &err);
        s->slots[t->seq].n_hist = 0;
    }
    if (t->gen.stream) {
        emit_json_event(t, api_error_json(&e));
        if (t->chunked) out_printf(c, "0\r\n\r\n");
        c->close_after = true;
        s->m.n_errors++;
    } else {
        send_error(s, c, &e, false);
    }
    slot_release(s, t);
    c->task = NULL;
    task_free(t);
    conn_flush(s, c);
}

/* Delivers what the engine produced for t since the last read. */
static void task_deliver(srv *s, srv_task *t) {
    dfl_seq_output out;
    dfl_error err = {0};
    if (dfl_engine_seq_read(s->engine, t->seq, &out, &err) != DFL_OK) {
        task_fail(s, t, err.msg);
        return;
    }
    if (out.n_tokens > 0 && !t->sent_first) {
        t->sent_first = true;
        t->t_first = now_ms();
        const double ttft = t->t_first - t->t_arrive;
        s->m.ttft_count++;
        s->m.ttft_sum += ttft;
        for (int i = 0; i < SRV_TTFT_BUCKETS; i++) {
            if (ttft / 1e3 <= k_ttft_bounds[i]) {
                s->m.ttft_bucket[i]++;
                break;
            }
        }
    }
    t->n_out += out.n_tokens;
    const dfl_vocab *v = dfl_engine_vocab(s->engine);
    if (t->gen.stream) {
        /* a chunk per delta; with logprobs also for tokens whose text is still held back */
        if (out.text_len > 0 || (t->gen.logprobs && out.n_tokens > 0)) {
            api_lp *lp = t->gen.logprobs ? api_lp_new(t->ids.chat) : NULL;
            api_lp_add(lp, v, out.tokens, out.n_tokens, out.logprobs, out.top_ids, out.top_logprobs, out.n_top);
            emit_json_event(t, api_chunk_json(&t->ids, false, out.text, out.text_len, NULL, t->gen.include_usage, lp));
            api_lp_free(lp);
        }
    } else {
        task_append_text(t, out.text, out.text_len);
        api_lp_add(t->lp, v, out.tokens, out.n_tokens, out.logprobs, out.top_ids, out.top_logprobs, out.n_top);
    }
    if (out.state == DFL_SEQ_FINISHED || out.state == DFL_SEQ_IDLE) {
        task_finish(s, t, out.finish);
        return;
    }
    if (t->gen.stream) conn_flush(s, t->conn);
}

/* The free slot whose last prompt shares the longest prefix with the new one. */
static int32_t pick_slot(srv *s, const int32_t *prompt, int64_t n) {
    int32_t best = -1;
    int64_t best_len = -1;
    for (int32_t i = 0; i < s->n_slots; i++) {
        if (s->slots[i].task != NULL) continue;
        int64_t k = 0;
        while (k < n && k < s->slots[i].n_hist && s->slots[i].hist[k] == prompt[k]) k++;
        if (k > best_len) {
            best_len = k;
            best = i;
        }
    }
    return best;
}

/* Starts the oldest waiting task on a free sequence (its prompt is processed here). Returns the
 * prompt tokens it took, 0 if nothing was started. */
static int64_t admit_one(srv *s) {
    srv_task *t = s->q_head;
    if (t == NULL || s->n_running >= s->n_slots) return 0;
    const int32_t seq = pick_slot(s, t->prompt, t->n_prompt);
    if (seq < 0) return 0;
    /* what seq_start decodes now: the whole prompt, or its first chunk */
    const int64_t chunk = s->o->prefill_chunk;
    const int64_t n_prompt = chunk > 0 && chunk < t->n_prompt ? chunk : t->n_prompt;
    s->q_head = t->next;
    if (s->q_head == NULL) s->q_tail = NULL;
    t->next = NULL;
    s->n_queued--;
    srv_slot *sl = &s->slots[seq];
    if (sl->cap_hist < t->n_prompt) {
        int32_t *p = realloc(sl->hist, (size_t)t->n_prompt * sizeof(int32_t));
        if (p != NULL) {
            sl->hist = p;
            sl->cap_hist = t->n_prompt;
        }
    }
    if (sl->cap_hist >= t->n_prompt) {
        memcpy(sl->hist, t->prompt, (size_t)t->n_prompt * sizeof(int32_t));
        sl->n_hist = t->n_prompt;
    } else {
        sl->n_hist = 0;
    }
    dfl_seq_params sp = dfl_seq_default_params();
    sp.sampler = t->gen.sampler;
    sp.max_tokens = t->gen.max_tokens;
    sp.stop = (const char *const *)t->gen.stop;
    sp.n_stop = t->gen.n_stop;
    sp.ignore_eos = t->gen.ignore_eos;
    sp.prefill_chunk = s->o->prefill_chunk;
    sp.logprobs = t->gen.logprobs;
    sp.n_top_logprobs = t->gen.top_logprobs;
    if (t->gen.logprobs && !t->gen.stream && t->lp == NULL) t->lp = api_lp_new(t->ids.chat);
    t->state = TASK_RUNNING;
    t->seq = seq;
    t->t_start = now_ms();
    sl->task = t;
    s->n_running++;
    dfl_error err = {0};
    if (dfl_engine_seq_start(s->engine, seq, t->prompt, t->n_prompt, &sp, &err) != DFL_OK) {
        /* a parameter or prompt the engine refuses: a 400 (nothing was changed) */
        srv_conn *c = t->conn;
        api_error e;
        api_error_set(&e, 400, "invalid_request_error", NULL, NULL, "%s", err.msg);
        srv_log("req %llu %s 400: %s", (unsigned long long)t->no, t->path, err.msg);
        sl->n_hist = 0;
        if (t->gen.stream) {
            emit_json_event(t, api_error_json(&e));
            if (t->chunked) out_printf(c, "0\r\n\r\n");
            c->close_after = true;
            s->m.n_errors++;
        } else {
            send_error(s, c, &e, t->keep_alive);
        }
        slot_release(s, t);
        c->task = NULL;
        task_free(t);
        conn_flush(s, c);
        if (c->fd >= 0) conn_process(s, c);
        return n_prompt;
    }
    if (t->gen.stream && t->ids.chat) {
        emit_json_event(t, api_chunk_json(&t->ids, true, "", 0, NULL, t->gen.include_usage, NULL));
    }
    task_deliver(s, t);
    return n_prompt;
}

/* Admits waiting tasks while sequences are free, up to about one batch of prompt tokens per loop
 * iteration (at least one task), so that arrivals do not stall the running streams for long. */
static void admit(srv *s) {
    int64_t budget = s->o->engine.n_batch > 0 ? s->o->engine.n_batch : 512;
    while (budget > 0) {
        const int64_t used = admit_one(s);
        if (used == 0) break;
        budget -= used;
    }
}

static void run_step(srv *s) {
    if (dfl_engine_n_active(s->engine) == 0) return;
    dfl_error err = {0};
    if (dfl_engine_step(s->engine, NULL, 0, &err) != DFL_OK) {
        srv_log("engine step failed: %s", err.msg);
        for (int32_t i = 0; i < s->n_slots; i++) {
            if (s->slots[i].task != NULL) task_fail(s, s->slots[i].task, err.msg);
        }
        return;
    }
    for (int32_t i = 0; i < s->n_slots; i++) {
        if (s->slots[i].task != NULL) task_deliver(s, s->slots[i].task);
    }
}

/* Connections idle (or stalled) beyond --timeout are closed; a request that is being received
 * gets a 408 first. */
static void sweep_timeouts(srv *s, double now) {
    const double lim = (double)s->o->timeout_s * 1e3;
    srv_conn *c = s->conns;
    while (c != NULL) {
        srv_conn *next = c->next;
        const bool waiting_engine = c->task != NULL && c->out_off == c->out_len;
        if (c->draining && now - c->t_active > 2000) {
            conn_close(s, c);
        } else if (!waiting_engine && now - c->t_active > lim) {
            if (c->task == NULL && c->in_len > 0 && c->out_off == c->out_len) {
                static const char msg[] = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
                send(c->fd, msg, sizeof(msg) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            }
            conn_close(s, c);
        }
        c = next;
    }
}

/* ---- loading and main loop -------------------------------------------------------------- */

static void *loader_main(void *arg) {
    srv *s = arg;
    s->engine = dfl_engine_new(s->o->target_path, s->o->drafter_path, &s->o->engine, &s->load_err);
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof(one));
    (void)w;
    return NULL;
}

static int open_listener(srv *s) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof(port), "%d", s->o->port);
    int rc = getaddrinfo(s->o->host, port, &hints, &res);
    if (rc != 0) {
        srv_log("cannot resolve --host %s: %s", s->o->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 512) == 0) break;
        srv_log("cannot listen on %s:%d: %s", s->o->host, s->o->port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int bound_port(int fd) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) return -1;
    if (sa.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&sa)->sin_port);
    if (sa.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    return -1;
}

static void base_name(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && strcmp(b + n - 5, ".gguf") == 0) n -= 5;
    if (n >= cap) n = cap - 1;
    memcpy(out, b, n);
    out[n] = '\0';
}

static void srv_free(srv *s) {
    if (s->loader_started) pthread_join(s->loader, NULL);
    while (s->conns != NULL) conn_close(s, s->conns);
    free_dead(s);
    while (s->q_head != NULL) {
        srv_task *t = s->q_head;
        s->q_head = t->next;
        task_free(t);
    }
    for (int32_t i = 0; s->slots != NULL && i < s->n_slots; i++) free(s->slots[i].hist);
    free(s->slots);
    dfl_engine_free(s->engine);
    if (s->lfd >= 0) close(s->lfd);
    if (s->sfd >= 0) close(s->sfd);
    if (s->efd >= 0) close(s->efd);
    if (s->ep >= 0) close(s->ep);
}

static bool add_fd(srv *s, int fd, void *tag) {
    struct epoll_event ev = {0};
    ev.events = EPOLLIN;
    ev.data.ptr = tag;
    return epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) == 0;
}

int srv_run(const srv_opts *o) {
    srv sv;
    srv *s = &sv;
    memset(s, 0, sizeof(*s));
    s->o = o;
    s->ep = s->lfd = s->sfd = s->efd = -1;
    s->created = (int64_t)time(NULL);
    s->seed_state = (uint64_t)now_ms() * 1000003u ^ (uint64_t)getpid();
    if (o->alias != NULL) snprintf(s->model_id, sizeof(s->model_id), "%s", o->alias);
    else base_name(o->target_path, s->model_id, sizeof(s->model_id));
    int rc = 1;
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGPIPE);
    if (pthread_sigmask(SIG_BLOCK, &mask, NULL) != 0) {
        srv_log("cannot block signals");
        return 1;
    }
    sigdelset(&mask, SIGPIPE);
    s->sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    if (s->sfd < 0 || s->efd < 0 || s->ep < 0) {
        srv_log("cannot create the event loop: %s", strerror(errno));
        goto done;
    }
    s->lfd = open_listener(s);
    if (s->lfd < 0) goto done;
    /* the non-connection fds are told apart by the address of their field in s */
    if (!add_fd(s, s->lfd, &s->lfd) || !add_fd(s, s->sfd, &s->sfd) || !add_fd(s, s->efd, &s->efd)) {
        srv_log("epoll: %s", strerror(errno));
        goto done;
    }
    srv_log("listening on http://%s%s%s:%d (model %s; loading)", strchr(o->host, ':') ? "[" : "", o->host,
            strchr(o->host, ':') ? "]" : "", bound_port(s->lfd), s->model_id);
    if (pthread_create(&s->loader, NULL, loader_main, s) != 0) {
        srv_log("cannot start the loader thread");
        goto done;
    }
    s->loader_started = true;
    double t_sweep = now_ms();
    struct epoll_event evs[64];
    for (;;) {
        const bool busy = s->loaded && (s->n_running > 0 || (s->q_head != NULL && s->n_running < s->n_slots));
        int n = epoll_wait(s->ep, evs, 64, busy ? 0 : 200);
        if (n < 0 && errno != EINTR) {
            srv_log("epoll_wait: %s", strerror(errno));
            goto done;
        }
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &s->lfd) {
                accept_all(s);
            } else if (tag == &s->sfd) {
                struct signalfd_siginfo si;
                while (read(s->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                    if (!s->stopping) {
                        s->stopping = true;
                        s->t_stop = now_ms();
                        srv_log("signal %u: stopping (no new requests; finishing %d running, %d waiting, up to %d s)",
                                si.ssi_signo, s->n_running, s->n_queued, o->timeout_s);
                        epoll_ctl(s->ep, EPOLL_CTL_DEL, s->lfd, NULL);
                        close(s->lfd);
                        s->lfd = -1;
                    } else {
                        srv_log("second signal: stopping now");
                        rc = 0;
                        goto done;
                    }
                }
            } else if (tag == &s->efd) {
                uint64_t v;
                ssize_t r = read(s->efd, &v, sizeof(v));
                (void)r;
                pthread_join(s->loader, NULL);
                s->loader_started = false;
                if (s->engine == NULL) {
                    srv_log("cannot load the model: %s", s->load_err.msg);
                    goto done;
                }
                s->n_slots = dfl_engine_n_seq(s->engine);
                s->slots = calloc((size_t)s->n_slots, sizeof(srv_slot));
                if (s->slots == NULL) goto done;
                s->loaded = true;
                const dfl_model *dm = dfl_engine_drafter(s->engine);
                srv_log("ready: %d sequences of %lld tokens, %s (draft %d, features %s)", s->n_slots,
                        (long long)dfl_engine_n_ctx(s->engine), dm ? "speculative" : "plain decoding",
                        dfl_engine_n_draft(s->engine), dfl_engine_feature_path(s->engine));
            } else {
                srv_conn *c = tag;
                if (c->fd < 0) continue;
                const uint32_t e = evs[i].events;
                if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
                    if ((e & (EPOLLHUP | EPOLLERR)) || ((e & EPOLLRDHUP) && !(e & EPOLLIN))) conn_close(s, c);
                    else conn_readable(s, c);
                }
                if (c->fd >= 0 && (e & EPOLLOUT)) conn_flush(s, c);
            }
        }
        if (s->loaded) {
            admit(s);
            run_step(s);
        }
        free_dead(s); /* connections closed in this iteration (no event refers to them any more) */
        const double now = now_ms();
        if (now - t_sweep > 1000) {
            sweep_timeouts(s, now);
            t_sweep = now;
        }
        if (s->stopping) {
            const bool idle = s->n_running == 0 && s->n_queued == 0;
            bool flushed = true;
            for (srv_conn *c = s->conns; c != NULL; c = c->next) flushed = flushed && c->out_off == c->out_len;
            if ((idle && flushed) || now - s->t_stop > (double)o->timeout_s * 1e3) {
                srv_log("stopped (%llu requests served, %d unfinished)", (unsigned long long)s->m.n_success,
                        s->n_running + s->n_queued);
                rc = 0;
                goto done;
            }
        }
    }
done:
    srv_free(s);
    return rc;
}
