"""generate_many: every request of a mixed batch gets what it would get alone.

Greedy output equals transformers' greedy decoding with the target alone, over Llama and Qwen2
shapes (GQA, biases), mixed methods, k, prompt lengths and budgets, EOS mid-batch and batches
smaller than the request count (requests join as others leave); GPT-2 runs its rows one after
another through the same interface. Stats of fixed-k greedy rows equal ``generate``'s.
"""

from __future__ import annotations

import warnings

import pytest

from generation import BatchRequestError, SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from tests.generation.batch_support import References, check_greedy, mixed_requests
from tests.generation.conformance import check_stats_invariants
from tests.generation.tiny_models import build_model, perturbed_copy

pytestmark = pytest.mark.models

VOCAB = 96

SHAPES = [
    ("llama", 32, 2, 0),
    ("qwen2", 32, 2, 1),
    ("llama", 64, 3, 2),
    ("qwen2", 48, 1, 3),
]


def _engine(family: str, hidden: int, layers: int, seed: int) -> SpeculativeEngine:
    target = build_model(
        family, vocab_size=VOCAB, seed=seed, hidden_size=hidden, num_layers=layers, logit_scale=3.0
    )
    return SpeculativeEngine(
        target,
        perturbed_copy(target, noise=0.4, seed=seed),
        config=EngineConfig(max_speculative_tokens=6),
    )


def _check_all(engine: SpeculativeEngine, prompts, params, results) -> list[str]:
    refs = References(engine.target)
    notes = []
    for prompt, p, result in zip(prompts, params, results, strict=True):
        note = check_greedy(engine.target, prompt, result.token_ids, refs(prompt, p.max_new_tokens))
        if note:
            notes.append(note)
        check_stats_invariants(result.stats, len(result.token_ids), p.max_new_tokens)
    return notes


@pytest.mark.parametrize(("family", "hidden", "layers", "seed"), SHAPES)
@pytest.mark.parametrize("max_batch_size", [3, 16])
def test_mixed_batch_is_greedy_exact(
    family: str, hidden: int, layers: int, seed: int, max_batch_size: int
) -> None:
    engine = _engine(family, hidden, layers, seed)
    prompts, params = mixed_requests(VOCAB, 10, seed)
    results = engine.generate_many(prompts, params, max_batch_size=max_batch_size)
    for note in _check_all(engine, prompts, params, results):
        warnings.warn(note, stacklevel=1)
    # Rows shared their target passes.
    assert max(r.stats.mean_batch_size for r in results) > 1.0


def test_arrival_order_does_not_change_outputs() -> None:
    engine = _engine("llama", 32, 2, 4)
    prompts, params = mixed_requests(VOCAB, 8, 4)
    forward = engine.generate_many(prompts, params, max_batch_size=4)
    backward = engine.generate_many(prompts[::-1], params[::-1], max_batch_size=4)[::-1]
    _check_all(engine, prompts, params, forward)
    _check_all(engine, prompts, params, backward)


def test_end_of_sequence_mid_batch() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=6, logit_scale=3.0)
    prompt = list(range(3, 15))
    free = References(target)(prompt, 20)
    target.generation_config.eos_token_id = free[6]
    engine = SpeculativeEngine(target, perturbed_copy(target, noise=0.2))
    prompts = [prompt, list(range(40, 52)), prompt, list(range(20, 25))]
    params = [
        SamplingParams(max_new_tokens=20, method=m, num_speculative_tokens=k)
        for m, k in [("draft_model", 3), ("draft_model", "auto"), ("ngram", 2), ("none", 1)]
    ]
    results = engine.generate_many(prompts, params)
    _check_all(engine, prompts, params, results)
    eos = free[6]
    assert results[0].token_ids[-1] == eos and len(results[0].token_ids) == free.index(eos) + 1
    assert results[0].token_ids == results[2].token_ids


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fixed_k_stats_equal_the_request_alone(family: str) -> None:
    engine = _engine(family, 32, 2, 7)
    prompts, params = mixed_requests(VOCAB, 9, 7, max_new=(16, 24))
    results = engine.generate_many(prompts, params, max_batch_size=5)
    fields = (
        "num_output_tokens",
        "num_target_forwards",
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "accepted_per_position",
    )
    for prompt, p, result in zip(prompts, params, results, strict=True):
        if p.num_speculative_tokens == "auto":
            continue
        alone = engine.generate(prompt, p)
        assert result.token_ids == alone.token_ids
        for name in fields:
            assert getattr(result.stats, name) == getattr(alone.stats, name), (name, p)
        k = 0 if p.method == "none" else p.num_speculative_tokens
        assert result.stats.mean_chosen_k <= k


@pytest.mark.parametrize(("chunk", "batch_chunk", "chunks"), [(8, None, 4), (8, 2048, 1)])
def test_generate_many_prefills_by_its_own_budget_and_answers_do_not_change(
    chunk: int, batch_chunk: int | None, chunks: int
) -> None:
    """Alone (no loop), ``generate_many`` takes ``batch_prefill_chunk`` prompt tokens a step
    (None: ``prefill_chunk``); the step's width changes batch company, never a float32 greedy
    answer."""
    engine = _engine("llama", 32, 2, 9)
    engine = SpeculativeEngine(
        engine.target,
        engine.draft,
        config=EngineConfig(prefill_chunk=chunk, batch_prefill_chunk=batch_chunk),
    )
    runs: list[int] = []
    prefill = engine._core.target.prefill

    def counted(slot: int, token_ids: list[int]):  # type: ignore[no-untyped-def]
        runs.append(len(token_ids))
        return prefill(slot, token_ids)

    engine._core.target.prefill = counted  # type: ignore[method-assign]
    long_prompt = [(7 * i) % VOCAB for i in range(30)]
    engine.generate(long_prompt, SamplingParams(max_new_tokens=2))
    assert len(runs) == chunks and sum(runs) == 30
    prompts, params = mixed_requests(VOCAB, 9, 9)
    results = engine.generate_many(prompts, params, max_batch_size=4)
    assert not _check_all(engine, prompts, params, results)
    for prompt, p, result in zip(prompts, params, results, strict=True):
        assert result.token_ids == engine.generate(prompt, p).token_ids


def test_batch_of_one_is_alone() -> None:
    engine = _engine("llama", 32, 2, 8)
    params = SamplingParams(max_new_tokens=12, num_speculative_tokens=3)
    [result] = engine.generate_many([[5, 6, 7, 8]], [params])
    assert result.stats.mean_batch_size == 1.0
    assert result.token_ids == engine.generate([5, 6, 7, 8], params).token_ids


def test_rows_of_other_architectures_run_one_after_another() -> None:
    engine = _engine("gpt2", 32, 2, 9)
    prompts, params = mixed_requests(VOCAB, 6, 9)
    results = engine.generate_many(prompts, params, max_batch_size=4)
    assert not _check_all(engine, prompts, params, results)


def test_bad_requests_fail_by_index_and_the_others_are_answered() -> None:
    engine = _engine("llama", 32, 2, 10)
    good = SamplingParams(max_new_tokens=6, num_speculative_tokens=2)
    prompts = [[1, 2, 3], [], [4, 5, 6], [1] * engine.max_context, [7, 8], [9, 10]]
    params = [good, good, good, good, "not params", good]
    with pytest.raises(BatchRequestError) as info:
        engine.generate_many(prompts, params)  # type: ignore[arg-type]
    error = info.value
    assert set(error.errors) == {1, 3, 4}
    message = str(error)
    assert "request 1: prompt_token_ids: empty prompt" in message
    assert "request 3: prompt_token_ids" in message and "context" in message
    assert "request 4: params" in message
    refs = References(engine.target)
    for i in (0, 2, 5):
        result = error.results[i]
        assert result is not None and result.token_ids == refs(prompts[i], 6)
    assert all(error.results[i] is None for i in (1, 3, 4))


def test_params_must_match_prompts() -> None:
    engine = _engine("llama", 32, 2, 10)
    with pytest.raises(ValueError, match="params"):
        engine.generate_many([[1, 2], [3, 4]], [SamplingParams()])
    # One SamplingParams serves every prompt.
    results = engine.generate_many([[1, 2], [3, 4]], SamplingParams(max_new_tokens=3))
    assert [len(r.token_ids) for r in results] == [3, 3]


def test_context_limit_caps_each_row() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=2, max_positions=40)
    engine = SpeculativeEngine(target, target, config=EngineConfig(max_speculative_tokens=6))
    prompts = [list(range(30)), [1, 2, 3], list(range(35, 0, -1))]
    params = [SamplingParams(max_new_tokens=64, num_speculative_tokens=k) for k in (4, 6, 2)]
    results = engine.generate_many(prompts, params)
    refs = References(target)
    for prompt, result in zip(prompts, results, strict=True):
        assert len(result.token_ids) == engine.max_context - len(prompt)
        check_greedy(target, prompt, result.token_ids, refs(prompt, len(result.token_ids)))
