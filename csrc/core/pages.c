#define _GNU_SOURCE
#include "core/pages.h"

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 (older headers lack the name) */
#endif

int llb_pages_populate(const void *p, size_t n) {
    if (n == 0) return 0;
    const long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    const uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    if (madvise((void *)lo, hi - lo, MADV_POPULATE_READ) == 0) return 0;
    if (errno != EINVAL) return -1;
    return madvise((void *)lo, hi - lo, MADV_WILLNEED) == 0 ? 1 : -1;
}
