/* ktrace: a kernel timeline of a CUDA program, for machines with Nsight
 * Compute but not Nsight Systems (the H200 machine: ncu replays kernels one
 * at a time, so it cannot show how a decode step's kernels overlap as
 * programmatic dependents or how long the GPU waits between them).
 *
 * An injection library: the CUDA driver loads it at cuInit when
 * CUDA_INJECTION64_PATH names it and calls InitializeInjection. It asks
 * CUPTI's activity API for concurrent-kernel records (they keep kernels'
 * concurrency; kernels replayed from CUDA graphs included) and writes one
 * CSV line per kernel as CUPTI hands the records over, to KTRACE_OUT
 * (default ktrace.csv): start and end in ns, grid, block, graph id (0 when
 * launched directly), name. Copies come as lines whose grid is "copy"
 * (name: direction and bytes). With KTRACE_API=1 the host's runtime and
 * driver API calls come too, grid "api" (name: the call), on the same
 * clock: they show what the host did while the GPU waited.
 * tools/device/ktrace_sum.py reads it back.
 *
 *   L=$(dirname $(find /usr/local/cuda/ -name 'libcupti.so' | head -1))
 *   gcc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include tools/device/ktrace.c \
 *       -o /tmp/ktrace.so -L$L -Wl,-rpath,$L -lcupti
 *   KTRACE_OUT=/tmp/k.csv CUDA_INJECTION64_PATH=/tmp/ktrace.so build/kapitsa bench ...
 *   python3 tools/device/ktrace_sum.py /tmp/k.csv --lines
 * (libcupti sits in lib64 or extras/CUPTI/lib64, by install.)
 */
#include <cupti.h>

#include <stdio.h>
#include <stdlib.h>

#define KT_BUF (8u << 20)

static FILE *kt_out;

static void CUPTIAPI kt_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, KT_BUF);
    *size = *buffer ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI kt_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME || rec->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
            const char *name = NULL;
            cuptiGetCallbackName(rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                          : CUPTI_CB_DOMAIN_DRIVER_API,
                                 a->cbid, &name);
            fprintf(kt_out, "%llu,%llu,api,-,0,\"%s\"\n", (unsigned long long)a->start, (unsigned long long)a->end,
                    name ? name : "?");
            continue;
        }
        if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
            const char *dir = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                              : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                                                                               : "other";
            fprintf(kt_out, "%llu,%llu,copy,-,%u,\"memcpy %s %llu B\"\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->graphId, dir, (unsigned long long)m->bytes);
            continue;
        }
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(kt_out, "%llu,%llu,%d.%d.%d,%d.%d.%d,%u,\"%s\"\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ,
                k->graphId, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped > 0)
        fprintf(stderr, "ktrace: %zu records dropped\n", dropped);
    free(buffer);
}

static void kt_end(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    fclose(kt_out);
}

int InitializeInjection(void)
{
    const char *path = getenv("KTRACE_OUT");
    kt_out = fopen(path ? path : "ktrace.csv", "w");
    if (!kt_out) {
        perror("ktrace: KTRACE_OUT");
        return 0;
    }
    fprintf(kt_out, "start_ns,end_ns,grid,block,graph,name\n");
    const char *api = getenv("KTRACE_API");
    if (cuptiActivityRegisterCallbacks(kt_requested, kt_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        (api && atoi(api) > 0 &&
         (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
          cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS))) {
        fprintf(stderr, "ktrace: CUPTI refused the activity records\n");
        fclose(kt_out);
        return 0;
    }
    atexit(kt_end);
    return 1;
}
