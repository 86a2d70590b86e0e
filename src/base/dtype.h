/* dtype: element types of stored tensors and their conversions to fp32.
 *
 * BF16 is the upper half of an IEEE binary32; F16 is IEEE binary16
 * (converted exactly, subnormals included); F8_E4M3 is OCP FP8 E4M3
 * (torch.float8_e4m3fn). Weights stay in their stored
 * type; every kernel widens to fp32 before it computes.
 *
 * The block types (Q8_0 ... IQ2_XXS) are GGUF's: a row is a run of blocks,
 * each holding dtype_block(t) elements in dtype_block_bytes(t) bytes (the
 * layouts are in src/quant/blocks.h). A row of such a tensor is a whole number
 * of blocks; sizes and offsets are in bytes through dtype_bytes(). */
#ifndef KP_DTYPE_H
#define KP_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum dtype {
    DT_F32,
    DT_F16,
    DT_BF16,
    DT_I32,
    DT_F8_E4M3, /* FP8 of Hugging Face's FP8 checkpoints: read at load (src/model/fp8.h), never a backend's type */
    DT_N_PLAIN, /* the types above are one element a unit; safetensors stores only these */
    DT_Q4_0 = DT_N_PLAIN,
    DT_Q4_1,
    DT_Q5_0,
    DT_Q5_1,
    DT_Q8_0,
    DT_Q2_K,
    DT_Q3_K,
    DT_Q4_K,
    DT_Q5_K,
    DT_Q6_K,
    DT_IQ4_NL,
    DT_IQ4_XS,
    DT_IQ2_XXS,
    DT_COUNT
};

struct dtype_traits {
    const char *name; /* safetensors' spelling for the plain types, GGUF's for the block types */
    int32_t ggml;     /* GGUF's type id */
    int32_t block;    /* elements a block (1 for plain types) */
    int32_t bytes;    /* bytes a block */
};

extern const struct dtype_traits dtype_traits[DT_COUNT];

static inline bool dtype_is_block(enum dtype t) { return t >= DT_N_PLAIN; }
/* Bytes an element of a plain type. */
static inline size_t dtype_size(enum dtype t)
{
    return (size_t)dtype_traits[t].bytes;
}
static inline int64_t dtype_block(enum dtype t) { return dtype_traits[t].block; }
static inline size_t dtype_block_bytes(enum dtype t) { return (size_t)dtype_traits[t].bytes; }
/* Bytes of n elements (n a multiple of the block for block types). */
static inline size_t dtype_bytes(enum dtype t, int64_t n)
{
    return (size_t)(n / dtype_traits[t].block) * (size_t)dtype_traits[t].bytes;
}

const char *dtype_name(enum dtype t);
/* The type of GGUF type id `ggml`; -1 when it is not one we read. */
int dtype_from_ggml(int64_t ggml, enum dtype *out);
/* The type of a name (dtype_name's spelling, case-insensitive); -1 if none. */
int dtype_parse(const char *name, enum dtype *out);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* FP8 E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (m * 2^-9); no infinities: S.1111.111 is NaN, S.1111.110 is
 * +-448, the largest. Every value is exact in fp32. */
static inline float f8e4m3_to_f32(uint8_t b)
{
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, man = b & 7u;
    uint32_t u;
    if ((b & 0x7fu) == 0x7fu)
        u = sign | 0x7fc00000u;
    else if (exp != 0)
        u = sign | ((exp + 120u) << 23) | (man << 20);
    else {
        const float f = (float)man * (1.0f / 512.0f);
        return sign ? -f : f;
    }
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

#ifdef __cplusplus
}
#endif

#endif
