"""Micro-benchmark (not a test): can FP32 FMAs run beside the int8 multiplies of a GEMM tile for free?

On Zen 2 vpmaddubsw and vpmaddwd share one FP pipe (1 a cycle together) while FMAs may issue on two, so a
tile could do part of its K in FP32 FMAs of the same integer codes (exact while |sum| < 2^24) and keep the
multiplier pipe busy with the rest. This writes instruction streams with the kernels' mix (as inline asm,
operands from L1), compiles them with gcc and prints cycles a 32-value block and int8 multiply-adds a cycle:

  python bench/port_mix.py            # clock from a dependent add chain; needs gcc and an AVX2+FMA CPU

signed: a quad per row and half is vpsignb (sign of the activation by the weight), vpmaddubsw (|w| x that),
vpmaddwd by ones, vpaddd (Q8_0's, IQ4_NL's AVX2 tile); unsigned: vpmaddubsw and an int16 vpaddw, one vpmaddwd
a block (Q4_0's). `float k` is how many of the block's 32 values go through FMAs (a broadcast activation
times a 16-row column, 2 FMAs a row), spread between the integer quads as a kernel would.
"""
import os
import subprocess
import sys
import tempfile

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static char buf[8192] __attribute__((aligned(64)));
int main(int argc, char **argv) {
    long iters = atol(argv[1]);
    char *p = buf;
    double t0 = now();
    for (long it = 0; it < iters; it++)
        __asm__ volatile(BODY :: "r"(p) : "memory", "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                         "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    printf("%.6f\n", (now() - t0) / iters * 1e9);
}
"""


def ns_per_iter(body, iters, workdir):
    src, exe = os.path.join(workdir, "mix.c"), os.path.join(workdir, "mix")
    with open(src, "w") as f:
        f.write(HARNESS)
    subprocess.run(["gcc", "-O2", "-mavx2", "-mfma", f'-DBODY="{body}"', "-o", exe, src], check=True)
    return min(float(subprocess.run([exe, str(iters)], capture_output=True, text=True, check=True).stdout)
               for _ in range(3))


def asm(lines):
    return "\\n".join(lines) + "\\n"


def block(signed, n_int, n_float, rows):
    """One block: n_int quads as integers, n_float values as FMAs, for `rows` activation rows x 16 weight rows.
    Registers: 0-3 integer accumulators (0-7 for the unsigned types without FMAs), 4-7 FP32 ones, 8-9 |w|, 10 the activation broadcast, 11-12
    products, 13 the float broadcast, 14 a vpmaddwd result, 15 ones."""
    s, k = [], 0
    chains = 8 if not signed and not n_float else 4  # the unsigned 4-row tile's 8 int16 chains leave no room for FP ones
    for t in range(n_int):
        if signed:
            s += [f"vmovdqa {t * 32}(%0), %%ymm8", f"vmovdqa {256 + t * 32}(%0), %%ymm9"]
        for m in range(rows):
            s.append(f"vpbroadcastd {1024 + m * 32 + 4 * t}(%0), %%ymm10")
            for h in range(2):
                acc = (2 * m + h) % chains
                if signed:
                    s += [f"vpsignb {2048 + h * 256 + t * 32}(%0), %%ymm10, %%ymm{11 + h}",
                          f"vpmaddubsw %%ymm{11 + h}, %%ymm{8 + h}, %%ymm{11 + h}",
                          f"vpmaddwd %%ymm15, %%ymm{11 + h}, %%ymm{11 + h}",
                          f"vpaddd %%ymm{11 + h}, %%ymm{acc}, %%ymm{acc}"]
                else:
                    s += [f"vpmaddubsw {h * 256 + t * 32}(%0), %%ymm10, %%ymm{11 + h}",
                          f"vpaddw %%ymm{11 + h}, %%ymm{acc}, %%ymm{acc}"]
        while k < (t + 1) * n_float // n_int:
            for m in range(rows):
                s.append(f"vbroadcastss {3072 + m * 64 + 4 * k}(%0), %%ymm13")
                s += [f"vfmadd231ps {4096 + k * 64 + h * 32}(%0), %%ymm13, %%ymm{4 + (2 * m + h) % 4}" for h in range(2)]
            k += 1
    if not signed:
        for m in range(rows):
            for h in range(2):
                acc = (2 * m + h) % chains
                s += [f"vpmaddwd %%ymm15, %%ymm{acc}, %%ymm14", f"vpaddd %%ymm14, %%ymm{acc}, %%ymm{acc}"]
    return asm(s)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    with tempfile.TemporaryDirectory() as d:
        ghz = 64 / ns_per_iter(asm(["add $1, %%rax"] * 64), iters, d)
        print(f"clock ~{ghz:.2f} GHz (64 dependent adds)")
        for signed, cases in ((True, [(8, 0, 4), (8, 0, 2), (7, 4, 2), (6, 8, 2), (5, 12, 2), (6, 8, 1)]),
                              (False, [(8, 0, 4), (7, 4, 4), (7, 4, 2)])):
            for n_int, n_float, rows in cases:
                cyc = ns_per_iter(block(signed, n_int, n_float, rows), iters, d) * ghz
                macs = rows * 16 * (4 * n_int + n_float)
                print(f"{'signed' if signed else 'unsigned':8s} int quads {n_int}, float k {n_float:2d}, rows {rows}: "
                      f"{cyc:6.1f} cycles a block, {macs / cyc:5.1f} multiply-adds a cycle")


if __name__ == "__main__":
    main()
