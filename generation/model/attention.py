"""Attention of each row's queries over its own KV slot, in bfloat16 on a CPU with AVX-512 BF16.

Why it exists: torch's CPU SDPA is slow at this engine's shapes in bfloat16. A speculative round
attends 1 + k queries a row (a draft pass 1) over hundreds of cached positions, where its flash
kernel costs 5 queries 2.5x one, nearly what 16 cost, and a batch of rows is padded to the
longest row with a mask. A prompt's prefill is no better: on a CPU without AMX its bf16 flash
kernel is no faster than float32's (a 500-token causal prefill, 6 heads of 64: 6.3 ms a layer
against 6.1). ``attention.c`` reads each row's slot up to its own length (no padding, no mask, no
gather), each position's keys and values once for a block of 16 queries (a prompt reads the
causal triangle block by block), as vLLM's CPU attention reads its paged cache.

It is built when the package is installed (setup.py, an optional extension) and never inside a
request. Where it was not built, cannot be loaded, or the CPU lacks AVX-512 BF16,
``slot_attention`` returns None and the forward pass runs SDPA; float32 always runs SDPA (its
numerics stay as they are). The first pass of each kind (dtype, decode rows or prompt chunks)
logs which attention it runs and why, once per process.
"""

from __future__ import annotations

import ctypes
import logging
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from generation.model.dtypes import cpu_bf16_flags

BLOCK = 16
"""Queries a row whose scores the kernel computes together (``BLOCK`` in attention.c)."""

LIBRARY = Path(__file__).with_name("_attention" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
"""Where setup.py's optional extension puts the compiled kernel (a plain library, for ctypes)."""

log = logging.getLogger(__name__)

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False
_why_not = ""
_logged: set[tuple[str, str]] = set()

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
"""(q [B, heads, n, head_dim], keys, values [slots, kv_heads, capacity, head_dim], scale) ->
[B * n, heads * head_dim]."""


def _cpu_has_avx512_bf16() -> bool:
    return "avx512_bf16" in cpu_bf16_flags()


def _cpu_has_amx() -> bool:
    return "amx_bf16" in cpu_bf16_flags()


def _load(path: Path) -> tuple[ctypes.CDLL | None, str]:
    """The kernel's library at ``path`` with its entry point typed, or None and the reason."""
    if not _cpu_has_avx512_bf16():
        return None, "the CPU lacks AVX-512 BF16"
    if not path.exists():
        return None, f"the kernel was not built at install ({path.name} absent: no C compiler?)"
    try:
        lib = ctypes.CDLL(str(path))
        fn = lib.slot_attention_bf16
    except (OSError, AttributeError) as exc:
        return None, f"the kernel at {path} cannot be loaded ({exc})"
    fn.restype = None
    fn.argtypes = [
        ctypes.c_void_p,  # q
        ctypes.c_void_p,  # q strides
        ctypes.c_void_p,  # keys
        ctypes.c_void_p,  # values
        ctypes.c_void_p,  # slots
        ctypes.c_void_p,  # starts
        *[ctypes.c_int64] * 6,  # batch, heads, kv_heads, n, dim, capacity
        ctypes.c_float,  # scale
        ctypes.c_void_p,  # out
        ctypes.c_void_p,  # scratch
    ]
    return lib, ""


def library() -> ctypes.CDLL | None:
    """The kernel's library, loaded on first call (None where it cannot run here)."""
    global _library, _tried, _why_not
    with _lock:
        if not _tried:
            _tried = True
            _library, _why_not = _load(LIBRARY)
        return _library


def _say_once(dtype: torch.dtype, kind: str, path: str) -> None:
    # One line per (dtype, shape kind) per process: which attention runs, and why.
    key = (str(dtype), kind)
    if key in _logged:
        return
    _logged.add(key)
    log.info("attention for %s %s: %s", str(dtype).removeprefix("torch."), kind, path)


def _why_sdpa(dtype: torch.dtype, device: torch.device, n: int, head_dim: int) -> str | None:
    # Why this pass runs SDPA whatever the kernel's state (None: the kernel may run it).
    if dtype != torch.bfloat16 or device.type != "cpu":
        return f"the kernel is for bfloat16 on a CPU, not {dtype} on {device.type}"
    if n < 1 or head_dim % 32:
        return f"head_dim {head_dim} is not a multiple of 32" if n >= 1 else "no queries"
    if torch.get_num_threads() != 1:
        return "more than one torch thread (the kernel runs on one)"
    if n > BLOCK and _cpu_has_amx():
        return "AMX: torch's flash kernel has the tile units for prompt chunks"
    return None


def slot_attention(
    dtype: torch.dtype,
    device: torch.device,
    slots: list[int],
    starts: list[int],
    n: int,
    head_dim: int,
) -> Attention | None:
    """An attention for one pass of ``n`` queries a row (row b: slot ``slots[b]``, its query j
    seeing positions up to ``starts[b] + j``), or None where it does not apply: another dtype
    or device, a head_dim not a multiple of 32, more than one torch thread (the kernel runs on
    one), no kernel here, or a prompt chunk (more than ``BLOCK`` queries a row) on a CPU with
    AMX, where torch's flash kernel has tile units this kernel does not use and the kernel's
    prompt path was never measured against it."""
    kind = "prompt chunks" if n > BLOCK else "decode rows"
    why = _why_sdpa(dtype, device, n, head_dim)
    lib = library() if why is None else None
    if lib is None:
        _say_once(dtype, kind, f"SDPA ({why or _why_not})")
        return None
    _say_once(dtype, kind, "the slot-attention kernel")
    rows = torch.tensor(slots, dtype=torch.int64)
    begins = torch.tensor(starts, dtype=torch.int64)
    batch = len(slots)

    def attend(
        q: torch.Tensor,  # [B, heads, n, head_dim]
        keys: torch.Tensor,  # [num_slots, kv_heads, capacity, head_dim]
        values: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        if q.stride(-1) != 1:
            q = q.contiguous()
        assert keys.is_contiguous() and values.is_contiguous()
        heads, kv_heads, capacity = q.shape[1], keys.shape[1], keys.shape[2]
        out = torch.empty((batch * n, heads * head_dim), dtype=torch.bfloat16)
        scratch = torch.empty(2 * min(n, BLOCK) * (capacity + 16), dtype=torch.float32)
        strides = torch.tensor(q.stride()[:3], dtype=torch.int64)
        lib.slot_attention_bf16(
            q.data_ptr(), strides.data_ptr(), keys.data_ptr(), values.data_ptr(),
            rows.data_ptr(), begins.data_ptr(), batch, heads, kv_heads, n, head_dim, capacity,
            scale, out.data_ptr(), scratch.data_ptr(),
        )  # fmt: skip
        return out

    return attend
