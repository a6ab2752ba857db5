"""Who owns which KV memory: one preallocated cache slot per running request, rollback = length.

``SlotCache`` holds the keys and values of one model for every slot of the batch, per layer
``[num_slots, capacity, kv_heads, head_dim]`` (the layout attention kernels read without a copy
once transposed), and each slot's length on the host. A forward pass writes its positions
after the slot's length; accepting fewer draft tokens than were verified only lowers the
length (nothing is copied, stale positions are overwritten by the next pass and never
attended: the mask stops at each query's own position). Capacity grows by doubling, for all
slots at once, so a batch of short requests does not pay for the model's whole context.

``SlotView`` lets the single-sequence forward pass (generation/forward.py) run on one slot, so
prefill and a batch of one use exactly the operations of ``SpeculativeEngine.generate``.

``RowCaches`` is the same interface over one transformers cache per slot, for models the
batched forward pass does not cover (their rows run one after another).
"""

from __future__ import annotations

from typing import Any

import torch

from generation.kv_cache import MIN_CAPACITY, new_cache


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Return the bytes of keys and values one token occupies in every layer of ``config``."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * element


class SlotCache:
    """Keys and values of one model for ``num_slots`` requests, each slot with its own length."""

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        max_length: int,
    ) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.max_length = max_length
        """Longest sequence a slot is ever asked to hold (the model's context plus padding)."""
        self.lengths: list[int] = []
        """lengths[slot]: positions of the slot that hold valid keys and values."""
        self.keys: list[torch.Tensor] = []  # per layer [num_slots, capacity, kv_heads, head_dim]
        self.values: list[torch.Tensor] = []

    @property
    def num_slots(self) -> int:
        """Slots allocated so far."""
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        """Positions each slot can hold before the next growth."""
        return self.keys[0].shape[1] if self.keys else 0

    def reserve(self, num_slots: int, length: int) -> None:
        """Make room for ``num_slots`` slots of ``length`` positions (doubling, keeping data)."""
        slots, capacity = self.num_slots, self.capacity
        if num_slots <= slots and length <= capacity:
            return
        # Doubling in both directions: requests joining one by one do not regrow each time.
        new_slots = slots if num_slots <= slots else max(num_slots, 2 * slots)
        new_capacity = capacity
        if length > capacity:
            new_capacity = max(length, 2 * capacity, MIN_CAPACITY)
        shape = (new_slots, new_capacity, self.kv_heads, self.head_dim)
        for store in (self.keys, self.values):
            for i in range(self.num_layers):
                # Zeros, not empty: positions past a length are masked, and a masked score
                # must never meet a NaN of uninitialised memory.
                grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if store and slots and capacity:
                    grown[:slots, :capacity] = store[i]
                if len(store) < self.num_layers:
                    store.append(grown)
                else:
                    store[i] = grown
        self.lengths.extend([0] * (new_slots - slots))

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s valid positions into slot ``dst`` (keeps the batch dense)."""
        n = self.lengths[src]
        for store in (self.keys, self.values):
            for layer in store:
                layer[dst, :n] = layer[src, :n]
        self.lengths[dst] = n
        self.lengths[src] = 0

    def nbytes(self) -> int:
        """Bytes held by the keys and values of every slot."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def view(self, slot: int) -> SlotView:
        """The slot as a single-sequence cache (for generation/forward.py's passes)."""
        return SlotView(self, slot)


class SlotView:
    """One slot of a ``SlotCache`` with the cache methods the single-sequence forward calls."""

    def __init__(self, cache: SlotCache, slot: int) -> None:
        self.cache = cache
        self.slot = slot

    def get_seq_length(self) -> int:
        """Positions already in the slot."""
        return self.cache.lengths[self.slot]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's positions ([1, kv_heads, n, head_dim]); return the slot's so far.

        The length moves once the last layer has written, so every layer writes at the same
        positions.
        """
        cache, slot = self.cache, self.slot
        start = cache.lengths[slot]
        end = start + key_states.shape[-2]
        cache.reserve(slot + 1, end)
        cache.keys[layer_idx][slot, start:end] = key_states[0].transpose(0, 1)
        cache.values[layer_idx][slot, start:end] = value_states[0].transpose(0, 1)
        if layer_idx == cache.num_layers - 1:
            cache.lengths[slot] = end
        keys = cache.keys[layer_idx][slot, :end].transpose(0, 1).unsqueeze(0)
        values = cache.values[layer_idx][slot, :end].transpose(0, 1).unsqueeze(0)
        return keys, values  # [1, kv_heads, end, head_dim]

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions."""
        lengths = self.cache.lengths
        lengths[self.slot] = max(0, lengths[self.slot] + min(0, tokens_to_remove))


class RowCaches:
    """One transformers cache per slot: the fallback for models run one row at a time."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.caches: list[Any] = []

    @property
    def lengths(self) -> list[int]:
        """lengths[slot]: positions of the slot that hold valid keys and values."""
        return [c.get_seq_length() for c in self.caches]

    def reserve(self, num_slots: int, length: int) -> None:
        """Make sure ``num_slots`` slots exist (each cache grows by itself)."""
        while len(self.caches) < num_slots:
            self.caches.append(new_cache(self.config))

    def set_length(self, slot: int, length: int) -> None:
        """Roll slot ``slot`` back to ``length`` positions."""
        cache = self.caches[slot]
        drop = cache.get_seq_length() - length
        if drop > 0:
            cache.crop(-drop)

    def move(self, src: int, dst: int) -> None:
        """Hand slot ``src``'s cache to slot ``dst`` (no copy) and give ``src`` an empty one."""
        self.caches[dst] = self.caches[src]
        self.caches[src] = new_cache(self.config)

    def clear(self, slot: int) -> None:
        """Empty slot ``slot``."""
        self.caches[slot] = new_cache(self.config)

    def nbytes(self) -> int:
        """Bytes held by the keys and values of every slot (what transformers allocated)."""
        total = 0
        for cache in self.caches:
            for layer in getattr(cache, "layers", []):
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    if isinstance(t, torch.Tensor):
                        total += t.numel() * t.element_size()
        return total

    def view(self, slot: int) -> Any:
        """The slot's own cache."""
        return self.caches[slot]
