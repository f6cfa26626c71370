/* cmd_generate.c: `dflash generate`: text generation through the engine: speculative with a
 * DFlash drafter (-md, or the embedded default pair when no -m is given), plain with --no-spec
 * or without a drafter: the same loop either way. Streams the engine's text deltas; --json
 * prints one object at the end. */
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

/* Appends what the engine gives to the collected tokens and text (and streams the text; a failed
 * write sets *write_errno). */
static bool collect(const dfl_seq_output *so, bool stream, int32_t **tok, int64_t *n_tok, char **text, size_t *n_text,
                    int *write_errno) {
    int32_t *t = realloc(*tok, (size_t)(*n_tok + so->n_tokens + 1) * sizeof(int32_t));
    char *x = realloc(*text, *n_text + so->text_len + 1);
    if (t != NULL) *tok = t;
    if (x != NULL) *text = x;
    if (t == NULL || x == NULL) return false;
    memcpy(t + *n_tok, so->tokens, (size_t)so->n_tokens * sizeof(int32_t));
    *n_tok += so->n_tokens;
    memcpy(x + *n_text, so->text, so->text_len + 1);
    *n_text += so->text_len;
    if (stream && so->text_len > 0 && (fwrite(so->text, 1, so->text_len, stdout) != so->text_len || fflush(stdout) != 0)) {
        *write_errno = errno != 0 ? errno : EIO;
        return false;
    }
    return true;
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
    if (cli_opts_finish(&o, "generate") != 0) return 2;
    if ((o.prompt == NULL) == (o.prompt_file == NULL)) {
        fprintf(stderr, "dflash generate: a prompt is required: -p TEXT or -f FILE (one of them)\n");
        return usage(stderr);
    }
    char *file_text = NULL;
    size_t file_len = 0;
    if (o.prompt_file != NULL && (file_text = cli_read_file(o.prompt_file, &file_len, "generate")) == NULL) return 1;
    o.n_seq = 1;
    cli_session s;
    int32_t *prompt = NULL, *tokens = NULL;
    int32_t *steps = NULL; /* [n_steps][2]: drafts verified, drafts accepted (--json) */
    int64_t n_step_log = 0;
    char *text = NULL;
    int64_t n_tok = 0;
    size_t n_text = 0;
    int write_errno = 0;
    int rc = cli_session_open(&s, &o, o.json, "generate");
    if (rc != 0) {
        free(file_text);
        goto done;
    }
    rc = 1;
    const int64_t n_prompt = file_text ? cli_tokenize_prompt_n(&s, &o, file_text, file_len, &prompt, "generate")
                                       : cli_tokenize_prompt(&s, &o, o.prompt, &prompt, "generate");
    free(file_text);
    if (n_prompt < 0) goto done;
    dfl_engine *e = s.engine;
    if (cli_check_fit(&s, n_prompt, o.n_predict, "generate") != 0) goto done;
    dfl_error err = {0};
    const dfl_seq_params sp = cli_seq_params(&o);
    double t_gen = 0;
    rc = 0;
    if (o.n_predict > 0) {
        if (dfl_engine_seq_start(e, 0, prompt, n_prompt, &sp, &err) != DFL_OK) {
            fprintf(stderr, "dflash generate: %s\n", err.msg);
            rc = 1;
            goto done;
        }
        steps = malloc((size_t)(o.n_predict + 1) * 2 * sizeof(int32_t)); /* a step yields >= 1 token */
        if (steps == NULL) {
            fprintf(stderr, "dflash generate: out of memory\n");
            rc = 1;
            goto done;
        }
        dfl_seq_stats prev;
        dfl_engine_seq_stats(e, 0, &prev, &err);
        const double t1 = cli_now_ms();
        for (;;) {
            dfl_seq_output so;
            dfl_engine_seq_read(e, 0, &so, &err);
            if (!collect(&so, !o.json, &tokens, &n_tok, &text, &n_text, &write_errno)) {
                if (write_errno != 0) fprintf(stderr, "dflash generate: cannot write output: %s\n", strerror(write_errno));
                else fprintf(stderr, "\ndflash generate: out of memory\n");
                rc = 1;
                goto done;
            }
            if (so.state != DFL_SEQ_ACTIVE) break;
            if (dfl_engine_step(e, NULL, 0, &err) != DFL_OK) {
                fprintf(stderr, "\ndflash generate: %s\n", err.msg);
                rc = 1;
                break;
            }
            dfl_seq_stats now;
            dfl_engine_seq_stats(e, 0, &now, &err);
            if (now.n_steps > prev.n_steps && n_step_log <= o.n_predict) {
                steps[2 * n_step_log] = (int32_t)(now.n_draft_tokens - prev.n_draft_tokens);
                steps[2 * n_step_log + 1] = (int32_t)(now.n_accepted - prev.n_accepted);
                n_step_log++;
            }
            prev = now;
        }
        t_gen = cli_now_ms() - t1;
    }
    dfl_seq_stats st;
    dfl_engine_seq_stats(e, 0, &st, &err);
    const dfl_engine_stats es = dfl_engine_get_stats(e);
    const double tps = t_gen > 0 ? (double)n_tok / (t_gen / 1e3) : 0.0;
    const bool spec = dfl_engine_n_draft(e) > 0;
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
        for (int64_t i = 0; i < n_tok; i++) jsonw_int(&w, tokens[i]);
        jsonw_arr_end(&w);
        jsonw_key(&w, "text"); jsonw_strn(&w, text ? text : "", n_text);
        jsonw_key(&w, "n_prompt"); jsonw_int(&w, n_prompt);
        jsonw_key(&w, "n_gen"); jsonw_int(&w, n_tok);
        jsonw_key(&w, "t_prompt_ms"); jsonw_double(&w, st.t_prefill_ms);
        jsonw_key(&w, "t_gen_ms"); jsonw_double(&w, t_gen);
        jsonw_key(&w, "tok_per_s"); jsonw_double(&w, tps);
        jsonw_key(&w, "speculative"); jsonw_bool(&w, spec);
        if (spec) {
            jsonw_key(&w, "n_draft"); jsonw_int(&w, dfl_engine_n_draft(e));
            jsonw_key(&w, "n_steps"); jsonw_int(&w, st.n_steps);
            jsonw_key(&w, "n_drafted"); jsonw_int(&w, st.n_draft_tokens);
            jsonw_key(&w, "n_accepted"); jsonw_int(&w, st.n_accepted);
            jsonw_key(&w, "tau"); jsonw_double(&w, tau);
            jsonw_key(&w, "steps"); /* per step: [drafts verified, drafts accepted] */
            jsonw_arr_begin(&w);
            for (int64_t i = 0; i < n_step_log; i++) {
                jsonw_arr_begin(&w);
                jsonw_int(&w, steps[2 * i]);
                jsonw_int(&w, steps[2 * i + 1]);
                jsonw_arr_end(&w);
            }
            jsonw_arr_end(&w);
            jsonw_key(&w, "n_draft_nonfinite"); jsonw_int(&w, es.n_draft_nonfinite);
            jsonw_key(&w, "accept_hist");
            jsonw_arr_begin(&w);
            for (int32_t k = 0; k <= dfl_engine_n_draft(e); k++) jsonw_int(&w, es.accept_hist[k]);
            jsonw_arr_end(&w);
            jsonw_key(&w, "t_draft_ms"); jsonw_double(&w, es.t_draft_ms);
            jsonw_key(&w, "t_verify_ms"); jsonw_double(&w, es.t_verify_ms);
            jsonw_key(&w, "t_inject_ms"); jsonw_double(&w, es.t_inject_ms);
            jsonw_key(&w, "feature_path"); jsonw_str(&w, dfl_engine_feature_path(e));
            jsonw_key(&w, "feature_host_bytes"); jsonw_uint(&w, es.feature_host_bytes);
        }
        jsonw_obj_end(&w);
        fputc('\n', stdout);
    } else {
        fputc('\n', stdout);
        fprintf(stderr, "dflash: prompt %lld tokens in %.1f ms, generated %lld tokens in %.1f ms (%.2f tok/s)\n",
                (long long)n_prompt, st.t_prefill_ms, (long long)n_tok, t_gen, tps);
        if (spec) {
            fprintf(stderr, "dflash: speculative: tau %.2f (%lld steps, %lld of %lld drafts accepted), features via %s\n",
                    tau, (long long)st.n_steps, (long long)st.n_accepted, (long long)st.n_draft_tokens,
                    dfl_engine_feature_path(e));
        }
    }
    if (es.n_draft_nonfinite > 0) {
        fprintf(stderr, "dflash generate: warning: the drafter's logits were not finite at %lld draft slots (those "
                "drafts were not verified: the output is the target's own, but the drafter file looks broken)\n",
                (long long)es.n_draft_nonfinite);
    }
done:
    free(steps);
    free(tokens);
    free(text);
    free(prompt);
    cli_session_close(&s);
    return rc;
}
