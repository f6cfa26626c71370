/* test_batch.c: the dfl_batch table, one test per validation rule of docs/batch.md (status and
 * the message naming the entry and the reason), and the in-order micro-batch split. */
#include "test.h"

#include "base/error.h"
#include "batch/batch.h"

#include <math.h>
#include <string.h>

enum { T_N_EMBD = 4, T_N_SEQ = 3 };

/* Limits of a context with n_vocab 100, n_ctx 32, 3 sequences of length seq_len. */
static batch_limits lim_make(const int64_t *seq_len) {
    batch_limits lim;
    memset(&lim, 0, sizeof(lim));
    lim.n_vocab = 100;
    lim.n_embd = T_N_EMBD;
    lim.n_pos_sections = 1;
    lim.n_seq = T_N_SEQ;
    lim.n_ctx = 32;
    lim.n_batch = 16;
    lim.n_rows_available = 8;
    lim.seq_len = seq_len;
    lim.encode_only = false;
    return lim;
}

static const int64_t k_len0[T_N_SEQ] = {0, 0, 0};

/* Validates and expects status `want` with a message containing both needles. */
#define EXPECT_REJECT(b, lim, want, needle1, needle2) \
    do { dfl_error e_; error_clear(&e_); \
         dfl_status st_ = batch_validate((b), (lim), &e_); \
         CHECK_EQ_INT(st_, (want)); CHECK_EQ_INT(e_.code, (want)); \
         CHECK_STR_CONTAINS(e_.msg, (needle1)); CHECK_STR_CONTAINS(e_.msg, (needle2)); } while (0)

#define EXPECT_OK(b, lim) \
    do { dfl_error e_; error_clear(&e_); dfl_status st_ = batch_validate((b), (lim), &e_); \
         CHECK_MSG(st_ == DFL_OK, "expected ok, got %d: %s", (int)st_, e_.msg); } while (0)

static dfl_batch *mk(test_ctx *t, int64_t n_max) {
    dfl_error err;
    error_clear(&err);
    dfl_batch *b = dfl_batch_init(n_max, T_N_EMBD, 1, &err);
    CHECK_MSG(b != NULL, "dfl_batch_init: %s", err.msg);
    return b;
}

static const float k_e[T_N_EMBD] = {0.5f, -1.0f, 2.0f, 0.0f};

TEST(batch_init_and_adders) {
    dfl_error err;
    error_clear(&err);
    CHECK(dfl_batch_init(0, 4, 1, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "n_tokens_max");
    error_clear(&err);
    CHECK(dfl_batch_init(4, -1, 1, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "n_embd");
    error_clear(&err);
    CHECK(dfl_batch_init(4, 4, 3, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "n_pos_sections");

    dfl_batch *b = dfl_batch_init(3, T_N_EMBD, 4, &err);
    REQUIRE(b != NULL);
    const int32_t p0[4] = {5, 5, 5, 0}, p1[4] = {6, 6, 6, 0}, p2[4] = {7, 7, 7, 0};
    CHECK_EQ_INT(dfl_batch_add_token(b, 42, p0, 1, false), 0);
    CHECK_EQ_INT(dfl_batch_add_embd(b, k_e, p1, 1, true), 1);
    CHECK_EQ_INT(dfl_batch_add_token_embd(b, 7, k_e, p2, 1, true), 2);
    CHECK_EQ_INT(dfl_batch_add_token(b, 1, p0, 0, false), -DFL_ERR_CTX_FULL);
    CHECK_EQ_INT(b->n_tokens, 3);
    CHECK_EQ_INT(b->token[0], 42);
    CHECK(!b->has_embd[0]);
    CHECK_EQ_INT(b->token[1], DFL_TOKEN_NULL);
    CHECK(b->has_embd[1]);
    CHECK_EQ_INT(b->token[2], 7);
    CHECK(b->has_embd[2]);
    CHECK(memcmp(b->embd + 2 * T_N_EMBD, k_e, sizeof(k_e)) == 0);
    CHECK(memcmp(b->pos + 2 * 4, p2, sizeof(p2)) == 0);
    CHECK_EQ_INT(b->embd_row[1], -1);
    CHECK_EQ_INT(b->seq_id[2], 1);
    CHECK(b->output[1] && !b->output[0]);
    CHECK_EQ_INT(batch_n_outputs(b), 2);
    CHECK_EQ_INT(dfl_batch_set_state(b, 1, k_e), DFL_OK);
    CHECK(b->has_state[1] && !b->has_state[0]);
    CHECK(memcmp(b->state + T_N_EMBD, k_e, sizeof(k_e)) == 0);
    CHECK_EQ_INT(dfl_batch_set_state(b, 3, k_e), DFL_ERR_INVALID);
    CHECK_EQ_INT(dfl_batch_set_state(b, -1, k_e), DFL_ERR_INVALID);
    dfl_batch_clear(b);
    CHECK_EQ_INT(b->n_tokens, 0);
    CHECK_EQ_INT(dfl_batch_add_embd_row(b, 3, p0, 0, true), 0);
    CHECK_EQ_INT(b->embd_row[0], 3);
    CHECK_EQ_INT(b->token[0], DFL_TOKEN_NULL);
    CHECK(!b->has_embd[0] && !b->has_state[0]); /* cleared entries do not leak old flags */
    CHECK_EQ_INT(dfl_batch_add_embd_row(b, -1, p0, 0, true), -DFL_ERR_INVALID);
    CHECK_EQ_INT(dfl_batch_add_token(b, 1, NULL, 0, true), -DFL_ERR_INVALID);
    CHECK_EQ_INT(dfl_batch_add_embd(b, NULL, p0, 0, true), -DFL_ERR_INVALID);
    dfl_batch_free(b);

    b = dfl_batch_init(2, 0, 1, &err); /* token-only batch: no embedding memory */
    REQUIRE(b != NULL);
    CHECK(b->embd == NULL && b->state == NULL);
    CHECK_EQ_INT(dfl_batch_add_embd(b, k_e, p0, 0, true), -DFL_ERR_INVALID);
    CHECK_EQ_INT(dfl_batch_add_token(b, 3, p0, 0, true), 0);
    CHECK_EQ_INT(dfl_batch_set_state(b, 0, k_e), DFL_ERR_INVALID);
    dfl_batch_free(b);
    dfl_batch_free(NULL);
}

TEST(batch_valid_mixed_interleaved) {
    dfl_batch *b = mk(t, 8);
    REQUIRE(b != NULL);
    const int64_t len[T_N_SEQ] = {3, 0, 10};
    batch_limits lim = lim_make(len);
    int32_t p;
    /* seq 0 continues at 3, seq 2 at 10, seq 1 at 0; interleaved; token, embd and mixed entries */
    p = 3;  dfl_batch_add_token(b, 5, &p, 0, false);
    p = 10; dfl_batch_add_embd(b, k_e, &p, 2, false);
    p = 4;  dfl_batch_add_token_embd(b, 6, k_e, &p, 0, false);
    p = 0;  dfl_batch_add_token(b, 99, &p, 1, true);
    p = 11; dfl_batch_add_token(b, 0, &p, 2, true);
    p = 5;  dfl_batch_add_token(b, 7, &p, 0, true);
    EXPECT_OK(b, &lim);
    dfl_batch_free(b);
}

TEST(batch_reject_empty_and_too_large) {
    dfl_batch *b = mk(t, 20);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "empty", "batch");
    for (int32_t i = 0; i < 17; i++) dfl_batch_add_token(b, 1, &i, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "17 entries", "at most 16");
    lim.n_batch = 0; /* no limit */
    EXPECT_OK(b, &lim);
    dfl_batch_free(b);
}

TEST(batch_reject_neither_token_nor_embd) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_token(b, 1, &p, 0, false);
    p = 1;
    dfl_batch_add_token(b, DFL_TOKEN_NULL, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1:", "neither a token id nor an embedding");
    dfl_batch_free(b);
}

TEST(batch_reject_state_not_on_all) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    for (int32_t i = 0; i < 3; i++) dfl_batch_add_token(b, 1, &i, 0, false);
    dfl_batch_set_state(b, 0, k_e);
    dfl_batch_set_state(b, 1, k_e);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 2:", "states must be on all entries or none");
    dfl_batch_set_state(b, 2, k_e);
    EXPECT_OK(b, &lim);
    b->has_state[0] = false; /* entry 0 has none, entry 1 has one */
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: has a state embedding but entry 0 has none", "");
    dfl_batch_free(b);
}

TEST(batch_reject_embd_row_not_on_all) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_embd_row(b, 0, &p, 0, false);
    p = 1;
    dfl_batch_add_embd_row(b, 1, &p, 0, false);
    EXPECT_OK(b, &lim);
    p = 2;
    dfl_batch_add_token(b, 3, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 2: has no embd row", "all entries or none");
    dfl_batch_clear(b);
    p = 0;
    dfl_batch_add_token(b, 3, &p, 0, false);
    p = 1;
    dfl_batch_add_embd_row(b, 1, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: has an embd row", "all entries or none");
    dfl_batch_free(b);
}

TEST(batch_reject_embd_row_with_token_or_embd) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_embd_row(b, 0, &p, 0, false);
    p = 1;
    dfl_batch_add_embd_row(b, 1, &p, 0, false);
    b->token[1] = 4;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1:", "embd row together with a token id");
    b->token[1] = DFL_TOKEN_NULL;
    b->has_embd[0] = true;
    memcpy(b->embd, k_e, sizeof(k_e));
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 0:", "embd row together with an embedding");
    b->has_embd[0] = false;
    b->embd_row[1] = -3;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: embd row -3 is negative", "");
    dfl_batch_free(b);
}

TEST(batch_reject_embd_row_encode_only) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_embd_row(b, 2, &p, 0, false);
    EXPECT_OK(b, &lim);
    lim.encode_only = true;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 0:", "not accepted by encode-only");
    dfl_batch_clear(b);
    dfl_batch_add_token(b, 2, &p, 0, false); /* a token batch is fine for encode */
    EXPECT_OK(b, &lim);
    dfl_batch_free(b);
}

TEST(batch_reject_token_out_of_range) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_token(b, 99, &p, 0, false);
    p = 1;
    dfl_batch_add_token(b, 100, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1:", "token id 100 is outside [0, 100)");
    b->token[1] = -2;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1:", "token id -2 is outside");
    dfl_batch_free(b);
}

TEST(batch_reject_embd_row_out_of_range) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_embd_row(b, 7, &p, 0, false);
    p = 1;
    dfl_batch_add_embd_row(b, 8, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: embd row 8", "8 rows available");
    lim.n_rows_available = 9;
    EXPECT_OK(b, &lim);
    dfl_batch_free(b);
}

TEST(batch_reject_seq_id_out_of_range) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_token(b, 1, &p, 2, false);
    dfl_batch_add_token(b, 1, &p, 3, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1:", "seq_id 3 is outside [0, 3)");
    b->seq_id[1] = -1;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1:", "seq_id -1");
    dfl_batch_free(b);
}

TEST(batch_reject_negative_position) {
    dfl_error err;
    error_clear(&err);
    dfl_batch *b = dfl_batch_init(4, 0, 4, &err);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    lim.n_pos_sections = 4;
    const int32_t p0[4] = {0, 0, 0, 0}, p1[4] = {1, 1, -1, 0};
    dfl_batch_add_token(b, 1, p0, 0, false);
    dfl_batch_add_token(b, 1, p1, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: position -1 (section 2)", "negative");
    b->pos[1 * 4 + 2] = 1;
    EXPECT_OK(b, &lim);
    b->pos[0] = -5;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 0: position -5 (section 0)", "negative");
    lim.n_pos_sections = 1; /* the batch's sections must match the context's */
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "4 position sections", "expects 1");
    dfl_batch_free(b);
}

TEST(batch_reject_position_gap_or_wrong_start) {
    dfl_batch *b = mk(t, 8);
    REQUIRE(b != NULL);
    const int64_t len[T_N_SEQ] = {5, 2, 0};
    batch_limits lim = lim_make(len);
    int32_t p = 4; /* sequence 0 holds 5 positions: the next one is 5, not 4 */
    dfl_batch_add_token(b, 1, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 0: position 4 does not continue sequence 0",
                  "holds 5 positions: expected 5");
    b->pos[0] = 6; /* a gap at the start */
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 0: position 6", "expected 5");
    b->pos[0] = 5;
    p = 2;
    dfl_batch_add_token(b, 1, &p, 1, false);
    p = 7; /* gap inside sequence 0 (previous entry 0 at 5) */
    dfl_batch_add_token(b, 1, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 2: position 7 of sequence 0 does not follow entry 0 (position 5)",
                  "expected 6");
    b->pos[2] = 5; /* repeated position */
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 2: position 5", "expected 6");
    b->pos[2] = 6;
    EXPECT_OK(b, &lim);
    /* out of order: 6 then... a later entry of seq 0 going back */
    p = 6;
    dfl_batch_add_token(b, 1, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 3:", "expected 7");
    dfl_batch_free(b);
}

TEST(batch_reject_context_full) {
    dfl_batch *b = mk(t, 8);
    REQUIRE(b != NULL);
    const int64_t len[T_N_SEQ] = {0, 29, 0};
    batch_limits lim = lim_make(len);
    int32_t p;
    p = 0; dfl_batch_add_token(b, 1, &p, 0, false);
    p = 29; dfl_batch_add_token(b, 1, &p, 1, false);
    p = 30; dfl_batch_add_token(b, 1, &p, 1, false);
    p = 31; dfl_batch_add_token(b, 1, &p, 1, false);
    EXPECT_OK(b, &lim); /* exactly fills n_ctx = 32 */
    p = 32; dfl_batch_add_token(b, 1, &p, 1, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_CTX_FULL, "entry 4: sequence 1 would need 33 positions (29 held + 4 in the batch)",
                  "holds 32 per sequence");
    /* an invalid entry after the overflow is reported first: nothing is judged "full" when
     * the batch is invalid anyway */
    p = 1; dfl_batch_add_token(b, 500, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 5:", "token id 500");
    dfl_batch_free(b);
}

TEST(batch_reject_nonfinite_embd) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    float e[T_N_EMBD] = {1, 2, 3, 4};
    int32_t p = 0;
    dfl_batch_add_embd(b, e, &p, 0, false);
    e[2] = NAN;
    p = 1;
    dfl_batch_add_embd(b, e, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: embedding value 2", "not finite");
    b->embd[1 * T_N_EMBD + 2] = 0.0f;
    b->embd[1 * T_N_EMBD + 3] = INFINITY;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: embedding value 3", "inf");
    b->embd[1 * T_N_EMBD + 3] = 1.0f;
    EXPECT_OK(b, &lim);
    e[2] = -INFINITY;
    dfl_batch_set_state(b, 0, k_e);
    dfl_batch_set_state(b, 1, e);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: state embedding value 2", "not finite");
    dfl_batch_free(b);
}

TEST(batch_reject_embd_width) {
    dfl_error err;
    error_clear(&err);
    dfl_batch *b = dfl_batch_init(4, 3, 1, &err);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_token(b, 4, &p, 0, false);
    EXPECT_OK(b, &lim); /* width only matters once an embedding is present */
    p = 1;
    dfl_batch_add_embd(b, k_e, &p, 0, false);
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: carries an embedding of 3 floats", "expects 4");
    lim.n_embd = 0;
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1: carries an embedding", "takes none");
    dfl_batch_free(b);
}

TEST(batch_validate_changes_nothing) {
    dfl_batch *b = mk(t, 4);
    REQUIRE(b != NULL);
    batch_limits lim = lim_make(k_len0);
    int32_t p = 0;
    dfl_batch_add_token_embd(b, 3, k_e, &p, 0, true);
    p = 2;
    dfl_batch_add_token(b, 3, &p, 0, true);
    /* snapshot the used part of the table; validation (failing) must leave it untouched */
    int32_t tok[2], pos[2], seq[2], row[2];
    float emb[2 * T_N_EMBD];
    memcpy(tok, b->token, sizeof(tok));
    memcpy(pos, b->pos, sizeof(pos));
    memcpy(seq, b->seq_id, sizeof(seq));
    memcpy(row, b->embd_row, sizeof(row));
    memcpy(emb, b->embd, sizeof(emb));
    EXPECT_REJECT(b, &lim, DFL_ERR_INVALID, "entry 1:", "expected 1");
    CHECK_EQ_INT(b->n_tokens, 2);
    CHECK(memcmp(tok, b->token, sizeof(tok)) == 0 && memcmp(pos, b->pos, sizeof(pos)) == 0);
    CHECK(memcmp(seq, b->seq_id, sizeof(seq)) == 0 && memcmp(row, b->embd_row, sizeof(row)) == 0);
    CHECK(memcmp(emb, b->embd, sizeof(emb)) == 0);
    /* the first error wins: a pre-set error is not overwritten */
    dfl_error e;
    error_clear(&e);
    error_set(&e, DFL_ERR_IO, "earlier");
    CHECK_EQ_INT(batch_validate(b, &lim, &e), DFL_ERR_INVALID);
    CHECK_EQ_INT(e.code, DFL_ERR_IO);
    dfl_batch_free(b);
}

TEST(batch_split_in_order) {
    dfl_batch *b = mk(t, 16);
    REQUIRE(b != NULL);
    for (int32_t i = 0; i < 11; i++) {
        const int32_t s = i % 2;
        const int32_t p = i / 2;
        REQUIRE(dfl_batch_add_token_embd(b, 100 + i, k_e, &p, s, i % 3 == 0) == i);
        b->embd[i * T_N_EMBD] = (float)i;
    }
    const int64_t sizes[] = {1, 3, 4, 11, 64};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        const int64_t nu = sizes[k];
        int64_t cur = 0, n_seen = 0, n_ub = 0;
        batch_ubatch ub;
        while (batch_split(b, nu, &cur, &ub)) {
            CHECK_EQ_INT(ub.i0, n_seen);
            CHECK(ub.n_tokens >= 1 && ub.n_tokens <= nu);
            /* every range but the last is full */
            if (ub.i0 + ub.n_tokens < b->n_tokens) CHECK_EQ_INT(ub.n_tokens, nu);
            for (int64_t j = 0; j < ub.n_tokens; j++) {
                const int64_t i = ub.i0 + j;
                CHECK_EQ_INT(ub.token[j], 100 + i);
                CHECK_EQ_INT(ub.seq_id[j], i % 2);
                CHECK_EQ_INT(ub.pos[j], i / 2);
                CHECK_EQ_INT(ub.output[j], i % 3 == 0);
                CHECK(ub.has_embd[j]);
                CHECK_NEAR(ub.embd[j * ub.n_embd], (double)i, 0);
                CHECK_EQ_INT(ub.embd_row[j], -1);
            }
            CHECK(!ub.has_embd_rows && !ub.has_states);
            n_seen += ub.n_tokens;
            n_ub++;
        }
        CHECK_EQ_INT(n_seen, 11);
        CHECK_EQ_INT(n_ub, (11 + nu - 1) / nu);
        CHECK_EQ_INT(cur, 11);
        CHECK(!batch_split(b, nu, &cur, &ub)); /* stays exhausted */
    }
    /* multi-section positions and embd rows travel with their entries */
    dfl_error err;
    error_clear(&err);
    dfl_batch *r = dfl_batch_init(5, 0, 4, &err);
    REQUIRE(r != NULL);
    for (int32_t i = 0; i < 5; i++) {
        const int32_t p[4] = {i, i + 10, i + 20, i + 30};
        dfl_batch_add_embd_row(r, 4 - i, p, 0, false);
    }
    int64_t cur = 0;
    batch_ubatch ub;
    REQUIRE(batch_split(r, 2, &cur, &ub));
    REQUIRE(batch_split(r, 2, &cur, &ub));
    CHECK_EQ_INT(ub.i0, 2);
    CHECK(ub.has_embd_rows && ub.embd == NULL);
    CHECK_EQ_INT(ub.embd_row[1], 1);
    CHECK_EQ_INT(ub.pos[1 * 4 + 2], 23);
    REQUIRE(batch_split(r, 2, &cur, &ub));
    CHECK_EQ_INT(ub.n_tokens, 1);
    CHECK(!batch_split(r, 2, &cur, &ub));
    dfl_batch_clear(r); /* an empty batch yields no micro-batch */
    cur = 0;
    CHECK(!batch_split(r, 2, &cur, &ub));
    dfl_batch_free(r);
    dfl_batch_free(b);
}
