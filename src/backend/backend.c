/* backend: what the backends share beside their op tables (see backend.h):
 * the fused ops run as separate ones, top_k of a host row. */
#include "backend.h"

#include <assert.h>
#include <math.h>

void backend_matmul_pieces(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                           const struct tensor *x, const struct mm_fused *f)
{
    const struct backend_ops *op = be->ops;
    assert(n_w >= 1 && n_w <= MM_MAX_W);
    const struct tensor *in = f->pre == MM_PRE_NONE ? x : f->pre_buf;
    switch (f->pre) {
    case MM_PRE_RMSNORM: op->rmsnorm(be, f->pre_buf, x, f->norm, f->eps); break;
    case MM_PRE_SWIGLU: op->swiglu(be, f->pre_buf, x, f->up); break;
    case MM_PRE_RELU2:
        assert(f->pre_buf->data == x->data);
        op->relu2(be, f->pre_buf);
        break;
    default: break;
    }
    for (int32_t i = 0; i < n_w; i++) {
        if (!f->accumulate) {
            op->matmul(be, out[i], in, w[i]);
            continue;
        }
        struct tensor t = tensor_cols(f->acc_buf, 0, w[i]->n_rows);
        t.n_rows = x->n_rows;
        op->matmul(be, &t, in, w[i]);
        op->add(be, out[i], &t);
    }
}

void backend_mlp(struct backend *be, const struct mlp_block *p, const struct tensor *x, struct tensor *out,
                 bool accumulate)
{
    const struct backend_ops *op = be->ops;
    const int64_t n = x->n_rows, inter = p->up->n_rows;
    struct tensor g = tensor_rows(p->g, 0, n), u = tensor_rows(p->u, 0, n);
    assert(g.n_cols >= inter && u.n_cols >= inter && (!p->norm || p->h) && (!accumulate || p->acc));
    g.n_cols = u.n_cols = inter;
    const struct mm_fused in = {.pre = p->norm ? MM_PRE_RMSNORM : MM_PRE_NONE, .norm = p->norm, .eps = p->eps,
                                .pre_buf = p->h};
    struct mm_fused act = {.accumulate = accumulate, .acc_buf = p->acc, .pre_buf = &u};
    const struct tensor *down_in = &u;
    if (p->gate) {
        op->matmul_fused(be, 2, (struct tensor *const[]){&g, &u}, (const struct tensor *const[]){p->gate, p->up}, x,
                         &in);
        act.pre = MM_PRE_SWIGLU;
        act.up = &u;
        down_in = &g;
    } else {
        op->matmul_fused(be, 1, (struct tensor *const[]){&u}, (const struct tensor *const[]){p->up}, x, &in);
        act.pre = MM_PRE_RELU2;
    }
    op->matmul_fused(be, 1, (struct tensor *const[]){out}, (const struct tensor *const[]){p->down}, down_in, &act);
}

void backend_moe_shared(struct backend *be, const struct moe_block *mb)
{
    const struct moe_shared *sh = mb->shared;
    backend_mlp(be, &sh->mlp, mb->h, sh->y, false);
    if (sh->mix) {
        be->ops->matmul(be, sh->mix_out, mb->h, sh->mix);
        be->ops->sigmoid_mul(be, sh->y, sh->mix_out);
    }
}

void backend_attn_prep_pieces(struct backend *be, struct tensor *q, struct tensor *k, const struct tensor *v,
                              struct tensor *k_cache, struct tensor *v_cache, const struct attn_prep *p)
{
    const struct backend_ops *op = be->ops;
    op->rmsnorm(be, q, q, p->q_norm, p->eps);
    op->rmsnorm(be, k, k, p->k_norm, p->eps);
    op->rope(be, q, p->n_head, p->head_dim, p->rope_dim, p->inv_freq, p->rope_scale);
    op->rope(be, k, p->n_kv_head, p->head_dim, p->rope_dim, p->inv_freq, p->rope_scale);
    op->kv_store(be, k_cache, v_cache, k, v);
}

void backend_top_k_row(const float *x, int64_t n, int32_t k, int32_t *ids, float *vals)
{
    assert(k >= 1 && k <= TOP_K_MAX && n >= k);
    int32_t nb = 0;
    float thr = 0.0f; /* the k-th value, once there are k */
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
        const int64_t t1 = t0 + 16 < n ? t0 + 16 : n;
        if (nb == k) { /* most runs of 16 hold nothing above the k-th: one vector max decides */
            float m = -INFINITY; /* a NaN never rises above it, as below */
            for (int64_t t = t0; t < t1; t++)
                m = x[t] > m ? x[t] : m;
            if (!(m > thr))
                continue;
        }
        for (int64_t t = t0; t < t1; t++) {
            /* a value equal to the k-th stays out: the lower column came first */
            if (nb == k && !(x[t] > thr))
                continue;
            int32_t q = nb < k ? nb++ : nb - 1;
            while (q > 0 && x[ids[q - 1]] < x[t]) {
                ids[q] = ids[q - 1];
                q--;
            }
            ids[q] = (int32_t)t;
            if (nb == k)
                thr = x[ids[k - 1]];
        }
    }
    if (vals)
        for (int32_t q = 0; q < k; q++)
            vals[q] = x[ids[q]];
}

int32_t backend_group_rows(const struct attn_batch *b, int32_t *start, int32_t *rows)
{
    int32_t g = 0, k = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        bool first = true;
        for (int32_t r = 0; r < i && first; r++)
            first = b->seq_row[r] != b->seq_row[i];
        if (!first)
            continue;
        start[g++] = k;
        for (int32_t r = i; r < b->n_tokens; r++)
            if (b->seq_row[r] == b->seq_row[i])
                rows[k++] = r;
    }
    start[g] = k;
    return g;
}

bool backend_rows_chain(const struct attn_batch *b, const int32_t *rows, int32_t n)
{
    for (int32_t j = 0; j < n; j++) {
        if (b->parent[rows[j]] != (j ? rows[j - 1] : -1))
            return false;
        if (j + 1 < n && b->state_out[rows[j]] >= 0)
            return false;
    }
    return true;
}
