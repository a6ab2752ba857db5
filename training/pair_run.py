"""The pair's training run state: both models, their AdamW optimizers and the loop's counters.

``training.train_demo`` (the pair from nothing) and ``training.instruct`` (the pair onto a chat
template) train a target and a draft side by side in one loop; both resume from one checkpoint
file (training/checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from training.checkpoint import load_checkpoint, save_checkpoint
from training.data import ANSWER_WEIGHT_SPLIT, Batch, BatchStream, induction_batch


class PairRun:
    """Optimizers and counters of one target + draft run, resumed from ``ckpt`` if it exists."""

    def __init__(
        self,
        target: torch.nn.Module,
        draft: torch.nn.Module,
        *,
        lr: float,
        draft_lr: float,
        ckpt: Path,
        log: Callable[[str], None],
    ) -> None:
        self.target, self.draft, self.ckpt = target, draft, ckpt
        self.opt_t = torch.optim.AdamW(
            target.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1
        )
        self.opt_d = torch.optim.AdamW(
            draft.parameters(), lr=draft_lr, betas=(0.9, 0.95), weight_decay=0.1
        )
        self.state: dict[str, Any] = {"step": 0, "rnd": 0, "idx": 0, "seconds": 0.0, "tokens": 0}
        saved = load_checkpoint(ckpt, self._modules(), self._optimizers())
        if saved is not None:
            self.state = saved["state"]
            log(f"resumed at step {self.state['step']}")

    def _modules(self) -> dict[str, torch.nn.Module]:
        return {"target": self.target, "draft": self.draft}

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"opt_t": self.opt_t, "opt_d": self.opt_d}

    def save(self) -> None:
        """Write the checkpoint: models, optimizers and counters, atomically."""
        save_checkpoint(self.ckpt, self._modules(), self._optimizers(), state=self.state)

    def next_batch(
        self, stream: BatchStream, *, every: int, seed: int, vocab: int, eos: int, tokens: int
    ) -> tuple[Batch, float, str]:
        """This step's batch, its answer-weight split and its kind ("ind" or "rag").

        Every ``every``-th step (0: never) is a seeded batch of repeated random spans over the
        first ``vocab`` ids, which keeps the induction circuit; the rest walk the RAG stream round
        by round, the position kept in the checkpointed counters.
        """
        step, state = self.state["step"], self.state
        if every and step % every == every - 1:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
            return induction_batch(vocab, eos, tokens, gen), 1.0, "ind"
        n_batches = len(stream.round_batches(state["rnd"]))
        batch = stream.batch(state["rnd"], state["idx"])
        state["idx"] += 1
        if state["idx"] >= n_batches:
            state["rnd"], state["idx"] = state["rnd"] + 1, 0
        return batch, ANSWER_WEIGHT_SPLIT, "rag"
