/* cuda: backend_ops on an NVIDIA GPU: memory, the batch upload, the op table
 * (see cuda.h for the numerics, cuda_impl.h for how failures travel). The ops
 * themselves are in matmul.cu, attention.cu, ops.cu, moe.cu and recurrent.cu. */
#include "cuda_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuda_fail(struct cuda_backend *c, cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess)
        return 0;
    if (c && !c->failed) {
        c->failed = true;
        err_set("cuda: %s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
    } else if (!c) {
        err_set("cuda: %s: %s", what, cudaGetErrorString(e));
    }
    return -1;
}

/* ---- graphs of small forwards (see cuda_impl.h) ---- */

static void graph_clear(struct cuda_backend *c)
{
    bool any = false;
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++)
        any |= c->graphs[i].exec != NULL;
    if (any && !c->capturing)
        cudaStreamSynchronize(c->stream); /* none may still be running */
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++)
        if (c->graphs[i].exec) {
            cudaGraphExecDestroy(c->graphs[i].exec);
            c->graphs[i].exec = NULL;
        }
    c->clean_key = 0;
}

/* A host wait inside a recorded forward: the ops recorded so far never ran. */
static void graph_abort(struct cuda_backend *c)
{
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(c->in_branch ? c->main_stream : c->stream, &g);
    if (g)
        cudaGraphDestroy(g);
    cudaGetLastError();
    c->capturing = false;
    c->graphs_off = true;
    if (!c->failed) {
        c->failed = true;
        err_set("cuda: a recorded forward waited on the host (graphs are now off; retry the request)");
    }
}

void cuda_host_wait(struct cuda_backend *c)
{
    c->dirty = true;
    if (c->capturing)
        graph_abort(c);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

static void graph_begin(struct cuda_backend *c, const struct attn_batch *b)
{
    c->in_forward = b->owner && b->n_tokens <= CUDA_SMALL_N && !c->graphs_off && !c->failed;
    c->dirty = false;
    if (!c->in_forward)
        return;
    const struct {
        const void *owner;
        struct dev_batch d;
        int32_t n, n_out, tiles;
    } k = {b->owner, c->d, b->n_tokens, b->n_out, (c->max_vis + 31) / 32};
    c->key = fnv(0xcbf29ce484222325ull, &k, sizeof k);
    for (int i = 0; i < CUDA_MAX_GRAPHS; i++)
        if (c->graphs[i].exec && c->graphs[i].key == c->key) {
            c->graphs[i].used = ++c->tick;
            c->replaying = CUDA_CHECK(c, cudaGraphLaunch(c->graphs[i].exec, c->stream)) == 0;
            return;
        }
    if (c->key == c->clean_key)
        c->capturing = CUDA_CHECK(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal)) == 0;
}

static void cu_forward_end(struct backend *be)
{
    struct cuda_backend *c = cuda_of(be);
    if (!c->in_forward)
        return;
    if (c->capturing) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t exec = NULL;
        c->capturing = false;
        if (CUDA_CHECK(c, cudaStreamEndCapture(c->stream, &g)) == 0 &&
            CUDA_CHECK(c, cudaGraphInstantiate(&exec, g, 0)) == 0) {
            int lru = 0;
            for (int i = 1; i < CUDA_MAX_GRAPHS; i++)
                if (c->graphs[i].used < c->graphs[lru].used)
                    lru = i;
            if (c->graphs[lru].exec)
                cudaGraphExecDestroy(c->graphs[lru].exec);
            c->graphs[lru].key = c->key;
            c->graphs[lru].exec = exec;
            c->graphs[lru].used = ++c->tick;
            CUDA_CHECK(c, cudaGraphLaunch(exec, c->stream));
        }
        if (g)
            cudaGraphDestroy(g);
    } else if (!c->replaying && !c->dirty) {
        c->clean_key = c->key;
    }
    c->replaying = c->in_forward = false;
}

void cuda_branch_begin(struct cuda_backend *c)
{
    assert(!c->in_branch && !c->to_join);
    if (cuda_op_skip(c) || CUDA_CHECK(c, cudaEventRecord(c->fork_ev, c->stream)) != 0 ||
        CUDA_CHECK(c, cudaStreamWaitEvent(c->side_stream, c->fork_ev, 0)) != 0)
        return;
    c->main_stream = c->stream;
    c->stream = c->side_stream;
    unsigned *t = c->counters;
    c->counters = c->side_counters;
    c->side_counters = t;
    c->in_branch = true;
}

void cuda_branch_end(struct cuda_backend *c)
{
    if (!c->in_branch)
        return;
    c->stream = c->main_stream;
    unsigned *t = c->counters;
    c->counters = c->side_counters;
    c->side_counters = t;
    c->in_branch = false;
    /* joined even after a failure: a capture ends only with its streams joined */
    c->to_join = CUDA_CHECK(c, cudaEventRecord(c->join_ev, c->side_stream)) == 0;
}

void cuda_branch_join(struct cuda_backend *c)
{
    if (c->to_join)
        CUDA_CHECK(c, cudaStreamWaitEvent(c->stream, c->join_ev, 0));
    c->to_join = false;
}

void *cuda_scratch(struct cuda_backend *c, int which, size_t bytes)
{
    assert(!c->in_branch || which == SCR_MATMUL);
    if (c->in_branch)
        which = SCR_SIDE; /* the main stream's products may be using SCR_MATMUL */
    if (bytes <= c->scr_cap[which])
        return c->scr[which];
    cuda_host_wait(c);
    graph_clear(c); /* recorded kernels point at the old buffer */
    /* the stream may still use the old buffer */
    if (CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) != 0)
        return NULL;
    cudaFree(c->scr[which]);
    c->scr[which] = NULL;
    c->scr_cap[which] = 0;
    bytes = (bytes + 0xfffff) & ~(size_t)0xfffff;
    if (CUDA_CHECK(c, cudaMalloc(&c->scr[which], bytes)) != 0)
        return NULL;
    c->scr_cap[which] = bytes;
    return c->scr[which];
}

int cuda_scratch_pieces(struct cuda_backend *c, int which, int n, const size_t *bytes, void **piece)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += (bytes[i] + 255) & ~(size_t)255;
    char *p = (char *)cuda_scratch(c, which, total);
    if (!p)
        return -1;
    for (int i = 0; i < n; i++) {
        piece[i] = p;
        p += (bytes[i] + 255) & ~(size_t)255;
    }
    return 0;
}

int32_t cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* Dense bf16 tensor-core FLOPs an SM does a clock, where NVIDIA publishes
 * them: A100 (8.0) 2048, H100 and H200 (9.0) 4096; 0 elsewhere (unknown). */
static double cu_bf16_flops_per_clock(int major, int minor)
{
    return major == 9 && minor == 0 ? 4096 : major == 8 && minor == 0 ? 2048 : 0;
}

int cuda_device_query(int32_t dev, struct device_info *info)
{
    struct cudaDeviceProp p;
    memset(info, 0, sizeof *info);
    if (cuda_fail(NULL, cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties", __FILE__, __LINE__) != 0)
        return -1;
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->gpu = true;
    info->n_units = p.multiProcessorCount;
    snprintf(info->arch, sizeof info->arch, "%d.%d", p.major, p.minor);
    int drv = 0, rt = 0, clk = 0, mclk = 0, bus = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    snprintf(info->software, sizeof info->software, "driver %d.%d, runtime %d.%d", drv / 1000, drv % 1000 / 10,
             rt / 1000, rt % 1000 / 10);
    /* peaks from the clocks the driver reports (kHz): memory transfers on
     * both edges of its clock over the whole bus */
    if (cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
        info->read_gbs = 2.0 * mclk * 1e3 * (bus / 8) / 1e9;
    if (cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev) == cudaSuccess)
        info->bf16_tflops = cu_bf16_flops_per_clock(p.major, p.minor) * p.multiProcessorCount * clk * 1e3 / 1e12;
    int cur = 0;
    size_t fr = 0, tot = 0;
    cudaGetDevice(&cur);
    if (cudaSetDevice(dev) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        info->mem_free = (int64_t)fr;
        info->mem_total = (int64_t)tot;
    }
    cudaSetDevice(cur);
    return 0;
}

static void cu_info(struct backend *be, struct device_info *out, bool measure)
{
    (void)measure; /* the peaks are the spec's */
    if (cuda_device_query(cuda_of(be)->dev, out) != 0)
        snprintf(out->name, sizeof out->name, "cuda:%d", (int)cuda_of(be)->dev);
}

/* ---- memory ---- */

static int cu_alloc(struct backend *be, struct tensor *t, enum dtype type, int64_t n_rows, int64_t n_cols)
{
    struct cuda_backend *c = cuda_of(be);
    size_t bytes = (size_t)(n_rows * n_cols) * dtype_size(type);
    void *p = NULL;
    memset(t, 0, sizeof *t);
    if (c->failed)
        return -1;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return err_set("cuda: cannot allocate %.1f MiB of device memory (%.1f of %.1f GiB free): the model and its "
                       "cache do not fit this GPU; `kapitsa doctor` lists what fits, or use --ctx with less or "
                       "--device cpu",
                       (double)bytes / (1 << 20), (double)fr / (1 << 30), (double)tot / (1 << 30));
    }
    if (CUDA_CHECK(c, cudaMemsetAsync(p, 0, bytes, c->stream)) != 0) {
        cudaFree(p);
        return -1;
    }
    *t = (struct tensor){type, n_rows, n_cols, n_cols, p, true};
    return 0;
}

static void cu_release(struct backend *be, struct tensor *t)
{
    graph_clear(cuda_of(be)); /* a recorded forward may use this tensor */
    if (t->owned)
        cudaFree(t->data);
    memset(t, 0, sizeof *t);
}

static int cu_weight(struct backend *be, struct tensor *dst, const struct tensor *host)
{
    struct cuda_backend *c = cuda_of(be);
    if (dtype_is_block(host->type))
        return cuda_weight_q(c, dst, host);
    if (cu_alloc(be, dst, host->type, host->n_rows, host->n_cols) != 0)
        return -1;
    size_t es = dtype_size(host->type);
    if (CUDA_CHECK(c, cudaMemcpy2DAsync(dst->data, (size_t)dst->row_stride * es, host->data,
                                        (size_t)host->row_stride * es, (size_t)host->n_cols * es,
                                        (size_t)host->n_rows, cudaMemcpyHostToDevice, c->stream)) != 0 ||
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) != 0) {
        cu_release(be, dst);
        return -1;
    }
    return 0;
}

static int cu_read(struct backend *be, const struct tensor *t, int64_t row0, int64_t n, void *dst)
{
    struct cuda_backend *c = cuda_of(be);
    if (c->in_forward)
        cuda_host_wait(c);
    const size_t es = dtype_size(t->type);
    if (!c->failed)
        CUDA_CHECK(c, cudaMemcpy2DAsync(dst, (size_t)t->n_cols * es, (const char *)t->data + (size_t)(row0 * t->row_stride) * es,
                                        (size_t)t->row_stride * es, (size_t)t->n_cols * es, (size_t)n,
                                        cudaMemcpyDeviceToHost, c->stream));
    if (!c->failed)
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
    if (c->failed)
        memset(dst, 0, (size_t)(n * t->n_cols) * es);
    return c->failed ? -1 : 0;
}

static void cu_write(struct backend *be, struct tensor *t, int64_t row0, int64_t n, const void *src)
{
    struct cuda_backend *c = cuda_of(be);
    if (c->in_forward)
        cuda_host_wait(c);
    size_t es = dtype_size(t->type);
    if (c->failed)
        return;
    if (CUDA_CHECK(c, cudaMemcpy2DAsync((char *)t->data + (size_t)(row0 * t->row_stride) * es,
                                        (size_t)t->row_stride * es, src, (size_t)t->n_cols * es,
                                        (size_t)t->n_cols * es, (size_t)n, cudaMemcpyHostToDevice, c->stream)) == 0)
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
}

#define COPY_PAIRS 128
struct copy_pairs {
    int32_t src[COPY_PAIRS], dst[COPY_PAIRS];
};

/* block (x, y): pair y's 32-bit words [x, x+1) * CR_WORDS, eight per thread
 * loaded before any is stored */
#define CR_WORDS (8 * 256)
__global__ void k_copy_rows(char *base, size_t row_bytes, size_t words, struct copy_pairs p)
{
    const uint32_t *s = (const uint32_t *)(base + (size_t)p.src[blockIdx.y] * row_bytes);
    uint32_t *d = (uint32_t *)(base + (size_t)p.dst[blockIdx.y] * row_bytes), v[8];
    const size_t w0 = (size_t)blockIdx.x * CR_WORDS + threadIdx.x;
#pragma unroll
    for (int u = 0; u < 8; u++)
        v[u] = w0 + u * 256 < words ? s[w0 + u * 256] : 0;
#pragma unroll
    for (int u = 0; u < 8; u++)
        if (w0 + u * 256 < words)
            d[w0 + u * 256] = v[u];
}

/* The caller's contract is memmove in a loop: a later copy may read a row an
 * earlier one wrote, or overwrite a row an earlier one read. Pairs that
 * touch no row another one writes run in one launch, every pair and every
 * part of a row at once; the rest one launch per pair, in order. */
static void cu_copy_rows(struct backend *be, struct tensor *t, const int32_t *src, const int32_t *dst, int32_t n)
{
    struct cuda_backend *c = cuda_of(be);
    size_t es = dtype_size(t->type), row_bytes = (size_t)t->row_stride * es, words = (size_t)t->n_cols * es / 4;
    assert(((size_t)t->n_cols * es) % 4 == 0 && row_bytes % 4 == 0);
    if (c->in_forward)
        cuda_host_wait(c);
    if (c->failed)
        return;
    const unsigned parts = (unsigned)cdiv((int64_t)words, CR_WORDS);
    for (int32_t i0 = 0; i0 < n;) {
        struct copy_pairs p;
        int32_t m = 0;
        for (; i0 + m < n && m < COPY_PAIRS; m++) {
            const int32_t s1 = src[i0 + m], d1 = dst[i0 + m];
            bool clash = false;
            for (int32_t j = 0; j < m && !clash; j++)
                clash = p.dst[j] == s1 || p.dst[j] == d1 || p.src[j] == d1;
            if (clash)
                break;
            p.src[m] = s1;
            p.dst[m] = d1;
        }
        k_copy_rows<<<dim3(parts, (unsigned)m), 256, 0, c->stream>>>((char *)t->data, row_bytes, words, p);
        if (CUDA_LAUNCHED(c) != 0)
            return;
        i0 += m;
    }
}

static void cu_sync(struct backend *be)
{
    struct cuda_backend *c = cuda_of(be);
    if (c->in_forward)
        cuda_host_wait(c);
    if (!c->failed)
        CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
}

/* ---- the batch ---- */

static int cu_set_batch(struct backend *be, const struct attn_batch *b)
{
    struct cuda_backend *c = cuda_of(be);
    const int32_t n = b->n_tokens;
    cu_forward_end(be); /* a forward without forward_end (no owner) ends here */
    if (c->failed)
        return -1;
    c->b = *b;
    /* visible positions past mask_from, for attention over compacted keys */
    int32_t vis_stride = 0;
    if (b->mask && b->n_kv)
        for (int32_t i = 0; i < n; i++)
            if (b->n_kv[i] - b->mask_from[i] > vis_stride)
                vis_stride = b->n_kv[i] - b->mask_from[i];
    /* the block table's rows the batch's tokens use, renumbered in order of
     * first use: a step uploads those, not every sequence's (a server keeps
     * a row for each slot and cached conversation, each as wide as the
     * whole cache). A batch without a table (recurrent state only) keeps
     * its rows as given. */
    const bool paged = b->seq_row && b->block_table;
    int32_t n_rows = 0;
    if (paged) {
        if (b->n_seq_rows > c->row_map_cap) {
            int32_t *m = (int32_t *)realloc(c->row_map, (size_t)b->n_seq_rows * sizeof *m);
            if (!m) {
                c->failed = true;
                err_set("cuda: out of host memory for a batch of %d sequence rows", b->n_seq_rows);
                return -1;
            }
            c->row_map = m;
            c->row_map_cap = b->n_seq_rows;
        }
        for (int32_t r = 0; r < b->n_seq_rows; r++)
            c->row_map[r] = -1;
        for (int32_t i = 0; i < n; i++)
            if (c->row_map[b->seq_row[i]] < 0)
                c->row_map[b->seq_row[i]] = n_rows++;
    }
    const size_t n_tab = (size_t)n_rows * b->max_blocks;
    const size_t n_int =
        (size_t)n * 18 + 3 + n_tab + (size_t)n * vis_stride + (size_t)b->n_out + 2 * (size_t)n_rows + 64;
    const size_t bytes = n_int * sizeof(int32_t);
    if (bytes > c->up_cap) {
        if (CUDA_CHECK(c, cudaEventSynchronize(c->up_done)) != 0)
            return -1;
        graph_clear(c); /* recorded kernels point at the old buffer */
        cudaFreeHost(c->up_host);
        cudaFree(c->up_dev);
        c->up_host = c->up_dev = NULL;
        c->up_cap = 0;
        size_t cap = bytes * 2;
        if (CUDA_CHECK(c, cudaMallocHost(&c->up_host, cap)) != 0 || CUDA_CHECK(c, cudaMalloc(&c->up_dev, cap)) != 0)
            return -1;
        c->up_cap = cap;
    }
    if (CUDA_CHECK(c, cudaEventSynchronize(c->up_done)) != 0) /* the last upload has left the buffer */
        return -1;
    int32_t *h = (int32_t *)c->up_host, *d = (int32_t *)c->up_dev;
    size_t off = 0;
#define PUT(field, src, count)                                                                                 \
    do {                                                                                                       \
        c->d.field = d + off;                                                                                  \
        if (src)                                                                                               \
            memcpy(h + off, src, (size_t)(count) * sizeof(int32_t));                                          \
        else                                                                                                   \
            memset(h + off, 0xff, (size_t)(count) * sizeof(int32_t));                                         \
        off += (size_t)(count);                                                                                \
    } while (0)
    PUT(token, b->token, n);
    PUT(pos, b->pos, n);
    PUT(slot, b->slot, n);
    c->d.seq_row = d + off; /* the rows renumbered, below */
    int32_t *sr = h + off;
    off += (size_t)n;
    PUT(n_kv, b->n_kv, n);
    PUT(mask_from, b->mask_from, n);
    PUT(parent, b->parent, n);
    PUT(state_in, b->state_in, n);
    PUT(state_out, b->state_out, n);
    PUT(out_rows, b->out_rows, b->n_out);
    c->d.block_table = d + off;
    int32_t *tab = h + off;
    off += n_tab;
#undef PUT
    /* the rows as the device and the host code below see them */
    for (int32_t i = 0; i < n; i++)
        sr[i] = paged ? c->row_map[b->seq_row[i]] : b->seq_row ? b->seq_row[i] : -1;
    if (paged) {
        for (int32_t r = 0; r < b->n_seq_rows; r++)
            if (c->row_map[r] >= 0)
                memcpy(tab + (size_t)c->row_map[r] * b->max_blocks, b->block_table + (size_t)r * b->max_blocks,
                       (size_t)b->max_blocks * sizeof(int32_t));
        c->b.seq_row = sr;
        c->b.block_table = tab;
        c->b.n_seq_rows = n_rows;
        b = &c->b;
    }
    /* n_vis and vis */
    c->d.n_vis = d + off;
    int32_t *nv = h + off;
    off += (size_t)n;
    c->d.vis = d + off;
    c->d.vis_stride = vis_stride;
    int32_t *vis = h + off;
    off += (size_t)n * vis_stride;
    c->max_vis = 0;
    for (int32_t i = 0; b->n_kv && i < n; i++) {
        int32_t cnt = b->n_kv[i];
        if (b->mask) {
            const uint8_t *m = b->mask + (size_t)i * b->mask_stride;
            cnt = b->mask_from[i];
            for (int32_t p = b->mask_from[i]; p < b->n_kv[i]; p++)
                if (m[p - b->mask_from[i]])
                    vis[(size_t)i * vis_stride + cnt++ - b->mask_from[i]] = p;
        }
        nv[i] = cnt;
        if (cnt > c->max_vis)
            c->max_vis = cnt;
    }
    /* sequence groups */
    c->d.grp_start = d + off;
    int32_t *gs = h + off;
    off += (size_t)n + 1;
    c->d.grp_rows = d + off;
    int32_t *gr = h + off;
    off += (size_t)n;
    c->d.n_grp = b->seq_row ? backend_group_rows(b, gs, gr) : 0;
    /* the groups a chunked scan takes (more than one row, one chain); a batch
     * without recurrent state slots (attention-only models) has none */
    c->d.grp_chain = d + off;
    int32_t *gch = h + off;
    off += (size_t)c->d.n_grp;
    c->n_chain = c->chain_rows = 0;
    for (int32_t g = 0; g < c->d.n_grp; g++) {
        const int32_t rows = gs[g + 1] - gs[g];
        const bool chain = b->state_out && rows > 1 && backend_rows_chain(b, gr + gs[g], rows);
        gch[g] = chain ? c->n_chain++ : -1;
        if (chain && rows > c->chain_rows)
            c->chain_rows = rows;
    }
    c->one_chain = c->d.n_grp == 1 && c->n_chain == 1;
    for (int32_t i = 0; c->one_chain && i < n; i++)
        c->one_chain = gr[i] == i;
    /* what each sequence row of more than one token sees, and its place in
     * the bf16 copies (ko counts the rows' tokens first) */
    c->d.kv_len = d + off;
    int32_t *kl = h + off;
    off += (size_t)n_rows;
    c->d.kv_off = d + off;
    int32_t *ko = h + off;
    off += (size_t)n_rows;
    memset(kl, 0, (size_t)n_rows * sizeof(int32_t));
    memset(ko, 0, (size_t)n_rows * sizeof(int32_t));
    for (int32_t i = 0; n_rows && i < n; i++)
        ko[b->seq_row[i]]++;
    for (int32_t i = 0; n_rows && b->n_kv && i < n; i++)
        if (ko[b->seq_row[i]] > 1 && b->n_kv[i] > kl[b->seq_row[i]])
            kl[b->seq_row[i]] = b->n_kv[i];
    /* a sequence's lone token (a decoding request beside a prompt's chunk)
     * takes decode attention in a large batch too: the bits it would get
     * decoded alone, without a 64-row tile or a copy of its keys */
    c->d.dec_rows = d + off;
    int32_t *dr = h + off;
    c->n_dec = c->dec_max_vis = 0;
    for (int32_t i = 0; n_rows && i < n; i++)
        if (ko[b->seq_row[i]] == 1) {
            dr[c->n_dec++] = i;
            c->dec_max_vis = b->n_kv && nv[i] > c->dec_max_vis ? nv[i] : c->dec_max_vis;
        }
    off += (size_t)c->n_dec;
    /* prefill attention's row tiles: each run of rows of one sequence cut
     * into pieces of CUDA_FA_ROWS, so a batch mixing sequences (a prefill
     * chunk beside other requests' decoded tokens) keeps the tensor cores */
    c->d.fa_tile = d + off;
    int32_t *ft = h + off;
    c->n_fa_tiles = 0;
    for (int32_t i = 0; n_rows && i < n;) {
        int32_t e = i + 1;
        while (e < n && e - i < CUDA_FA_ROWS && b->seq_row[e] == b->seq_row[i])
            e++;
        if (ko[b->seq_row[i]] > 1) {
            ft[2 * c->n_fa_tiles] = i;
            ft[2 * c->n_fa_tiles + 1] = e;
            c->n_fa_tiles++;
        }
        i = e;
    }
    off += 2 * (size_t)c->n_fa_tiles;
    c->kv_total = 0;
    c->kv_max = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        ko[r] = (int32_t)c->kv_total;
        c->kv_total += (kl[r] + CUDA_KV_TILE - 1) / CUDA_KV_TILE * CUDA_KV_TILE;
        c->kv_max = kl[r] > c->kv_max ? kl[r] : c->kv_max;
    }
    assert(off <= n_int);
    if (CUDA_CHECK(c, cudaMemcpyAsync(c->up_dev, c->up_host, off * sizeof(int32_t), cudaMemcpyHostToDevice,
                                      c->stream)) != 0 ||
        CUDA_CHECK(c, cudaEventRecord(c->up_done, c->stream)) != 0)
        return -1;
    graph_begin(c, b);
    return c->failed ? -1 : 0;
}

/* ---- lifetime ---- */

static void cu_free(struct backend *be)
{
    struct cuda_backend *c = cuda_of(be);
    cudaStreamSynchronize(c->stream);
    graph_clear(c);
    for (int i = 0; i < SCR_N; i++)
        cudaFree(c->scr[i]);
    cudaFree(c->counters);
    cudaFree(c->side_counters);
    cuda_moe_free(c);
    cudaFree(c->up_dev);
    cudaFreeHost(c->up_host);
    free(c->row_map);
    cudaEventDestroy(c->up_done);
    cudaEventDestroy(c->fork_ev);
    cudaEventDestroy(c->join_ev);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->side_stream);
    cudaStreamDestroy(c->stream);
    free(c);
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .kv_bf16 = true,
    .prefill_chunk = 4096, /* bench's prefill figures: at 4096 the GEMMs reach 68% of the tensor-core peak */
    .free = cu_free,
    .info = cu_info,
    .alloc = cu_alloc,
    .release = cu_release,
    .weight = cu_weight,
    .read = cu_read,
    .top_k = cuda_top_k,
    .write = cu_write,
    .copy_rows = cu_copy_rows,
    .sync = cu_sync,
    .forward_end = cu_forward_end,
    .set_batch = cu_set_batch,
    .embed = cuda_embed,
    .matmul = cuda_matmul,
    .matmul_fused = cuda_matmul_fused,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .attn_prep = cuda_attn_prep,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .swiglu = cuda_swiglu,
    .add = cuda_add,
    .get_out_rows = cuda_get_out_rows,
    .moe = cuda_moe,
    .sigmoid_mul = cuda_sigmoid_mul,
    .relu2 = cuda_relu2,
    .permute_cols = cuda_permute_cols,
    .rmsnorm_gated = cuda_rmsnorm_gated,
    .conv1d = cuda_conv1d,
    .delta_rule = cuda_delta_rule,
    .ssd = cuda_ssd,
};

struct backend *cuda_backend_init(int32_t dev, bool precise)
{
    int32_t n_dev = cuda_device_count();
    if (n_dev == 0) {
        err_set("cuda: no CUDA device found (no GPU, or no driver)");
        return NULL;
    }
    if (dev < 0 || dev >= n_dev) {
        err_set("cuda: device %d does not exist (%d found)", dev, n_dev);
        return NULL;
    }
    struct cuda_backend *c = (struct cuda_backend *)calloc(1, sizeof *c);
    if (!c) {
        err_set("cuda: out of memory");
        return NULL;
    }
    c->base.ops = &cuda_ops;
    c->dev = dev;
    c->precise = precise;
    const char *graphs = getenv("KAPITSA_CUDA_GRAPHS");
    c->graphs_off = graphs && strcmp(graphs, "0") == 0;
    struct cudaDeviceProp p;
    if (CUDA_CHECK(c, cudaSetDevice(dev)) != 0 || CUDA_CHECK(c, cudaGetDeviceProperties(&p, dev)) != 0)
        goto fail;
    if (p.major < 8) {
        err_set("cuda: %s has compute capability %d.%d; kapitsa needs 8.0 or newer (bf16 tensor cores)", p.name,
                p.major, p.minor);
        goto fail;
    }
    c->n_sm = p.multiProcessorCount;
    c->pdl = p.major >= 9 && !(getenv("KAPITSA_CUDA_PDL") && strcmp(getenv("KAPITSA_CUDA_PDL"), "0") == 0);
    c->wgmma = p.major == 9 && p.minor == 0 &&
               !(getenv("KAPITSA_CUDA_WGMMA") && strcmp(getenv("KAPITSA_CUDA_WGMMA"), "0") == 0);
    /* KAPITSA_CUDA_TMA=0: flash_sm90 copies every tile by cp.async, a large
     * MoE batch's experts run on cuBLAS */
    if (!c->wgmma || (getenv("KAPITSA_CUDA_TMA") && strcmp(getenv("KAPITSA_CUDA_TMA"), "0") == 0) ||
        !cuda_flash_sm90_init(c))
        c->tma_encode = NULL;
    if (CUDA_CHECK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != 0 ||
        CUDA_CHECK(c, cudaEventCreateWithFlags(&c->up_done, cudaEventDisableTiming)) != 0 ||
        CUDA_CHECK(c, cudaEventRecord(c->up_done, c->stream)) != 0 ||
        CUDA_CHECK(c, cudaMalloc(&c->counters, CUDA_MAX_COUNTERS * sizeof(unsigned))) != 0 ||
        CUDA_CHECK(c, cudaMemset(c->counters, 0, CUDA_MAX_COUNTERS * sizeof(unsigned))) != 0 ||
        CUDA_CHECK(c, cudaStreamCreateWithFlags(&c->side_stream, cudaStreamNonBlocking)) != 0 ||
        CUDA_CHECK(c, cudaEventCreateWithFlags(&c->fork_ev, cudaEventDisableTiming)) != 0 ||
        CUDA_CHECK(c, cudaEventCreateWithFlags(&c->join_ev, cudaEventDisableTiming)) != 0 ||
        CUDA_CHECK(c, cudaMalloc(&c->side_counters, CUDA_MAX_COUNTERS * sizeof(unsigned))) != 0 ||
        CUDA_CHECK(c, cudaMemset(c->side_counters, 0, CUDA_MAX_COUNTERS * sizeof(unsigned))) != 0)
        goto fail;
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        err_set("cuda: cublasCreate failed");
        goto fail;
    }
    cublasSetStream(c->blas, c->stream);
    if (cuda_matmul_init(c) != 0 || cuda_matmul_q_init(c) != 0 || cuda_moe_init(c) != 0)
        goto fail;
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
    return &c->base;
fail:
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    if (c->up_done)
        cudaEventDestroy(c->up_done);
    if (c->fork_ev)
        cudaEventDestroy(c->fork_ev);
    if (c->join_ev)
        cudaEventDestroy(c->join_ev);
    if (c->side_stream)
        cudaStreamDestroy(c->side_stream);
    cudaFree(c->counters);
    cudaFree(c->side_counters);
    free(c);
    return NULL;
}
