/* dtype: element types of stored tensors and their conversions to fp32.
 *
 * BF16 is the upper half of an IEEE binary32; F16 is IEEE binary16
 * (converted exactly, subnormals included). Weights stay in their stored
 * type; every kernel widens to fp32 before it computes. */
#ifndef KP_DTYPE_H
#define KP_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dtype { DT_F32, DT_F16, DT_BF16, DT_I32, DT_COUNT };

static inline size_t dtype_size(enum dtype t)
{
    static const size_t sz[DT_COUNT] = {4, 2, 2, 4};
    return sz[t];
}

const char *dtype_name(enum dtype t);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept quiet: what torch's .to(bfloat16) does. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; overflow to infinity, underflow through subnormals. */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
        float x;
        memcpy(&x, &a, 4);
        /* x * 2^24 rounded to an integer, in the current (nearest-even) mode */
        float scaled = x * 16777216.0f;
        uint32_t r = (uint32_t)scaled;
        float frac = scaled - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t mant = a & 0x7fffffu, exp = (a >> 23) - 112u;
    uint32_t h = (exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

#endif
