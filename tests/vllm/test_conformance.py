"""ENGINE's conformance suite (tests/generation/conformance.py) on real vLLM, CPU build, float32.

The suite varies method and k per request; vLLM fixes them at start, so every request goes to
the real engine started for its speculation (tests/vllm/support.py), and each (method, k) is
another engine start (20-60 s here). So the tests over k run on SPECULATIONS: draft_model at
k = 1, 4 and "auto" (vLLM: k = 4 without a batch-size schedule, an engine of its own since it
serves only "auto" requests), ngram at k = 4, none; not the torch engine's every method at
1, 2, 4, 8 and "auto". `make test` must stay within minutes.
The reference is transformers' own greedy decoding of the same random-weight target, in
float32; head_dim 64 because vLLM's CPU attention kernels take no smaller head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from generation import BatchRequestError, Engine, SamplingParams
from generation.vllm_engine import UnsupportedSpeculationError
from tests.generation.conformance import EngineConformance, check_stats_invariants, make_prompts
from tests.generation.tiny_models import (
    build_model,
    perturbed_copy,
    reference_greedy,
    save_checkpoint,
)
from tests.vllm.support import EnginePool, PerSpeculationEngine

VOCAB = 96
SPECULATIONS: list[tuple[str, int | str]] = [
    ("draft_model", 1), ("draft_model", 4), ("draft_model", "auto"), ("ngram", 4), ("none", 4),
]  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    target = build_model("llama", vocab_size=VOCAB, seed=3, hidden_size=256, logit_scale=4.0)
    root = tmp_path_factory.mktemp("vllm_pair")
    draft = perturbed_copy(target, noise=0.3)
    return target, save_checkpoint(target, root / "target"), save_checkpoint(draft, root / "draft")


@pytest.fixture(scope="module")
def engine(engine_pool: EnginePool, pair: tuple[Any, Path, Path]) -> Iterator[PerSpeculationEngine]:
    yield PerSpeculationEngine(engine_pool, pair[1], pair[2], max_model_len=256)


@pytest.fixture(scope="module")
def reference(pair: tuple[Any, Path, Path]) -> Callable[[list[int], int], list[int]]:
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


class TestVLLMConformance(EngineConformance):
    """The suite on real vLLM; the tests over k are re-parametrized with SPECULATIONS."""

    @pytest.mark.parametrize(("method", "k"), SPECULATIONS)
    def test_greedy_equals_target_alone(
        self,
        engine: Engine,
        reference: Callable[[list[int], int], list[int]],
        prompts: list[list[int]],
        method: str,
        k: int | str,
    ) -> None:
        super().test_greedy_equals_target_alone(engine, reference, prompts, method, k)

    @pytest.mark.parametrize("temperature", [0.0, 0.8])
    @pytest.mark.parametrize(("method", "k"), SPECULATIONS)
    def test_stats_invariants(
        self, engine: PerSpeculationEngine, prompts: list[list[int]], method: str, k: int | str,
        temperature: float,
    ) -> None:  # fmt: skip
        """vLLM's per-request metrics and our stats from them keep the invariants, greedy and
        sampling."""
        for i, prompt in enumerate(prompts):
            params = SamplingParams(
                max_new_tokens=17, temperature=temperature, seed=i, method=method,
                num_speculative_tokens=k,
            )  # fmt: skip
            result = engine.for_params(params).generate(prompt, params)
            assert result.stats.method == method and result.stats.num_speculative_tokens == k
            check_stats_invariants(result.stats, len(result.token_ids), 17)
            if method == "none":
                assert result.stats.num_draft_tokens == 0

    @pytest.mark.parametrize(("method", "k"), [s for s in SPECULATIONS if s[0] != "none"])
    def test_sampling_while_speculating_is_refused_without_the_kernel_fix(
        self, engine: PerSpeculationEngine, prompts: list[list[int]], method: str, k: int | str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:  # fmt: skip
        """Where vLLM's CPU build runs its own expand kernel (a vLLM other than the pinned one,
        or VLLM_PLUGINS without ours), sampling while speculating follows the wrong law: refused
        with the way out before vLLM sees the request, alone, batched and on the loop; greedy
        is served. Here the plugin is active, so the engine is told it is not."""
        params = SamplingParams(
            max_new_tokens=5, temperature=0.8, seed=1, method=method, num_speculative_tokens=k
        )
        real = engine.for_params(params)
        assert real.platform == "cpu" and real.samples_exactly_while_speculating
        monkeypatch.setattr(real, "samples_exactly_while_speculating", False)
        refusal = r"^temperature: vLLM 0\.32\.0's CPU build .* ask temperature=0"
        with pytest.raises(UnsupportedSpeculationError, match=refusal):
            real.generate(prompts[0], params)
        with pytest.raises(BatchRequestError) as batch:
            real.generate_many(prompts[:2], [params, replace(params, temperature=0.0)])
        assert list(batch.value.errors) == [0] and batch.value.results[1] is not None
        loop = real.start_loop(2)
        try:
            with pytest.raises(UnsupportedSpeculationError, match=refusal):
                loop.submit(prompts[0], params).result(10)
        finally:
            loop.close()
        assert real.llm.get_num_unfinished_requests() == 0

    def test_properties(self, engine: Engine) -> None:
        real = engine.for_params(SamplingParams())  # type: ignore[attr-defined]
        super().test_properties(real)
        assert real.platform == "cpu" and real.engine_args["dtype"] == "float32"

    def test_draft_rounds_carry_vllms_own_per_request_metrics(
        self, engine: PerSpeculationEngine, prompts: list[list[int]]
    ) -> None:
        """Greedy draft rounds at every position: exact counts follow from the tokens."""
        real = engine.for_params(SamplingParams())
        for prompt in prompts:
            stats = real.generate(prompt, SamplingParams(max_new_tokens=32)).stats
            assert stats.num_drafts > 0 and stats.num_draft_tokens == 4 * stats.num_drafts
            assert stats.num_target_forwards == stats.num_drafts  # a draft model drafts always
            assert 0 < stats.ttft_ms <= stats.generation_ms  # type: ignore[operator]
