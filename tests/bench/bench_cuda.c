/* bench_cuda.c: the speculative loop's costs on one device (`make bench-cuda`; used by
 * tools/device-check.sh on a GPU). For a target + DFlash drafter pair it measures, medians over
 * repetitions:
 *   - load: model load + context creation (the weight upload on a GPU);
 *   - pp: prompt processing (one 512-token batch);
 *   - tg: single-token greedy decoding, against the HBM roofline (weight bytes read per token
 *     / bandwidth, default 4.8 TB/s: H200);
 *   - verify16: one target batch of 16 tokens with logits at every entry (a verification), and
 *     the same without the logits read-back;
 *   - draft: one drafter block pass; inject: feeding the drafter one step of features;
 *   - spec step time with the device feature path and with the host path (real drafter), the
 *     feature bytes each path copies through host memory per step (0 expected on the device
 *     path), and
 *     the spec decoding rate with oracle drafts (the target's own greedy continuation: every
 *     draft accepted, the upper bound of the loop);
 *   - the feature handoff between two queues of the backend: target-side work, event `written`,
 *     then the drafter-side reads either after a host wait (cudaEventSynchronize) or behind a
 *     device-side wait (cudaStreamWaitEvent): end-to-end time and host-blocked time.
 * Prints a human-readable report and one `RESULT key=value ...` line for scripts.
 *   bench-cuda --target T.gguf --drafter D.gguf [--device cuda|cpu] [--label L] [--gen N]
 *              [--bandwidth GBps] [--ctx N] */
#define _POSIX_C_SOURCE 200809L
#include "dflash.h"
#include "speculative/session.h"
#include "backend/backend.h"
#include "model/context.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[b]) b = i;
    }
    return (int)b;
}

static void die(const char *what, const dfl_error *err) {
    fprintf(stderr, "bench-cuda: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

/* Decodes n tokens of seq 0 at its current length; outputs on all entries if all_out, else on the last. */
static void decode(dfl_context *ctx, dfl_batch *b, const int32_t *tok, int64_t n, bool all_out) {
    dfl_error err = {0};
    dfl_batch_clear(b);
    const int64_t p0 = dfl_seq_len(ctx, 0);
    for (int64_t i = 0; i < n; i++) {
        const int32_t pos = (int32_t)(p0 + i);
        dfl_batch_add_token(b, tok[i], &pos, 0, all_out || i == n - 1);
    }
    if (dfl_decode(ctx, b, &err) != DFL_OK) die("decode", &err);
}

/* Draft tokens per step plus the bonus: a fully accepted step commits block_size tokens. */
static int64_t block_commit(const dfl_hparams *dh) { return dh->block_size; }

/* ---- oracle drafts -------------------------------------------------------------------------- */

typedef struct oracle {
    const int32_t *ref; /* the target's greedy continuation after the prompt */
    int64_t n_ref;
    int64_t done;       /* tokens committed so far */
} oracle;

static void oracle_hook(void *user, int32_t seq, int32_t *draft, int32_t n_draft) {
    (void)seq;
    oracle *o = user;
    for (int32_t j = 0; j < n_draft; j++) {
        const int64_t at = o->done + j;
        draft[j] = at < o->n_ref ? o->ref[at] : 0;
    }
}

typedef struct spec_result {
    double step_ms;     /* median step */
    double draft_ms, verify_ms, inject_ms, other_ms; /* per step (means) */
    double tok_s;       /* committed tokens per second over the run */
    double tau;
    double host_bytes;  /* feature bytes copied through host memory per step (prefill excluded) */
    char path[16];      /* the feature path in use ("device", or "host" after a fallback) */
} spec_result;

static spec_result run_spec(dfl_context *tc, dfl_context *dc, dfl_feature_path fp, const int32_t *prompt, int64_t n_prompt,
                            int n_steps, oracle *o) {
    dfl_error err = {0};
    spec_params sp = spec_default_params();
    sp.features = fp;
    if (o != NULL) {
        sp.draft_hook = oracle_hook;
        sp.draft_hook_user = o;
    }
    dfl_seq_remove(tc, 0, 0, NULL);
    dfl_seq_remove(dc, 0, 0, NULL);
    spec_session *s = spec_new(tc, dc, &sp, &err);
    if (s == NULL) die("spec", &err);
    int32_t first, toks[64], n_tok;
    const int32_t seq = 0;
    if (spec_prefill(s, 0, prompt, n_prompt, &first, &err) != DFL_OK) die("spec prefill", &err);
    if (o) o->done = 1;
    spec_stats st0 = spec_get_stats(s); /* after the prefill: the steps' own costs below */
    double *steps = malloc((size_t)n_steps * sizeof(double));
    int64_t committed = 0;
    const double t0 = now_ms();
    int done = 0;
    for (int i = 0; i < n_steps; i++) {
        if (dfl_seq_len(tc, 0) + 64 >= dfl_n_ctx(tc)) break;
        const double a = now_ms();
        if (spec_step(s, 1, &seq, toks, &n_tok, &err) != DFL_OK) die("spec step", &err);
        steps[done++] = now_ms() - a;
        committed += n_tok;
        if (o) o->done += n_tok;
    }
    const double total = now_ms() - t0;
    spec_stats st = spec_get_stats(s);
    spec_result r;
    const double n = st.n_steps > 0 ? (double)st.n_steps : 1.0;
    r.step_ms = median(steps, done);
    r.draft_ms = (st.t_draft_ms - st0.t_draft_ms) / n;
    r.verify_ms = (st.t_verify_ms - st0.t_verify_ms) / n;
    r.inject_ms = (st.t_inject_ms - st0.t_inject_ms - 0.0) / n;
    r.other_ms = (st.t_other_ms - st0.t_other_ms) / n;
    r.tok_s = total > 0 ? (double)committed / (total / 1e3) : 0.0;
    r.tau = st.n_steps > 0 ? (double)(st.n_accepted + st.n_steps) / (double)st.n_steps : 0.0;
    r.host_bytes = (double)(st.feature_host_bytes - st0.feature_host_bytes) / n;
    snprintf(r.path, sizeof(r.path), "%s", spec_feature_path_name(s));
    if (fp == DFL_FEATURES_DEVICE && strcmp(r.path, "device") != 0) {
        printf("  note: the device feature path fell back to %s: %s\n", r.path, spec_feature_note(s));
    }
    free(steps);
    spec_free(s);
    return r;
}

/* ---- the feature handoff: host wait vs device wait -------------------------------------------- */

typedef struct handoff {
    double total_ms;   /* from the first enqueue to the drafter side's completion */
    double blocked_ms; /* host time spent inside the wait */
} handoff;

/* Target side: a verification-sized FFN matmul chain, then one feature row written; event.
 * Drafter side: gather the row, fc-sized matmul. */
static handoff run_handoff(dfl_context *tc, bool host_wait, int reps) {
    dfl_error err = {0};
    backend *be = tc->be;
    backend_queue *qa = backend_queue_new(be, &err), *qb = backend_queue_new(be, &err);
    backend_event *written = backend_event_new(be, &err), *read = backend_event_new(be, &err);
    if (!qa || !qb || !written || !read) die("handoff setup", &err);
    const ctx_layer_w *L = &tc->w.layers[0];
    const int64_t n_embd = tc->n_embd, n_ff = L->ffn_up.ne[1], n_q = L->wq.ne[1];
    backend_buffer *buf = backend_buffer_alloc(be, (size_t)(16 * (n_embd + n_ff) + n_embd + n_q + 64) * 4, &err);
    if (buf == NULL) die("handoff buffer", &err);
    tensor x = tensor_in_buffer(buf, 0, QUANT_TYPE_F32, n_embd, 16);                               /* [n_embd, 16] */
    tensor up = tensor_in_buffer(buf, (size_t)(16 * n_embd) * 4, QUANT_TYPE_F32, n_ff, 16);        /* [n_ff, 16] */
    tensor f = tensor_in_buffer(buf, (size_t)(16 * (n_embd + n_ff)) * 4, QUANT_TYPE_F32, n_embd, 1);
    tensor g = tensor_in_buffer(buf, (size_t)(16 * (n_embd + n_ff) + n_embd) * 4, QUANT_TYPE_F32, n_q, 1);
    tensor idx = tensor_in_buffer(buf, (size_t)(16 * (n_embd + n_ff) + n_embd + n_q) * 4, QUANT_TYPE_I32, 1, 1);
    int32_t zero = 0;
    op_write(qa, idx, &zero, sizeof(zero));
    backend_queue_synchronize(qa);
    double *tot = malloc((size_t)reps * sizeof(double)), *blk = malloc((size_t)reps * sizeof(double));
    for (int i = 0; i < reps + 2; i++) {
        const double t0 = now_ms();
        backend_queue_wait_event(qa, read); /* the drafter finished reading the previous rows */
        for (int k = 0; k < 4; k++) {
            op_matmul(qa, up, L->ffn_up, x);
            op_matmul(qa, x, L->ffn_down, up);
        }
        backend_event_record(written, qa);
        const double w0 = now_ms();
        if (host_wait) {
            backend_event_synchronize(written);
        } else {
            backend_queue_wait_event(qb, written);
        }
        const double w1 = now_ms();
        op_get_rows(qb, f, x, idx);
        op_matmul(qb, g, L->wq, f);
        backend_event_record(read, qb);
        backend_queue_synchronize(qb);
        const double t1 = now_ms();
        if (i >= 2) {
            tot[i - 2] = t1 - t0;
            blk[i - 2] = w1 - w0;
        }
    }
    handoff h = {median(tot, reps), median(blk, reps)};
    backend_queue_synchronize(qa);
    free(tot);
    free(blk);
    backend_buffer_free(buf);
    backend_event_free(written);
    backend_event_free(read);
    backend_queue_free(qa);
    backend_queue_free(qb);
    return h;
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *tpath = NULL, *dpath = NULL, *label = "model";
    dfl_device dev = DFL_DEVICE_CUDA;
    int n_gen = 64;
    double bw_gbps = 4800.0;
    int64_t n_ctx = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--target") && v) tpath = argv[++i];
        else if (!strcmp(a, "--drafter") && v) dpath = argv[++i];
        else if (!strcmp(a, "--label") && v) label = argv[++i];
        else if (!strcmp(a, "--device") && v) { dev = strcmp(v, "cpu") == 0 ? DFL_DEVICE_CPU : DFL_DEVICE_CUDA; i++; }
        else if (!strcmp(a, "--gen") && v) n_gen = atoi(argv[++i]);
        else if (!strcmp(a, "--bandwidth") && v) bw_gbps = atof(argv[++i]);
        else if (!strcmp(a, "--ctx") && v) n_ctx = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: bench-cuda --target T.gguf --drafter D.gguf [--device cuda|cpu] [--label L] [--gen N] "
                            "[--bandwidth GBps] [--ctx N]\n");
            return 2;
        }
    }
    if (tpath == NULL || dpath == NULL || n_gen < 4 || n_gen > 1024 || n_ctx < 1024) {
        fprintf(stderr, "bench-cuda: --target and --drafter are required (--gen 4..1024, --ctx >= 1024)\n");
        return 2;
    }
    dfl_error err = {0};
    double t0 = now_ms();
    dfl_model *tm = dfl_model_load(tpath, NULL, &err);
    if (tm == NULL) die("target", &err);
    dfl_model *dm = dfl_model_load(dpath, NULL, &err);
    if (dm == NULL) die("drafter", &err);
    const double t_load = now_ms() - t0;
    const dfl_hparams *th = dfl_model_hparams(tm), *dh = dfl_model_hparams(dm);
    /* bytes read per generated token: every weight except the embedding table (one row is
     * gathered), unless the head is tied to it */
    uint64_t bytes_tok = tm->n_bytes;
    if (!th->tied_output && tm->token_embd != NULL) bytes_tok -= tm->token_embd->nbytes;
    const double roofline = bw_gbps * 1e9 / (double)bytes_tok;

    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_outputs = 64;
    cp.device = dev;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    t0 = now_ms();
    dfl_context *tc = dfl_context_new(tm, &cp, &err);
    if (tc == NULL) die("target context", &err);
    const double t_tctx = now_ms() - t0;
    dfl_context_params dp = dfl_context_default_params();
    dp.target = tc;
    dp.n_batch = 512;
    t0 = now_ms();
    dfl_context *dc = dfl_context_new(dm, &dp, &err);
    if (dc == NULL) die("drafter context", &err);
    const double t_dctx = now_ms() - t0;
    printf("bench %s: target %s (%lld layers, n_embd %lld, vocab %lld, %.2f GB), drafter %lld layers (%.2f GB), "
           "backend %s\n", label, tpath, (long long)th->n_layer, (long long)th->n_embd, (long long)th->n_vocab,
           (double)tm->n_bytes / 1e9, (long long)dh->n_layer, (double)dm->n_bytes / 1e9, backend_get_caps(tc->be).name);
    printf("  load: mmap %.0f ms, target context (weight upload) %.0f ms, drafter context %.0f ms\n", t_load, t_tctx,
           t_dctx);

    const int64_t nv = dfl_n_vocab(tc);
    dfl_batch *b = dfl_batch_init(512, 0, 1, &err);
    if (b == NULL) die("batch", &err);
    int32_t prompt[512];
    for (int i = 0; i < 512; i++) prompt[i] = (int32_t)((i * 7919 + 13) % (nv < 32000 ? nv : 32000));
    /* warm-up (first-use allocations, cuBLAS heuristics) */
    decode(tc, b, prompt, 512, false);
    decode(tc, b, prompt, 16, true);
    decode(tc, b, prompt, 1, true);
    dfl_seq_remove(tc, 0, 0, NULL);

    /* pp: 512 tokens */
    double pp[3];
    for (int r = 0; r < 3; r++) {
        dfl_seq_remove(tc, 0, 0, NULL);
        const double a = now_ms();
        decode(tc, b, prompt, 512, false);
        pp[r] = now_ms() - a;
    }
    const double pp_ms = median(pp, 3);
    /* tg: greedy after a 128-token prompt */
    dfl_seq_remove(tc, 0, 0, NULL);
    decode(tc, b, prompt, 128, false);
    int32_t *ref = calloc((size_t)(n_gen * 16 + 64), sizeof(int32_t));
    double *tg = malloc((size_t)n_gen * sizeof(double));
    int32_t tok = argmax(dfl_get_logits(tc, 127), nv);
    for (int i = 0; i < n_gen; i++) {
        ref[i] = tok;
        const double a = now_ms();
        decode(tc, b, &tok, 1, true);
        tok = argmax(dfl_get_logits(tc, 0), nv);
        tg[i] = now_ms() - a;
    }
    const double tg_ms = median(tg, n_gen);
    /* verify16: 16 tokens, logits on all (what a speculative step runs), rolled back */
    double v_all[20], v_last[20];
    const int64_t p_keep = dfl_seq_len(tc, 0);
    for (int r = 0; r < 20; r++) {
        double a = now_ms();
        decode(tc, b, prompt + 200, 16, true);
        v_all[r] = now_ms() - a;
        dfl_seq_remove(tc, 0, p_keep, NULL);
        a = now_ms();
        decode(tc, b, prompt + 200, 16, false);
        v_last[r] = now_ms() - a;
        dfl_seq_remove(tc, 0, p_keep, NULL);
    }
    const double v16 = median(v_all, 20), v16_last = median(v_last, 20);
    printf("  pp512: %.1f ms (%.0f tok/s)\n", pp_ms, 512.0 / (pp_ms / 1e3));
    printf("  tg: %.3f ms/token = %.1f tok/s; roofline %.1f tok/s (%.2f GB per token at %.0f GB/s): %.0f%%\n", tg_ms,
           1e3 / tg_ms, roofline, (double)bytes_tok / 1e9, bw_gbps, 100.0 * (1e3 / tg_ms) / roofline);
    printf("  verify16: %.3f ms with 16 logit rows read back, %.3f ms with one (%.2fx a decode step)\n", v16, v16_last,
           v16 / tg_ms);

    /* the greedy continuation for the oracle: enough tokens for every step to accept all drafts */
    const int n_steps = n_gen;
    {
        dfl_seq_remove(tc, 0, 0, NULL);
        decode(tc, b, prompt, 128, false);
        int32_t tk = argmax(dfl_get_logits(tc, 127), nv);
        const int64_t n_ref = (int64_t)n_steps * 16 + 32;
        for (int64_t i = 0; i < n_ref && dfl_seq_len(tc, 0) + 2 < n_ctx; i++) {
            ref[i] = tk;
            decode(tc, b, &tk, 1, true);
            tk = argmax(dfl_get_logits(tc, 0), nv);
        }
        dfl_seq_remove(tc, 0, 0, NULL);
    }
    oracle o = {ref, (int64_t)n_steps * 16 + 32, 0};
    spec_result sd = run_spec(tc, dc, DFL_FEATURES_DEVICE, prompt, 128, n_steps, NULL);
    spec_result sh = run_spec(tc, dc, DFL_FEATURES_HOST, prompt, 128, n_steps, NULL);
    spec_result so = run_spec(tc, dc, DFL_FEATURES_DEVICE, prompt, 128, n_steps, &o);
    printf("  spec, real drafter, device features (path in use: %s): step %.3f ms (draft %.3f, verify %.3f, inject "
           "%.3f, other %.3f), %.2fx a decode step, tau %.2f, %.1f tok/s, %.0f feature bytes through host memory per "
           "step\n", sd.path, sd.step_ms, sd.draft_ms, sd.verify_ms, sd.inject_ms, sd.other_ms, sd.step_ms / tg_ms, sd.tau,
           sd.tok_s, sd.host_bytes);
    printf("  spec, real drafter, host features:   step %.3f ms (draft %.3f, verify %.3f, inject %.3f, other %.3f), "
           "tau %.2f, %.1f tok/s, %.0f feature bytes through host memory per step\n", sh.step_ms, sh.draft_ms,
           sh.verify_ms, sh.inject_ms, sh.other_ms, sh.tau, sh.tok_s, sh.host_bytes);
    printf("  spec, oracle drafts (all accepted):  step %.3f ms, tau %.2f (%d expected: decode and verification agree "
           "bit for bit), %.1f tok/s (%.2fx tg)\n", so.step_ms, so.tau, (int)block_commit(dh), so.tok_s,
           so.tok_s / (1e3 / tg_ms));
    handoff hh = run_handoff(tc, true, 20), hd = run_handoff(tc, false, 20);
    printf("  feature handoff (target work -> written -> drafter reads): host wait %.3f ms total (host blocked %.3f ms), "
           "device wait %.3f ms total (host blocked %.3f ms)\n", hh.total_ms, hh.blocked_ms, hd.total_ms, hd.blocked_ms);
    printf("RESULT label=%s weights_gb=%.3f tg_ms=%.3f tg_tok_s=%.1f roofline_tok_s=%.1f roofline_pct=%.0f "
           "verify16_ms=%.3f verify16_1out_ms=%.3f draft_ms=%.3f step_device_ms=%.3f step_host_ms=%.3f step_vs_ar=%.2f "
           "path_device=%s host_bytes_device=%.0f host_bytes_host=%.0f tau=%.2f spec_oracle_tok_s=%.1f "
           "wait_host_ms=%.3f wait_host_blocked_ms=%.3f wait_device_ms=%.3f wait_device_blocked_ms=%.3f "
           "pp512_tok_s=%.0f upload_ms=%.0f\n", label, (double)bytes_tok / 1e9, tg_ms, 1e3 / tg_ms, roofline,
           100.0 * (1e3 / tg_ms) / roofline, v16, v16_last, sd.draft_ms, sd.step_ms, sh.step_ms, sd.step_ms / tg_ms,
           sd.path, sd.host_bytes, sh.host_bytes, sd.tau, so.tok_s, hh.total_ms, hh.blocked_ms, hd.total_ms,
           hd.blocked_ms, 512.0 / (pp_ms / 1e3), t_tctx);
    free(ref);
    free(tg);
    dfl_batch_free(b);
    dfl_context_free(dc);
    dfl_context_free(tc);
    dfl_model_free(dm);
    dfl_model_free(tm);
    return 0;
}
