/* cpu: backend_ops on the host (see backend.h for each op's meaning).
 * Work is split into independent tasks (weight-row chunks for matmul,
 * (token, kv-head) pairs for attention, row ranges elsewhere) and run on the
 * pool; the arithmetic itself is in the kern table. The recurrent ops are in
 * recurrent.c. */
#define _GNU_SOURCE
#include "cpu_impl.h"

#include "../../base/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- memory ---- */

static int cpu_alloc(struct backend *be, struct tensor *t, enum dtype type, int64_t n_rows, int64_t n_cols)
{
    (void)be;
    int64_t stride = n_cols;
    size_t bytes = (size_t)(n_rows * stride) * dtype_size(type);
    bytes = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p)
        return err_set("cpu: cannot allocate %zu bytes", bytes);
    memset(p, 0, bytes);
    *t = (struct tensor){type, n_rows, n_cols, stride, p, true};
    return 0;
}

static void cpu_release(struct backend *be, struct tensor *t)
{
    (void)be;
    if (t->owned)
        free(t->data);
    memset(t, 0, sizeof *t);
}

/* Bytes of one activation row rounded for the fast product with weights of
 * type t and k columns: int8 blocks (matmul_q8), or bf16 for BF16 weights
 * (matmul_bf16_bf16); 0 where there is none. */
static int64_t fast_row_bytes(enum dtype t, int64_t k)
{
    return t == DT_BF16 ? kern_bf16_row_bytes(k) : kern_q8_row_bytes(t, k);
}

/* the tokens a fast product takes a pass over the weights: matmul_bf16_bf16's
 * or matmul_q8's */
static int32_t fast_tile(enum dtype t) { return t == DT_BF16 ? KERN_MAX_NX : KERN_Q8_MAX_NX; }

static int cpu_weight(struct backend *be, struct tensor *dst, const struct tensor *host)
{
    struct cpu_backend *c = cpu_of(be);
    if (dtype_is_block(host->type) && DQ_ROWS * host->n_cols > c->dq_per_worker) {
        const int64_t per = DQ_ROWS * host->n_cols;
        float *p = aligned_alloc(64, (size_t)(per * pool_n_threads(c->pool)) * sizeof(float));
        if (!p)
            return err_set("cpu: out of memory");
        free(c->dq);
        c->dq = p;
        c->dq_per_worker = per;
    }
    const int64_t xb = fast_tile(host->type) * fast_row_bytes(host->type, host->n_cols);
    if (xb > c->xq_per_worker) {
        uint8_t *p = aligned_alloc(64, (size_t)(xb * pool_n_threads(c->pool)));
        if (!p)
            return err_set("cpu: out of memory");
        free(c->xq_own);
        c->xq_own = p;
        c->xq_per_worker = xb;
    }
    *dst = *host;
    dst->owned = false;
    return 0;
}

static int cpu_read(struct backend *be, const struct tensor *t, int64_t row0, int64_t n, void *dst)
{
    (void)be;
    const size_t es = dtype_size(t->type), rb = (size_t)t->n_cols * es;
    for (int64_t r = 0; r < n; r++)
        memcpy((char *)dst + (size_t)r * rb, (const char *)t->data + (size_t)((row0 + r) * t->row_stride) * es, rb);
    return 0;
}

static int cpu_top_k(struct backend *be, const struct tensor *t, int32_t k, int32_t *ids, float *vals)
{
    (void)be;
    assert(t->type == DT_F32);
    for (int64_t r = 0; r < t->n_rows; r++)
        backend_top_k_row((const float *)t->data + r * t->row_stride, t->n_cols, k, ids + r * k,
                          vals ? vals + r * k : NULL);
    return 0;
}

static void cpu_write(struct backend *be, struct tensor *t, int64_t row0, int64_t n, const void *src)
{
    (void)be;
    size_t es = dtype_size(t->type), rb = (size_t)t->n_cols * es;
    for (int64_t r = 0; r < n; r++)
        memcpy((char *)t->data + (size_t)((row0 + r) * t->row_stride) * es, (const char *)src + (size_t)r * rb, rb);
}

static void cpu_copy_rows(struct backend *be, struct tensor *t, const int32_t *src, const int32_t *dst, int32_t n)
{
    (void)be;
    size_t es = dtype_size(t->type), rb = (size_t)t->n_cols * es;
    for (int32_t i = 0; i < n; i++)
        memmove((char *)t->data + (size_t)dst[i] * t->row_stride * es,
                (char *)t->data + (size_t)src[i] * t->row_stride * es, rb);
}

static void cpu_sync(struct backend *be) { (void)be; }
static void cpu_forward_end(struct backend *be) { (void)be; }

static int cpu_set_batch(struct backend *be, const struct attn_batch *b)
{
    cpu_of(be)->b = *b;
    return cpu_group_rows(cpu_of(be));
}

/* ---- matmul ---- */

/* A worker's dequantisation buffer; NULL when no block-type weight was bound. */
static float *dq_of(float *dq, int64_t per_worker, int32_t worker) { return dq ? dq + worker * per_worker : NULL; }

void cpu_backend_set_precise(struct backend *be, bool precise)
{
    struct cpu_backend *c = cpu_of(be);
    c->q8 = !precise && kern_q8_supported(c->k);
    c->bf16 = !precise && kern_bf16_supported(c->k);
}

/* Activation rows for the fast products: rounded already (rows, stride
 * bytes apart) or, rows NULL, to be rounded a token tile at a time into own. */
struct fast_x {
    const uint8_t *rows;
    int64_t stride;
    uint8_t *own;
};

static struct fast_x fast_of(const struct cpu_backend *c, const uint8_t *rows, int64_t stride, int32_t worker)
{
    return (struct fast_x){rows, stride, c->xq_own ? c->xq_own + worker * c->xq_per_worker : NULL};
}

/* Whether w's products take a fast path (int8 or bf16 activations). */
static bool fast_takes(const struct cpu_backend *c, const struct tensor *w)
{
    return (w->type == DT_BF16 ? c->bf16 : c->q8) && fast_row_bytes(w->type, w->n_cols) > 0;
}

/* One activation row of x's k values rounded for w's fast product. */
static void fast_round(const struct kern *k, const struct tensor *w, const float *x, uint8_t *xr)
{
    if (w->type == DT_BF16)
        k->bf16_round(x, w->n_cols, (uint16_t *)xr);
    else
        k->q8_quant(w->type, x, w->n_cols, xr);
}

struct mm_job {
    const struct cpu_backend *c;
    const struct tensor *x, *w;
    struct tensor *out;
    int64_t chunk;
    const uint8_t *xq; /* x rounded for w's fast product, or NULL */
    int64_t xq_stride;
};

/* out's columns [j0, j1) = x . w's rows [j0, j1)^T, the tokens in tiles.
 * With fx the product is the fast one, a token tile at a time over the rows
 * (which stay in L2 between tiles): int8 activations for block types
 * (matmul_q8), bf16 for BF16 weights (matmul_bf16_bf16). Otherwise, for
 * block-type rows, up to KERN_MAX_NX tokens (decoding) go to the kern's
 * matmul_q, which dequantises each chunk in registers for every token at once; a larger
 * batch has the rows dequantised DQ_ROWS at a time into dq (the worker's
 * buffer) and multiplied as fp32 rows, so that each is dequantised once for
 * all its token tiles. Both give the sums matmul_f32 makes over the
 * dequantised rows, so a token's row has the same bits alone and in any
 * batch (on either path). */
static void mm_rows(const struct kern *k, struct tensor *out, const struct tensor *x, const struct tensor *w, int64_t j0,
                    int64_t j1, float *dq, const struct fast_x *fx)
{
    const int64_t n = w->n_cols;
    if (fx) {
        const int64_t rb = fast_row_bytes(w->type, n), xs = fx->rows ? fx->stride : rb;
        assert(fx->rows || fx->own); /* own is sized as the weights are bound */
        const int32_t tile = fast_tile(w->type);
        for (int64_t t = 0; t < x->n_rows; t += tile) {
            int32_t nt = (int32_t)(x->n_rows - t < tile ? x->n_rows - t : tile);
            const uint8_t *xr = fx->rows ? fx->rows + t * fx->stride : fx->own;
            if (!fx->rows)
                for (int32_t i = 0; i < nt; i++)
                    fast_round(k, w, f32_row(x, t + i), fx->own + i * rb);
            if (w->type == DT_BF16) {
                k->matmul_bf16_bf16((const uint16_t *)xr, xs / 2, nt, w->data, w->row_stride, n, f32_row(out, t),
                                    out->row_stride, j0, j1);
                continue;
            }
            const int done = k->matmul_q8(w->type, xr, xs, nt, w->data, w->row_stride, n, f32_row(out, t),
                                          out->row_stride, j0, j1);
            assert(done);
            (void)done;
        }
        return;
    }
    if (dtype_is_block(w->type)) {
        if (x->n_rows <= KERN_MAX_NX && k->matmul_q(w->type, f32_row(x, 0), x->row_stride, (int32_t)x->n_rows, w->data,
                                                    w->row_stride, n, f32_row(out, 0), out->row_stride, j0, j1))
            return;
        for (int64_t jg = j0; jg < j1; jg += DQ_ROWS) {
            const int64_t nr = j1 - jg < DQ_ROWS ? j1 - jg : DQ_ROWS;
            for (int64_t r = 0; r < nr; r++)
                k->dequant(w->type, (const char *)w->data + dtype_bytes(w->type, (jg + r) * w->row_stride), n,
                           dq + r * n);
            for (int64_t t = 0; t < x->n_rows; t += KERN_MAX_NX) {
                int32_t nt = (int32_t)(x->n_rows - t < KERN_MAX_NX ? x->n_rows - t : KERN_MAX_NX);
                k->matmul_f32(f32_row(x, t), x->row_stride, nt, dq, n, n, f32_row(out, t) + jg, out->row_stride, 0,
                              nr);
            }
        }
        return;
    }
    kern_matmul_fn fn = w->type == DT_BF16 ? k->matmul_bf16 : w->type == DT_F16 ? k->matmul_f16 : k->matmul_f32;
    for (int64_t t = 0; t < x->n_rows; t += KERN_MAX_NX) {
        int32_t nt = (int32_t)(x->n_rows - t < KERN_MAX_NX ? x->n_rows - t : KERN_MAX_NX);
        fn(f32_row(x, t), x->row_stride, nt, w->data, w->row_stride, x->n_cols, f32_row(out, t), out->row_stride, j0,
           j1);
    }
}

static void mm_task(void *ctx, int32_t task, int32_t worker)
{
    const struct mm_job *j = ctx;
    const struct cpu_backend *c = j->c;
    int64_t j0 = (int64_t)task * j->chunk, j1 = j0 + j->chunk;
    const struct fast_x fx = fast_of(c, j->xq, j->xq_stride, worker);
    mm_rows(c->k, j->out, j->x, j->w, j0, j1 < j->w->n_rows ? j1 : j->w->n_rows, dq_of(c->dq, c->dq_per_worker, worker),
            fast_takes(c, j->w) ? &fx : NULL);
}

static void round_task(void *ctx, int32_t task, int32_t worker)
{
    (void)worker;
    const struct mm_job *j = ctx;
    fast_round(j->c->k, j->w, f32_row(j->x, task), (uint8_t *)j->xq + task * j->xq_stride);
}

/* The fast path's activation rows of x rounded once into c->xq for all the
 * tasks; left NULL where the buffer cannot grow (each task then rounds its own). */
static void round_rows(struct cpu_backend *c, struct mm_job *j)
{
    const int64_t bytes = j->x->n_rows * j->xq_stride;
    if (bytes > c->xq_cap) {
        uint8_t *p = aligned_alloc(64, (size_t)bytes);
        if (!p)
            return;
        free(c->xq);
        c->xq = p;
        c->xq_cap = bytes;
    }
    j->xq = c->xq;
    if (j->x->n_rows <= KERN_MAX_NX)
        for (int32_t r = 0; r < j->x->n_rows; r++)
            round_task(j, r, 0);
    else
        pool_run(c->pool, round_task, j, (int32_t)j->x->n_rows);
}

static void cpu_matmul(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w)
{
    struct cpu_backend *c = cpu_of(be);
    assert(x->n_cols == w->n_cols && out->n_rows == x->n_rows && out->n_cols == w->n_rows);
    int32_t nth = pool_n_threads(c->pool);
    /* chunks small enough to balance, large enough that a chunk of weights
     * stays in L2 while every token tile passes over it */
    int64_t chunk = w->n_rows / (nth * 8);
    if (chunk < 16)
        chunk = 16;
    if (chunk > 64 && x->n_rows > KERN_MAX_NX)
        chunk = 64;
    chunk = (chunk + 3) & ~(int64_t)3;
    struct mm_job j = {c, x, w, out, chunk, NULL, 0};
    if (fast_takes(c, w)) {
        j.xq_stride = fast_row_bytes(w->type, w->n_cols);
        round_rows(c, &j);
    }
    pool_run(c->pool, mm_task, &j, (int32_t)((w->n_rows + chunk - 1) / chunk));
}

/* ---- row-wise ops ---- */

static void cpu_embed(struct backend *be, struct tensor *out, const struct tensor *table)
{
    const struct cpu_backend *c = cpu_of(be);
    const struct attn_batch *b = &c->b;
    for (int32_t i = 0; i < b->n_tokens; i++)
        c->k->dequant(table->type,
                      (const char *)table->data + dtype_bytes(table->type, (int64_t)b->token[i] * table->row_stride),
                      table->n_cols, f32_row(out, i));
}

static void cpu_rmsnorm(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w, float eps)
{
    const struct kern *k = cpu_of(be)->k;
    const int64_t d = w->n_cols, groups = x->n_cols / d;
    assert(x->n_cols % d == 0 && out->n_cols == x->n_cols);
    float wf[16384];
    assert(d <= 16384);
    for (int64_t c = 0; c < d; c++)
        wf[c] = weight_at(w, c);
    for (int64_t r = 0; r < x->n_rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float *xr = f32_row(x, r) + g * d;
            float *o = f32_row(out, r) + g * d;
            float inv = 1.0f / sqrtf(k->sumsq(xr, d) / (float)d + eps);
            for (int64_t c = 0; c < d; c++)
                o[c] = wf[c] * (xr[c] * inv);
        }
}

static void cpu_rope(struct backend *be, struct tensor *x, int32_t n_head, int32_t head_dim, int32_t rope_dim,
                     const struct tensor *inv_freq, float scale)
{
    const struct attn_batch *b = &cpu_of(be)->b;
    const float *f = inv_freq->data;
    const int32_t half = rope_dim / 2;
    float cs[512], sn[512];
    assert(half <= 512);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        const float pos = (float)b->pos[i];
        for (int32_t d = 0; d < half; d++) {
            float a = pos * f[d];
            cs[d] = cosf(a) * scale;
            sn[d] = sinf(a) * scale;
        }
        for (int32_t h = 0; h < n_head; h++) {
            float *v = f32_row(x, i) + (int64_t)h * head_dim;
            for (int32_t d = 0; d < half; d++) {
                float x1 = v[d], x2 = v[d + half];
                v[d] = x1 * cs[d] - x2 * sn[d];
                v[d + half] = x2 * cs[d] + x1 * sn[d];
            }
        }
    }
}

static void cpu_kv_store(struct backend *be, struct tensor *kc, struct tensor *vc, const struct tensor *k,
                         const struct tensor *v)
{
    const struct attn_batch *b = &cpu_of(be)->b;
    assert(kc->type == vc->type && (kc->type == DT_F32 || kc->type == DT_BF16));
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (kc->type == DT_F32) {
            memcpy(f32_row(kc, b->slot[i]), f32_row(k, i), (size_t)k->n_cols * sizeof(float));
            memcpy(f32_row(vc, b->slot[i]), f32_row(v, i), (size_t)v->n_cols * sizeof(float));
            continue;
        }
        uint16_t *kd = bf16_row(kc, b->slot[i]), *vd = bf16_row(vc, b->slot[i]);
        const float *ks = f32_row(k, i), *vs = f32_row(v, i);
        for (int64_t c = 0; c < k->n_cols; c++)
            kd[c] = f32_to_bf16(ks[c]);
        for (int64_t c = 0; c < v->n_cols; c++)
            vd[c] = f32_to_bf16(vs[c]);
    }
}

static void cpu_swiglu(struct backend *be, struct tensor *out, const struct tensor *gate, const struct tensor *up)
{
    (void)be;
    for (int64_t r = 0; r < gate->n_rows; r++) {
        const float *g = f32_row(gate, r), *u = f32_row(up, r);
        float *o = f32_row(out, r);
        for (int64_t c = 0; c < gate->n_cols; c++)
            o[c] = g[c] / (1.0f + expf(-g[c])) * u[c];
    }
}

static void cpu_add(struct backend *be, struct tensor *x, const struct tensor *y)
{
    (void)be;
    for (int64_t r = 0; r < x->n_rows; r++) {
        float *a = f32_row(x, r);
        const float *c = f32_row(y, r);
        for (int64_t i = 0; i < x->n_cols; i++)
            a[i] += c[i];
    }
}

static void cpu_get_out_rows(struct backend *be, struct tensor *out, const struct tensor *x)
{
    const struct attn_batch *b = &cpu_of(be)->b;
    for (int32_t j = 0; j < b->n_out; j++)
        memcpy(f32_row(out, j), f32_row(x, b->out_rows[j]), (size_t)x->n_cols * sizeof(float));
}

/* ---- attention ---- */

#define ATT_CHUNK 64
#define ATT_MAX_GROUP 16
#define ATT_RUN 64 /* rows of one sequence per task: a chunk's keys are read from memory once for all */

struct att_job {
    const struct kern *k;
    const struct attn_batch *b;
    const int32_t *tile; /* [n_tile+1] first row of each run of rows */
    float *acc;          /* per worker: see att_scratch */
    int64_t acc_stride;
    const float **qp;    /* per worker: [ATT_RUN * heads per kv head] */
    float **yp;
    struct tensor *out;
    const struct tensor *q, *kc, *vc;
    int32_t n_head, n_kv_head, head_dim;
    float scale;
};

/* A worker's floats for a run of nq (row, head) queries: their running
 * outputs [nq][head_dim], scores [nq][ATT_CHUNK], maxima and sums [nq]. */
static int64_t att_scratch(int64_t nq, int64_t head_dim) { return nq * (head_dim + ATT_CHUNK + 2); }

/* A run of up to ATT_RUN rows of one sequence, one kv head and the query
 * heads that share it, in chunks of keys with a running max per row and head
 * (flash-attention style): the same result as softmax(qk^T)v. Per chunk the
 * kern table's scores for every (row, head) query of the run at once, each
 * chunk key loaded once for all of them: a tree's rows read the committed
 * prefix once (chunks outer, rows inner). A query's keys it may not see (past
 * its position, or masked out of a tree) get weight exactly 0. A (query, key)
 * pair's score does not depend on the other queries or keys, nor a query's
 * output on the other rows of its run: a row has the bits it has alone. */
static void att_task(void *ctx, int32_t task, int32_t worker)
{
    const struct att_job *j = ctx;
    const struct attn_batch *b = j->b;
    const int32_t tile = task / j->n_kv_head, g = task % j->n_kv_head;
    const int32_t i0 = j->tile[tile], T = j->tile[tile + 1] - i0;
    const int32_t G = j->n_head / j->n_kv_head, hd = j->head_dim, nq = T * G;
    const int32_t *table = b->block_table + (int64_t)b->seq_row[i0] * b->max_blocks;
    /* query x = row u, head h (x = u*G + h): its output acc + x*hd, its scores s + x*ATT_CHUNK */
    float *const acc = j->acc + worker * j->acc_stride;
    float *const s = acc + (int64_t)nq * hd, *const m = s + (int64_t)nq * ATT_CHUNK, *const l = m + nq;
    const float **const qp = j->qp + (int64_t)worker * ATT_RUN * ATT_MAX_GROUP;
    float **const yp = j->yp + (int64_t)worker * ATT_RUN * ATT_MAX_GROUP;
    const float *krow[ATT_CHUNK], *vrow[ATT_CHUNK];
    const uint16_t *krow16[ATT_CHUNK], *vrow16[ATT_CHUNK]; /* a bf16 cache's rows */
    const bool bf16 = j->kc->type == DT_BF16;
    int32_t n_kv_max = 0;
    for (int32_t u = 0; u < T; u++) {
        for (int32_t h = 0; h < G; h++) {
            const int32_t x = u * G + h;
            m[x] = -INFINITY;
            l[x] = 0;
            qp[x] = f32_row(j->q, i0 + u) + (int64_t)(g * G + h) * hd;
            yp[x] = acc + (int64_t)x * hd;
            memset(yp[x], 0, (size_t)hd * sizeof(float));
        }
        n_kv_max = b->n_kv[i0 + u] > n_kv_max ? b->n_kv[i0 + u] : n_kv_max;
    }
    for (int32_t p0 = 0; p0 < n_kv_max; p0 += ATT_CHUNK) {
        const int32_t n = n_kv_max - p0 < ATT_CHUNK ? n_kv_max - p0 : ATT_CHUNK;
        for (int32_t t = 0; t < n; t++) {
            const int32_t p = p0 + t, r = table[p / b->block_size] * b->block_size + p % b->block_size;
            if (bf16) {
                krow16[t] = bf16_row(j->kc, r) + (int64_t)g * hd;
                vrow16[t] = bf16_row(j->vc, r) + (int64_t)g * hd;
            } else {
                krow[t] = f32_row(j->kc, r) + (int64_t)g * hd;
                vrow[t] = f32_row(j->vc, r) + (int64_t)g * hd;
            }
        }
        if (bf16)
            j->k->scores_bf16(qp, nq, krow16, n, hd, j->scale, s, ATT_CHUNK);
        else
            j->k->scores(qp, nq, krow, n, hd, j->scale, s, ATT_CHUNK);
        for (int32_t u = 0; u < T; u++) {
            const int32_t i = i0 + u, n_kv = b->n_kv[i], mask_from = b->mask_from[i];
            const uint8_t *mask = b->mask ? b->mask + (int64_t)i * b->mask_stride : NULL;
            uint8_t vis[ATT_CHUNK];
            int32_t n_vis = 0, n_pre = 0; /* visible keys; how many lead the chunk unbroken */
            for (int32_t t = 0; t < n; t++) {
                const int32_t p = p0 + t;
                vis[t] = p < n_kv && !(mask && p >= mask_from && !mask[p - mask_from]);
                n_vis += vis[t];
                n_pre += vis[t] && n_pre == t;
            }
            for (int32_t h = 0; h < G; h++) {
                const int32_t x = u * G + h;
                float *sx = s + (int64_t)x * ATT_CHUNK;
                float mx = m[x];
                for (int32_t t = 0; t < n; t++)
                    mx = vis[t] && sx[t] > mx ? sx[t] : mx;
                if (n_vis == 0) {
                    memset(sx, 0, (size_t)n * sizeof(float));
                    continue;
                }
                if (mx > m[x]) {
                    const float corr = expf(m[x] - mx);
                    l[x] *= corr;
                    j->k->scale(yp[x], corr, hd);
                    m[x] = mx;
                }
                /* a causal row sees a prefix of the chunk: its sum is the same
                 * whatever the keys past it, as when it is attended alone */
                if (n_pre == n_vis) {
                    l[x] += j->k->exp_sum(sx, n_pre, mx);
                    memset(sx + n_pre, 0, (size_t)(n - n_pre) * sizeof(float));
                    continue;
                }
                /* holes (a tree's mask): the sum in key order, the keys a
                 * query does not see weighing 0 */
                for (int32_t t = 0; t < n; t++)
                    sx[t] = vis[t] ? sx[t] : mx; /* exp_sum takes scores <= mx */
                j->k->exp_sum(sx, n, mx);
                float part = 0;
                for (int32_t t = 0; t < n; t++) {
                    sx[t] = vis[t] ? sx[t] : 0.0f;
                    part += sx[t];
                }
                l[x] += part;
            }
        }
        if (bf16)
            j->k->axpy_rows_bf16(yp, nq, s, ATT_CHUNK, vrow16, n, hd);
        else
            j->k->axpy_rows(yp, nq, s, ATT_CHUNK, vrow, n, hd);
    }
    for (int32_t u = 0; u < T; u++)
        for (int32_t h = 0; h < G; h++) {
            float *o = f32_row(j->out, i0 + u) + (int64_t)(g * G + h) * hd;
            const int32_t x = u * G + h;
            const float inv = l[x] > 0 ? 1.0f / l[x] : 0.0f;
            for (int32_t c = 0; c < hd; c++)
                o[c] = yp[x][c] * inv;
        }
}

/* Splits the batch into runs of consecutive rows of one sequence (into
 * c->att_tile, returns their number): each sequence's rows into as few runs
 * of at most ATT_RUN as still give every worker a (run, kv head) task, of
 * near-equal length. A tree's rows (up to ATT_RUN) then share one run per kv
 * head while there are enough kv heads to go round. */
static int32_t att_runs(struct cpu_backend *c, int32_t n_kv_head)
{
    const struct attn_batch *b = &c->b;
    int32_t n_seg = 0;
    for (int32_t i = 0; i < b->n_tokens; i++)
        n_seg += i == 0 || b->seq_row[i] != b->seq_row[i - 1];
    const int32_t workers = pool_n_threads(c->pool), tasks = n_seg * n_kv_head; /* one run a sequence */
    const int32_t min_runs = tasks ? (workers + tasks - 1) / tasks : 1;
    int32_t n_tile = 0;
    for (int32_t i0 = 0; i0 < b->n_tokens;) {
        int32_t i1 = i0 + 1;
        while (i1 < b->n_tokens && b->seq_row[i1] == b->seq_row[i0])
            i1++;
        const int32_t R = i1 - i0;
        int32_t runs = (R + ATT_RUN - 1) / ATT_RUN;
        runs = runs < min_runs ? min_runs : runs;
        runs = runs > R ? R : runs;
        for (int32_t r = 0; r < runs; r++)
            c->att_tile[n_tile++] = i0 + (int32_t)((int64_t)R * r / runs);
        i0 = i1;
    }
    c->att_tile[n_tile] = b->n_tokens;
    return n_tile;
}

static void cpu_attention(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *kc,
                          const struct tensor *vc, int32_t n_head, int32_t n_kv_head, int32_t head_dim, float scale)
{
    struct cpu_backend *c = cpu_of(be);
    const struct attn_batch *b = &c->b;
    assert(n_head / n_kv_head <= ATT_MAX_GROUP);
    /* grown by the first forward of a context (its largest batch), as the other scratch */
    if (b->n_tokens + 1 > c->cap_tile) {
        int32_t *t = realloc(c->att_tile, (size_t)(b->n_tokens + 1) * sizeof(int32_t));
        assert(t);
        c->att_tile = t;
        c->cap_tile = b->n_tokens + 1;
    }
    const int32_t workers = pool_n_threads(c->pool);
    const int64_t acc_stride = att_scratch((int64_t)ATT_RUN * (n_head / n_kv_head), head_dim);
    if (acc_stride > c->att_acc_per_worker) {
        float *a = realloc(c->att_acc, (size_t)(acc_stride * workers) * sizeof(float));
        assert(a);
        c->att_acc = a;
        c->att_acc_per_worker = acc_stride;
    }
    if (!c->att_qp) {
        c->att_qp = malloc((size_t)workers * ATT_RUN * ATT_MAX_GROUP * sizeof *c->att_qp);
        c->att_yp = malloc((size_t)workers * ATT_RUN * ATT_MAX_GROUP * sizeof *c->att_yp);
        assert(c->att_qp && c->att_yp);
    }
    c->att_n_runs = att_runs(c, n_kv_head);
    struct att_job j = {.k = c->k, .b = b, .tile = c->att_tile, .acc = c->att_acc, .acc_stride = c->att_acc_per_worker,
                        .qp = c->att_qp, .yp = c->att_yp, .out = out, .q = q, .kc = kc, .vc = vc, .n_head = n_head,
                        .n_kv_head = n_kv_head, .head_dim = head_dim, .scale = scale};
    pool_run(c->pool, att_task, &j, c->att_n_runs * n_kv_head);
}

int32_t cpu_backend_att_runs(const struct backend *be) { return ((const struct cpu_backend *)be)->att_n_runs; }

/* ---- mixture of experts ---- */

/* Index of the largest p[e] among experts not yet taken and allowed (ties: lower index). */
static int64_t route_best(const float *p, int64_t E, const int32_t *taken, int32_t n_taken, const uint8_t *allowed)
{
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++) {
        int t = 0;
        for (int32_t q = 0; q < n_taken; q++)
            t |= taken[q] == e;
        if (!t && (!allowed || allowed[e]) && (best < 0 || p[e] > p[best]))
            best = e;
    }
    return best;
}

static void cpu_moe_route(struct tensor *ids, struct tensor *weights, const struct tensor *logits,
                          const struct moe_routing *rt)
{
    const int64_t E = logits->n_cols;
    const int32_t k = rt->k;
    float p[4096], choice[4096];
    uint8_t allowed[4096];
    assert(E <= 4096 && E % rt->n_group == 0);
    for (int64_t r = 0; r < logits->n_rows; r++) {
        const float *x = f32_row(logits, r);
        if (rt->sigmoid) {
            for (int64_t e = 0; e < E; e++) {
                p[e] = 1.0f / (1.0f + expf(-x[e]));
                choice[e] = p[e] + (rt->bias ? weight_at(rt->bias, e) : 0.0f);
            }
        } else {
            float mx = -INFINITY, sum = 0;
            for (int64_t e = 0; e < E; e++)
                mx = x[e] > mx ? x[e] : mx;
            for (int64_t e = 0; e < E; e++)
                sum += p[e] = expf(x[e] - mx);
            for (int64_t e = 0; e < E; e++)
                choice[e] = p[e] /= sum;
        }
        const uint8_t *allow = NULL;
        if (rt->sigmoid && rt->topk_group < rt->n_group) {
            /* group score: the sum of its two best biased scores */
            const int64_t per = E / rt->n_group;
            float gs[4096];
            for (int32_t g = 0; g < rt->n_group; g++) {
                float b1 = -INFINITY, b2 = -INFINITY;
                for (int64_t e = g * per; e < (g + 1) * per; e++)
                    if (choice[e] > b1)
                        b2 = b1, b1 = choice[e];
                    else if (choice[e] > b2)
                        b2 = choice[e];
                gs[g] = b1 + (per > 1 ? b2 : 0.0f);
            }
            int32_t gsel[4096];
            memset(allowed, 0, (size_t)E);
            for (int32_t j = 0; j < rt->topk_group; j++) {
                gsel[j] = (int32_t)route_best(gs, rt->n_group, gsel, j, NULL);
                memset(allowed + gsel[j] * per, 1, (size_t)per);
            }
            allow = allowed;
        }
        int32_t *id = (int32_t *)ids->data + r * ids->row_stride;
        float *w = f32_row(weights, r), wsum = 0;
        for (int32_t j = 0; j < k; j++) {
            int64_t best = route_best(choice, E, id, j, allow);
            id[j] = (int32_t)best;
            w[j] = p[best];
            wsum += p[best];
        }
        for (int32_t j = 0; j < k; j++) {
            w[j] = (rt->norm ? w[j] / (wsum + (rt->sigmoid ? 1e-20f : 0.0f)) : w[j]) * rt->scale;
            if (rt->spread)
                id[j] = MOE_SPREAD_ID(r, j, E, k);
        }
    }
}

static void cpu_relu2(struct backend *be, struct tensor *x)
{
    (void)be;
    for (int64_t r = 0; r < x->n_rows; r++) {
        float *a = f32_row(x, r);
        for (int64_t i = 0; i < x->n_cols; i++)
            a[i] = a[i] > 0 ? a[i] * a[i] : 0.0f;
    }
}

/* A batch's picks at once, when ws has a row for each (n * k): ws row p holds
 * pick p's [input | gate | up | down] columns, an expert's picks in
 * consecutive rows (off), its tokens in batch order. Two parallel-fors instead
 * of three per expert, and the activation inside them: a decoded token's k
 * experts are k small products each, whose start and end would dominate. */
#define MOE_PICKS_MAX_EXPERT 1024

struct moe_job {
    const struct cpu_backend *c;
    const struct moe_experts *ex;
    const struct tensor *ws;
    const int32_t *act; /* [n_act] the experts picked, in index order */
    const int32_t *off; /* [n_expert + 1] each expert's first ws row */
    int64_t hidden, inter, chunk; /* chunk: output rows of one expert a task computes */
    int32_t n_chunk;              /* tasks per expert */
};

/* a task's expert's picks as rows of ws, columns [c0, c0 + n_cols) */
static struct tensor moe_cols(const struct moe_job *j, int32_t e, int64_t c0, int64_t n_cols)
{
    const struct tensor *ws = j->ws;
    return (struct tensor){DT_F32, j->off[e + 1] - j->off[e], n_cols, ws->row_stride,
                           f32_row(ws, j->off[e]) + c0, false};
}

static void moe_up_task(void *ctx, int32_t task, int32_t worker)
{
    const struct moe_job *j = ctx;
    float *dq = dq_of(j->c->dq, j->c->dq_per_worker, worker);
    const int32_t e = j->act[task / j->n_chunk];
    const int64_t j0 = (task % j->n_chunk) * j->chunk, j1 = j0 + j->chunk < j->inter ? j0 + j->chunk : j->inter;
    const struct tensor x = moe_cols(j, e, 0, j->hidden);
    struct tensor g = moe_cols(j, e, j->hidden, j->inter), u = moe_cols(j, e, j->hidden + j->inter, j->inter);
    const struct fast_x fx = fast_of(j->c, NULL, 0, worker);
    mm_rows(j->c->k, &u, &x, &j->ex->up[e], j0, j1, dq, fast_takes(j->c, &j->ex->up[e]) ? &fx : NULL);
    if (j->ex->gate)
        mm_rows(j->c->k, &g, &x, &j->ex->gate[e], j0, j1, dq, fast_takes(j->c, &j->ex->gate[e]) ? &fx : NULL);
    for (int64_t t = 0; t < u.n_rows; t++) { /* cpu_swiglu's and cpu_relu2's arithmetic */
        float *a = f32_row(&u, t);
        const float *b = f32_row(&g, t);
        for (int64_t c = j0; c < j1; c++)
            a[c] = j->ex->gate ? b[c] / (1.0f + expf(-b[c])) * a[c] : a[c] > 0 ? a[c] * a[c] : 0.0f;
    }
}

static void moe_down_task(void *ctx, int32_t task, int32_t worker)
{
    const struct moe_job *j = ctx;
    const int32_t e = j->act[task / j->n_chunk];
    const int64_t j0 = (task % j->n_chunk) * j->chunk, j1 = j0 + j->chunk < j->hidden ? j0 + j->chunk : j->hidden;
    const struct tensor u = moe_cols(j, e, j->hidden + j->inter, j->inter);
    struct tensor d = moe_cols(j, e, 2 * j->inter + j->hidden, j->hidden);
    const struct fast_x fx = fast_of(j->c, NULL, 0, worker);
    mm_rows(j->c->k, &d, &u, &j->ex->down[e], j0, j1, dq_of(j->c->dq, j->c->dq_per_worker, worker),
            fast_takes(j->c, &j->ex->down[e]) ? &fx : NULL);
}

/* rows per task: about eight tasks a thread over all the experts' rows, a
 * multiple of 4 (the kernels' row tiles) */
static int64_t moe_chunk(int64_t rows, int32_t n_act, int32_t nth)
{
    int64_t c = rows * n_act / (nth * 8);
    c = c < 16 ? 16 : c > rows ? rows : c;
    return (c + 3) & ~(int64_t)3;
}

static void moe_picks(struct cpu_backend *c, struct tensor *sum, const struct moe_block *mb, int64_t hidden,
                      int64_t inter)
{
    const struct moe_experts *ex = &mb->ex;
    const int32_t k = mb->rt.k, E = ex->n_expert, nth = pool_n_threads(c->pool);
    const int64_t n = sum->n_rows;
    const int32_t *ids = mb->ids->data;
    int32_t off[MOE_PICKS_MAX_EXPERT + 1] = {0}, act[MOE_PICKS_MAX_EXPERT], row[4096], n_act = 0;
    for (int64_t r = 0; r < n; r++)
        for (int32_t j = 0; j < k; j++)
            off[ids[r * mb->ids->row_stride + j] + 1]++;
    for (int32_t e = 0; e < E; e++) {
        if (off[e + 1] > 0)
            act[n_act++] = e;
        off[e + 1] += off[e];
    }
    int32_t fill[MOE_PICKS_MAX_EXPERT];
    memcpy(fill, off, sizeof(int32_t) * (size_t)E);
    for (int64_t r = 0; r < n; r++)
        for (int32_t j = 0; j < k; j++) {
            const int32_t p = fill[ids[r * mb->ids->row_stride + j]]++;
            row[r * k + j] = p;
            memcpy(f32_row(mb->ws, p), f32_row(mb->h, r), (size_t)hidden * sizeof(float));
        }
    struct moe_job job = {c, ex, mb->ws, act, off, hidden, inter, moe_chunk(inter, n_act, nth), 0};
    job.n_chunk = (int32_t)((inter + job.chunk - 1) / job.chunk);
    pool_run(c->pool, moe_up_task, &job, n_act * job.n_chunk);
    job.chunk = moe_chunk(hidden, n_act, nth);
    job.n_chunk = (int32_t)((hidden + job.chunk - 1) / job.chunk);
    pool_run(c->pool, moe_down_task, &job, n_act * job.n_chunk);
    /* each token's picks in expert order, as the per-expert loop adds them */
    for (int64_t r = 0; r < n; r++) {
        float *y = f32_row(sum, r);
        memset(y, 0, (size_t)hidden * sizeof(float));
        int32_t done = -1;
        for (int32_t i = 0; i < k; i++) {
            int32_t jb = -1;
            for (int32_t j = 0; j < k; j++) {
                const int32_t e = ids[r * mb->ids->row_stride + j];
                if (e > done && (jb < 0 || e < ids[r * mb->ids->row_stride + jb]))
                    jb = j;
            }
            done = ids[r * mb->ids->row_stride + jb];
            c->k->axpy(y, f32_row(mb->weights, r)[jb], f32_row(mb->ws, row[r * k + jb]) + hidden + 2 * inter, hidden);
        }
    }
}

/* The routed experts in index order, each over the tokens routed to it, as
 * the reference sums them, into sum (ws's last hidden columns). */
static void moe_each(struct backend *be, struct tensor *sum, const struct moe_block *mb, int64_t hidden, int64_t inter)
{
    const struct moe_experts *ex = &mb->ex;
    const struct tensor *ids = mb->ids, *weights = mb->weights, *ws = mb->ws;
    const int64_t n = sum->n_rows;
    const int32_t k = mb->rt.k;
    for (int64_t r = 0; r < n; r++)
        memset(f32_row(sum, r), 0, (size_t)hidden * sizeof(float));
    int32_t rows[4096];
    float wt[4096];
    for (int32_t e = 0; e < ex->n_expert; e++) {
        int32_t m = 0;
        for (int64_t r = 0; r < n; r++)
            for (int32_t j = 0; j < k; j++)
                if (((const int32_t *)ids->data)[r * ids->row_stride + j] == e) {
                    rows[m] = (int32_t)r;
                    wt[m++] = f32_row(weights, r)[j];
                }
        if (m == 0)
            continue;
        struct tensor xe = {DT_F32, m, hidden, ws->row_stride, ws->data, false};
        struct tensor ge = xe, ue = xe, de = xe;
        ge.n_cols = ue.n_cols = inter;
        ge.data = f32_row(ws, 0) + hidden;
        ue.data = f32_row(ws, 0) + hidden + inter;
        for (int32_t t = 0; t < m; t++)
            memcpy(f32_row(&xe, t), f32_row(mb->h, rows[t]), (size_t)hidden * sizeof(float));
        cpu_matmul(be, &ue, &xe, &ex->up[e]);
        if (ex->gate) {
            cpu_matmul(be, &ge, &xe, &ex->gate[e]);
            cpu_swiglu(be, &ue, &ge, &ue);
        } else {
            cpu_relu2(be, &ue);
        }
        cpu_matmul(be, &de, &ue, &ex->down[e]);
        for (int32_t t = 0; t < m; t++)
            cpu_of(be)->k->axpy(f32_row(sum, rows[t]), wt[t], f32_row(&de, t), hidden);
    }
}

/* The block's routed experts: a batch's picks at once where ws has a row for
 * each, else expert by expert (the same bits); their sums, the shared
 * expert's rows added, then added to out (or copied there) once whole. */
static void cpu_moe(struct backend *be, struct tensor *out, const struct tensor *x, const struct moe_block *mb,
                    bool accumulate)
{
    const int64_t n = x->n_rows, hidden = x->n_cols, inter = mb->ex.up[0].n_rows;
    struct tensor *ws = mb->ws;
    assert(ws->n_rows >= n && ws->n_cols >= 2 * (hidden + inter) && n <= 4096);
    cpu_rmsnorm(be, mb->h, x, mb->norm, mb->eps);
    cpu_matmul(be, mb->logits, mb->h, mb->router);
    cpu_moe_route(mb->ids, mb->weights, mb->logits, &mb->rt);
    const bool at_once = n * mb->rt.k <= ws->n_rows && n * mb->rt.k <= 4096 && mb->ex.n_expert <= MOE_PICKS_MAX_EXPERT;
    /* at once: the sums overwrite the picks' inputs, read by then */
    struct tensor sum = {DT_F32, n, hidden, ws->row_stride, f32_row(ws, 0) + (at_once ? 0 : hidden + 2 * inter), false};
    if (at_once)
        moe_picks(cpu_of(be), &sum, mb, hidden, inter);
    else
        moe_each(be, &sum, mb, hidden, inter);
    if (mb->shared) {
        backend_moe_shared(be, mb);
        cpu_add(be, &sum, mb->shared->y);
    }
    if (accumulate) {
        cpu_add(be, out, &sum);
    } else {
        for (int64_t r = 0; r < n; r++)
            memcpy(f32_row(out, r), f32_row(&sum, r), (size_t)hidden * sizeof(float));
    }
}

/* ---- gates, permutations ---- */

static void cpu_sigmoid_mul(struct backend *be, struct tensor *x, const struct tensor *g)
{
    (void)be;
    assert(g->n_rows == x->n_rows && (g->n_cols == x->n_cols || g->n_cols == 1));
    for (int64_t r = 0; r < x->n_rows; r++) {
        float *a = f32_row(x, r);
        const float *s = f32_row(g, r);
        for (int64_t i = 0; i < x->n_cols; i++)
            a[i] *= 1.0f / (1.0f + expf(-s[g->n_cols == 1 ? 0 : i]));
    }
}

static void cpu_permute_cols(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *map)
{
    (void)be;
    const int32_t *m = map->data;
    assert(map->type == DT_I32 && map->n_cols == out->n_cols && out->data != x->data);
    for (int64_t r = 0; r < x->n_rows; r++) {
        const float *a = f32_row(x, r);
        float *o = f32_row(out, r);
        for (int64_t j = 0; j < out->n_cols; j++)
            o[j] = a[m[j]];
    }
}

static void cpu_rmsnorm_gated(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *z,
                              const struct tensor *w, float eps, int64_t group, bool gate_first)
{
    const struct kern *k = cpu_of(be)->k;
    assert(x->n_cols % group == 0 && (w->n_cols == group || w->n_cols == x->n_cols) && group <= 16384);
    float t[16384];
    for (int64_t r = 0; r < x->n_rows; r++)
        for (int64_t g0 = 0; g0 < x->n_cols; g0 += group) {
            const float *a = f32_row(x, r) + g0, *zr = f32_row(z, r) + g0;
            float *o = f32_row(out, r) + g0;
            const int64_t w0 = w->n_cols == group ? 0 : g0;
            for (int64_t c = 0; c < group; c++)
                t[c] = gate_first ? a[c] * (zr[c] / (1.0f + expf(-zr[c]))) : a[c];
            float inv = 1.0f / sqrtf(k->sumsq(t, group) / (float)group + eps);
            for (int64_t c = 0; c < group; c++) {
                float v = weight_at(w, w0 + c) * (t[c] * inv);
                o[c] = gate_first ? v : v * (zr[c] / (1.0f + expf(-zr[c])));
            }
        }
}

/* ---- lifetime ---- */

static void cpu_free(struct backend *be)
{
    struct cpu_backend *c = cpu_of(be);
    pool_free(c->pool);
    free(c->grp_start);
    free(c->grp_rows);
    free(c->att_tile);
    free(c->att_acc);
    free(c->att_qp);
    free(c->att_yp);
    free(c->scratch);
    free(c->dq);
    free(c->xq);
    free(c->xq_own);
    free(c);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .kv_bf16 = true,
    .prefill_chunk = 128,
    .free = cpu_free,
    .info = cpu_info,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .weight = cpu_weight,
    .read = cpu_read,
    .top_k = cpu_top_k,
    .write = cpu_write,
    .copy_rows = cpu_copy_rows,
    .sync = cpu_sync,
    .forward_end = cpu_forward_end,
    .set_batch = cpu_set_batch,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .matmul_fused = backend_matmul_pieces, /* on the host there is no launch to save */
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attn_prep = backend_attn_prep_pieces,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .get_out_rows = cpu_get_out_rows,
    .moe = cpu_moe,
    .sigmoid_mul = cpu_sigmoid_mul,
    .relu2 = cpu_relu2,
    .permute_cols = cpu_permute_cols,
    .rmsnorm_gated = cpu_rmsnorm_gated,
    .conv1d = cpu_conv1d,
    .delta_rule = cpu_delta_rule,
    .ssd = cpu_ssd,
};

struct backend *cpu_backend_init(int32_t n_threads, const struct kern *kern)
{
    if (n_threads <= 0)
        n_threads = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    if (kern && !kern_supported(kern)) {
        err_set("cpu: this CPU cannot run the %s kernels", kern->name);
        return NULL;
    }
    struct cpu_backend *c = calloc(1, sizeof *c);
    if (!c) {
        err_set("cpu: out of memory");
        return NULL;
    }
    c->base.ops = &cpu_ops;
    c->k = kern ? kern : kern_best();
    c->q8 = kern_q8_supported(c->k);
    c->bf16 = kern_bf16_supported(c->k);
    c->pool = pool_init(n_threads);
    if (!c->pool) {
        free(c);
        return NULL;
    }
    return &c->base;
}
