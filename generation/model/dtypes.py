"""Which numerics an engine runs in: ``float32`` (bit-exact), ``bfloat16``, or ``auto``.

``auto`` is bfloat16 where the hardware computes it natively (CUDA; a CPU with AMX or AVX-512
BF16) and float32 elsewhere: on a CPU without those instructions oneDNN emulates bfloat16, slower
than float32. Asking for bfloat16 there is refused, naming the missing feature.
"""

from __future__ import annotations

import functools

import torch

DTYPES = ("float32", "bfloat16", "auto")
"""The names ``EngineConfig.dtype``, ``from_pretrained(dtype=)`` and ``SPECRAG_DTYPE`` take."""
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags (``/proc/cpuinfo``) under which a CPU runs bfloat16 matmuls natively."""
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@functools.cache
def cpu_bf16_flags() -> frozenset[str]:
    """The ``BF16_CPU_FLAGS`` this CPU reports (empty where none, or where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(set(line.split(":", 1)[1].split()) & set(BF16_CPU_FLAGS))
    except OSError:
        pass
    return frozenset()


def check_dtype_name(name: str) -> str:
    """Return ``name`` when it is one of ``DTYPES``; else raise ValueError naming the choices."""
    if name not in DTYPES:
        raise ValueError(f"dtype: unknown {name!r}; expected one of {', '.join(DTYPES)}")
    return name


def resolve_dtype(name: str, device: torch.device | str) -> str:
    """Return ``"float32"`` or ``"bfloat16"`` for ``name`` on ``device`` (``auto`` decided here).

    Raises ValueError for an unknown name, and for bfloat16 on a CPU without native support
    (naming the missing CPU feature and float32, the setting that works)."""
    check_dtype_name(name)
    dev = torch.device(device)
    native = dev.type != "cpu" or bool(cpu_bf16_flags())
    if name == "auto":
        return "bfloat16" if native else "float32"
    if name == "bfloat16" and not native:
        raise ValueError(
            "dtype 'bfloat16': this CPU has neither AMX nor AVX-512 BF16 (no "
            f"{' / '.join(BF16_CPU_FLAGS)} in /proc/cpuinfo), so bfloat16 would run emulated, "
            "slower than float32; use dtype 'float32' (SPECRAG_DTYPE=float32)"
        )
    return name


def dtype_name(dtype: torch.dtype) -> str:
    """The ``DTYPES`` name of a torch dtype (e.g. ``"bfloat16"``); other dtypes by torch's name."""
    for name, value in TORCH_DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).removeprefix("torch.")
