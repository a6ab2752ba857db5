"""The shipped demo pair on real vLLM (CPU build, float32, draft_model k = 4), beside the torch
engine: identical answers, stats against vLLM's own Prometheus counters, the online loop
(many in flight, streamed deltas, cancel = abort), bad requests refused before vLLM sees them,
and a close without tracebacks. One vLLM engine for the file (tests/vllm/support.py).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from generation import Cancelled, SamplingParams, load_engine, load_tokenizer
from retrieval.chat import PromptFormat
from retrieval.prompt import Passage
from tests.generation.conformance import check_stats_invariants
from tests.vllm.support import EnginePool
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
TARGET, DRAFT = REPO / "models" / "demo" / "target", REPO / "models" / "demo" / "draft"
MAX_NEW = 48


def rag_prompts(count: int) -> list[list[int]]:
    """RAG prompts through the demo pair's chat template from the bundled demo corpus."""
    fmt = PromptFormat.for_tokenizer(load_tokenizer(str(TARGET)))  # the service's prompt
    files = sorted((REPO / "demo" / "corpus").glob("*.md"))
    prompts = []
    for i in range(count):
        docs = [files[(2 * i) % len(files)], files[(2 * i + 1) % len(files)]]
        passages = [Passage(d.stem, " ".join(d.read_text().split()[:60])) for d in docs]
        prompts.append(fmt.encode(f"What is {docs[0].stem}?", passages))
    return prompts


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return rag_prompts(16)


@pytest.fixture(scope="module")
def vllm_engine(engine_pool: EnginePool) -> Any:
    return engine_pool.get(
        TARGET, DRAFT, "draft_model", 4, llm_kwargs={"kv_cache_memory_bytes": 512 << 20}
    )


@pytest.fixture(scope="module")
def torch_answers(prompts: list[list[int]]) -> list[list[int]]:
    engine = load_engine("torch", TARGET, DRAFT, device="cpu")
    params = SamplingParams(max_new_tokens=MAX_NEW)
    return [engine.generate(p, params).token_ids for p in prompts]


def vllm_counter(name: str) -> float:
    """The sum over engines and labels of one of vLLM's own Prometheus counters (this process)."""
    from prometheus_client import REGISTRY

    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == name:
                total += sample.value
    return total


def per_position_counter() -> dict[int, float]:
    from prometheus_client import REGISTRY

    found: dict[int, float] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                pos = int(sample.labels["position"])
                found[pos] = found.get(pos, 0.0) + sample.value
    return found


def test_answers_are_the_torch_engines_one_by_one_and_batched(
    vllm_engine: Any, prompts: list[list[int]], torch_answers: list[list[int]]
) -> None:
    params = SamplingParams(max_new_tokens=MAX_NEW)
    alone = [vllm_engine.generate(p, params) for p in prompts]
    assert [r.token_ids for r in alone] == torch_answers
    batched = vllm_engine.generate_many(prompts, params)
    assert [r.token_ids for r in batched] == torch_answers
    for result in alone + batched:
        check_stats_invariants(result.stats, len(result.token_ids), MAX_NEW)
    assert max(r.stats.mean_batch_size for r in batched) > 1  # they did share vLLM's batch


def test_stats_sum_to_vllms_own_prometheus_counters(
    vllm_engine: Any, prompts: list[list[int]]
) -> None:
    names = [
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:generation_tokens_total",
    ]
    before = {n: vllm_counter(n) for n in names}
    pos_before = per_position_counter()
    lengths = [5 + 7 * i for i in range(len(prompts))]  # many requests end mid-round
    params = [SamplingParams(max_new_tokens=n) for n in lengths]
    results = vllm_engine.generate_many(prompts, params)
    stats = [r.stats for r in results]
    # vLLM's logger records an iteration's stats after its outputs are handed out: the counters
    # catch up with the last iteration a moment after generate_many returns.
    output_tokens = sum(s.num_output_tokens for s in stats)
    wait_until(
        lambda: vllm_counter(names[3]) - before[names[3]] >= output_tokens,
        10,
        f"vLLM's {names[3]} to count {output_tokens} more tokens",
        interval=0.05,
        explain=lambda: vllm_counter(names[3]) - before[names[3]],
    )
    delta = {n: vllm_counter(n) - before[n] for n in names}
    pos = {p: v - pos_before.get(p, 0.0) for p, v in per_position_counter().items()}
    assert delta["vllm:generation_tokens_total"] == output_tokens
    assert delta["vllm:spec_decode_num_drafts_total"] == sum(s.num_drafts for s in stats)
    assert delta["vllm:spec_decode_num_draft_tokens_total"] == sum(
        s.num_draft_tokens for s in stats
    )
    # vLLM counts the drafts it accepted before max_tokens cut the last round; our stats count
    # only accepted tokens kept (docs/vllm.md): vLLM's total is ours plus what the cuts dropped.
    ours = sum(s.num_accepted_tokens for s in stats)
    dropped = delta["vllm:spec_decode_num_accepted_tokens_total"] - ours
    cut = sum(1 for r, n in zip(results, lengths, strict=True) if len(r.token_ids) == n)
    assert 0 <= dropped <= 3 * cut
    for i in range(4):
        kept = sum(s.accepted_per_position[i] for s in stats)
        assert kept <= pos.get(i, 0.0) <= kept + cut


def test_many_in_flight_stream_deltas_that_add_up(
    vllm_engine: Any, prompts: list[list[int]], torch_answers: list[list[int]]
) -> None:
    loop = vllm_engine.start_loop(24)
    streamed: dict[int, list[int]] = {i: [] for i in range(24)}
    lock = threading.Lock()

    def on_delta(i: int) -> Any:
        def add(ids: list[int]) -> None:
            with lock:
                streamed[i].extend(ids)

        return add

    params = SamplingParams(max_new_tokens=MAX_NEW)
    handles = [loop.submit(prompts[i % 16], params, on_delta(i)) for i in range(24)]
    try:
        results = [h.result(300) for h in handles]
    finally:
        loop.close()
    for i, result in enumerate(results):
        assert result.token_ids == torch_answers[i % 16]
        assert streamed[i] == result.token_ids
    assert max(r.stats.mean_batch_size for r in results) > 4


def test_cancel_aborts_in_vllm_and_no_later_request_sees_its_tokens(
    vllm_engine: Any, prompts: list[list[int]], torch_answers: list[list[int]]
) -> None:
    loop = vllm_engine.start_loop(8)
    try:
        long = [loop.submit(p, SamplingParams(max_new_tokens=400)) for p in prompts[:4]]
        for handle in long:
            next(iter(handle.deltas()))  # each is running in vLLM
        for handle in long:
            handle.cancel()
        for handle in long:
            with pytest.raises(Cancelled):
                handle.result(60)
        wait_until(
            lambda: vllm_engine.llm.get_num_unfinished_requests() == 0,
            10,
            "vLLM to free the cancelled requests",
            interval=0.05,
        )
        later = [loop.submit(p, SamplingParams(max_new_tokens=MAX_NEW)) for p in prompts[:8]]
        assert [h.result(120).token_ids for h in later] == torch_answers[:8]
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], {}, "empty"),
        ([8194], {}, "outside the vocabulary"),  # 8192 + the two ChatML tokens
        ([1] * 2048, {}, "context"),
        ([1, 2], {"method": "ngram"}, "started with method='draft_model'"),
        ([1, 2], {"num_speculative_tokens": 2}, "num_speculative_tokens=2"),
    ],
)
def test_bad_requests_are_refused_before_vllm_sees_them(
    vllm_engine: Any, prompt: list[int], params: dict, message: str
) -> None:
    before = vllm_counter("vllm:prompt_tokens_total"), vllm_counter("vllm:request_success_total")
    loop = vllm_engine.start_loop(2)
    try:
        handle = loop.submit(prompt, SamplingParams(**params))
        with pytest.raises(ValueError, match=message):
            handle.result(10)
    finally:
        loop.close()
    with pytest.raises(ValueError, match=message):
        vllm_engine.generate(prompt, SamplingParams(**params))
    after = vllm_counter("vllm:prompt_tokens_total"), vllm_counter("vllm:request_success_total")
    assert after == before  # vLLM never received them


def test_close_leaves_no_traceback(engine_pool: EnginePool, capfd: pytest.CaptureFixture) -> None:
    """vLLM logged an EngineDeadError traceback when its engine core stopped under a live
    output handler; close cancels the handler first. Closes every engine the pool holds."""
    assert engine_pool.engines
    engines = list(engine_pool.engines.values())
    engine_pool.close()
    out, err = capfd.readouterr()
    assert all(e.closed for e in engines)
    for text in (out, err):
        assert "Traceback" not in text and "EngineDeadError" not in text, text[-3000:]
    with pytest.raises(RuntimeError, match="closed"):
        engines[0].generate([1, 2, 3], SamplingParams())
