"""The two engines of the prefix benchmark behind one interface: submit a prompt, get timings.

``TorchRunner`` drives the torch engine's online loop (``EngineLoop``); ``VLLMRunner`` drives
vLLM's ``AsyncLLM`` (CPU build, float32, eager, the same draft model and k, prefix caching on)
on an asyncio loop of its own. Both time a request the same way, on this process's clock: from
``submit`` to the first verified token (TTFT) and to the last one.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from benchmarks.support import warm_up_torch_engine


@dataclass
class Outcome:
    """One request's timings (perf_counter seconds) and answer."""

    submitted: float
    first: float | None = None
    done: float | None = None
    tokens: list[int] = field(default_factory=list)
    cached: int = 0
    """Prompt tokens the engine reused from its prefix cache."""

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.submitted


class TorchRunner:
    """The torch engine's ``EngineLoop`` with ``max_batch`` slots."""

    name = "torch"

    def __init__(
        self, target: str, draft: str, k: int, max_batch: int, prefix_mb: float = 0.0
    ) -> None:
        from generation import SamplingParams, SpeculativeEngine
        from generation.config import EngineConfig

        config = EngineConfig(max_batch_size=max_batch, prefix_cache_mb=prefix_mb)
        self.engine = SpeculativeEngine.from_pretrained(target, draft, device="cpu", config=config)
        self.warmup_s = warm_up_torch_engine(self.engine, max_batch)  # as the worker's start
        self.loop = self.engine.start_loop(max_batch)
        self._params = lambda n: SamplingParams(
            max_new_tokens=n, method="draft_model", num_speculative_tokens=k
        )

    def submit(self, prompt: list[int], max_tokens: int) -> Future[Outcome]:
        out = Outcome(time.perf_counter())
        fut: Future[Outcome] = Future()

        def on_delta(ids: list[int]) -> None:
            if out.first is None:
                out.first = time.perf_counter()

        handle = self.loop.submit(prompt, self._params(max_tokens), on_delta)

        def wait() -> None:
            try:
                result = handle.result()
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)
                return
            out.done = time.perf_counter()
            out.tokens = list(result.token_ids)
            out.cached = int(getattr(result.stats, "num_cached_prompt_tokens", 0) or 0)
            fut.set_result(out)

        threading.Thread(target=wait, daemon=True).start()
        return fut

    def reset_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def close(self) -> None:
        self.loop.close()


class VLLMRunner:
    """vLLM's ``AsyncLLM`` on the CPU build, as the docstring of this module says."""

    name = "vllm"

    def __init__(self, target: str, draft: str, k: int, max_batch: int) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._aio = asyncio.new_event_loop()
        threading.Thread(target=self._aio.run_forever, daemon=True).start()
        args = AsyncEngineArgs(
            model=target,
            dtype="float32",
            enforce_eager=True,
            enable_prefix_caching=True,
            max_model_len=2048,
            max_num_seqs=max_batch,
            seed=0,
            speculative_config={
                "method": "draft_model",
                "model": draft,
                "num_speculative_tokens": k,
                "draft_tensor_parallel_size": 1,
            },
        )

        async def build() -> Any:
            return AsyncLLM.from_engine_args(args)

        self.llm = asyncio.run_coroutine_threadsafe(build(), self._aio).result()

    def submit(self, prompt: list[int], max_tokens: int) -> Future[Outcome]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        out = Outcome(time.perf_counter())
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, output_kind=RequestOutputKind.CUMULATIVE
        )

        async def run() -> Outcome:
            final = None
            gen = self.llm.generate({"prompt_token_ids": prompt}, params, uuid.uuid4().hex)
            async for final in gen:
                if out.first is None and final.outputs and final.outputs[0].token_ids:
                    out.first = time.perf_counter()
            out.done = time.perf_counter()
            assert final is not None
            out.tokens = [int(t) for t in final.outputs[0].token_ids]
            out.cached = int(final.num_cached_tokens or 0)
            return out

        return asyncio.run_coroutine_threadsafe(run(), self._aio)  # type: ignore[return-value]

    def reset_cache(self) -> None:
        asyncio.run_coroutine_threadsafe(self.llm.reset_prefix_cache(), self._aio).result()

    def close(self) -> None:
        self.llm.shutdown()
        self._aio.call_soon_threadsafe(self._aio.stop)


def target_alone(target: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy answers of the target alone: an engine without a draft or a prefix cache."""
    from generation import SamplingParams, SpeculativeEngine

    engine = SpeculativeEngine.from_pretrained(target, None, device="cpu")
    params = SamplingParams(max_new_tokens=max_tokens, method="none")
    return [list(r.token_ids) for r in engine.generate_many(prompts, params)]
