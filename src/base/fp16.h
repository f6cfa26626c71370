/* fp16.h: IEEE half and bfloat16 conversions (exact, round-to-nearest-even, NaN kept). */
#ifndef DFL_BASE_FP16_H
#define DFL_BASE_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fp32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fp32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return fp32_from_bits(sign);
        /* subnormal: man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) {
        return fp32_from_bits(sign | 0x7f800000u | (man << 13));
    }
    return fp32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t fp32_to_fp16(float f) {
    uint32_t x = fp32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    }
    if (ax >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (113 - e) - 1 ... see derivation: value = m * 2^(e-150) */
        /* half subnormal unit = 2^-24; result = m * 2^(e-150+24) = m >> (126 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u); /* round to nearest even on bit 13 */
    r -= 0x38000000u;                              /* rebias exponent 127 -> 15 */
    return (uint16_t)(sign | (r >> 13));
}

static inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits((uint32_t)h << 16); }

static inline uint16_t fp32_to_bf16(float f) {
    uint32_t x = fp32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
