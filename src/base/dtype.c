/* dtype: names of element types, as safetensors spells them. */
#include "dtype.h"

const char *dtype_name(enum dtype t)
{
    static const char *names[DT_COUNT] = {"F32", "F16", "BF16", "I32"};
    return t < DT_COUNT ? names[t] : "?";
}
