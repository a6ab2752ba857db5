"""Attention of each row's queries over its own KV slot, in bfloat16 on a CPU with AVX-512 BF16.

Why it exists: torch's CPU SDPA is slow at this engine's shapes in bfloat16. A speculative round
attends 1 + k queries a row (a draft pass 1) over hundreds of cached positions, where its flash
kernel costs 5 queries 2.5x one, nearly what 16 cost, and a batch of rows is padded to the
longest row with a mask. A prompt's prefill is no better: on a CPU without AMX its bf16 flash
kernel is no faster than float32's (a 500-token causal prefill, 6 heads of 64: 6.3 ms a layer
against 6.1). ``attention.c`` reads each row's slot up to
its own length (no padding, no mask, no gather), each position's keys and values once for a
block of 16 queries (a prompt reads the causal triangle block by block), as vLLM's CPU attention
reads its paged cache. It is compiled on first
use with the system's C compiler into a per-user cache; where that fails, or the CPU lacks
AVX-512 BF16, ``slot_attention`` returns None and the forward pass runs SDPA as before. float32
always runs SDPA (its numerics stay as they were).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from generation.model.dtypes import cpu_bf16_flags

BLOCK = 16
"""Queries a row whose scores the kernel computes together (``BLOCK`` in attention.c)."""

SOURCE = Path(__file__).with_name("attention.c")
FLAGS = ["-O3", "-mavx512f", "-mavx512bf16", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"]

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
"""(q [B, heads, n, head_dim], keys, values [slots, kv_heads, capacity, head_dim], scale) ->
[B * n, heads * head_dim]."""


def _cpu_has_avx512_bf16() -> bool:
    return "avx512_bf16" in cpu_bf16_flags()


def _cpu_has_amx() -> bool:
    return "amx_bf16" in cpu_bf16_flags()


def _build() -> ctypes.CDLL | None:
    """The compiled kernel, built once per source version into ``~/.cache/specrag`` (None: no
    compiler, a failed build, or a CPU without AVX-512 BF16)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not _cpu_has_avx512_bf16():
        return None
    source = SOURCE.read_bytes()
    tag = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    cache = Path(os.path.expanduser("~")) / ".cache" / "specrag"
    target = cache / f"attention-{tag}.so"
    if not target.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                built = Path(tmp) / "attention.so"
                subprocess.run(
                    [compiler, *FLAGS, "-shared", "-fPIC", "-o", str(built), str(SOURCE)],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
                os.replace(built, target)  # concurrent builders: each replaces whole
        except (OSError, subprocess.SubprocessError):
            return None
    lib = ctypes.CDLL(str(target))
    fn = lib.slot_attention_bf16
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
    return lib


def library() -> ctypes.CDLL | None:
    """The kernel's library, built on first call (None where it cannot run here)."""
    global _library, _tried
    with _lock:
        if not _tried:
            _tried = True
            _library = _build()
        return _library


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
    if (
        dtype != torch.bfloat16
        or device.type != "cpu"
        or n < 1
        or head_dim % 32
        or torch.get_num_threads() != 1
        or (n > BLOCK and _cpu_has_amx())
    ):
        return None
    lib = library()
    if lib is None:
        return None
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
