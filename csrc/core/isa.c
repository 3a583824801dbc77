/* Which SIMD path this CPU (and OS) can run.
 *
 * A path is usable only if the CPU has every feature its target attribute in
 * isa.h enables AND the OS saves the matching register state on context
 * switches (XCR0 via xgetbv); otherwise the first AVX instruction faults. */
#include "core/isa.h"

#include <string.h>

#include "core/env.h"

static const char *const isa_names[] = {"scalar", "avx2", "avx512"};

const char *llb_isa_name(int isa) {
    if (isa < LLB_ISA_SCALAR || isa > LLB_ISA_AVX512) return "unknown";
    return isa_names[isa];
}

#if LLB_X86
#include <cpuid.h>

static int xcr0_has(unsigned long long bits) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    unsigned long long xcr0 = ((unsigned long long)hi << 32) | lo;
    return (xcr0 & bits) == bits;
}

/* Detected once: 0 = not yet, else 1 + best path. */
static int detected_best;

static int detect(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return LLB_ISA_SCALAR;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return LLB_ISA_SCALAR;
    /* XCR0 bit 1 = SSE state, bit 2 = AVX (upper YMM); 5,6,7 = opmask, ZMM0-15 upper, ZMM16-31. */
    if (!xcr0_has(0x6)) return LLB_ISA_SCALAR;
    if (__get_cpuid_max(0, 0) < 7) return LLB_ISA_SCALAR;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx2 = (b >> 5) & 1;
    if (!(avx2 && fma && f16c)) return LLB_ISA_SCALAR;
    const int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    const int vnni = (c >> 11) & 1;
    int bf16 = 0;
    if (a >= 1) { /* leaf 7 sub-leaf 0 EAX = highest sub-leaf */
        unsigned int a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        bf16 = (a1 >> 5) & 1;
    }
    /* Everything LLB_TARGET_AVX512 lets the compiler emit, so kernels may use any of it. */
    if (f && dq && bw && vl && vnni && bf16 && xcr0_has(0xE6)) return LLB_ISA_AVX512;
    return LLB_ISA_AVX2;
}

int llb_isa_best(void) {
    if (!detected_best) detected_best = 1 + detect();
    return detected_best - 1;
}

static int cpu_is_amd(void) {
    unsigned int a, b, c, d;
    char vendor[13] = {0};
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    return strcmp(vendor, "AuthenticAMD") == 0;
}
#else
int llb_isa_best(void) { return LLB_ISA_SCALAR; }
static int cpu_is_amd(void) { return 0; }
#endif

/* A switch that defaults to on for AMD's cores, read once into *slot: 0 = not yet, else 1 + the answer. */
static int amd_default(int *slot, const char *name) {
    if (!*slot) *slot = 1 + llb_env_flag(name, cpu_is_amd());
    return *slot - 1;
}

int llb_isa_split_broadcast(void) {
    static int slot;
    return amd_default(&slot, "LLAMBDA_SPLIT_BROADCAST");
}

int llb_isa_far_stream(void) {
    static int slot;
    return amd_default(&slot, "LLAMBDA_FAR_STREAM");
}

int llb_isa_supported(int isa) { return isa >= LLB_ISA_SCALAR && isa <= llb_isa_best(); }
