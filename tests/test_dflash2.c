/* test_dflash2.c: the DFlash2 drafter (docs/drafter.md "DFlash2"): random-weight DFlash2 files in
 * llama.cpp's converter layout (`dflash make-test-model --dflash2`) against the independent numpy
 * float64 reference (tests/ref/dflash2_np.py: block logits, lattice scores, walked tokens) on
 * awkward sizes, batch invariance of the convolutions (several sequences, each its own block
 * length), the lossless property through the engine (greedy output == the target alone, with
 * the real DFlash2 walk and with oracle drafts, adaptive length and the walk's p_min cut), and bad
 * files refused with messages that name the key or tensor. */
#include "test.h"
#include "test_util.h"
#include "gguf/gguf.h"
#include "model/context.h"
#include "model/model.h"
#include "quant/quant.h"
#include "speculative/drafter_dflash2.h"
#include "speculative/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NV 640
#define TINY_T "--n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640"

typedef tu_pair d2pair;

static void d2_close(d2pair *p) { tu_pair_close(p); }

static bool d2_open_p(test_ctx *t, d2pair *p, const char *tpath, const char *dpath, int n_seq, int n_draft,
                      float p_min) {
    spec_params sp = spec_default_params();
    sp.n_draft = n_draft;
    sp.draft_p_min = p_min;
    const tu_pair_params pp = {.n_seq = n_seq, .n_batch = 64, .drafter_n_batch = 32, .kv_f32 = true, .sp = &sp};
    return tu_pair_open(t, p, tpath, dpath, &pp);
}

static bool d2_open(test_ctx *t, d2pair *p, const char *tpath, const char *dpath, int n_seq, int n_draft) {
    return d2_open_p(t, p, tpath, dpath, n_seq, n_draft, 0.0f);
}

/* The numbers of the JSON array after "key": into out (at most cap); returns the count or -1. */
static int json_nums(const char *json, const char *key, double *out, int cap) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\": [", key);
    const char *p = strstr(json, pat);
    if (p == NULL) return -1;
    p += strlen(pat);
    int n = 0;
    while (*p && *p != ']') {
        char *end;
        double v = strtod(p, &end);
        if (end == p) {
            if (strncmp(p, "Infinity", 8) == 0) { v = INFINITY; end = (char *)p + 8; }
            else return -1;
        }
        if (n < cap) out[n++] = v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

/* One configuration against the numpy reference: block logits, lattice, walk. */
static void vs_numpy_case(test_ctx *t, const char *dir, const char *args, int n_draft, int *n_cmp_tok, int *n_cmp_lat) {
    char tpath[512], dpath[512], cmd[2048], out[8192], pref[512], lpath[600], apath[600];
    if (!tu_make_models(t, dir, args, tpath, dpath, sizeof(tpath))) return;
    int32_t prompt[13];
    for (int i = 0; i < 13; i++) prompt[i] = (i * 71 + 2) % NV;
    char csv[256];
    tu_ids_csv(prompt, 13, csv, sizeof(csv));
    test_path(t, dir, pref, sizeof(pref));
    strcat(pref, "/ref");
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 tests/ref/dflash2_np.py draft --target %s --drafter %s --tokens %s "
             "--n-draft %d --out %s", tpath, dpath, csv, n_draft, pref);
    int rc = test_run(cmd, out, sizeof(out));
    if (rc != 0) {
        test_fail(t, __FILE__, __LINE__, "dflash2_np.py failed: %s", out);
        return;
    }
    double ref_tok[64], margins[64], kgap[64], kd;
    const int n_rt = json_nums(out, "draft_tokens", ref_tok, 64);
    REQUIRE(n_rt == n_draft && json_nums(out, "margins", margins, 64) == n_draft &&
            json_nums(out, "kgap", kgap, 64) == n_draft);
    const char *kp = strstr(out, "\"k\": ");
    REQUIRE(kp != NULL);
    kd = strtod(kp + 5, NULL);
    const int64_t k = (int64_t)kd, row = k + k * k;
    snprintf(lpath, sizeof(lpath), "%s.logits", pref);
    snprintf(apath, sizeof(apath), "%s.lattice", pref);
    int64_t n_l = 0, n_a = 0;
    float *ref_l = tu_read_floats(lpath, &n_l), *ref_a = tu_read_floats(apath, &n_a);
    REQUIRE(ref_l != NULL && ref_a != NULL && n_l == n_draft * NV && n_a == n_draft * row);
    d2pair p;
    if (d2_open(t, &p, tpath, dpath, 1, n_draft)) {
        int32_t first, draft[64];
        dfl_error err = {0};
        float *logits = malloc((size_t)n_draft * NV * sizeof(float));
        CHECK(spec_prefill(p.spec, 0, prompt, 13, &first, &err) == DFL_OK);
        CHECK(drafter_draft(p.dctx, 1, (int32_t[]){0}, &first, n_draft, NULL, draft, logits, &err) == DFL_OK);
        const double el = tu_rel_err(logits, ref_l, (int64_t)n_draft * NV);
        int64_t rl = 0;
        const float *lat = dflash2_last_lattice(p.dctx, &rl);
        REQUIRE(lat != NULL && rl == row);
        /* lattice rows whose candidate sets are robust (the k-th / (k+1)-th logit gap, and the
         * previous row's, above 1e-3) compare exactly in ids and closely in scores */
        double el_max = 0.0;
        int n_rows = 0;
        for (int j = 0; j < n_draft; j++) {
            if (kgap[j] < 1e-3 || (j > 0 && kgap[j - 1] < 1e-3)) continue;
            bool ids_ok = true;
            for (int64_t s = 0; s < k; s++) ids_ok = ids_ok && lat[j * row + s] == ref_a[j * row + s];
            CHECK_MSG(ids_ok, "%s: row %d: candidate ids differ from numpy", dir, j);
            const double e = tu_rel_err(lat + j * row + k, ref_a + j * row + k, k * k);
            el_max = e > el_max ? e : el_max;
            n_rows++;
        }
        /* walked tokens: equal up to the first near-tie of the walk (or of the candidate set) */
        int n_tok = 0;
        for (int j = 0; j < n_draft; j++) {
            if (margins[j] < 1e-3 || kgap[j] < 1e-3) break;
            CHECK_MSG(draft[j] == (int32_t)ref_tok[j], "%s: draft %d: %d != numpy %d", dir, j, draft[j], (int)ref_tok[j]);
            n_tok++;
        }
        printf("    %s: block logits max rel err %.3g, lattice scores %.3g (%d rows), %d/%d walked tokens compared\n", dir,
               el, el_max, n_rows, n_tok, n_draft);
        CHECK_MSG(el < 1e-4, "%s: block logits relative error %.3g", dir, el);
        CHECK_MSG(el_max < 1e-4, "%s: lattice relative error %.3g", dir, el_max);
        *n_cmp_tok += n_tok;
        *n_cmp_lat += n_rows;
        free(logits);
    }
    d2_close(&p);
    free(ref_l);
    free(ref_a);
}

TEST(dflash2_drafter_vs_numpy) {
    if (!tu_have_numpy(t)) return;
    int n_tok = 0, n_lat = 0;
    /* K 3, 8 groups of 8, rank 16, top-4, 1 layer, the full block */
    vs_numpy_case(t, "a", TINY_T " --type f32 --block-size 8 --draft-layers 1 --seed 3 --dflash2 3,8,16,4", 7, &n_tok, &n_lat);
    /* one group over all channels, top-1 (the walk is the argmax), K 4, 2 layers */
    vs_numpy_case(t, "b", TINY_T " --type f32 --block-size 6 --draft-layers 2 --seed 4 --dflash2 4,64,8,1", 5, &n_tok, &n_lat);
    /* a kernel longer than the block, group size 1, odd rank, top-7 (7*8 <= 64), a short draft */
    vs_numpy_case(t, "c", TINY_T " --type f32 --block-size 5 --draft-layers 1 --seed 5 --dflash2 9,1,5,7", 3, &n_tok, &n_lat);
    /* the same at the full block of a bigger kernel */
    vs_numpy_case(t, "d", TINY_T " --type f32 --block-size 5 --draft-layers 1 --seed 6 --dflash2 9,1,5,7", 4, &n_tok, &n_lat);
    /* a single tap (no shift: the convolution is a per-token gate), group size 32, 3 layers */
    vs_numpy_case(t, "e", TINY_T " --type f32 --block-size 8 --draft-layers 3 --seed 9 --dflash2 1,32,8,3", 7, &n_tok, &n_lat);
    /* the drafter options on the selector's input: logit scale and a tight final softcap (llama.cpp
     * applies both before the selector, so they move the lattice scores, not only probabilities) */
    vs_numpy_case(t, "f", TINY_T " --type f32 --block-size 8 --draft-layers 1 --seed 11 --dflash2 3,8,16,4 --logit-scale 3 "
                  "--softcap 0.05", 7, &n_tok, &n_lat);
    printf("    %d walked tokens and %d lattice rows compared with numpy\n", n_tok, n_lat);
    CHECK(n_tok >= 10);
    CHECK(n_lat >= 10);
}

/* Drafting two sequences in one pass, each its own block length, gives each exactly its solo
 * drafts (the convolutions never cross a block). */
TEST(dflash2_batch_invariance) {
    char tpath[512], dpath[512];
    if (!tu_make_models(t, "m", TINY_T " --type f32 --block-size 8 --seed 7 --dflash2 3,4,16,4", tpath, dpath, sizeof(tpath))) return;
    int32_t pa[9], pb[14];
    for (int i = 0; i < 9; i++) pa[i] = (i * 37 + 5) % NV;
    for (int i = 0; i < 14; i++) pb[i] = (i * 53 + 11) % NV;
    int32_t solo[2][7];
    float solo_lat[2][7 * 20];
    const int32_t lens[2] = {7, 3};
    for (int s = 0; s < 2; s++) {
        d2pair p;
        if (!d2_open(t, &p, tpath, dpath, 1, 7)) { d2_close(&p); return; }
        dfl_error err = {0};
        int32_t first;
        CHECK(spec_prefill(p.spec, 0, s ? pb : pa, s ? 14 : 9, &first, &err) == DFL_OK);
        CHECK(drafter_draft(p.dctx, 1, (int32_t[]){0}, &first, lens[s], NULL, solo[s], NULL, &err) == DFL_OK);
        int64_t rl = 0;
        const float *lat = dflash2_last_lattice(p.dctx, &rl);
        REQUIRE(lat != NULL && rl == 20);
        memcpy(solo_lat[s], lat, (size_t)(lens[s] * rl) * sizeof(float));
        d2_close(&p);
    }
    d2pair p;
    if (!d2_open(t, &p, tpath, dpath, 2, 7)) { d2_close(&p); return; }
    dfl_error err = {0};
    int32_t first[2], both[2 * 7];
    CHECK(spec_prefill(p.spec, 0, pa, 9, &first[0], &err) == DFL_OK);
    CHECK(spec_prefill(p.spec, 1, pb, 14, &first[1], &err) == DFL_OK);
    CHECK(drafter_draft(p.dctx, 2, (int32_t[]){0, 1}, first, 7, lens, both, NULL, &err) == DFL_OK);
    int64_t rl = 0;
    const float *lat = dflash2_last_lattice(p.dctx, &rl);
    REQUIRE(lat != NULL);
    for (int s = 0; s < 2; s++) {
        for (int j = 0; j < lens[s]; j++) CHECK_EQ_INT(both[s * 7 + j], solo[s][j]);
    }
    const double e0 = tu_rel_err(lat, solo_lat[0], 7 * rl), e1 = tu_rel_err(lat + 7 * rl, solo_lat[1], 3 * rl);
    printf("    lattice of the batched pass vs solo: rel err %.3g / %.3g\n", e0, e1);
    CHECK(e0 < 1e-5 && e1 < 1e-5);
    d2_close(&p);
}

/* Target-alone greedy tokens of a prompt. */
static bool greedy_ref(test_ctx *t, dfl_model *tm, const int32_t *prompt, int len, int n, int32_t *out) {
    dfl_error err = {0};
    dfl_context_params rp = dfl_context_default_params();
    rp.n_ctx = 256;
    rp.n_threads = rp.n_threads_batch = 1;
    dfl_context *r = dfl_context_new(tm, &rp, &err);
    bool ok = r != NULL && tu_greedy(r, 0, prompt, len, n, out, &err) == DFL_OK;
    if (!ok) test_fail(t, __FILE__, __LINE__, "reference: %s", err.msg);
    dfl_context_free(r);
    return ok;
}

#define N_GEN 24

/* The engine with a DFlash2 drafter: every sequence's greedy output equals the target alone. */
static bool lossless_case(test_ctx *t, dfl_model *tm, dfl_model *dm, int n_seq, int n_draft, int n_draft_min, float p_min,
                          int mode, int prompt_len, int64_t *drafted, int64_t *accepted) {
    static int32_t prompts[8][80], ref[8][N_GEN + 64], got[8][N_GEN + 64];
    int64_t n_got[8] = {0};
    tu_oracle o;
    memset(&o, 0, sizeof(o));
    o.n_ref = N_GEN + 64;
    o.n_vocab = NV;
    o.mode = mode;
    o.rng = (uint64_t)(n_seq * 100 + n_draft + prompt_len);
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < prompt_len + s; i++) prompts[s][i] = (int32_t)((i * 131 + s * 17 + prompt_len * 7 + 3) % NV);
        if (!greedy_ref(t, tm, prompts[s], prompt_len + s, N_GEN + 64, ref[s])) return false;
        o.ref[s] = ref[s];
    }
    dfl_error err = {0};
    dfl_engine_params ep = dfl_engine_default_params();
    ep.n_seq = n_seq;
    ep.n_ctx = 256;
    ep.n_batch = 16;
    ep.n_threads = ep.n_threads_batch = 1;
    ep.n_draft = n_draft;
    ep.n_draft_min = n_draft_min;
    ep.draft_p_min = p_min;
    ep.draft_hook = mode > 0 ? tu_oracle_hook : NULL;
    ep.draft_hook_user = &o;
    dfl_engine *e = dfl_engine_new_from_models(tm, dm, NULL, &ep, &err);
    if (e == NULL) {
        test_fail(t, __FILE__, __LINE__, "engine: %s", err.msg);
        return false;
    }
    dfl_seq_params sp = dfl_seq_default_params();
    sp.max_tokens = N_GEN;
    int32_t *pp[8];
    int64_t lens[8];
    for (int s = 0; s < n_seq; s++) {
        pp[s] = prompts[s];
        lens[s] = prompt_len + s;
    }
    bool ok = tu_engine_generate(e, n_seq, pp, lens, &sp, &got[0][0], N_GEN + 64, n_got, &o, &err);
    if (!ok) test_fail(t, __FILE__, __LINE__, "engine step: %s", err.msg);
    for (int s = 0; s < n_seq && ok; s++) {
        if (n_got[s] != N_GEN) {
            test_fail(t, __FILE__, __LINE__, "seq %d: %lld tokens", s, (long long)n_got[s]);
            ok = false;
        }
        for (int i = 0; i < N_GEN && ok; i++) {
            if (got[s][i] != ref[s][i]) {
                test_fail(t, __FILE__, __LINE__, "n_seq %d k %d min %d p_min %.2f mode %d: seq %d token %d: %d != greedy %d",
                          n_seq, n_draft, n_draft_min, (double)p_min, mode, s, i, got[s][i], ref[s][i]);
                ok = false;
            }
        }
        dfl_seq_stats st;
        if (dfl_engine_seq_stats(e, s, &st, &err) == DFL_OK) {
            *drafted += st.n_draft_tokens;
            *accepted += st.n_accepted;
        }
    }
    dfl_engine_free(e);
    return ok;
}

TEST(dflash2_lossless_greedy) {
    const char *types[] = {"f32", "f16", "q8_0"};
    int n_cases = 0, n_ok = 0;
    int64_t drafted = 0, accepted = 0;
    for (int ti = 0; ti < 3; ti++) {
        char args[512], tp[512], dp[512], dir[16];
        snprintf(args, sizeof(args), TINY_T " --type %s --block-size %d --seed %d --dflash2 %s", types[ti], ti == 1 ? 4 : 8,
                 21 + ti, ti == 2 ? "3,8,32,4" : "2,16,16,3");
        snprintf(dir, sizeof(dir), "t%d", ti);
        if (!tu_make_models(t, dir, args, tp, dp, sizeof(tp))) return;
        dfl_error err = {0};
        dfl_model *tm = dfl_model_load(tp, NULL, &err);
        dfl_model *dm = tm ? dfl_model_load(dp, NULL, &err) : NULL;
        REQUIRE(dm != NULL);
        const int B = (int)dfl_model_hparams(dm)->block_size;
        /* (n_seq, n_draft, n_draft_min, p_min x 100, oracle mode, prompt length) */
        const int cases[][6] = {
            {1, B - 1, 0, 0, 0, 5}, {1, B - 1, 0, 0, 1, 9}, {2, B - 1, 1, 0, 1, 17}, {3, B / 2, 0, 0, 1, 3},
            {4, B - 1, 1, 30, 0, 11}, {2, 1, 0, 0, 1, 20}, {1, B - 1, 0, 50, 1, 7}, {3, B - 1, 1, 0, 0, 33},
        };
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            n_cases++;
            n_ok += lossless_case(t, tm, dm, cases[c][0], cases[c][1], cases[c][2], (float)cases[c][3] / 100.0f,
                                  cases[c][4], cases[c][5], &drafted, &accepted);
        }
        dfl_model_free(dm);
        dfl_model_free(tm);
    }
    printf("    %d of %d DFlash2 engine runs bit-identical to target-alone greedy (%lld drafted, %lld accepted)\n", n_ok,
           n_cases, (long long)drafted, (long long)accepted);
    CHECK_EQ_INT(n_ok, n_cases);
    CHECK(n_cases >= 24);
    CHECK(accepted > 0);
}

/* The walk's p_min cut (llama.cpp's --draft-p-min for DFlash2): drafts stop before the first
 * position whose walk probability is below it; 1.0 keeps (almost) nothing, 0 everything. */
TEST(dflash2_p_min_uses_the_walk) {
    char tpath[512], dpath[512];
    if (!tu_make_models(t, "m", TINY_T " --type f32 --block-size 8 --seed 8 --dflash2 3,8,16,4", tpath, dpath, sizeof(tpath))) return;
    d2pair p;
    if (!d2_open(t, &p, tpath, dpath, 1, 7)) { d2_close(&p); return; }
    dfl_error err = {0};
    int32_t prompt[6] = {3, 77, 150, 9, 400, 21}, first, draft[7];
    CHECK(spec_prefill(p.spec, 0, prompt, 6, &first, &err) == DFL_OK);
    CHECK(drafter_draft(p.dctx, 1, (int32_t[]){0}, &first, 7, NULL, draft, NULL, &err) == DFL_OK);
    const float *pr = dflash2_last_probs(p.dctx);
    int64_t rl = 0;
    const float *lat = dflash2_last_lattice(p.dctx, &rl);
    REQUIRE(pr != NULL && lat != NULL);
    /* the probabilities are the softmax of the walk's scores at its choice */
    int64_t j = 0;
    for (int r = 0; r < 7; r++) {
        const float *sc = lat + r * rl + 4 + j * 4;
        int64_t best = 0;
        for (int s = 1; s < 4; s++) if (sc[best] < sc[s]) best = s;
        double sum = 0;
        for (int s = 0; s < 4; s++) sum += exp((double)sc[s] - (double)sc[best]);
        CHECK_NEAR(pr[r], 1.0 / sum, 1e-5);
        CHECK(pr[r] > 0.0f && pr[r] <= 1.0f);
        CHECK_EQ_INT(draft[r], (int32_t)lat[r * rl + best]);
        j = best;
    }
    /* the session verifies exactly the drafts before the first probability below p_min: a cut
     * between the smallest and the largest of this walk's probabilities */
    float lo = pr[0], hi = pr[0];
    for (int r = 1; r < 7; r++) {
        lo = pr[r] < lo ? pr[r] : lo;
        hi = pr[r] > hi ? pr[r] : hi;
    }
    d2_close(&p);
    REQUIRE(lo < hi);
    const float cut = 0.5f * (lo + hi);
    int expect = 0;
    float pr_copy[7];
    if (!d2_open_p(t, &p, tpath, dpath, 1, 7, cut)) { d2_close(&p); return; }
    CHECK(spec_prefill(p.spec, 0, prompt, 6, &first, &err) == DFL_OK);
    int32_t seq = 0, toks[8], n_tok = 0, n_drafted = -1;
    CHECK(spec_step_ex(p.spec, 1, &seq, toks, &n_tok, &n_drafted, &err) == DFL_OK);
    memcpy(pr_copy, dflash2_last_probs(p.dctx), sizeof(pr_copy));
    while (expect < 7 && pr_copy[expect] >= cut) expect++;
    printf("    walk probabilities %.3f..%.3f, cut %.3f: %d of 7 drafts verified\n", (double)lo, (double)hi, (double)cut,
           n_drafted);
    CHECK_EQ_INT(n_drafted, expect);
    CHECK(expect < 7);
    d2_close(&p);
}

/* ---- bad files -------------------------------------------------------------------------------- */

typedef struct d2file {
    int64_t kernel, group, rank, top_k;
    const char *skip_key, *skip_tensor, *bad_tensor;
} d2file;

static float k_z[1 << 16];

static void d2_add(gguf_writer *w, const d2file *m, const char *name, uint32_t type, uint32_t nd, int64_t ne0, int64_t ne1,
                   int64_t ne2) {
    if (m->skip_tensor && strcmp(name, m->skip_tensor) == 0) return;
    if (m->bad_tensor && strcmp(name, m->bad_tensor) == 0) ne0 += 32;
    int64_t ne[3] = {ne0, ne1, ne2};
    gguf_writer_add_tensor(w, name, type, nd, ne, k_z, quant_row_size(type, ne0) * (size_t)(ne1 * ne2), NULL);
}

static void d2_key(gguf_writer *w, const d2file *m, const char *key, int64_t v) {
    if (v < 0 || (m->skip_key && strcmp(key, m->skip_key) == 0)) return;
    gguf_writer_set_u32(w, key, (uint32_t)v);
}

/* A zero-weight DFlash2 drafter: n_embd 64, 1 layer, n_vocab 256. */
static bool d2_write(const d2file *m, const char *path) {
    const int64_t E = 64, V = 256, G = m->group > 0 && E % m->group == 0 ? E / m->group : 1;
    const int64_t K = m->kernel > 0 ? m->kernel : 1, R = m->rank > 0 ? m->rank : 1;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "dflash");
    d2_key(w, m, "dflash.block_count", 1);
    d2_key(w, m, "dflash.embedding_length", E);
    d2_key(w, m, "dflash.feed_forward_length", 128);
    d2_key(w, m, "dflash.attention.head_count", 4);
    d2_key(w, m, "dflash.attention.head_count_kv", 2);
    d2_key(w, m, "dflash.attention.key_length", 16);
    gguf_writer_set_f32(w, "dflash.attention.layer_norm_rms_epsilon", 1e-6f);
    int32_t tl[2] = {1, 2};
    gguf_writer_set_arr_i32(w, "dflash.target_layers", tl, 2);
    d2_key(w, m, "dflash.block_size", 8);
    d2_key(w, m, "tokenizer.ggml.mask_token_id", 5);
    d2_key(w, m, "dflash.conv_kernel_size", m->kernel);
    d2_key(w, m, "dflash.conv_group_size", m->group);
    d2_key(w, m, "dflash.selector_rank", m->rank);
    d2_key(w, m, "dflash.selector_top_k", m->top_k);
    d2_add(w, m, "token_embd.weight", QUANT_TYPE_F32, 2, E, V, 1);
    d2_add(w, m, "fc.weight", QUANT_TYPE_F32, 2, 2 * E, E, 1);
    d2_add(w, m, "enc.output_norm.weight", QUANT_TYPE_F32, 1, E, 1, 1);
    d2_add(w, m, "output_norm.weight", QUANT_TYPE_F32, 1, E, 1, 1);
    d2_add(w, m, "blk.0.attn_norm.weight", QUANT_TYPE_F32, 1, E, 1, 1);
    d2_add(w, m, "blk.0.attn_q.weight", QUANT_TYPE_F32, 2, E, 64, 1);
    d2_add(w, m, "blk.0.attn_k.weight", QUANT_TYPE_F32, 2, E, 32, 1);
    d2_add(w, m, "blk.0.attn_v.weight", QUANT_TYPE_F32, 2, E, 32, 1);
    d2_add(w, m, "blk.0.attn_output.weight", QUANT_TYPE_F32, 2, 64, E, 1);
    d2_add(w, m, "blk.0.attn_q_norm.weight", QUANT_TYPE_F32, 1, 16, 1, 1);
    d2_add(w, m, "blk.0.attn_k_norm.weight", QUANT_TYPE_F32, 1, 16, 1, 1);
    d2_add(w, m, "blk.0.ffn_norm.weight", QUANT_TYPE_F32, 1, E, 1, 1);
    d2_add(w, m, "blk.0.ffn_gate.weight", QUANT_TYPE_F32, 2, E, 128, 1);
    d2_add(w, m, "blk.0.ffn_up.weight", QUANT_TYPE_F32, 2, E, 128, 1);
    d2_add(w, m, "blk.0.ffn_down.weight", QUANT_TYPE_F32, 2, 128, E, 1);
    d2_add(w, m, "blk.0.attn_conv_base", QUANT_TYPE_F32, 3, E, K, 2);
    d2_add(w, m, "blk.0.attn_conv_proj.weight", QUANT_TYPE_F32, 2, E, 2 * K * G, 1);
    d2_add(w, m, "blk.0.ffn_conv_base", QUANT_TYPE_F16, 3, E, K, 2);
    d2_add(w, m, "blk.0.ffn_conv_proj.weight", QUANT_TYPE_F32, 2, E, 2 * K * G, 1);
    d2_add(w, m, "selector_predecessor.weight", QUANT_TYPE_F32, 2, R, V, 1);
    d2_add(w, m, "selector_successor.weight", QUANT_TYPE_F32, 2, R, V, 1);
    d2_add(w, m, "selector_hidden.weight", QUANT_TYPE_F32, 2, E, R, 1);
    dfl_error err = {0};
    dfl_status st = gguf_writer_write(w, path, &err);
    gguf_writer_free(w);
    return st == DFL_OK;
}

static d2file d2_good(void) {
    d2file m = {.kernel = 3, .group = 8, .rank = 16, .top_k = 4};
    return m;
}

static void d2_expect_fail(test_ctx *t, const d2file *m, const char *name, const char *needle) {
    char path[512];
    test_path(t, name, path, sizeof(path));
    REQUIRE(d2_write(m, path));
    dfl_error err = {0};
    dfl_model *dm = dfl_model_load(path, NULL, &err);
    CHECK_MSG(dm == NULL, "%s: loaded", name);
    CHECK_STR_CONTAINS(err.msg, needle);
    CHECK_STR_CONTAINS(err.msg, name);
    dfl_model_free(dm);
}

TEST(dflash2_bad_files) {
    char path[512];
    test_path(t, "good.gguf", path, sizeof(path));
    d2file m = d2_good();
    REQUIRE(d2_write(&m, path));
    dfl_error err = {0};
    dfl_model *dm = dfl_model_load(path, NULL, &err);
    REQUIRE(dm != NULL);
    REQUIRE(dm->d2 != NULL);
    CHECK_EQ_INT(dm->d2->conv_kernel, 3);
    CHECK_EQ_INT(dm->d2->conv_group, 8);
    CHECK_EQ_INT(dm->d2->rank, 16);
    CHECK_EQ_INT(dm->d2->top_k, 4);
    dfl_model_free(dm);

    m = d2_good();
    m.skip_key = "dflash.selector_rank";
    d2_expect_fail(t, &m, "no_rank.gguf", "needs key dflash.selector_rank, missing");
    m = d2_good();
    m.skip_key = "dflash.block_size";
    d2_expect_fail(t, &m, "no_block.gguf", "needs key dflash.block_size, missing");
    m = d2_good();
    m.kernel = 0;
    d2_expect_fail(t, &m, "kernel0.gguf", "dflash.conv_kernel_size = 0 is out of range");
    m = d2_good();
    m.group = 7;
    d2_expect_fail(t, &m, "group7.gguf", "n_embd 64 is not divisible by dflash.conv_group_size 7");
    m = d2_good();
    m.top_k = 8;
    d2_expect_fail(t, &m, "topk8.gguf", "too small for the selector lattice of dflash.selector_top_k 8");
    m = d2_good();
    m.skip_tensor = "blk.0.ffn_conv_proj.weight";
    d2_expect_fail(t, &m, "no_proj.gguf", "blk.0.ffn_conv_proj.weight: expected [64, 48], missing");
    m = d2_good();
    m.bad_tensor = "selector_successor.weight";
    d2_expect_fail(t, &m, "bad_succ.gguf", "selector_successor.weight: expected [16, 256]");
    m = d2_good();
    m.bad_tensor = "blk.0.attn_conv_base";
    d2_expect_fail(t, &m, "bad_base.gguf", "blk.0.attn_conv_base: expected [64, 3, 2]");
    m = d2_good();
    m.skip_tensor = "selector_hidden.weight";
    d2_expect_fail(t, &m, "no_hidden.gguf", "but no selector_hidden.weight");
}

/* dflash2_scan_row (the selector's one pass over a logit row) against dflash2_top_k plus a plain
 * scan for the first NaN / Inf: the same index, or the same k ids in the same order, on rows of
 * every length from 1 to 70 and around the 16-value blocks, k 1 / 8 / 64, with many ties (values
 * on a coarse grid), constant and ascending rows, and a NaN, +Inf or -Inf at random places. */
TEST(dflash2_scan_row_equals_top_k) {
    uint64_t s = 77;
    static float row[4200];
    static const int64_t lens[] = {1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 70, 4096, 4111};
    static const int64_t ks[] = {1, 8, 64};
    int32_t a[64], b[64];
    for (int it = 0; it < 600; it++) {
        const int64_t n = it < 70 ? it + 1 : lens[it % 13];
        const int64_t k = ks[it % 3];
        const int kind = (it / 3) % 5;
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const int q = (int)((s >> 33) % 9);
            row[i] = kind == 0 ? (float)q * 0.5f - 2.0f            /* ties everywhere */
                     : kind == 1 ? 1.25f                             /* constant */
                     : kind == 2 ? (float)i * 0.001f                 /* ascending: every block enters */
                                 : (float)((s >> 20) & 0xffff) / 4096.0f - 8.0f;
        }
        if (kind >= 3 && n > 2) { /* a non-finite value somewhere (kind 4: two of them) */
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const float bad[3] = {NAN, INFINITY, -INFINITY};
            row[(s >> 33) % (uint64_t)n] = bad[(s >> 20) % 3];
            if (kind == 4) row[(s >> 40) % (uint64_t)n] = bad[(s >> 50) % 3];
        }
        int64_t first = -1;
        for (int64_t i = 0; i < n && first < 0; i++) {
            if (!isfinite(row[i])) first = i;
        }
        const int64_t got = dflash2_scan_row(row, n, k, a);
        CHECK_MSG(got == first, "scan_row n %lld k %lld kind %d: first non-finite %lld, expected %lld", (long long)n,
                  (long long)k, kind, (long long)got, (long long)first);
        if (first < 0 && got < 0) {
            dflash2_top_k(row, n, k, b);
            const int64_t m = k < n ? k : n;
            CHECK_MSG(memcmp(a, b, (size_t)m * sizeof(int32_t)) == 0, "scan_row n %lld k %lld kind %d: top-k differs",
                      (long long)n, (long long)k, kind);
        }
    }
}
