/* fp8: block-scaled FP8 weights to BF16 (see fp8.h). */
#include "fp8.h"

#include "../base/err.h"

#include <stdio.h>

static int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void shape_str(char *buf, size_t n, int32_t n_dim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int32_t d = 0; d < n_dim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

int fp8_find(const struct safetensors *st, const struct model_config *c, const struct st_tensor *w,
             struct fp8_weight *f)
{
    if (c->fp8_block[0] == 0)
        return err_set("model: %s: tensor '%s' is F8_E4M3 but config.json has no quantization_config with "
                       "quant_method \"fp8\"", w->file, w->name);
    if (w->n_dim != 2 && w->n_dim != 3)
        return err_set("model: %s: F8_E4M3 tensor '%s' has %d dimensions; block scales need 2 or 3", w->file,
                       w->name, (int)w->n_dim);
    /* transformers' naming: X.weight -> X.weight_scale_inv */
    char name[512];
    snprintf(name, sizeof name, "%s_scale_inv", w->name);
    const struct st_tensor *s = st_find(st, name);
    if (!s)
        return err_set("model: %s: F8_E4M3 tensor '%s' has no scale tensor '%s'", w->file, w->name, name);
    if (s->type != DT_F32 && s->type != DT_BF16 && s->type != DT_F16)
        return err_set("model: %s: scale tensor '%s' is %s; it must be F32, BF16 or F16", s->file, name,
                       dtype_name(s->type));
    int64_t want[3];
    const int32_t nd = w->n_dim;
    for (int32_t d = 0; d < nd - 2; d++)
        want[d] = w->shape[d];
    want[nd - 2] = div_up(w->shape[nd - 2], c->fp8_block[0]);
    want[nd - 1] = div_up(w->shape[nd - 1], c->fp8_block[1]);
    bool same = s->n_dim == nd;
    for (int32_t d = 0; same && d < nd; d++)
        same = s->shape[d] == want[d];
    if (!same) {
        char got[128], exp[128];
        shape_str(got, sizeof got, s->n_dim, s->shape);
        shape_str(exp, sizeof exp, nd, want);
        return err_set("model: %s: scale tensor '%s' has shape %s, expected %s (blocks of %dx%d, "
                       "quantization_config.weight_block_size)", s->file, name, got, exp, (int)c->fp8_block[0],
                       (int)c->fp8_block[1]);
    }
    f->w = w;
    f->scale = s;
    f->rows = w->shape[nd - 2];
    f->cols = w->shape[nd - 1];
    f->block_rows = c->fp8_block[0];
    f->block_cols = c->fp8_block[1];
    return 0;
}

int fp8_check(const struct safetensors *st, const struct model_config *c)
{
    struct fp8_weight f;
    for (int32_t i = 0; i < st->n_tensors; i++)
        if (st->tensors[i].type == DT_F8_E4M3 && fp8_find(st, c, &st->tensors[i], &f) != 0)
            return -1;
    return 0;
}

static float scale_at(const struct st_tensor *s, int64_t i)
{
    const void *p = s->data;
    return s->type == DT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i])
           : s->type == DT_F16 ? f16_to_f32(((const uint16_t *)p)[i])
                               : ((const float *)p)[i];
}

void fp8_rows_bf16(const struct fp8_weight *f, int64_t row0, int64_t n, uint16_t *out)
{
    const int64_t cols = f->cols, bc = f->block_cols;
    const int64_t n_rb = div_up(f->rows, f->block_rows), n_cb = div_up(cols, bc);
    const uint8_t *w = f->w->data;
    for (int64_t i = 0; i < n; i++) {
        const int64_t R = row0 + i, e = R / f->rows, r = R % f->rows;
        const int64_t srow = (e * n_rb + r / f->block_rows) * n_cb;
        const uint8_t *src = w + R * cols;
        uint16_t *dst = out + i * cols;
        for (int64_t cb = 0; cb < n_cb; cb++) {
            const float s = scale_at(f->scale, srow + cb);
            const int64_t c1 = (cb + 1) * bc < cols ? (cb + 1) * bc : cols;
            for (int64_t col = cb * bc; col < c1; col++)
                dst[col] = f32_to_bf16(f8e4m3_to_f32(src[col]) * s);
        }
    }
}
