/* backend: the operations a model forward is made of, as a table of function
 * pointers that each backend (cpu; cuda and metal later) fills in.
 *
 * Model code (src/model) is written once against these ops and never touches
 * tensor memory itself: tensors live where the backend keeps them (host memory
 * for the cpu backend, device memory for a GPU one). Weights keep their stored
 * dtype (bf16/f16/f32); activations are fp32; every op accumulates in fp32.
 *
 * The batch a forward runs on is handed to the backend once per forward
 * (set_batch); the ops that need per-token facts (token ids, positions, cache
 * slots, attention visibility) read them from there, so a GPU backend uploads
 * them once and can replay a captured graph.
 *
 * Ownership: a tensor made by alloc is freed by release; a tensor made by
 * weight aliases or copies stored data and is freed by release too. */
#ifndef KP_BACKEND_H
#define KP_BACKEND_H

#include "../base/dtype.h"

#include <stdbool.h>
#include <stdint.h>

/* A 2-D row-major tensor (a vector is one row). */
struct tensor {
    enum dtype type;
    int64_t n_rows;
    int64_t n_cols;
    int64_t row_stride; /* elements between row starts (>= n_cols) */
    void *data;         /* backend memory */
    bool owned;         /* data was allocated by the backend (else: an alias) */
};

/* A view of rows [row0, row0+n) of t; of a tensor never allocated (data NULL:
 * an unused scratch buffer), a view with NULL data: no arithmetic on NULL. */
static inline struct tensor tensor_rows(const struct tensor *t, int64_t row0, int64_t n)
{
    struct tensor v = *t;
    v.n_rows = n;
    v.data = t->data ? (char *)t->data + dtype_bytes(t->type, row0 * t->row_stride) : NULL;
    v.owned = false;
    return v;
}

/* A view of columns [col0, col0+n) of every row of t (an F32 activation). */
static inline struct tensor tensor_cols(const struct tensor *t, int64_t col0, int64_t n)
{
    struct tensor v = *t;
    v.data = t->data ? (char *)t->data + (size_t)col0 * dtype_size(t->type) : NULL;
    v.n_cols = n;
    v.owned = false;
    return v;
}

/* The tokens of one forward as the ops see them. Host arrays, valid until the
 * forward returns. Visibility: token i attends to positions [0, n_kv[i]) of its
 * sequence's cache, except that a position p >= mask_from[i] is visible only if
 * mask[i*mask_stride + p - mask_from[i]] is 1 (mask NULL: all visible).
 *
 * Recurrent layers (short conv, DeltaNet, Mamba2) see the same tree through
 * parent: token i continues from the state after token parent[i] of this
 * batch, or, for parent -1, from the committed state in slot state_in[i] of
 * the layer's state tensors. The state after token i is written to slot
 * state_out[i] when that is >= 0; the engine gives every token whose state is
 * needed later (a branching parent, the end of each sequence's rows, a row a
 * partial commit may end on) its own slot, distinct from every state_in. */
struct attn_batch {
    int32_t n_tokens;
    const int32_t *token;       /* [n_tokens] */
    const int32_t *pos;         /* [n_tokens] rope position */
    const int32_t *slot;        /* [n_tokens] cache row receiving this token's K/V */
    const int32_t *seq_row;     /* [n_tokens] row of block_table of its sequence */
    const int32_t *n_kv;        /* [n_tokens] */
    const int32_t *mask_from;   /* [n_tokens] */
    const uint8_t *mask;        /* [n_tokens][mask_stride] or NULL */
    int32_t mask_stride;
    const int32_t *block_table; /* [n_seq_rows][max_blocks] block ids */
    int32_t n_seq_rows;
    int32_t max_blocks;
    int32_t block_size;         /* cache row of position p: table[p/bs]*bs + p%bs */
    int32_t n_out;
    const int32_t *out_rows;    /* [n_out] tokens whose logits are wanted */
    const int32_t *parent;      /* [n_tokens] earlier token of the same sequence, or -1 */
    const int32_t *state_in;    /* [n_tokens] recurrent state slot (read when parent is -1) */
    const int32_t *state_out;   /* [n_tokens] slot receiving the state after the token, or -1 */
    /* What runs this batch (the engine: its model, caches and scratch), or
     * NULL. A forward that names its owner ends with forward_end, and the same
     * owner and batch shape always queue the same ops on the same tensors, so
     * a GPU backend may record them once and replay them as one graph (until
     * a tensor is released). */
    const void *owner;
};

/* A dense MLP, down(act(pre(x))): act SwiGLU (silu(x.gate^T) * x.up^T) or,
 * with gate NULL, relu(x.up^T)^2; pre the RMSNorm of x by norm, or none.
 * g, u [n][>= inter], h [n][hidden] and acc [n][hidden] (F32) are scratch
 * the caller owns (as mm_fused's pre_buf and acc_buf: h only with norm, acc
 * only when accumulating). */
struct mlp_block {
    const struct tensor *gate; /* [inter][hidden], or NULL */
    const struct tensor *up;   /* [inter][hidden] */
    const struct tensor *down; /* [hidden][inter] */
    const struct tensor *norm; /* [hidden], or NULL */
    float eps;
    struct tensor *g, *u, *h, *acc;
};

/* A MoE layer's shared expert (Qwen3-Next, Qwen3.5-MoE, Nemotron 3): y =
 * mlp(h), times sigmoid(h . mix^T) where mix is given, h the block's RMSNorm
 * of x. */
struct moe_shared {
    struct mlp_block mlp;     /* norm NULL */
    const struct tensor *mix; /* [1][hidden], or NULL */
    struct tensor *mix_out;   /* [n][1] F32 scratch */
    struct tensor *y;         /* [n][hidden] F32: its output */
};

/* Routed experts of one MoE layer: SwiGLU MLPs, or, with gate NULL,
 * down(relu(up x)^2) MLPs (Nemotron). */
struct moe_experts {
    int32_t n_expert;
    const struct tensor *gate; /* [n_expert] each [inter][hidden], or NULL */
    const struct tensor *up;   /* [n_expert] each [inter][hidden] */
    const struct tensor *down; /* [n_expert] each [hidden][inter] */
};

/* How router logits pick experts. Softmax (Qwen): the top k of softmax(logits).
 * Sigmoid (Nemotron 3): scores = sigmoid(logits); experts are chosen by
 * scores + bias within the topk_group groups (of n_group) whose two best
 * biased scores sum highest; the weights are the unbiased scores. Then, if
 * norm, the k weights are divided by their sum, and all are multiplied by scale. */
struct moe_routing {
    int32_t k;
    bool sigmoid;
    bool norm;
    const struct tensor *bias; /* [n_expert] F32/BF16, sigmoid only (may be NULL) */
    int32_t n_group, topk_group;
    float scale;
    bool spread; /* a synthetic checkpoint's (config kapitsa_route_spread): MOE_SPREAD_ID's picks */
};

/* The picks of a random-weight checkpoint (kapitsa synth). Its router does
 * not spread tokens as a trained one does: past the first layers nearly
 * every token picks the same few experts, so a batch reads a fraction of
 * the experts' bytes and its speed says nothing of a real model's. With
 * spread, the routing is computed as usual and then row r's pick j is
 * expert (37 r + j (E / k)) mod E, keeping pick j's weight: k distinct
 * experts a row, and each expert picked k times over any E consecutive
 * rows (37 is coprime to every power of two). Every backend picks these
 * same ids, so its results can still be compared with the cpu's; a token's
 * picks depend on its row in the batch, so such a model's output does too
 * (it is random anyway: spread routing serves speed measurements only). */
#define MOE_SPREAD_ID(r, j, E, k) ((int32_t)((37 * (int64_t)(r) + (int64_t)(j) * ((E) / (k))) % (E)))

/* One MoE block's routed experts (the moe op), with the caller's scratch
 * (each at least n rows; what the op leaves there is its result too). */
struct moe_block {
    const struct tensor *norm;   /* [hidden]: the RMSNorm of x the block reads */
    float eps;
    const struct tensor *router; /* [n_expert][hidden] */
    struct moe_routing rt;
    struct moe_experts ex;
    struct tensor *h;       /* [n][hidden] F32: RMSNorm(x) (a shared expert's input) */
    struct tensor *logits;  /* [n][n_expert] F32: h . router^T */
    struct tensor *ids;     /* [n][k] I32: each row's experts (ties: the lower index first) */
    struct tensor *weights; /* [n][k] F32: their weights */
    struct tensor *ws;      /* [>= n][2*hidden + 2*inter] F32: room for the products (the cpu takes a
                               batch's n*k picks at once where it has a row for each) */
    const struct moe_shared *shared; /* a shared expert beside the routed ones, or NULL */
};

/* Mamba2 scan shapes and time-step limits. */
struct ssd_params {
    int32_t n_head, head_dim, n_group, d_state;
    int32_t chunk;         /* chunk length of the chunked (prefill) form */
    float dt_min;          /* dt = clamp(softplus(dt + dt_bias), max(dt_min, dt_lo), dt_hi) */
    float dt_lo, dt_hi;
};

#define TOP_K_MAX 32 /* the most values top_k returns per row */

/* What a fused product does around its multiply (see matmul_fused). */
enum mm_pre {
    MM_PRE_NONE,    /* x as it is */
    MM_PRE_RMSNORM, /* RMSNorm of each row of x: norm * x / sqrt(mean(x^2) + eps) */
    MM_PRE_SWIGLU,  /* silu(x) * up */
    MM_PRE_RELU2,   /* max(x, 0)^2, in place: pre_buf is x */
};

struct mm_fused {
    enum mm_pre pre;
    const struct tensor *norm; /* MM_PRE_RMSNORM: [k] */
    float eps;
    const struct tensor *up;   /* MM_PRE_SWIGLU: [n][k] */
    bool accumulate;           /* out += the product (else out = it) */
    /* Scratch the caller owns, for backends that run the pieces one by one:
     * pre_buf [n][k] may receive pre(x) (it may be x or up themselves, the
     * input ops being elementwise; for MM_PRE_RELU2 it is x), acc_buf
     * [n][max m] a product before it is added. Neither is read afterwards. */
    struct tensor *pre_buf;
    struct tensor *acc_buf;
};

#define MM_MAX_W 4

/* What a layer's attention does to q and k before reading them (attn_prep). */
struct attn_prep {
    const struct tensor *q_norm, *k_norm; /* [head_dim] per-head RMSNorm weights */
    float eps;
    int32_t n_head, n_kv_head, head_dim, rope_dim;
    const struct tensor *inv_freq;        /* [rope_dim/2] f32 */
    float rope_scale;
};

struct backend;

/* What a backend runs on: reports (doctor, bench, the server's banner),
 * rooflines and what fits. Peaks are the hardware's: a GPU's from the clocks
 * and bus its driver reports, a cpu's read bandwidth measured with the
 * backend's own threads. */
struct device_info {
    char name[256];          /* "NVIDIA H100 80GB HBM3", a cpu's model name */
    bool gpu;                /* tensors in the device's own memory, apart from the host's */
    int64_t mem_total;       /* bytes of the memory tensors live in */
    int64_t mem_free;        /* of it, available now */
    int32_t n_units;         /* streaming multiprocessors, or the cpu's worker threads */
    char arch[16];           /* a GPU's compute capability ("9.0"); a cpu's kernel table */
    char software[64];       /* a GPU's driver and runtime versions ("" on a cpu) */
    double read_gbs;         /* memory read bandwidth, GB/s (0: unknown) */
    double bf16_tflops;      /* dense bf16 matrix peak, TFLOP/s (0: unknown, as on a cpu) */
};

/* The ops a forward is made of, one line each, X(name, (parameters), (their
 * names, the backend's as `in`)): backend_ops has a member for each and
 * profile.c times each. Shapes in rows x cols, n = batch tokens. Adding an
 * op: its line here, a function in each backend (cpu.c, cuda.cu) and its
 * entry in their tables; ARCHITECTURE.md has the whole recipe. */
#define BACKEND_OPS(X)                                                                                                 \
    X(embed, (struct backend * be, struct tensor * out /* [n][hidden] */, const struct tensor *table /* [vocab][hidden] */), \
      (in, out, table))                                                                                                \
    X(matmul, (struct backend * be, struct tensor * out /* [n][m] */, const struct tensor *x /* [n][k] */,             \
               const struct tensor *w /* [m][k] */),                                                                   \
      (in, out, x, w))                                                                                                 \
    /* out[i] (+)= pre(x) . w[i]^T for i < n_w <= MM_MAX_W, one input shared by                                        \
     * up to three weights [m_i][k] (q/k/v, gate/up): the neighbours of a                                              \
     * product that a GPU backend folds into one launch. Same numbers as the                                           \
     * separate ops, to float rounding. */                                                                             \
    X(matmul_fused, (struct backend * be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,       \
                     const struct tensor *x /* [n][k] */, const struct mm_fused *f),                                   \
      (in, n_w, out, w, x, f))                                                                                         \
    /* RMSNorm of every w->n_cols-wide group of x (so [n][heads*hd] with w [hd] is per-head). */                       \
    X(rmsnorm, (struct backend * be, struct tensor * out, const struct tensor *x, const struct tensor *w, float eps),  \
      (in, out, x, w, eps))                                                                                            \
    /* Rotary embedding, rotate-half layout, on the first rope_dim dims of each head. */                               \
    X(rope, (struct backend * be, struct tensor * x /* [n][n_head*head_dim] */, int32_t n_head, int32_t head_dim,      \
             int32_t rope_dim, const struct tensor *inv_freq /* [rope_dim/2] f32 */, float scale),                     \
      (in, x, n_head, head_dim, rope_dim, inv_freq, scale))                                                            \
    /* q [n][n_head*hd] and k [n][n_kv_head*hd] in place: per-head RMSNorm,                                            \
     * rotary embedding; then k and v into their cache slots: rmsnorm, rope                                            \
     * and kv_store one after another, in one pass where the backend can. */                                           \
    X(attn_prep, (struct backend * be, struct tensor * q, struct tensor * k, const struct tensor *v,                   \
                  struct tensor *k_cache, struct tensor *v_cache, const struct attn_prep *p),                          \
      (in, q, k, v, k_cache, v_cache, p))                                                                              \
    /* K/V of the batch tokens into their cache slots. */                                                              \
    X(kv_store, (struct backend * be, struct tensor * k_cache, struct tensor * v_cache, const struct tensor *k,        \
                 const struct tensor *v),                                                                              \
      (in, k_cache, v_cache, k, v))                                                                                    \
    X(attention, (struct backend * be, struct tensor * out /* [n][n_head*head_dim] */, const struct tensor *q,         \
                  const struct tensor *k_cache, const struct tensor *v_cache, int32_t n_head, int32_t n_kv_head,       \
                  int32_t head_dim, float scale),                                                                      \
      (in, out, q, k_cache, v_cache, n_head, n_kv_head, head_dim, scale))                                              \
    X(swiglu, (struct backend * be, struct tensor * out, const struct tensor *gate, const struct tensor *up),          \
      (in, out, gate, up))                                                                                             \
    /* x += y */                                                                                                       \
    X(add, (struct backend * be, struct tensor * x, const struct tensor *y), (in, x, y))                               \
    /* out[j] = x[out_rows[j]] for the batch's output rows. */                                                         \
    X(get_out_rows, (struct backend * be, struct tensor * out, const struct tensor *x), (in, out, x))                  \
    /* out (+)= the routed experts of x: h = RMSNorm(x), the routing of h's                                            \
     * logits, and each row's sum over its k experts of weight * expert(h)                                             \
     * (struct moe_block; accumulate adds it to out, which may be x). With a                                           \
     * shared expert, its y is added to each row's sum before out: out (+)=                                            \
     * routed + shared, the reference's order. A backend may run the shared                                            \
     * expert beside the routed ones. */                                                                               \
    X(moe, (struct backend * be, struct tensor * out, const struct tensor *x, const struct moe_block *mb,              \
            bool accumulate),                                                                                          \
      (in, out, x, mb, accumulate))                                                                                    \
    /* elementwise: x *= sigmoid(g), g [n][cols] or [n][1] */                                                          \
    X(sigmoid_mul, (struct backend * be, struct tensor * x, const struct tensor *g), (in, x, g))                       \
    /* x = max(x, 0)^2 */                                                                                              \
    X(relu2, (struct backend * be, struct tensor * x), (in, x))                                                        \
    /* out[r][j] = x[r][map[j]]; map: I32 [1][out cols] made with alloc + write. */                                    \
    X(permute_cols, (struct backend * be, struct tensor * out, const struct tensor *x, const struct tensor *map),      \
      (in, out, x, map))                                                                                               \
    /* RMSNorm over groups of `group` columns with a gate z (same shape as x):                                         \
     * gate_first false (Qwen): w * norm(x) * silu(z); true (Mamba2): w * norm(x * silu(z)).                           \
     * w has `group` entries (shared by all groups) or x->n_cols. */                                                   \
    X(rmsnorm_gated, (struct backend * be, struct tensor * out, const struct tensor *x, const struct tensor *z,        \
                      const struct tensor *w, float eps, int64_t group, bool gate_first),                              \
      (in, out, x, z, w, eps, group, gate_first))                                                                      \
    /* recurrent layers (see struct attn_batch for parent / state slots) */                                            \
    /* out = silu(bias + depthwise causal conv of width K over each token's path).                                     \
     * w [C][K] (tap K-1 multiplies the token itself), bias [C] or NULL,                                               \
     * state [n_slots][(K-1)*C]: the last K-1 inputs, oldest first. */                                                 \
    X(conv1d, (struct backend * be, struct tensor * out /* [n][C] */, const struct tensor *x /* [n][C] */,             \
               const struct tensor *w, const struct tensor *bias, struct tensor *state),                               \
      (in, out, x, w, bias, state))                                                                                    \
    /* Gated delta rule (Gated DeltaNet). Per value head h (key head h/(Hv/Hk)):                                       \
     * q, k L2-normalised, q scaled by 1/sqrt(dk); beta = sigmoid(b[h]);                                               \
     * g = -exp(A_log[h]) * softplus(a[h] + dt_bias[h]); S = exp(g) S;                                                 \
     * S += k (beta (v - S^T k))^T; out = S^T q. state [n_slots][Hv*dk*dv], S [dk][dv] per head. */                    \
    X(delta_rule, (struct backend * be, struct tensor * out /* [n][Hv*dv] */, const struct tensor *q /* [n][Hk*dk] */, \
                   const struct tensor *k /* [n][Hk*dk] */, const struct tensor *v /* [n][Hv*dv] */,                   \
                   const struct tensor *a /* [n][Hv] */, const struct tensor *b /* [n][Hv] */,                         \
                   const struct tensor *A_log, const struct tensor *dt_bias, struct tensor *state, int32_t n_k_head,   \
                   int32_t n_v_head, int32_t k_dim, int32_t v_dim),                                                    \
      (in, out, q, k, v, a, b, A_log, dt_bias, state, n_k_head, n_v_head, k_dim, v_dim))                               \
    /* Mamba2 selective scan (SSD). Per head h (group h/(H/G)), with A = -exp(A_log[h]):                               \
     * S = exp(dt A) S + dt x B^T; y = S C + D[h] x. state [n_slots][H*P*N], S [P][N] per head. */                     \
    X(ssd, (struct backend * be, struct tensor * y /* [n][H*P] */, const struct tensor *x /* [n][H*P] */,              \
            const struct tensor *B /* [n][G*N] */, const struct tensor *C /* [n][G*N] */,                              \
            const struct tensor *dt /* [n][H] */, const struct tensor *A_log, const struct tensor *D,                  \
            const struct tensor *dt_bias, struct tensor *state, const struct ssd_params *p),                           \
      (in, y, x, B, C, dt, A_log, D, dt_bias, state, p))

struct backend_ops {
    const char *name;
    bool kv_bf16; /* kv_store, attn_prep and attention take BF16 caches (else F32 only) */
    /* Prompt tokens a forward takes by default (the server's chunk, the
     * command line's batch): enough rows that the products run at the
     * device's full rate; more costs scratch memory and, in a server, the
     * time the other requests wait for their next token. */
    int32_t prefill_chunk;
    void (*free)(struct backend *be);
    /* Facts of the device (see struct device_info); measure: a cpu's read
     * bandwidth measured (the first time a fraction of a second), else 0. */
    void (*info)(struct backend *be, struct device_info *out, bool measure);

    /* memory */
    int (*alloc)(struct backend *be, struct tensor *t, enum dtype type, int64_t n_rows, int64_t n_cols);
    void (*release)(struct backend *be, struct tensor *t);
    /* Make a host tensor (mmapped checkpoint data) usable by the ops. */
    int (*weight)(struct backend *be, struct tensor *dst, const struct tensor *host);
    /* Copy rows [row0, row0+n) of a tensor to host memory as stored (n *
     * n_cols elements of its dtype), after the queued ops. -1 with err_set()
     * when the backend failed (an op since the last check, or this copy): dst
     * then holds zeros. */
    int (*read)(struct backend *be, const struct tensor *t, int64_t row0, int64_t n, void *dst);
    /* The k <= TOP_K_MAX largest values of each row of an F32 tensor, largest
     * first (ties: the lower column first), to host ids [n][k] and vals [n][k]
     * (vals may be NULL): greedy decoding and draft trees read k numbers per
     * row instead of the vocabulary. Waits for the queued ops and reports a
     * failure as read does. */
    int (*top_k)(struct backend *be, const struct tensor *t, int32_t k, int32_t *ids, float *vals);
    /* Copy host rows into rows [row0, row0+n) of a tensor (host data in its dtype). */
    void (*write)(struct backend *be, struct tensor *t, int64_t row0, int64_t n, const void *src);
    /* Copy cache rows src[i] -> dst[i] in each tensor (copy-on-write, tree commit). */
    void (*copy_rows)(struct backend *be, struct tensor *t, const int32_t *src, const int32_t *dst, int32_t n);

    /* Waits until every queued op has finished (a no-op where ops are synchronous). */
    void (*sync)(struct backend *be);
    /* The forward begun by set_batch (with an owner) has queued its last op. */
    void (*forward_end)(struct backend *be);

    /* the batch */
    int (*set_batch)(struct backend *be, const struct attn_batch *b);

    /* the ops (BACKEND_OPS) */
#define BACKEND_OP_FIELD(name, params, args) void(*name) params;
    BACKEND_OPS(BACKEND_OP_FIELD)
#undef BACKEND_OP_FIELD
};

struct backend {
    const struct backend_ops *ops;
};

/* matmul_fused as its pieces, the backend's own ops one after another
 * (rmsnorm / swiglu / relu2 into pre_buf, matmul, add through acc_buf): what
 * a backend runs where it has nothing fused for the shape. */
#ifdef __cplusplus
extern "C" /* the cuda backend calls it */
#endif
void backend_matmul_pieces(struct backend *be, int32_t n_w, struct tensor *const *out, const struct tensor *const *w,
                           const struct tensor *x, const struct mm_fused *f);

/* out (+)= the MLP of x (struct mlp_block): gate and up in one product, the
 * activation folded into down's input, through the backend's matmul_fused. */
#ifdef __cplusplus
extern "C"
#endif
void backend_mlp(struct backend *be, const struct mlp_block *p, const struct tensor *x, struct tensor *out,
                 bool accumulate);

/* The shared expert of mb (mb->shared, not NULL) into its y, from mb->h. */
#ifdef __cplusplus
extern "C"
#endif
void backend_moe_shared(struct backend *be, const struct moe_block *mb);

/* attn_prep as its pieces (rmsnorm, rope, kv_store), the backend's own ops. */
#ifdef __cplusplus
extern "C"
#endif
void backend_attn_prep_pieces(struct backend *be, struct tensor *q, struct tensor *k, const struct tensor *v,
                              struct tensor *k_cache, struct tensor *v_cache, const struct attn_prep *p);

/* The recurrent ops' view of a batch: rows of each sequence in batch order,
 * sequences in order of their first row; start [n_groups+1] indexes rows
 * [n_tokens]. Returns the number of groups. */
#ifdef __cplusplus
extern "C"
#endif
int32_t backend_group_rows(const struct attn_batch *b, int32_t *start, int32_t *rows);

/* Whether a group's n rows are one chain from the committed state with a
 * state kept only after the last: the form a chunked scan may take. */
#ifdef __cplusplus
extern "C"
#endif
bool backend_rows_chain(const struct attn_batch *b, const int32_t *rows, int32_t n);

/* top_k of one host row x[0..n) (the order top_k defines); vals may be NULL. */
void backend_top_k_row(const float *x, int64_t n, int32_t k, int32_t *ids, float *vals);

#endif
