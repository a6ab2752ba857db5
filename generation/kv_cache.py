"""A KV cache that grows in place: each forward pass writes its keys and values, nothing is copied.

transformers' ``DynamicLayer`` appends with ``torch.cat``: every forward pass allocates and copies
the whole cache of every layer (for the demo target at a 900-token context, ~33 MB per pass),
which on a CPU is a large share of a decode step.  ``GrowingLayer`` keeps a buffer with spare
room (doubling when full), writes the new positions into it, and hands attention a view of the
filled part: the same values in the same shape as ``DynamicLayer`` gives, so outputs do not change
(the greedy-equality tests compare against transformers' own ``generate``).  Rolling back after
rejected draft tokens (``crop``) only moves the end of the view.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` with an in-place buffer instead of concatenation."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None
        self._length = 0

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        have = 0 if self._key_buf is None else self._key_buf.shape[-2]
        if need <= have:
            return
        capacity = max(need, 2 * have, MIN_CAPACITY)
        keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        values = value_states.new_empty(
            (*value_states.shape[:-2], capacity, value_states.shape[-1])
        )
        if self._key_buf is not None and self._value_buf is not None:
            keys[..., : self._length, :] = self._key_buf[..., : self._length, :]
            values[..., : self._length, :] = self._value_buf[..., : self._length, :]
        self._key_buf, self._value_buf = keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions after the cached ones; return keys and values so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        self._reserve(key_states, value_states, end)
        assert self._key_buf is not None and self._value_buf is not None
        self._key_buf[..., self._length : end, :] = key_states
        self._value_buf[..., self._length : end, :] = value_states
        self._length = end
        self.keys = self._key_buf[..., :end, :]
        self.values = self._value_buf[..., :end, :]
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (a negative count, as DynamicLayer)."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"crop: pass a negative count of tokens to remove, got {tokens_to_remove}"
            )
        if tokens_to_remove == 0 or not self.is_initialized or self._key_buf is None:
            return
        self._length = max(0, self._length + tokens_to_remove)
        assert self._value_buf is not None
        self.keys = self._key_buf[..., : self._length, :]
        self.values = self._value_buf[..., : self._length, :]


def new_cache(config: Any) -> DynamicCache:
    """A cache for a model of ``config``: growing in place where every layer is full attention."""
    cache = DynamicCache(config=config)
    if cache.layers and all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache
