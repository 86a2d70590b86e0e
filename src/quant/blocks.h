/* blocks: the byte layouts of GGUF's block types, one header for every
 * backend (the cpu's kernels, the cuda ones) and for the reference code in
 * quant.c. ggml's published format is the specification: a block holds
 * QK (32) or QK_K (256) consecutive elements of a row; f16 fields are IEEE
 * binary16 bit patterns; everything is little-endian and unpadded. */
#ifndef KP_BLOCKS_H
#define KP_BLOCKS_H

#include <stdint.h>

#define QK 32    /* elements of a Q4_0 .. Q8_0 / IQ4_NL block */
#define QK_K 256 /* elements of a K-quant / IQ4_XS / IQ2_XXS super-block */

/* x = d * (q - 8), q the low nibbles for elements 0-15, the high for 16-31 */
struct block_q4_0 {
    uint16_t d;
    uint8_t qs[QK / 2];
};
/* x = d * q + m */
struct block_q4_1 {
    uint16_t d, m;
    uint8_t qs[QK / 2];
};
/* x = d * (q - 16), q's fifth bit j in bit j of qh (little-endian u32) */
struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
struct block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
/* x = d * q */
struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK];
};
/* 16 groups of 16: x = d * (sc & 15) * q - dmin * (sc >> 4), q 2-bit */
struct block_q2_k {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d, dmin;
};
/* 16 groups of 16: x = d * (s - 32) * (q - 4 * !hbit), s 6-bit packed in 12 bytes */
struct block_q3_k {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
/* 8 groups of 32: x = d * s * q - dmin * m, s and m 6-bit packed in 12 bytes */
struct block_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
struct block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
/* 16 groups of 16: x = d * s * (q - 32), q 6-bit (4 in ql, 2 in qh), s int8 */
struct block_q6_k {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
/* x = d * kvalues_iq4nl[q] */
struct block_iq4_nl {
    uint16_t d;
    uint8_t qs[QK / 2];
};
/* 8 groups of 32: x = d * (s - 32) * kvalues_iq4nl[q], s 6-bit (4 in scales_l, 2 in scales_h) */
struct block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};
/* 8 groups of 32, each two u32: four 8-bit indices into iq2xxs_grid (8
 * magnitudes each), then four 7-bit sign indices and a 4-bit scale s:
 * x = d * (0.5 + s) / 4 * grid * sign */
struct block_iq2_xxs {
    uint16_t d;
    uint16_t qs[QK_K / 8];
};

/* Scale and min of group j (of 8) of a Q4_K / Q5_K block's 12 scale bytes:
 * groups 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); groups
 * 4-7 in the nibbles of bytes 8-11 with their top two bits in the spare top
 * bits of bytes 0-7. */
static inline void block_k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Signed scale of group j (of 16) of a Q3_K block's 12 scale bytes: low
 * nibbles in bytes 0-7 (groups 0-7 low, 8-15 high), the top two bits of
 * group j at bit 2(j/4) of byte 8 + j%4, stored biased by 32. */
static inline int block_q3_k_scale(const uint8_t *s, int j)
{
    const int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

#ifndef __cplusplus
_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(struct block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(struct block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(struct block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(struct block_q2_k) == 84, "q2_k");
_Static_assert(sizeof(struct block_q3_k) == 110, "q3_k");
_Static_assert(sizeof(struct block_q4_k) == 144, "q4_k");
_Static_assert(sizeof(struct block_q5_k) == 176, "q5_k");
_Static_assert(sizeof(struct block_q6_k) == 210, "q6_k");
_Static_assert(sizeof(struct block_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(struct block_iq4_xs) == 136, "iq4_xs");
_Static_assert(sizeof(struct block_iq2_xxs) == 66, "iq2_xxs");
#endif

#endif
