/* moe: expert routing and the routed experts on the GPU.
 *
 * Routing is the cpu backend's loop, one thread per token (ties to the lower
 * index, the same float operations in the same order). The experts run as
 * the reference sums them: in index order, each over the tokens routed to it
 * (gather, up/gate, activation, down, weighted add into the output), so each
 * token adds its experts' outputs in the same order as on the cpu. The token
 * lists are built on the host from the routed ids: one small copy back per
 * MoE layer. */
#include "cuda_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MOE_MAX_EXPERT 1024

static __device__ int64_t route_best(const float *p, int64_t E, const int32_t *taken, int32_t n_taken,
                                     const uint8_t *allowed)
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

struct route_args {
    int32_t *ids;
    int64_t is;
    float *w;
    int64_t wst;
    const float *logits;
    int64_t ls;
    int64_t n, E;
    int32_t k, n_group, topk_group;
    bool sigmoid, norm;
    const void *bias;
    enum dtype bias_t;
    float scale;
};

/* one block per token; its first thread runs the cpu loop on shared arrays */
__global__ void k_moe_route(struct route_args a)
{
    const int64_t r = blockIdx.x;
    if (threadIdx.x != 0)
        return;
    const int64_t E = a.E;
    __shared__ float p[MOE_MAX_EXPERT], choice[MOE_MAX_EXPERT], gs[MOE_MAX_EXPERT];
    __shared__ int32_t gsel[MOE_MAX_EXPERT];
    __shared__ uint8_t allowed[MOE_MAX_EXPERT];
    const float *x = a.logits + r * a.ls;
    if (a.sigmoid) {
        for (int64_t e = 0; e < E; e++) {
            p[e] = 1.0f / (1.0f + expf(-x[e]));
            choice[e] = p[e] + (a.bias ? dev_weight(a.bias, a.bias_t, e) : 0.0f);
        }
    } else {
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; e++)
            mx = x[e] > mx ? x[e] : mx;
        for (int64_t e = 0; e < E; e++)
            sum += p[e] = expf(x[e] - mx);
        for (int64_t e = 0; e < E; e++)
            choice[e] = p[e] /= sum;
    }
    const uint8_t *allow = NULL;
    if (a.sigmoid && a.topk_group < a.n_group) {
        const int64_t per = E / a.n_group;
        for (int32_t g = 0; g < a.n_group; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int64_t e = g * per; e < (g + 1) * per; e++)
                if (choice[e] > b1)
                    b2 = b1, b1 = choice[e];
                else if (choice[e] > b2)
                    b2 = choice[e];
            gs[g] = b1 + (per > 1 ? b2 : 0.0f);
        }
        for (int64_t e = 0; e < E; e++)
            allowed[e] = 0;
        for (int32_t j = 0; j < a.topk_group; j++) {
            gsel[j] = (int32_t)route_best(gs, a.n_group, gsel, j, NULL);
            for (int64_t e = gsel[j] * per; e < (gsel[j] + 1) * per; e++)
                allowed[e] = 1;
        }
        allow = allowed;
    }
    int32_t *id = a.ids + r * a.is;
    float *w = a.w + r * a.wst, wsum = 0.0f;
    for (int32_t j = 0; j < a.k; j++) {
        const int64_t best = route_best(choice, E, id, j, allow);
        id[j] = (int32_t)best;
        w[j] = p[best];
        wsum += p[best];
    }
    for (int32_t j = 0; j < a.k; j++)
        w[j] = (a.norm ? w[j] / (wsum + (a.sigmoid ? 1e-20f : 0.0f)) : w[j]) * a.scale;
}

void cuda_moe_route(struct backend *be, struct tensor *ids, struct tensor *weights, const struct tensor *logits,
                    const struct moe_routing *rt)
{
    struct cuda_backend *c = cuda_of(be);
    assert(logits->n_cols <= MOE_MAX_EXPERT && logits->n_cols % rt->n_group == 0);
    if (cuda_op_skip(c) || logits->n_rows == 0)
        return;
    struct route_args a = {
        (int32_t *)ids->data, ids->row_stride, (float *)weights->data, weights->row_stride,
        (const float *)logits->data, logits->row_stride, logits->n_rows, logits->n_cols, rt->k, rt->n_group,
        rt->topk_group, rt->sigmoid, rt->norm, rt->bias ? rt->bias->data : NULL,
        rt->bias ? rt->bias->type : DT_F32, rt->scale,
    };
    k_moe_route<<<(unsigned)logits->n_rows, 32, 0, c->stream>>>(a);
    CUDA_LAUNCHED(c);
}

void cuda_moe_ffn(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *ids,
                  const struct tensor *weights, const struct moe_experts *ex, struct tensor *ws)
{
    struct cuda_backend *c = cuda_of(be);
    const int64_t n = x->n_rows, hidden = x->n_cols, inter = ex->up[0].n_rows;
    const int32_t k = (int32_t)ids->n_cols, E = ex->n_expert;
    assert(ws->n_rows >= n && ws->n_cols >= hidden + 2 * inter);
    if (cuda_op_skip(c) || n == 0)
        return;
    cuda_host_wait(c);
    /* host: ids and weights back, then each expert's token list and weights */
    const size_t nk = (size_t)(n * k);
    int32_t *hid = (int32_t *)malloc(nk * sizeof(int32_t) * 2 + (size_t)(E + 1) * sizeof(int32_t) +
                                     nk * (sizeof(int32_t) + sizeof(float)));
    if (!hid) {
        c->failed = true;
        err_set("cuda: out of memory");
        return;
    }
    float *hw = (float *)(hid + nk);
    int32_t *start = (int32_t *)(hw + nk), *rows = start + E + 1;
    float *wt = (float *)(rows + nk);
    if (CUDA_CHECK(c, cudaMemcpy2DAsync(hid, (size_t)k * 4, ids->data, (size_t)ids->row_stride * 4, (size_t)k * 4,
                                        (size_t)n, cudaMemcpyDeviceToHost, c->stream)) != 0 ||
        CUDA_CHECK(c, cudaMemcpy2DAsync(hw, (size_t)k * 4, weights->data, (size_t)weights->row_stride * 4,
                                        (size_t)k * 4, (size_t)n, cudaMemcpyDeviceToHost, c->stream)) != 0 ||
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) != 0)
        goto done;
    {
        int32_t m = 0;
        for (int32_t e = 0; e < E; e++) {
            start[e] = m;
            for (int64_t r = 0; r < n; r++)
                for (int32_t j = 0; j < k; j++)
                    if (hid[r * k + j] == e) {
                        rows[m] = (int32_t)r;
                        wt[m++] = hw[r * k + j];
                    }
        }
        start[E] = m;
        int32_t *d_rows = (int32_t *)cuda_scratch(c, SCR_REC, nk * (sizeof(int32_t) + sizeof(float)));
        if (!d_rows)
            goto done;
        float *d_wt = (float *)(d_rows + nk);
        if (CUDA_CHECK(c, cudaMemcpyAsync(d_rows, rows, nk * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream)) != 0 ||
            CUDA_CHECK(c, cudaMemcpyAsync(d_wt, wt, nk * sizeof(float), cudaMemcpyHostToDevice, c->stream)) != 0 ||
            CUDA_CHECK(c, cudaMemset2DAsync(out->data, (size_t)out->row_stride * 4, 0, (size_t)hidden * 4, (size_t)n,
                                            c->stream)) != 0)
            goto done;
        for (int32_t e = 0; e < E; e++) {
            const int32_t me = start[e + 1] - start[e];
            if (me == 0)
                continue;
            struct tensor xe = {DT_F32, me, hidden, ws->row_stride, ws->data, false};
            struct tensor ge = xe, ue = xe;
            ge.n_cols = ue.n_cols = inter;
            ge.data = (float *)ws->data + hidden;
            ue.data = (float *)ws->data + hidden + inter;
            cuda_gather_rows(c, &xe, x, d_rows + start[e], me);
            cuda_matmul(be, &ue, &xe, &ex->up[e]);
            if (ex->gate) {
                cuda_matmul(be, &ge, &xe, &ex->gate[e]);
                cuda_swiglu(be, &ue, &ge, &ue);
            } else {
                cuda_relu2(be, &ue);
            }
            cuda_matmul(be, &xe, &ue, &ex->down[e]);
            cuda_scatter_add(c, out, &xe, d_rows + start[e], d_wt + start[e], me);
        }
        /* the host lists must outlive the copies above */
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    }
done:
    free(hid);
}
