/* batch.c: the dfl_batch table (allocation at init, allocation-free adders), its validation
 * against a context's limits (docs/batch.md) and the in-order micro-batch split. */
#include "batch/batch.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the table ---------------------------------------------------------------------------- */

#define BATCH_MAX_TOKENS ((int64_t)INT32_MAX) /* indices are returned as int32_t */
#define BATCH_MAX_EMBD ((int64_t)1 << 24)

void dfl_batch_free(dfl_batch *b) {
    if (b == NULL) return;
    free(b->token);
    free(b->embd);
    free(b->has_embd);
    free(b->pos);
    free(b->seq_id);
    free(b->output);
    free(b->embd_row);
    free(b->state);
    free(b->has_state);
    free(b);
}

dfl_batch *dfl_batch_init(int64_t n_tokens_max, int64_t n_embd, int64_t n_pos_sections, dfl_error *err) {
    error_clear(err);
    if (n_tokens_max < 1 || n_tokens_max > BATCH_MAX_TOKENS) {
        error_set(err, DFL_ERR_INVALID, "dfl_batch_init: n_tokens_max %lld must be in [1, %lld]",
                  (long long)n_tokens_max, (long long)BATCH_MAX_TOKENS);
        return NULL;
    }
    if (n_embd < 0 || n_embd > BATCH_MAX_EMBD) {
        error_set(err, DFL_ERR_INVALID, "dfl_batch_init: n_embd %lld must be in [0, %lld]",
                  (long long)n_embd, (long long)BATCH_MAX_EMBD);
        return NULL;
    }
    if (n_pos_sections != 1 && n_pos_sections != 4) {
        error_set(err, DFL_ERR_INVALID, "dfl_batch_init: n_pos_sections %lld must be 1 or 4",
                  (long long)n_pos_sections);
        return NULL;
    }
    const size_t n = (size_t)n_tokens_max;
    const size_t n_f = (size_t)n_embd;
    if (n_f > 0 && n > SIZE_MAX / sizeof(float) / n_f) {
        error_set(err, DFL_ERR_NOMEM, "dfl_batch_init: %lld x %lld floats overflow the address space",
                  (long long)n_tokens_max, (long long)n_embd);
        return NULL;
    }
    dfl_batch *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        error_set(err, DFL_ERR_NOMEM, "dfl_batch_init: out of memory");
        return NULL;
    }
    b->n_tokens_max = n_tokens_max;
    b->n_embd = n_embd;
    b->n_pos_sections = n_pos_sections;
    b->token = malloc(n * sizeof(int32_t));
    b->has_embd = calloc(n, sizeof(bool));
    b->pos = malloc(n * (size_t)n_pos_sections * sizeof(int32_t));
    b->seq_id = malloc(n * sizeof(int32_t));
    b->output = calloc(n, sizeof(bool));
    b->embd_row = malloc(n * sizeof(int32_t));
    b->has_state = calloc(n, sizeof(bool));
    bool ok = b->token && b->has_embd && b->pos && b->seq_id && b->output && b->embd_row && b->has_state;
    if (ok && n_f > 0) {
        b->embd = malloc(n * n_f * sizeof(float));
        b->state = malloc(n * n_f * sizeof(float));
        ok = b->embd && b->state;
    }
    if (!ok) {
        error_set(err, DFL_ERR_NOMEM, "dfl_batch_init: out of memory for %lld entries of n_embd %lld",
                  (long long)n_tokens_max, (long long)n_embd);
        dfl_batch_free(b);
        return NULL;
    }
    return b;
}

void dfl_batch_clear(dfl_batch *b) {
    if (b != NULL) b->n_tokens = 0;
}

/* Appends an entry with position and sequence set and no input; returns its index or a
 * negative status. The caller then sets the input. */
static int32_t batch_append(dfl_batch *b, const int32_t *pos, int32_t seq_id, bool output) {
    if (b == NULL || pos == NULL) return -(int32_t)DFL_ERR_INVALID;
    if (b->n_tokens >= b->n_tokens_max) return -(int32_t)DFL_ERR_CTX_FULL;
    const int64_t i = b->n_tokens++;
    b->token[i] = DFL_TOKEN_NULL;
    b->has_embd[i] = false;
    memcpy(b->pos + i * b->n_pos_sections, pos, (size_t)b->n_pos_sections * sizeof(int32_t));
    b->seq_id[i] = seq_id;
    b->output[i] = output;
    b->embd_row[i] = -1;
    b->has_state[i] = false;
    return (int32_t)i;
}

int32_t dfl_batch_add_token(dfl_batch *b, int32_t token, const int32_t *pos, int32_t seq_id, bool output) {
    const int32_t i = batch_append(b, pos, seq_id, output);
    if (i >= 0) b->token[i] = token;
    return i;
}

int32_t dfl_batch_add_token_embd(dfl_batch *b, int32_t token, const float *embd, const int32_t *pos,
                                 int32_t seq_id, bool output) {
    if (b == NULL || embd == NULL || b->n_embd == 0) return -(int32_t)DFL_ERR_INVALID;
    const int32_t i = batch_append(b, pos, seq_id, output);
    if (i < 0) return i;
    b->token[i] = token;
    memcpy(b->embd + (size_t)i * (size_t)b->n_embd, embd, (size_t)b->n_embd * sizeof(float));
    b->has_embd[i] = true;
    return i;
}

int32_t dfl_batch_add_embd(dfl_batch *b, const float *embd, const int32_t *pos, int32_t seq_id, bool output) {
    return dfl_batch_add_token_embd(b, DFL_TOKEN_NULL, embd, pos, seq_id, output);
}

int32_t dfl_batch_add_embd_row(dfl_batch *b, int32_t row, const int32_t *pos, int32_t seq_id, bool output) {
    if (row < 0) return -(int32_t)DFL_ERR_INVALID;
    const int32_t i = batch_append(b, pos, seq_id, output);
    if (i >= 0) b->embd_row[i] = row;
    return i;
}

dfl_status dfl_batch_set_state(dfl_batch *b, int64_t idx, const float *state) {
    if (b == NULL || state == NULL || b->n_embd == 0 || idx < 0 || idx >= b->n_tokens) {
        return DFL_ERR_INVALID;
    }
    memcpy(b->state + (size_t)idx * (size_t)b->n_embd, state, (size_t)b->n_embd * sizeof(float));
    b->has_state[idx] = true;
    return DFL_OK;
}

/* ---- validation --------------------------------------------------------------------------- */

/* Index of the first non-finite value in x[0..n), or -1. */
static int64_t batch_find_nonfinite(const float *x, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        if (!isfinite(x[k])) return k;
    }
    return -1;
}

/* Checks the input kind of entry i (token / embedding / row / state) against entry 0's. */
static dfl_status batch_check_kind(const dfl_batch *b, const batch_limits *lim, int64_t i, dfl_error *err) {
    const long long li = (long long)i;
    const bool is_tok = b->token[i] != DFL_TOKEN_NULL;
    const bool is_emb = b->has_embd[i];
    const bool is_row = b->embd_row[i] >= 0;
    const bool has_row = b->embd_row[0] >= 0;
    if (b->embd_row[i] < -1) {
        return error_set(err, DFL_ERR_INVALID, "batch entry %lld: embd row %d is negative (-1 means none)",
                         li, b->embd_row[i]);
    }
    if (is_row != has_row) {
        return error_set(err, DFL_ERR_INVALID,
                         "batch entry %lld: %s but entry 0 %s: embd rows must be on all entries or none",
                         li, is_row ? "has an embd row" : "has no embd row", has_row ? "has one" : "has none");
    }
    if (is_row) {
        if (is_tok || is_emb) {
            return error_set(err, DFL_ERR_INVALID,
                             "batch entry %lld: has an embd row together with %s (an embd row entry carries nothing else)",
                             li, is_tok ? "a token id" : "an embedding");
        }
        if (lim->encode_only) {
            return error_set(err, DFL_ERR_INVALID,
                             "batch entry %lld: embd row batches are not accepted by encode-only calls", li);
        }
    } else if (!is_tok && !is_emb) {
        return error_set(err, DFL_ERR_INVALID, "batch entry %lld: has neither a token id nor an embedding", li);
    }
    if (b->has_state[i] != b->has_state[0]) {
        return error_set(err, DFL_ERR_INVALID,
                         "batch entry %lld: %s but entry 0 %s: states must be on all entries or none",
                         li, b->has_state[i] ? "has a state embedding" : "has no state embedding", b->has_state[0] ? "has one" : "has none");
    }
    if (is_emb || b->has_state[i]) {
        const char *what = is_emb ? "an embedding" : "a state embedding";
        if (lim->n_embd <= 0) {
            return error_set(err, DFL_ERR_INVALID, "batch entry %lld: carries %s but this context takes none",
                             li, what);
        }
        if (b->n_embd != lim->n_embd) {
            return error_set(err, DFL_ERR_INVALID,
                             "batch entry %lld: carries %s of %lld floats, the context expects %lld",
                             li, what, (long long)b->n_embd, (long long)lim->n_embd);
        }
    }
    return DFL_OK;
}

/* Checks the values of entry i: ranges, finiteness and the position chain of its sequence. */
static dfl_status batch_check_values(const dfl_batch *b, const batch_limits *lim, int64_t i, dfl_error *err) {
    const long long li = (long long)i;
    const int64_t nps = b->n_pos_sections;
    if (b->token[i] != DFL_TOKEN_NULL && (b->token[i] < 0 || b->token[i] >= lim->n_vocab)) {
        return error_set(err, DFL_ERR_INVALID, "batch entry %lld: token id %d is outside [0, %lld)",
                         li, b->token[i], (long long)lim->n_vocab);
    }
    if (b->embd_row[i] >= 0 && b->embd_row[i] >= lim->n_rows_available) {
        return error_set(err, DFL_ERR_INVALID,
                         "batch entry %lld: embd row %d is outside the %lld rows available in the feature buffer",
                         li, b->embd_row[i], (long long)lim->n_rows_available);
    }
    const int32_t s = b->seq_id[i];
    if (s < 0 || s >= lim->n_seq) {
        return error_set(err, DFL_ERR_INVALID, "batch entry %lld: seq_id %d is outside [0, %lld)",
                         li, s, (long long)lim->n_seq);
    }
    for (int64_t k = 0; k < nps; k++) {
        if (b->pos[i * nps + k] < 0) {
            return error_set(err, DFL_ERR_INVALID, "batch entry %lld: position %d (section %lld) is negative",
                             li, b->pos[i * nps + k], (long long)k);
        }
    }
    if (b->has_embd[i]) {
        const int64_t k = batch_find_nonfinite(b->embd + i * b->n_embd, b->n_embd);
        if (k >= 0) {
            return error_set(err, DFL_ERR_INVALID, "batch entry %lld: embedding value %lld is not finite (%g)",
                             li, (long long)k, (double)b->embd[i * b->n_embd + k]);
        }
    }
    if (b->has_state[i]) {
        const int64_t k = batch_find_nonfinite(b->state + i * b->n_embd, b->n_embd);
        if (k >= 0) {
            return error_set(err, DFL_ERR_INVALID, "batch entry %lld: state embedding value %lld is not finite (%g)",
                             li, (long long)k, (double)b->state[i * b->n_embd + k]);
        }
    }
    /* the position must continue sequence s: the previous entry of s (already checked) + 1,
     * or seq_len[s] for the first entry of s. The backward scan stops at the previous entry of
     * the same sequence, so the cost is bounded by the interleaving, with no scratch memory. */
    int64_t expected = lim->seq_len[s];
    int64_t j = i - 1;
    while (j >= 0 && b->seq_id[j] != s) j--;
    if (j >= 0) expected = (int64_t)b->pos[j * nps] + 1;
    if ((int64_t)b->pos[i * nps] != expected) {
        if (j >= 0) {
            return error_set(err, DFL_ERR_INVALID,
                             "batch entry %lld: position %d of sequence %d does not follow entry %lld (position %d): "
                             "positions of a sequence must be consecutive, expected %lld",
                             li, b->pos[i * nps], s, (long long)j, b->pos[j * nps], (long long)expected);
        }
        return error_set(err, DFL_ERR_INVALID,
                         "batch entry %lld: position %d does not continue sequence %d, which holds %lld positions: "
                         "expected %lld",
                         li, b->pos[i * nps], s, (long long)lim->seq_len[s], (long long)expected);
    }
    return DFL_OK;
}

dfl_status batch_validate(const dfl_batch *b, const batch_limits *lim, dfl_error *err) {
    DFL_ASSERT(lim != NULL);
    if (b == NULL) return error_set(err, DFL_ERR_INVALID, "batch: NULL batch");
    if (b->n_tokens <= 0) return error_set(err, DFL_ERR_INVALID, "batch: empty batch (no entries)");
    DFL_ASSERT(b->n_tokens <= b->n_tokens_max);
    DFL_ASSERT(lim->n_seq <= 0 || lim->seq_len != NULL);
    if (lim->n_batch > 0 && b->n_tokens > lim->n_batch) {
        return error_set(err, DFL_ERR_INVALID, "batch: %lld entries, but the context accepts at most %lld per call",
                         (long long)b->n_tokens, (long long)lim->n_batch);
    }
    if (b->n_pos_sections != lim->n_pos_sections) {
        return error_set(err, DFL_ERR_INVALID,
                         "batch: %lld position sections per entry, the context expects %lld",
                         (long long)b->n_pos_sections, (long long)lim->n_pos_sections);
    }
    for (int64_t i = 0; i < b->n_tokens; i++) {
        dfl_status st = batch_check_kind(b, lim, i, err);
        if (st != DFL_OK) return st;
        st = batch_check_values(b, lim, i, err);
        if (st != DFL_OK) return st;
    }
    /* every position is now consecutive from seq_len; a sequence fits if its last one does */
    for (int64_t i = 0; i < b->n_tokens; i++) {
        const int32_t s = b->seq_id[i];
        const int64_t p = b->pos[i * b->n_pos_sections];
        if (p >= lim->n_ctx) {
            int64_t n_s = 0;
            for (int64_t k = 0; k < b->n_tokens; k++) n_s += b->seq_id[k] == s;
            return error_set(err, DFL_ERR_CTX_FULL,
                             "batch entry %lld: sequence %d would need %lld positions (%lld held + %lld in the batch), "
                             "the context holds %lld per sequence",
                             (long long)i, s, (long long)(lim->seq_len[s] + n_s), (long long)lim->seq_len[s],
                             (long long)n_s, (long long)lim->n_ctx);
        }
    }
    return DFL_OK;
}

int64_t batch_n_outputs(const dfl_batch *b) {
    int64_t n = 0;
    for (int64_t i = 0; i < b->n_tokens; i++) n += b->output[i];
    return n;
}

/* ---- micro-batches ------------------------------------------------------------------------ */

bool batch_split(const dfl_batch *b, int64_t n_ubatch, int64_t *cursor, batch_ubatch *ub) {
    DFL_ASSERT(b != NULL && cursor != NULL && ub != NULL && n_ubatch > 0);
    const int64_t i0 = *cursor;
    if (i0 < 0 || i0 >= b->n_tokens) return false;
    const int64_t n = b->n_tokens - i0 < n_ubatch ? b->n_tokens - i0 : n_ubatch;
    const int64_t ne = b->n_embd;
    ub->i0 = i0;
    ub->n_tokens = n;
    ub->n_embd = ne;
    ub->n_pos_sections = b->n_pos_sections;
    ub->has_embd_rows = b->embd_row[0] >= 0;
    ub->has_states = b->has_state[0];
    ub->token = b->token + i0;
    ub->embd = b->embd != NULL ? b->embd + i0 * ne : NULL;
    ub->has_embd = b->has_embd + i0;
    ub->pos = b->pos + i0 * b->n_pos_sections;
    ub->seq_id = b->seq_id + i0;
    ub->output = b->output + i0;
    ub->embd_row = b->embd_row + i0;
    ub->state = b->state != NULL ? b->state + i0 * ne : NULL;
    *cursor = i0 + n;
    return true;
}
