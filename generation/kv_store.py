"""Who owns which KV memory: one preallocated slot per running request, rollback = a length.

``KVStore`` holds the keys and values of one model for every slot, per layer
``[num_slots, kv_heads, capacity, head_dim]`` (a slot's first n positions are the view attention
reads, as a single-sequence cache gives it), and each slot's length on the host. It is
allocated once, when the engine first runs (``ModelRunner``): the engine decides how many
slots it can hold at the full context (its ``max_concurrency``), so nothing grows or copies
while requests come and go. A forward pass writes its positions at the slot's length; rejecting
draft tokens only lowers the length (stale positions are overwritten by the next pass and never
attended: the mask stops at each query's own position).

A request's prompt KV lives in its slot, positions ``0 .. len(prompt) - 1``, once prefilled.
``read`` copies a slot's positions out and ``write`` puts such a copy into a slot, so a prompt
prefix computed once can be attached to another request's slot (its prefill then starts after
the prefix).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""Keys and values of one layer for some positions: each [kv_heads, num_positions, head_dim]."""


def kv_shape(config: Any) -> tuple[int, int, int]:
    """Return (layers, kv_heads, head_dim) of a model of ``config``."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return int(config.num_hidden_layers), kv_heads, head_dim


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Return the bytes of keys and values one token occupies in every layer of ``config``."""
    layers, kv_heads, head_dim = kv_shape(config)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


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
        self.num_layers, kv_heads, head_dim = kv_shape(config)
        self.capacity = capacity
        """Positions each slot holds: the model's context plus one round's padding."""
        shape = (num_slots, kv_heads, capacity, head_dim)
        # Zeros, not empty: positions past a length are masked, and a masked score must never
        # meet a NaN of uninitialised memory.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.keys]
        self.lengths = [0] * num_slots
        """lengths[slot]: positions of the slot that hold valid keys and values."""

    @property
    def num_slots(self) -> int:
        """Slots the store holds."""
        return len(self.lengths)

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s valid positions into slot ``dst`` and empty ``src``."""
        n = self.lengths[src]
        for store in (self.keys, self.values):
            for layer in store:
                layer[dst, :, :n] = layer[src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0

    def read(self, slot: int, start: int, end: int) -> list[LayerKV]:
        """Return a copy of positions ``start .. end - 1`` of ``slot``, per layer."""
        return [
            (k[slot, :, start:end].clone(), v[slot, :, start:end].clone())
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def write(self, slot: int, start: int, kv: list[LayerKV]) -> None:
        """Put ``kv`` (per layer, as ``read`` returns) at ``start`` of ``slot``; its length is
        then ``start`` plus their positions."""
        n = kv[0][0].shape[1]
        for (k, v), keys, values in zip(kv, self.keys, self.values, strict=True):
            keys[slot, :, start : start + n] = k
            values[slot, :, start : start + n] = v
        self.lengths[slot] = start + n


class SlotLayer(DynamicLayer):
    """One layer of one slot as a transformers cache layer: what a model's own forward writes
    through (``HFForward``); the pass's positions go into the store after ``start``."""

    def __init__(self, store: KVStore, layer: int, slot: int, start: int) -> None:
        super().__init__()
        self.store, self.layer, self.slot, self.start = store, layer, slot, start
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the store is."""

    def get_seq_length(self) -> int:
        """Positions already in the slot when the pass began."""
        return self.start

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's positions ([1, kv_heads, n, head_dim]); return the slot's so far."""
        end = self.start + key_states.shape[-2]
        keys, values = self.store.keys[self.layer], self.store.values[self.layer]
        keys[self.slot, :, self.start : end] = key_states[0]
        values[self.slot, :, self.start : end] = value_states[0]
        self.keys = keys[self.slot, :, :end].unsqueeze(0)
        self.values = values[self.slot, :, :end].unsqueeze(0)
        return self.keys, self.values
