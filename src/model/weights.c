/* weights: checked binding of safetensors tensors to backend tensors (see weights.h). */
#include "weights.h"

#include "../base/err.h"
#include "fp8.h"

#include <stdio.h>
#include <stdlib.h>

static const struct st_tensor *weights_find(struct model *m, const char *name)
{
    const struct st_tensor *t = st_find(&m->st, name);
    if (!t)
        err_set("model: missing tensor '%s' in the checkpoint (%s)", name,
                m->st.n_files ? m->st.files[0].path : "?");
    else if (t->type == DT_I32) {
        err_set("model: %s: tensor '%s' has dtype %s; weights must be BF16, F16, F32 or a GGUF block type", t->file,
                name, dtype_name(t->type));
        t = NULL;
    }
    return t;
}

/* Vectors (norms, biases, conv taps) are read element by element: a plain type. */
static const struct st_tensor *weights_find_plain(struct model *m, const char *name)
{
    const struct st_tensor *t = weights_find(m, name);
    if (t && (dtype_is_block(t->type) || t->type == DT_F8_E4M3)) {
        err_set("model: %s: tensor '%s' is %s; a vector must be F32, F16 or BF16", t->file, name,
                dtype_name(t->type));
        return NULL;
    }
    return t;
}

/* Counts a tensor's bytes as bound, once the backend has it (a GPU's upload
 * is what takes the time), for model_opts.progress. */
static void weights_bound(struct model *m, int64_t bytes)
{
    if (!m->load_opts)
        return;
    m->load_done += bytes;
    m->load_opts->progress(m->load_opts->progress_ctx, m->load_source,
                           m->load_done < m->load_total ? m->load_done : m->load_total - 1, m->load_total);
}

/* dst <- rows [row0, row0+rows) of t seen as [.][cols]. An F8_E4M3 weight
 * becomes a BF16 host copy here (fp8.h), one tensor (one expert's slice) at
 * a time: BF16 is what the backends' products have fast paths for; FP8
 * kernels (tensor cores) can come later and would take the stored bytes and
 * scales instead. The copy is the model's while the backend uses it in place
 * (the cpu), and freed at once when the backend keeps its own (a GPU). */
static int weights_load(struct model *m, struct tensor *dst, const struct st_tensor *t, int64_t row0, int64_t rows,
                        int64_t cols)
{
    struct backend *be = m->be;
    if (t->type != DT_F8_E4M3) {
        struct tensor host = {t->type, rows, cols, cols, (char *)t->data + dtype_bytes(t->type, row0 * cols), false};
        if (be->ops->weight(be, dst, &host) != 0)
            return -1;
        weights_bound(m, (int64_t)dtype_bytes(t->type, rows * cols));
        return 0;
    }
    struct fp8_weight f;
    if (fp8_find(&m->st, &m->cfg, t, &f) != 0)
        return -1;
    if (m->n_dequant == m->cap_dequant) {
        const int32_t cap = m->cap_dequant ? 2 * m->cap_dequant : 64;
        void **p = realloc(m->dequant, (size_t)cap * sizeof *p);
        if (!p)
            return err_set("model: out of memory");
        m->dequant = p;
        m->cap_dequant = cap;
    }
    const size_t n_bytes = (size_t)(rows * cols) * sizeof(uint16_t);
    uint16_t *buf = malloc(n_bytes);
    if (!buf)
        return err_set("model: out of memory for '%s' as BF16 (%zu bytes)", t->name, n_bytes);
    fp8_rows_bf16(&f, row0, rows, buf);
    struct tensor host = {DT_BF16, rows, cols, cols, buf, false};
    if (be->ops->weight(be, dst, &host) != 0) {
        free(buf);
        return -1;
    }
    const uintptr_t at = (uintptr_t)dst->data, lo = (uintptr_t)buf;
    const bool in_place = at >= lo && at < lo + n_bytes;
    if (in_place)
        m->dequant[m->n_dequant++] = buf;
    else
        free(buf);
    weights_bound(m, (int64_t)dtype_bytes(t->type, rows * cols));
    return 0;
}

static void shape_str(char *buf, size_t n, const struct st_tensor *t)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int32_t d = 0; d < t->n_dim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

static int weights_bad_shape(const struct st_tensor *t, const char *want)
{
    char got[128];
    shape_str(got, sizeof got, t);
    return err_set("model: %s: tensor '%s' has shape %s, expected %s", t->file, t->name, got, want);
}

int weights_bind(struct model *m, struct tensor *dst, const char *name, int64_t rows, int64_t cols)
{
    const struct st_tensor *t = rows == 0 ? weights_find_plain(m, name) : weights_find(m, name);
    char want[96];
    if (!t)
        return -1;
    if (rows == 0) {
        if (t->n_dim != 1 || t->shape[0] != cols) {
            snprintf(want, sizeof want, "[%lld]", (long long)cols);
            return weights_bad_shape(t, want);
        }
        rows = 1;
    } else if (t->n_dim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        return weights_bad_shape(t, want);
    }
    if (cols % dtype_block(t->type) != 0)
        return err_set("model: %s: tensor '%s' is %s with %lld columns, not a whole number of blocks", t->file,
                       name, dtype_name(t->type), (long long)cols);
    return weights_load(m, dst, t, 0, rows, cols);
}

int weights_bind_slices(struct model *m, struct tensor *dst, const char *name, int64_t n, int64_t height,
                        int64_t row0, int64_t rows, int64_t cols)
{
    const struct st_tensor *t = weights_find(m, name);
    if (!t)
        return -1;
    if (t->n_dim != 3 || t->shape[0] != n || t->shape[1] != height || t->shape[2] != cols) {
        char want[96];
        snprintf(want, sizeof want, "[%lld, %lld, %lld]", (long long)n, (long long)height, (long long)cols);
        return weights_bad_shape(t, want);
    }
    for (int64_t e = 0; e < n; e++)
        if (weights_load(m, &dst[e], t, e * height + row0, rows, cols) != 0)
            return -1;
    return 0;
}

bool weights_has(const struct model *m, const char *name) { return st_find(&m->st, name) != NULL; }

int weights_bind_norm(struct model *m, struct tensor *dst, const char *name, int64_t cols, bool plus_one)
{
    if (!plus_one)
        return weights_bind(m, dst, name, 0, cols);
    struct tensor host;
    if (weights_bind(m, &host, name, 0, cols) != 0)
        return -1;
    float *w = malloc((size_t)cols * sizeof(float));
    if (!w) {
        m->be->ops->release(m->be, &host);
        return err_set("model: out of memory");
    }
    const struct st_tensor *t = st_find(&m->st, name);
    for (int64_t i = 0; i < cols; i++) {
        const void *p = t->data;
        float v = t->type == DT_BF16  ? bf16_to_f32(((const uint16_t *)p)[i])
                  : t->type == DT_F16 ? f16_to_f32(((const uint16_t *)p)[i])
                                      : ((const float *)p)[i];
        w[i] = 1.0f + v;
    }
    m->be->ops->release(m->be, &host);
    int rc = m->be->ops->alloc(m->be, dst, DT_F32, 1, cols);
    if (rc == 0)
        m->be->ops->write(m->be, dst, 0, 1, w);
    free(w);
    return rc;
}

int weights_bind_conv(struct model *m, struct tensor *dst, const char *name, int64_t channels, int64_t width)
{
    const struct st_tensor *t = weights_find_plain(m, name);
    if (!t)
        return -1;
    if (t->n_dim != 3 || t->shape[0] != channels || t->shape[1] != 1 || t->shape[2] != width) {
        char want[96];
        snprintf(want, sizeof want, "[%lld, 1, %lld]", (long long)channels, (long long)width);
        return weights_bad_shape(t, want);
    }
    struct tensor host = {t->type, channels, width, width, (void *)t->data, false};
    if (m->be->ops->weight(m->be, dst, &host) != 0)
        return -1;
    weights_bound(m, (int64_t)t->n_bytes);
    return 0;
}

int weights_make_map(struct model *m, struct tensor *dst, const int32_t *map, int64_t n)
{
    if (m->be->ops->alloc(m->be, dst, DT_I32, 1, n) != 0)
        return -1;
    m->be->ops->write(m->be, dst, 0, 1, map);
    return 0;
}
