"""One batched forward of a model on its KV slots, and how many slots to allocate.

The KV memory itself is generation/model/kv_store.py's ``KVStore``. ``plan_slots``
decides once, before anything is allocated (as nano-vLLM's ``allocate_kv_cache``), how many
slots fit at the full context, so nothing grows or copies while requests come and go and a full
batch never runs out of memory mid-step. A pass writes at the slot's length; rejecting drafts
only lowers the length (stale positions are overwritten and never attended: the mask stops at
each query's own position).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from generation.model.forward import Forward
from generation.model.kv_store import KVShape, KVStore

PREFILL_BUCKET = 16
"""Prompt chunks run padded to a multiple of this many tokens (``ModelRunner._prefill_ids``)."""


class ModelRunner:
    """A model (target or draft) with a KV slot per running request: a pass reads each row's
    start from its slot's length and advances the length by the row's real tokens."""

    def __init__(self, fwd: Forward, num_slots: int, capacity: int) -> None:
        self.fwd = fwd
        self.num_slots = num_slots
        self.capacity = capacity
        self._store: KVStore | None = None

    @property
    def store(self) -> KVStore:
        """The model's KV store, allocated on first use."""
        if self._store is None:
            fwd = self.fwd
            self._store = KVStore(
                fwd.config, self.num_slots, self.capacity, dtype=fwd.dtype, device=fwd.device
            )
        return self._store

    def length(self, slot: int) -> int:
        return self.store.lengths[slot]

    def set_length(self, slot: int, length: int) -> None:
        """Roll ``slot`` back to ``length`` positions (rejected drafts are forgotten)."""
        self.store.lengths[slot] = length

    def run(
        self,
        slots: list[int],
        input_ids: torch.Tensor,  # [B, n], right-padded
        num_tokens: list[int],
        last_only: bool = False,
    ) -> torch.Tensor:
        """Append each row's real tokens to its slot; return logits [B, n, vocab] (``last_only``:
        [B, vocab] at each row's last real token). A row of 0 tokens is carried along."""
        store = self.store
        starts = [store.lengths[s] for s in slots]
        last = [max(c, 1) - 1 for c in num_tokens] if last_only else None
        logits = self.fwd(input_ids, store, slots, starts, last)
        for slot, start, count in zip(slots, starts, num_tokens, strict=True):
            store.lengths[slot] = start + count
        return logits.float()

    def run_hidden(
        self,
        slots: list[int],
        input_ids: torch.Tensor,  # [B, n], right-padded
        num_tokens: list[int],
        last_only: bool = False,
        features: torch.Tensor | None = None,  # [B, n, hidden]: an EAGLE head's input
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``run``, with the final hidden states beside the logits ([B, n, hidden], or
        [B, hidden] with ``last_only``): the target's feed an EAGLE head (generation/spec_decode/eagle.py)."""
        store = self.store
        starts = [store.lengths[s] for s in slots]
        last = [max(c, 1) - 1 for c in num_tokens] if last_only else None
        fwd: Any = self.fwd
        if features is None:
            logits, hidden = fwd.run(input_ids, store, slots, starts, last)
        else:
            logits, hidden = fwd.run(input_ids, store, slots, starts, last, features)
        for slot, start, count in zip(slots, starts, num_tokens, strict=True):
            store.lengths[slot] = start + count
        return logits.float(), hidden

    def prefill_hidden(self, slot: int, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``prefill``, with the final hidden state of every token [n, hidden]."""
        n, start = len(token_ids), self.length(slot)
        fwd: Any = self.fwd  # the fast Llama path: the only one an EAGLE head runs beside
        ids = self._prefill_ids(slot, token_ids)
        logits, hidden = fwd.run(ids, self.store, [slot], [start], [n - 1], all_hidden=True)
        self.set_length(slot, start + n)
        return logits[0].float(), hidden[0, :n]

    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor:
        """Append ``token_ids`` to slot ``slot``; return the logits after the last one [vocab]."""
        ids = self._prefill_ids(slot, token_ids)
        return self.run([slot], ids, [len(token_ids)], last_only=True)[0]

    def fill(self, slot: int, token_ids: list[int]) -> None:
        """``prefill`` without the logits, where the forward can skip them (a draft's prompt:
        its output projection, float32 even in a bf16 engine, is ~1 ms of reading on the demo
        draft that nobody uses)."""
        fill = getattr(self.fwd, "fill", None)
        if fill is None:
            self.prefill(slot, token_ids)
            return
        start = self.length(slot)
        fill(self._prefill_ids(slot, token_ids), self.store, [slot], [start])
        self.set_length(slot, start + len(token_ids))

    def _prefill_ids(self, slot: int, token_ids: list[int]) -> torch.Tensor:
        """``token_ids`` as [1, n'], right-padded to a multiple of ``PREFILL_BUCKET`` where the
        slot has room (the padding is written past the length, never attended).

        Why: oneDNN builds a GEMM primitive per input shape; a prompt length it has not seen
        costs ~0.7-1.4 ms a projection shape in bf16 (each model's 4, once a pass) on top of the
        GEMM, so a prefill of fresh lengths paid for building kernels. Bucketed, a few dozen lengths cover every chunk."""
        n = len(token_ids)
        padded = -(-n // PREFILL_BUCKET) * PREFILL_BUCKET
        if self.length(slot) + padded > self.capacity:
            padded = n
        ids = torch.zeros((1, padded), dtype=torch.long, device=self.fwd.device)
        ids[0, :n] = torch.tensor(token_ids, dtype=torch.long)
        return ids


def free_memory_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (CUDA: the driver's figure; CPU: MemAvailable; None: unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None  # unknown: every slot asked for is allocated


def slot_bytes(models: list[Forward], capacity: int) -> int:
    """Bytes of KV one slot takes at ``capacity`` positions, every model together."""
    return sum(KVShape.of_config(m.config, m.dtype).bytes_per_token() * capacity for m in models)


def plan_slots(models: list[Forward], capacity: int, wanted: int, memory_fraction: float) -> int:
    """Return how many slots of ``capacity`` positions to allocate: ``wanted``, or fewer (at
    least 1) where ``memory_fraction`` of the device's free memory cannot hold them."""
    free = free_memory_bytes(models[0].device)
    per_slot = slot_bytes(models, capacity)
    if free is None or per_slot == 0:
        return wanted
    return max(1, min(wanted, int(memory_fraction * free) // per_slot))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_batch_steps(
    target: Forward,
    draft: Forward | None,
    batch_size: int,
    ks: list[int],
    context_len: int = 64,
    repeats: int = 2,
    head: Any = None,
) -> dict[int, float]:
    """Return the median seconds of a batch step of ``batch_size`` rows for each k in ``ks``:
    a target pass over ``[batch_size, k + 1]`` and, with a draft, ``k`` draft passes over
    ``[batch_size, 1]`` (with an EAGLE ``head`` instead: ``k`` head passes over
    ``[batch_size, 1]`` and their features), on scratch slots holding ``context_len`` tokens.
    ``repeats`` 0: each step runs once, untimed (its kernels made ready; returns {})."""
    if head is not None:
        draft = head
    capacity = context_len + max(ks) + 2
    runners = [ModelRunner(m, batch_size, capacity) for m in (target, draft) if m is not None]
    device = target.device
    vocab = int(target.config.vocab_size)
    context = [i % vocab for i in range(context_len)]
    slots = list(range(batch_size))
    times: dict[int, list[float]] = {k: [] for k in ks}
    with torch.inference_mode():
        for slot in slots:
            runners[0].prefill(slot, context)
            if len(runners) > 1 and head is None:
                runners[1].prefill(slot, context)
            elif head is not None:  # the head's context: any features will do for timing
                runners[1].set_length(slot, context_len)
        for attempt in range(repeats + 1):  # the first round warms up allocators and kernels
            for k in ks:
                _synchronize(device)
                start = time.perf_counter()
                if draft is not None and k:
                    ids = torch.ones((batch_size, 1), dtype=torch.long, device=device)
                    feats = None
                    if head is not None:
                        hidden = int(head.config.hidden_size)
                        feats = torch.zeros((batch_size, 1, hidden), dtype=head.dtype)
                    for _ in range(k):
                        if feats is not None:
                            runners[1].run_hidden(slots, ids, [1] * batch_size, True, feats)
                        else:
                            runners[1].run(slots, ids, [1] * batch_size, last_only=True)
                ids = torch.ones((batch_size, k + 1), dtype=torch.long, device=device)
                verify = runners[0].run_hidden if head is not None else runners[0].run
                verify(slots, ids, [k + 1] * batch_size)[0].argmax(dim=-1).tolist()
                _synchronize(device)
                if attempt:
                    times[k].append(time.perf_counter() - start)
                for runner in runners:
                    for slot in slots:
                        runner.set_length(slot, context_len)
    return {k: statistics.median(t) for k, t in times.items() if t}
