/* flash_sm90: prefill attention on Hopper's warpgroup tensor cores (wgmma),
 * bf16 operands (fast mode), head dims 64, 128 and 256.
 *
 * It reads what attention.cu's k_kv_bf16 makes for k_flash: bf16 copies of
 * each sequence row's keys [kv head][position][hd] and transposed values
 * [kv head][hd][position]. A warpgroup (4 warps, 128 threads) takes 64
 * rows of one head (a row tile, d.fa_tile), a block nwg heads of one kv
 * head, so every key and value tile in shared memory serves all of them. Per
 * tile of 64 keys: S = Q K^T by wgmma with both operands in shared memory
 * (the block's queries staged once, as bf16); the causal mask (only where the
 * tile reaches past a row's keys), the running max and the exponentials in
 * registers, as k_flash does them but with the scale folded into exp2's
 * argument (a warp's 16 rows of a wgmma accumulator are laid out as
 * mma.sync's); then O += P V with P from registers (at head dim 256 as two
 * products of 128 value rows: a wgmma's N is at most 256, and one of 256
 * would want the whole accumulator in one instruction's operand list, which
 * is no faster than two of 128). k_flash issues a warp's
 * mma.sync for 16 rows and reads its operands from shared memory per warp; a
 * warpgroup's wgmma reads them once for 64 rows and runs asynchronously.
 *
 * At head dim 128 with two heads a block (qwen3's shapes) the block follows
 * FlashAttention-3's layout: a producer warpgroup fetches tiles of 128 keys
 * by TMA (cp.async.bulk.tensor, the tensor maps' 128-byte swizzle being the
 * operands' layout) into three stages, handing them over through mbarriers,
 * so the two consumer warpgroups never wait for each other; and each
 * consumer issues tile t's S = Q K^T together with tile t - 1's O += P V,
 * working out t's softmax while P V runs. Other shapes, or a driver without
 * tensor maps: every thread copies 64-key tiles by cp.async into two stages,
 * one barrier a tile, the products and the softmax in turn.
 *
 * Operands sit in the 128-byte-swizzled K-major layout of the PTX ISA's
 * wgmma matrix descriptors: rows of 64 bf16 (128 bytes), 8-row atoms of 1024
 * bytes, the 16-byte chunk c of row r stored at chunk c ^ (r % 8); a k16
 * step inside a row is the descriptor's start address plus 32 bytes.
 *
 * wgmma exists on sm_90a only: this file alone is compiled for sm_90a (plus
 * PTX without the kernel's body, for newer GPUs), and the backend launches
 * the kernel only on a device of compute capability 9.0 (c->wgmma). */
#include "cuda_impl.h"
#include "sm90.h"

#include <math.h>

/* the tensor maps of the bf16 copies the producer warp fetches tiles by:
 * keys [n_kv_head][kv_total][HD] in boxes of 64 dims x 128 keys, transposed
 * values [n_kv_head][HD][kv_total] in boxes of 64 keys x HD dims */
struct fw_maps {
    CUtensorMap k, v;
};

#define FW_ROWS CUDA_FA_ROWS /* query rows per warpgroup: a row tile (d.fa_tile) */

#if FW_WGMMA
/* 2^x as the MUFU computes it, results below 2^-126 flushed to zero: exp2f
 * without fast math adds a compare and two multiplies a score to keep
 * those subnormal, and a subnormal p weighs nothing beside a row's sum of
 * at least 1 (the row's max scores exp2(0)) */
static __device__ __forceinline__ float fw_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif

/* grid: (row tiles of 64, kv heads x head groups of nwg); nwg warpgroups,
 * one query head each, the same rows. TMA: a producer warpgroup after them
 * fetches tiles of 128 keys by the tensor maps m into three stages;
 * otherwise every thread copies tiles of 64 keys into two */
template <int HD, int NWG, int MINB, bool TMA>
__global__ void __launch_bounds__(NWG * 128 + (TMA ? 128 : 0), MINB)
    k_flash_sm90(const __grid_constant__ flash_sm90_args a, const __grid_constant__ fw_maps m)
{
#if FW_WGMMA
    constexpr int KT = TMA ? 128 : 64; /* keys a tile */
    constexpr int NK = HD / 16, ND = HD / 8, NJ = KT / 8;
    constexpr uint32_t QTILE = HD * 128; /* bytes of a [64][HD] query tile */
    constexpr uint32_t KVT = HD * KT * 2; /* bytes of a [KT][HD] key tile or a [HD][KT] value tile */
    constexpr uint32_t SUB = 64 * 128;    /* a 64-wide column slice of a query tile */
    constexpr uint32_t KSUB = KT * 128;   /* ... of a key tile */
    constexpr uint32_t VSUB = HD * 128;   /* a 64-key slice of a value tile */
    constexpr int NST = TMA ? 3 : 2;     /* stages of keys and values */
    extern __shared__ uint8_t fw_raw[];
    __shared__ int32_t v_end, v_full;
    __shared__ uint64_t full_bar[NST], empty_bar[NST]; /* TMA: a stage's tile in; its last user done */
    /* the atoms' swizzle is of address bits: tiles start 1024-aligned */
    const uint32_t raw_s = (uint32_t)__cvta_generic_to_shared(fw_raw), pad = (1024 - (raw_s & 1023)) & 1023;
    uint8_t *const sm = fw_raw + pad;
    const uint32_t sm_s = raw_s + pad;
    const int tid = threadIdx.x, wg = tid >> 7, warp = tid >> 5 & 3, lane = tid & 31, g = lane >> 2, cq = lane & 3;
    const int32_t G = a.n_head / a.n_kv_head, groups = G / NWG;
    const int32_t kvh = blockIdx.y / groups, h = kvh * G + (int32_t)(blockIdx.y % groups) * NWG + wg;
    /* the tiles in reverse: a prompt's rows with the most keys first, so the last wave is short */
    const int32_t tile_i = a.n_tiles - 1 - (int32_t)blockIdx.x;
    const int32_t i0 = a.b.fa_tile[2 * tile_i], hi = a.b.fa_tile[2 * tile_i + 1];
    const int32_t ra = i0 + warp * 16 + g, rb = ra + 8;
    const int32_t va = ra < hi ? a.b.n_vis[ra] : 0, vb = rb < hi ? a.b.n_vis[rb] : 0;
    const int32_t w_end = __reduce_max_sync(0xffffffffu, max(va, vb));
    /* keys below the block's least count are visible to every row: no mask there */
    const int32_t w_full = __reduce_min_sync(0xffffffffu, min(ra < hi ? va : INT32_MAX, rb < hi ? vb : INT32_MAX));
    if (tid == 0) {
        v_end = 0;
        v_full = INT32_MAX;
        if (TMA)
            mbar_ring_init(full_bar, empty_bar, NST, NWG * 4);
    }
    __syncthreads();
    uint8_t *const stages = sm + NWG * QTILE;
    const uint32_t stages_s = sm_s + NWG * QTILE, qs_s = sm_s + wg * QTILE;
    const int64_t total = a.kv_total, kv0 = a.b.kv_off[a.b.seq_row[i0]];
    if (TMA && wg == NWG) {
        /* the producer: it fetches the tiles into the stages by TMA, each
         * stage's arrival on full_bar, from the start, while the consumers
         * stage their queries; each consumer warp arrives on empty_bar when
         * its warpgroup's P V of the stage is done. A tile runs past end into
         * the next rows' copies (finite: every copy's padding is written) or
         * past kv_total (zeros): masked scores, P 0. Its registers go to the
         * consumers (launched at 168 a thread: 40 here, 232 there) */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp != 0)
            return;
        const int32_t end = __reduce_max_sync(0xffffffffu, max(i0 + lane < hi ? a.b.n_vis[i0 + lane] : 0,
                                                                i0 + 32 + lane < hi ? a.b.n_vis[i0 + 32 + lane] : 0));
        if (lane == 0)
            for (int32_t tile = 0, t = 0; tile < end; tile += KT, t++) {
                const int st = t % NST;
                if (t >= NST)
                    mbar_wait(&empty_bar[st], (t / NST & 1) ^ 1);
                const uint32_t ks_s = stages_s + st * 2 * KVT;
                mbar_expect(&full_bar[st], 2 * KVT);
#pragma unroll
                for (int c = 0; c < HD / 64; c++)
                    tma3(ks_s + c * KSUB, &m.k, c * 64, (int)kv0 + tile, kvh, &full_bar[st]);
#pragma unroll
                for (int c = 0; c < KT / 64; c++)
                    tma3(ks_s + KVT + c * VSUB, &m.v, (int)kv0 + tile + c * 64, 0, kvh, &full_bar[st]);
            }
        return;
    }
    /* the warpgroup's queries as bf16, rows past the tile repeating its last */
    uint8_t *const qs = sm + wg * QTILE;
    for (int e = tid & 127; e < FW_ROWS * HD / 8; e += 128) {
        const int r = e / (HD / 8), c = e % (HD / 8);
        const float2 *src = (const float2 *)(a.q + (int64_t)min(i0 + r, hi - 1) * a.qs + (int64_t)h * HD + c * 8);
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const __nv_bfloat162 p = __float22bfloat162_rn(src[i]);
            v[i] = *(const uint32_t *)&p;
        }
        *(uint4 *)(qs + (c / 8) * SUB + wg_swz(r, c % 8 * 8)) = make_uint4(v[0], v[1], v[2], v[3]);
    }
    if (lane == 0) {
        atomicMax(&v_end, w_end);
        atomicMin(&v_full, w_full);
    }
    fence_async_shared();
    /* the consumers' barrier (all threads but the producer's) */
    asm volatile("bar.sync 1, %0;\n" ::"n"(NWG * 128) : "memory");
    const int32_t end = v_end, full = v_full; /* every warpgroup has the same rows: one range for the block */
    const __nv_bfloat16 *kb = a.kb + ((int64_t)kvh * total + kv0) * HD, *vt = a.vt + (int64_t)kvh * HD * total + kv0;
    /* a stage: the key tile [HD / 64][KT keys][64], then the value tile
     * [KT / 64][HD][64 keys]; zeros past end. A thread copies one 16-byte column of
     * key rows kr0, kr0 + KR, ... and of value rows vr0, vr0 + VR, ...:
     * its columns and bases are fixed, only the row steps, so the copies'
     * addresses cost an add each (computed from scratch each copy, they
     * and the softmax spilled past the 128 registers two blocks an SM allow) */
    constexpr int T = NWG * 128, CK = HD / 8, KR = T / CK, VR = T / (KT / 8);
    const int kc = tid % CK, kr0 = tid / CK, vc = tid % (KT / 8), vr0 = tid / (KT / 8);
    const uint32_t k_sm = (uint32_t)(kc / 8) * KSUB + (uint32_t)kr0 * 128,
                   v_sm = (uint32_t)(vc / 8) * VSUB + wg_swz(vr0, vc % 8 * 8);
    const __nv_bfloat16 *const k_src = kb + kc * 8, *const v_src = vt + (int64_t)vr0 * total + vc * 8;
    auto fetch = [&](int32_t tile, int st) {
        uint8_t *ks = stages + st * 2 * KVT, *vs = ks + KVT;
#pragma unroll
        for (int i = 0; i < KT / KR; i++) {
            const int key = kr0 + i * KR;
            const bool in = tile + key < end;
            cp_async16(ks + k_sm + (uint32_t)(i * KR) * 128 + ((((kc % 8) ^ key) & 7) << 4),
                       k_src + (int64_t)(in ? tile + key : 0) * HD, in ? 16 : 0);
        }
        const int valid = min(max(end - (tile + vc * 8), 0), 8);
#pragma unroll
        for (int i = 0; i < HD / VR; i++)
            cp_async16(vs + v_sm + (uint32_t)(i * VR) * 128, v_src + (int64_t)i * VR * total + (valid ? tile : -vc * 8),
                       valid * 2);
        cp_async_commit();
    };
    float o[ND][4], s[NJ][4];
#pragma unroll
    for (int j = 0; j < ND; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++)
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
    const float scale2 = a.scale * 1.44269504088896341f; /* the running maxima are in base 2 */
    /* S = Q K^T for the key tile at ks_s (one commit group) */
    auto qk = [&](uint32_t ks_s) {
#pragma unroll
        for (int kt = 0; kt < NK; kt++) {
            const uint64_t dq = wg_desc(qs_s + kt / 4 * SUB + kt % 4 * 32), dk = wg_desc(ks_s + kt / 4 * KSUB + kt % 4 * 32);
            if constexpr (KT == 128)
                wg_ss_n128(s, dq, dk, kt > 0);
            else
                wg_ss_n64(s, dq, dk, kt > 0);
        }
        wg_commit();
    };
    /* O += P V for the value tile at vs_s (one commit group) */
    auto pv = [&](const uint32_t (*p)[4], uint32_t vs_s) {
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            const uint32_t v_s = vs_s + kk / 4 * VSUB + kk % 4 * 32;
            if constexpr (HD == 256) {
                wg_rs_n128(o, p[kk], wg_desc(v_s));
                wg_rs_n128(o + 16, p[kk], wg_desc(v_s + 128 * 128));
            } else if constexpr (HD == 128) {
                wg_rs_n128(o, p[kk], wg_desc(v_s));
            } else {
                wg_rs_n64(o, p[kk], wg_desc(v_s));
            }
        }
        wg_commit();
    };
    /* the softmax of the tile's scores, in place in s: the causal mask past
     * full, the running max per row (a row's 4 lanes agree) over the
     * unscaled scores, kept scaled into base 2: exp(x) = 2^(x log2 e), one
     * multiply-add and exp2 a score; the sums la, lb rescaled and added to;
     * ca, cb: the rows' corrections for O */
    auto softmax = [&](int32_t tile, float &ca, float &cb) {
        float xa = -INFINITY, xb = -INFINITY;
        if (tile + KT <= full) {
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                xa = fmaxf(xa, fmaxf(s[j][0], s[j][1]));
                xb = fmaxf(xb, fmaxf(s[j][2], s[j][3]));
            }
        } else {
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int32_t key = tile + 8 * j + 2 * cq + c;
                    s[j][c] = key < va ? s[j][c] : -INFINITY;
                    s[j][2 + c] = key < vb ? s[j][2 + c] : -INFINITY;
                    xa = fmaxf(xa, s[j][c]);
                    xb = fmaxf(xb, s[j][2 + c]);
                }
        }
        xa = quad_max(xa);
        xb = quad_max(xb);
        xa = fmaxf(ma, xa * scale2);
        xb = fmaxf(mb, xb * scale2);
        ca = xa == -INFINITY ? 1.0f : fw_exp2(ma - xa);
        cb = xb == -INFINITY ? 1.0f : fw_exp2(mb - xb);
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
                s[j][c] = fw_exp2(fmaf(s[j][c], scale2, -sa));
                s[j][2 + c] = fw_exp2(fmaf(s[j][2 + c], scale2, -sb));
                la += s[j][c];
                lb += s[j][2 + c];
            }
    };
    /* the exponentials as bf16, the row operand of P V: the accumulator's
     * key tiles 2kk and 2kk+1 make its k16 step kk */
    auto to_p = [&](uint32_t (*p)[4]) {
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const __nv_bfloat162 x = __floats2bfloat162_rn(s[j][0], s[j][1]), y = __floats2bfloat162_rn(s[j][2], s[j][3]);
            p[j / 2][j % 2 * 2] = *(const uint32_t *)&x;
            p[j / 2][j % 2 * 2 + 1] = *(const uint32_t *)&y;
        }
    };
    /* a warp whose 16 rows all kept their maxima would multiply by 1:
     * skipped, the same bits (a row's maximum changes less often the more
     * keys it has seen) */
    auto rescale = [&](float ca, float cb) {
        if (!__all_sync(0xffffffffu, ca == 1.0f && cb == 1.0f)) {
#pragma unroll
            for (int j = 0; j < ND; j++) {
                o[j][0] *= ca;
                o[j][1] *= ca;
                o[j][2] *= cb;
                o[j][3] *= cb;
            }
        }
    };
    if (!TMA && end > 0)
        fetch(0, 0);
    if constexpr (TMA) {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        uint32_t p[KT / 16][4];
        float ca, cb;
        if (end > 0) { /* the first tile alone: no P V before it */
            mbar_wait(&full_bar[0], 0);
            wg_fence();
            qk(stages_s);
            wg_wait_all();
            wg_pin<NJ>(s);
            softmax(0, ca, cb);
            to_p(p);
        }
        uint32_t vs_prev = stages_s + KVT;
        for (int32_t tile = KT, t = 1; tile < end; tile += KT, t++) {
            const int st = t % NST;
            mbar_wait(&full_bar[st], t / NST & 1);
            const uint32_t ks_s = stages_s + st * 2 * KVT;
            rescale(ca, cb);
            wg_pin<ND>(o);
            wg_fence();
            qk(ks_s);
            pv(p, vs_prev);
            wg_wait_one();
            wg_pin<NJ>(s);
            softmax(tile, ca, cb);
            wg_wait_all();
            wg_pin<ND>(o);
            if (lane == 0)
                mbar_arrive(&empty_bar[(t - 1) % NST]);
            to_p(p);
            vs_prev = ks_s + KVT;
        }
        if (end > 0) {
            rescale(ca, cb);
            wg_pin<ND>(o);
            wg_fence();
            pv(p, vs_prev);
            wg_wait_all();
            wg_pin<ND>(o);
        }
    } else {
        for (int32_t tile = 0, st = 0; tile < end; tile += KT, st ^= 1) {
            cp_async_wait_all();
            fence_async_shared();
            /* the tile (and, the first time, the queries) in for every
             * warpgroup, and every warpgroup done with the last tile: its
             * stage takes the next (one barrier a tile, where a barrier
             * after each tile's products was a fifth of the warps' stalls) */
            __syncthreads();
            if (tile + KT < end)
                fetch(tile + KT, st ^ 1);
            const uint32_t ks_s = stages_s + st * 2 * KVT;
            wg_fence();
            qk(ks_s);
            wg_wait_all();
            wg_pin<NJ>(s);
            uint32_t p[KT / 16][4];
            float ca, cb;
            softmax(tile, ca, cb);
            to_p(p);
            rescale(ca, cb);
            /* at head dim 256 the compiler would otherwise finish the
             * rescaling after the fence, and ptxas serialises the products
             * around it (C7519) */
            if constexpr (HD == 256)
                wg_pin<ND>(o);
            wg_fence();
            pv(p, ks_s + KVT);
            wg_wait_all();
            wg_pin<ND>(o);
        }
    }
    flash_store<ND, HD>(a, o, la, lb, ra, rb, hi, h, cq);
#else
    (void)a;
    __trap(); /* launched only where the sm_90a build runs (c->wgmma) */
#endif
}

template <int HD, int NWG, int MINB, bool TMA = false>
static void flash_sm90_run(struct cuda_backend *c, const struct flash_sm90_args *a, const struct fw_maps *m)
{
    constexpr int KT = TMA ? 128 : 64, NST = TMA ? 3 : 2;
    const int smem = NWG * HD * 128 + NST * 2 * HD * KT * 2 + 1024; /* queries, the stages of keys and values, alignment */
    if (CUDA_CHECK(c, cudaFuncSetAttribute(k_flash_sm90<HD, NWG, MINB, TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           smem)) != 0)
        return;
    const unsigned groups = (unsigned)(a->n_head / a->n_kv_head / NWG);
    k_flash_sm90<HD, NWG, MINB, TMA><<<dim3((unsigned)a->n_tiles, (unsigned)a->n_kv_head * groups),
                                       NWG * 128 + (TMA ? 128 : 0), smem, c->stream>>>(*a, *m);
    CUDA_LAUNCHED(c);
}

bool cuda_flash_sm90_init(struct cuda_backend *c)
{
    cudaDriverEntryPointQueryResult q;
    return cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &c->tma_encode, 12000, cudaEnableDefault, &q) ==
               cudaSuccess &&
           q == cudaDriverEntryPointSuccess;
}

int cuda_tma_map(const struct cuda_backend *c, CUtensorMap *m, const void *base, int rank, const uint64_t *dims,
                 const uint64_t *strides, const uint32_t *box)
{
    const PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)c->tma_encode;
    const cuuint32_t es[3] = {1, 1, 1};
    assert(rank == 2 || rank == 3);
    return encode && encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)base, (const cuuint64_t *)dims,
                            (const cuuint64_t *)strides, (const cuuint32_t *)box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

/* the tensor maps of a's copies at head dim hd; false where the driver has
 * no encoder or refuses */
static bool fw_maps_make(const struct cuda_backend *c, struct fw_maps *m, const struct flash_sm90_args *a, int32_t hd)
{
    const uint64_t T = (uint64_t)a->kv_total, H = (uint64_t)hd, NKV = (uint64_t)a->n_kv_head;
    const uint64_t kd[3] = {H, T, NKV}, ks[2] = {H * 2, T * H * 2}, vd[3] = {T, H, NKV}, vs[2] = {T * 2, H * T * 2};
    const uint32_t kb[3] = {64, 128, 1}, vb[3] = {64, (uint32_t)hd, 1};
    return cuda_tma_map(c, &m->k, a->kb, 3, kd, ks, kb) == 0 && cuda_tma_map(c, &m->v, a->vt, 3, vd, vs, vb) == 0;
}

bool cuda_flash_sm90_fits(const struct cuda_backend *c, int32_t head_dim)
{
    return c->wgmma && !c->precise && (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

void cuda_flash_sm90(struct cuda_backend *c, const struct flash_sm90_args *a, int32_t head_dim)
{
    assert(cuda_flash_sm90_fits(c, head_dim));
    /* Two heads a block where the group allows (they share the key and
     * value tiles). Head dim 128: with a producer warpgroup and tiles of 128
     * keys, one block an SM (225 KB of shared memory, 232 registers a
     * consumer thread): qwen3-8b's 16k prefill 7% faster, 32k 10%, than the
     * form below; without tensor maps, two blocks an SM of
     * 64-key tiles (128 registers, a few bytes spilled). Otherwise one head
     * a block, without spilling. Head dim 256: 128 accumulators a thread
     * for O alone and 197 KB of shared memory for two heads, so one block
     * an SM */
    const bool pairs = a->n_head / a->n_kv_head % 2 == 0;
    struct fw_maps m = {};
    if (head_dim == 64)
        pairs ? flash_sm90_run<64, 2, 2>(c, a, &m) : flash_sm90_run<64, 1, 4>(c, a, &m);
    else if (head_dim == 128 && pairs && fw_maps_make(c, &m, a, head_dim))
        flash_sm90_run<128, 2, 1, true>(c, a, &m);
    else if (head_dim == 128)
        pairs ? flash_sm90_run<128, 2, 2>(c, a, &m) : flash_sm90_run<128, 1, 3>(c, a, &m);
    else
        pairs ? flash_sm90_run<256, 2, 1>(c, a, &m) : flash_sm90_run<256, 1, 1>(c, a, &m);
}
