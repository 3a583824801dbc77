/* The process-wide switches (state.h) and the import-time setup. */
#include "core/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/env.h"
#include "core/isa.h"
#include "core/threadpool.h"

int llb_isa_current = LLB_ISA_SCALAR;
int llb_batch_invariant = 0;

/* LLAMBDA_ISA=scalar|avx2|avx512 forces a path; an unknown or unsupported one
 * falls back to the best path with a warning (a typo must not stop an import). */
static void select_isa_from_env(void) {
    const int best = llb_isa_best();
    llb_isa_current = best;
    char want[16];
    const int n = llb_env_str("LLAMBDA_ISA", want, sizeof want);
    if (n == 0) return;
    for (int isa = LLB_ISA_SCALAR; isa <= LLB_ISA_AVX512 && n < (int)sizeof want; isa++) {
        if (strcasecmp(want, llb_isa_name(isa)) != 0) continue;
        if (llb_isa_supported(isa)) {
            llb_isa_current = isa;
        } else {
            fprintf(stderr, "llambda: warning: LLAMBDA_ISA=%s is not supported by this CPU; using %s\n", want,
                    llb_isa_name(best));
        }
        return;
    }
    llb_env_warn("LLAMBDA_ISA", "scalar, avx2 or avx512", llb_isa_name(best));
}

int llb_core_init(void) {
    select_isa_from_env();
    return llb_pool_init(1);
}
