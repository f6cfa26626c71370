/* unicode.c: strict UTF-8 decoding and NFC normalization (UAX #15: canonical decomposition,
 * canonical ordering, canonical composition) over the generated tables of unicode_data.c.
 * Only the stretches around code points that are not NFC-safe are normalized; text made of safe
 * code points (ASCII, most CJK, ...) is passed through untouched. */
#include "unicode.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

utf8_status utf8_decode(const uint8_t *s, size_t n, uint32_t *cp, size_t *len) {
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        *len = 1;
        return UTF8_OK;
    }
    size_t need;      /* continuation bytes */
    uint8_t lo = 0x80, hi = 0xBF; /* range of the second byte (Unicode Table 3-7) */
    uint32_t v;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        v = b0 & 0x1Fu;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        v = b0 & 0x0Fu;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        v = b0 & 0x07u;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *len = 1;
        return UTF8_INVALID;
    }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n) {
            *len = k;
            return UTF8_TRUNCATED;
        }
        uint8_t b = s[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *len = k;
            return UTF8_INVALID;
        }
        v = (v << 6) | (b & 0x3Fu);
    }
    *cp = v;
    *len = need + 1;
    return UTF8_OK;
}

size_t utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the code point at s (well-formed UTF-8 guaranteed by the caller); returns its length. */
static inline size_t utf8_next_valid(const uint8_t *s, uint32_t *cp) {
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    if (b0 < 0xE0) {
        *cp = ((uint32_t)(b0 & 0x1F) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (b0 < 0xF0) {
        *cp = ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    *cp = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
          (s[3] & 0x3Fu);
    return 4;
}

void unicode_nfc_ws_free(unicode_nfc_ws *ws) {
    free(ws->cps);
    free(ws->out);
    memset(ws, 0, sizeof(*ws));
}

uint8_t unicode_ccc_rank(uint32_t cp) {
    size_t lo = 0, hi = unicode_n_ccc;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < unicode_ccc[mid].first) hi = mid;
        else if (cp > unicode_ccc[mid].last) lo = mid + 1;
        else return unicode_ccc[mid].rank;
    }
    return 0;
}

static const unicode_decomp_entry *decomp_find(uint32_t cp) {
    size_t lo = 0, hi = unicode_n_decomp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < unicode_decomp[mid].cp) hi = mid;
        else if (cp > unicode_decomp[mid].cp) lo = mid + 1;
        else return &unicode_decomp[mid];
    }
    return NULL;
}

/* Hangul syllables (algorithmic decomposition and composition, Unicode section 3.12). */
enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
       HANGUL_NL = 19, HANGUL_NV = 21, HANGUL_NT = 28, HANGUL_NS = 19 * 21 * 28 };

/* The primary composite of first + second, or 0 if none. */
static uint32_t compose_pair(uint32_t first, uint32_t second) {
    if (first - HANGUL_L < HANGUL_NL && second - HANGUL_V < HANGUL_NV) {
        return HANGUL_S + ((first - HANGUL_L) * HANGUL_NV + (second - HANGUL_V)) * HANGUL_NT;
    }
    if (first - HANGUL_S < HANGUL_NS && (first - HANGUL_S) % HANGUL_NT == 0 && second - HANGUL_T - 1 < HANGUL_NT - 1) {
        return first + (second - HANGUL_T);
    }
    if (!(unicode_props_of(second) & UNICODE_SECOND)) return 0;
    uint64_t key = ((uint64_t)first << 21) | second;
    size_t lo = 0, hi = unicode_n_comp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (key < unicode_comp[mid].key) hi = mid;
        else if (key > unicode_comp[mid].key) lo = mid + 1;
        else return unicode_comp[mid].composite;
    }
    return 0;
}

bool unicode_nfc_quick(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        i += utf8_next_valid(s + i, &cp);
        if (!(unicode_props_of(cp) & UNICODE_NFC_SAFE)) return false;
    }
    return true;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (q == NULL) return false;
    *p = q;
    *cap = c;
    return true;
}

#define PACK(cp, rank) ((uint32_t)(cp) | ((uint32_t)(rank) << 24))
#define CP_OF(v) ((v) & 0x1FFFFFu)
#define RANK_OF(v) ((v) >> 24)

/* Stable sort of a run of non-starters by combining class rank. */
static void sort_marks(uint32_t *a, size_t n, uint32_t *tmp) {
    if (n <= 32 || tmp == NULL) {
        for (size_t i = 1; i < n; i++) {
            uint32_t v = a[i];
            size_t j = i;
            while (j > 0 && RANK_OF(a[j - 1]) > RANK_OF(v)) {
                a[j] = a[j - 1];
                j--;
            }
            a[j] = v;
        }
        return;
    }
    size_t count[257] = {0}; /* counting sort, stable, O(n) */
    for (size_t i = 0; i < n; i++) count[RANK_OF(a[i]) + 1]++;
    for (size_t r = 1; r < 257; r++) count[r] += count[r - 1];
    for (size_t i = 0; i < n; i++) tmp[count[RANK_OF(a[i])]++] = a[i];
    memcpy(a, tmp, n * sizeof(uint32_t));
}

/* Normalizes one segment s[0..n) into ws->out at *out_len. */
static bool nfc_segment(const uint8_t *s, size_t n, unicode_nfc_ws *ws, size_t *out_len) {
    /* 1. decomposition: at most 4 code points per input code point, the upper half is scratch
     * for sorting long runs of marks. cps: [2 * 4 * n] packed (code point | rank << 24) */
    if (!grow((void **)&ws->cps, &ws->cap_cps, 8 * n + 8, sizeof(uint32_t))) return false;
    uint32_t *d = ws->cps, *tmp = ws->cps + 4 * n + 4;
    size_t nd = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_next_valid(s + i, &cp);
        uint8_t p = unicode_props_of(cp);
        if (cp - HANGUL_S < HANGUL_NS) {
            uint32_t si = cp - HANGUL_S;
            d[nd++] = PACK(HANGUL_L + si / (HANGUL_NV * HANGUL_NT), 0);
            d[nd++] = PACK(HANGUL_V + (si % (HANGUL_NV * HANGUL_NT)) / HANGUL_NT, 0);
            if (si % HANGUL_NT != 0) d[nd++] = PACK(HANGUL_T + si % HANGUL_NT, 0);
        } else if (p & UNICODE_DECOMP) {
            const unicode_decomp_entry *e = decomp_find(cp);
            DFL_ASSERT(e != NULL && e->len <= 4);
            for (uint8_t k = 0; k < e->len; k++) {
                uint32_t c = unicode_decomp_pool[e->off + k];
                d[nd++] = PACK(c, unicode_ccc_rank(c));
            }
        } else {
            d[nd++] = PACK(cp, (p & UNICODE_NFC_SAFE) ? 0 : unicode_ccc_rank(cp));
        }
    }
    /* 2. canonical ordering of each run of non-starters */
    for (size_t i = 0; i < nd;) {
        if (RANK_OF(d[i]) == 0) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < nd && RANK_OF(d[j]) != 0) j++;
        sort_marks(d + i, j - i, tmp);
        i = j;
    }
    /* 3. canonical composition, in place */
    size_t no = 0;
    long starter = -1;
    int last_rank = -1;
    for (size_t i = 0; i < nd; i++) {
        uint32_t v = d[i];
        int r = (int)RANK_OF(v);
        if (starter >= 0 && (last_rank < r || (last_rank == 0 && no - 1 == (size_t)starter))) {
            uint32_t comp = compose_pair(CP_OF(d[starter]), CP_OF(v));
            if (comp != 0) {
                d[starter] = PACK(comp, 0);
                continue;
            }
        }
        if (r == 0) starter = (long)no;
        last_rank = r;
        d[no++] = v;
    }
    /* 4. encode */
    if (!grow((void **)&ws->out, &ws->cap_out, *out_len + 4 * no, 1)) return false;
    for (size_t i = 0; i < no; i++) *out_len += utf8_encode(CP_OF(d[i]), ws->out + *out_len);
    return true;
}

bool unicode_nfc(const uint8_t *s, size_t n, unicode_nfc_ws *ws, const uint8_t **out, size_t *out_len) {
    size_t i = 0, prev = 0; /* prev: start of the code point before i */
    size_t copied = 0, len = 0; /* input bytes consumed, output bytes written */
    bool changed = false;
    while (i < n) {
        if (s[i] < 0x80) {
            prev = i++;
            continue;
        }
        uint32_t cp;
        size_t l = utf8_next_valid(s + i, &cp);
        if (unicode_props_of(cp) & UNICODE_NFC_SAFE) {
            prev = i;
            i += l;
            continue;
        }
        /* an unsafe code point: normalize from the safe code point before it (it may compose
         * with what follows) to the next safe code point */
        size_t start = i > copied ? prev : copied;
        size_t end = i + l;
        while (end < n) {
            if (s[end] < 0x80) break;
            uint32_t c2;
            size_t l2 = utf8_next_valid(s + end, &c2);
            if (unicode_props_of(c2) & UNICODE_NFC_SAFE) break;
            end += l2;
        }
        if (start > copied) {
            if (!grow((void **)&ws->out, &ws->cap_out, len + (start - copied), 1)) return false;
            memcpy(ws->out + len, s + copied, start - copied);
            len += start - copied;
        }
        if (!nfc_segment(s + start, end - start, ws, &len)) return false;
        changed = true;
        copied = end;
        prev = i = end;
    }
    if (!changed) {
        *out = s;
        *out_len = n;
        return true;
    }
    if (n > copied) {
        if (!grow((void **)&ws->out, &ws->cap_out, len + (n - copied), 1)) return false;
        memcpy(ws->out + len, s + copied, n - copied);
        len += n - copied;
    }
    *out = ws->out;
    *out_len = len;
    return true;
}
