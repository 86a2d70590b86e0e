/* device: backend selection (see device.h). */
#include "device.h"

#include "../base/err.h"
#include "cpu/cpu.h"
#include "profile.h"
#ifdef KAPITSA_CUDA
#include "cuda/cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

bool device_has_cuda(void)
{
#ifdef KAPITSA_CUDA
    return true;
#else
    return false;
#endif
}

int32_t device_n_gpus(void)
{
#ifdef KAPITSA_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

int device_gpu_query(int32_t i, struct device_info *info)
{
#ifdef KAPITSA_CUDA
    return cuda_device_query(i, info);
#else
    (void)info;
    return err_set("device: no GPU %d: this kapitsa was built without CUDA", (int)i);
#endif
}

static struct backend *cpu_open(int32_t n_threads, bool precise)
{
    struct backend *be = cpu_backend_init(n_threads, NULL);
    if (be)
        cpu_backend_set_precise(be, precise);
    return be;
}

static struct backend *open_named(const char *name, int32_t n_threads, bool precise)
{
    if (!name || !*name)
        name = getenv("KAPITSA_DEVICE");
    if (!name || !*name)
        name = "auto";
    if (strcmp(name, "cpu") == 0)
        return cpu_open(n_threads, precise);
    const bool is_auto = strcmp(name, "auto") == 0;
    if (!is_auto && strncmp(name, "cuda", 4) != 0) {
        err_set("device: unknown device '%s' (cpu, cuda, cuda:N or auto)", name);
        return NULL;
    }
#ifdef KAPITSA_CUDA
    int32_t dev = 0;
    if (!is_auto && name[4]) {
        char *end;
        long v = name[4] == ':' ? strtol(name + 5, &end, 10) : -1;
        if (v < 0 || name[5] == 0 || *end) {
            err_set("device: '%s' is not cuda or cuda:N", name);
            return NULL;
        }
        dev = (int32_t)v;
    }
    if (!is_auto || cuda_device_count() > 0)
        return cuda_backend_init(dev, precise);
#else
    if (!is_auto) {
        err_set("device: this kapitsa was built without CUDA (rebuild with nvcc on the PATH, or make CUDA=1)");
        return NULL;
    }
#endif
    return cpu_open(n_threads, precise);
}

struct backend *device_open(const char *name, int32_t n_threads, bool precise)
{
    const char *pr = getenv("KAPITSA_PRECISION");
    precise = precise || (pr && strcmp(pr, "exact") == 0);
    struct backend *be = open_named(name, n_threads, precise);
    const char *prof = getenv("KAPITSA_PROFILE");
    return be && prof && *prof && *prof != '0' ? profile_wrap(be) : be;
}
