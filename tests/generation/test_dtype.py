"""bfloat16: choosing it (auto, refusals on a CPU without it), what runs in it (weights, KV, prefix
blocks), what stays float32 (logits, sampling), and greedy exactness in it: speculative output
equals the bf16 ``none`` run except at near-ties, each counted (generation/exactness.py).

Tests that need bfloat16 hand the engine models cast to it, or force the CPU check on, so they
pass on a CPU without AMX / AVX-512 BF16 too (slowly emulated, but tiny).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from generation import (
    EngineConfig,
    SamplingParams,
    SpeculativeEngine,
    load_engine,
)
from generation.exactness import check_greedy
from generation.model import dtypes, model_runner
from generation.spec_decode.eagle import EagleHeadModule, head_config
from tests.generation.tiny_models import build_model, perturbed_copy

pytestmark = pytest.mark.models

VOCAB = 96


@pytest.fixture
def no_bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU, as far as the engine can tell, has neither AMX nor AVX-512 BF16."""
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: frozenset())


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU, as far as the engine can tell, has AMX."""
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: frozenset({"amx_bf16"}))


def test_an_unknown_dtype_is_refused_naming_the_choices(tiny_models: dict[str, Path]) -> None:
    choices = "expected one of float32, bfloat16, auto"
    with pytest.raises(ValueError, match=f"dtype: unknown 'float16'; {choices}"):
        dtypes.resolve_dtype("float16", "cpu")
    with pytest.raises(ValueError, match=f"engine config: dtype: unknown 'half'; {choices}"):
        EngineConfig(dtype="half")
    with pytest.raises(ValueError, match=choices):
        load_engine("torch", tiny_models["target"], dtype="fp8")


@pytest.mark.usefixtures("no_bf16_cpu")
def test_without_cpu_support_auto_is_float32_and_bfloat16_is_refused(
    tiny_models: dict[str, Path],
) -> None:
    assert dtypes.resolve_dtype("auto", "cpu") == "float32"
    assert dtypes.resolve_dtype("auto", "cuda") == "bfloat16"  # every CUDA GPU we run on has it
    engine = SpeculativeEngine.from_pretrained(tiny_models["target"], dtype="auto")
    assert engine.dtype == "float32" and engine.target_forward.dtype == torch.float32
    refusal = r"dtype 'bfloat16': .*amx_bf16 / avx512_bf16.*use dtype 'float32'"
    with pytest.raises(ValueError, match=refusal):
        SpeculativeEngine.from_pretrained(tiny_models["target"], dtype="bfloat16")
    with pytest.raises(ValueError, match=refusal):
        load_engine("torch", tiny_models["target"], config=EngineConfig(dtype="bfloat16"))


@pytest.mark.usefixtures("bf16_cpu")
def test_bfloat16_halves_kv_and_keeps_logits_and_stats_float32_side(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fixed amount of free memory, so the slots that fit are comparable.
    monkeypatch.setattr(model_runner, "free_memory_bytes", lambda device: 1 << 26)
    config = EngineConfig(max_batch_size=10**6, prefix_cache_mb=1.0)
    t, d = tiny_models["target"], tiny_models["draft"]
    f32 = SpeculativeEngine.from_pretrained(t, d, config=config)  # the Python default
    bf16 = SpeculativeEngine.from_pretrained(t, d, config=config, dtype="auto")
    assert (f32.dtype, bf16.dtype) == ("float32", "bfloat16")
    assert bf16.config.dtype == "bfloat16"
    assert 2 * bf16.kv_bytes_per_slot == f32.kv_bytes_per_slot
    assert bf16.max_concurrency in (2 * f32.max_concurrency, 2 * f32.max_concurrency + 1)
    assert {s.keys[0].dtype for s in bf16.kv_stores} == {torch.bfloat16}
    assert (
        bf16.prefix_cache is not None and bf16.prefix_cache.target.keys[0].dtype == torch.bfloat16
    )
    logits = bf16._core.target.prefill(0, [1, 2, 3])
    assert logits.dtype == torch.float32  # softmax, sampling and the rejection rule see these
    result = bf16.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=4, method="draft_model"))
    assert result.stats.dtype == "bfloat16" and result.stats.to_dict()["dtype"] == "bfloat16"
    assert f32.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=4)).stats.dtype == "float32"
    # The engine casts handed models to the config's dtype; None keeps theirs.
    target = build_model("llama", vocab_size=VOCAB)
    assert SpeculativeEngine(target, config=EngineConfig(dtype="bfloat16")).dtype == "bfloat16"
    assert SpeculativeEngine(build_model("llama", vocab_size=VOCAB)).dtype == "float32"


@pytest.fixture(scope="module")
def bf16_engine() -> SpeculativeEngine:
    """A sharpened tiny pair in bfloat16 (logits far from uniform, as a trained model's)."""
    target = build_model("llama", vocab_size=VOCAB, seed=5, hidden_size=64, logit_scale=8.0)
    draft = perturbed_copy(target, noise=0.3)
    torch.manual_seed(5)
    head = EagleHeadModule(head_config(target.config)).to(torch.bfloat16)
    engine = SpeculativeEngine(target.to(torch.bfloat16), draft.to(torch.bfloat16), eagle=head)
    engine.step_costs().timer = lambda batch_size, ks, with_draft: {k: 0.01 for k in ks}
    engine.step_costs().eagle_timer = lambda batch_size, ks: {k: 0.01 for k in ks}
    return engine


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(4, 30))] for _ in range(n)]


CASES = [("draft_model", 1), ("draft_model", 3), ("draft_model", 6), ("ngram", 2)]
CASES += [("draft_model", "auto"), ("eagle", 3), ("eagle", "auto")]


def test_greedy_speculation_in_bf16_is_the_none_run_but_at_near_ties(
    bf16_engine: SpeculativeEngine,
) -> None:
    """Alone and in a batch of 12 (its company changes the shapes that round)."""
    engine, prompts = bf16_engine, _prompts(12)
    none = SamplingParams(max_new_tokens=40)
    reference = [engine.generate(p, none).token_ids for p in prompts]
    excused: list[tuple[Any, ...]] = []
    runs = 0
    for method, k in CASES:
        params = SamplingParams(max_new_tokens=40, method=method, num_speculative_tokens=k)
        alone = [engine.generate(p, params).token_ids for p in prompts]
        batched = [r.token_ids for r in engine.generate_many(prompts, params)]
        for i, p in enumerate(prompts):
            for how, out in (("alone", alone[i]), ("batched", batched[i])):
                runs += 1
                div = check_greedy(engine.target_forward, p, reference[i], out)
                if div is None:
                    continue
                assert div.excused, (method, k, how, i, div)  # a clear margin: a bug
                excused.append((method, k, how, i, div))
    print(f"bf16 greedy: {len(excused)} of {runs} runs diverged from none, all at near-ties")
    for case in excused:
        print("  excused:", case)
    assert len(excused) <= runs // 4  # near-ties are rare at these margins


def test_a_divergence_at_a_clear_margin_is_not_excused(bf16_engine: SpeculativeEngine) -> None:
    engine = bf16_engine
    [prompt] = _prompts(1)
    reference = engine.generate(prompt, SamplingParams(max_new_tokens=12)).token_ids
    wrong = list(reference)
    wrong[5] = (wrong[5] + 1) % VOCAB  # not the argmax: the second-best or worse
    div = check_greedy(engine.target_forward, prompt, reference, wrong)
    assert div is not None and div.position == 5
    assert not div.excused, div
    assert check_greedy(engine.target_forward, prompt, reference, list(reference)) is None


def test_prefix_reuse_and_goodput_k_in_bf16(bf16_engine: SpeculativeEngine) -> None:
    """Reused bf16 blocks give the no-reuse answers but at near-ties; "auto" prices bf16 steps."""
    plain = bf16_engine
    config = EngineConfig(prefix_cache_mb=1.0, prefix_block_size=4)
    cached = SpeculativeEngine(plain.target, plain.draft, config=config)
    assert cached.dtype == "bfloat16"
    rng = random.Random(3)
    passages = [[rng.randrange(VOCAB) for _ in range(16)] for _ in range(2)]
    prompts = [passages[i % 2] + [rng.randrange(VOCAB) for _ in range(3)] for i in range(6)]
    params = SamplingParams(max_new_tokens=24, method="draft_model", num_speculative_tokens="auto")
    results = cached.generate_many(prompts, params, max_batch_size=2)
    assert sum(r.stats.num_cached_prompt_tokens for r in results) >= 4 * 16
    assert all(r.stats.mean_chosen_k is not None for r in results)
    for prompt, result in zip(prompts, results, strict=True):
        reference = plain.generate(prompt, SamplingParams(max_new_tokens=24)).token_ids
        div = check_greedy(plain.target_forward, prompt, reference, result.token_ids)
        assert div is None or div.excused, div


def test_bf16_changes_float32_answers_only_within_the_rounding_between_them() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=5, hidden_size=64, logit_scale=8.0)
    f32 = SpeculativeEngine(target)
    bf16 = SpeculativeEngine(build_model("llama", vocab_size=VOCAB, seed=5, hidden_size=64,
                                         logit_scale=8.0).to(torch.bfloat16))  # fmt: skip
    params = SamplingParams(max_new_tokens=40, method="none")
    differ = 0
    for prompt in _prompts(12):
        ref, out = f32.generate(prompt, params).token_ids, bf16.generate(prompt, params).token_ids
        div = check_greedy(f32.target_forward, prompt, ref, out, other_fwd=bf16.target_forward)
        assert div is None or div.excused, div
        differ += div is not None
    print(f"bf16 vs float32: {differ} of 12 greedy answers differ, all within their rounding")
