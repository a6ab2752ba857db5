"""The vLLM engine's mapping, checks and stats, against a STAND-IN for vLLM.

vLLM cannot be installed or run on these machines (no GPU; its wheels need CUDA), so most tests
here drive ``VLLMEngine`` through ``standin_vllm``: a fake ``vllm`` module whose ``LLM`` and
``SamplingParams`` take vllm==0.32.0's documented keyword arguments and return its documented
output shapes (``RequestOutput.outputs[0].token_ids`` / ``.spec_decode_metrics``,
``RequestOutput.metrics``, ``LLM.get_metrics()`` Counter/Vector entries). Its "model" is a toy
greedy speculative decoder, so the stats conversion is checked against known true counts. These
tests show our mapping is right for the documented shapes, not that vLLM behaves as documented:
that needs the GPU test at the end, which skips (and says why) wherever vLLM or CUDA is missing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from dataclasses import dataclass, field
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
    request_timings_ms,
    sampling_kwargs,
    speculative_config,
)
from generation.vllm_engine import engine as engine_module
from tests.generation.conformance import EngineConformance, check_stats_invariants

LLM_KWARGS = {  # vllm 0.32 EngineArgs fields this engine passes
    "model", "skip_tokenizer_init", "generation_config", "tensor_parallel_size",
    "gpu_memory_utilization", "speculative_config", "disable_log_stats",
    "per_request_spec_decode_metrics", "max_model_len",
}  # fmt: skip
SAMPLING_KWARGS = {
    "n",
    "temperature",
    "top_p",
    "seed",
    "max_tokens",
    "stop_token_ids",
    "detokenize",
}


# --- the stand-in ---------------------------------------------------------------------------
@dataclass
class Counter:  # vllm.v1.metrics.reader.Counter
    name: str
    labels: dict[str, str]
    value: int


@dataclass
class Vector:  # vllm.v1.metrics.reader.Vector
    name: str
    labels: dict[str, str]
    values: list[int]


@dataclass
class RequestSpecDecodeMetrics:  # CompletionOutput.spec_decode_metrics
    num_spec_tokens: int
    histogram: list[int]
    num_draft_tokens: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)


class StandinSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - SAMPLING_KWARGS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {unknown}")
        self.kwargs = kwargs


def target_next(ctx: list[int], vocab: int) -> int:
    return (ctx[-1] * 7 + len(ctx) * 3 + 1) % vocab


class StandinLLM:
    """Greedy speculative decoding over a toy target; the draft errs every 5th position."""

    reject_per_request = False
    instances: list[StandinLLM] = []

    def __init__(self, **kwargs: Any) -> None:
        if set(kwargs) - LLM_KWARGS:
            raise TypeError(
                f"EngineArgs got unexpected keyword arguments {set(kwargs) - LLM_KWARGS}"
            )
        if self.reject_per_request and "per_request_spec_decode_metrics" in kwargs:
            raise TypeError("unexpected keyword argument 'per_request_spec_decode_metrics'")
        if kwargs.get("per_request_spec_decode_metrics", "none") != "none":
            if kwargs["speculative_config"] is None:  # vllm/config/vllm.py refuses this
                raise ValueError("per-request spec decode metrics require speculative decoding")
        self.kwargs = kwargs
        self.vocab = json.loads((Path(kwargs["model"]) / "config.json").read_text())["vocab_size"]
        spec = kwargs["speculative_config"] or {}
        self.k, self.method = spec.get("num_speculative_tokens", 0), spec.get("method", "none")
        # Earlier traffic: counters never start at zero.
        self.counts = {"num_drafts": 11, "num_draft_tokens": 40, "num_accepted_tokens": 23}
        self.per_pos = [9, 7, 5, 2][: self.k] + [0] * max(0, self.k - 4)
        self.last_rounds, self.kept_per_pos = 0, [0] * self.k
        StandinLLM.instances.append(self)

    def _propose(self, ctx: list[int]) -> list[int]:
        if self.method == "ngram" and len(ctx) % 3 == 0:
            return []  # no n-gram match: a round without drafts
        draft: list[int] = []
        for _ in range(self.k):
            t = target_next(ctx + draft, self.vocab)
            draft.append(t if (len(ctx) + len(draft)) % 5 else (t + 1) % self.vocab)
        return draft

    def generate(self, prompts: list[dict], sampling_params: Any, use_tqdm: bool = True) -> list:
        return [self._run(list(p["prompt_token_ids"]), sampling_params.kwargs) for p in prompts]

    def _run(self, ctx: list[int], sp: dict[str, Any]) -> Any:
        stop, out, accepted, drafted, rounds = set(sp["stop_token_ids"]), [], [], [], 0
        emitted, round_accepted = [target_next(ctx, self.vocab)], 0  # the prefill's token
        kept_per_pos = [0] * self.k  # what a kept-tokens count (the torch engine's) would say
        while True:
            done = False
            for i, t in enumerate(emitted):  # vLLM drops what follows a stop or max_tokens
                out.append(t)
                ctx.append(t)
                if i < round_accepted:
                    kept_per_pos[i] += 1
                if t in stop or len(out) >= sp["max_tokens"]:
                    done = True
                    break
            if done:
                break
            draft, emitted, rounds = self._propose(ctx), [], rounds + 1
            for d in draft:
                if d != target_next(ctx + emitted, self.vocab):
                    break
                emitted.append(d)
            round_accepted = len(emitted)
            if draft:
                accepted.append(round_accepted)
                drafted.append(len(draft))
            emitted.append(target_next(ctx + emitted, self.vocab))  # recovered or bonus token
        self.last_rounds, self.kept_per_pos = rounds, kept_per_pos
        self.counts["num_drafts"] += len(accepted)
        self.counts["num_draft_tokens"] += sum(drafted)
        self.counts["num_accepted_tokens"] += sum(accepted)
        for a in accepted:
            for i in range(a):
                self.per_pos[i] += 1
        level = self.kwargs.get("per_request_spec_decode_metrics", "none")
        metrics = None
        if self.k and level != "none":
            metrics = RequestSpecDecodeMetrics(
                self.k, [accepted.count(j) for j in range(self.k + 1)], sum(drafted)
            )
            if level == "detailed":
                metrics.per_step_accepted, metrics.per_step_drafted = accepted, drafted
        completion = types.SimpleNamespace(
            index=0, text="", token_ids=out, spec_decode_metrics=metrics
        )
        stats = types.SimpleNamespace(  # RequestStateStats
            num_generation_tokens=len(out), arrival_time=1e9, queued_ts=50.0, scheduled_ts=50.001,
            first_token_ts=50.02, last_token_ts=50.02 + 0.005 * len(out), first_token_latency=0.021,
        )  # fmt: skip
        return types.SimpleNamespace(outputs=[completion], metrics=stats, finished=True)

    def get_metrics(self) -> list[Any]:
        if not self.k:
            return []
        metrics: list[Any] = [
            Counter(f"vllm:spec_decode_{n}", {"engine": "0"}, v) for n, v in self.counts.items()
        ]
        # A second data-parallel engine's labels: summed, never changes here.
        metrics.append(Counter("vllm:spec_decode_num_drafts", {"engine": "1"}, 5))
        metrics.append(
            Vector(
                "vllm:spec_decode_num_accepted_tokens_per_pos", {"engine": "0"}, list(self.per_pos)
            )
        )
        return metrics + [Counter("vllm:request_success", {}, 3)]


@pytest.fixture
def standin_vllm(monkeypatch: pytest.MonkeyPatch) -> type[StandinLLM]:
    """Install the stand-in as ``vllm`` and report one CUDA GPU (there is none here)."""
    module = types.ModuleType("vllm")
    module.__version__ = "0.32.0"  # type: ignore[attr-defined]
    module.LLM = StandinLLM  # type: ignore[attr-defined]
    module.SamplingParams = StandinSamplingParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(engine_module, "_cuda_device_count", lambda: 1)
    monkeypatch.setattr(StandinLLM, "reject_per_request", False)
    StandinLLM.instances = []
    return StandinLLM


def start(
    models: dict[str, Path], method: str = "draft_model", k: int | str = 4, **kw: Any
) -> VLLMEngine:
    draft = models["draft"] if method == "draft_model" else None
    return VLLMEngine.from_pretrained(
        models["target"], draft, method=method, num_speculative_tokens=k, **kw
    )


PROMPT = [5, 17, 42, 17, 42, 99, 3, 17, 42]


# --- parameter and config mapping -----------------------------------------------------------
def test_speculative_config_maps_each_method(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    assert speculative_config(Speculation("draft_model", 4), draft) == {
        "method": "draft_model", "model": str(draft), "num_speculative_tokens": 4,
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
    config = speculative_config(auto, tmp_path, [(1, 8, 4), (9, 64, 2)])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 2]]  # type: ignore[index]
    with pytest.raises(UnsupportedSpeculationError, match="auto_batch_schedule"):
        speculative_config(auto, tmp_path, [(1, 8, 9)])  # k above num_speculative_tokens


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
    for source, last in ((detailed, 1), (summary, None)):
        counters = SpecCounters.from_request(source)
        assert counters == SpecCounters(5, 20, 11, [4, 3, 2, 2], last_accepted=last)


def test_a_round_whose_drafts_were_all_invalidated_is_not_a_draft_round() -> None:
    metrics = RequestSpecDecodeMetrics(3, [2, 1, 0, 0], 3, [0, 1, 0], [0, 3, 0])
    assert SpecCounters.from_request(metrics).num_drafts == 1


def test_aggregate_counters_sum_engines_and_subtract() -> None:
    before = SpecCounters.from_metrics(
        [Counter("vllm:spec_decode_num_drafts", {"engine": "0"}, 10),
         Counter("vllm:spec_decode_num_drafts", {"engine": "1"}, 5),
         Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {}, [4, 1])]
    )  # fmt: skip
    after = SpecCounters(num_drafts=18, accepted_per_position=[6, 2, 1])
    assert before.num_drafts == 15
    assert after.minus(before) == SpecCounters(3, 0, 0, [2, 1, 1])


def test_timings_come_from_request_metrics() -> None:
    stats = types.SimpleNamespace(first_token_latency=0.25, first_token_ts=7.0, last_token_ts=8.5)
    assert request_timings_ms(stats) == pytest.approx((250.0, 1750.0))
    assert request_timings_ms(None) == (None, None)


def test_build_stats_fills_every_contract_field() -> None:
    params = SamplingParams(num_speculative_tokens="auto")
    stats = build_stats(params, 12, SpecCounters(3, 12, 8, [3, 3, 1, 1]), 5.0, 40.0).to_dict()
    assert stats["num_speculative_tokens"] == "auto" and stats["method"] == "draft_model"
    assert stats["num_target_forwards"] == 3  # 12 tokens - prefill's 1 - 8 accepted
    assert stats["acceptance_rate"] == pytest.approx(8 / 12)
    assert stats["mean_acceptance_length"] == pytest.approx(1 + 8 / 3)


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


def test_load_engine_passes_settings_options_to_vllm(
    tiny_models: dict[str, Path], standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPECRAG_VLLM_OPTIONS (a JSON object) reaches vLLM's constructor, e.g. tensor parallelism."""
    from app.settings import Settings
    from generation import load_engine

    monkeypatch.setenv("SPECRAG_VLLM_OPTIONS", '{"tensor_parallel_size": 1, "max_model_len": 192}')
    options = Settings().vllm_options
    engine = load_engine("vllm", tiny_models["target"], tiny_models["draft"], "cuda", options)
    assert isinstance(engine, VLLMEngine)
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


def test_bad_device_method_and_checkpoint_fail_before_vllm(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="CUDA only"):
        VLLMEngine.from_pretrained(tiny_models["target"], device="cpu")
    with pytest.raises(UnsupportedSpeculationError, match="unknown method 'eagle'"):
        start(tiny_models, method="eagle")
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
    tiny_models: dict[str, Path], standin_vllm: Any
) -> None:
    engine = start(tiny_models, "draft_model", 4)
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
    # An engine without speculation serves method "none" whatever k the request names.
    plain = start(tiny_models, "none")
    assert "per_request_spec_decode_metrics" not in standin_vllm.instances[-1].kwargs
    result = plain.generate(PROMPT, SamplingParams(method="none", num_speculative_tokens=7))
    assert result.stats.num_drafts == 0
    assert result.stats.num_target_forwards == len(result.token_ids) - 1


# --- the engine end to end on the stand-in --------------------------------------------------
def test_from_pretrained_starts_vllm_with_documented_arguments(
    tiny_models: dict[str, Path], standin_vllm: Any
) -> None:
    engine = start(tiny_models, "draft_model", 4, max_model_len=256, tensor_parallel_size=1)
    kwargs = standin_vllm.instances[-1].kwargs
    assert kwargs["model"] == str(tiny_models["target"])
    assert kwargs["speculative_config"] == {
        "method": "draft_model", "model": str(tiny_models["draft"]), "num_speculative_tokens": 4,
    }  # fmt: skip
    assert kwargs["skip_tokenizer_init"] and kwargs["disable_log_stats"] is False
    assert kwargs["per_request_spec_decode_metrics"] == "detailed"
    assert kwargs["max_model_len"] == 256 and engine.max_context == 256
    config = json.loads((tiny_models["target"] / "config.json").read_text())
    assert engine.vocab_size == config["vocab_size"]
    assert engine.eos_token_id == config["eos_token_id"]
    assert engine.model_pair == "target+draft" and engine.per_request_metrics


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_stats_count_kept_tokens_like_the_torch_engine(
    tiny_models: dict[str, Path], standin_vllm: Any, method: str
) -> None:
    engine = start(tiny_models, method, 4)
    cut_rounds = 0
    for max_new in range(2, 40):
        params = SamplingParams(max_new_tokens=max_new, method=method, num_speculative_tokens=4)
        result = engine.generate(PROMPT, params)
        llm, stats = standin_vllm.instances[-1], result.stats
        check_stats_invariants(stats, len(result.token_ids), max_new)  # ENGINE's conformance
        assert stats.ttft_ms == pytest.approx(21.0)
        assert stats.generation_ms == pytest.approx(21.0 + 5 * len(result.token_ids))
        metrics = llm.generate([{"prompt_token_ids": PROMPT}], StandinSamplingParams(
            **sampling_kwargs(params, [engine.eos_token_id], max_new)
        ))[0].outputs[0].spec_decode_metrics  # fmt: skip
        cut_rounds += sum(metrics.per_step_accepted) > stats.num_accepted_tokens
        if method == "draft_model":  # every round drafts: exact
            assert stats.num_target_forwards == llm.last_rounds
            assert stats.accepted_per_position == llm.kept_per_pos
        else:  # draft-less rounds and a cut last round cannot be told apart (docs/vllm.md)
            assert llm.last_rounds - 4 <= stats.num_target_forwards <= llm.last_rounds
    assert cut_rounds > 0, "the stand-in never cut a round: the correction went untested"


def test_counter_fallback_gives_the_same_stats(
    tiny_models: dict[str, Path], standin_vllm: Any
) -> None:
    params = SamplingParams(max_new_tokens=60)
    exact = start(tiny_models).generate(PROMPT, params)
    standin_vllm.reject_per_request = True  # a vLLM without per-request metrics
    fallback_engine = start(tiny_models)
    assert not fallback_engine.per_request_metrics
    fallback = fallback_engine.generate(PROMPT, params)
    assert fallback.token_ids == exact.token_ids
    assert fallback.stats.to_dict() == exact.stats.to_dict()
    assert exact.stats.num_drafts > 0


def test_budget_and_eos_are_passed_to_vllm(
    tiny_models: dict[str, Path], standin_vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = start(tiny_models, max_model_len=20)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        engine, "sampling_params_cls", lambda **kw: sent.append(kw) or StandinSamplingParams(**kw)
    )
    result = engine.generate(PROMPT, SamplingParams(max_new_tokens=64))
    assert sent[0]["max_tokens"] == 20 - len(PROMPT)
    assert sent[0]["stop_token_ids"] == [engine.eos_token_id]
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


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    from tests.generation.tiny_models import build_model, perturbed_copy, save_checkpoint

    # head_dim 64 (256 / 4): vLLM's attention kernels do not take the CPU tests' head_dim 8.
    target = build_model("llama", vocab_size=GPU_VOCAB, seed=3, hidden_size=256, logit_scale=4.0)
    root = tmp_path_factory.mktemp("vllm_pair")
    draft = perturbed_copy(target, noise=0.3)
    return target, save_checkpoint(target, root / "target"), save_checkpoint(draft, root / "draft")


@pytest.fixture(scope="module")
def engine(gpu_pair: tuple[Any, Path, Path]) -> PerSpeculationEngines:
    return PerSpeculationEngines(gpu_pair[1], gpu_pair[2])


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
        assert spec.per_request_metrics, "vllm 0.32 should accept per_request_spec_decode_metrics"
        stats = spec.generate(list(range(20)) * 2, SamplingParams(max_new_tokens=32)).stats
        assert stats.num_drafts > 0 and stats.ttft_ms is not None
