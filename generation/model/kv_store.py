"""Who owns which KV memory: one model's keys and values for every slot, and their shape.

``KVShape`` is the one place a model's config turns into KV arithmetic (layers, kv heads, head
dim, bytes per token): the slot store, the prefix pool and the slot planner all ask it.
``KVStore`` holds one model's keys and values for every slot, per layer
``[num_slots, kv_heads, capacity, head_dim]``, and each slot's length on the host. A pass writes
at the slot's length; rejecting drafts only lowers the length (stale positions are overwritten
and never attended: the mask stops at each query's own position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

SlotKV = tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]
"""One slot of one model: per layer keys and values ``[positions, kv_heads, head_dim]``."""


@dataclass(frozen=True)
class KVShape:
    """What one model's KV looks like per token."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of_config(cls, config: Any, dtype: torch.dtype) -> KVShape:
        """The KV shape of a model of ``config`` holding its KV in ``dtype``."""
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(int(config.num_hidden_layers), kv_heads, head_dim, dtype)

    @classmethod
    def of(cls, model: Any) -> KVShape:
        """The KV shape of a loaded causal LM (its config and its parameters' dtype)."""
        return cls.of_config(model.config, next(model.parameters()).dtype)

    def bytes_per_token(self) -> int:
        """Keys and values of one token in every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.kv_heads * self.head_dim * element


class KVStore:
    """Keys and values of one model for ``num_slots`` requests, each slot with its own length."""

    def __init__(
        self,
        config: Any,
        num_slots: int,
        capacity: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = KVShape.of_config(config, dtype)
        self.num_layers = shape.num_layers
        self.capacity = capacity
        size = (num_slots, shape.kv_heads, capacity, shape.head_dim)
        # Zeros, not empty: positions past a length are masked, and a masked score must never
        # meet a NaN of uninitialised memory.
        self.keys = [torch.zeros(size, dtype=dtype, device=device) for _ in range(self.num_layers)]
        self.values = [torch.zeros(size, dtype=dtype, device=device) for _ in self.keys]
        self.lengths = [0] * num_slots
        """lengths[slot]: positions of the slot that hold valid keys and values."""

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s valid positions into slot ``dst`` and empty ``src``."""
        n = self.lengths[src]
        for store in (self.keys, self.values):
            for layer in store:
                layer[dst, :, :n] = layer[src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0


def slot_kv(store: KVStore, slot: int) -> SlotKV:
    """One slot of a KV store as per-layer views ``[capacity, kv_heads, head_dim]``; the
    transposed views write through to the store, so copies in and out need no reshaping."""
    return (
        [k[slot].transpose(0, 1) for k in store.keys],
        [v[slot].transpose(0, 1) for v in store.values],
    )
