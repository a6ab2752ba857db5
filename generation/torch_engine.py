"""The built-in PyTorch engine: speculative decoding over Hugging Face models and KV caches.

Read top to bottom: ``prefill`` fills the target's cache with the prompt and yields the first
token; each round a proposer drafts k tokens, ``speculative_decode`` verifies them in one target
pass and rolls the caches back to the last accepted position; ``decode_one_token`` is the plain
round when nothing was drafted (method ``none``, no n-gram match, or one token left).
Models run through generation/forward.py: Llama-family models on the engine's own forward
pass (same weights, same operations, less overhead), others on transformers' forward.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from generation.adaptive import AdaptiveK, CostModel, RecentAcceptance
from generation.base import GenerationResult, check_prompt
from generation.config import EngineConfig
from generation.costs import measure_costs, time_batch_steps
from generation.engine_loop import EngineLoop, run_many
from generation.forward import Forward, forward_for
from generation.goodput import StepCosts
from generation.loading import (
    check_vocab_compatible,
    eos_token_ids,
    load_causal_lm,
    max_context,
    output_vocab_size,
    resolve_device,
)
from generation.params import SamplingParams
from generation.proposers import Draft, DraftModelProposer, NgramProposer, Proposer
from generation.rejection_sampler import greedy_verify, rejection_sample, sample_from_logits
from generation.sequence import new_generator
from generation.stats import GenerationStats


def prefill(model: Forward, input_ids: torch.Tensor, cache: Any) -> torch.Tensor:
    """Run the prompt ``input_ids`` [1, seq_len] through ``model``; return the last logits [vocab]."""
    return model(input_ids, cache, logits_to_keep=1)[-1].float()


def decode_one_token(model: Forward, token: torch.Tensor, cache: Any) -> torch.Tensor:
    """Feed one token [1] to ``model`` on its cache; return the next logits [vocab_size]."""
    return model(token.view(1, 1), cache)[-1].float()


def speculative_decode(
    target: Forward,
    cache: Any,
    last_token: torch.Tensor,  # [1]: emitted, not yet in the target's cache
    draft: Draft,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[int, list[int], torch.Tensor]:
    """Verify ``draft`` in one target pass; return (num_accepted, emitted ids, next token [1]).

    The emitted ids are the accepted draft tokens followed by the recovered or bonus token; the
    target's cache is cropped so that it ends at the last accepted draft token.
    """
    k = draft.token_ids.shape[0]
    input_ids = torch.cat([last_token, draft.token_ids]).view(1, k + 1)
    logits = target(input_ids, cache).float()  # [k + 1, vocab_size]
    if temperature == 0.0:
        num_accepted, next_token = greedy_verify(logits, draft.token_ids)
    else:
        target_probs = torch.softmax(logits / temperature, dim=-1)  # [k + 1, vocab_size]
        num_accepted, next_token = rejection_sample(
            target_probs, draft.probs, draft.token_ids, generator
        )
    # The one host transfer of the round: the algorithm needs the accepted count here.
    host = torch.cat([num_accepted, next_token, draft.token_ids]).tolist()
    accepted = host[0]
    if accepted < k:
        cache.crop(accepted - k)
    return accepted, host[2 : 2 + accepted] + [host[1]], next_token


def cut_at_eos(emitted: list[int], eos: Collection[int]) -> tuple[list[int], bool]:
    """Return the tokens up to and including the first end-of-sequence token, and whether one was."""
    for i, token in enumerate(emitted):
        if token in eos:
            return emitted[: i + 1], True
    return emitted, False


def _label(model: Any) -> str:
    name = str(getattr(model.config, "_name_or_path", "") or "")
    return Path(name).name if name else type(model).__name__


@dataclass
class _Run:
    """One ``generate`` call's state between rounds: what a round reads and advances."""

    started: float
    temperature: float
    generator: torch.Generator | None
    cache: Any  # the target's KV cache (generation/kv_cache.py)
    budget: int  # most new tokens: max_new_tokens, within the context
    proposer: Proposer | None
    adaptive: AdaptiveK | None  # None: a fixed k
    fixed_k: int
    stats: GenerationStats
    tokens: list[int]  # prompt + output
    output: list[int]
    last_token: torch.Tensor  # the newest token, not yet in the cache
    finished: bool


class SpeculativeEngine:
    """A target (and optional draft) on one device that generates with speculative decoding."""

    def __init__(
        self,
        target: Any,
        draft: Any | None = None,
        *,
        model_pair: str | None = None,
        config: EngineConfig | None = None,
        costs: dict[str, CostModel] | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        fast_forward = config.fast_forward
        self.target = target.eval()
        self.draft = draft.eval() if draft is not None else None
        self.device = next(target.parameters()).device
        # How each model runs (generation/forward.py); fast_forward=False keeps transformers'.
        self._target_fwd = forward_for(self.target, fast_forward)
        self._draft_fwd = (
            None
            if self.draft is None
            else self._target_fwd
            if self.draft is self.target  # draft = target (an efficiency check): one forward
            else forward_for(self.draft, fast_forward)
        )
        self.max_speculative_tokens = config.max_speculative_tokens
        self.ngram_max_n = config.ngram_max_n
        self._vocab_size = output_vocab_size(target)
        self._max_context = min(max_context(m.config) for m in (target, draft) if m is not None)
        self._eos = eos_token_ids(target)
        self._model_pair = model_pair or _label(target) + (f"+{_label(draft)}" if draft else "")
        self._costs: dict[str, CostModel] = dict(costs or {})
        """Per-method costs for adaptive k; measured on first use when not given."""
        self._recent = {"draft_model": RecentAcceptance(), "ngram": RecentAcceptance()}
        self.max_batch_size = config.max_batch_size
        self._step_costs: StepCosts | None = None

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

    @property
    def target_forward(self) -> Forward:
        """The target as the engine runs it (generation/forward.py)."""
        return self._target_fwd

    @property
    def draft_forward(self) -> Forward | None:
        """The draft as the engine runs it, if there is one."""
        return self._draft_fwd

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
    def model_pair(self) -> str:
        """A short label of the loaded target/draft pair."""
        return self._model_pair

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem when this engine cannot serve the request."""
        check_prompt(prompt_token_ids, params, self.vocab_size, self.max_context)
        if params.method == "draft_model" and self.draft is None:
            raise ValueError("method: 'draft_model' needs a draft model; this engine has none")

    def _proposer(self, method: str) -> Proposer | None:
        if method == "draft_model":
            assert self._draft_fwd is not None
            return DraftModelProposer(self._draft_fwd)
        if method == "ngram":
            return NgramProposer(self.device, max_n=self.ngram_max_n)
        return None

    def warmup(self, batch_sizes: tuple[int, ...] = ()) -> None:
        """Measure the adaptive-k costs now (else the first ``"auto"`` request of a method does).

        A few dozen forward passes; also warms the kernels a first request would wait on.
        ``batch_sizes``: also measure the batch engine's step costs T(B, k) for these sizes.
        """
        for method in ("draft_model", "ngram") if self.draft is not None else ("ngram",):
            self._adaptive(method)
        for size in batch_sizes:
            self.step_costs().table(size, False)
            if self.draft is not None:
                self.step_costs().table(size, True)

    @property
    def eos_token_ids(self) -> list[int]:
        """Every end-of-sequence id of the target."""
        return list(self._eos)

    def recent_alpha(self, method: str) -> float:
        """Acceptance that recent requests of ``method`` saw (the prior of a new request)."""
        return self._recent[method].alpha

    def record_acceptance(self, method: str, alpha: float | None) -> None:
        """Fold a finished ``"auto"`` request's acceptance into the method's recent average."""
        self._recent[method].update(alpha)

    def step_costs(self) -> StepCosts:
        """The batch engine's T(B, k) tables, shared by every loop of this engine."""
        if self._step_costs is None:
            target, draft = self._target_fwd, self._draft_fwd

            def timer(batch_size: int, ks: list[int], with_draft: bool) -> dict[int, float]:
                return time_batch_steps(target, draft if with_draft else None, batch_size, ks)

            self._step_costs = StepCosts(timer, self.max_speculative_tokens)
        return self._step_costs

    def start_loop(
        self, max_batch_size: int | None = None, *, prefill_chunk: int | None = None
    ) -> EngineLoop:
        """Return a running ``EngineLoop`` (continuous batching) over this engine.

        ``prefill_chunk``: most prompt tokens prefilled per step while others decode
        (``SPECRAG_PREFILL_CHUNK``; None: ``DEFAULT_PREFILL_CHUNK``).
        """
        chunk = self.config.prefill_chunk if prefill_chunk is None else prefill_chunk
        return EngineLoop(self, max_batch_size or self.max_batch_size, chunk)

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
        after every other request was answered (its ``results`` hold the others).
        """
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        return run_many(self, prompts, params, max_batch_size or self.max_batch_size)

    def _adaptive(self, method: str) -> AdaptiveK:
        if method not in self._costs:
            self._costs[method] = measure_costs(
                self._target_fwd,
                self._draft_fwd if method == "draft_model" else None,
                self.max_speculative_tokens,
            )
        return AdaptiveK(
            cost=self._costs[method],
            k_max=self.max_speculative_tokens,
            prior_alpha=self._recent[method].alpha,
        )

    @torch.inference_mode()
    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``.

        Prefill and the first token, then speculative rounds (``_round``) until EOS or the
        budget; the adaptive policy's acceptance is folded into the method's recent average.
        """
        self.check_request(prompt_token_ids, params)
        run = self._start([int(t) for t in prompt_token_ids], params)
        while not run.finished:
            self._round(run)
        if run.adaptive is not None:
            self._recent[params.method].update(run.adaptive.request_alpha())
        run.stats.generation_ms = (time.perf_counter() - run.started) * 1000.0
        return GenerationResult(token_ids=run.output, stats=run.stats)

    def _start(self, prompt: list[int], params: SamplingParams) -> _Run:
        """Prefill ``prompt`` and sample the first token: the state the rounds advance."""
        started = time.perf_counter()
        generator = new_generator(params, self.device)
        cache = self._target_fwd.new_cache()
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
        temperature = float(params.temperature)
        last = sample_from_logits(prefill(self._target_fwd, ids, cache), temperature, generator)
        output = last.tolist()
        stats = GenerationStats(
            method=params.method, num_speculative_tokens=params.num_speculative_tokens
        )
        stats.ttft_ms = (time.perf_counter() - started) * 1000.0
        stats.num_output_tokens = 1
        budget = min(params.max_new_tokens, self.max_context - len(prompt))
        proposer = self._proposer(params.method)
        auto = proposer is not None and params.num_speculative_tokens == "auto"
        run = _Run(
            started=started,
            temperature=temperature,
            generator=generator,
            cache=cache,
            budget=budget,
            proposer=proposer,
            adaptive=self._adaptive(params.method) if auto else None,
            fixed_k=(
                params.num_speculative_tokens
                if isinstance(params.num_speculative_tokens, int)
                else 0
            ),
            stats=stats,
            tokens=prompt + output,
            output=output,
            last_token=last,
            finished=output[0] in self._eos or budget == 1,
        )
        if proposer is not None and not run.finished:
            proposer.begin(run.tokens)
        return run

    def _round(self, run: _Run) -> None:
        """One round: draft k tokens (k from the policy), verify them in one target pass,
        emit the accepted ones and the target's next token, stop at EOS or the budget."""
        round_started = time.perf_counter()
        proposer, adaptive = run.proposer, run.adaptive
        k = adaptive.next_k() if adaptive is not None else run.fixed_k
        # Never draft past the budget: a round emits at most k + 1 tokens.
        k = min(k, run.budget - len(run.output) - 1) if proposer is not None else 0
        draft = (
            proposer.propose(run.tokens, k, run.temperature, run.generator)
            if proposer is not None and k
            else None
        )
        num_draft = 0 if draft is None else int(draft.token_ids.shape[0])
        if draft is None or num_draft == 0:
            logits = decode_one_token(self._target_fwd, run.last_token, run.cache)
            run.last_token = sample_from_logits(logits, run.temperature, run.generator)
            accepted, emitted = 0, run.last_token.tolist()
        else:
            accepted, emitted, run.last_token = speculative_decode(
                self._target_fwd, run.cache, run.last_token, draft, run.temperature, run.generator
            )
        if num_draft and adaptive is not None:
            adaptive.observe(num_draft, accepted)
            assert adaptive.cost is not None
            adaptive.cost.observe(num_draft, time.perf_counter() - round_started)
        emitted, eos = cut_at_eos(emitted, self._eos)
        run.stats.record_round(num_draft, min(accepted, len(emitted)), len(emitted))
        run.output.extend(emitted)
        run.tokens.extend(emitted)
        run.finished = eos or len(run.output) >= run.budget
        if proposer is not None and num_draft and not run.finished:
            proposer.rollback(run.tokens, num_draft, accepted)
