/* sm90: Hopper's asynchronous machinery for the kernels built for sm_90a
 * (flash_sm90.cu, moe_gemm.cu): warpgroup products (wgmma) on operands in
 * shared memory in the 128-byte-swizzled K-major layout of the PTX ISA's
 * matrix descriptors, mbarriers, and TMA copies by tensor maps whose
 * 128-byte swizzle is that layout.
 *
 * Layout: rows of 64 bf16 (128 bytes), 8-row atoms of 1024 bytes, the
 * 16-byte chunk c of row r stored at chunk c ^ (r % 8); a k16 step inside a
 * row is the descriptor's start address plus 32 bytes. Tiles start
 * 1024-aligned (the swizzle is of address bits).
 *
 * A wgmma accumulator of 64 rows: warp w of the warpgroup holds rows
 * 16w + g and 16w + g + 8 (g = lane / 4), d[j] columns 8j + 2 (lane % 4)
 * and + 1, as mma.sync's accumulators. */
#ifndef KAPITSA_CUDA_SM90_H
#define KAPITSA_CUDA_SM90_H

#include "cuda_impl.h"

#include <cudaTypedefs.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FW_WGMMA 1
#else
#define FW_WGMMA 0
#endif

/* A 2-D (rank 2) or 3-D tensor map of bf16 elements over base: dims[0]
 * contiguous, strides[i] bytes between steps of dims[i + 1], boxes of
 * box[] elements, 128-byte swizzle, zeros outside dims. 0, or -1 where the
 * driver has no encoder (c->tma_encode) or refuses. */
int cuda_tma_map(const struct cuda_backend *c, CUtensorMap *m, const void *base, int rank, const uint64_t *dims,
                 const uint64_t *strides, const uint32_t *box);

#if FW_WGMMA
/* byte offset of bf16 element k (< 64) of row r in a swizzled tile of 128-byte rows */
static __device__ __forceinline__ uint32_t wg_swz(int r, int k)
{
    return (uint32_t)(r * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2);
}

/* descriptor of a K-major, 128-byte-swizzled operand at shared address s:
 * 8-row atoms 1024 bytes apart (the leading offset is unused in this mode) */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t s)
{
    return (uint64_t)((s & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

static __device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_wait_all(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* all but the most recent group */
static __device__ __forceinline__ void wg_wait_one(void) { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

/* a wgmma accumulator's registers as asm operands: row j of d[][4], or its first 8 or 16 rows */
#define FW_ACC1(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define FW_ACC8(d)                                                                                             \
    FW_ACC1(d, 0), FW_ACC1(d, 1), FW_ACC1(d, 2), FW_ACC1(d, 3), FW_ACC1(d, 4), FW_ACC1(d, 5), FW_ACC1(d, 6),   \
        FW_ACC1(d, 7)
#define FW_ACC16(d)                                                                                            \
    FW_ACC8(d), FW_ACC1(d, 8), FW_ACC1(d, 9), FW_ACC1(d, 10), FW_ACC1(d, 11), FW_ACC1(d, 12), FW_ACC1(d, 13),  \
        FW_ACC1(d, 14), FW_ACC1(d, 15)

/* keeps the compiler from touching accumulators across an asynchronous product */
template <int N> static __device__ __forceinline__ void wg_pin(float (*d)[4])
{
#pragma unroll
    for (int j = 0; j < N; j++)
        asm volatile("" : FW_ACC1(d, j)::"memory");
}
/* shared memory written by the threads (generic proxy) is read by wgmma (async proxy) after the next barrier */
static __device__ __forceinline__ void fence_async_shared(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* d (= or +=, acc) A B: A [64][16] and B [64][16] K-major in shared memory */
static __device__ __forceinline__ void wg_ss_n64(float (*d)[4], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : FW_ACC8(d)
                 : "l"(da), "l"(db), "r"(acc));
}

/* d (= or +=, acc) A B: A [64][16] and B [128][16] K-major in shared memory */
static __device__ __forceinline__ void wg_ss_n128(float (*d)[4], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : FW_ACC16(d)
                 : "l"(da), "l"(db), "r"(acc));
}

/* d += A B: A [64][16] in registers (mma.sync's row-operand layout per warp), B [64][16] K-major in shared memory */
static __device__ __forceinline__ void wg_rs_n64(float (*d)[4], const uint32_t *a, uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : FW_ACC8(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* d += A B: A [64][16] in registers (mma.sync's row-operand layout per warp), B [128][16] K-major in shared memory */
static __device__ __forceinline__ void wg_rs_n128(float (*d)[4], const uint32_t *a, uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                 : FW_ACC16(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

static __device__ __forceinline__ void mbar_init(uint64_t *b, unsigned n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(n));
}
static __device__ __forceinline__ void mbar_expect(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)),
                 "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    asm volatile("{\n .reg .pred p;\n W_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W_%=;\n}\n" ::"r"(
                     (unsigned)__cvta_generic_to_shared(b)),
                 "r"(parity)
                 : "memory");
}
/* a ring of n stages handed from one TMA producer to consumer warps: full[i]
 * completes with the producer's arrival and its copies' bytes, empty[i]
 * with an arrival from each of the `consumers` warps done with the stage.
 * One thread calls it, before the block's first barrier. */
static __device__ __forceinline__ void mbar_ring_init(uint64_t *full, uint64_t *empty, int n, unsigned consumers)
{
    for (int i = 0; i < n; i++) {
        mbar_init(&full[i], 1);
        mbar_init(&empty[i], consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/* a box of map m at coordinates (x, y, z) into shared memory at dst, completing on mbarrier bar */
static __device__ __forceinline__ void tma3(uint32_t dst, const CUtensorMap *m, int x, int y, int z, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
                 "l"((uint64_t)m), "r"(x), "r"(y), "r"(z), "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}

/* d (= or +=, acc) A B: A [64][16] and B [256][16] K-major in shared memory */
static __device__ __forceinline__ void wg_ss_n256(float (*d)[4], uint64_t da, uint64_t db, int acc)
{
    float(*e)[4] = d + 16;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : FW_ACC16(d), FW_ACC16(e)
                 : "l"(da), "l"(db), "r"(acc));
}

/* a box of 2-D map m at coordinates (x, y) into shared memory at dst, completing on mbarrier bar */
static __device__ __forceinline__ void tma2(uint32_t dst, const CUtensorMap *m, int x, int y, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"((uint64_t)m), "r"(x), "r"(y), "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}
#endif

#endif
