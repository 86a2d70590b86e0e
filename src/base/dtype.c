/* dtype: each type's name, GGUF id and block size. */
#define _GNU_SOURCE
#include "dtype.h"

#include <strings.h>

/* GGUF's ids and block sizes: ggml's published type table. */
const struct dtype_traits dtype_traits[DT_COUNT] = {
    [DT_F32] = {"F32", 0, 1, 4},
    [DT_F16] = {"F16", 1, 1, 2},
    [DT_BF16] = {"BF16", 30, 1, 2},
    [DT_I32] = {"I32", 26, 1, 4},
    [DT_F8_E4M3] = {"F8_E4M3", -1, 1, 1}, /* GGUF has no such type */
    [DT_Q4_0] = {"Q4_0", 2, 32, 18},
    [DT_Q4_1] = {"Q4_1", 3, 32, 20},
    [DT_Q5_0] = {"Q5_0", 6, 32, 22},
    [DT_Q5_1] = {"Q5_1", 7, 32, 24},
    [DT_Q8_0] = {"Q8_0", 8, 32, 34},
    [DT_Q2_K] = {"Q2_K", 10, 256, 84},
    [DT_Q3_K] = {"Q3_K", 11, 256, 110},
    [DT_Q4_K] = {"Q4_K", 12, 256, 144},
    [DT_Q5_K] = {"Q5_K", 13, 256, 176},
    [DT_Q6_K] = {"Q6_K", 14, 256, 210},
    [DT_IQ4_NL] = {"IQ4_NL", 20, 32, 18},
    [DT_IQ4_XS] = {"IQ4_XS", 23, 256, 136},
    [DT_IQ2_XXS] = {"IQ2_XXS", 16, 256, 66},
};

const char *dtype_name(enum dtype t) { return (unsigned)t < DT_COUNT ? dtype_traits[t].name : "?"; }

int dtype_from_ggml(int64_t ggml, enum dtype *out)
{
    for (int t = 0; t < DT_COUNT; t++)
        if (dtype_traits[t].ggml == ggml) {
            *out = (enum dtype)t;
            return 0;
        }
    return -1;
}

int dtype_parse(const char *name, enum dtype *out)
{
    for (int t = 0; t < DT_COUNT; t++)
        if (strcasecmp(name, dtype_traits[t].name) == 0) {
            *out = (enum dtype)t;
            return 0;
        }
    return -1;
}
