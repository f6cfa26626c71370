/* server.h: the `dflash serve` event loop: one thread runs an epoll loop over the listening
 * socket, the connections, a signalfd (SIGINT/SIGTERM) and the model loader's eventfd, and drives
 * ONE dfl_engine between socket events: waiting requests join free sequences between steps,
 * every active sequence advances by one dfl_engine_step per loop iteration, text deltas go out as
 * soon as a step produced them, and a closed connection cancels its sequence before the next
 * step. Sockets are non-blocking: the engine never waits on a client. */
#ifndef DFL_SERVE_SERVER_H
#define DFL_SERVE_SERVER_H

#include "dflash.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_opts {
    const char *host;          /* --host (default 127.0.0.1) */
    int port;                  /* --port (default 8080; 0: any free port, printed at start-up) */
    const char *target_path;   /* -m */
    const char *drafter_path;  /* -md (NULL: plain decoding) */
    const char *alias;         /* the model id clients see */
    dfl_engine_params engine;  /* n_seq (-np), n_ctx (-c), threads, draft settings */
    dfl_sampler_params sampler;/* defaults for requests that do not set a field */
    bool fixed_seed;           /* --seed given: requests without a seed use sampler.seed (else a fresh one) */
    const char *api_key;       /* --api-key (NULL: no key) */
    const char *cors_origin;   /* --cors-origin (NULL: no CORS headers) */
    int32_t max_queue;         /* --max-queue: waiting requests before 503 */
    int32_t timeout_s;         /* --timeout: idle / stalled connection and shutdown grace, seconds */
    size_t max_body;           /* --max-body: request body bytes before 413 */
    int32_t max_conns;         /* connections at once (beyond: closed at accept) */
    int64_t prefill_chunk;     /* --prefill-chunk: prompt tokens per step for a joining request (0: all at once) */
} srv_opts;

void srv_opts_default(srv_opts *o);
/* Runs the server until SIGINT/SIGTERM (then: stop accepting, finish in-flight requests up to
 * timeout_s, return 0) or a fatal error (message printed, return 1). */
int srv_run(const srv_opts *o);

#endif
