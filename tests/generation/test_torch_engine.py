"""The built-in torch engine: conformance on two model families, exact greedy, full acceptance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from generation import SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from generation.model.forward import can_pack
from tests.generation.conformance import EngineConformance, check_stats_invariants, make_prompts
from tests.generation.tiny_models import build_model, perturbed_copy, reference_greedy

pytestmark = pytest.mark.models

VOCAB = 96


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    target = build_model(request.param, vocab_size=VOCAB, seed=3, logit_scale=4.0)
    # A lightly perturbed copy agrees with the target at roughly half the positions.
    return target, perturbed_copy(target, noise=0.3)


@pytest.fixture(scope="module")
def engine(pair: tuple[Any, Any]) -> SpeculativeEngine:
    return SpeculativeEngine(pair[0], pair[1], config=EngineConfig(max_speculative_tokens=6))


@pytest.fixture(scope="module")
def reference(pair: tuple[Any, Any]) -> Callable[[list[int], int], list[int]]:
    cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def greedy(prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt), max_new_tokens)
        if key not in cache:
            cache[key] = reference_greedy(pair[0], prompt, max_new_tokens)
        return cache[key]

    return greedy


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(VOCAB, range(3))


class TestTorchEngineConformance(EngineConformance):
    """The conformance suite on Llama and GPT-2 pairs."""


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("seed", range(4))
def test_greedy_equality_many_seeds(family: str, seed: int) -> None:
    target = build_model(family, vocab_size=VOCAB, seed=seed, logit_scale=3.0)
    engine = SpeculativeEngine(target, perturbed_copy(target, noise=0.5, seed=seed))
    for prompt in make_prompts(VOCAB, range(seed * 10, seed * 10 + 2), lengths=(7,)):
        expected = reference_greedy(target, prompt, 30)
        for method in ("draft_model", "ngram"):
            for k in (1, 2, 4, 8, "auto"):
                params = SamplingParams(max_new_tokens=30, method=method, num_speculative_tokens=k)
                assert engine.generate(prompt, params).token_ids == expected, (method, k, prompt)


@pytest.mark.parametrize("packed", [None, False])
def test_the_config_picks_packed_or_transformers_kernels(packed: bool | None) -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=5, logit_scale=3.0)
    draft = perturbed_copy(target, noise=0.5, seed=5)
    engine = SpeculativeEngine(target, draft, config=EngineConfig(packed_weights=packed))
    on = packed is None and can_pack(target.lm_head.weight)  # None: packed on a CPU
    assert [f.packed for f in (engine.target_forward, engine.draft_forward)] == [on, on]  # type: ignore[union-attr]
    for prompt in make_prompts(VOCAB, range(50, 52), lengths=(9,)):
        params = SamplingParams(max_new_tokens=30, num_speculative_tokens=4)
        assert engine.generate(prompt, params).token_ids == reference_greedy(target, prompt, 30)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_identical_draft_is_fully_accepted(k: int) -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=5)
    engine = SpeculativeEngine(target, target)
    rounds = 4
    # 1 token from the prefill, then full rounds of k accepted drafts + 1 bonus token.
    max_new = 1 + rounds * (k + 1)
    result = engine.generate(
        list(range(10)), SamplingParams(max_new_tokens=max_new, num_speculative_tokens=k)
    )
    stats = result.stats
    assert result.token_ids == reference_greedy(target, list(range(10)), max_new)
    assert stats.acceptance_rate == 1.0
    assert stats.mean_acceptance_length == k + 1
    assert stats.num_drafts == stats.num_target_forwards == rounds
    assert stats.accepted_per_position == [rounds] * k
    # A budget that does not divide evenly cuts the last round short, never wastes drafts.
    short = engine.generate(
        list(range(10)), SamplingParams(max_new_tokens=max_new + 1, num_speculative_tokens=k)
    )
    assert short.stats.acceptance_rate == 1.0 and short.stats.num_output_tokens == max_new + 1


def test_end_of_sequence_stops_generation() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=6, logit_scale=3.0)
    prompt = list(range(3, 15))
    free = reference_greedy(target, prompt, 20)
    eos = free[6]
    target.generation_config.eos_token_id = eos
    engine = SpeculativeEngine(target, perturbed_copy(target, noise=0.2))
    expected = reference_greedy(target, prompt, 20)
    assert expected[-1] == eos and len(expected) == free.index(eos) + 1
    assert engine.eos_token_id == eos
    for method in ("draft_model", "ngram", "none"):
        for k in (1, 3, "auto"):
            result = engine.generate(
                prompt, SamplingParams(max_new_tokens=20, method=method, num_speculative_tokens=k)
            )
            assert result.token_ids == expected
            check_stats_invariants(result.stats, len(expected), 20)


def test_numpy_token_ids_are_accepted() -> None:
    import numpy as np

    target = build_model("llama", vocab_size=VOCAB, seed=2)
    engine = SpeculativeEngine(target)
    prompt = np.arange(5, 15, dtype=np.int64)
    result = engine.generate(list(prompt), SamplingParams(max_new_tokens=6, method="ngram"))
    assert result.token_ids == reference_greedy(target, prompt.tolist(), 6)
    assert all(type(t) is int for t in result.token_ids)


def test_warmup_allocates_the_kv_store_and_measures_step_costs_once() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=2)
    engine = SpeculativeEngine(
        target, perturbed_copy(target, noise=0.2), config=EngineConfig(max_batch_size=4)
    )
    engine.warmup(batch_sizes=(1, 4))
    tables = dict(engine.step_costs().tables)
    # Where arctic-inference is installed, suffix steps get a table of their own at each bucket.
    suffix = {(1, "suffix"), (4, "suffix")} if "suffix" in engine.methods else set()
    assert set(tables) == {(1, False), (1, True), (4, False), (4, True)} | suffix
    # Every k is priced (no timing comparison here: on a shared machine a step's wall time
    # says little; docs/results.md quotes the costs).
    assert all(len(t.measured) == engine.max_speculative_tokens + 1 for t in tables.values())
    assert [s.num_slots for s in engine.kv_stores] == [engine.max_concurrency] * 2 == [4, 4]
    engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4, num_speculative_tokens="auto"))
    assert engine.step_costs().tables[(1, True)] is tables[(1, True)]


def _timed_tables(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Every step-cost table the engine times from now on: (batch size, with a draft)."""
    import generation.torch_engine as torch_engine

    timed: list[tuple[int, bool]] = []
    real = torch_engine.time_batch_steps

    def spy(target: Any, draft: Any, batch_size: int, ks: list[int], *a: Any, **kw: Any) -> Any:
        if kw.get("repeats", 2):  # repeats 0: passes made ready, nothing timed
            timed.append((batch_size, draft is not None))
        return real(target, draft, batch_size, ks, *a, **kw)

    monkeypatch.setattr(torch_engine, "time_batch_steps", spy)
    return timed


def test_a_one_shot_warm_up_makes_ready_only_what_its_request_uses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from generation.spec_decode.cost_cache import StepCostCache

    timed = _timed_tables(monkeypatch)
    target = build_model("llama", vocab_size=VOCAB, seed=2)
    draft = perturbed_copy(target, noise=0.2)
    engine = SpeculativeEngine(target, draft, config=EngineConfig(max_batch_size=2))
    # A fixed k needs no cost table, before or during its answer.
    engine.warm_request("draft_model", 4)
    engine.generate([1, 2, 3], SamplingParams(max_new_tokens=6, num_speculative_tokens=4))
    assert timed == [] and engine.step_costs().tables == {}
    assert [s.num_slots for s in engine.kv_stores] == [2, 2]
    # "auto" needs its method's table only, measured once and kept in the cache ...
    cache = StepCostCache(tmp_path, {"engine": engine.cost_identity()})
    engine.use_cost_cache(cache)
    engine.warm_request("draft_model", "auto")
    assert timed == [(1, True)] and set(engine.step_costs().tables) == {(1, True)}
    # ... where a later engine of the same identity finds it, and times nothing.
    later = SpeculativeEngine(target, draft, config=EngineConfig(max_batch_size=2))
    later.use_cost_cache(StepCostCache(tmp_path, {"engine": later.cost_identity()}))
    later.warm_request("draft_model", "auto")
    assert timed == [(1, True)]
    assert (
        later.step_costs().tables[(1, True)].measured
        == engine.step_costs().tables[(1, True)].measured
    )
    with pytest.raises(ValueError, match="method: 'eagle'"):
        later.warm_request("eagle", 4)


def test_the_cost_identity_follows_dtype_and_pair() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=2)
    draft = perturbed_copy(target, noise=0.2)
    plain = SpeculativeEngine(target, draft).cost_identity()
    assert plain["dtype"] == "float32"
    assert SpeculativeEngine(target, draft).cost_identity() == plain
    assert SpeculativeEngine(target).cost_identity() != plain  # no draft
    halved = SpeculativeEngine(
        build_model("llama", vocab_size=VOCAB, seed=2).to(torch.bfloat16),
        perturbed_copy(target, noise=0.2).to(torch.bfloat16),
    )
    assert halved.cost_identity()["dtype"] == "bfloat16" != plain["dtype"]


def test_a_fixed_k_above_k_max_beside_an_auto_row_is_served() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=2)
    engine = SpeculativeEngine(target, target, config=EngineConfig(max_speculative_tokens=3))
    params = [
        SamplingParams(max_new_tokens=20, num_speculative_tokens=5),
        SamplingParams(max_new_tokens=20, num_speculative_tokens="auto"),
    ]
    fixed, auto = engine.generate_many([[1, 2, 3], [4, 5]], params)
    assert len(fixed.stats.accepted_per_position) == 5  # k = 5 drafted as asked
    assert fixed.token_ids == reference_greedy(target, [1, 2, 3], 20)
    assert auto.token_ids == reference_greedy(target, [4, 5], 20)


def test_context_limit_caps_generation() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=2, max_positions=40)
    engine = SpeculativeEngine(target, target)
    result = engine.generate(
        list(range(30)), SamplingParams(max_new_tokens=64, num_speculative_tokens=4)
    )
    assert len(result.token_ids) == engine.max_context - 30


def test_draft_method_without_draft_is_refused() -> None:
    engine = SpeculativeEngine(build_model("llama", vocab_size=VOCAB))
    with pytest.raises(ValueError, match="draft"):
        engine.generate([1, 2, 3], SamplingParams(method="draft_model"))
    assert engine.generate([1, 2, 3], SamplingParams(max_new_tokens=3, method="ngram")).token_ids


def test_adaptive_k_uses_recent_requests_of_the_same_method() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=5)
    engine = SpeculativeEngine(target, target, config=EngineConfig(max_speculative_tokens=8))
    # The draft is the target itself, so its real cost would make short drafts best; price
    # every step alike, as a cheap draft would be.
    engine.step_costs().timer = lambda batch_size, ks, with_draft: {k: 0.01 for k in ks}
    before = engine.recent_alpha("draft_model")
    for _ in range(3):
        result = engine.generate(
            list(range(12)), SamplingParams(max_new_tokens=40, num_speculative_tokens="auto")
        )
        assert result.stats.acceptance_rate == 1.0
    assert engine.recent_alpha("draft_model") > before
    assert engine.recent_alpha("ngram") == before
    # With everything accepted the policy drafts long: few target passes for 40 tokens.
    assert result.stats.num_target_forwards <= 40 // 4
    assert torch.get_num_threads() == 1
