#define _GNU_SOURCE
#include "core/pages.h"

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 (older headers lack the names) */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* madvise over [p, p + n) widened to whole pages: 0 done, 1 EINVAL (an advice this kernel lacks), -1 refused. */
static int advise_pages(const void *p, size_t n, int advice) {
    if (n == 0) return 0;
    const long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    const uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    if (madvise((void *)lo, hi - lo, advice) == 0) return 0;
    return errno == EINVAL ? 1 : -1;
}

int llb_pages_populate(const void *p, size_t n) {
    const int rc = advise_pages(p, n, MADV_POPULATE_READ);
    return rc == 1 ? (advise_pages(p, n, MADV_WILLNEED) == 0 ? 1 : -1) : rc;
}

int llb_pages_populate_write(void *p, size_t n) { return advise_pages(p, n, MADV_POPULATE_WRITE); }
