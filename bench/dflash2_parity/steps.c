/* steps.c: prints the number of drafts verified at each speculative step of one greedy run
 * (public API only), for comparing draft counts with llama-speculative-simple (parity.sh).
 * Built by parity.sh against build/libdflash.a; not part of the library or of `make check`.
 *
 * usage: steps TARGET DRAFTER P_MIN N_GEN N_DRAFT ID,ID,... [kv-f32]   (fixed draft length: n_draft_min 0)
 * Output: "steps:" then drafted:accepted per step. kv-f32: f32 KV caches instead of f16 (the same
 * algorithm with other rounding: a step that changes with it is a numerical near-tie). */
#include "dflash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 7 && !(argc == 8 && strcmp(argv[7], "kv-f32") == 0)) {
        fprintf(stderr, "usage: steps TARGET DRAFTER P_MIN N_GEN N_DRAFT ID,ID,... [kv-f32]\n");
        return 2;
    }
    dfl_error err = {0};
    dfl_model *tm = dfl_model_load(argv[1], NULL, &err);
    dfl_model *dm = tm ? dfl_model_load(argv[2], NULL, &err) : NULL;
    if (dm == NULL) {
        fprintf(stderr, "steps: %s\n", err.msg);
        return 1;
    }
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_seq = 1;
    ep.n_ctx = 512;
    ep.n_threads = ep.n_threads_batch = 1;
    ep.n_draft = atoi(argv[5]);
    ep.n_draft_min = 0;
    ep.kv_f32 = argc == 8;
    ep.draft_p_min = (float)atof(argv[3]);
    dfl_engine *e = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    if (e == NULL) {
        fprintf(stderr, "steps: %s\n", err.msg);
        return 1;
    }
    int32_t prompt[512];
    int n = 0;
    for (char *p = strtok(argv[6], ","); p != NULL && n < 512; p = strtok(NULL, ",")) prompt[n++] = atoi(p);
    dfl_seq_params sp = dfl_seq_default_params();
    sp.max_tokens = atoi(argv[4]);
    sp.ignore_eos = true;
    if (dfl_engine_seq_start(e, 0, prompt, n, &sp, &err) != DFL_OK) {
        fprintf(stderr, "steps: %s\n", err.msg);
        return 1;
    }
    dfl_seq_output o;
    dfl_engine_seq_read(e, 0, &o, &err);
    int64_t prev = 0;
    printf("steps:");
    while (dfl_engine_n_active(e) > 0) {
        if (dfl_engine_step(e, NULL, 0, &err) != DFL_OK) {
            fprintf(stderr, "steps: %s\n", err.msg);
            return 1;
        }
        dfl_seq_stats st;
        dfl_engine_seq_stats(e, 0, &st, &err);
        dfl_engine_seq_read(e, 0, &o, &err);
        printf(" %lld:%lld", (long long)(st.n_draft_tokens - prev), (long long)o.n_tokens - 1);
        prev = st.n_draft_tokens;
    }
    printf("\n");
    dfl_engine_free(e);
    dfl_model_free(dm);
    dfl_model_free(tm);
    return 0;
}
