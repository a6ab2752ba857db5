"""Who runs this step: requests wait in arrival order, join free slots, leave when done.

Running requests occupy slots 0 .. len(running) - 1, so the batched pass reads the batch's KV as
one view: when a request leaves, the last running one moves into its slot (its KV copied once),
or, where that one is still prefilling, the highest request whose prompt is in (``release``).
A long prompt is prefilled in chunks of at most ``prefill_chunk`` tokens per step, so decoding
rows are never stalled by more than one chunk's pass.

Background requests (batch jobs) take free slots after every waiting foreground request. With
``pause_background`` (where an extra row costs real arithmetic, as on a CPU) they also sit out
the steps while a foreground request runs, slots and caches kept, unless paused for
``max_background_pause`` seconds (no starvation); their prompts are prefilled in chunks of at
most ``background_chunk`` tokens, so an arriving foreground request waits for a short pass.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from generation.engine.sequence import Sequence

SlotMove = Callable[[int, int], None]
"""(src, dst): move the sequence in slot src to slot dst, in every model's cache."""


class Scheduler:
    """The waiting queue and the running batch of one batch engine."""

    def __init__(
        self,
        max_batch_size: int,
        prefill_chunk: int,
        move: SlotMove,
        pause_background: bool = False,
        background_chunk: int | None = None,
        max_background_pause: float = 5.0,
    ) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk: must be >= 1, got {prefill_chunk}")
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        """Most prompt tokens prefilled in one step (all prefilling requests together)."""
        self._move = move
        self.pause_background = pause_background
        self.background_chunk = background_chunk or prefill_chunk
        self.max_background_pause = max_background_pause
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        """running[i] holds slot i."""

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Give free slots to waiting requests (foreground first, each in arrival order);
        return those admitted."""
        admitted = []
        while self.waiting and len(self.running) < self.max_batch_size:
            seq = next((s for s in self.waiting if not s.background), self.waiting[0])
            self.waiting.remove(seq)
            seq.slot = len(self.running)
            seq.last_step = time.perf_counter()  # a paused wait counts from admission
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def prefill_plan(self) -> list[tuple[Sequence, int]]:
        """Return (request, chunk length) pairs to prefill this step, oldest first."""
        plan = []
        budget = self.prefill_chunk
        for seq in self._stepping():
            left = len(seq.prompt) - seq.prefilled
            if left > 0 and budget > 0:
                take = min(left, budget, self.background_chunk if seq.background else budget)
                plan.append((seq, take))
                budget -= take
        return plan

    def decoding(self) -> list[Sequence]:
        """Return the running requests whose prompt is in and that are not finished."""
        return [s for s in self._stepping() if s.prefilled == len(s.prompt) and not s.finished]

    def _stepping(self) -> list[Sequence]:
        """The running requests that take part in this step (see ``pause_background``)."""
        if self.pause_background and any(not s.background and not s.finished for s in self.running):
            due = time.perf_counter() - self.max_background_pause
            return [s for s in self.running if not s.background or s.last_step <= due]
        return self.running

    def release(self, seq: Sequence) -> None:
        """Free ``seq``'s slot: the last running request moves into it, unless its prompt is
        still being prefilled while a request above the slot has its prompt in; then that one
        moves in and the last takes its place (two moves), so requests whose prompt is in keep
        the lowest slots and a batched pass reads their KV as one view, not a gather of every
        layer's."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        slot = seq.slot
        last = self.running.pop()
        if last is not seq:
            if not _prompt_in(last):
                ready = next((s for s in reversed(self.running[slot + 1 :]) if _prompt_in(s)), None)
                if ready is not None:
                    slot, freed = ready.slot, slot
                    self._place(ready, freed)
            self._place(last, slot)
        seq.slot = -1

    def _place(self, seq: Sequence, slot: int) -> None:
        """Move running request ``seq`` into the free slot ``slot``."""
        self._move(seq.slot, slot)
        seq.slot = slot
        self.running[slot] = seq


def _prompt_in(seq: Sequence) -> bool:
    return seq.prefilled == len(seq.prompt)
