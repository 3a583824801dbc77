/* Counted aligned allocations and per-thread scratch. */
#include "core/alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

static atomic_size_t alloc_count, alloc_bytes;

void *llb_alloc(size_t nbytes) {
    if (nbytes == 0) nbytes = 1;
    if (nbytes > SIZE_MAX - 63) return NULL;
    size_t rounded = (nbytes + 63) & ~(size_t)63; /* aligned_alloc wants a multiple of the alignment */
    void *p = aligned_alloc(64, rounded);
    if (p) {
        atomic_fetch_add(&alloc_count, 1);
        atomic_fetch_add(&alloc_bytes, rounded);
    }
    return p;
}

void llb_free(void *p) { free(p); }

void llb_alloc_stats(size_t *count, size_t *bytes) {
    *count = atomic_load(&alloc_count);
    *bytes = atomic_load(&alloc_bytes);
}

/* Scratch is per calling thread, so two Python threads running ops at once
 * never share it; the workers of one op reach it through the op's context.
 * A thread's buffer is freed when the thread exits. */
struct scratch {
    void *p;
    size_t size;
};
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *arg) {
    struct scratch *s = arg;
    llb_free(s->p);
    free(s);
}
static void scratch_key_create(void) { pthread_key_create(&scratch_key, scratch_destroy); }

void *llb_scratch(size_t nbytes) {
    pthread_once(&scratch_once, scratch_key_create);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (nbytes > s->size) {
        void *p = llb_alloc(nbytes);
        if (!p) return NULL;
        llb_free(s->p);
        s->p = p;
        s->size = nbytes;
    }
    return s->p;
}
