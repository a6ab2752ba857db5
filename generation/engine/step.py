"""The speculative step: schedule -> prefill -> propose -> run -> verify -> postprocess.

``step`` advances every running request by one round; a lone request is a batch of one, so every
rule of a round exists once, here. The first token, sampled after a prompt's last chunk, goes
through the same postprocess as a verified round's tokens (end of sequence, budget, emit,
rollback). Each request gets what it would get alone: greedy rows the
target's greedy tokens, sampled rows the target's law, and a seeded row with a fixed k the same
tokens in any company (its random draws come from its own generator in the same order).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from generation.config import EngineConfig
from generation.engine.prefix_cache import PrefixCache
from generation.engine.scheduler import Scheduler
from generation.engine.sequence import Sequence, new_generator
from generation.handle import LoopHandle
from generation.model.dtypes import dtype_name
from generation.model.kv_store import slot_kv
from generation.model.model_runner import ModelRunner
from generation.params import SamplingParams
from generation.requests import token_budget
from generation.spec_decode.goodput import (
    Acceptance,
    RecentAcceptance,
    RowPlan,
    StepCosts,
    choose_k,
    row_k,
)
from generation.spec_decode.ngram import NgramProposer
from generation.spec_decode.proposers import propose
from generation.spec_decode.rejection_sampler import PLACEHOLDER, verify
from generation.spec_decode.sampling import sample_from_logits
from generation.spec_decode.suffix import SuffixMemory, SuffixProposer
from generation.stats import GenerationStats


@dataclass
class EngineState:
    """What every batch of one engine shares: the models on their KV stores, and policy state."""

    target: ModelRunner
    draft: ModelRunner | None
    config: EngineConfig
    device: torch.device
    eos: frozenset[int]
    max_context: int
    check_request: Callable[[list[int], SamplingParams], None]
    costs: StepCosts
    recent: dict[str, RecentAcceptance]
    """Acceptance recent ``"auto"`` requests saw, per method: the prior of a new request."""
    prefix: PrefixCache | None = None
    """KV of earlier prompts' prefixes (None: reuse off)."""
    head: ModelRunner | None = None
    """The EAGLE head on its own KV store (generation/spec_decode/eagle.py; None: no ``eagle`` method)."""
    suffix_memory: SuffixMemory | None = None
    """Past answers per scope that ``suffix`` requests draft from (None: no ``suffix`` method)."""


class BatchEngine:
    """Running requests of one engine, advanced together one round per step."""

    def __init__(
        self,
        core: EngineState,
        max_batch_size: int,
        pause_background: bool,
        prefill_chunk: int | None = None,
    ) -> None:
        config = core.config
        if not 1 <= max_batch_size <= core.target.num_slots:
            raise ValueError(
                f"max_batch_size: must be in [1, {core.target.num_slots}] (the engine's KV "
                f"slots), got {max_batch_size}"
            )
        self.core = core
        self.scheduler = Scheduler(
            max_batch_size,
            config.prefill_chunk if prefill_chunk is None else prefill_chunk,
            self._move,
            pause_background,
            config.background_prefill_chunk if pause_background else None,
            config.max_background_pause,
        )
        self._next_id = 0

    def _move(self, src: int, dst: int) -> None:
        for runner in (self.core.target, self.core.draft, self.core.head):
            if runner is not None:
                runner.store.move(src, dst)

    def add(
        self,
        prompt: list[int],
        params: SamplingParams,
        handle: LoopHandle,
        background: bool = False,
    ) -> None:
        """Queue a request; a bad one fails ``handle`` with the error instead."""
        core = self.core
        try:
            core.check_request(prompt, params)
        except (TypeError, ValueError) as exc:
            handle.fail(exc)
            return
        prompt = [int(t) for t in prompt]
        seq = Sequence(
            request_id=self._next_id,
            prompt=prompt,
            params=params,
            handle=handle,
            budget=token_budget(len(prompt), params, core.max_context),
            generator=new_generator(params, core.device),
            background=background,
            stats=GenerationStats(
                method=params.method,
                num_speculative_tokens=params.num_speculative_tokens,
                dtype=dtype_name(core.target.fwd.dtype),
            ),
        )
        self._next_id += 1
        if params.method == "ngram":
            seq.ngram = NgramProposer(max_n=core.config.ngram_max_n)
        elif params.method == "suffix":
            config = core.config
            seq.suffix = SuffixProposer(
                core.suffix_memory, params.suffix_scope, config.suffix_max_depth,
                config.suffix_max_spec_factor, config.suffix_min_token_prob,
                config.suffix_max_speculative_tokens,
            )  # fmt: skip
        if params.method != "none":
            seq.acceptance = Acceptance(prior_alpha=core.recent[params.method].alpha)
        self.scheduler.add(seq)

    def fail_all(self, error: BaseException) -> None:
        """Fail every waiting and running request with ``error`` and free their slots."""
        for seq in [*self.scheduler.waiting, *self.scheduler.running]:
            self.scheduler.release(seq)
            seq.handle.fail(error)

    @torch.inference_mode()
    def step(self) -> None:
        """Advance every running request by one round."""
        for seq, logits in self._prefill(self._schedule()):  # prompts whose last chunk ran
            first = int(sample_from_logits(logits, seq.temperature, seq.generator).item())
            seq.stats.ttft_ms = (time.perf_counter() - seq.arrived) * 1000.0
            seq.stats.num_output_tokens = self._postprocess(seq, [first])
        self._release_finished()
        rows = self.scheduler.decoding()
        if not rows:
            return
        started = time.perf_counter()
        for seq in rows:
            seq.last_step = started
        plans = [_plan(seq) for seq in rows]
        batch_k = choose_k(plans, self.core.costs)
        ks = [row_k(plan, batch_k) for plan in plans]
        drafts = propose(rows, ks, self.core.draft, self.core.device, self.core.head)
        logits, hidden = self._run(rows, drafts.token_ids)  # [B, 1 + k, vocab], [B, 1 + k, H]
        emitted = verify(logits, drafts, [s.temperature for s in rows], [s.generator for s in rows])
        for b, seq in enumerate(rows):
            num_draft = drafts.num_tokens[b]
            row = emitted[b]
            row = row[: row.index(PLACEHOLDER)] if PLACEHOLDER in row else row
            accepted = len(row) - 1
            if seq.acceptance is not None:
                seq.acceptance.observe(num_draft, accepted)
            kept = self._postprocess(seq, row, num_draft, None if hidden is None else hidden[b])
            seq.stats.record_round(num_draft, min(accepted, kept), kept)
            seq.batch_size_sum += len(rows)
            seq.chosen_k_sum += ks[b]
        self.core.costs.observe(
            len(rows),
            any(p.uses_draft_model for p in plans),
            any(p.uses_eagle for p in plans),
            drafts.token_ids.shape[1],  # the width verified (a suffix chain may be shorter)
            time.perf_counter() - started,
            any(p.uses_suffix for p in plans),
        )
        self._release_finished()

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """Decide who runs: drop cancelled requests, give free slots to waiting ones; return the
        prompt chunks to prefill this step (the rows that decode are those whose prompt is in)."""
        for seq in [*self.scheduler.waiting, *self.scheduler.running]:
            if seq.handle.cancel_requested:
                self.scheduler.release(seq)
                seq.handle.fail(seq.cancelled())
        for seq in self.scheduler.admit():
            # the new occupant's slot is empty
            for runner in (self.core.target, self.core.draft, self.core.head):
                if runner is not None:
                    runner.set_length(seq.slot, 0)
        return self.scheduler.prefill_plan()

    def _prefill(self, chunks: list[tuple[Sequence, int]]) -> list[tuple[Sequence, torch.Tensor]]:
        """Prefill each chunk; return the requests whose prompt is now in, each with the target's
        logits after its last prompt token [vocab]."""
        core = self.core
        now = time.perf_counter()
        done = []
        for seq, count in chunks:
            seq.last_step = now
            if seq.prefilled == 0 and core.prefix is not None:
                # Looked up at the first chunk, not at admission: a request admitted beside
                # another with the same passage reuses what that one's prefill kept earlier in
                # this step.
                self._reuse_prefix(seq, core.prefix)
                count = min(count, len(seq.prompt) - seq.prefilled)
            chunk = seq.prompt[seq.prefilled : seq.prefilled + count]
            if seq.params.method == "eagle":  # the head reads the prompt's features
                logits, hidden = core.target.prefill_hidden(seq.slot, chunk)
                seq.features = _append(seq.features, hidden)
            else:
                logits = core.target.prefill(seq.slot, chunk)
            if seq.params.method == "draft_model":
                assert core.draft is not None
                core.draft.fill(seq.slot, chunk)  # its first proposal runs next step
            seq.prefilled += count
            if seq.prefilled == len(seq.prompt):
                if core.prefix is not None:
                    core.prefix.keep(seq.prompt, *self._slots(seq), seq.params.cache_salt)
                seq.tokens = list(seq.prompt)
                done.append((seq, logits))
        return done

    def _slots(self, seq: Sequence) -> tuple[Any, Any]:
        """The request's slot in the target's store and, if it drafts with it, the draft's."""
        core = self.core
        drafting = seq.params.method == "draft_model" and core.draft is not None
        draft = slot_kv(core.draft.store, seq.slot) if drafting and core.draft else None
        return slot_kv(core.target.store, seq.slot), draft

    def _reuse_prefix(self, seq: Sequence, prefix: PrefixCache) -> None:
        """Start the request's slots with its longest cached prefix; prefill resumes after it."""
        target, draft = self._slots(seq)
        cached = prefix.reuse(seq.prompt, target, draft, seq.params.cache_salt)
        if cached:
            self.core.target.set_length(seq.slot, cached)
            if draft is not None and self.core.draft is not None:
                self.core.draft.set_length(seq.slot, cached)
        seq.prefilled = cached
        seq.head_base = cached  # the reused positions' features were never computed
        seq.stats.num_cached_prompt_tokens = cached

    def _run(
        self, rows: list[Sequence], drafts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the target over each row's last token and drafts [B, k]; return logits and,
        when an EAGLE row is among them, the final hidden states (its features)."""
        last = torch.tensor([[s.last_token] for s in rows], dtype=torch.long, device=drafts.device)
        input_ids = torch.cat([last, drafts], dim=1)  # [B, 1 + k]
        counts = [input_ids.shape[1]] * len(rows)  # padding is written past the length, unread
        slots = [s.slot for s in rows]
        if self.core.head is not None and any(s.params.method == "eagle" for s in rows):
            return self.core.target.run_hidden(slots, input_ids, counts)
        return self.core.target.run(slots, input_ids, counts), None

    def _postprocess(
        self,
        seq: Sequence,
        emitted: list[int],
        num_draft: int = 0,
        hidden: torch.Tensor | None = None,  # [1 + k, hidden]: the round's target features
    ) -> int:
        """Append ``emitted`` (a round's accepted drafts and its recovered or bonus token, or
        the first token alone), stop at end of sequence or the budget, roll the slots back to
        what stays valid, emit; return how many tokens were kept."""
        core = self.core
        accepted = len(emitted) - 1
        for i, token in enumerate(emitted):
            if token in core.eos:
                emitted = emitted[: i + 1]
                seq.finished = True
                break
        before = len(seq.tokens)  # the target's slot holds all but the newest of these
        seq.output.extend(emitted)
        seq.tokens.extend(emitted)
        seq.last_token = emitted[-1]
        seq.finished = seq.finished or len(seq.output) >= seq.budget
        # Rollback is a length: the target's slot keeps the last token and the accepted drafts;
        # the draft's keeps the drafts it was fed (all but the last) that were accepted.
        core.target.set_length(seq.slot, before + accepted)
        if num_draft and core.draft is not None and seq.params.method == "draft_model":
            core.draft.set_length(seq.slot, before + min(accepted, num_draft - 1))
        if hidden is not None and core.head is not None and seq.params.method == "eagle":
            # The head keeps the entries fed with true features (the target's length before
            # the round); the features of the last token and accepted drafts come next round.
            if num_draft:
                core.head.set_length(seq.slot, before - 1 - seq.head_base)
            seq.features = _append(seq.features, hidden[: accepted + 1])
        seq.handle.emit(emitted)
        return len(emitted)

    def _release_finished(self) -> None:
        for seq in [s for s in self.scheduler.running if s.finished]:
            self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.release(seq)
        if seq.acceptance is not None and seq.params.num_speculative_tokens == "auto":
            self.core.recent[seq.params.method].update(seq.acceptance.request_alpha())
        seq.handle.finish(seq.result())


def _plan(seq: Sequence) -> RowPlan:
    method = seq.params.method
    return RowPlan(
        alpha=seq.acceptance.alpha if seq.acceptance is not None else 0.0,
        cap=0 if method == "none" else seq.remaining - 1,
        fixed_k=seq.fixed_k,
        uses_draft_model=method == "draft_model",
        uses_eagle=method == "eagle",
        uses_suffix=method == "suffix",
    )


def _append(features: torch.Tensor | None, more: torch.Tensor) -> torch.Tensor:
    """Pending EAGLE features [m, hidden] with ``more`` after them."""
    return more if features is None else torch.cat([features, more])
