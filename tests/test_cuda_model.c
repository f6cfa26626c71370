/* test_cuda_model.c: end to end on the CUDA backend with generated models: CUDA logits vs CPU
 * logits (f32 ... q4_0, the cuBLAS prompt path included), greedy speculative output == target-alone
 * greedy output on the GPU, host vs device feature paths identical, and the DFlash2 drafter on the
 * GPU vs the CPU. Without a usable device every test here skips with the reason (this development
 * machine has none); tools/device-check.sh runs them on a GPU. The op-level CUDA tests are in
 * test_backend_cuda.c. */
#include "test.h"
#include "test_util.h"

#include "base/error.h"
#include "dflash.h"
#include "speculative/session.h"
#include "speculative/drafter_dflash2.h"
#ifdef DFL_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TINY "--n-embd 64 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 640 --draft-layers 1"

/* True if a CUDA device is usable (else the test skipped itself). */
static bool have_gpu(test_ctx *t) {
#ifdef DFL_HAVE_CUDA
    dfl_error err = {0};
    if (backend_cuda_device_count(&err) > 0) return true;
    test_skip(t, err.msg);
    return false;
#else
    test_skip(t, "built without CUDA (make CUDA=1 where nvcc is installed)");
    return false;
#endif
}

static dfl_context *ctx_on(test_ctx *t, dfl_model *m, dfl_device dev, int64_t n_ubatch, int32_t n_seq) {
    dfl_context_params p = dfl_context_default_params();
    p.n_ctx = 256;
    p.n_batch = 128;
    p.n_ubatch = n_ubatch;
    p.n_outputs = 128;
    p.n_seq = n_seq;
    p.n_threads = 2;
    p.n_threads_batch = 2;
    p.device = dev;
    dfl_error err = {0};
    dfl_context *c = dfl_context_new(m, &p, &err);
    if (c == NULL) test_fail(t, __FILE__, __LINE__, "context: %s", err.msg);
    return c;
}

/* CUDA vs CPU logits on one generated model (extra make-test-model arguments `args`): a prompt of
 * 100 in one 100-row ubatch (the cuBLAS path) and in 8-row ubatches (own kernels), then 5 decode
 * steps; relative error <= tol. */
static void forward_vs_cpu(test_ctx *t, const char *name, const char *dir, const char *args, double tol) {
    char tpath[512];
    if (!tu_make_models(t, dir, args, tpath, NULL, sizeof(tpath))) return;
    dfl_error err = {0};
    dfl_model *m = dfl_model_load(tpath, NULL, &err);
    REQUIRE(m != NULL);
    for (int ub = 0; ub < 2; ub++) {
        const int64_t n_ub = ub == 0 ? 128 : 8;
        dfl_context *cc = ctx_on(t, m, DFL_DEVICE_CPU, n_ub, 1), *gc = ctx_on(t, m, DFL_DEVICE_CUDA, n_ub, 1);
        if (cc == NULL || gc == NULL) {
            dfl_context_free(cc);
            dfl_context_free(gc);
            break;
        }
        const int64_t nv = dfl_n_vocab(cc), n_prompt = 100;
        int32_t toks[100];
        for (int i = 0; i < 100; i++) toks[i] = (i * 37 + 11) % 640;
        float *a = malloc((size_t)(n_prompt * nv) * 4), *b = malloc((size_t)(n_prompt * nv) * 4);
        REQUIRE(a && b);
        CHECK(tu_decode(cc, 0, toks, n_prompt, a, &err) == DFL_OK);
        CHECK(tu_decode(gc, 0, toks, n_prompt, b, &err) == DFL_OK);
        double e1 = tu_rel_err(b, a, n_prompt * nv);
        CHECK_MSG(e1 <= tol, "%s ubatch %lld: prompt logits rel err %.3g > %.3g", name, (long long)n_ub, e1, tol);
        for (int k = 0; k < 5; k++) {
            int32_t tok = (k * 101 + 7) % 640;
            CHECK(tu_decode(cc, 0, &tok, 1, a, &err) == DFL_OK);
            CHECK(tu_decode(gc, 0, &tok, 1, b, &err) == DFL_OK);
            double e2 = tu_rel_err(b, a, nv);
            CHECK_MSG(e2 <= tol, "%s: decode step %d logits rel err %.3g > %.3g", name, k, e2, tol);
        }
        printf("    %s ubatch %lld: prompt rel err %.2e\n", name, (long long)n_ub, e1);
        free(a);
        free(b);
        dfl_context_free(gc);
        dfl_context_free(cc);
    }
    dfl_model_free(m);
}

TEST(cuda_forward_logits_vs_cpu) {
    if (!have_gpu(t)) return;
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    const double tol[] = {2e-4, 2e-3, 2e-2, 2e-2, 2e-2};
    for (int ti = 0; ti < 5; ti++) {
        char args[512], dir[32];
        snprintf(args, sizeof(args), TINY " --type %s --seed %d", types[ti], 3 + ti);
        snprintf(dir, sizeof(dir), "m_%s", types[ti]);
        forward_vs_cpu(t, types[ti], dir, args, tol[ti]);
    }
}

/* Arch llama (no qk-norm, NORM rope pairing: adjacent pairs, op->i[1] = 1) on the GPU vs the CPU:
 * a rope that paired (i, i + n_rot/2) instead would give wrong attention and fail the f32 bound. */
TEST(cuda_forward_llama_vs_cpu) {
    if (!have_gpu(t)) return;
    forward_vs_cpu(t, "llama f32", "l_f32", TINY " --arch llama --type f32 --seed 13", 2e-4);
    forward_vs_cpu(t, "llama q8_0", "l_q8_0", TINY " --arch llama --type q8_0 --untied --seed 14", 2e-2);
}

#define SPEC_GEN 32

typedef struct oracle {
    const int32_t *ref[4];
    int64_t done[4];
    uint64_t rng;
    int mode; /* 0 real drafter, 1 the true continuation with planted errors */
} oracle;

static void oracle_hook(void *user, int32_t seq, int32_t *draft, int32_t n_draft) {
    oracle *o = user;
    if (o->mode == 0) return;
    for (int32_t j = 0; j < n_draft; j++) {
        const int64_t at = o->done[seq] + j;
        draft[j] = at < SPEC_GEN + 64 ? o->ref[seq][at] : 0;
    }
    o->rng = o->rng * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t r = o->rng >> 33;
    if (r % 4 != 0) draft[(r >> 4) % (uint64_t)n_draft] = (draft[(r >> 4) % (uint64_t)n_draft] + 1) % 640;
}

/* Greedy speculative tokens on the GPU == the target's own greedy tokens on the GPU. */
static bool spec_run(test_ctx *t, const char *tpath, const char *dpath, int n_seq, int n_draft, int prompt_len,
                     dfl_feature_path fp, int mode, int32_t got[4][SPEC_GEN + 64]) {
    dfl_error err = {0};
    dfl_model *tm = dfl_model_load(tpath, NULL, &err), *dm = tm ? dfl_model_load(dpath, NULL, &err) : NULL;
    if (dm == NULL) {
        test_fail(t, __FILE__, __LINE__, "load: %s", err.msg);
        dfl_model_free(tm);
        return false;
    }
    const dfl_hparams *dh = dfl_model_hparams(dm);
    dfl_context_params cp = dfl_context_default_params();
    cp.n_ctx = 256;
    cp.n_seq = n_seq;
    cp.n_batch = 64;
    cp.n_ubatch = 16;
    cp.n_outputs = 64;
    cp.device = DFL_DEVICE_CUDA;
    cp.n_capture = (int32_t)dh->n_target_layers;
    cp.capture_layers = dh->target_layers;
    dfl_context *tc = dfl_context_new(tm, &cp, &err);
    dfl_context_params rp = cp;
    rp.n_seq = 1;
    rp.n_capture = 0;
    rp.capture_layers = NULL;
    rp.share_backend = tc;
    dfl_context *rc = tc ? dfl_context_new(tm, &rp, &err) : NULL;
    dfl_context_params dp = dfl_context_default_params();
    dp.n_seq = n_seq;
    dp.target = tc;
    dp.n_batch = 32;
    dfl_context *dc = rc ? dfl_context_new(dm, &dp, &err) : NULL;
    oracle o;
    memset(&o, 0, sizeof(o));
    o.mode = mode;
    o.rng = (uint64_t)(n_seq * 100 + n_draft * 10 + prompt_len);
    spec_params sp = spec_default_params();
    sp.n_draft = n_draft;
    sp.features = fp;
    sp.draft_hook = oracle_hook;
    sp.draft_hook_user = &o;
    spec_session *spec = dc ? spec_new(tc, dc, &sp, &err) : NULL;
    bool ok = spec != NULL;
    CHECK_MSG(ok, "setup: %s", err.msg);
    int32_t prompts[4][128], ref[4][SPEC_GEN + 64];
    memset(ref, 0, sizeof(ref)); /* the oracle may look past the computed continuation: token 0 */
    for (int s = 0; s < n_seq && ok; s++) {
        const int len = prompt_len + s;
        for (int i = 0; i < len; i++) prompts[s][i] = (int32_t)((i * 131 + s * 17 + prompt_len * 7 + 3) % 640);
        dfl_seq_remove(rc, 0, 0, NULL);
        ok = tu_greedy(rc, 0, prompts[s], len, SPEC_GEN + n_draft + 1, ref[s], &err) == DFL_OK;
        o.ref[s] = ref[s];
    }
    for (int s = 0; s < n_seq && ok; s++) {
        int32_t first;
        ok = spec_prefill(spec, s, prompts[s], prompt_len + s, &first, &err) == DFL_OK;
        got[s][0] = first;
        o.done[s] = 1;
    }
    int32_t seqs[4] = {0, 1, 2, 3}, step_tok[4 * 64], n_step[4];
    while (ok) {
        bool all = true;
        for (int s = 0; s < n_seq; s++) all = all && o.done[s] >= SPEC_GEN;
        if (all) break;
        ok = spec_step(spec, n_seq, seqs, step_tok, n_step, &err) == DFL_OK;
        for (int s = 0; s < n_seq && ok; s++) {
            for (int j = 0; j < n_step[s]; j++) {
                if (o.done[s] < SPEC_GEN + 63) got[s][o.done[s]] = step_tok[s * (n_draft + 1) + j];
                o.done[s]++;
            }
        }
    }
    CHECK_MSG(ok, "spec run: %s", err.msg);
    for (int s = 0; s < n_seq && ok; s++) {
        for (int i = 0; i < SPEC_GEN; i++) {
            if (got[s][i] != ref[s][i]) {
                test_fail(t, __FILE__, __LINE__, "n_seq %d k %d prompt %d mode %d features %d: seq %d token %d: spec %d "
                          "!= greedy %d", n_seq, n_draft, prompt_len, mode, (int)fp, s, i, got[s][i], ref[s][i]);
                ok = false;
                break;
            }
        }
    }
    spec_free(spec);
    dfl_context_free(dc);
    dfl_context_free(rc);
    dfl_context_free(tc);
    dfl_model_free(dm);
    dfl_model_free(tm);
    return ok;
}

TEST(cuda_spec_greedy_equals_target) {
    if (!have_gpu(t)) return;
    const char *types[] = {"f32", "bf16", "q8_0", "q4_0"};
    static int32_t got[4][SPEC_GEN + 64];
    for (int ti = 0; ti < 4; ti++) {
        char args[512], tpath[512], dpath[512], dir[32];
        snprintf(args, sizeof(args), TINY " --type %s --block-size 16 --seed %d", types[ti], 21 + ti);
        snprintf(dir, sizeof(dir), "s_%s", types[ti]);
        if (!tu_make_models(t, dir, args, tpath, dpath, sizeof(tpath))) return;
        /* (n_seq, n_draft, prompt_len, mode) */
        static const int cases[][4] = {{1, 15, 9, 1}, {2, 15, 20, 1}, {1, 7, 33, 0}, {3, 4, 5, 1}, {4, 15, 40, 1}};
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            spec_run(t, tpath, dpath, cases[c][0], cases[c][1], cases[c][2], c % 2 ? DFL_FEATURES_HOST : DFL_FEATURES_DEVICE,
                     cases[c][3], got);
        }
    }
}

TEST(cuda_spec_host_and_device_features_identical) {
    if (!have_gpu(t)) return;
    char tpath[512], dpath[512];
    if (!tu_make_models(t, "m", TINY " --type q8_0 --block-size 8 --seed 5", tpath, dpath, sizeof(tpath))) return;
    static int32_t a[4][SPEC_GEN + 64], b[4][SPEC_GEN + 64];
    for (int mode = 0; mode < 2; mode++) {
        memset(a, 0, sizeof(a));
        memset(b, 0, sizeof(b));
        CHECK(spec_run(t, tpath, dpath, 3, 7, 21, DFL_FEATURES_HOST, mode, a));
        CHECK(spec_run(t, tpath, dpath, 3, 7, 21, DFL_FEATURES_DEVICE, mode, b));
        CHECK_MSG(memcmp(a, b, sizeof(a)) == 0, "mode %d: host and device feature paths give different tokens", mode);
    }
}

/* ---- DFlash2 drafter on the GPU (docs/drafter.md "DFlash2") --------------------------------------- */

/* The DFlash2 draft pass (convolutions composed of broadcast add/mul and row-shifting get_rows,
 * selector gate matmul on the device; lattice and walk on the host) on CUDA vs the CPU: block
 * logits and lattice scores close, walked tokens equal. */
TEST(cuda_dflash2_draft_vs_cpu) {
    if (!have_gpu(t)) return;
    char tpath[512], dpath[512];
    if (!tu_make_models(t, "d2", TINY " --type f32 --block-size 8 --seed 31 --dflash2 3,8,16,4", tpath, dpath,
                        sizeof(tpath))) return;
    dfl_error err = {0};
    dfl_model *tm = dfl_model_load(tpath, NULL, &err), *dm = tm ? dfl_model_load(dpath, NULL, &err) : NULL;
    REQUIRE(dm != NULL);
    const dfl_hparams *dh = dfl_model_hparams(dm);
    int32_t draft[2][2 * 7], first[2][2];
    float *logits[2], *lat[2];
    int64_t rl = 0;
    const int32_t lens[2] = {7, 4};
    for (int dev = 0; dev < 2; dev++) {
        dfl_context_params cp = dfl_context_default_params();
        cp.n_ctx = 128;
        cp.n_seq = 2;
        cp.n_batch = 64;
        cp.n_outputs = 64;
        cp.kv_f32 = true;
        cp.device = dev ? DFL_DEVICE_CUDA : DFL_DEVICE_CPU;
        cp.n_capture = (int32_t)dh->n_target_layers;
        cp.capture_layers = dh->target_layers;
        dfl_context *tc = dfl_context_new(tm, &cp, &err);
        dfl_context_params dp = dfl_context_default_params();
        dp.n_seq = 2;
        dp.target = tc;
        dp.kv_f32 = true;
        dfl_context *dc = tc ? dfl_context_new(dm, &dp, &err) : NULL;
        spec_params sp = spec_default_params();
        sp.n_draft = 7;
        spec_session *spec = dc ? spec_new(tc, dc, &sp, &err) : NULL;
        REQUIRE(spec != NULL);
        int32_t pa[11], pb[6];
        for (int i = 0; i < 11; i++) pa[i] = (i * 41 + 3) % 640;
        for (int i = 0; i < 6; i++) pb[i] = (i * 67 + 9) % 640;
        CHECK(spec_prefill(spec, 0, pa, 11, &first[dev][0], &err) == DFL_OK);
        CHECK(spec_prefill(spec, 1, pb, 6, &first[dev][1], &err) == DFL_OK);
        logits[dev] = malloc(2 * 7 * 640 * sizeof(float));
        CHECK(drafter_draft(dc, 2, (int32_t[]){0, 1}, first[dev], 7, lens, draft[dev], logits[dev], &err) == DFL_OK);
        const float *l = dflash2_last_lattice(dc, &rl);
        REQUIRE(l != NULL);
        lat[dev] = malloc((size_t)(11 * rl) * sizeof(float));
        memcpy(lat[dev], l, (size_t)(11 * rl) * sizeof(float));
        spec_free(spec);
        dfl_context_free(dc);
        dfl_context_free(tc);
    }
    CHECK(first[0][0] == first[1][0] && first[0][1] == first[1][1]);
    double el = 0;
    for (int s = 0; s < 2; s++) {
        const double e = tu_rel_err(logits[1] + s * 7 * 640, logits[0] + s * 7 * 640, lens[s] * 640);
        el = e > el ? e : el;
        for (int j = 0; j < lens[s]; j++) CHECK_EQ_INT(draft[1][s * 7 + j], draft[0][s * 7 + j]);
    }
    const double ea = tu_rel_err(lat[1], lat[0], 11 * rl);
    printf("    DFlash2 draft CUDA vs CPU: block logits rel err %.2e, lattice %.2e\n", el, ea);
    CHECK(el < 2e-4 && ea < 2e-4);
    for (int dev = 0; dev < 2; dev++) {
        free(logits[dev]);
        free(lat[dev]);
    }
    dfl_model_free(dm);
    dfl_model_free(tm);
}

/* Greedy speculative output with a DFlash2 drafter on the GPU == the target's own. */
TEST(cuda_dflash2_spec_greedy_equals_target) {
    if (!have_gpu(t)) return;
    static int32_t got[4][SPEC_GEN + 64];
    const char *types[] = {"f32", "q8_0"};
    for (int ti = 0; ti < 2; ti++) {
        char args[512], tpath[512], dpath[512], dir[32];
        snprintf(args, sizeof(args), TINY " --type %s --block-size 8 --seed %d --dflash2 3,8,32,4", types[ti], 41 + ti);
        snprintf(dir, sizeof(dir), "d2s_%s", types[ti]);
        if (!tu_make_models(t, dir, args, tpath, dpath, sizeof(tpath))) return;
        static const int cases[][4] = {{1, 7, 9, 0}, {2, 7, 20, 1}, {3, 4, 5, 1}, {4, 7, 40, 0}};
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            CHECK(spec_run(t, tpath, dpath, cases[c][0], cases[c][1], cases[c][2],
                           c % 2 ? DFL_FEATURES_HOST : DFL_FEATURES_DEVICE, cases[c][3], got));
        }
    }
}
