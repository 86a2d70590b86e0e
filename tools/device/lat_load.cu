/* lat_load: how much slower a latency-bound chain of memory round trips runs
 * while the rest of the GPU streams weights, by the streaming rate. A decode
 * step's attention is such a chain (prep, attention, merge: a few dependent
 * trips each, about 10 us a layer on an H100) and no weights move during it;
 * a step that streamed the next product's weights meanwhile (a persistent
 * kernel's ring, an L2 prefetch) would hide it only if the trips did not slow
 * by as much as the stream saves. Five L2 prefetches lost in the engine
 * (BENCHMARKS.md's index for #8), without saying by how much attention slowed.
 *
 * A streamer (one block an SM, held there by its shared memory, on all but
 * FREE SMs) reads a buffer many times the L2, sleeping a set time after each
 * 64 KB a block to lower its rate; beside it, on the free SMs:
 *   chase: a warp whose lanes each follow a random cycle through a 512 MB
 *          buffer, one 8-byte load at a time (a round trip's latency);
 *   burst: FREE blocks of 256 threads, each round loading a 16 KB tile at
 *          once and picking the next tile from its values (a trip with a
 *          tile's loads in flight, attention's shape).
 * The chaser waits 20 us for the stream to ramp, then times its rounds; the
 * streamer counts its bytes only within that window, which gives the rate.
 * A run without the streamer is the idle latency.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/lat_load.cu -o /tmp/lat_load && /tmp/lat_load */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define TOOL "lat_load"
#include "tool.cuh"

#define FREE 4                    /* SMs left to the chaser */
#define ST_THREADS 512
#define ST_LOADS 8                /* a streamer thread's loads in flight */
#define ST_SMEM (160 * 1024)      /* one streamer block an SM */
#define CHASE_STEPS 2000
#define BURST_ROUNDS 400
#define TILE_BYTES (16 * 1024)
#define SLOT 256                  /* a chase element's bytes: one element a segment */
#define LIMIT_NS 400000000ull     /* the streamer stops by itself after 0.4 s */

struct flags {
    unsigned measure; /* 0 ramping, 1 measuring, 2 done */
    unsigned n_done;  /* the chaser's blocks finished */
    unsigned long long bytes; /* streamed while measuring */
    unsigned long long t0, t1; /* the chaser's window (globaltimer ns) */
};

static __device__ __forceinline__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ unsigned ld_flag(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* each thread ST_LOADS loads of 16 bytes a round (64 KB a block),
 * grid-strided, wrapping; a warp's lane 0 reads the flag every 8 rounds */
__global__ void __launch_bounds__(ST_THREADS, 1) k_stream(const uint4 *p, size_t n, unsigned sleep_ns, flags *f,
                                                          unsigned *sink)
{
    extern __shared__ uint4 hold[]; /* only occupies the SM */
    const int lane = threadIdx.x & 31;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0, state = 0;
    unsigned long long counted = 0;
    const unsigned long long start = now_ns();
    for (unsigned r = 0;; r++) {
        uint4 v[ST_LOADS];
#pragma unroll
        for (int u = 0; u < ST_LOADS; u++) {
            size_t j = i + u * stride;
            if (j >= n)
                j -= n;
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                         : "l"(p + j));
        }
#pragma unroll
        for (int u = 0; u < ST_LOADS; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        i += ST_LOADS * stride;
        if (i >= n)
            i -= n;
        if (state == 1)
            counted += 16 * ST_LOADS;
        if ((r & 7) == 0) {
            unsigned s = lane == 0 ? ld_flag(&f->measure) : 0;
            s = __shfl_sync(0xffffffffu, s, 0);
            if (s == 2 || now_ns() - start > LIMIT_NS)
                break;
            state = s;
        }
        if (sleep_ns)
            __nanosleep(sleep_ns);
    }
    atomicAdd(&f->bytes, counted);
    if (acc == 0x9e3779b9u)
        *sink = acc + hold[0].x;
}

/* the chaser's window: every block waits out the stream's ramp, block 0
 * opens the window, the last block to finish closes it (thread 0 of each) */
static __device__ void window_open(flags *f, bool stream)
{
    if (threadIdx.x != 0)
        return;
    if (stream) {
        const unsigned long long t = now_ns();
        while (now_ns() - t < 20000)
            ;
    }
    if (blockIdx.x == 0) {
        f->t0 = now_ns();
        asm volatile("st.relaxed.gpu.global.u32 [%0], 1;" ::"l"(&f->measure) : "memory");
    }
}

static __device__ void window_close(flags *f)
{
    if (threadIdx.x == 0 && atomicAdd(&f->n_done, 1u) == gridDim.x - 1) {
        f->t1 = now_ns();
        asm volatile("st.relaxed.gpu.global.u32 [%0], 2;" ::"l"(&f->measure) : "memory");
    }
}

/* one warp; a lane's cycle starts at its own element; ns a step into out */
__global__ void k_chase(const unsigned long long *c, bool stream, flags *f, double *out, unsigned *sink)
{
    window_open(f, stream);
    __syncwarp();
    unsigned long long idx = threadIdx.x;
    const unsigned long long t = now_ns();
    for (int s = 0; s < CHASE_STEPS; s++)
        asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(idx) : "l"(c + idx * (SLOT / 8)) : "memory");
    const unsigned long long e = now_ns();
    __syncwarp();
    window_close(f);
    if (threadIdx.x == 0)
        out[0] = (double)(e - t) / CHASE_STEPS;
    if (idx == ~0ull)
        *sink = (unsigned)idx;
}

/* a block's round: 16 KB at tile `tile` (every thread 4 x 16 bytes in
 * flight), then the next tile from the loaded words */
__global__ void __launch_bounds__(256) k_burst(const uint4 *c, size_t n_tiles, bool stream, flags *f, double *out,
                                               unsigned *sink)
{
    __shared__ unsigned mix[8];
    window_open(f, stream);
    __syncthreads();
    size_t tile = (size_t)blockIdx.x * 7919 % n_tiles;
    const unsigned long long t = now_ns();
    unsigned acc = 0;
    for (int r = 0; r < BURST_ROUNDS; r++) {
        const uint4 *q = c + tile * (TILE_BYTES / 16);
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                         : "l"(q + u * 256 + threadIdx.x)
                         : "memory");
        unsigned x = 0;
#pragma unroll
        for (int u = 0; u < 4; u++)
            x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        for (int o = 16; o > 0; o >>= 1)
            x ^= __shfl_xor_sync(0xffffffffu, x, o);
        if ((threadIdx.x & 31) == 0)
            mix[threadIdx.x >> 5] = x;
        __syncthreads();
        x = 0;
        for (int w = 0; w < 8; w++)
            x ^= mix[w];
        acc += x;
        tile = (tile * 2654435761ull + x + 1) % n_tiles;
        __syncthreads(); /* mix's readers, before the next round writes it */
    }
    const unsigned long long e = now_ns();
    __syncthreads();
    window_close(f);
    if (threadIdx.x == 0)
        out[blockIdx.x] = (double)(e - t) / BURST_ROUNDS;
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

int main()
{
    int n_sm = 0;
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs, L2 %d MB\n", prop.name, n_sm, prop.l2CacheSize >> 20);

    const size_t st_bytes = (size_t)4 << 30, c_bytes = (size_t)512 << 20;
    const size_t n_slot = c_bytes / SLOT;
    uint4 *st;
    unsigned long long *c;
    CHECK(cudaMalloc(&st, st_bytes));
    CHECK(cudaMemset(st, 1, st_bytes));
    CHECK(cudaMalloc(&c, c_bytes));
    /* one random cycle through every slot: slot i's first word is the next slot */
    {
        std::vector<unsigned long long> perm(n_slot), h(c_bytes / 8, 0);
        for (size_t i = 0; i < n_slot; i++)
            perm[i] = i;
        uint64_t s = 88172645463325252ull;
        for (size_t i = n_slot - 1; i > 0; i--) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            const size_t j = s % (i + 1);
            const unsigned long long t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (size_t i = 0; i < n_slot; i++)
            h[perm[i] * (SLOT / 8)] = perm[(i + 1) % n_slot];
        CHECK(cudaMemcpy(c, h.data(), c_bytes, cudaMemcpyHostToDevice));
    }
    flags *f;
    double *out;
    unsigned *sink;
    CHECK(cudaMalloc(&f, sizeof(flags)));
    CHECK(cudaMalloc(&out, 64 * sizeof(double)));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaFuncSetAttribute(k_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, ST_SMEM));
    cudaStream_t s_st, s_ch;
    CHECK(cudaStreamCreateWithFlags(&s_st, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s_ch, cudaStreamNonBlocking));

    /* sleep after each 64 KB a block: -1 no streamer */
    const int sleeps[] = {-1, 0, 100, 200, 400, 800, 1600, 3200, 6400};
    printf("%-12s %10s %14s %18s\n", "sleep ns", "stream TB/s", "chase ns/trip", "burst us/16 KB trip");
    for (int rep = 0; rep < 2; rep++)
        for (int sl : sleeps) {
            double res[2] = {0.0, 0.0}, rate[2] = {0.0, 0.0};
            for (int mode = 0; mode < 2; mode++) {
                CHECK(cudaMemset(f, 0, sizeof(flags)));
                CHECK(cudaDeviceSynchronize());
                const bool stream = sl >= 0;
                if (stream)
                    k_stream<<<n_sm - FREE, ST_THREADS, ST_SMEM, s_st>>>(st, st_bytes / 16, (unsigned)sl, f, sink);
                if (mode == 0)
                    k_chase<<<1, 32, 0, s_ch>>>(c, stream, f, out, sink);
                else
                    k_burst<<<FREE, 256, 0, s_ch>>>((const uint4 *)c, c_bytes / TILE_BYTES, stream, f, out, sink);
                CHECK(cudaDeviceSynchronize());
                CHECK(cudaGetLastError());
                flags hf;
                double ho[FREE];
                CHECK(cudaMemcpy(&hf, f, sizeof hf, cudaMemcpyDeviceToHost));
                CHECK(cudaMemcpy(ho, out, sizeof ho, cudaMemcpyDeviceToHost));
                double v = ho[0];
                if (mode == 1) {
                    for (int b = 1; b < FREE; b++)
                        v += ho[b];
                    v /= FREE * 1000.0;
                }
                res[mode] = v;
                rate[mode] = hf.t1 > hf.t0 ? (double)hf.bytes / (double)(hf.t1 - hf.t0) / 1000.0 : 0.0;
            }
            char name[16] = "no stream";
            if (sl >= 0)
                snprintf(name, sizeof name, "%d", sl);
            printf("%-12s %5.2f/%5.2f %14.0f %18.2f\n", name, rate[0], rate[1], res[0], res[1]);
        }
    return 0;
}
