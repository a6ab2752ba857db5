"""EngineConfig: every field has a default, is validated once, and the config is frozen."""

from __future__ import annotations

import dataclasses

import pytest

from generation import EngineConfig


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_batch_size", 0),
        ("max_speculative_tokens", 0),
        ("prefill_chunk", -1),
        ("background_prefill_chunk", 1.5),
        ("batch_prefill_chunk", 0),
        ("batch_prefill_chunk", True),
        ("ngram_max_n", True),
        ("max_background_pause", -1.0),
        ("kv_memory_fraction", 0.0),
        ("kv_memory_fraction", 1.5),
        ("pause_background", "yes"),
        ("packed_weights", 1),
    ],
)
def test_a_bad_field_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"engine config: {field}"):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


def test_defaults_and_frozen() -> None:
    config = EngineConfig()
    assert all(f.default is not dataclasses.MISSING for f in dataclasses.fields(config))
    assert (config.max_batch_size, config.max_speculative_tokens, config.prefill_chunk) == (
        16,
        8,
        512,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.prefill_chunk = 5  # type: ignore[misc]
    assert dataclasses.replace(config, prefill_chunk=5).prefill_chunk == 5
    assert config.batch_prefill_chunk == 2048
    assert EngineConfig(batch_prefill_chunk=None).batch_prefill_chunk is None
