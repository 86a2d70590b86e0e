/* attention_flash: prefill attention on the tensor cores (attention_impl.h);
 * attention.cu holds decoding and picks which kernels a batch takes. */
#include "attention_impl.h"

/* Prefill on the tensor cores (flash attention). First k_kv_bf16 converts,
 * once per layer, the keys and values the batch's sequences see into dense
 * bf16 copies (K by position, V transposed: a value row per head dim), per
 * kv head, at a 64-aligned offset per sequence row. Then k_flash: a block
 * takes fa_rb groups of 16 consecutive rows of a row tile times fa_hb
 * query heads sharing one kv head (a warp each, up to 8), and walks the keys
 * in tiles of FA_KT copied (cp.async) into shared memory as they are stored,
 * the next tile while the current one is multiplied, with a running max per
 * row and fp32 accumulation. Precise (SPLIT): every operand is a bf16 pair hi
 * + lo and each product three (qh.kh + qh.kl + ql.kh, to ~2^-17),
 * fp32-level results at tensor-core speed; otherwise one product of the bf16
 * values, like the prefill matmuls' bf16 activations. */
#define FA_KT CUDA_KV_TILE

/* grid: (position tiles of 64, sequence rows, kv heads) */
template <int HD, bool SPLIT>
__global__ void k_kv_bf16(struct att_args a)
{
    constexpr int DS = HD < 128 ? HD : 128; /* head dims transposed at a time (static shared memory) */
    __shared__ float vs[FA_KT][DS + 1];
    const int32_t s = blockIdx.y, kvh = blockIdx.z, p0 = blockIdx.x * FA_KT, len = a.b.kv_len[s];
    if (p0 >= len)
        return;
    const int64_t base = (int64_t)a.b.kv_off[s] + p0, total = a.kv_total, lo_k = (int64_t)a.n_kv_head * total * HD;
    const int32_t *table = a.b.block_table + (int64_t)s * a.max_blocks;
    for (int d0 = 0; d0 < HD; d0 += DS) {
        for (int e = threadIdx.x; e < FA_KT * DS; e += blockDim.x) {
            const int key = e / DS, d = d0 + e % DS, p = p0 + key;
            /* past the row's keys: zeros (flash_sm90's tiles read them) */
            const int64_t src = p < len ? (int64_t)(table[p / a.block_size] * a.block_size + p % a.block_size) * a.ks +
                                              (int64_t)kvh * HD + d
                                        : -1;
            const float k = src < 0 ? 0.0f : kv_at(a.kc, a.kv16, src);
            const __nv_bfloat16 h = __float2bfloat16_rn(k);
            __nv_bfloat16 *kb = a.kb + ((int64_t)kvh * total + base + key) * HD + d;
            kb[0] = h;
            if (SPLIT)
                kb[lo_k] = __float2bfloat16_rn(k - __bfloat162float(h));
            vs[key][d - d0] = src < 0 ? 0.0f : kv_at(a.vc, a.kv16, src);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < FA_KT * DS; e += blockDim.x) {
            const int d = e / FA_KT, key = e % FA_KT;
            const float v = vs[key][d];
            const __nv_bfloat16 h = __float2bfloat16_rn(v);
            __nv_bfloat16 *vt = a.vt + ((int64_t)kvh * HD + d0 + d) * total + base + key;
            vt[0] = h;
            if (SPLIT)
                vt[lo_k] = __float2bfloat16_rn(v - __bfloat162float(h));
        }
        __syncthreads(); /* vs is read before the next slice refills it */
    }
}

/* k_kv_bf16 for a bf16 cache in fast mode, where the copy changes no bits:
 * each thread moves 16 bytes (8 dims of a key) of K and of V; the value
 * tile is transposed through shared memory, a row of 65 values a head dim
 * (an odd pitch: a chunk's 8 stores land in distinct banks but for pairs),
 * and written 8 keys at a time. A tile reaching past the row's keys writes
 * zeros there: a row's copy starts 64-aligned, so the whole tile is its. */
#define KV_VP (FA_KT + 1)
template <int HD>
__global__ void k_kv_copy16(struct att_args a)
{
    constexpr int CH = HD / 8; /* 16-byte chunks of a key's head */
    __shared__ __nv_bfloat16 vs[HD * KV_VP];
    const int32_t s = blockIdx.y, kvh = blockIdx.z, p0 = blockIdx.x * FA_KT, len = a.b.kv_len[s];
    if (p0 >= len)
        return;
    const int64_t base = (int64_t)a.b.kv_off[s] + p0, total = a.kv_total;
    const int32_t *table = a.b.block_table + (int64_t)s * a.max_blocks;
    const __nv_bfloat16 *kc = (const __nv_bfloat16 *)a.kc, *vc = (const __nv_bfloat16 *)a.vc;
    for (int e = threadIdx.x; e < FA_KT * CH; e += blockDim.x) {
        const int key = e / CH, c = e % CH, p = p0 + key;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
        if (p < len) {
            const int64_t src = (int64_t)(table[p / a.block_size] * a.block_size + p % a.block_size) * a.ks +
                                (int64_t)kvh * HD + c * 8;
            kv = *(const uint4 *)(kc + src);
            vv = *(const uint4 *)(vc + src);
        }
        *(uint4 *)(a.kb + ((int64_t)kvh * total + base + key) * HD + c * 8) = kv;
        const __nv_bfloat16 *v8 = (const __nv_bfloat16 *)&vv;
#pragma unroll
        for (int j = 0; j < 8; j++)
            vs[(c * 8 + j) * KV_VP + key] = v8[j];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < HD * (FA_KT / 8); e += blockDim.x) {
        const int d = e / (FA_KT / 8), c = e % (FA_KT / 8);
        __align__(16) __nv_bfloat16 v8[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v8[j] = vs[d * KV_VP + c * 8 + j];
        *(uint4 *)(a.vt + ((int64_t)kvh * HD + d) * total + base + c * 8) = *(const uint4 *)v8;
    }
}

template <int HD, bool SPLIT>
__global__ void __launch_bounds__(FA_MAX_WARPS * 32) k_flash(struct att_args a)
{
    constexpr int KP = HD + 8, VP = FA_KT + 8, NK = HD / 16, ND = HD / 8, NJ = FA_KT / 8;
    constexpr int STAGE = (FA_KT * KP + HD * VP) * (SPLIT ? 2 : 1); /* bf16 per stage: kh, vh (, kl, vl) */
    /* head dims over 128: the output takes the registers, so each warp's 16
     * query rows wait in shared memory (after the two stages, QP apart) and
     * come back by ldmatrix per product; bf16 operands only */
    constexpr bool QS = HD > 128;
    constexpr int QP = HD + 8;
    static_assert(!(QS && SPLIT), "k_flash: split operands up to head dim 128");
    extern __shared__ uint4 smem_raw[];
    __shared__ int32_t v_end;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
    const int32_t G = a.n_head / a.n_kv_head, groups = G / a.fa_hb;
    const int32_t kvh = blockIdx.y / groups, h = kvh * G + (blockIdx.y % groups) * a.fa_hb + warp % a.fa_hb;
    /* rows [i0, hi) of a row tile (d.fa_tile), 16 * fa_rb of them a block */
    const int32_t parts = CUDA_FA_ROWS / (16 * a.fa_rb), tile_i = blockIdx.x / parts;
    const int32_t i0 = a.b.fa_tile[2 * tile_i] + (int32_t)(blockIdx.x % parts) * 16 * a.fa_rb,
                  hi = a.b.fa_tile[2 * tile_i + 1];
    if (i0 >= hi)
        return;
    const int32_t ra = i0 + warp / a.fa_hb * 16 + g, rb = ra + 8;
    const int32_t va = ra < hi ? a.b.n_vis[ra] : 0, vb = rb < hi ? a.b.n_vis[rb] : 0;
    const int32_t w_end = __reduce_max_sync(0xffffffffu, max(va, vb));
    if (threadIdx.x == 0)
        v_end = 0;
    __syncthreads();
    if (lane == 0)
        atomicMax(&v_end, w_end);
    uint32_t qh[QS ? 1 : NK][4], ql[QS ? 1 : NK][4];
    __nv_bfloat16 *qsm = (__nv_bfloat16 *)smem_raw + 2 * STAGE + warp * 16 * QP;
    if constexpr (QS) {
        const int32_t r0 = i0 + warp / a.fa_hb * 16;
        for (int e = lane; e < 16 * HD / 2; e += 32) {
            const int r = e / (HD / 2), d = e % (HD / 2) * 2;
            const float2 x = *(const float2 *)(a.q + (int64_t)min(r0 + r, hi - 1) * a.qs + (int64_t)h * HD + d);
            *(__nv_bfloat162 *)(qsm + r * QP + d) = __floats2bfloat162_rn(x.x, x.y);
        }
    } else {
        const float *qa = a.q + (int64_t)min(ra, hi - 1) * a.qs + (int64_t)h * HD + 2 * cq;
        const float *qb = a.q + (int64_t)min(rb, hi - 1) * a.qs + (int64_t)h * HD + 2 * cq;
#pragma unroll
        for (int kt = 0; kt < NK; kt++) {
            const float2 x0 = *(const float2 *)(qa + kt * 16), x1 = *(const float2 *)(qb + kt * 16);
            const float2 x2 = *(const float2 *)(qa + kt * 16 + 8), x3 = *(const float2 *)(qb + kt * 16 + 8);
            split_bf16x2(x0.x, x0.y, &qh[kt][0], &ql[kt][0]);
            split_bf16x2(x1.x, x1.y, &qh[kt][1], &ql[kt][1]);
            split_bf16x2(x2.x, x2.y, &qh[kt][2], &ql[kt][2]);
            split_bf16x2(x3.x, x3.y, &qh[kt][3], &ql[kt][3]);
        }
    }
    float o[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
    const float scale2 = a.scale * 1.44269504088896341f; /* the running maxima are in base 2 */
    __syncthreads();
    const int32_t end = v_end;
    /* the block's sequence's keys in the bf16 copies; past end, zeros */
    const int64_t total = a.kv_total, lo_k = (int64_t)a.n_kv_head * total * HD;
    const int64_t kv0 = a.b.kv_off[a.b.seq_row[i0]];
    const __nv_bfloat16 *kb = a.kb + ((int64_t)kvh * total + kv0) * HD, *vt = a.vt + (int64_t)kvh * HD * total + kv0;
    auto fetch = [&](int32_t tile, int st) {
        __nv_bfloat16 *kh = (__nv_bfloat16 *)smem_raw + st * STAGE, *vh = kh + FA_KT * KP;
        for (int e = threadIdx.x; e < FA_KT * HD / 8; e += blockDim.x) {
            const int key = e / (HD / 8), d = (e % (HD / 8)) * 8;
            const bool in = tile + key < end;
            const __nv_bfloat16 *src = kb + (int64_t)(in ? tile + key : 0) * HD + d;
            cp_async16(kh + key * KP + d, src, in ? 16 : 0);
            if (SPLIT)
                cp_async16(kh + FA_KT * KP + HD * VP + key * KP + d, src + lo_k, in ? 16 : 0);
        }
        for (int e = threadIdx.x; e < HD * FA_KT / 8; e += blockDim.x) {
            const int d = e / (FA_KT / 8), k0 = (e % (FA_KT / 8)) * 8;
            const int valid = min(max(end - (tile + k0), 0), 8);
            const __nv_bfloat16 *src = vt + (int64_t)d * total + (valid ? tile + k0 : 0);
            cp_async16(vh + d * VP + k0, src, valid * 2);
            if (SPLIT)
                cp_async16(vh + FA_KT * KP + HD * VP + d * VP + k0, src + lo_k, valid * 2);
        }
        cp_async_commit();
    };
    if (end > 0)
        fetch(0, 0);
    for (int32_t tile = 0, st = 0; tile < end; tile += FA_KT, st ^= 1) {
        flash_ring_next(fetch, tile, FA_KT, end, st);
        __syncthreads(); /* tile's copy is in for every thread */
        const __nv_bfloat16 *kh = (const __nv_bfloat16 *)smem_raw + st * STAGE, *vh = kh + FA_KT * KP;
        const __nv_bfloat16 *kl = vh + HD * VP, *vl = kl + FA_KT * KP;
        if (tile < w_end) {
            float s[NJ][4];
#pragma unroll
            for (int j = 0; j < NJ; j++)
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kt = 0; kt < NK; kt++) {
                /* the row operand: rows g and g+8, head dims kt*16 + 2cq (+8) */
                uint32_t qf[4];
                if constexpr (QS) {
                    ldsm_x4(qf, qsm + (lane & 15) * QP + kt * 16 + (lane >> 4) * 8);
                } else {
                    qf[0] = qh[kt][0];
                    qf[1] = qh[kt][1];
                    qf[2] = qh[kt][2];
                    qf[3] = qh[kt][3];
                }
#pragma unroll
                for (int j = 0; j < NJ; j += 2) {
                    /* keys 8j..8j+15, head dims kt*16..kt*16+15: b[0..1] key tile j, b[2..3] j+1 */
                    const int off = (8 * j + (lane >> 4) * 8 + (lane & 7)) * KP + kt * 16 + (lane >> 3 & 1) * 8;
                    uint32_t bh[4];
                    ldsm_x4(bh, kh + off);
                    if constexpr (SPLIT) {
                        uint32_t bl[4];
                        ldsm_x4(bl, kl + off);
                        mma_bf16(s[j], ql[kt][0], ql[kt][1], ql[kt][2], ql[kt][3], bh[0], bh[1]);
                        mma_bf16(s[j], qf[0], qf[1], qf[2], qf[3], bl[0], bl[1]);
                        mma_bf16(s[j + 1], ql[kt][0], ql[kt][1], ql[kt][2], ql[kt][3], bh[2], bh[3]);
                        mma_bf16(s[j + 1], qf[0], qf[1], qf[2], qf[3], bl[2], bl[3]);
                    }
                    mma_bf16(s[j], qf[0], qf[1], qf[2], qf[3], bh[0], bh[1]);
                    mma_bf16(s[j + 1], qf[0], qf[1], qf[2], qf[3], bh[2], bh[3]);
                }
            }
            /* scale (into base 2: exp(x) = 2^(x log2 e)), causal mask, running
             * max per row (a row's 4 lanes agree) */
            float xa = ma, xb = mb;
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int32_t key = tile + 8 * j + 2 * cq + c;
                    s[j][c] = key < va ? s[j][c] * scale2 : -INFINITY;
                    s[j][2 + c] = key < vb ? s[j][2 + c] * scale2 : -INFINITY;
                    xa = fmaxf(xa, s[j][c]);
                    xb = fmaxf(xb, s[j][2 + c]);
                }
            xa = quad_max(xa);
            xb = quad_max(xb);
            const float ca = xa == -INFINITY ? 1.0f : exp2f(ma - xa), cb = xb == -INFINITY ? 1.0f : exp2f(mb - xb);
            ma = xa;
            mb = xb;
            la *= ca;
            lb *= cb;
            /* a row with no key yet keeps zeros (its max is -inf) */
            const float sa = xa == -INFINITY ? 0.0f : xa, sb = xb == -INFINITY ? 0.0f : xb;
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    s[j][c] = exp2f(s[j][c] - sa);
                    s[j][2 + c] = exp2f(s[j][2 + c] - sb);
                    la += s[j][c];
                    lb += s[j][2 + c];
                }
#pragma unroll
            for (int j = 0; j < ND; j++) {
                o[j][0] *= ca;
                o[j][1] *= ca;
                o[j][2] *= cb;
                o[j][3] *= cb;
            }
            /* the scores' accumulator layout is the next product's row operand:
             * key tiles 2kk and 2kk+1 make the 16 keys of step kk */
#pragma unroll
            for (int kk = 0; kk < FA_KT / 16; kk++) {
                uint32_t ph[4], pl[4];
                split_bf16x2(s[2 * kk][0], s[2 * kk][1], &ph[0], &pl[0]);
                split_bf16x2(s[2 * kk][2], s[2 * kk][3], &ph[1], &pl[1]);
                split_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1], &ph[2], &pl[2]);
                split_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3], &ph[3], &pl[3]);
#pragma unroll
                for (int j = 0; j < ND; j += 2) {
                    /* head dims 8j..8j+15 (rows of the transposed values), keys kk*16..kk*16+15 */
                    const int off = (8 * j + (lane >> 4) * 8 + (lane & 7)) * VP + kk * 16 + (lane >> 3 & 1) * 8;
                    uint32_t bh[4];
                    ldsm_x4(bh, vh + off);
                    if constexpr (SPLIT) {
                        uint32_t bl[4];
                        ldsm_x4(bl, vl + off);
                        mma_bf16(o[j], pl[0], pl[1], pl[2], pl[3], bh[0], bh[1]);
                        mma_bf16(o[j], ph[0], ph[1], ph[2], ph[3], bl[0], bl[1]);
                        mma_bf16(o[j + 1], pl[0], pl[1], pl[2], pl[3], bh[2], bh[3]);
                        mma_bf16(o[j + 1], ph[0], ph[1], ph[2], ph[3], bl[2], bl[3]);
                    }
                    mma_bf16(o[j], ph[0], ph[1], ph[2], ph[3], bh[0], bh[1]);
                    mma_bf16(o[j + 1], ph[0], ph[1], ph[2], ph[3], bh[2], bh[3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with this stage before it is refilled */
    }
    flash_store<ND, HD>(a, o, la, lb, ra, rb, hi, h, cq);
}

/* The bf16 copies of the keys and values each sequence row of the batch sees
 * (positions below its tokens' largest count, see set_batch), then the
 * flash kernel. */
template <int HD, bool SPLIT>
static void flash_run(struct cuda_backend *c, struct att_args *a)
{
    const int32_t n_rows = c->b.n_seq_rows;
    const size_t copies = (size_t)a->n_kv_head * c->kv_total * HD * (SPLIT ? 2 : 1) * sizeof(__nv_bfloat16);
    char *buf = (char *)cuda_scratch(c, SCR_KV, 2 * copies);
    if (!buf)
        return;
    a->kb = (__nv_bfloat16 *)buf;
    a->vt = (__nv_bfloat16 *)(buf + copies);
    a->kv_total = c->kv_total;
    if (c->kv_max > 0) {
        const dim3 grid((unsigned)cdiv(c->kv_max, FA_KT), (unsigned)n_rows, (unsigned)a->n_kv_head);
        if (!SPLIT && a->kv16 && a->ks % 8 == 0 && ((uintptr_t)a->kc & 15) == 0 && ((uintptr_t)a->vc & 15) == 0)
            k_kv_copy16<HD><<<grid, 256, 0, c->stream>>>(*a);
        else
            k_kv_bf16<HD, SPLIT><<<grid, 256, 0, c->stream>>>(*a);
        if (CUDA_LAUNCHED(c) != 0)
            return;
    }
    if (a->sm90) {
        const struct flash_sm90_args f = {a->q,        a->qs,        a->out,       a->os,
                                          a->kb,       a->vt,        a->kv_total,  a->b,
                                          c->n_fa_tiles, a->n_head, a->n_kv_head, a->scale};
        cuda_flash_sm90(c, &f, HD);
        return;
    }
    const int smem = (2 * (FA_KT * (HD + 8) + HD * (FA_KT + 8)) * (SPLIT ? 2 : 1) +
                      (HD > 128 ? a->fa_hb * a->fa_rb * 16 * (HD + 8) : 0)) *
                     (int)sizeof(__nv_bfloat16);
    if (CUDA_CHECK(c, cudaFuncSetAttribute(k_flash<HD, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) !=
        0)
        return;
    const unsigned groups = (unsigned)(a->n_head / a->n_kv_head / a->fa_hb);
    k_flash<HD, SPLIT><<<dim3((unsigned)(c->n_fa_tiles * (CUDA_FA_ROWS / (16 * a->fa_rb))),
                              (unsigned)a->n_kv_head * groups),
                         (unsigned)(a->fa_hb * a->fa_rb * 32), smem, c->stream>>>(*a);
    CUDA_LAUNCHED(c);
}

/* precise (kapitsa check): the split products; otherwise bf16 q, k, p and v
 * with fp32 accumulation, as the prefill matmuls take bf16 activations */
template <int HD>
static void flash_launch(struct cuda_backend *c, struct att_args *a)
{
    if (c->precise)
        flash_run<HD, true>(c, a);
    else
        flash_run<HD, false>(c, a);
}

void attention_flash(struct cuda_backend *c, struct att_args *a, int32_t head_dim)
{
    if (head_dim == 32)
        flash_launch<32>(c, a);
    else if (head_dim == 64)
        flash_launch<64>(c, a);
    else if (head_dim == 128)
        flash_launch<128>(c, a);
    else
        flash_run<256, false>(c, a);
}
