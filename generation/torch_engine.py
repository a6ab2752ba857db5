"""The built-in PyTorch engine: speculative decoding over Hugging Face models on KV slots.

As nano-vLLM's ``LLM``, the engine is a batching engine whose ``generate`` is a batch of one:
``generate_many`` queues requests on a ``BatchEngine`` (generation/batching.py) and steps it
until they are done, and ``start_loop`` steps one in a thread while requests come and go. Both
run on the engine's one KV store per model (generation/kv_store.py), whose slots the engine
decides once at construction (``max_concurrency``) and allocates on first use; while a loop
runs, ``generate_many`` submits to it, so every caller (worker, audits, warm-up) takes the
production path.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from generation.base import GenerationResult, check_prompt
from generation.batching import BatchEngine, EngineCore
from generation.config import EngineConfig
from generation.engine_loop import BatchRequestError, EngineLoop, collect, run_many
from generation.forward import Forward, forward_for
from generation.goodput import RecentAcceptance, StepCosts
from generation.loading import (
    check_vocab_compatible,
    eos_token_ids,
    load_causal_lm,
    max_context,
    output_vocab_size,
    resolve_device,
)
from generation.model_runner import ModelRunner, plan_slots, slot_bytes, time_batch_steps
from generation.params import SamplingParams
from generation.prefix_kv import PrefixCache


def _label(model: Any) -> str:
    name = str(getattr(model.config, "_name_or_path", "") or "")
    return Path(name).name if name else type(model).__name__


class SpeculativeEngine:
    """A target (and optional draft) on one device that generates with speculative decoding."""

    def __init__(
        self,
        target: Any,
        draft: Any | None = None,
        *,
        model_pair: str | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        self.target = target.eval()
        self.draft = draft.eval() if draft is not None else None
        self.device = next(target.parameters()).device
        self.target_forward: Forward = forward_for(self.target, config.fast_forward)
        """The target as the engine runs it (generation/forward.py)."""
        self.draft_forward: Forward | None = None
        """The draft as the engine runs it, if there is one."""
        if self.draft is not None:
            self.draft_forward = forward_for(self.draft, config.fast_forward)
        self._vocab_size = output_vocab_size(target)
        self._max_context = min(max_context(m.config) for m in (target, draft) if m is not None)
        self._eos = eos_token_ids(target)
        self._model_pair = model_pair or _label(target) + (f"+{_label(draft)}" if draft else "")
        models = [m for m in (self.target_forward, self.draft_forward) if m is not None]
        # A slot holds the whole context and one round's padding.
        capacity = self._max_context + config.max_speculative_tokens + 1
        self.kv_bytes_per_slot = slot_bytes(models, capacity)
        """Bytes of KV one request's slot takes, target and draft together."""
        self.max_concurrency = plan_slots(
            models, capacity, config.max_batch_size, config.kv_memory_fraction
        )
        """Requests the engine holds at once: its KV slots (``max_batch_size``, or fewer where
        memory cannot hold them at the full context)."""
        target_fwd, draft_fwd = self.target_forward, self.draft_forward

        def timer(batch_size: int, ks: list[int], with_draft: bool) -> dict[int, float]:
            return time_batch_steps(target_fwd, draft_fwd if with_draft else None, batch_size, ks)

        self._core = EngineCore(
            target=ModelRunner(target_fwd, self.max_concurrency, capacity),
            draft=None
            if draft_fwd is None
            else ModelRunner(draft_fwd, self.max_concurrency, capacity),
            config=config,
            device=self.device,
            eos=frozenset(self._eos),
            max_context=self._max_context,
            check_request=self.check_request,
            costs=StepCosts(timer, config.max_speculative_tokens),
            recent={"draft_model": RecentAcceptance(), "ngram": RecentAcceptance()},
        )
        self.prefix_cache = PrefixCache.for_models(
            config.prefix_cache_mb, self.target, self.draft, self._model_pair,
            config.prefix_block_size,
        )  # fmt: skip
        """KV of earlier prompts' prefixes (generation/prefix_kv.py); None when reuse is off."""
        self._core.prefix = self.prefix_cache
        self._lock = threading.Lock()
        """Held by whoever steps the KV store: a running loop's thread, or ``generate_many``."""
        self._loop: EngineLoop | None = None

    @classmethod
    def from_pretrained(
        cls,
        target_dir: str | Path,
        draft_dir: str | Path | None = None,
        device: str | torch.device = "cpu",
        config: EngineConfig | None = None,
    ) -> SpeculativeEngine:
        """Return an engine with the checkpoints loaded once; a mismatched draft is refused."""
        dev = resolve_device(device)
        target = load_causal_lm(target_dir, dev)
        draft = None
        pair = Path(target_dir).name
        if draft_dir is not None:
            draft = load_causal_lm(draft_dir, dev)
            check_vocab_compatible(target, draft, target_dir, draft_dir)
            pair = f"{pair}+{Path(draft_dir).name}"
        return cls(target, draft, model_pair=pair, config=config)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt prefix not in use (as vLLM's ``reset_prefix_cache``);
        return how many blocks were dropped (0 when reuse is off)."""
        return self.prefix_cache.reset() if self.prefix_cache is not None else 0

    @property
    def vocab_size(self) -> int:
        """Size of the target's vocabulary; valid token ids are ``range(vocab_size)``."""
        return self._vocab_size

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + new tokens) the target (and draft) accept."""
        return self._max_context

    @property
    def eos_token_id(self) -> int | None:
        """The target's end-of-sequence token, if it has one."""
        return self._eos[0] if self._eos else None

    @property
    def eos_token_ids(self) -> list[int]:
        """Every end-of-sequence id of the target."""
        return list(self._eos)

    @property
    def model_pair(self) -> str:
        """A short label of the loaded target/draft pair."""
        return self._model_pair

    @property
    def max_speculative_tokens(self) -> int:
        """k_max: the largest k a request may ask for, and the longest draft of ``"auto"``."""
        return self.config.max_speculative_tokens

    @property
    def kv_stores(self) -> list[Any]:
        """The KV store of each model (target first), allocated now if not yet."""
        return [r.store for r in (self._core.target, self._core.draft) if r is not None]

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem when this engine cannot serve the request."""
        check_prompt(prompt_token_ids, params, self.vocab_size, self.max_context)
        if params.method == "draft_model" and self.draft is None:
            raise ValueError("method: 'draft_model' needs a draft model; this engine has none")

    def recent_alpha(self, method: str) -> float:
        """Acceptance that recent ``"auto"`` requests of ``method`` saw (a new one's prior)."""
        return self._core.recent[method].alpha

    def step_costs(self) -> StepCosts:
        """The T(B, k) tables goodput prices steps with, shared by every batch of this engine."""
        return self._core.costs

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        """Allocate the KV stores and measure the step costs T(B, k) of these batch sizes now
        (else the first batch of a size does); also warms the kernels a first request needs."""
        with torch.inference_mode():
            self.kv_stores  # noqa: B018 - allocated here, not in the first request
        for size in batch_sizes:
            self.step_costs().table(size, False)
            if self.draft is not None:
                self.step_costs().table(size, True)

    def _batch(
        self,
        max_batch_size: int | None,
        pause_background: bool | None,
        prefill_chunk: int | None = None,
    ) -> BatchEngine:
        if pause_background is None:
            pause_background = self.config.pause_background
        if pause_background is None:
            pause_background = self.device.type == "cpu"
        size = max_batch_size or self.max_concurrency
        return BatchEngine(self._core, size, pause_background, prefill_chunk)

    def start_loop(
        self,
        max_batch_size: int | None = None,
        *,
        prefill_chunk: int | None = None,
    ) -> EngineLoop:
        """Return a running ``EngineLoop`` (continuous batching) over this engine's KV store.

        ``max_batch_size``: at most ``max_concurrency`` (None: that). ``prefill_chunk``: most
        prompt tokens prefilled per step (None: the config's). One loop at a time: close it first.
        """
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk: must be >= 1, got {prefill_chunk}")
        if self._loop is not None and not self._loop.closed:
            raise RuntimeError("start_loop: this engine already runs a loop; close it first")
        self._loop = EngineLoop(self._batch(max_batch_size, None, prefill_chunk), self._lock)
        return self._loop

    def generate_many(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams] | SamplingParams,
        *,
        max_batch_size: int | None = None,
    ) -> list[GenerationResult]:
        """Return one result per prompt, in input order, generated as one continuous batch.

        ``params``: one ``SamplingParams`` per prompt (or one for all). Each result is what the
        request would get alone. Bad requests raise ``BatchRequestError`` naming their index,
        after every other request was answered (its ``results`` hold the others). While a loop
        runs, the requests join it (``max_batch_size`` is then the loop's).
        """
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(
                f"params: expected one SamplingParams per prompt ({len(prompts)}), "
                f"got {len(params)}"
            )
        loop = self._loop
        if loop is not None and not loop.closed:
            return collect([loop.submit(p, s) for p, s in zip(prompts, params, strict=True)], None)
        size = min(max_batch_size or self.max_concurrency, self.max_concurrency, len(prompts))
        with self._lock:
            return run_many(self._batch(max(1, size), False), prompts, params)

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``: a batch
        of one (a bad request raises its own error)."""
        try:
            [result] = self.generate_many([prompt_token_ids], [params], max_batch_size=1)
        except BatchRequestError as exc:
            raise exc.errors[0] from None
        return result
