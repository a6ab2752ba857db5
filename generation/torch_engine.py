"""The built-in PyTorch engine: speculative decoding over Hugging Face models on KV slots.

As nano-vLLM's ``LLM``, ``generate`` is a batch of one: ``generate_many`` steps a ``BatchEngine``
(generation/engine/step.py) until its requests are done, and ``start_loop`` steps one in a thread
(generation/engine/loop.py). Both run on one KV store per model, whose slots are decided once
(``max_concurrency``); while a loop runs, ``generate_many`` submits to it, so every caller
(worker, audits, warm-up) takes the production path.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from pathlib import Path
from typing import Any

import torch

from generation.config import EngineConfig
from generation.engine.loop import EngineLoop, run_many
from generation.engine.prefix_cache import PrefixCache
from generation.engine.step import BatchEngine, EngineState
from generation.exactness import Divergence, check_greedy
from generation.interface import GenerationResult
from generation.model.dtypes import TORCH_DTYPES, dtype_name, resolve_dtype
from generation.model.forward import FastLlamaForward, Forward, forward_for
from generation.model.loading import (
    check_vocab_compatible,
    checkpoint_limits,
    load_causal_lm,
    output_vocab_size,
    resolve_device,
)
from generation.model.model_runner import ModelRunner, plan_slots, slot_bytes, time_batch_steps
from generation.params import SamplingParams
from generation.requests import BatchRequestError, check_prompt, collect, per_prompt
from generation.spec_decode.cost_cache import StepCostCache
from generation.spec_decode.eagle import EagleHead, EagleHeadModule, check_head_config, load_head
from generation.spec_decode.goodput import RecentAcceptance, StepCosts, measured_ks
from generation.spec_decode.suffix import SuffixMemory, suffix_available


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
        config: EngineConfig | None = None,
        eagle: EagleHeadModule | None = None,
        suffix_memory: SuffixMemory | None = None,
    ) -> None:
        """``eagle``: an EAGLE head trained on this target (generation/spec_decode/eagle.py), which serves
        method ``eagle``; it needs the engine's own forward pass of a Llama-family target.
        ``suffix_memory``: the past answers ``suffix`` requests draft from, shared with whoever
        fills it (generation/spec_decode/suffix.py; None: an empty one of the engine's own,
        where arctic-inference's suffix tree is installed)."""
        self.config = config = config or EngineConfig()
        self.device = next(target.parameters()).device
        if config.dtype is not None:  # else the models' own dtype
            want = TORCH_DTYPES[resolve_dtype(config.dtype, self.device)]
            target, draft = target.to(want), draft.to(want) if draft is not None else None
        self.target = target.eval()
        self.draft = draft.eval() if draft is not None else None
        self.dtype = dtype_name(next(self.target.parameters()).dtype)
        """The numerics of weights, KV slots and prefix blocks ("float32", "bfloat16")."""
        fast, packed = config.fast_forward, config.packed_weights
        self.target_forward: Forward = forward_for(self.target, fast, packed)
        self.draft_forward = forward_for(draft, fast, packed) if draft is not None else None
        self.eagle_head: EagleHead | None = None
        """The EAGLE head as the engine runs it (None: this engine serves no ``eagle``)."""
        if eagle is not None:
            if not isinstance(self.target_forward, FastLlamaForward):
                raise ValueError(
                    "eagle: an EAGLE head needs the engine's own forward pass of a Llama-family "
                    "target (fast_forward on; transformers' pass does not return the features)"
                )
            check_head_config(eagle.config, target.config, "the given head")
            param = next(self.target.parameters())
            eagle = eagle.to(device=param.device, dtype=param.dtype).eval()
            self.eagle_head = EagleHead(eagle, self.target_forward)
        # vocab_size, max_context, eos_token_id, model_pair: as generation.interface.Engine says.
        self.vocab_size = output_vocab_size(target)
        # The one reader of limits and EOS ids, as the vLLM engine reads them from the files.
        limits = checkpoint_limits(
            target.config,
            getattr(target, "generation_config", None),
            draft.config if draft is not None else None,
        )
        self.max_context = limits.max_context
        eos = limits.eos_token_ids
        self.eos_token_id = eos[0] if eos else None
        self.eos_token_ids = list(eos)
        """Every id that ends an answer (generation config's, then the model config's)."""
        self.model_pair = _label(target) + (f"+{_label(draft)}" if draft else "")
        if self.eagle_head is not None and self.eagle_head.module.name:
            # The head's directory too: a tuned head is a pair of its own (vLLM's engine labels
            # its speculator, draft or head, the same way).
            self.model_pair += f"+{self.eagle_head.module.name}"
        self.methods: tuple[str, ...] = ("none", "ngram")
        """The methods this engine serves (draft_model with a draft, eagle with a head)."""
        self.methods += ("draft_model",) if draft is not None else ()
        self.methods += ("eagle",) if self.eagle_head is not None else ()
        if suffix_memory is None and suffix_available():
            suffix_memory = SuffixMemory()
        if suffix_memory is not None:
            suffix_memory.set_vocab_size(self.vocab_size)
            self.methods += ("suffix",)
        self.suffix_memory: SuffixMemory | None = suffix_memory
        """The scopes' past answers ``suffix`` requests draft from (None: no ``suffix``)."""
        self.max_speculative_tokens = config.max_speculative_tokens
        models: list[Any] = [self.target_forward, self.draft_forward, self.eagle_head]
        models = [m for m in models if m is not None]
        # One round's padding: the widest draft, a fixed or "auto" k or a suffix chain.
        longest = max(config.max_speculative_tokens, config.suffix_max_speculative_tokens)
        capacity = self.max_context + longest + 1
        self.kv_bytes_per_slot = slot_bytes(models, capacity)
        """Bytes of KV one request's slot takes, target, draft and head together."""
        self.max_concurrency = plan_slots(
            models, capacity, config.max_batch_size, config.kv_memory_fraction
        )
        """Requests the engine holds at once: its KV slots (``max_batch_size``, or fewer where
        memory cannot hold them at the full context)."""
        target_fwd, draft_fwd, head = self.target_forward, self.draft_forward, self.eagle_head

        def timer(batch_size: int, ks: list[int], with_draft: bool) -> dict[int, float]:
            return time_batch_steps(target_fwd, draft_fwd if with_draft else None, batch_size, ks)

        def eagle_timer(batch_size: int, ks: list[int]) -> dict[int, float]:
            return time_batch_steps(target_fwd, None, batch_size, ks, head=head)

        self.prefix_cache = PrefixCache.for_models(
            config.prefix_cache_mb, self.target, self.draft, self.model_pair,
            config.prefix_block_size,
        )  # fmt: skip
        """KV of earlier prompts' prefixes (generation/engine/prefix_cache.py); None when reuse is off."""
        runners = [ModelRunner(m, self.max_concurrency, capacity) for m in models]
        self._core = EngineState(
            target=runners[0],
            draft=runners[1] if self.draft_forward is not None else None,
            config=config,
            device=self.device,
            eos=frozenset(eos),
            max_context=self.max_context,
            check_request=self.check_request,
            costs=StepCosts(
                timer, config.max_speculative_tokens, eagle_timer=eagle_timer if head else None
            ),
            recent={m: RecentAcceptance() for m in ("draft_model", "ngram", "suffix", "eagle")},
            prefix=self.prefix_cache,
            head=runners[-1] if head is not None else None,
            suffix_memory=suffix_memory,
        )
        self._lock = threading.Lock()
        """Held by whoever steps the KV stores: a running loop's thread, or ``generate_many``."""
        self._loop: EngineLoop | None = None

    @classmethod
    def from_pretrained(
        cls,
        target_dir: str | Path,
        draft_dir: str | Path | None = None,
        device: str | torch.device = "cpu",
        config: EngineConfig | None = None,
        dtype: str | None = None,
        eagle_dir: str | Path | None = None,
        suffix_memory: SuffixMemory | None = None,
    ) -> SpeculativeEngine:
        """Return an engine with the checkpoints loaded once; a mismatched draft or EAGLE head
        (``eagle_dir``, vLLM's EAGLE format: generation/spec_decode/eagle.py) is refused.

        ``dtype``: "float32", "bfloat16" or "auto" (None: the config's, else float32); bfloat16
        on a CPU without AMX / AVX-512 BF16 is refused before anything loads."""
        dev = resolve_device(device)
        config = config or EngineConfig()
        name = resolve_dtype(dtype or config.dtype or "float32", dev)
        config = dataclasses.replace(config, dtype=name)
        target = load_causal_lm(target_dir, dev, TORCH_DTYPES[name])
        draft = None
        if draft_dir is not None:
            draft = load_causal_lm(draft_dir, dev, TORCH_DTYPES[name])
            check_vocab_compatible(
                output_vocab_size(target), output_vocab_size(draft), target_dir, draft_dir
            )
        eagle = load_head(eagle_dir, target) if eagle_dir is not None else None
        return cls(target, draft, config=config, eagle=eagle, suffix_memory=suffix_memory)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt prefix not in use (as vLLM's ``reset_prefix_cache``);
        return how many blocks were dropped (0 when reuse is off)."""
        return self.prefix_cache.reset() if self.prefix_cache is not None else 0

    @property
    def kv_stores(self) -> list[Any]:
        """The KV store of each model (target first), allocated now if not yet."""
        core = self._core
        return [r.store for r in (core.target, core.draft, core.head) if r is not None]

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem when this engine cannot serve the request."""
        check_prompt(prompt_token_ids, params, self.vocab_size, self.max_context)
        if params.method not in self.methods:
            needs = {"draft_model": "a draft model", "suffix": "arctic-inference's suffix tree"}
            need = needs.get(params.method, "an EAGLE head")
            raise ValueError(
                f"method: {params.method!r} needs {need}; this engine has none and serves "
                f"{', '.join(self.methods)}"
            )

    def recent_alpha(self, method: str) -> float:
        """Acceptance that recent ``"auto"`` requests of ``method`` saw (a new one's prior)."""
        return self._core.recent[method].alpha

    def step_costs(self) -> StepCosts:
        """The T(B, k) tables goodput prices steps with, shared by every batch of this engine."""
        return self._core.costs

    def warmup(self, batch_sizes: tuple[int, ...] = (1,)) -> None:
        """Allocate the KV stores and measure the step costs T(B, k) of these batch sizes now
        (else the first batch of a size does)."""
        with torch.inference_mode():
            self.kv_stores  # noqa: B018 - allocated here, not in the first request
        for size in batch_sizes:
            for with_draft in (False, True) if self.draft is not None else (False,):
                self._core.costs.table(size, with_draft)
            if self.eagle_head is not None:
                self._core.costs.table(size, False, with_eagle=True)
            if self.suffix_memory is not None:
                self._core.costs.table(size, False, with_suffix=True)

    def warm_request(self, method: str, num_speculative_tokens: int | str) -> None:
        """Make ready what one request of ``method`` and k needs, alone, and nothing else: the KV
        stores; its step-cost table only for ``"auto"`` (from ``use_cost_cache``'s file when it
        holds one, else measured); and one pass of each shape its steps run (the target over
        1 + k tokens, k draft or head passes), so their kernels are made before it is timed.
        A one-shot answer's warm-up; a worker warms every table (``warmup``)."""
        if method not in self.methods:
            raise ValueError(f"method: {method!r}; this engine serves {', '.join(self.methods)}")
        with torch.inference_mode():
            self.kv_stores  # noqa: B018 - allocated here, not in the request
        with_draft, with_eagle = method == "draft_model", method == "eagle"
        k = num_speculative_tokens
        if method == "none":
            ks = [0]
        elif k == "auto":
            self._core.costs.table(1, with_draft, with_eagle, method == "suffix")
            ks = measured_ks(self.max_speculative_tokens)
        else:
            ks = [0, int(k)]
        draft = self.draft_forward if with_draft else None
        head = self.eagle_head if with_eagle else None
        time_batch_steps(self.target_forward, draft, 1, ks, repeats=0, head=head)

    def use_cost_cache(self, cache: StepCostCache | None) -> None:
        """Load step-cost tables from ``cache`` (and store measured ones there) from now on."""
        self._core.costs.cache = cache

    def cost_identity(self) -> dict[str, Any]:
        """What this engine's step costs depend on besides the checkpoints' files and the
        machine (generation/spec_decode/cost_cache.py): numerics, kernels, forwards, k_max, device."""
        forwards = [self.target_forward, self.draft_forward, self.eagle_head]
        return {
            "dtype": self.dtype,
            "device": str(self.device),
            "k_max": self.max_speculative_tokens,
            "forwards": [
                None if f is None else [type(f).__name__, getattr(f, "packed", None)]
                for f in forwards
            ],
            "model_pair": self.model_pair,
        }

    def start_loop(
        self,
        max_batch_size: int | None = None,
        *,
        prefill_chunk: int | None = None,
    ) -> EngineLoop:
        """Return a running ``EngineLoop`` (continuous batching); one at a time.

        ``max_batch_size``: at most ``max_concurrency`` (None: that). ``prefill_chunk``: most
        prompt tokens prefilled per step (None: the config's)."""
        if self._loop is not None and not self._loop.closed:
            raise RuntimeError("start_loop: this engine already runs a loop; close it first")
        pause = self.config.pause_background
        pause = self.device.type == "cpu" if pause is None else pause
        batch = BatchEngine(
            self._core, max_batch_size or self.max_concurrency, pause, prefill_chunk
        )
        self._loop = EngineLoop(batch, self._lock)
        return self._loop

    def generate_many(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams] | SamplingParams,
        *,
        max_batch_size: int | None = None,
    ) -> list[GenerationResult]:
        """Return one result per prompt, in input order, generated as one continuous batch.

        ``params``: one per prompt (or one for all). Bad requests raise ``BatchRequestError``
        naming their index after every other request was answered. While a loop runs, the
        requests join it (``max_batch_size`` and the prompt budget are then the loop's; alone:
        ``EngineConfig.batch_prefill_chunk`` prompt tokens a step)."""
        params = per_prompt(prompts, params)
        loop = self._loop
        if loop is not None and not loop.closed:
            return collect([loop.submit(p, s) for p, s in zip(prompts, params, strict=True)])
        size = min(max_batch_size or self.max_concurrency, self.max_concurrency, len(prompts))
        with self._lock:
            batch = BatchEngine(self._core, max(1, size), False, self.config.batch_prefill_chunk)
            return run_many(batch, prompts, params)

    def judge_greedy(
        self,
        prompt_token_ids: list[int],
        reference: list[int],
        other: list[int],
        *,
        reference_dtype: str | None = None,
    ) -> Divergence | None:
        """Where ``other`` (greedy tokens from this engine) first leaves ``reference`` (this
        engine's greedy ``none`` tokens after ``prompt_token_ids``): the target's top-2 logit gap
        there and the rounding tolerance (generation/exactness.py); None when they are identical.

        ``reference_dtype``: compute the target's logits in this dtype ("float32") on a copy of
        the target made for this call and dropped after it (memory: the target once more, in that
        dtype), the tolerance then being the rounding measured between it and this engine's
        numerics; None (or this engine's dtype): on this engine's own target. Runs beside a
        running loop, outside its lock: the passes read the weights, their KV is a store of their
        own, and the rotary tables already cover every position (``reference`` was just decoded
        over them), so nothing the loop uses is written. Cost on the demo target (27.5M
        parameters, bf16, a 300-token prompt, divergence at token 40, one busy thread): 1.3 s on
        its own logits, 2.3-2.7 s with a float32 copy."""
        if reference_dtype is None or reference_dtype == self.dtype:
            return check_greedy(self.target_forward, prompt_token_ids, reference, other)
        if reference_dtype not in TORCH_DTYPES:
            raise ValueError(
                f"reference_dtype: expected one of {', '.join(TORCH_DTYPES)}; "
                f"got {reference_dtype!r}"
            )
        copied = copy.deepcopy(self.target).to(TORCH_DTYPES[reference_dtype]).eval()
        fwd = forward_for(copied, self.config.fast_forward, False)
        return check_greedy(fwd, prompt_token_ids, reference, other, other_fwd=self.target_forward)

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``: a batch
        of one (a bad request raises its own error)."""
        try:
            [result] = self.generate_many([prompt_token_ids], [params], max_batch_size=1)
        except BatchRequestError as exc:
            raise exc.errors[0] from None
        return result
