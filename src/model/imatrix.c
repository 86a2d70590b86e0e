/* imatrix: importance matrices read, written and collected (see imatrix.h).
 * The layouts are llama.cpp's tools/imatrix/imatrix.cpp (writers) and
 * common/imatrix-loader.cpp (reader); the importance is
 * tools/quantize/quantize.cpp's. */
#define _GNU_SOURCE
#include "imatrix.h"

#include "../base/err.h"
#include "gguf.h"
#include "gguf_hf.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ggml's tensor names hold 63 bytes, "NAME.in_sum2" among them: longer names
 * are no file's */
#define NAME_MAX_LEN 240

void imatrix_free(struct imatrix *im)
{
    for (int32_t i = 0; i < im->n; i++) {
        free(im->e[i].name);
        free(im->e[i].sums);
        free(im->e[i].counts);
    }
    free(im->e);
    for (int32_t i = 0; i < im->n_datasets; i++)
        free(im->datasets[i]);
    free(im->datasets);
    free(im->path);
    memset(im, 0, sizeof *im);
}

const struct imatrix_entry *imatrix_find(const struct imatrix *im, const char *name)
{
    for (int32_t i = 0; i < im->n; i++)
        if (strcmp(im->e[i].name, name) == 0)
            return &im->e[i];
    return NULL;
}

/* A new entry of zeros at the end of im; NULL with err_set() when out of memory. */
static struct imatrix_entry *entry_add(struct imatrix *im, const char *name, size_t len, int64_t n_cols,
                                       int32_t n_mat, int32_t n_counts)
{
    struct imatrix_entry *e = realloc(im->e, (size_t)(im->n + 1) * sizeof *e);
    if (!e) {
        err_set("imatrix: out of memory");
        return NULL;
    }
    im->e = e;
    e = &im->e[im->n++]; /* counted at once: imatrix_free frees what was allocated */
    *e = (struct imatrix_entry){strndup(name, len), n_cols, n_mat, n_counts,
                                calloc((size_t)(n_cols * n_mat), sizeof(float)),
                                calloc((size_t)n_counts, sizeof(int64_t))};
    if (!e->name || !e->sums || !e->counts) {
        err_set("imatrix: out of memory");
        return NULL;
    }
    return e;
}

static int add_dataset(struct imatrix *im, const char *s, size_t n)
{
    char **d = realloc(im->datasets, (size_t)(im->n_datasets + 1) * sizeof *d);
    if (!d)
        return err_set("imatrix: out of memory");
    im->datasets = d;
    if (!(d[im->n_datasets] = strndup(s, n)))
        return err_set("imatrix: out of memory");
    im->n_datasets++;
    return 0;
}

int imatrix_add_dataset(struct imatrix *im, const char *name) { return add_dataset(im, name, strlen(name)); }

/* Sums of squares: finite and not negative. */
static int check_sums(const char *path, const char *name, const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]) || v[i] < 0)
            return err_set("imatrix: %s: entry '%s': value %lld is %g; sums of squares are finite and not negative",
                           path, name, (long long)i, (double)v[i]);
    return 0;
}

/* ---- GGUF ---- */

static bool has_suffix(const char *s, const char *suffix)
{
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* rc of a typed lookup, an absent key an error: llama-quantize refuses such files */
static int need_key(const char *path, const char *key, int rc)
{
    return rc > 0 ? err_set("imatrix: %s: no key '%s' (an imatrix file has imatrix.datasets, imatrix.chunk_count "
                            "and imatrix.chunk_size)",
                            path, key)
                  : rc;
}

/* One entry from its two tensors. */
static int read_gguf_entry(struct imatrix *im, const char *path, const struct gguf_tensor *s,
                           const struct gguf_tensor *c, const char *name, size_t len)
{
    if (len == 0 || len > NAME_MAX_LEN)
        return err_set("imatrix: %s: tensor '%s' names no weight", path, s->name);
    if (s->type != DT_F32 || c->type != DT_F32)
        return err_set("imatrix: %s: entry '%.*s': in_sum2 is %s and counts %s; both are F32", path, (int)len, name,
                       dtype_name(s->type), dtype_name(c->type));
    const int64_t n_counts = c->ne[0] * c->ne[1] * c->ne[2] * c->ne[3];
    if (s->n_dim > 2 || s->ne[1] > INT32_MAX || s->ne[0] * s->ne[1] == 0)
        return err_set("imatrix: %s: entry '%.*s': in_sum2 is not [columns] or [columns x experts]", path, (int)len,
                       name);
    if (n_counts != 1 && (n_counts != s->ne[1] || c->ne[0] != 1))
        return err_set("imatrix: %s: entry '%.*s': %lld counts for %lld matrices (one, or one per matrix)", path,
                       (int)len, name, (long long)n_counts, (long long)s->ne[1]);
    struct imatrix_entry *e = entry_add(im, name, len, s->ne[0], (int32_t)s->ne[1], (int32_t)n_counts);
    if (!e)
        return -1;
    memcpy(e->sums, s->data, (size_t)(e->n_cols * e->n_mat) * sizeof(float));
    if (check_sums(path, e->name, e->sums, e->n_cols * e->n_mat) != 0)
        return -1;
    for (int32_t j = 0; j < e->n_counts; j++) {
        float v;
        memcpy(&v, (const char *)c->data + (size_t)j * sizeof v, sizeof v);
        if (!(v >= 0 && v <= 0x1p53f && v == nearbyintf(v)))
            return err_set("imatrix: %s: entry '%s': count %d is %g; counts are whole numbers of tokens", path,
                           e->name, (int)j, (double)v);
        e->counts[j] = (int64_t)v;
    }
    return 0;
}

static int read_gguf(struct imatrix *im, const char *path)
{
    struct gguf g;
    if (gguf_open(&g, path) != 0)
        return -1;
    int rc = -1;
    const char *s;
    size_t sn;
    uint32_t count, size;
    const struct gguf_kv *ds;
    int r = gguf_get_str(&g, "general.type", &s, &sn);
    if (r < 0)
        goto done;
    if (r == 0 && !(sn == 7 && memcmp(s, "imatrix", 7) == 0)) {
        err_set("imatrix: %s: general.type is '%.*s', not 'imatrix'", path, (int)sn, s);
        goto done;
    }
    if (need_key(path, "imatrix.chunk_count", gguf_get_u32(&g, "imatrix.chunk_count", &count)) != 0 ||
        need_key(path, "imatrix.chunk_size", gguf_get_u32(&g, "imatrix.chunk_size", &size)) != 0 ||
        need_key(path, "imatrix.datasets", gguf_get_arr(&g, "imatrix.datasets", GGUF_STRING, &ds)) != 0)
        goto done;
    if (count > INT32_MAX || size > INT32_MAX) {
        err_set("imatrix: %s: imatrix.chunk_count %u or imatrix.chunk_size %u out of range", path, count, size);
        goto done;
    }
    im->chunk_count = (int32_t)count;
    im->chunk_size = (int32_t)size;
    for (uint64_t i = 0; i < ds->n; i++)
        if (add_dataset(im, ds->strs[i].p, ds->strs[i].n) != 0)
            goto done;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const struct gguf_tensor *t = &g.tensors[i];
        const bool sums = has_suffix(t->name, ".in_sum2");
        if (!sums && !has_suffix(t->name, ".counts")) {
            err_set("imatrix: %s: tensor '%s' is neither an entry's NAME.in_sum2 nor its NAME.counts", path, t->name);
            goto done;
        }
        const size_t len = strlen(t->name) - strlen(sums ? ".in_sum2" : ".counts");
        char other[NAME_MAX_LEN + 16];
        snprintf(other, sizeof other, "%.*s%s", (int)(len < NAME_MAX_LEN ? len : NAME_MAX_LEN), t->name,
                 sums ? ".counts" : ".in_sum2");
        const struct gguf_tensor *o = len <= NAME_MAX_LEN ? gguf_find(&g, other) : NULL;
        if (!o) {
            err_set("imatrix: %s: entry '%.*s' has %s but no %s", path, (int)len, t->name, sums ? "in_sum2" : "counts",
                    sums ? "counts" : "in_sum2");
            goto done;
        }
        if (sums && read_gguf_entry(im, path, t, o, t->name, len) != 0)
            goto done;
    }
    if (im->n == 0) {
        err_set("imatrix: %s: no entries", path);
        goto done;
    }
    rc = 0;
done:
    gguf_close(&g);
    return rc;
}

/* ---- legacy .dat ---- */

struct cursor {
    const unsigned char *p;
    size_t n, off;
};

static bool take(struct cursor *c, void *dst, size_t n)
{
    if (c->n - c->off < n)
        return false;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return true;
}

/* The whole file in memory; NULL with err_set(). */
static unsigned char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        fclose(f);
        *size = (size_t)n;
        return buf;
    }
    err_set("imatrix: %s: cannot read the file", path);
    free(buf);
    if (f)
        fclose(f);
    return NULL;
}

static int read_legacy_entry(struct imatrix *im, const char *path, struct cursor *c, int32_t i)
{
    int32_t len, ncall, nval;
    char name[NAME_MAX_LEN + 1];
    if (!take(c, &len, 4) || len < 1 || len > NAME_MAX_LEN || !take(c, name, (size_t)len))
        return err_set("imatrix: %s: legacy .dat entry %d: no name (a name length of 1 to %d, then the name)", path,
                       (int)i, NAME_MAX_LEN);
    name[len] = 0;
    if (strlen(name) != (size_t)len)
        return err_set("imatrix: %s: legacy .dat entry %d: the name holds a NUL byte", path, (int)i);
    if (imatrix_find(im, name))
        return err_set("imatrix: %s: entry '%s' appears twice", path, name);
    if (!take(c, &ncall, 4) || !take(c, &nval, 4) || ncall < 0 || nval < 1)
        return err_set("imatrix: %s: entry '%s': bad or missing call count and value count", path, name);
    if (c->n - c->off < (size_t)nval * sizeof(float))
        return err_set("imatrix: %s: entry '%s': %d values run past the end of the file", path, name, (int)nval);
    struct imatrix_entry *e = entry_add(im, name, (size_t)len, nval, 1, 1);
    if (!e)
        return -1;
    take(c, e->sums, (size_t)nval * sizeof(float));
    /* values are means times ncall; with ncall 0 llama-quantize takes them as they are */
    e->counts[0] = ncall > 0 ? ncall : 1;
    return check_sums(path, e->name, e->sums, nval);
}

static int read_legacy(struct imatrix *im, const char *path)
{
    size_t size;
    unsigned char *buf = slurp(path, &size);
    if (!buf)
        return -1;
    struct cursor c = {buf, size, 0};
    int32_t n_entries, count, len;
    int rc = -1;
    if (!take(&c, &n_entries, 4) || n_entries < 1) {
        err_set("imatrix: %s: neither a GGUF file nor a legacy imatrix (no entry count)", path);
        goto done;
    }
    for (int32_t i = 0; i < n_entries; i++)
        if (read_legacy_entry(im, path, &c, i + 1) != 0)
            goto done;
    if (c.off < c.n) { /* the trailer: chunk count and dataset name */
        const size_t rest = c.n - c.off;
        if (!take(&c, &count, 4) || !take(&c, &len, 4) || count < 0 || len < 0 || c.n - c.off != (size_t)len) {
            err_set("imatrix: %s: after %d entries, %zu bytes that are not a chunk count and a dataset name", path,
                    (int)n_entries, rest);
            goto done;
        }
        im->chunk_count = count;
        if (len > 0 && add_dataset(im, (const char *)buf + c.off, (size_t)len) != 0)
            goto done;
    }
    rc = 0;
done:
    free(buf);
    return rc;
}

int imatrix_read(struct imatrix *im, const char *path)
{
    memset(im, 0, sizeof *im);
    if (!(im->path = strdup(path)))
        return err_set("imatrix: out of memory");
    if ((gguf_hf_is_gguf(path) ? read_gguf(im, path) : read_legacy(im, path)) != 0) {
        imatrix_free(im);
        return -1;
    }
    return 0;
}

/* ---- writing ---- */

static int cmp_entry(const void *a, const void *b)
{
    return strcmp((*(const struct imatrix_entry *const *)a)->name, (*(const struct imatrix_entry *const *)b)->name);
}

/* tensor 2i is entry i's in_sum2, 2i+1 its counts (as floats) */
static void write_fill(void *ctx, int32_t i, void *buf, size_t n_bytes)
{
    const struct imatrix_entry *e = ((const struct imatrix_entry *const *)ctx)[i / 2];
    if (i % 2 == 0) {
        memcpy(buf, e->sums, n_bytes);
        return;
    }
    for (int32_t j = 0; j < e->n_counts; j++)
        ((float *)buf)[j] = (float)e->counts[j];
}

int imatrix_write(const struct imatrix *im, const char *path)
{
    const struct imatrix_entry **order = malloc((size_t)(im->n ? im->n : 1) * sizeof *order);
    struct gguf_writer *w = NULL;
    if (!order || gguf_writer_init(&w, path) != 0) {
        free(order);
        return order ? -1 : err_set("imatrix: out of memory");
    }
    for (int32_t i = 0; i < im->n; i++)
        order[i] = &im->e[i];
    qsort(order, (size_t)im->n, sizeof *order, cmp_entry);
    gguf_writer_kv_str(w, "general.type", "imatrix");
    gguf_writer_kv_arr_str(w, "imatrix.datasets", (const char *const *)im->datasets, (uint64_t)im->n_datasets);
    gguf_writer_kv_u32(w, "imatrix.chunk_count", (uint32_t)im->chunk_count);
    gguf_writer_kv_u32(w, "imatrix.chunk_size", (uint32_t)im->chunk_size);
    for (int32_t i = 0; i < im->n; i++) {
        const struct imatrix_entry *e = order[i];
        char name[NAME_MAX_LEN + 16];
        const int64_t sums_ne[2] = {e->n_cols, e->n_mat}, counts_ne[2] = {1, e->n_counts};
        snprintf(name, sizeof name, "%s.in_sum2", e->name);
        gguf_writer_tensor(w, name, DT_F32, e->n_mat > 1 ? 2 : 1, sums_ne);
        snprintf(name, sizeof name, "%s.counts", e->name);
        gguf_writer_tensor(w, name, DT_F32, e->n_counts > 1 ? 2 : 1, counts_ne);
    }
    const int rc = gguf_writer_finish(w, write_fill, order);
    free(order);
    return rc;
}

int imatrix_importance(const struct imatrix *im, const char *name, int64_t n_cols, int32_t n_mat, int32_t mat,
                       float *out)
{
    assert(mat >= 0 && mat < n_mat);
    const struct imatrix_entry *e = imatrix_find(im, name);
    if (!e)
        return 1;
    const int64_t total = e->n_cols * e->n_mat;
    if (total != n_cols * n_mat)
        return err_set("imatrix: %s: entry '%s' has %lld values; the tensor has %d matrices of %lld columns",
                       im->path ? im->path : "(collected)", name, (long long)total, (int)n_mat, (long long)n_cols);
    const int64_t per_count = total / e->n_counts;
    for (int64_t j = 0; j < n_cols; j++) {
        const int64_t i = mat * n_cols + j, count = e->counts[i / per_count];
        out[j] = count > 0 ? e->sums[i] / (float)count : 1.0f;
    }
    return 0;
}

/* ---- collection ---- */

struct col_key {
    const void *data; /* a weight's backend memory, as the ops see it */
    int32_t entry;    /* its entry */
    int32_t layer;
};

struct collector {
    struct backend base;
    struct backend *in;
    struct backend_ops ops;
    struct imatrix *im; /* NULL until bound */
    struct col_key *keys;
    int32_t n_keys;
    int32_t (*exps)[3];   /* [n_layer] a MoE layer's gate, up and down expert entries */
    char why[512];        /* the first failure since bind, "" if none */
    float *x, *rows;      /* host copies: an op's input rows; an expert's rows */
    size_t x_cap, rows_cap;
    int32_t *ids, *pick;  /* a MoE block's picks [n][k]; one expert's rows */
    size_t ids_cap, pick_cap;
    struct tensor hx, g, u; /* on the inner backend: an expert's input rows and its gate/up products */
    int64_t cap_rows;
};

static struct collector *col_of(struct backend *be) { return (struct collector *)be; }

/* Records the first failure (err_msg() is overwritten long before status asks). */
static void col_fail(struct collector *c)
{
    if (!c->why[0])
        snprintf(c->why, sizeof c->why, "%s", err_msg());
}

/* *p grown to hold n elements of size es; false with err_set(). */
static bool grow(void *p, size_t *cap, size_t n, size_t es)
{
    if (n <= *cap)
        return true;
    void *q = realloc(*(void **)p, n * es);
    if (!q) {
        err_set("imatrix: out of memory");
        return false;
    }
    *(void **)p = q;
    *cap = n;
    return true;
}

static int cmp_key(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t)((const struct col_key *)a)->data, y = (uintptr_t)((const struct col_key *)b)->data;
    return x < y ? -1 : x > y;
}

static const struct col_key *key_find(const struct collector *c, const void *data)
{
    const struct col_key k = {data, 0, 0};
    return c->im ? bsearch(&k, c->keys, (size_t)c->n_keys, sizeof k, cmp_key) : NULL;
}

/* n host rows of e's columns into matrix mat's sums */
static void add_rows(struct imatrix_entry *e, int32_t mat, const float *x, int64_t n)
{
    float *s = e->sums + mat * e->n_cols;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < e->n_cols; j++)
            s[j] += x[r * e->n_cols + j] * x[r * e->n_cols + j];
    e->counts[mat] += n;
}

/* The rows of x (F32, on the inner backend) into c->x; false on failure. */
static bool read_rows(struct collector *c, const struct tensor *x)
{
    assert(x->type == DT_F32);
    if (!grow(&c->x, &c->x_cap, (size_t)(x->n_rows * x->n_cols), sizeof(float)) ||
        c->in->ops->read(c->in, x, 0, x->n_rows, c->x) != 0) {
        col_fail(c);
        return false;
    }
    return true;
}

static void c_matmul(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w)
{
    struct collector *c = col_of(be);
    const struct col_key *k = key_find(c, w->data);
    if (k && read_rows(c, x)) {
        assert(x->n_cols == c->im->e[k->entry].n_cols);
        add_rows(&c->im->e[k->entry], 0, c->x, x->n_rows);
    }
    c->in->ops->matmul(c->in, out, x, w);
}

/* As its pieces through this backend, so that each product's input, after
 * the RMSNorm or SwiGLU, passes c_matmul (the cpu runs the pieces anyway). */
static void c_matmul_fused(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                           const struct tensor *x, const struct mm_fused *f)
{
    backend_matmul_pieces(be, n_w, out, w, x, f);
}

/* Room on the inner backend for n rows of an expert's input and products. */
static bool expert_scratch(struct collector *c, int64_t n, int64_t hidden, int64_t inter)
{
    const struct backend_ops *op = c->in->ops;
    if (n <= c->cap_rows && c->hx.n_cols == hidden && c->g.n_cols == inter)
        return true;
    op->release(c->in, &c->hx);
    op->release(c->in, &c->g);
    op->release(c->in, &c->u);
    c->cap_rows = 0;
    if (op->alloc(c->in, &c->hx, DT_F32, n, hidden) != 0 || op->alloc(c->in, &c->g, DT_F32, n, inter) != 0 ||
        op->alloc(c->in, &c->u, DT_F32, n, inter) != 0)
        return false;
    c->cap_rows = n;
    return true;
}

/* One expert's m picked rows (their numbers in c->pick, h in c->x): gate/up
 * inputs, then the down input silu(h gate_e) * (h up_e) on the inner backend. */
static bool collect_expert(struct collector *c, const struct moe_block *mb, const int32_t *ent, int32_t e, int64_t m)
{
    const struct backend_ops *op = c->in->ops;
    const int64_t hidden = mb->h->n_cols, inter = mb->ex.up[e].n_rows;
    if (!grow(&c->rows, &c->rows_cap, (size_t)(m * (hidden > inter ? hidden : inter)), sizeof(float)) ||
        !expert_scratch(c, m, hidden, inter))
        return false;
    for (int64_t r = 0; r < m; r++)
        memcpy(c->rows + r * hidden, c->x + (int64_t)c->pick[r] * hidden, (size_t)hidden * sizeof(float));
    add_rows(&c->im->e[ent[0]], e, c->rows, m);
    add_rows(&c->im->e[ent[1]], e, c->rows, m);
    struct tensor hx = tensor_rows(&c->hx, 0, m), g = tensor_rows(&c->g, 0, m), u = tensor_rows(&c->u, 0, m);
    op->write(c->in, &hx, 0, m, c->rows);
    op->matmul(c->in, &g, &hx, &mb->ex.gate[e]);
    op->matmul(c->in, &u, &hx, &mb->ex.up[e]);
    op->swiglu(c->in, &g, &g, &u);
    if (op->read(c->in, &g, 0, m, c->rows) != 0)
        return false;
    add_rows(&c->im->e[ent[2]], e, c->rows, m);
    return true;
}

static void c_moe(struct backend *be, struct tensor *out, const struct tensor *x, const struct moe_block *mb,
                  bool accumulate)
{
    struct collector *c = col_of(be);
    c->in->ops->moe(c->in, out, x, mb, accumulate);
    const struct col_key *key = key_find(c, mb->router->data);
    if (!key)
        return;
    /* the block leaves h = RMSNorm(x) and each row's experts in its scratch */
    const int64_t n = x->n_rows, k = mb->rt.k;
    struct tensor h = tensor_rows(mb->h, 0, n), ids = tensor_rows(mb->ids, 0, n);
    assert(ids.n_cols == k);
    if (!read_rows(c, &h))
        return;
    add_rows(&c->im->e[key->entry], 0, c->x, n);
    if (!grow(&c->ids, &c->ids_cap, (size_t)(n * k), sizeof(int32_t)) ||
        !grow(&c->pick, &c->pick_cap, (size_t)n, sizeof(int32_t)) || c->in->ops->read(c->in, &ids, 0, n, c->ids) != 0) {
        col_fail(c);
        return;
    }
    for (int32_t e = 0; e < mb->ex.n_expert; e++) {
        int64_t m = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++)
                if (c->ids[r * k + j] == e) {
                    c->pick[m++] = (int32_t)r;
                    break;
                }
        if (m > 0 && !collect_expert(c, mb, c->exps[key->layer], e, m)) {
            col_fail(c);
            return;
        }
    }
}

/* ---- the other ops, as the inner backend runs them: those of the
 * architectures collected (bind refuses other models) ---- */

#define IN(be) (col_of(be)->in)

static void c_free(struct backend *be)
{
    struct collector *c = col_of(be);
    c->in->ops->release(c->in, &c->hx);
    c->in->ops->release(c->in, &c->g);
    c->in->ops->release(c->in, &c->u);
    c->in->ops->free(c->in);
    free(c->keys);
    free(c->exps);
    free(c->x);
    free(c->rows);
    free(c->ids);
    free(c->pick);
    free(c);
}
static int c_alloc(struct backend *be, struct tensor *t, enum dtype type, int64_t r, int64_t n)
{
    return IN(be)->ops->alloc(IN(be), t, type, r, n);
}
static void c_release(struct backend *be, struct tensor *t) { IN(be)->ops->release(IN(be), t); }
static int c_weight(struct backend *be, struct tensor *dst, const struct tensor *host)
{
    return IN(be)->ops->weight(IN(be), dst, host);
}
static int c_read(struct backend *be, const struct tensor *t, int64_t r0, int64_t n, void *dst)
{
    return IN(be)->ops->read(IN(be), t, r0, n, dst);
}
static int c_top_k(struct backend *be, const struct tensor *t, int32_t k, int32_t *ids, float *vals)
{
    return IN(be)->ops->top_k(IN(be), t, k, ids, vals);
}
static void c_write(struct backend *be, struct tensor *t, int64_t r0, int64_t n, const void *src)
{
    IN(be)->ops->write(IN(be), t, r0, n, src);
}
static void c_copy_rows(struct backend *be, struct tensor *t, const int32_t *s, const int32_t *d, int32_t n)
{
    IN(be)->ops->copy_rows(IN(be), t, s, d, n);
}
static void c_sync(struct backend *be) { IN(be)->ops->sync(IN(be)); }
static void c_forward_end(struct backend *be) { IN(be)->ops->forward_end(IN(be)); }
static int c_set_batch(struct backend *be, const struct attn_batch *b) { return IN(be)->ops->set_batch(IN(be), b); }
static void c_embed(struct backend *be, struct tensor *out, const struct tensor *table)
{
    IN(be)->ops->embed(IN(be), out, table);
}
static void c_rmsnorm(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w, float eps)
{
    IN(be)->ops->rmsnorm(IN(be), out, x, w, eps);
}
static void c_attn_prep(struct backend *be, struct tensor *q, struct tensor *k, const struct tensor *v,
                        struct tensor *kc, struct tensor *vc, const struct attn_prep *p)
{
    IN(be)->ops->attn_prep(IN(be), q, k, v, kc, vc, p);
}
static void c_attention(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *kc,
                        const struct tensor *vc, int32_t nh, int32_t nkv, int32_t hd, float scale)
{
    IN(be)->ops->attention(IN(be), out, q, kc, vc, nh, nkv, hd, scale);
}
static void c_swiglu(struct backend *be, struct tensor *out, const struct tensor *g, const struct tensor *u)
{
    IN(be)->ops->swiglu(IN(be), out, g, u);
}
static void c_add(struct backend *be, struct tensor *x, const struct tensor *y) { IN(be)->ops->add(IN(be), x, y); }
static void c_out_rows(struct backend *be, struct tensor *out, const struct tensor *x)
{
    IN(be)->ops->get_out_rows(IN(be), out, x);
}

struct backend *imatrix_collector_wrap(struct backend *inner)
{
    struct collector *c = calloc(1, sizeof *c);
    if (!c) {
        inner->ops->free(inner);
        err_set("imatrix: out of memory");
        return NULL;
    }
    c->in = inner;
    c->ops = (struct backend_ops){
        .name = inner->ops->name, .kv_bf16 = inner->ops->kv_bf16, .prefill_chunk = inner->ops->prefill_chunk,
        .free = c_free, .alloc = c_alloc, .release = c_release, .weight = c_weight, .read = c_read,
        .top_k = c_top_k, .write = c_write, .copy_rows = c_copy_rows, .sync = c_sync,
        .forward_end = c_forward_end, .set_batch = c_set_batch, .embed = c_embed, .matmul = c_matmul,
        .matmul_fused = c_matmul_fused, .rmsnorm = c_rmsnorm, .attn_prep = c_attn_prep, .attention = c_attention,
        .swiglu = c_swiglu, .add = c_add, .get_out_rows = c_out_rows, .moe = c_moe,
    };
    c->base.ops = &c->ops;
    return &c->base;
}

/* An entry blk.l.WHAT.weight for w (n_mat matrices of its columns), and
 * w's key when key is set. The entry's index, or -1 with err_set(). */
static int32_t bind_one(struct collector *c, const struct tensor *w, int32_t n_mat, int32_t l, const char *what,
                        bool key)
{
    char name[NAME_MAX_LEN];
    snprintf(name, sizeof name, "blk.%d.%s.weight", (int)l, what);
    if (!entry_add(c->im, name, strlen(name), w->n_cols, n_mat, n_mat))
        return -1;
    if (key)
        c->keys[c->n_keys++] = (struct col_key){w->data, c->im->n - 1, l};
    return c->im->n - 1;
}

int imatrix_collector_bind(struct backend *be, const struct model *m, struct imatrix *im)
{
    assert(be->ops->free == c_free && m->be == be);
    struct collector *c = col_of(be);
    const struct model_config *cfg = &m->cfg;
    if (cfg->arch != ARCH_QWEN3 && cfg->arch != ARCH_QWEN3_MOE)
        return err_set("imatrix: model_type '%s' cannot be collected yet (qwen3, qwen3_moe)", cfg->model_type);
    free(c->keys);
    free(c->exps);
    memset(im, 0, sizeof *im);
    c->im = NULL;
    c->n_keys = 0;
    c->why[0] = 0;
    c->keys = malloc((size_t)cfg->n_layer * 7 * sizeof *c->keys);
    c->exps = malloc((size_t)cfg->n_layer * sizeof *c->exps);
    if (!c->keys || !c->exps)
        return err_set("imatrix: out of memory");
    c->im = im;
    static const char *const attn[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
    static const char *const dense[] = {"ffn_gate", "ffn_up", "ffn_down"};
    static const char *const exps[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int32_t l = 0; l < cfg->n_layer; l++) {
        const struct layer_weights *L = &m->layers[l];
        const struct tensor *a[] = {&L->q, &L->k, &L->v, &L->o}, *d[] = {&L->gate, &L->up, &L->down};
        for (int i = 0; i < 4; i++)
            if (bind_one(c, a[i], 1, l, attn[i], true) < 0)
                goto fail;
        if (cfg->layer_ffn[l] != FFN_MOE) {
            for (int i = 0; i < 3; i++)
                if (bind_one(c, d[i], 1, l, dense[i], true) < 0)
                    goto fail;
            continue;
        }
        /* the router's key finds the layer's experts */
        const struct tensor *x[] = {&L->ex_gate[0], &L->ex_up[0], &L->ex_down[0]};
        if (bind_one(c, &L->router, 1, l, "ffn_gate_inp", true) < 0)
            goto fail;
        for (int i = 0; i < 3; i++)
            if ((c->exps[l][i] = bind_one(c, x[i], cfg->n_expert, l, exps[i], false)) < 0)
                goto fail;
    }
    qsort(c->keys, (size_t)c->n_keys, sizeof *c->keys, cmp_key);
    return 0;
fail:
    c->im = NULL;
    imatrix_free(im);
    return -1;
}

int imatrix_collector_status(struct backend *be)
{
    assert(be->ops->free == c_free);
    const struct collector *c = col_of(be);
    return c->why[0] ? err_set("%s", c->why) : 0;
}
