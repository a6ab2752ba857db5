"""Method ``suffix`` on real vLLM (its CPU build, float32) beside the torch engine: the same
greedy answers on the demo pair's RAG prompts, and vLLM's suffix proposer really drafts.

vLLM's suffix decoding runs arctic-inference's suffix tree (built into .venv-vllm by
``make vllm-venv``); its global tree is off (generation/vllm_engine/mapping.py), so both engines
draft from each request's own prompt and output.
"""

from __future__ import annotations

from typing import Any

import pytest

from generation import SamplingParams, load_engine
from tests.generation.conformance import check_stats_invariants
from tests.vllm.support import EnginePool
from tests.vllm.test_demo_pair import DRAFT, TARGET, rag_prompts

MAX_NEW = 48
K = 8


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return rag_prompts(6)


@pytest.fixture(scope="module")
def vllm_suffix(engine_pool: EnginePool) -> Any:
    return engine_pool.get(TARGET, None, "suffix", K)


def test_suffix_answers_equal_the_torch_engine(vllm_suffix: Any, prompts: list[list[int]]) -> None:
    torch_engine = load_engine("torch", TARGET, DRAFT, device="cpu", dtype="float32")
    params = SamplingParams(max_new_tokens=MAX_NEW, method="suffix", num_speculative_tokens=K)
    none = SamplingParams(max_new_tokens=MAX_NEW, method="none")
    ours = torch_engine.generate_many(prompts, params)
    reference = torch_engine.generate_many(prompts, none)
    theirs = vllm_suffix.generate_many(prompts, params)
    for mine, ref, other in zip(ours, reference, theirs, strict=True):
        assert mine.token_ids == ref.token_ids
        assert other.token_ids == mine.token_ids
        check_stats_invariants(other.stats, len(other.token_ids), MAX_NEW)
        assert other.stats.method == "suffix"
    # Both proposers drafted from the prompts (RAG answers quote their passages).
    assert sum(r.stats.num_draft_tokens for r in theirs) > 0
    assert sum(r.stats.num_accepted_tokens for r in theirs) > 0
    assert sum(r.stats.num_accepted_tokens for r in ours) > 0
