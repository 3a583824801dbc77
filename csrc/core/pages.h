/* Mapped memory paged in ahead of its use: a model file's pages read by a thread of their own while
 * the loader packs what came before, so a cold load reads the disk and packs at the same time. */
#ifndef LLB_PAGES_H
#define LLB_PAGES_H
#include <stddef.h>

/* Fault the pages under [p, p + n) of a mapping in for reading (widened to whole pages), waiting
 * for the reads: 0 when they are in, 1 when this kernel (before Linux 5.14) could only be asked to
 * read them ahead asynchronously, -1 when it refused (a range not mapped, an I/O error). Reading
 * never faults the caller: a truncated file's pages are an error here, not a SIGBUS. */
int llb_pages_populate(const void *p, size_t n);

/* Fault the pages under [p, p + n) of a private anonymous mapping in for writing (zero-filled, widened
 * to whole pages), so that whoever writes them next takes no page fault: a load's packed-weight arena
 * faulted in on a thread of its own ahead of the packing. 0 when they are in, 1 when this kernel
 * (before Linux 5.14) cannot (the writer then faults them itself), -1 when it refused (out of memory,
 * a range not mapped). */
int llb_pages_populate_write(void *p, size_t n);

#endif
