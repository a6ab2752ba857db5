"""Starting vLLM: importing it, checking it can give per-request metrics, building ``AsyncLLM``.

Only ``VLLMEngine.from_pretrained`` calls these, after every check that needs no vLLM.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import Any

from generation.vllm_engine.loop import EventLoopThread
from generation.vllm_engine.mapping import VLLM_PIN, VLLMUnavailableError


def import_vllm() -> Any:
    """Return the ``vllm`` module; warn when it is not the pinned version."""
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as exc:
        raise VLLMUnavailableError(
            f"vLLM is not installed ({exc}); install the project's `vllm` extra on a GPU host "
            f"(pip install '.[vllm]', vllm=={VLLM_PIN}) or use SPECRAG_ENGINE=torch"
        ) from exc
    version = getattr(vllm, "__version__", "unknown")
    if version != VLLM_PIN:
        warnings.warn(
            f"vllm {version} is installed; this engine reads vllm=={VLLM_PIN}'s output shapes",
            RuntimeWarning,
            stacklevel=3,
        )
    return vllm


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
        raise

    async def build() -> Any:
        return async_llm.AsyncLLM.from_engine_args(engine_args)

    llm = runner.submit(build()).result()  # loads the models: minutes, on purpose blocking
    cumulative = sampling.RequestOutputKind.CUMULATIVE

    def make_sampling_params(**sampling_kw: Any) -> Any:
        return sampling.SamplingParams(output_kind=cumulative, **sampling_kw)

    return llm, make_sampling_params
