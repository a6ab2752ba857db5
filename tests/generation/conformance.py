"""Engine conformance suite: what every ``Engine`` implementation must do (torch, vLLM).

Subclass ``EngineConformance`` in a ``Test*`` class and provide fixtures:
- ``engine``: the engine under test, loaded with a target and a draft;
- ``reference``: ``(prompt, max_new_tokens) -> list[int]``, greedy decoding with the target
  alone (e.g. transformers' ``generate(do_sample=False)``);
- ``prompts``: prompts of valid ids, some with repeated material (so n-gram lookup drafts).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from typing import Any

import pytest

from generation import Engine, GenerationLoop, GenerationStats, SamplingParams

KS: tuple[int | str, ...] = (1, 2, 4, 8, "auto")
MAX_NEW = 24


def make_prompts(
    vocab_size: int, seeds: range, lengths: tuple[int, ...] = (9, 23)
) -> list[list[int]]:
    """Return random prompts and, per seed, one that repeats a passage (prompt-lookup material)."""
    prompts = []
    for seed in seeds:
        rng = random.Random(seed)
        for length in lengths:
            prompts.append([rng.randrange(vocab_size) for _ in range(length)])
        passage = [rng.randrange(vocab_size) for _ in range(12)]
        filler = [rng.randrange(vocab_size) for _ in range(5)]
        prompts.append(passage + filler + passage[:6])
    return prompts


def check_stats_invariants(stats: GenerationStats, num_tokens: int, max_new_tokens: int) -> None:
    """Assert the contract's relations between the counters of one result."""
    assert stats.num_output_tokens == num_tokens <= max_new_tokens
    assert 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    assert all(
        a >= b
        for a, b in zip(
            stats.accepted_per_position[:-1], stats.accepted_per_position[1:], strict=True
        )
    )
    # Every emitted token is an accepted draft or one the target emitted itself: one from the
    # prefill and one per target pass (the last one dropped when an accepted draft was EOS).
    emitted_by_target = stats.num_output_tokens - stats.num_accepted_tokens
    assert stats.num_target_forwards <= emitted_by_target <= stats.num_target_forwards + 1
    assert stats.num_drafts <= stats.num_target_forwards
    data = stats.to_dict()
    if stats.num_draft_tokens == 0:
        assert data["acceptance_rate"] is None and data["mean_acceptance_length"] is None
        assert stats.num_drafts == 0
    else:
        assert data["acceptance_rate"] == stats.num_accepted_tokens / stats.num_draft_tokens
        assert data["mean_acceptance_length"] == 1 + stats.num_accepted_tokens / stats.num_drafts
    assert stats.ttft_ms is not None and stats.generation_ms is not None
    assert 0 <= stats.ttft_ms <= stats.generation_ms


def check_protocol(obj: Any, protocol: type) -> None:
    """Assert ``obj`` has every public member ``protocol`` names, each method with the protocol's
    parameters (names, kinds and defaults), not just something of that name."""
    name = type(obj).__name__
    members = [m for m in vars(protocol) if not m.startswith("_")]
    for member_name in members:
        member = vars(protocol)[member_name]
        assert hasattr(obj, member_name), f"{name} lacks {member_name}"
        if isinstance(member, property) or not callable(member):
            continue
        params = list(inspect.signature(member).parameters.values())[1:]  # less self
        want = [(p.name, p.kind, p.default) for p in params]
        got = [
            (p.name, p.kind, p.default)
            for p in inspect.signature(getattr(obj, member_name)).parameters.values()
        ]
        assert got == want, f"{name}.{member_name}: parameters {got}, protocol {want}"


def check_engine_protocol(engine: Any) -> None:
    """Assert ``engine`` is a whole ``generation.interface.Engine`` (see ``check_protocol``)."""
    assert isinstance(engine, Engine), f"{type(engine).__name__} is not an Engine"
    assert {"check_request", "generate", "generate_many", "start_loop"} <= set(vars(Engine))
    check_protocol(engine, Engine)


class EngineConformance:
    """Tests any engine must pass; see the module docstring for the fixtures it needs."""

    @pytest.mark.parametrize("k", KS)
    @pytest.mark.parametrize("method", ["draft_model", "ngram", "none"])
    def test_greedy_equals_target_alone(
        self,
        engine: Engine,
        reference: Callable[[list[int], int], list[int]],
        prompts: list[list[int]],
        method: str,
        k: int | str,
    ) -> None:
        for prompt in prompts:
            expected = reference(prompt, MAX_NEW)
            params = SamplingParams(max_new_tokens=MAX_NEW, method=method, num_speculative_tokens=k)
            result = engine.generate(prompt, params)
            assert result.token_ids == expected, f"prompt {prompt}"
            check_stats_invariants(result.stats, len(result.token_ids), MAX_NEW)

    @pytest.mark.parametrize("temperature", [0.0, 0.8])
    @pytest.mark.parametrize("method", ["draft_model", "ngram", "none"])
    def test_stats_invariants(
        self, engine: Engine, prompts: list[list[int]], method: str, temperature: float
    ) -> None:
        for i, prompt in enumerate(prompts):
            for k in (1, 3, "auto"):
                params = SamplingParams(
                    max_new_tokens=17,
                    temperature=temperature,
                    seed=i,
                    method=method,
                    num_speculative_tokens=k,
                )
                result = engine.generate(prompt, params)
                assert result.stats.method == method and result.stats.num_speculative_tokens == k
                check_stats_invariants(result.stats, len(result.token_ids), 17)
                if method == "none":
                    assert result.stats.num_draft_tokens == 0

    @pytest.mark.parametrize("method", ["draft_model", "ngram"])
    def test_seeded_sampling_is_reproducible(
        self, engine: Engine, prompts: list[list[int]], method: str
    ) -> None:
        params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=7, method=method)
        first = engine.generate(prompts[-1], params).token_ids
        assert engine.generate(prompts[-1], params).token_ids == first
        others = {
            tuple(
                engine.generate(
                    prompts[-1],
                    SamplingParams(max_new_tokens=20, temperature=1.0, seed=s, method=method),
                ).token_ids
            )
            for s in range(8, 12)
        }
        assert len(others | {tuple(first)}) > 1, "different seeds should sample differently"

    def test_properties(self, engine: Engine) -> None:
        check_engine_protocol(engine)
        loop = engine.start_loop()
        try:
            check_protocol(loop, GenerationLoop)
        finally:
            loop.close()
        assert engine.vocab_size > 0 and engine.max_context > 0
        assert isinstance(engine.model_pair, str) and engine.model_pair

    def test_one_handle_behaviour(self, engine: Engine, prompts: list[list[int]]) -> None:
        # generation/handle.py, on every engine: a raising on_delta fails its own request with
        # that error while the others go on; once a request ended, a second deltas() ends at once.
        def broken(token_ids: list[int]) -> None:
            raise OSError("client socket gone")

        loop = engine.start_loop()
        try:
            failing = loop.submit(prompts[0], SamplingParams(max_new_tokens=MAX_NEW), broken)
            fine = loop.submit(prompts[1], SamplingParams(max_new_tokens=MAX_NEW))
            with pytest.raises(OSError, match="client socket gone"):
                failing.result(120)
            result = fine.result(120)
        finally:
            loop.close()
        assert [t for burst in fine.deltas() for t in burst] == result.token_ids
        assert list(fine.deltas()) == []
        assert list(failing.deltas()) and list(failing.deltas()) == []

    @pytest.mark.parametrize(
        ("prompt", "params", "message"),
        [
            ([], {}, "empty"),
            ([1, -1, 2], {}, "outside the vocabulary"),
            ([1, "VOCAB", 2], {}, "outside the vocabulary"),
            ([1, 2.5], {}, "integer|outside the vocabulary"),
            ("LONG", {}, "context"),
        ],
    )
    def test_bad_prompt(self, engine: Engine, prompt: Any, params: dict, message: str) -> None:
        if prompt == "LONG":
            prompt = [1] * engine.max_context
        else:
            prompt = [engine.vocab_size if t == "VOCAB" else t for t in prompt]
        with pytest.raises(ValueError, match=message):
            engine.generate(prompt, SamplingParams(**params))

    @pytest.mark.parametrize(
        ("params", "field"),
        [
            ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
            ({"num_speculative_tokens": "many"}, "num_speculative_tokens"),
            ({"max_new_tokens": 0}, "max_new_tokens"),
            ({"method": "medusa"}, "method"),
            ({"temperature": -1.0}, "temperature"),
        ],
    )
    def test_bad_params(self, params: dict, field: str) -> None:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**params)
