/* Memory the core owns. The C core allocates only through these, so the
 * counters prove that a decode step allocates nothing once warmed up. */
#ifndef LLB_CORE_H
#define LLB_CORE_H
#include <stddef.h>

/* 64-byte aligned allocation, counted. */
void *llb_alloc(size_t nbytes);
void llb_free(void *p);
/* The calling thread's scratch buffer of at least nbytes, 64-byte aligned, valid until
 * that thread's next llb_scratch call (two threads running ops at once have their own;
 * the pool workers of one op may share the caller's by offsets). Grows (a counted
 * allocation) only when asked for more than before.
 * Returns NULL on allocation failure. */
void *llb_scratch(size_t nbytes);
/* Number of allocations and bytes ever made through llb_alloc/llb_scratch. */
void llb_alloc_stats(size_t *count, size_t *bytes);

#endif
