"""A STAND-IN for vllm==0.32.0's CUDA build, for what only a GPU host can show.

Real vLLM runs in the tests (its CPU build, tests/vllm/, from .venv-vllm): conformance, the
online loop, stats against vLLM's own counters, the worker end to end. This fake is kept for
what that cannot reach here: the CUDA platform (GPU counts for ``tensor_parallel_size``, a
CUDA build asked for device ``cpu``), a vLLM without per-request spec-decode metrics (0.32 has
them), the batch-size schedule (vLLM documents it for EAGLE-family drafters on GPU), and
timing edges of our own loop that real vLLM cannot be made to hit on cue (a cancel before
vLLM registered the request, or while it waits for a slot). It is an
``AsyncLLM`` that takes vllm 0.32's ``AsyncEngineArgs`` keywords and returns its documented
output shapes (``RequestOutput.outputs[0].token_ids`` / ``.spec_decode_metrics`` on the final
output only, ``RequestOutput.metrics`` a ``RequestStateStats``), batches every request in flight
step by step, merges a lagging consumer's CUMULATIVE outputs like ``RequestOutputCollector``,
and answers ``abort(request_id)`` with a final output whose finish_reason is ``"abort"``. Its
"model" is a toy greedy speculative decoder, so stats are checked against known true counts.
This shows the engine is right for the documented shapes, not that vLLM behaves as documented.
"""

from __future__ import annotations

import asyncio
import enum
import json
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ENGINE_ARGS = {  # vllm 0.32 EngineArgs fields the engine passes
    "model", "skip_tokenizer_init", "tensor_parallel_size", "gpu_memory_utilization",
    "max_num_seqs", "speculative_config", "disable_log_stats",
    "per_request_spec_decode_metrics", "max_model_len",
}  # fmt: skip
SAMPLING_ARGS = {
    "n", "temperature", "top_p", "seed", "max_tokens", "stop_token_ids", "detokenize",
    "output_kind",
}  # fmt: skip
STEP_SECONDS = 0.001  # a "GPU step": long enough for submitters to join the running batch


class RequestOutputKind(enum.Enum):  # vllm.sampling_params.RequestOutputKind
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class RequestSpecDecodeMetrics:  # vllm.v1.metrics.stats.RequestSpecDecodeMetrics
    num_spec_tokens: int
    histogram: list[int]
    num_draft_tokens: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: Any = None
    spec_decode_metrics: RequestSpecDecodeMetrics | None = None


@dataclass
class OldCompletionOutput:  # a vLLM without per-request metrics
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


class SamplingParams:  # vllm.SamplingParams: only the keywords the engine passes
    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - SAMPLING_ARGS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {unknown}")
        self.kwargs = kwargs


class AsyncEngineArgs:
    reject_per_request = False

    def __init__(self, **kwargs: Any) -> None:
        if set(kwargs) - ENGINE_ARGS:
            raise TypeError(f"unexpected keyword arguments {set(kwargs) - ENGINE_ARGS}")
        if self.reject_per_request and "per_request_spec_decode_metrics" in kwargs:
            raise TypeError("unexpected keyword argument 'per_request_spec_decode_metrics'")
        self.kwargs = kwargs


def target_next(ctx: list[int], vocab: int) -> int:
    return (ctx[-1] * 7 + len(ctx) * 3 + 1) % vocab


@dataclass
class _Request:
    ctx: list[int]
    sp: dict[str, Any]
    emitted: list[int]
    out: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    round_accepted: int = 0
    rounds: int = 0
    kept_per_pos: list[int] = field(default_factory=list)
    output: Any = None  # the collector's slot: a lagging consumer sees only the newest
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class AsyncLLM:
    """Continuous batching over a toy target; the draft errs every 5th position."""

    instances: list[AsyncLLM] = []
    drop_metrics = False  # a vLLM that forgets spec_decode_metrics
    hold: threading.Event | None = None  # while cleared, no step runs
    admit: threading.Event | None = None  # while cleared, generate() has not added its request

    @classmethod
    def from_engine_args(cls, args: AsyncEngineArgs) -> AsyncLLM:
        return cls(**args.kwargs)

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("per_request_spec_decode_metrics", "none") != "none":
            if kwargs["speculative_config"] is None:  # vllm/config/vllm.py refuses this
                raise ValueError("per-request spec decode metrics require speculative decoding")
        spec = kwargs["speculative_config"] or {}
        if spec.get("method") == "draft_model":  # DraftModelProposer's own rule
            assert spec["draft_tensor_parallel_size"] == kwargs["tensor_parallel_size"]
            assert spec["draft_sample_method"] in ("greedy", "probabilistic")
        self.kwargs = kwargs
        self.vocab = json.loads((Path(kwargs["model"]) / "config.json").read_text())["vocab_size"]
        self.k, self.method = spec.get("num_speculative_tokens", 0), spec.get("method", "none")
        self.requests: dict[str, _Request] = {}
        self.seen: list[str] = []  # request ids in the order vLLM received them
        self.aborted: list[str] = []
        self.batch_sizes: list[int] = []  # requests in each step
        self.finished: dict[str, _Request] = {}
        self._stepper: asyncio.Task[None] | None = None
        AsyncLLM.instances.append(self)

    def _propose(self, ctx: list[int]) -> list[int]:
        if self.method == "ngram" and len(ctx) % 3 == 0:
            return []  # no n-gram match: a round without drafts
        draft: list[int] = []
        for _ in range(self.k):
            t = target_next(ctx + draft, self.vocab)
            draft.append(t if (len(ctx) + len(draft)) % 5 else (t + 1) % self.vocab)
        return draft

    async def generate(
        self, prompt: dict, sampling_params: SamplingParams, request_id: str, trace_headers=None
    ):  # type: ignore[no-untyped-def]  # noqa: E501
        sp = sampling_params.kwargs
        assert sp["output_kind"] is RequestOutputKind.CUMULATIVE
        assert request_id not in self.requests, "request ids must be unique"
        ctx = list(prompt["prompt_token_ids"])
        req = _Request(ctx, sp, [target_next(ctx, self.vocab)], kept_per_pos=[0] * self.k)
        await asyncio.sleep(0)  # adding a request awaits the engine core
        while self.admit is not None and not self.admit.is_set():
            await asyncio.sleep(STEP_SECONDS)
        self.requests[request_id] = req
        self.seen.append(request_id)
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.get_running_loop().create_task(self._steps())
        try:
            while True:
                await req.ready.wait()
                output, req.output = req.output, None
                req.ready.clear()
                yield output
                if output.finished:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise

    async def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.aborted.append(request_id)
            self._put(req, finish_reason="abort")

    def shutdown(self) -> None:
        if self._stepper is not None and not self._stepper.get_loop().is_closed():
            self._stepper.get_loop().call_soon_threadsafe(self._stepper.cancel)

    async def _steps(self) -> None:
        while self.requests:
            while self.hold is not None and not self.hold.is_set():
                await asyncio.sleep(STEP_SECONDS)
            batch = list(self.requests.items())[: self.kwargs["max_num_seqs"]]
            self.batch_sizes.append(len(batch))
            for request_id, req in batch:
                if self._step(req):
                    del self.requests[request_id]
                    self.finished[request_id] = req
            await asyncio.sleep(STEP_SECONDS)

    def _step(self, req: _Request) -> bool:
        """Emit the pending round's tokens, then verify the next round; return whether done."""
        stop, sp = set(req.sp["stop_token_ids"]), req.sp
        for i, t in enumerate(req.emitted):  # vLLM drops what follows a stop or max_tokens
            req.out.append(t)
            req.ctx.append(t)
            if i < req.round_accepted:
                req.kept_per_pos[i] += 1
            if t in stop or len(req.out) >= sp["max_tokens"]:
                self._put(req, finish_reason="stop" if t in stop else "length")
                return True
        draft, emitted = self._propose(req.ctx), []
        req.rounds += 1
        for d in draft:
            if d != target_next(req.ctx + emitted, self.vocab):
                break
            emitted.append(d)
        req.round_accepted = len(emitted)
        if draft:
            req.accepted.append(req.round_accepted)
            req.drafted.append(len(draft))
        req.emitted = emitted + [target_next(req.ctx + emitted, self.vocab)]
        self._put(req, finish_reason=None)
        return False

    def _put(self, req: _Request, finish_reason: str | None) -> None:
        level = self.kwargs.get("per_request_spec_decode_metrics", "none")
        metrics = None
        if finish_reason not in (None, "abort") and self.k and level != "none" and req.accepted:
            metrics = RequestSpecDecodeMetrics(
                self.k, [req.accepted.count(j) for j in range(self.k + 1)], sum(req.drafted)
            )
            if level == "detailed":
                metrics.per_step_accepted = list(req.accepted)
                metrics.per_step_drafted = list(req.drafted)
        if self.drop_metrics:
            metrics = None
        completion = CompletionOutput(
            0, "", list(req.out), finish_reason=finish_reason, spec_decode_metrics=metrics
        )
        stats = types.SimpleNamespace(  # RequestStateStats
            num_generation_tokens=len(req.out), arrival_time=1e9, queued_ts=50.0,
            scheduled_ts=50.001, first_token_ts=50.02, last_token_ts=50.02 + 0.005 * len(req.out),
            first_token_latency=0.021,
        )  # fmt: skip
        req.output = types.SimpleNamespace(  # CUMULATIVE: a newer output replaces the older
            outputs=[completion], metrics=stats, finished=finish_reason is not None
        )
        req.ready.set()


class CudaPlatform:
    """vllm.platforms.current_platform of the CUDA build."""

    device_name = "cuda"

    def is_cpu(self) -> bool:
        return False

    def is_cuda_alike(self) -> bool:
        return True


def install(
    monkeypatch: pytest.MonkeyPatch, completion_cls: type = CompletionOutput
) -> type[AsyncLLM]:
    """Install the stand-in as ``vllm`` (and the submodules the engine imports)."""
    root = types.ModuleType("vllm")
    root.__version__ = "0.32.0"  # type: ignore[attr-defined]
    modules = {
        "vllm": root,
        "vllm.engine.arg_utils": types.SimpleNamespace(AsyncEngineArgs=AsyncEngineArgs),
        "vllm.v1.engine.async_llm": types.SimpleNamespace(AsyncLLM=AsyncLLM),
        "vllm.sampling_params": types.SimpleNamespace(
            SamplingParams=SamplingParams, RequestOutputKind=RequestOutputKind
        ),
        "vllm.outputs": types.SimpleNamespace(CompletionOutput=completion_cls),
        "vllm.platforms": types.SimpleNamespace(current_platform=CudaPlatform()),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(AsyncEngineArgs, "reject_per_request", False)
    monkeypatch.setattr(AsyncLLM, "drop_metrics", False)
    monkeypatch.setattr(AsyncLLM, "hold", None)
    monkeypatch.setattr(AsyncLLM, "admit", None)
    AsyncLLM.instances = []
    return AsyncLLM


# --- fixtures and helpers shared by the vLLM engine's test modules ---------------------------
PROMPT = [5, 17, 42, 17, 42, 99, 3, 17, 42]
WAIT = 30.0  # seconds any single wait in these tests may take before it fails


@pytest.fixture
def standin_vllm(monkeypatch: pytest.MonkeyPatch) -> type[AsyncLLM]:
    """Install the stand-in as ``vllm`` and report one CUDA GPU (there is none here)."""
    from generation.vllm_engine import startup

    monkeypatch.setattr(startup, "_cuda_device_count", lambda: 1)
    return install(monkeypatch)


def start(models: dict[str, Path], method: str = "draft_model", k: int | str = 4, **kw: Any) -> Any:
    """Return a ``VLLMEngine`` on the tiny pair (the draft only for ``draft_model``)."""
    from generation.vllm_engine import VLLMEngine

    draft = models["draft"] if method == "draft_model" else None
    kw.setdefault("device", "cuda")
    return VLLMEngine.from_pretrained(
        models["target"], draft, method=method, num_speculative_tokens=k, **kw
    )


@pytest.fixture
def engine_factory(tiny_models: dict[str, Path], standin_vllm: Any) -> Iterator[Any]:
    """Start engines on the stand-in; every one is closed (its thread stopped) afterwards."""
    started: list[Any] = []

    def make(method: str = "draft_model", k: int | str = 4, **kw: Any) -> Any:
        started.append(start(tiny_models, method, k, **kw))
        return started[-1]

    yield make
    for engine in started:
        engine.close()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
