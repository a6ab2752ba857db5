"""The vLLM engine's mapping, checks and stats, against a STAND-IN for vLLM.

vLLM cannot be installed or run on these machines (no GPU; its wheels need CUDA), so most tests
here drive ``VLLMEngine`` through ``tests/generation/vllm_standin.py``: a fake ``vllm`` whose
``AsyncLLM`` takes vllm==0.32.0's documented keyword arguments, returns its documented output
shapes, batches every request in flight and answers ``abort``. Its "model" is a toy greedy
speculative decoder, so stats are checked against known true counts. These tests show our
mapping is right for the documented shapes, not that vLLM behaves as documented: that needs the
GPU test at the end, which skips (and says why) wherever vLLM or CUDA is missing. The online
loop (concurrency, streaming, abort) is tested in test_vllm_loop.py.
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
)
from generation.vllm_engine import engine as engine_module
from generation.vllm_engine.mapping import cached_prompt_tokens
from tests.generation import vllm_standin
from tests.generation.conformance import EngineConformance, check_stats_invariants
from tests.generation.vllm_standin import (
    PROMPT,
    AsyncEngineArgs,
    RequestSpecDecodeMetrics,
    start,
)
from tests.generation.vllm_standin import SamplingParams as StandinSamplingParams


# --- parameter and config mapping -----------------------------------------------------------
def test_speculative_config_maps_each_method(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    assert speculative_config(Speculation("draft_model", 4), draft, None, 2) == {
        "method": "draft_model", "model": str(draft), "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic", "draft_tensor_parallel_size": 2,
    }  # fmt: skip
    assert speculative_config(Speculation("ngram", 3), None) == {
        "method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4,
        "num_speculative_tokens": 3,
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
    with pytest.raises(VLLMUnavailableError, match=r"vllm. extra on a GPU host"):
        start(tiny_models)


def test_load_engine_selects_this_engine(tiny_models: dict[str, Path], standin_vllm: Any) -> None:
    from generation import load_engine

    engine = load_engine("vllm", tiny_models["target"], tiny_models["draft"], device="auto")
    assert isinstance(engine, VLLMEngine) and engine.speculation == Speculation("draft_model", 4)
    engine.close()


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


def test_without_a_gpu_the_error_says_so(
    tiny_models: dict[str, Path], standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "_cuda_device_count", lambda: 0)
    with pytest.raises(VLLMUnavailableError, match=r"needs 1 CUDA GPU\(s\).*has 0"):
        start(tiny_models)
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
    with pytest.raises(ValueError, match="CUDA only"):
        VLLMEngine.from_pretrained(tiny_models["target"], device="cpu")
    with pytest.raises(UnsupportedSpeculationError, match="unknown method 'eagle'"):
        start(tiny_models, method="eagle")
    with pytest.raises(UnsupportedSpeculationError, match="must start at batch size 1"):
        start(tiny_models, k="auto", auto_batch_schedule=[(4, 8, 2)])
    with pytest.raises(ValueError, match="max_num_seqs: must be an int >= 1"):
        start(tiny_models, max_num_seqs=0)
    with pytest.raises(CheckpointError, match="does not exist"):
        VLLMEngine.from_pretrained(tmp_path / "missing")


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
    with pytest.raises(IncompatibleDraftError, match="map 2 tokens to different ids"):
        VLLMEngine.from_pretrained(tiny_models["target"], draft)


def test_requests_are_checked_against_the_started_speculation(
    engine_factory: Any, standin_vllm: Any
) -> None:
    engine = engine_factory("draft_model", 4)
    with pytest.raises(UnsupportedSpeculationError, match="started with method='draft_model'"):
        engine.generate(PROMPT, SamplingParams(method="ngram"))
    with pytest.raises(UnsupportedSpeculationError, match="num_speculative_tokens=2"):
        engine.generate(PROMPT, SamplingParams(num_speculative_tokens=2))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([engine.vocab_size], SamplingParams())
    with pytest.raises(ValueError, match="leaves no room"):
        engine.generate([1] * engine.max_context, SamplingParams())
    assert not standin_vllm.instances[-1].seen  # nothing bad reached vLLM
    # An engine without speculation serves method "none" whatever k the request names.
    plain = engine_factory("none")
    assert "per_request_spec_decode_metrics" not in standin_vllm.instances[-1].kwargs
    result = plain.generate(PROMPT, SamplingParams(method="none", num_speculative_tokens=7))
    assert result.stats.num_drafts == 0
    assert result.stats.num_target_forwards == len(result.token_ids) - 1


# --- the engine end to end on the stand-in --------------------------------------------------
def test_from_pretrained_starts_vllm_with_documented_arguments(
    engine_factory: Any, standin_vllm: Any, tiny_models: dict[str, Path]
) -> None:
    engine = engine_factory("draft_model", 4, max_model_len=256, tensor_parallel_size=1)
    kwargs = standin_vllm.instances[-1].kwargs
    assert kwargs["model"] == str(tiny_models["target"])
    assert kwargs["speculative_config"] == {
        "method": "draft_model", "model": str(tiny_models["draft"]), "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic", "draft_tensor_parallel_size": 1,
    }  # fmt: skip
    assert kwargs["skip_tokenizer_init"] and kwargs["disable_log_stats"] is False
    assert kwargs["per_request_spec_decode_metrics"] == "detailed"
    assert kwargs["max_model_len"] == 256 and engine.max_context == 256
    assert kwargs["max_num_seqs"] == engine.max_num_seqs == 64
    config = json.loads((tiny_models["target"] / "config.json").read_text())
    assert engine.vocab_size == config["vocab_size"]
    assert engine.eos_token_id == config["eos_token_id"]
    assert engine.model_pair == "target+draft"


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_stats_count_kept_tokens_like_the_torch_engine(
    engine_factory: Any, standin_vllm: Any, method: str
) -> None:
    engine = engine_factory(method, 4)
    llm, cut_rounds = standin_vllm.instances[-1], 0
    for max_new in range(2, 40):
        params = SamplingParams(max_new_tokens=max_new, method=method, num_speculative_tokens=4)
        result = engine.generate(PROMPT, params)
        stats, truth = result.stats, list(llm.finished.values())[-1]
        check_stats_invariants(stats, len(result.token_ids), max_new)  # ENGINE's conformance
        assert result.token_ids == truth.out
        assert stats.ttft_ms == pytest.approx(21.0)
        assert stats.generation_ms == pytest.approx(21.0 + 5 * len(result.token_ids))
        cut_rounds += sum(truth.accepted) > stats.num_accepted_tokens
        if method == "draft_model":  # every round drafts: exact
            assert stats.num_target_forwards == truth.rounds
            assert stats.accepted_per_position == truth.kept_per_pos
        else:  # draft-less rounds and a cut last round cannot be told apart (docs/vllm.md)
            assert truth.rounds - 4 <= stats.num_target_forwards <= truth.rounds
    assert cut_rounds > 0, "the stand-in never cut a round: the correction went untested"


def test_budget_and_eos_are_passed_to_vllm(engine_factory: Any, standin_vllm: Any) -> None:
    engine = engine_factory(max_model_len=20)
    result = engine.generate(PROMPT, SamplingParams(max_new_tokens=64))
    sent = list(standin_vllm.instances[-1].finished.values())[-1].sp
    assert sent["max_tokens"] == 20 - len(PROMPT)
    assert sent["stop_token_ids"] == [engine.eos_token_id]
    assert len(result.token_ids) <= 20 - len(PROMPT)


# --- real vLLM on a GPU: ENGINE's conformance suite (skips here) ------------------------------
def _vllm_and_cuda() -> bool:
    import torch

    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


NEEDS_GPU = pytest.mark.skipif(not _vllm_and_cuda(), reason="needs the vllm package and a CUDA GPU")
GPU_VOCAB = 96


class PerSpeculationEngines:
    """The conformance suite varies method and k per request; vLLM fixes them at start.

    This test-only ``Engine`` starts one ``VLLMEngine`` per (method, k) on first use, on small
    slices of GPU memory, and sends each request to the one started for it.
    """

    def __init__(self, target: Path, draft: Path) -> None:
        self.target, self.draft = target, draft
        self.engines: dict[tuple[str, int | str], VLLMEngine] = {}
        self.none = self._get(SamplingParams(method="none"))

    def _get(self, params: SamplingParams) -> VLLMEngine:
        k = 4 if params.method == "none" else params.num_speculative_tokens
        key = (params.method, k)
        if key not in self.engines:
            self.engines[key] = VLLMEngine.from_pretrained(
                self.target, self.draft, method=params.method, num_speculative_tokens=k,
                gpu_memory_utilization=0.05, max_model_len=256,
                # float32 keeps greedy argmax comparable with the transformers reference.
                llm_kwargs={"dtype": "float32", "enforce_eager": True},
            )  # fmt: skip
        return self.engines[key]

    vocab_size = property(lambda self: self.none.vocab_size)
    max_context = property(lambda self: self.none.max_context)
    eos_token_id = property(lambda self: self.none.eos_token_id)
    model_pair = property(lambda self: self.none.model_pair)

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Any:
        return self._get(params).generate(prompt_token_ids, params)

    def close(self) -> None:
        for started in self.engines.values():
            started.close()


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    from tests.generation.tiny_models import build_model, perturbed_copy, save_checkpoint

    # head_dim 64 (256 / 4): vLLM's attention kernels do not take the CPU tests' head_dim 8.
    target = build_model("llama", vocab_size=GPU_VOCAB, seed=3, hidden_size=256, logit_scale=4.0)
    root = tmp_path_factory.mktemp("vllm_pair")
    draft = perturbed_copy(target, noise=0.3)
    return target, save_checkpoint(target, root / "target"), save_checkpoint(draft, root / "draft")


@pytest.fixture(scope="module")
def engine(gpu_pair: tuple[Any, Path, Path]) -> Any:
    engines = PerSpeculationEngines(gpu_pair[1], gpu_pair[2])
    yield engines
    engines.close()


@pytest.fixture(scope="module")
def reference(gpu_pair: tuple[Any, Path, Path]) -> Any:
    from tests.generation.tiny_models import reference_greedy

    return lambda prompt, n: reference_greedy(gpu_pair[0], prompt, n)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from tests.generation.conformance import make_prompts

    return make_prompts(GPU_VOCAB, range(3))


@pytest.mark.vllm
@NEEDS_GPU
class TestVLLMEngineConformance(EngineConformance):
    """ENGINE's conformance suite on real vLLM: greedy equality, stats invariants, bad input."""

    def test_vllm_returns_per_request_metrics(self, engine: PerSpeculationEngines) -> None:
        spec = engine._get(SamplingParams())
        stats = spec.generate(list(range(20)) * 2, SamplingParams(max_new_tokens=32)).stats
        assert stats.num_drafts > 0 and stats.ttft_ms is not None

    def test_batched_requests_match_their_solo_runs(self, engine: PerSpeculationEngines) -> None:
        spec = engine._get(SamplingParams())
        prompts = [list(range(i, i + 12)) for i in range(12)]
        params = SamplingParams(max_new_tokens=24)
        alone = [spec.generate(p, params) for p in prompts]
        loop = spec.start_loop(12)
        together = [h.result(120) for h in [loop.submit(p, params) for p in prompts]]
        for a, b in zip(alone, together, strict=True):
            assert a.token_ids == b.token_ids and a.stats.num_drafts == b.stats.num_drafts
