"""The one thing pyproject.toml cannot say: the optional C attention kernel, built at install.

``generation/model/attention.c`` is compiled by ``pip install`` (editable or not) into
``generation/model/_attention<EXT_SUFFIX>``, a plain shared library that
``generation/model/attention.py`` loads with ctypes. ``optional=True``: a host without a C
compiler installs the package all the same, and the engine runs torch's SDPA. Nothing is ever
compiled inside a running worker. ``SPECRAG_BUILD_KERNEL=0`` installs without it: .venv-vllm's
editable install (Makefile) uses the library .venv's install built into the tree, and leaves it
alone while the main suite has it loaded.
"""

import os

from setuptools import Extension, setup

# AVX-512 BF16 instructions: the kernel runs only where the CPU has them (attention.py checks),
# but any x86-64 compiler that knows the flags builds it, so an image built on one host runs on
# another.
FLAGS = ["-O3", "-mavx512f", "-mavx512bf16", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"]

KERNEL = Extension(
    "generation.model._attention",
    sources=["generation/model/attention.c"],
    extra_compile_args=FLAGS,
    optional=True,
)

setup(ext_modules=[] if os.environ.get("SPECRAG_BUILD_KERNEL") == "0" else [KERNEL])
