"""Builds the C core (csrc/) as the extension module llambda._native.

Sources live in csrc/ by role (core/, quants/, matmul/, ops/, python/) and are
found recursively; includes are written relative to csrc/ ("core/isa.h").
All sources are compiled with the same portable flags; ISA-specific kernels
select their instruction set per function (GCC/Clang target attributes), so
one binary carries the scalar, AVX2 and AVX-512 paths and picks one at run time.
The extension is optional: without a C compiler the package still installs and
runs on the NumPy backend.
"""
import glob
import sys

from setuptools import Extension, setup

extra_compile = ["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"]
extra_link = []
if sys.platform != "win32":
    extra_compile += ["-pthread", "-fvisibility=hidden"]
    extra_link += ["-pthread"]

setup(
    ext_modules=[
        Extension(
            "llambda._native",
            sources=sorted(glob.glob("csrc/**/*.c", recursive=True)),
            include_dirs=["csrc"],
            depends=sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.inc", recursive=True)),
            extra_compile_args=extra_compile,
            extra_link_args=extra_link,
            optional=True,
        )
    ]
)
