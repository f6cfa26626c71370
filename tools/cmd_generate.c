/* cmd_generate.c: `dflash generate`: text generation with a target model, speculative with a
 * DFlash drafter (-md, or the embedded default pair when no -m is given). Streams text as it is
 * produced; --json prints one object at the end. */
#include "cli_common.h"
#include "cmds.h"
#include "base/jsonw.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *out) {
    fprintf(out, "usage: dflash generate [-m TARGET.gguf] [-md DRAFT.gguf] (-p TEXT | -f FILE) [-n N] [options]\n");
    cli_print_common_help(out);
    return out == stdout ? 0 : 2;
}

typedef struct gen_out {
    int32_t *tokens;
    int64_t n, cap;
    char *text;
    size_t text_len, text_cap;
    int write_errno; /* a streamed write to stdout failed (generation stops) */
} gen_out;

static bool out_push_text(gen_out *g, const char *t, size_t len) {
    if (g->text_len + len + 1 > g->text_cap) {
        size_t cap = (g->text_len + len + 1) * 2;
        char *p = realloc(g->text, cap);
        if (p == NULL) return false;
        g->text = p;
        g->text_cap = cap;
    }
    memcpy(g->text + g->text_len, t, len);
    g->text_len += len;
    g->text[g->text_len] = '\0';
    return true;
}

/* Appends one generated token; streams its text. Returns false at the end of generation. */
static bool emit(gen_out *g, const cli_session *s, const cli_opts *o, dfl_detok *dt, int32_t tok) {
    if (dfl_vocab_is_eog(s->vocab, tok)) return false;
    g->tokens[g->n++] = tok;
    const char *t;
    size_t len;
    if (dfl_detok_push(dt, tok, &t, &len) == DFL_OK && len > 0) {
        out_push_text(g, t, len);
        if (!o->json && (fwrite(t, 1, len, stdout) != len || fflush(stdout) != 0)) {
            g->write_errno = errno != 0 ? errno : EIO;
            return false;
        }
    }
    return g->n < o->n_predict;
}

int cmd_generate(int argc, char **argv) {
    cli_opts o;
    cli_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout);
        int r = cli_parse_common(&o, argc, argv, &i, "generate");
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "dflash generate: unknown option %s\n", argv[i]);
            return usage(stderr);
        }
    }
    if ((o.prompt == NULL) == (o.prompt_file == NULL)) {
        fprintf(stderr, "dflash generate: a prompt is required: -p TEXT or -f FILE (one of them)\n");
        return usage(stderr);
    }
    char *file_text = NULL;
    size_t file_len = 0;
    if (o.prompt_file != NULL && (file_text = cli_read_file(o.prompt_file, &file_len, "generate")) == NULL) return 1;
    o.n_seq = 1;
    cli_session s;
    const int open_rc = cli_session_open(&s, &o, o.json, "generate");
    if (open_rc != 0) {
        cli_session_close(&s);
        free(file_text);
        return open_rc;
    }
    int32_t *prompt = NULL;
    int64_t n_prompt = file_text ? cli_tokenize_prompt_n(&s, &o, file_text, file_len, &prompt, "generate")
                                 : cli_tokenize_prompt(&s, &o, o.prompt, &prompt, "generate");
    free(file_text);
    if (n_prompt < 0) {
        cli_session_close(&s);
        return 1;
    }
    dfl_error err = {0};
    gen_out g;
    memset(&g, 0, sizeof(g));
    g.cap = o.n_predict + 64;
    g.tokens = malloc((size_t)g.cap * sizeof(int32_t));
    dfl_detok *dt = dfl_detok_new(s.vocab, false, &err);
    int rc = 0;
    double t_prompt = 0, t_gen = 0;
    int32_t *step_tokens = NULL, n_step = 0;
    if (g.tokens == NULL || dt == NULL) {
        fprintf(stderr, "dflash generate: out of memory\n");
        rc = 1;
        goto done;
    }
    if (cli_check_fit(&s, n_prompt, o.n_predict, "generate") != 0) {
        rc = 1;
        goto done;
    }
    double t0 = cli_now_ms();
    if (o.n_predict == 0) goto finish;
    if (s.spec != NULL) {
        int32_t first;
        if (dfl_spec_prefill(s.spec, 0, prompt, n_prompt, &first, &err) != DFL_OK) {
            fprintf(stderr, "dflash generate: %s\n", err.msg);
            rc = 1;
            goto done;
        }
        t_prompt = cli_now_ms() - t0;
        double t1 = cli_now_ms();
        const int32_t k = dfl_spec_n_draft(s.spec);
        step_tokens = malloc((size_t)(k + 1) * sizeof(int32_t));
        bool more = step_tokens != NULL && emit(&g, &s, &o, dt, first);
        const int32_t seq = 0;
        while (more) {
            if (dfl_spec_step(s.spec, 1, &seq, step_tokens, &n_step, &err) != DFL_OK) {
                fprintf(stderr, "\ndflash generate: %s\n", err.msg);
                rc = 1;
                break;
            }
            for (int32_t j = 0; j < n_step && more; j++) more = emit(&g, &s, &o, dt, step_tokens[j]);
        }
        t_gen = cli_now_ms() - t1;
    } else {
        dfl_sampler_params sp = dfl_sampler_default_params();
        sp.temp = o.temp;
        sp.top_k = o.top_k;
        sp.top_p = o.top_p;
        sp.min_p = o.min_p;
        sp.repeat_penalty = o.repeat_penalty;
        sp.seed = o.seed;
        dfl_sampler *smp = dfl_sampler_new(&sp, dfl_n_vocab(s.tctx), &err);
        dfl_batch *b = dfl_batch_init(o.n_batch, 0, 1, &err);
        if (smp == NULL || b == NULL) {
            fprintf(stderr, "dflash generate: %s\n", err.msg);
            dfl_sampler_free(smp);
            dfl_batch_free(b);
            rc = 1;
            goto done;
        }
        for (int64_t i = 0; i < n_prompt; i++) dfl_sampler_accept(smp, prompt[i]);
        int64_t pos = 0;
        bool ok = true;
        for (int64_t off = 0; off < n_prompt && ok; off += o.n_batch) {
            const int64_t m = n_prompt - off < o.n_batch ? n_prompt - off : o.n_batch;
            dfl_batch_clear(b);
            for (int64_t j = 0; j < m; j++) {
                const int32_t p = (int32_t)(pos++);
                dfl_batch_add_token(b, prompt[off + j], &p, 0, off + j == n_prompt - 1);
            }
            ok = dfl_decode(s.tctx, b, &err) == DFL_OK;
        }
        int32_t tok = ok ? dfl_sampler_sample(smp, dfl_get_logits(s.tctx, b->n_tokens - 1)) : -1;
        t_prompt = cli_now_ms() - t0;
        double t1 = cli_now_ms();
        bool more = ok && tok >= 0;
        while (more) {
            dfl_sampler_accept(smp, tok);
            more = emit(&g, &s, &o, dt, tok);
            if (!more) break;
            dfl_batch_clear(b);
            const int32_t p = (int32_t)(pos++);
            dfl_batch_add_token(b, tok, &p, 0, true);
            if (dfl_decode(s.tctx, b, &err) != DFL_OK) {
                ok = false;
                break;
            }
            tok = dfl_sampler_sample(smp, dfl_get_logits(s.tctx, 0));
            more = tok >= 0;
        }
        if (ok && tok < 0 && g.write_errno == 0) {
            fprintf(stderr, "\ndflash generate: sampling failed at position %lld: %s\n", (long long)pos,
                    dfl_status_str((dfl_status)-tok));
            rc = 1;
        }
        t_gen = cli_now_ms() - t1;
        if (!ok) {
            fprintf(stderr, "\ndflash generate: %s\n", err.msg);
            rc = 1;
        }
        dfl_sampler_free(smp);
        dfl_batch_free(b);
    }
finish:
    if (g.write_errno != 0) {
        fprintf(stderr, "dflash generate: cannot write output: %s\n", strerror(g.write_errno));
        rc = 1;
        goto done;
    }
    const char *tail;
    size_t tail_len;
    dfl_detok_flush(dt, &tail, &tail_len);
    if (tail_len > 0) {
        out_push_text(&g, tail, tail_len);
        if (!o.json) fwrite(tail, 1, tail_len, stdout);
    }
    const double tps = t_gen > 0 ? (double)g.n / (t_gen / 1e3) : 0.0;
    dfl_spec_stats st;
    memset(&st, 0, sizeof(st));
    if (s.spec) st = dfl_spec_get_stats(s.spec);
    const double tau = st.n_steps > 0 ? (double)(st.n_accepted + st.n_steps) / (double)st.n_steps : 0.0;
    if (o.json) {
        jsonw w;
        jsonw_init(&w, stdout);
        jsonw_obj_begin(&w);
        jsonw_key(&w, "prompt_tokens");
        jsonw_arr_begin(&w);
        for (int64_t i = 0; i < n_prompt; i++) jsonw_int(&w, prompt[i]);
        jsonw_arr_end(&w);
        jsonw_key(&w, "tokens");
        jsonw_arr_begin(&w);
        for (int64_t i = 0; i < g.n; i++) jsonw_int(&w, g.tokens[i]);
        jsonw_arr_end(&w);
        jsonw_key(&w, "text"); jsonw_strn(&w, g.text ? g.text : "", g.text_len);
        jsonw_key(&w, "n_prompt"); jsonw_int(&w, n_prompt);
        jsonw_key(&w, "n_gen"); jsonw_int(&w, g.n);
        jsonw_key(&w, "t_prompt_ms"); jsonw_double(&w, t_prompt);
        jsonw_key(&w, "t_gen_ms"); jsonw_double(&w, t_gen);
        jsonw_key(&w, "tok_per_s"); jsonw_double(&w, tps);
        jsonw_key(&w, "speculative"); jsonw_bool(&w, s.spec != NULL);
        if (s.spec) {
            jsonw_key(&w, "n_draft"); jsonw_int(&w, dfl_spec_n_draft(s.spec));
            jsonw_key(&w, "n_steps"); jsonw_int(&w, st.n_steps);
            jsonw_key(&w, "n_drafted"); jsonw_int(&w, st.n_drafted);
            jsonw_key(&w, "n_accepted"); jsonw_int(&w, st.n_accepted);
            jsonw_key(&w, "tau"); jsonw_double(&w, tau);
            jsonw_key(&w, "accept_hist");
            jsonw_arr_begin(&w);
            for (int32_t k = 0; k <= dfl_spec_n_draft(s.spec); k++) jsonw_int(&w, st.accept_hist[k]);
            jsonw_arr_end(&w);
            jsonw_key(&w, "t_draft_ms"); jsonw_double(&w, st.t_draft_ms);
            jsonw_key(&w, "t_verify_ms"); jsonw_double(&w, st.t_verify_ms);
            jsonw_key(&w, "t_inject_ms"); jsonw_double(&w, st.t_inject_ms);
            jsonw_key(&w, "feature_path"); jsonw_str(&w, dfl_spec_feature_path_name(s.spec));
            jsonw_key(&w, "feature_host_bytes"); jsonw_uint(&w, st.feature_host_bytes);
        }
        jsonw_obj_end(&w);
        fputc('\n', stdout);
    } else {
        fputc('\n', stdout);
        fprintf(stderr, "dflash: prompt %lld tokens in %.1f ms, generated %lld tokens in %.1f ms (%.2f tok/s)\n",
                (long long)n_prompt, t_prompt, (long long)g.n, t_gen, tps);
        if (s.spec) {
            fprintf(stderr, "dflash: speculative: tau %.2f (%lld steps, %lld of %lld drafts accepted), features via %s\n",
                    tau, (long long)st.n_steps, (long long)st.n_accepted, (long long)st.n_drafted,
                    dfl_spec_feature_path_name(s.spec));
        }
    }
done:
    free(step_tokens);
    dfl_detok_free(dt);
    free(g.tokens);
    free(g.text);
    free(prompt);
    cli_session_close(&s);
    return rc;
}
