/* Instruction-set paths: which ones this CPU can run, and the per-function
 * target attributes of the SIMD kernels. The active path is llb_isa_current
 * (core/state.h). */
#ifndef LLB_ISA_H
#define LLB_ISA_H

enum llb_isa { LLB_ISA_SCALAR = 0, LLB_ISA_AVX2 = 1, LLB_ISA_AVX512 = 2 };

int llb_isa_best(void);               /* best path this CPU supports */
int llb_isa_supported(int isa);       /* 1 if the CPU (and OS) can run that path */
const char *llb_isa_name(int isa);

/* 1 where the AVX-512 32-block GEMM runs its AMD-tuned tiles: each activation broadcast its own instruction,
 * chains and float sums held in registers (Zen 4: 6-16% less time); 0 on Intel, whose tiles fold the
 * broadcasts into the multiplies as {1toN} operands, as they were tuned there. The broadcast form itself runs
 * at the same rate on both (bench/broadcast_forms.c); the code around it differs. LLAMBDA_SPLIT_BROADCAST=1/0
 * forces either. */
int llb_isa_split_broadcast(void);

/* 1 where a GEMV streams its weights the Zen 4 way (LLB_FAR_STREAM_OF in the kernels' common.h: most types
 * with no software prefetch, the rest into L2 only, far ahead; decode attention's short K/V rows the latter
 * way): AMD's cores, not Intel's (tuned there on L2 + L1 prefetch). LLAMBDA_FAR_STREAM=1/0 forces it. */
int llb_isa_far_stream(void);

/* Per-function ISA targets, so every file is compiled with portable flags. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LLB_X86 1
#define LLB_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LLB_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")))
#else
#define LLB_X86 0
#endif

#endif
