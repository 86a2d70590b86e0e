/* quant: reference dequantisation and quantisation of GGUF's block types
 * (see quant.h). The dequantisers follow ggml's published definitions
 * element by element; the quantisers are this project's own. */
#include "quant.h"

#include "../base/err.h"
#include "blocks.h"
#include "iq_tables.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* ---- dequantisation ---- */

static void dq_q4_0(const struct block_q4_0 *b, float *y)
{
    const float d = f16_to_f32(b->d);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((b->qs[j] & 15) - 8) * d;
        y[j + QK / 2] = (float)((b->qs[j] >> 4) - 8) * d;
    }
}

static void dq_q4_1(const struct block_q4_1 *b, float *y)
{
    const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(b->qs[j] & 15) * d + m;
        y[j + QK / 2] = (float)(b->qs[j] >> 4) * d + m;
    }
}

static uint32_t load_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void dq_q5_0(const struct block_q5_0 *b, float *y)
{
    const float d = f16_to_f32(b->d);
    const uint32_t qh = load_u32(b->qh);
    for (int j = 0; j < QK / 2; j++) {
        const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)(((b->qs[j] & 15) | h0) - 16) * d;
        y[j + QK / 2] = (float)(((b->qs[j] >> 4) | h1) - 16) * d;
    }
}

static void dq_q5_1(const struct block_q5_1 *b, float *y)
{
    const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
    const uint32_t qh = load_u32(b->qh);
    for (int j = 0; j < QK / 2; j++) {
        const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = (float)((b->qs[j] & 15) | h0) * d + m;
        y[j + QK / 2] = (float)((b->qs[j] >> 4) | h1) * d + m;
    }
}

static void dq_q8_0(const struct block_q8_0 *b, float *y)
{
    const float d = f16_to_f32(b->d);
    for (int j = 0; j < QK; j++)
        y[j] = (float)b->qs[j] * d;
}

static void dq_q2_k(const struct block_q2_k *b, float *y)
{
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int e = 0; e < QK_K; e++) {
        const int c = e / 128, r = e % 128, sc = b->scales[e / 16];
        const int q = (b->qs[32 * c + r % 32] >> (2 * (r / 32))) & 3;
        y[e] = d * (float)(sc & 15) * (float)q - dmin * (float)(sc >> 4);
    }
}

static void dq_q3_k(const struct block_q3_k *b, float *y)
{
    const float d = f16_to_f32(b->d);
    for (int e = 0; e < QK_K; e++) {
        const int c = e / 128, r = e % 128, j = r / 32, l = r % 32;
        const int q = (b->qs[32 * c + l] >> (2 * j)) & 3;
        const int h = (b->hmask[l] >> (4 * c + j)) & 1;
        y[e] = d * (float)block_q3_k_scale(b->scales, e / 16) * (float)(q - (h ? 0 : 4));
    }
}

static void dq_q4_k(const struct block_q4_k *b, float *y)
{
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int g = 0; g < 8; g++) {
        int sc, m;
        block_k4_scale_min(b->scales, g, &sc, &m);
        const uint8_t *q = b->qs + 32 * (g / 2);
        for (int l = 0; l < 32; l++)
            y[32 * g + l] = d * (float)sc * (float)(g % 2 ? q[l] >> 4 : q[l] & 15) - dmin * (float)m;
    }
}

static void dq_q5_k(const struct block_q5_k *b, float *y)
{
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int g = 0; g < 8; g++) {
        int sc, m;
        block_k4_scale_min(b->scales, g, &sc, &m);
        const uint8_t *q = b->qs + 32 * (g / 2);
        for (int l = 0; l < 32; l++) {
            const int lo = g % 2 ? q[l] >> 4 : q[l] & 15, hi = (b->qh[l] >> g) & 1;
            y[32 * g + l] = d * (float)sc * (float)(lo | hi << 4) - dmin * (float)m;
        }
    }
}

static void dq_q6_k(const struct block_q6_k *b, float *y)
{
    const float d = f16_to_f32(b->d);
    for (int e = 0; e < QK_K; e++) {
        const int c = e / 128, r = e % 128, k = r / 32, l = r % 32;
        const uint8_t ql = b->ql[64 * c + l + 32 * (k & 1)];
        const int lo = k < 2 ? ql & 15 : ql >> 4, hi = (b->qh[32 * c + l] >> (2 * k)) & 3;
        y[e] = d * (float)b->scales[e / 16] * (float)((lo | hi << 4) - 32);
    }
}

static void dq_iq4_nl(const struct block_iq4_nl *b, float *y)
{
    const float d = f16_to_f32(b->d);
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)kvalues_iq4nl[b->qs[j] & 15];
        y[j + QK / 2] = d * (float)kvalues_iq4nl[b->qs[j] >> 4];
    }
}

static void dq_iq4_xs(const struct block_iq4_xs *b, float *y)
{
    const float d = f16_to_f32(b->d);
    for (int g = 0; g < 8; g++) {
        const int ls = ((b->scales_l[g / 2] >> (4 * (g % 2))) & 15) | ((b->scales_h >> (2 * g)) & 3) << 4;
        const float dl = d * (float)(ls - 32);
        const uint8_t *q = b->qs + 16 * g;
        for (int j = 0; j < 16; j++) {
            y[32 * g + j] = dl * (float)kvalues_iq4nl[q[j] & 15];
            y[32 * g + j + 16] = dl * (float)kvalues_iq4nl[q[j] >> 4];
        }
    }
}

static void dq_iq2_xxs(const struct block_iq2_xxs *b, float *y)
{
    const float d = f16_to_f32(b->d);
    for (int g = 0; g < 8; g++) {
        const uint8_t *p = (const uint8_t *)(b->qs + 4 * g);
        const uint32_t idx = load_u32(p), sg = load_u32(p + 4);
        const float db = d * (0.5f + (float)(sg >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const uint64_t grid = iq2xxs_grid[(idx >> (8 * l)) & 255];
            const uint8_t signs = ksigns_iq2xs[(sg >> (7 * l)) & 127];
            for (int j = 0; j < 8; j++) {
                const float v = db * (float)((grid >> (8 * j)) & 255);
                y[32 * g + 8 * l + j] = signs >> j & 1 ? -v : v;
            }
        }
    }
}

void quant_dequant(enum dtype t, const void *src, int64_t n, float *dst)
{
    const uint8_t *p = src;
    const int64_t blk = dtype_block(t);
    const size_t bb = dtype_block_bytes(t);
    for (int64_t i = 0; i < n / blk; i++, p += bb, dst += blk)
        switch (t) {
        case DT_F32: memcpy(dst, p, 4); break;
        case DT_F16: dst[0] = f16_to_f32((uint16_t)(p[0] | p[1] << 8)); break;
        case DT_BF16: dst[0] = bf16_to_f32((uint16_t)(p[0] | p[1] << 8)); break;
        case DT_I32: dst[0] = (float)(int32_t)load_u32(p); break;
        case DT_F8_E4M3: dst[0] = f8e4m3_to_f32(p[0]); break;
        case DT_Q4_0: dq_q4_0((const void *)p, dst); break;
        case DT_Q4_1: dq_q4_1((const void *)p, dst); break;
        case DT_Q5_0: dq_q5_0((const void *)p, dst); break;
        case DT_Q5_1: dq_q5_1((const void *)p, dst); break;
        case DT_Q8_0: dq_q8_0((const void *)p, dst); break;
        case DT_Q2_K: dq_q2_k((const void *)p, dst); break;
        case DT_Q3_K: dq_q3_k((const void *)p, dst); break;
        case DT_Q4_K: dq_q4_k((const void *)p, dst); break;
        case DT_Q5_K: dq_q5_k((const void *)p, dst); break;
        case DT_Q6_K: dq_q6_k((const void *)p, dst); break;
        case DT_IQ4_NL: dq_iq4_nl((const void *)p, dst); break;
        case DT_IQ4_XS: dq_iq4_xs((const void *)p, dst); break;
        case DT_IQ2_XXS: dq_iq2_xxs((const void *)p, dst); break;
        case DT_COUNT: break;
        }
}

/* ---- quantisation: ggml's reference for the simple types ---- */

static float amax_signed(const float *x, int n, float *amax)
{
    float m = 0, a = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > a) {
            a = fabsf(x[j]);
            m = x[j];
        }
    *amax = a;
    return m;
}

static void q_q4_0(const float *x, struct block_q4_0 *b)
{
    float a;
    const float d = amax_signed(x, QK, &a) / -8, id = d ? 1.0f / d : 0.0f;
    b->d = f32_to_f16(d);
    for (int j = 0; j < QK / 2; j++) {
        const int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + QK / 2] * id + 8.5f);
        b->qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
    }
}

static void minmax(const float *x, int n, float *lo, float *hi)
{
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int j = 0; j < n; j++) {
        *lo = x[j] < *lo ? x[j] : *lo;
        *hi = x[j] > *hi ? x[j] : *hi;
    }
}

static void q_q4_1(const float *x, struct block_q4_1 *b)
{
    float lo, hi;
    minmax(x, QK, &lo, &hi);
    const float d = (hi - lo) / 15, id = d ? 1.0f / d : 0.0f;
    b->d = f32_to_f16(d);
    b->m = f32_to_f16(lo);
    for (int j = 0; j < QK / 2; j++) {
        const int q0 = (int)((x[j] - lo) * id + 0.5f), q1 = (int)((x[j + QK / 2] - lo) * id + 0.5f);
        b->qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
    }
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void q_q5_0(const float *x, struct block_q5_0 *b)
{
    float a;
    const float d = amax_signed(x, QK, &a) / -16, id = d ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    b->d = f32_to_f16(d);
    for (int j = 0; j < QK / 2; j++) {
        int q0 = (int)(x[j] * id + 16.5f), q1 = (int)(x[j + QK / 2] * id + 16.5f);
        q0 = q0 < 31 ? q0 : 31;
        q1 = q1 < 31 ? q1 : 31;
        b->qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
        qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
    }
    put_u32(b->qh, qh);
}

static void q_q5_1(const float *x, struct block_q5_1 *b)
{
    float lo, hi;
    minmax(x, QK, &lo, &hi);
    const float d = (hi - lo) / 31, id = d ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    b->d = f32_to_f16(d);
    b->m = f32_to_f16(lo);
    for (int j = 0; j < QK / 2; j++) {
        const int q0 = (int)((x[j] - lo) * id + 0.5f), q1 = (int)((x[j + QK / 2] - lo) * id + 0.5f);
        b->qs[j] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
        qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
    }
    put_u32(b->qh, qh);
}

static void q_q8_0(const float *x, struct block_q8_0 *b)
{
    float a;
    amax_signed(x, QK, &a);
    const float d = a / 127, id = d ? 1.0f / d : 0.0f;
    b->d = f32_to_f16(d);
    for (int j = 0; j < QK; j++)
        b->qs[j] = (int8_t)roundf(x[j] * id);
}

/* ---- quantisation: fitted scales ---- */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Symmetric: x ~ s * L, L in [-nmax, nmax - 1]. Tries scales around the one
 * that maps the largest |x| to -nmax and keeps the least-squares s of the
 * best integer assignment. Returns s; L receives the integers. */
static float fit_sym(const float *x, const float *w, int n, int nmax, int8_t *L)
{
    float a;
    const float mx = amax_signed(x, n, &a);
    if (a < 1e-30f) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    float best = -1, scale = 0;
    int8_t tmp[QK_K];
    for (int is = -9; is <= 9; is++) {
        const float iscale = -((float)nmax + 0.1f * (float)is) / mx;
        float sxl = 0, sll = 0;
        for (int j = 0; j < n; j++) {
            const int l = clampi((int)lrintf(iscale * x[j]), -nmax, nmax - 1);
            tmp[j] = (int8_t)l;
            sxl += w[j] * x[j] * (float)l;
            sll += w[j] * (float)l * (float)l;
        }
        if (sll > 0 && sxl * sxl / sll > best) {
            best = sxl * sxl / sll;
            scale = sxl / sll;
            memcpy(L, tmp, (size_t)n);
        }
    }
    return scale;
}

/* With a min: x ~ s * L - m, L in [0, nmax], m >= 0. Tries a range of
 * scales over [min(x, 0), max(x)], solves the weighted least squares for
 * (s, m) of each integer assignment, keeps the smallest error. */
static float fit_asym(const float *x, const float *w, int n, int nmax, uint8_t *L, float *m_out)
{
    float lo, hi;
    minmax(x, n, &lo, &hi);
    lo = lo < 0 ? lo : 0;
    if (hi <= lo) {
        memset(L, 0, (size_t)n);
        *m_out = -lo;
        return 0;
    }
    float best = INFINITY, scale = 0, mn = lo;
    uint8_t tmp[QK_K];
    for (int is = 0; is <= 20; is++) {
        const float iscale = ((float)nmax - 1.0f + 0.1f * (float)is) / (hi - lo);
        float sw = 0, sl = 0, sll = 0, sx = 0, slx = 0;
        for (int j = 0; j < n; j++) {
            const int l = clampi((int)lrintf(iscale * (x[j] - lo)), 0, nmax);
            tmp[j] = (uint8_t)l;
            sw += w[j];
            sl += w[j] * (float)l;
            sll += w[j] * (float)l * (float)l;
            sx += w[j] * x[j];
            slx += w[j] * (float)l * x[j];
        }
        const float det = sw * sll - sl * sl;
        if (det <= 0)
            continue;
        float s = (sw * slx - sl * sx) / det, b = (sll * sx - sl * slx) / det;
        if (b > 0) { /* the offset must be a subtracted min >= 0 */
            b = 0;
            s = slx / sll;
        }
        float err = 0;
        for (int j = 0; j < n; j++) {
            const float e = s * (float)tmp[j] + b - x[j];
            err += w[j] * e * e;
        }
        if (err < best) {
            best = err;
            scale = s;
            mn = b;
            memcpy(L, tmp, (size_t)n);
        }
    }
    *m_out = -mn;
    return scale;
}

static void weights_of(const float *x, const float *imp, int n, float *w)
{
    float s2 = 0;
    for (int j = 0; j < n; j++)
        s2 += x[j] * x[j];
    const float sigma = s2 / (float)n;
    for (int j = 0; j < n; j++)
        w[j] = imp ? imp[j] * sqrtf(sigma + x[j] * x[j]) : sigma + x[j] * x[j];
}

/* A super-block's group scales as integers of n bits (unsigned, or signed
 * in [-2^(bits-1), 2^(bits-1))), and the f16 scale they multiply. */
static float quantize_scales(const float *s, int n, int bits, bool sgn, int *q)
{
    float a;
    const float mx = amax_signed(s, n, &a);
    const int top = sgn ? 1 << (bits - 1) : (1 << bits) - 1;
    float d = sgn ? mx / -(float)top : a / (float)top;
    d = f16_to_f32(f32_to_f16(d));
    for (int j = 0; j < n; j++)
        q[j] = d ? clampi((int)lrintf(s[j] / d), sgn ? -top : 0, sgn ? top - 1 : top) : 0;
    return d;
}

static void q_q2_k(const float *x, const float *imp, struct block_q2_k *b)
{
    float w[QK_K], s[16], m[16];
    uint8_t L[QK_K];
    int qs[16], qm[16];
    weights_of(x, imp, QK_K, w);
    for (int g = 0; g < 16; g++)
        s[g] = fit_asym(x + 16 * g, w + 16 * g, 16, 3, L + 16 * g, &m[g]);
    const float d = quantize_scales(s, 16, 4, false, qs), dm = quantize_scales(m, 16, 4, false, qm);
    b->d = f32_to_f16(d);
    b->dmin = f32_to_f16(dm);
    memset(b->qs, 0, sizeof b->qs);
    for (int g = 0; g < 16; g++) {
        b->scales[g] = (uint8_t)(qs[g] | qm[g] << 4);
        const float dl = d * (float)qs[g], ml = dm * (float)qm[g];
        for (int j = 0; j < 16; j++) {
            const int e = 16 * g + j, l = dl ? clampi((int)lrintf((x[e] + ml) / dl), 0, 3) : 0;
            b->qs[32 * (e / 128) + e % 32] |= (uint8_t)(l << (2 * ((e % 128) / 32)));
        }
    }
}

static void q_q3_k(const float *x, const float *imp, struct block_q3_k *b)
{
    float w[QK_K], s[16];
    int8_t L[QK_K];
    int qs[16];
    weights_of(x, imp, QK_K, w);
    for (int g = 0; g < 16; g++)
        s[g] = fit_sym(x + 16 * g, w + 16 * g, 16, 4, L + 16 * g);
    const float d = quantize_scales(s, 16, 6, true, qs);
    b->d = f32_to_f16(d);
    memset(b->scales, 0, sizeof b->scales);
    memset(b->qs, 0, sizeof b->qs);
    memset(b->hmask, 0, sizeof b->hmask);
    for (int g = 0; g < 16; g++) {
        const int v = qs[g] + 32;
        b->scales[g % 8] |= (uint8_t)((v & 15) << (g < 8 ? 0 : 4));
        b->scales[8 + g % 4] |= (uint8_t)((v >> 4) << (2 * (g / 4)));
        const float dl = d * (float)qs[g];
        for (int j = 0; j < 16; j++) {
            const int e = 16 * g + j, l = (dl ? clampi((int)lrintf(x[e] / dl), -4, 3) : 0) + 4;
            const int c = e / 128, r = e % 128;
            b->qs[32 * c + r % 32] |= (uint8_t)((l & 3) << (2 * (r / 32)));
            b->hmask[r % 32] |= (uint8_t)((l >> 2) << (4 * c + r / 32));
        }
    }
}

/* Q4_K / Q5_K: 8 groups of 32 with a 6-bit scale and min each. */
static void q_k4(const float *x, const float *imp, int nmax, uint16_t *d_out, uint16_t *dmin_out, uint8_t *scales,
                 uint8_t *L)
{
    float w[QK_K], s[8], m[8];
    int qs[8], qm[8];
    weights_of(x, imp, QK_K, w);
    for (int g = 0; g < 8; g++)
        s[g] = fit_asym(x + 32 * g, w + 32 * g, 32, nmax, L + 32 * g, &m[g]);
    const float d = quantize_scales(s, 8, 6, false, qs), dm = quantize_scales(m, 8, 6, false, qm);
    *d_out = f32_to_f16(d);
    *dmin_out = f32_to_f16(dm);
    for (int g = 0; g < 8; g++) {
        if (g < 4) {
            scales[g] = (uint8_t)qs[g];
            scales[g + 4] = (uint8_t)qm[g];
        } else {
            scales[g + 4] = (uint8_t)((qs[g] & 15) | (qm[g] & 15) << 4);
            scales[g - 4] |= (uint8_t)((qs[g] >> 4) << 6);
            scales[g] |= (uint8_t)((qm[g] >> 4) << 6);
        }
        const float dl = d * (float)qs[g], ml = dm * (float)qm[g];
        for (int j = 0; j < 32; j++)
            L[32 * g + j] = (uint8_t)(dl ? clampi((int)lrintf((x[32 * g + j] + ml) / dl), 0, nmax) : 0);
    }
}

static void q_q4_k(const float *x, const float *imp, struct block_q4_k *b)
{
    uint8_t L[QK_K];
    q_k4(x, imp, 15, &b->d, &b->dmin, b->scales, L);
    for (int e = 0; e < QK_K; e++)
        if ((e / 32) % 2 == 0)
            b->qs[32 * (e / 64) + e % 32] = (uint8_t)(L[e] | L[e + 32] << 4);
}

static void q_q5_k(const float *x, const float *imp, struct block_q5_k *b)
{
    uint8_t L[QK_K];
    q_k4(x, imp, 31, &b->d, &b->dmin, b->scales, L);
    memset(b->qh, 0, sizeof b->qh);
    for (int e = 0; e < QK_K; e++) {
        if ((e / 32) % 2 == 0)
            b->qs[32 * (e / 64) + e % 32] = (uint8_t)((L[e] & 15) | (L[e + 32] & 15) << 4);
        b->qh[e % 32] |= (uint8_t)((L[e] >> 4) << (e / 32));
    }
}

static void q_q6_k(const float *x, const float *imp, struct block_q6_k *b)
{
    float w[QK_K], s[16];
    int8_t L[QK_K];
    int qs[16];
    weights_of(x, imp, QK_K, w);
    for (int g = 0; g < 16; g++)
        s[g] = fit_sym(x + 16 * g, w + 16 * g, 16, 32, L + 16 * g);
    const float d = quantize_scales(s, 16, 8, true, qs);
    b->d = f32_to_f16(d);
    memset(b->qh, 0, sizeof b->qh);
    memset(b->ql, 0, sizeof b->ql);
    for (int g = 0; g < 16; g++) {
        b->scales[g] = (int8_t)qs[g];
        const float dl = d * (float)qs[g];
        for (int j = 0; j < 16; j++) {
            const int e = 16 * g + j, l = (dl ? clampi((int)lrintf(x[e] / dl), -32, 31) : 0) + 32;
            const int c = e / 128, r = e % 128, k = r / 32, i = r % 32;
            b->ql[64 * c + i + 32 * (k & 1)] |= (uint8_t)((l & 15) << (k < 2 ? 0 : 4));
            b->qh[32 * c + i] |= (uint8_t)((l >> 4) << (2 * k));
        }
    }
}

static int iq4_index(float v)
{
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (fabsf(v - (float)kvalues_iq4nl[i]) < fabsf(v - (float)kvalues_iq4nl[best]))
            best = i;
    return best;
}

/* A group's scale for the non-linear 4-bit values, by the same search as fit_sym. */
static float fit_iq4(const float *x, const float *w, int n)
{
    float a;
    const float mx = amax_signed(x, n, &a);
    if (a < 1e-30f)
        return 0;
    float best = -1, scale = 0;
    for (int is = -9; is <= 9; is++) {
        const float iscale = ((float)kvalues_iq4nl[0] + 0.1f * (float)is * 8) / mx;
        float sxl = 0, sll = 0;
        for (int j = 0; j < n; j++) {
            const float l = (float)kvalues_iq4nl[iq4_index(iscale * x[j])];
            sxl += w[j] * x[j] * l;
            sll += w[j] * l * l;
        }
        if (sll > 0 && sxl * sxl / sll > best) {
            best = sxl * sxl / sll;
            scale = sxl / sll;
        }
    }
    return scale;
}

static void q_iq4_nl(const float *x, const float *imp, struct block_iq4_nl *b)
{
    float w[QK];
    weights_of(x, imp, QK, w);
    const float d = f16_to_f32(f32_to_f16(fit_iq4(x, w, QK))), id = d ? 1.0f / d : 0.0f;
    b->d = f32_to_f16(d);
    for (int j = 0; j < QK / 2; j++)
        b->qs[j] = (uint8_t)(iq4_index(x[j] * id) | iq4_index(x[j + QK / 2] * id) << 4);
}

static void q_iq4_xs(const float *x, const float *imp, struct block_iq4_xs *b)
{
    float w[QK_K], s[8];
    int qs[8];
    weights_of(x, imp, QK_K, w);
    for (int g = 0; g < 8; g++)
        s[g] = fit_iq4(x + 32 * g, w + 32 * g, 32);
    const float d = quantize_scales(s, 8, 6, true, qs);
    b->d = f32_to_f16(d);
    b->scales_h = 0;
    memset(b->scales_l, 0, sizeof b->scales_l);
    for (int g = 0; g < 8; g++) {
        const int v = qs[g] + 32;
        b->scales_l[g / 2] |= (uint8_t)((v & 15) << (4 * (g % 2)));
        b->scales_h |= (uint16_t)((v >> 4) << (2 * g));
        const float dl = d * (float)qs[g], id = dl ? 1.0f / dl : 0.0f;
        for (int j = 0; j < 16; j++)
            b->qs[16 * g + j] =
                (uint8_t)(iq4_index(x[32 * g + j] * id) | iq4_index(x[32 * g + j + 16] * id) << 4);
    }
}

/* IQ2_XXS: each 8 values are a sign pattern of even parity times a point
 * of the 256-point grid (magnitudes 8, 25, 43) times the group's scale. */

/* Each grid point's levels (0, 1, 2 for magnitudes 8, 25, 43), and the
 * grid index of each of the 3^8 level patterns (-1 where the grid has none). */
static uint8_t iq2_levels[256][8];
static int16_t iq2_index[6561];
static pthread_once_t iq2_once = PTHREAD_ONCE_INIT;

static void iq2_init(void)
{
    for (int i = 0; i < 6561; i++)
        iq2_index[i] = -1;
    for (int g = 0; g < 256; g++) {
        int key = 0;
        for (int j = 7; j >= 0; j--) {
            const int v = (int)((iq2xxs_grid[g] >> (8 * j)) & 255);
            iq2_levels[g][j] = (uint8_t)(v == 8 ? 0 : v == 25 ? 1 : 2);
            key = key * 3 + iq2_levels[g][j];
        }
        iq2_index[key] = (int16_t)g;
    }
}

/* The grid point nearest a[0..8) / dl in importance-weighted squares: each
 * element's nearest level where that pattern is a grid point, else the
 * best of all 256 by their per-element costs. */
static int iq2_best(const float *a, const float *w, float dl, float *err)
{
    static const float mag[3] = {8, 25, 43};
    float c[8][3];
    int key = 0, near[8];
    float e0 = 0;
    for (int j = 7; j >= 0; j--) {
        near[j] = 0;
        for (int v = 0; v < 3; v++) {
            const float d = a[j] - dl * mag[v];
            c[j][v] = w[j] * d * d;
            near[j] = c[j][v] < c[j][near[j]] ? v : near[j];
        }
        key = key * 3 + near[j];
        e0 += c[j][near[j]];
    }
    if (iq2_index[key] >= 0) {
        *err = e0;
        return iq2_index[key];
    }
    int best = 0;
    float be = INFINITY;
    for (int g = 0; g < 256; g++) {
        const uint8_t *l = iq2_levels[g];
        const float e = c[0][l[0]] + c[1][l[1]] + c[2][l[2]] + c[3][l[3]] + c[4][l[4]] + c[5][l[5]] + c[6][l[6]] +
                        c[7][l[7]];
        if (e < be) {
            be = e;
            best = g;
        }
    }
    *err = be;
    return best;
}

/* A group of 32 magnitudes: the scale of the grid points (before the
 * super-block's 4-bit quantisation of it) with the least error. */
static float iq2_fit(const float *a, const float *w)
{
    float mx = 0, best = INFINITY, scale = 0;
    for (int j = 0; j < 32; j++)
        mx = a[j] > mx ? a[j] : mx;
    if (mx < 1e-30f)
        return 0;
    for (int k = 0; k < 7; k++) {
        float dl = mx / 43.0f * (0.6f + 0.1f * (float)k), e = 0, sag = 0, sgg = 0;
        int idx[4];
        for (int s = 0; s < 4; s++) {
            float es;
            idx[s] = iq2_best(a + 8 * s, w + 8 * s, dl, &es);
            for (int j = 0; j < 8; j++) {
                const float g = (float)((iq2xxs_grid[idx[s]] >> (8 * j)) & 255);
                sag += w[8 * s + j] * a[8 * s + j] * g;
                sgg += w[8 * s + j] * g * g;
            }
        }
        if (sgg <= 0)
            continue;
        dl = sag / sgg; /* the least-squares scale of these points */
        for (int s = 0; s < 4; s++)
            for (int j = 0; j < 8; j++) {
                const float d = a[8 * s + j] - dl * (float)((iq2xxs_grid[idx[s]] >> (8 * j)) & 255);
                e += w[8 * s + j] * d * d;
            }
        if (e < best) {
            best = e;
            scale = dl;
        }
    }
    return scale;
}

static void q_iq2_xxs(const float *x, const float *imp, struct block_iq2_xxs *b)
{
    pthread_once(&iq2_once, iq2_init);
    float w[QK_K], a[QK_K], dl[8];
    uint8_t neg[32];
    weights_of(x, imp, QK_K, w);
    for (int s = 0; s < 32; s++) { /* signs of even parity: the cheapest element flips */
        int n = 0, cheap = 8 * s;
        for (int j = 8 * s; j < 8 * s + 8; j++) {
            n += x[j] < 0;
            if (w[j] * x[j] * x[j] < w[cheap] * x[cheap] * x[cheap])
                cheap = j;
        }
        neg[s] = 0;
        for (int j = 0; j < 8; j++)
            neg[s] |= (uint8_t)((x[8 * s + j] < 0) << j);
        if (n % 2)
            neg[s] ^= (uint8_t)(1u << (cheap - 8 * s));
        for (int j = 0; j < 8; j++) /* the magnitude each point must match: negative where the sign was flipped */
            a[8 * s + j] = neg[s] >> j & 1 ? -x[8 * s + j] : x[8 * s + j];
    }
    float mx = 0;
    for (int g = 0; g < 8; g++) {
        dl[g] = iq2_fit(a + 32 * g, w + 32 * g);
        mx = dl[g] > mx ? dl[g] : mx;
    }
    const float d = f16_to_f32(f32_to_f16(mx / 3.875f)); /* the largest scale is d * (0.5 + 15) / 4 */
    b->d = f32_to_f16(d);
    for (int g = 0; g < 8; g++) {
        const int sc = d > 0 ? clampi((int)lrintf(dl[g] * 4 / d - 0.5f), 0, 15) : 0;
        const float db = d * (0.5f + (float)sc) * 0.25f;
        uint32_t idx = 0, sg = (uint32_t)sc << 28;
        for (int s = 0; s < 4; s++) {
            float e;
            idx |= (uint32_t)iq2_best(a + 32 * g + 8 * s, w + 32 * g + 8 * s, db, &e) << (8 * s);
            sg |= (uint32_t)(neg[4 * g + s] & 127) << (7 * s);
        }
        uint8_t *p = (uint8_t *)(b->qs + 4 * g);
        put_u32(p, idx);
        put_u32(p + 4, sg);
    }
}

bool quant_can_quantize(enum dtype t) { return t != DT_I32 && t != DT_F8_E4M3; }

int quant_quantize(enum dtype t, const float *x, int64_t n, const float *imp, void *dst)
{
    if (!quant_can_quantize(t))
        return err_set("quant: cannot quantise to %s", dtype_name(t));
    uint8_t *p = dst;
    const int64_t blk = dtype_block(t);
    const size_t bb = dtype_block_bytes(t);
    for (int64_t i = 0; i < n / blk; i++, p += bb, x += blk, imp = imp ? imp + blk : NULL)
        switch (t) {
        case DT_F32: memcpy(p, x, 4); break;
        case DT_F16: {
            const uint16_t h = f32_to_f16(x[0]);
            memcpy(p, &h, 2);
            break;
        }
        case DT_BF16: {
            const uint16_t h = f32_to_bf16(x[0]);
            memcpy(p, &h, 2);
            break;
        }
        case DT_Q4_0: q_q4_0(x, (void *)p); break;
        case DT_Q4_1: q_q4_1(x, (void *)p); break;
        case DT_Q5_0: q_q5_0(x, (void *)p); break;
        case DT_Q5_1: q_q5_1(x, (void *)p); break;
        case DT_Q8_0: q_q8_0(x, (void *)p); break;
        case DT_Q2_K: q_q2_k(x, imp, (void *)p); break;
        case DT_Q3_K: q_q3_k(x, imp, (void *)p); break;
        case DT_Q4_K: q_q4_k(x, imp, (void *)p); break;
        case DT_Q5_K: q_q5_k(x, imp, (void *)p); break;
        case DT_Q6_K: q_q6_k(x, imp, (void *)p); break;
        case DT_IQ4_NL: q_iq4_nl(x, imp, (void *)p); break;
        case DT_IQ4_XS: q_iq4_xs(x, imp, (void *)p); break;
        case DT_IQ2_XXS: q_iq2_xxs(x, imp, (void *)p); break;
        case DT_I32:
        case DT_F8_E4M3:
        case DT_COUNT: break;
        }
    return 0;
}
