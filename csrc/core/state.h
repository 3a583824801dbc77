/* Process-wide switches, owned by the core: the Python bindings set them, the
 * matmul and op drivers and kernels read them. Nothing outside core/ defines
 * global state. */
#ifndef LLB_STATE_H
#define LLB_STATE_H

#include "core/isa.h"

/* The active SIMD path (enum llb_isa, core/isa.h). Chosen at import from CPUID,
 * or forced with LLAMBDA_ISA=scalar|avx2|avx512 or _native.set_isa(). Drivers
 * read it once per op, so a switch never mixes two paths within one op. */
extern int llb_isa_current;

/* The one of three per-ISA things (kernel tables, functions) the active path uses; a build for
 * another architecture has only the scalar one, and never names the others. */
#if LLB_X86
#define LLB_PER_ISA(scalar, avx2, avx512) \
    (llb_isa_current == LLB_ISA_AVX512 ? (avx512) : llb_isa_current == LLB_ISA_AVX2 ? (avx2) : (scalar))
#else
#define LLB_PER_ISA(scalar, avx2, avx512) (scalar)
#endif

/* When set (the server), a row's result must never depend on how many rows share
 * the call, the thread count, or how a prompt was chunked (batched serving then
 * equals one-at-a-time serving bit for bit). Matmul kernels (matmul/kernels/kernels.h)
 * and attention (ops/attention.c) read it. */
extern int llb_batch_invariant;

/* Called once at import: reads LLAMBDA_ISA / CPUID, creates the 1-thread pool. 0 on success. */
int llb_core_init(void);

#endif
