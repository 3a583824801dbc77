/* Process-wide switches, owned by the core: the Python bindings set them, the
 * matmul and op drivers and kernels read them. Nothing outside core/ defines
 * global state. */
#ifndef LLB_STATE_H
#define LLB_STATE_H

/* The active SIMD path (enum llb_isa, core/isa.h). Chosen at import from CPUID,
 * or forced with LLAMBDA_ISA=scalar|avx2|avx512 or _native.set_isa(). Drivers
 * read it once per op, so a switch never mixes two paths within one op. */
extern int llb_isa_current;

/* When set (the server), a row's result must never depend on how many rows share
 * the call, the thread count, or how a prompt was chunked (batched serving then
 * equals one-at-a-time serving bit for bit). Matmul kernels (matmul/kernels/kernels.h)
 * and attention (ops/attention.c) read it. */
extern int llb_batch_invariant;

/* Called once at import: reads LLAMBDA_ISA / CPUID, creates the 1-thread pool. 0 on success. */
int llb_core_init(void);

#endif
