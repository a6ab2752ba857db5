"""The in-place KV cache gives the same logits as transformers' concatenating one."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from generation.kv_cache import MIN_CAPACITY, GrowingLayer, new_cache
from tests.generation.tiny_models import FAMILIES, build_model

VOCAB = 96


def decode_with_rollbacks(model, cache, ids: torch.Tensor) -> torch.Tensor:
    """Prefill, then one token at a time, rolling back 3 positions and re-feeding every 7th step."""
    out = [model(input_ids=ids[:, :20], cache=cache, use_cache=True).logits[0]]
    with torch.inference_mode():
        for i in range(20, ids.shape[1]):
            out.append(model(input_ids=ids[:, i : i + 1], cache=cache, use_cache=True).logits[0])
            if i % 7 == 6:
                cache.crop(-3)
                out.append(
                    model(input_ids=ids[:, i - 2 : i + 1], cache=cache, use_cache=True).logits[0]
                )
    return torch.cat(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_same_logits_as_dynamic_cache_through_growth_and_rollback(family: str) -> None:
    model = build_model(family, vocab_size=VOCAB, seed=3, max_positions=MIN_CAPACITY * 2)
    # Longer than the first buffer: the cache must grow (and copy) at least once.
    ids = torch.randint(
        0, VOCAB, (1, MIN_CAPACITY + 60), generator=torch.Generator().manual_seed(1)
    )
    with torch.inference_mode():
        expected = decode_with_rollbacks(model, DynamicCache(config=model.config), ids)
        cache = new_cache(model.config)
        got = decode_with_rollbacks(model, cache, ids)
    assert torch.equal(expected, got)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert cache.get_seq_length() == ids.shape[1]


def test_crop_refuses_a_positive_count() -> None:
    layer = GrowingLayer()
    layer.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))
    with pytest.raises(ValueError, match="negative"):
        layer.crop(2)
    layer.crop(-2)
    assert layer.get_seq_length() == 3
    assert type(layer) is not DynamicLayer
