/* bench_sampler: the host sampler's cost per token over a 151,936-token row
 * (Qwen's vocabulary), for the settings agents send, on two kinds of rows:
 * "peaked" (a bulk around -2 with sd 2.5 and 20 tokens at 10..19.5, like a
 * model's logits) and "flat" (sd 3: nothing cut, the worst case). Best of 5
 * passes of 40 draws each.
 *
 *   cc -O2 -std=c11 -I src/engine tools/bench_sampler.c src/engine/sampler.c src/base/err.c -lm -o /tmp/bs
 *
 * Build it again against another revision's sampler.c (git show REV:src/engine/sampler.c
 * into a folder with the headers) to compare the two side by side. */
#define _POSIX_C_SOURCE 199309L
#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double gauss(uint64_t *r)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        *r = *r * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = ((double)(*r >> 11) + 1.0) * 0x1.0p-53;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

int main(void)
{
    enum { V = 151936 };
    static float peaked[V], flat[V];
    uint64_t r = 1;
    for (int i = 0; i < V; i++) {
        flat[i] = (float)(3 * gauss(&r));
        peaked[i] = (float)(-2 + 2.5 * gauss(&r));
    }
    for (int i = 0; i < 20; i++)
        peaked[(i * 7919) % V] = 10.0f + (float)i * 0.5f;
    const struct {
        float t, top_p;
        int32_t top_k;
        const char *name;
    } cfg[] = {{1.0f, 1.0f, 0, "temperature 1"},
               {0.7f, 0.95f, 0, "temperature 0.7, top_p 0.95"},
               {0.6f, 0.95f, 20, "temperature 0.6, top_p 0.95, top_k 20 (Qwen3)"}};
    const float *rows[2] = {peaked, flat};
    const char *row_name[2] = {"peaked", "flat"};
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            struct sampler_params p = sampler_defaults();
            p.temperature = cfg[c].t;
            p.top_p = cfg[c].top_p;
            p.top_k = cfg[c].top_k;
            struct sampler s;
            if (sampler_init(&s, &p, V) != 0)
                return 1;
            double best = 1e9;
            long sum = 0;
            for (int rep = 0; rep < 5; rep++) {
                const double t0 = now_s();
                for (int i = 0; i < 40; i++)
                    sum += sampler_sample(&s, rows[d], NULL, 0);
                const double t = (now_s() - t0) / 40;
                best = t < best ? t : best;
            }
            printf("%-6s | %-46s | %.3f ms/token (checksum %ld)\n", row_name[d], cfg[c].name, best * 1e3, sum % 1000);
            sampler_free(&s);
        }
    return 0;
}
