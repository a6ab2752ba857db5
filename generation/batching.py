"""The continuous-batching step: schedule -> propose -> verify -> accept -> postprocess.

One ``step`` advances every running request by one speculative round:

- schedule: cancelled requests leave, waiting ones take free slots, prompts are prefilled (in
  chunks) and each request's first token is sampled; the batch's k is chosen by goodput
  (generation/goodput.py);
- propose: n-gram rows look their drafts up; draft-model rows draft together, one batched draft
  pass per draft position;
- verify: one target pass over ``[B, 1 + max k]`` (last token + drafts, right-padded);
- accept: per row, greedy (the drafts the target's argmax agrees with) or rejection sampling
  with the row's own generator;
- postprocess: append tokens, stream them, stop at EOS or budget, free finished slots, and roll
  each slot back to its accepted length.

Each request gets what it would get alone: greedy rows the target's greedy tokens, sampled rows
the target's law, and a seeded row with a fixed k the very tokens ``generate`` gives it (its
random draws come from its own generator in the same order).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from generation.adaptive import AdaptiveK
from generation.goodput import RowPlan, StepCosts, choose_k, row_k
from generation.model_runner import ModelRunner
from generation.params import SamplingParams
from generation.proposers import NgramProposer
from generation.rejection_sampler import rejection_sample, sample_from_logits
from generation.scheduler import Scheduler
from generation.sequence import LoopHandle, Sequence, new_generator
from generation.stats import GenerationStats

if TYPE_CHECKING:
    from generation.torch_engine import SpeculativeEngine

DEFAULT_PREFILL_CHUNK = 512


class BatchEngine:
    """Running requests of one ``SpeculativeEngine``, advanced together one round per step."""

    def __init__(
        self,
        engine: SpeculativeEngine,
        max_batch_size: int,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        pause_background: bool = False,
        background_chunk: int | None = None,
        max_background_pause: float = 5.0,
    ) -> None:
        self.engine = engine
        self.target = ModelRunner(engine.target_forward, "target")
        draft_fwd = engine.draft_forward
        self.draft = None if draft_fwd is None else ModelRunner(draft_fwd, "draft")
        self.scheduler = Scheduler(
            max_batch_size,
            prefill_chunk,
            self._move,
            pause_background,
            background_chunk,
            max_background_pause,
        )
        self.costs: StepCosts = engine.step_costs()
        self._eos = set(engine.eos_token_ids)
        self._next_id = 0

    def _move(self, src: int, dst: int) -> None:
        self.target.move(src, dst)
        if self.draft is not None:
            self.draft.move(src, dst)

    def preallocate(self) -> None:
        """Reserve every slot's KV cache for the full context now (an online loop's start).

        Otherwise the caches grow by doubling when a longer request joins, and a growth copies
        every running row's keys and values: about a second for 9 slots growing to 2,048
        positions on the demo target, a stall for every row (docs/benchmarks.md, "stall").
        ``app.serving.check_concurrency`` has already checked that this much memory is there.
        """
        length = self.engine.max_context + self.engine.max_speculative_tokens + 1
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.cache.reserve(self.scheduler.max_batch_size, length)

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.has_work

    def add(
        self,
        prompt: list[int],
        params: SamplingParams,
        handle: LoopHandle,
        background: bool = False,
    ) -> bool:
        """Queue a request; a bad one fails ``handle`` with the error instead (returns False).

        ``background``: a batch job's request (generation/scheduler.py)."""
        try:
            self.engine.check_request(prompt, params)
        except (TypeError, ValueError) as exc:
            handle.fail(exc)
            return False
        prompt = [int(t) for t in prompt]
        engine = self.engine
        seq = Sequence(
            request_id=self._next_id,
            prompt=prompt,
            params=params,
            handle=handle,
            budget=min(params.max_new_tokens, engine.max_context - len(prompt)),
            generator=new_generator(params, engine.device),
            background=background,
            stats=GenerationStats(
                method=params.method, num_speculative_tokens=params.num_speculative_tokens
            ),
        )
        self._next_id += 1
        if params.method != "none":
            # Only its acceptance estimate is used: the batch's k comes from goodput.
            seq.adaptive = AdaptiveK(
                cost=None,
                k_max=engine.max_speculative_tokens,
                prior_alpha=engine.recent_alpha(params.method),
            )
        self.scheduler.add(seq)
        return True

    def fail_all(self, error: BaseException) -> None:
        """Fail every waiting and running request with ``error`` and free their slots."""
        for seq in [*self.scheduler.waiting, *self.scheduler.running]:
            self.scheduler.release(seq)
            seq.handle.fail(error)

    # ---------------------------------------------------------------- schedule
    def _schedule(self) -> list[Sequence]:
        """Drop cancelled requests, admit and prefill; return the rows that decode this step."""
        for seq in [*self.scheduler.waiting, *self.scheduler.running]:
            if seq.handle.cancel_requested:
                self.scheduler.release(seq)
                seq.handle.fail(seq.cancelled())
        for seq in self.scheduler.admit():
            # Room for the whole request at once (prompt, budget, one round's padding), and
            # slots for a full batch: the caches grow once, not as requests join.
            need = len(seq.prompt) + seq.budget + self.engine.max_speculative_tokens + 1
            for runner in (self.target, self.draft):
                if runner is not None:
                    runner.cache.reserve(self.scheduler.max_batch_size, need)
                    runner.clear(seq.slot)
        now = time.perf_counter()
        for seq, count in self.scheduler.prefill_plan():
            seq.last_step = now
            self._prefill(seq, count)
        for seq in [s for s in self.scheduler.running if s.finished]:
            self._finish(seq)
        return self.scheduler.decoding()

    def _prefill(self, seq: Sequence, count: int) -> None:
        chunk = seq.prompt[seq.prefilled : seq.prefilled + count]
        logits = self.target.prefill(seq.slot, chunk)
        if seq.params.method == "draft_model":
            assert self.draft is not None
            self.draft.prefill(seq.slot, chunk)
        seq.prefilled += count
        if seq.prefilled < len(seq.prompt):
            return
        first = int(sample_from_logits(logits, seq.temperature, seq.generator).item())
        seq.output.append(first)
        seq.tokens = seq.prompt + [first]
        seq.last_token = first
        seq.stats.ttft_ms = (time.perf_counter() - seq.arrived) * 1000.0
        seq.stats.num_output_tokens = 1
        seq.handle.emit([first])
        seq.finished = first in self._eos or seq.budget <= 1
        if seq.params.method == "ngram" and not seq.finished:
            seq.ngram = NgramProposer(self.engine.device, max_n=self.engine.ngram_max_n)
            seq.ngram.begin(seq.tokens)

    # ---------------------------------------------------------------- step
    @torch.inference_mode()
    def step(self) -> None:
        """Advance every running request by one round (see the module docstring)."""
        rows = self._schedule()
        if not rows:
            return
        started = time.perf_counter()
        for seq in rows:
            seq.last_step = started
        plans = [self._plan(seq) for seq in rows]
        batch_k = choose_k(plans, self.costs)
        ks = [row_k(plan, batch_k) for plan in plans]
        drafts, draft_probs = self._propose(rows, ks)
        verified = self._verify(rows, drafts)
        for b, seq in enumerate(rows):
            accepted, token = self._accept(seq, verified, b, drafts[b], draft_probs[b])
            self._postprocess(seq, drafts[b], accepted, token, len(rows), ks[b])
        width = max(ks)
        self.costs.observe(
            len(rows), width, any(p.uses_draft_model for p in plans), time.perf_counter() - started
        )
        for seq in [s for s in self.scheduler.running if s.finished]:
            self._finish(seq)

    def _plan(self, seq: Sequence) -> RowPlan:
        method = seq.params.method
        return RowPlan(
            alpha=seq.adaptive.alpha if seq.adaptive is not None else 0.0,
            cap=0 if method == "none" else seq.remaining - 1,
            fixed_k=seq.fixed_k,
            uses_draft_model=method == "draft_model",
        )

    def _propose(
        self, rows: list[Sequence], ks: list[int]
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Return each row's draft tokens and, for sampled draft-model rows, their probs."""
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[torch.Tensor | None] = [None for _ in rows]
        model_rows = []
        for b, (seq, k) in enumerate(zip(rows, ks, strict=True)):
            if k == 0:
                continue
            if seq.ngram is not None:
                lookup = seq.ngram.propose(seq.tokens, k, seq.temperature, seq.generator)
                drafts[b] = lookup.token_ids.tolist()
            elif seq.params.method == "draft_model":
                model_rows.append(b)
        if model_rows:
            found = self._propose_with_model(
                [rows[b] for b in model_rows], [ks[b] for b in model_rows]
            )
            for b, (draft, draft_probs) in zip(model_rows, found, strict=True):
                drafts[b], probs[b] = draft, draft_probs
        return drafts, probs

    def _propose_with_model(
        self, rows: list[Sequence], ks: list[int]
    ) -> list[tuple[list[int], torch.Tensor | None]]:
        """Draft ``ks[i]`` tokens for each row with the draft model, one batched pass a position."""
        runner = self.draft
        assert runner is not None
        device = self.engine.device
        slots = [seq.slot for seq in rows]
        # The draft's slot lags the sequence by the tokens it has not seen (1 or 2 after a
        # round, more after rounds that drafted nothing): they are fed first.
        pending = [seq.tokens[runner.length(seq.slot) :] for seq in rows]
        width = max(len(p) for p in pending)
        input_ids = torch.tensor(
            [p + [0] * (width - len(p)) for p in pending], dtype=torch.long, device=device
        )
        counts = [len(p) for p in pending]
        tokens: list[list[torch.Tensor]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        for position in range(max(ks)):
            logits = runner.run(slots, input_ids, counts, last_only=True)  # [R, vocab]
            greedy = logits.argmax(dim=-1, keepdim=True)  # [R, 1]
            for i, seq in enumerate(rows):
                if position >= ks[i]:
                    tokens[i].append(greedy[i])
                    continue
                if seq.temperature == 0.0:
                    tokens[i].append(greedy[i])
                else:
                    p = torch.softmax(logits[i] / seq.temperature, dim=-1)  # [vocab]
                    tokens[i].append(torch.multinomial(p, 1, generator=seq.generator))
                    probs[i].append(p)
            input_ids = torch.stack([t[-1] for t in tokens])  # [R, 1]
            counts = [1 if position + 1 < k else 0 for k in ks]
        host = torch.stack([torch.cat(t) for t in tokens]).tolist()  # [R, max k]
        found = []
        for i, seq in enumerate(rows):
            k = ks[i]
            # Every draft token but the last entered the draft's slot.
            runner.set_length(seq.slot, len(seq.tokens) + k - 1)
            found.append((host[i][:k], torch.stack(probs[i]) if probs[i] else None))
        return found

    def _verify(self, rows: list[Sequence], drafts: list[list[int]]) -> torch.Tensor:
        """Run the target over each row's last token and drafts; return logits [B, n, vocab]."""
        width = 1 + max(len(d) for d in drafts)
        ids = [
            [seq.last_token, *d] + [0] * (width - 1 - len(d))
            for seq, d in zip(rows, drafts, strict=True)
        ]
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.engine.device)
        counts = [1 + len(d) for d in drafts]
        logits = self.target.run([seq.slot for seq in rows], input_ids, counts)
        self._argmax = logits.argmax(dim=-1).tolist()  # [B, n] on the host: one transfer
        return logits

    def _accept(
        self,
        seq: Sequence,
        logits: torch.Tensor,  # [B, n, vocab]
        b: int,
        draft: list[int],
        draft_probs: torch.Tensor | None,  # [k, vocab] or None (one-hot)
    ) -> tuple[int, int]:
        """Return (accepted draft tokens, the recovered or bonus token) of row ``b``."""
        k = len(draft)
        if seq.temperature == 0.0:
            # Greedy: keep drafts while they equal the target's argmax (ties to the lowest
            # id); the next token is the argmax after the last kept one.
            argmax = self._argmax[b]
            accepted = 0
            while accepted < k and draft[accepted] == argmax[accepted]:
                accepted += 1
            return accepted, argmax[accepted]
        if k == 0:
            return 0, int(sample_from_logits(logits[b, 0], seq.temperature, seq.generator).item())
        target_probs = torch.softmax(logits[b, : k + 1] / seq.temperature, dim=-1)
        draft_ids = torch.tensor(draft, dtype=torch.long, device=logits.device)
        num, token = rejection_sample(target_probs, draft_probs, draft_ids, seq.generator)
        return int(num.item()), int(token.item())

    def _postprocess(
        self, seq: Sequence, draft: list[int], accepted: int, token: int, batch: int, k: int
    ) -> None:
        num_draft = len(draft)
        emitted = draft[:accepted] + [token]
        if num_draft and seq.adaptive is not None:
            seq.adaptive.observe(num_draft, accepted)
        for i, t in enumerate(emitted):
            if t in self._eos:
                emitted = emitted[: i + 1]
                seq.finished = True
                break
        seq.stats.record_round(num_draft, min(accepted, len(emitted)), len(emitted))
        seq.batch_size_sum += batch
        seq.chosen_k_sum += k
        seq.output.extend(emitted)
        seq.tokens.extend(emitted)
        seq.last_token = emitted[-1]
        seq.finished = seq.finished or len(seq.output) >= seq.budget
        # Rollback is a length: the target's slot keeps the last token and the accepted drafts.
        self.target.set_length(seq.slot, self.target.length(seq.slot) - num_draft + accepted)
        if num_draft and seq.params.method == "draft_model":
            assert self.draft is not None
            stale = max(0, num_draft - 1 - accepted)
            self.draft.set_length(seq.slot, self.draft.length(seq.slot) - stale)
        seq.handle.emit(emitted)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.release(seq)
        if seq.adaptive is not None and seq.params.num_speculative_tokens == "auto":
            self.engine.record_acceptance(seq.params.method, seq.adaptive.request_alpha())
        seq.handle.finish(seq.result())
