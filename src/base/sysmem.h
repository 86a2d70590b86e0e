/* sysmem: how much memory this process can still take, from /proc/meminfo
 * and the cgroup (v2) it runs in, for the commands that size large
 * allocations (serve's KV cache) and those that report the machine (doctor). */
#ifndef KP_SYSMEM_H
#define KP_SYSMEM_H

#include <stdint.h>

/* A /proc/meminfo field ("MemTotal", "MemAvailable") in bytes; -1 when absent. */
int64_t sysmem_meminfo(const char *key);
/* Bytes a new allocation can take without swapping or the OOM killer:
 * MemAvailable, or less where the process's cgroup limits it
 * (memory.max - memory.current); -1 when unknown. */
int64_t sysmem_available(void);
/* This process's resident bytes (VmRSS); -1 when unknown. */
int64_t sysmem_resident(void);

#endif
