/* Memory the core owns. The C core allocates only through these, so the
 * counters prove that a decode step allocates nothing once warmed up. */
#ifndef LLB_CORE_H
#define LLB_CORE_H
#include <stddef.h>

/* 64-byte aligned allocation, counted. */
void *llb_alloc(size_t nbytes);
void llb_free(void *p);
/* A shared scratch buffer of at least nbytes, 64-byte aligned, valid until the
 * next llb_scratch call (ops run one at a time; workers of the same op may share it
 * by offsets). Grows (a counted allocation) only when asked for more than before.
 * Returns NULL on allocation failure. */
void *llb_scratch(size_t nbytes);
/* Number of allocations and bytes ever made through llb_alloc/llb_scratch. */
void llb_alloc_stats(size_t *count, size_t *bytes);

#endif
