/* cuda_impl: what the cuda backend's source files share: the backend state,
 * the batch as uploaded to the device, CUDA_CHECK, and each file's ops.
 *
 * Errors: a failed CUDA call inside an op cannot be returned through the op
 * table (ops return void), so it is recorded in the backend (first error
 * kept, message via err_set) and every later op is skipped; read() then
 * returns zeros and the caller's next checked call (set_batch, alloc) fails
 * with the message. The CLI and the server turn that into an error, never a
 * hang. */
#ifndef KP_CUDA_IMPL_H
#define KP_CUDA_IMPL_H

#include "cuda.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "../../base/err.h"
}

#include <assert.h>

struct cuda_backend;
/* Records the first failure; 0 if the call succeeded. */
int cuda_fail(struct cuda_backend *c, cudaError_t e, const char *what, const char *file, int line);
#define CUDA_CHECK(c, call) cuda_fail((c), (call), #call, __FILE__, __LINE__)
#define CUDA_LAUNCHED(c) cuda_fail((c), cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

#define CUDA_MAX_GRAPHS 32

/* The batch on the device (see struct attn_batch); all [n_tokens] unless noted. */
struct dev_batch {
    int32_t *token, *pos, *slot, *seq_row, *n_kv, *mask_from, *out_rows, *parent, *state_in, *state_out;
    int32_t *block_table; /* [n_seq_rows][max_blocks] */
    /* attention: the number of visible positions, and the visible positions
     * at or past mask_from in order ([n_tokens][vis_stride]; mask only) */
    int32_t *n_vis, *vis;
    int32_t vis_stride;
    /* rows grouped by sequence, batch order kept (recurrent ops) */
    int32_t n_grp;
    int32_t *grp_start; /* [n_grp+1] */
    int32_t *grp_rows;
    /* [n_grp] the group's index among those of more than one row that are one
     * chain from the committed state (backend_rows_chain: a chunked scan's
     * form), in group order; -1 for the others */
    int32_t *grp_chain;
    /* per sequence row [n_seq_rows]: the positions its tokens see at most,
     * and where they start in prefill attention's bf16 copies (multiples of
     * CUDA_KV_TILE; kv_total in all, host side) */
    int32_t *kv_len, *kv_off;
    /* prefill attention's row tiles [n_fa_tiles][2]: rows [lo, hi) of one
     * sequence, at most CUDA_FA_ROWS, the runs of the sequences of more than
     * one token cut in order (host side: n_fa_tiles) */
    int32_t *fa_tile;
    /* [n_dec] the rows that are their sequence's only token, in order: a
     * large batch's attention decodes them (host side: n_dec) */
    int32_t *dec_rows;
};

#define CUDA_KV_TILE 64 /* prefill attention's key tile */
#define CUDA_FA_ROWS 64 /* ... and its longest row tile */
#define CUDA_SL_WARPS 16 /* k_mmv_slices' warps a block at most */

/* scratch buffers (cuda_scratch); SCR_SIDE: SCR_MATMUL's inside a branch */
/* SCR_DQ: a slice of a block-type weight dequantised for a prefill product */
enum { SCR_MATMUL, SCR_BLAS, SCR_ATTN, SCR_REC, SCR_TOPK, SCR_MOE, SCR_KV, SCR_SCAN, SCR_SIDE, SCR_DQ, SCR_N };

struct cuda_backend {
    struct backend base;
    int32_t dev, n_sm;
    int32_t mmv_per_sm; /* resident k_mmv blocks per SM */
    /* resident k_mmv_slices blocks per SM, [COMB][warps a block] (a lone
     * token's slices of up to MMV_SL_K_MAX) */
    int32_t sl_per_sm[2][CUDA_SL_WARPS + 1];
    bool precise;
    bool failed;
    bool pdl; /* products and decode attention launched as programmatic dependents (sm_90+; KAPITSA_CUDA_PDL=0: off) */
    bool wgmma; /* compute capability 9.0: flash_sm90.cu's kernel runs (KAPITSA_CUDA_WGMMA=0: off) */
    void *tma_encode; /* the driver's cuTensorMapEncodeTiled where c->wgmma and it has one, else NULL (KAPITSA_CUDA_TMA=0: NULL) */
    cudaStream_t stream;
    cublasHandle_t blas;
    struct attn_batch b; /* host copy; pointers valid during the forward */
    struct dev_batch d;
    int32_t max_vis;      /* largest n_vis of the batch */
    int32_t n_chain;      /* groups with a grp_chain index */
    int32_t chain_rows;   /* rows of the longest of them, 0 if none */
    bool one_chain;       /* the batch is one such group, its rows in batch order (a prompt) */
    int64_t kv_total;     /* positions in prefill attention's bf16 copies */
    int32_t kv_max;       /* largest kv_len */
    int32_t n_fa_tiles;   /* d.fa_tile's */
    int32_t n_dec;        /* d.dec_rows' */
    int32_t dec_max_vis;  /* largest n_vis of those rows */
    /* batch upload: one pinned host buffer and one device buffer */
    void *up_host, *up_dev;
    size_t up_cap;
    /* a sequence row's place among the batch's rows (-1: unused); grow-only */
    int32_t *row_map;
    int32_t row_map_cap;
    cudaEvent_t up_done;
    /* grow-only device scratch (split-K partials, cuBLAS operands, attention
     * partials, recurrent inputs); sized by the first forward of the largest batch */
    void *scr[SCR_N];
    size_t scr_cap[SCR_N];
    unsigned *counters; /* [CUDA_MAX_COUNTERS] split-K arrival counters, zero between uses */
    /* A branch (cuda_branch_begin): ops queued on a second stream, with their
     * own counters and split-K scratch, beside the main stream's until it
     * joins them. While one is open, stream and counters are the side's. */
    cudaStream_t main_stream, side_stream;
    unsigned *side_counters; /* [CUDA_MAX_COUNTERS] */
    cudaEvent_t fork_ev, join_ev;
    bool in_branch, to_join;
    /* CUDA graphs of small forwards (decoding, trees): a forward whose key
     * (owner, the device batch record, logits rows, key tiles) ran once
     * eagerly touching nothing but the stream is captured the next time and
     * replayed after that; ops between set_batch and forward_end then return
     * at once. Anything that waits on the host (MoE routing copies, scratch
     * growth, reads) makes a forward ineligible. KAPITSA_CUDA_GRAPHS=0 turns
     * graphs off. */
    struct cuda_graph {
        uint64_t key;
        cudaGraphExec_t exec;
        uint64_t used;
    } graphs[CUDA_MAX_GRAPHS];
    uint64_t key, clean_key, tick;
    bool in_forward, dirty, capturing, replaying, graphs_off;
    struct moe_table *moe_tabs; /* [n_moe_tabs] expert weight tables on the device, one per MoE layer met */
    int32_t n_moe_tabs;
    /* a large MoE batch's host side: its experts' row counts back, its
     * plan's slices and products' pointers out (moe_ffn_host). Pinned, so
     * both copies are DMA without staging; grow-only. A layer's upload from
     * it may still be pending when the host moves on: the next layer writes
     * it only after waiting for its own counts, which the stream orders
     * after that upload. */
    void *moe_pin;
    size_t moe_pin_cap;
};

#define CUDA_MAX_COUNTERS 8192
#define CUDA_MOE_COUNTER (CUDA_MAX_COUNTERS - 1) /* the MoE routing's; the products take the others */

static inline struct cuda_backend *cuda_of(struct backend *be) { return (struct cuda_backend *)be; }
/* An op does nothing after a failure, or while a recorded graph stands in for the forward. */
static inline bool cuda_op_skip(const struct cuda_backend *c) { return c->failed || c->replaying; }
/* Something in this forward waits on the host: it cannot be recorded. */
void cuda_host_wait(struct cuda_backend *c);
/* The ops queued from cuda_branch_begin to cuda_branch_end start after
 * everything queued before them and run beside what the main stream queues
 * next, until cuda_branch_join makes its next ops wait for them (a graph
 * records the fork and the join). A branch takes split-K products and
 * elementwise ops (its products' scratch is its own, no other is); every
 * begun branch is joined before the forward ends. */
void cuda_branch_begin(struct cuda_backend *c);
void cuda_branch_end(struct cuda_backend *c);
void cuda_branch_join(struct cuda_backend *c);

/* At least `bytes` of scratch `which`; NULL (failure recorded) if out of memory. */
void *cuda_scratch(struct cuda_backend *c, int which, size_t bytes);
/* Scratch `which` as n pieces of bytes[i] each, 256-byte aligned, into
 * piece[i]; -1 (failure recorded) if out of memory. */
int cuda_scratch_pieces(struct cuda_backend *c, int which, int n, const size_t *bytes, void **piece);

/* ops by file */
int cuda_matmul_init(struct cuda_backend *c);
/* the fused MoE gate's shared memory limit, once per backend */
int cuda_moe_init(struct cuda_backend *c);
void cuda_matmul(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w);
/* matmul_q.cu: weights in GGUF's block types. The device tables, once per
 * backend; matmul_fused's work where every weight is of a block type; embed's
 * for such a table; weight's upload of one. */
int cuda_matmul_q_init(struct cuda_backend *c);
void cuda_matmul_q(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                   const struct tensor *x, const struct mm_fused *f);
void cuda_embed_q(struct cuda_backend *c, struct tensor *out, const struct tensor *table);
int cuda_weight_q(struct cuda_backend *c, struct tensor *dst, const struct tensor *host);
void cuda_matmul_fused(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                       const struct tensor *x, const struct mm_fused *f);
void cuda_attention(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *kc,
                    const struct tensor *vc, int32_t n_head, int32_t n_kv_head, int32_t head_dim, float scale);
/* flash_sm90.cu: prefill attention by wgmma over attention.cu's bf16 copies
 * of the keys and transposed values (k_kv_bf16), a block per row tile
 * (d.fa_tile); head dims 64 and 128, fast mode, c->wgmma */
struct flash_sm90_args {
    const float *q; /* [n][n_head * head_dim], rows qs apart */
    int64_t qs;
    float *out; /* as q, rows os apart */
    int64_t os;
    const __nv_bfloat16 *kb, *vt; /* [n_kv_head][kv_total][head_dim], [n_kv_head][head_dim][kv_total] */
    int64_t kv_total;
    struct dev_batch b;
    int32_t n_tiles, n_head, n_kv_head;
    float scale;
};
bool cuda_flash_sm90_fits(const struct cuda_backend *c, int32_t head_dim);
/* the tensor-map encoder into c->tma_encode; false where the driver has none
 * (flash_sm90 then copies by cp.async, moe.cu's large batches use cuBLAS) */
bool cuda_flash_sm90_init(struct cuda_backend *c);

/* moe_gemm.cu: a large batch's expert products in fast mode on Hopper, one
 * grouped launch a product over the unpadded sorted list */
#define MOE_GEMM_ROWS 128 /* rows of one expert's slice a block: the host's tiles */
bool cuda_moe_gemm_fits(const struct cuda_backend *c);
/* the tensor maps of a layer's expert weights on the device, [3][E] (gate,
 * up, down; gate's zeros where there is none), for cuda_moe_gemm; freed by
 * cudaFree. NULL on failure (c->failed, a message). */
void *cuda_moe_gemm_maps(struct cuda_backend *c, const struct moe_experts *ex);
/* Over the rows of tiles [n_tiles][2] (an expert e, a first row; the tile's
 * rows run to min(row + MOE_GEMM_ROWS, start[e + 1])), x [n_rows][K] bf16
 * (K a multiple of 8) times [N][K] weights (N even; w0 and w1 [E] arrays of
 * cuda_moe_gemm_maps' maps), out [n_rows][N] rounded to bf16: x . w0^T
 * (MM_PRE_NONE), silu(x . w0^T) * (x . w1^T) (MM_PRE_SWIGLU) or
 * relu(x . w0^T)^2 (MM_PRE_RELU2, w1 NULL). 0, or -1 with c->failed. */
int cuda_moe_gemm(struct cuda_backend *c, const void *w0, const void *w1, const __nv_bfloat16 *x, int64_t n_rows,
                  int64_t K, int64_t N, const int32_t *tiles, int32_t n_tiles, const int32_t *start, enum mm_pre pre,
                  __nv_bfloat16 *out);
void cuda_flash_sm90(struct cuda_backend *c, const struct flash_sm90_args *a, int32_t head_dim);

void cuda_embed(struct backend *be, struct tensor *out, const struct tensor *table);
void cuda_rmsnorm(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w, float eps);
void cuda_rope(struct backend *be, struct tensor *x, int32_t n_head, int32_t head_dim, int32_t rope_dim,
               const struct tensor *inv_freq, float scale);
void cuda_kv_store(struct backend *be, struct tensor *kc, struct tensor *vc, const struct tensor *k,
                   const struct tensor *v);
void cuda_swiglu(struct backend *be, struct tensor *out, const struct tensor *gate, const struct tensor *up);
void cuda_add(struct backend *be, struct tensor *x, const struct tensor *y);
void cuda_get_out_rows(struct backend *be, struct tensor *out, const struct tensor *x);
void cuda_attn_prep(struct backend *be, struct tensor *q, struct tensor *k, const struct tensor *v,
                    struct tensor *kc, struct tensor *vc, const struct attn_prep *p);
int cuda_top_k(struct backend *be, const struct tensor *t, int32_t k, int32_t *ids, float *vals);
void cuda_sigmoid_mul(struct backend *be, struct tensor *x, const struct tensor *g);
void cuda_relu2(struct backend *be, struct tensor *x);
void cuda_permute_cols(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *map);
void cuda_rmsnorm_gated(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *z,
                        const struct tensor *w, float eps, int64_t group, bool gate_first);
/* out[i] = x[rows[i]], i < n */
void cuda_gather_rows(struct cuda_backend *c, struct tensor *out, const struct tensor *x, const int32_t *rows,
                      int32_t n);

/* Row rows[i] of x, i < n, as dense bf16 hi [n][K] and, when lo is not
 * NULL, the rounding left over lo = x - hi. It reads 8 floats at a time:
 * K a multiple of 8, x's rows 16-byte aligned. */
void cuda_gather_bf16(struct cuda_backend *c, const float *x, int64_t xs, const int32_t *rows, int64_t n, int64_t K,
                      __nv_bfloat16 *hi, __nv_bfloat16 *lo);
/* Row t of x [n][K], t < n, as bf16 into rows tpos[t k + j], j < k, of out
 * [][K] (a large MoE batch's list: each token's row once per pick, the
 * row read once); K and x's rows as cuda_gather_bf16 takes them. */
void cuda_scatter_bf16(struct cuda_backend *c, const float *x, int64_t xs, const int32_t *tpos, int64_t n, int32_t k,
                       int64_t K, __nv_bfloat16 *out);
/* pre(x) of rows x [n][K] (see struct mm_fused: RMSNorm, SwiGLU with f->up,
 * relu^2 or nothing) as dense bf16 hi and, when lo is not NULL, lo; K and
 * the rows of x and f->up as cuda_gather_bf16 takes them. */
void cuda_pre_split(struct cuda_backend *c, const float *x, int64_t xs, int64_t n, int32_t K, const struct mm_fused *f,
                    __nv_bfloat16 *hi, __nv_bfloat16 *lo);
/* out[i] (+)= pre(x) . w[i]^T for i < n_w on cuBLAS (matmul_blas.cu): x
 * rounded to bf16 once (and its lo half, a second product, when precise),
 * one GEMM a weight adding into out when f->accumulate. */
void cuda_mm_prefill(struct cuda_backend *c, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                     const struct tensor *x, const struct mm_fused *f);
/* 0 for CUBLAS_STATUS_SUCCESS; else -1, the failure recorded with what */
int cuda_blas_status(struct cuda_backend *c, cublasStatus_t st, const char *what);
/* count row-major products out = alpha l . r + beta out, every operand
 * packed (its row stride its width), the i-th at i times its stride: l
 * [m][k] as stored or, when l_t, stored as [k][m]; r [k][n] or, when r_t,
 * stored as [n][k]; out [m][n], fp32; l and r bf16 or fp32 (the sums fp32) */
int cuda_gemm_packed(struct cuda_backend *c, int32_t m, int32_t n, int32_t k, float alpha, const void *l, bool l_t,
                     int64_t sl, const void *r, bool r_t, int64_t sr, float beta, float *out, int64_t so,
                     int32_t count, bool bf16, const char *what);
/* the gated delta rule's chunk (torch_chunk_gated_delta_rule's, the cpu's DELTA_CHUNK) */
#define CUDA_DELTA_CHUNK 64
/* delta_gemm.cu: whether cuda_delta_gemm takes this batch (a prompt's chain
 * of at least 256 rows, fast mode, k head dims dk a multiple of 4 up to 128),
 * and the whole chunked pass from
 * k_delta_prep's outputs (qn, kn: the normalised q and k [n][Hk][dk]; gb
 * [n][Hv][2]: log decay, beta) and v [n][Hv*dv] at row stride vs */
bool cuda_delta_gemm_takes(const struct cuda_backend *c, int32_t dk);
int cuda_delta_gemm(struct cuda_backend *c, float *out, int64_t os, const float *qn, const float *kn, const float *v,
                    int64_t vs, const float *gb, int32_t Hk, int32_t Hv, int32_t dk, int32_t dv, float *state,
                    int64_t ss);
/* ssd_gemm.cu: whether cuda_ssd_gemm takes this batch (a prompt's chain of at
 * least 256 rows, fast mode), and the scan itself (dts: k_ssd_prep's dt, [n][H]) */
bool cuda_ssd_gemm_takes(const struct cuda_backend *c, const struct ssd_params *p);
int cuda_ssd_gemm(struct cuda_backend *c, struct tensor *y, const struct tensor *x, const struct tensor *B,
                  const struct tensor *C, const float *dts, const struct tensor *A_log, const struct tensor *D,
                  struct tensor *state, const struct ssd_params *p);
/* out [n][M] (os apart) = beta * out + x [n][K] (dense bf16) . w [M][K]^T
 * (bf16, ws apart) on cuBLAS, fp32 accumulation; -1 (failure recorded) on error. */
int cuda_gemm_bf16(struct cuda_backend *c, float *out, int64_t os, const __nv_bfloat16 *x, int64_t n, int64_t K,
                   const void *w, int64_t ws, int64_t M, float beta);
/* cuda_gemm_bf16 for `count` products of one shape, their out, x and w
 * pointers in device arrays [count] (cublasGemmBatchedEx). */
int cuda_gemm_bf16_batched(struct cuda_backend *c, float *const *out, int64_t os, const __nv_bfloat16 *const *x,
                           int64_t n, int64_t K, const void *const *w, int64_t ws, int64_t M, float beta,
                           int32_t count);

/* The routing plan of a MoE layer on the device (int32, see moe.cu): the
 * number of active experts, their ids in increasing order, where each one's
 * rows begin in the compact list (tokens in increasing order per expert),
 * the token of each compact row, and per token its compact rows and weights
 * in increasing expert order. */
#define MOE_PLAN_EXPERT 1
#define MOE_PLAN_BEG(max_act) (1 + (max_act))
#define MOE_PLAN_ROWS(max_act) (2 + 2 * (max_act))

/* A product over the experts a plan made active: slot z < n_act multiplies
 * expert act[z]'s weights by the inputs of its compact rows and writes those
 * rows of the outputs (os apart). */
struct mm_group {
    const int32_t *plan;                /* device, MOE_PLAN_* */
    int32_t max_act;                    /* slots launched: at most this many experts are active */
    int32_t n_pos;                      /* compact rows */
    int32_t n_max;                      /* the most rows one expert can have (<= CUDA_SMALL_N) */
    int32_t fill_slots;                 /* slots assumed active when splitting K: a constant of the model */
    bool gather;                        /* input row of compact row p: the plan's token of p (else p) */
    const uint16_t *const *w[MM_MAX_W]; /* device: each weight's [n_expert] bf16 matrices */
    int64_t ws;                         /* their row stride */
    int32_t M[MM_MAX_W];                /* their rows */
};
void cuda_matmul_grouped(struct cuda_backend *c, const struct mm_group *g, int32_t n_w, float *const *out, int64_t os,
                         const float *x, int64_t xs, int32_t K, const struct mm_fused *f);

/* A lone token's grouped product (one weight, k slots of one row each) and
 * the weighted sum of its slots' rows, plus add [M] where given, into out
 * [M] (pick j: compact row tpos[j], weight tw[j]; f->accumulate adds to
 * out), in one launch, with the bits of cuda_matmul_grouped followed by
 * k_moe_combine. -1 when the shape does not fit the one-block form: nothing
 * launched. */
int cuda_matmul_grouped_combine(struct cuda_backend *c, const struct mm_group *g, float *out, const float *x,
                                int64_t xs, int32_t K, const struct mm_fused *f, const int32_t *tpos, const float *tw,
                                int32_t k, const float *add);

/* cuda_matmul_grouped's product for one weight of a block type: expert e's
 * matrix at ew[e] (a device table), each of w0's type and shape; out (not
 * accumulated) and the input as cuda_matmul_grouped takes them. */
void cuda_matmul_q_grouped(struct cuda_backend *c, const struct mm_group *g, const void *const *ew,
                           const struct tensor *w0, float *out, int64_t os, const float *x, int64_t xs, int32_t K);

void cuda_moe(struct backend *be, struct tensor *out, const struct tensor *x, const struct moe_block *mb,
              bool accumulate);
void cuda_moe_free(struct cuda_backend *c);

void cuda_conv1d(struct backend *be, struct tensor *out, const struct tensor *x, const struct tensor *w,
                 const struct tensor *bias, struct tensor *state);
void cuda_delta_rule(struct backend *be, struct tensor *out, const struct tensor *q, const struct tensor *k,
                     const struct tensor *v, const struct tensor *a, const struct tensor *b,
                     const struct tensor *A_log, const struct tensor *dt_bias, struct tensor *state,
                     int32_t n_k_head, int32_t n_v_head, int32_t k_dim, int32_t v_dim);
void cuda_ssd(struct backend *be, struct tensor *y, const struct tensor *x, const struct tensor *B,
              const struct tensor *C, const struct tensor *dt, const struct tensor *A_log, const struct tensor *D,
              const struct tensor *dt_bias, struct tensor *state, const struct ssd_params *p);

/* Element i of a small weight vector (any stored dtype) on the device. */
static __device__ __forceinline__ float dev_weight(const void *w, enum dtype t, int64_t i)
{
    switch (t) {
    case DT_BF16: return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
    case DT_F16: return __half2float(((const __half *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

/* Element i of a KV cache row block (bf16: a bf16 cache, else f32), and
 * four of them from i (a multiple of 4; 16 bytes of f32, 8 of bf16). */
static __device__ __forceinline__ float kv_at(const void *c, bool bf16, int64_t i)
{
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)c)[i]) : ((const float *)c)[i];
}
/* four bf16 values, two to a word (the lower element in the low half), widened */
static __device__ __forceinline__ float4 bf16x4(uint32_t a, uint32_t b)
{
    return make_float4(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u), __uint_as_float(b << 16),
                       __uint_as_float(b & 0xffff0000u));
}
static __device__ __forceinline__ float4 kv_at4(const void *c, bool bf16, int64_t i)
{
    if (!bf16)
        return *(const float4 *)((const float *)c + i);
    const uint2 u = *(const uint2 *)((const uint16_t *)c + i);
    return bf16x4(u.x, u.y);
}
static __device__ __forceinline__ void kv_put(void *c, bool bf16, int64_t i, float v)
{
    if (bf16)
        ((__nv_bfloat16 *)c)[i] = __float2bfloat16_rn(v);
    else
        ((float *)c)[i] = v;
}

/* Programmatic dependent launch: a kernel launched with it (cuda_launch_dep)
 * may start while the previous one finishes; it waits here before touching
 * anything that kernel writes (a no-op when launched plainly). A kernel lets
 * its successor start with grid_dep_launch: products at their start (their
 * first weight loads need no input), small kernels as their blocks end, so
 * that waiting successors never hold the multiprocessors for long. Except
 * attn_prep, which releases decode attention at its start: attention's
 * blocks are small and load their old keys and values before they wait. */
static __device__ __forceinline__ void grid_dep_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
static __device__ __forceinline__ void grid_dep_launch(void) { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

/* launch k as a programmatic dependent of the stream's previous kernel (a
 * plain launch without c->pdl, and in a branch, whose first kernel follows
 * the fork's event and whose kernels are hidden beside the main stream's);
 * 0 or -1 as CUDA_CHECK */
template <typename... P, typename... A>
static int cuda_launch_dep(struct cuda_backend *c, void (*k)(P...), dim3 grid, dim3 block, size_t smem, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &at;
    cfg.numAttrs = c->pdl && !c->in_branch ? 1 : 0;
    return CUDA_CHECK(c, cudaLaunchKernelEx(&cfg, k, args...));
}

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* v summed over the block: each warp's tree, then the warps in order
 * (part: 32 floats of shared memory, once a kernel); every thread gets it */
static __device__ __forceinline__ float block_sum(float v, float *part)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    float tot = 0.0f;
    for (unsigned k = 0; k < blockDim.x >> 5; k++)
        tot += part[k];
    return tot;
}

/* 1 / sqrt(mean(xr[0..d)^2) + eps), the row summed by the whole block
 * (part: 32 floats of shared memory); every thread gets it. */
static __device__ __forceinline__ float block_rms_inv(const float *xr, int64_t d, float eps, float *part)
{
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
        ss += xr[c] * xr[c];
    return 1.0f / sqrtf(block_sum(ss, part) / (float)d + eps);
}

/* x[0..n) in shared memory replaced by its inclusive prefix sums; called by
 * one whole warp (32 entries a step, the running total carried) */
static __device__ __forceinline__ void warp_prefix_sum(float *x, int32_t n)
{
    const int lane = threadIdx.x & 31;
    float run = 0.0f;
    for (int32_t t1 = 0; t1 < n; t1 += 32) {
        const int32_t t = t1 + lane;
        float v = t < n ? x[t] : 0.0f;
        for (int o = 1; o < 32; o <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o)
                v += u;
        }
        if (t < n)
            x[t] = run + v;
        run += __shfl_sync(0xffffffffu, v, 31);
    }
}

/* acc[m] += w[m] * v for m < 8; w 16-byte aligned (two float4 loads) */
static __device__ __forceinline__ void fma8(float *acc, const float *w, float v)
{
    const float4 w0 = *(const float4 *)w, w1 = *(const float4 *)(w + 4);
    acc[0] += w0.x * v;
    acc[1] += w0.y * v;
    acc[2] += w0.z * v;
    acc[3] += w0.w * v;
    acc[4] += w1.x * v;
    acc[5] += w1.y * v;
    acc[6] += w1.z * v;
    acc[7] += w1.w * v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* c += a.b on the tensor cores: m16n8k16, bf16 inputs, fp32 accumulation */
static __device__ __forceinline__ void mma_bf16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared without passing through registers (cp.async);
 * src_bytes 0 writes zeros. Completion: cp_async_commit, cp_async_wait_all. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
}
/* 8 bytes (through L1: the .cg form, which bypasses it, takes 16 only) */
static __device__ __forceinline__ void cp_async8(void *dst, const void *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::); }
/* all but the most recent group */
static __device__ __forceinline__ void cp_async_wait_one(void) { asm volatile("cp.async.wait_group 1;\n" ::); }

/* Four 8x8 bf16 tiles from shared memory (ldmatrix): lanes 8m..8m+7 give the
 * 16-byte rows of tile m, and each lane receives, in r[m], the pair at row
 * lane/4, columns 2*(lane%4): the B operand layout of mma_bf16 when a tile's
 * rows are its n and its columns its k. */
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* The same four tiles transposed (ldmatrix .trans): lanes 8m..8m+7 give the
 * 16-byte rows of tile m, and each lane receives, in r[m], the pair at
 * rows 2*(lane%4) and 2*(lane%4)+1, column lane/4: the B operand layout of
 * mma_bf16 when a tile's rows are its k and its columns its n. */
static __device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* (x, y) rounded to a bf16 pair, x in the low half: an mma operand register */
static __device__ __forceinline__ uint32_t bf16x2_rn(float x, float y)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *(const uint32_t *)&h;
}

/* (x, y) as a bf16 pair hi and the rounding left over, lo: hi + lo is x, y to ~2^-17 */
static __device__ __forceinline__ void split_bf16x2(float x, float y, uint32_t *hi, uint32_t *lo)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 f = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - f.x, y - f.y);
    *hi = *(const uint32_t *)&h;
    *lo = *(const uint32_t *)&l;
}

/* the max and the sum over a quad's 4 lanes: an mma accumulator row's */
static __device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

static __device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* A flash kernel's two-stage ring at key tile `tile` (stage st): the next
 * tile's copies requested into the other stage by fetch(tile + kt, st ^ 1)
 * where there is one below end, and this tile's awaited. */
template <typename F>
static __device__ __forceinline__ void flash_ring_next(F &fetch, int32_t tile, int32_t kt, int32_t end, int st)
{
    if (tile + kt < end) {
        fetch(tile + kt, st ^ 1);
        cp_async_wait_one();
    } else {
        cp_async_wait_all();
    }
}

/* A flash kernel's end for a warp's two rows ra and rb = ra + 8 of a tile
 * (those below hi): their softmax sums la, lb completed across the quad's
 * lanes, and the mma accumulators o[j] (columns 8j + 2cq and + 1 of head h,
 * rows a then b) written to a.out (rows a.os apart) divided by them. */
template <int ND, int HD, typename A>
static __device__ __forceinline__ void flash_store(const A &a, const float (&o)[ND][4], float la, float lb, int32_t ra,
                                                   int32_t rb, int32_t hi, int32_t h, int cq)
{
    la = quad_sum(la);
    lb = quad_sum(lb);
    const float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
    for (int j = 0; j < ND; j++) {
        const int d = h * HD + 8 * j + 2 * cq;
        if (ra < hi)
            *(float2 *)(a.out + (int64_t)ra * a.os + d) = make_float2(o[j][0] * ia, o[j][1] * ia);
        if (rb < hi)
            *(float2 *)(a.out + (int64_t)rb * a.os + d) = make_float2(o[j][2] * ib, o[j][3] * ib);
    }
}

static inline unsigned cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

/* rows of K floats, xs apart, that a kernel reads 8 at a time: K a multiple
 * of 8 and every row 16-byte aligned */
static inline bool cuda_rows_vec8(const float *x, int64_t xs, int64_t K)
{
    return K % 8 == 0 && xs % 4 == 0 && ((uintptr_t)x & 15) == 0;
}

#endif
