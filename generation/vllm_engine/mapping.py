"""vLLM mapping: our request and stats types to and from vLLM's config, params and metrics.

Pure functions on vLLM's documented shapes (vllm==0.32.0); nothing here imports vLLM, so it is
unit-tested on CPU against stand-ins. Sources for every field: docs/vllm.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from generation.params import SamplingParams
from generation.stats import GenerationStats

VLLM_PIN = "0.32.0"
AUTO_NUM_SPECULATIVE_TOKENS = 4
"""k for ``"auto"``: the k of a batch-size schedule at batch size 1 (see ``speculative_config``)."""
logger = logging.getLogger(__name__)

DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
NGRAM_LOOKUP_MIN, NGRAM_LOOKUP_MAX = 1, 4
"""n-gram lengths prompt lookup matches; the same range as the torch engine's proposer."""
SUFFIX_MAX_TREE_DEPTH, SUFFIX_MAX_SPEC_FACTOR, SUFFIX_MIN_TOKEN_PROB = 64, 1.0, 0.1
"""vLLM's suffix decoding as the torch engine's defaults (EngineConfig.suffix_*)."""


class VLLMUnavailableError(RuntimeError):
    """vLLM cannot run here: the package is not installed, or there is no (or too small a) GPU."""


class VLLMOptionError(ValueError):
    """An engine option (``SPECRAG_VLLM_OPTIONS``) that this engine or vLLM does not accept."""


class UnsupportedSpeculationError(ValueError):
    """A speculation method or k, or sampling while speculating, that vLLM (or this started
    engine) cannot serve."""


class SpecMetricsMissingError(RuntimeError):
    """vLLM finished a speculating request without its per-request spec-decode metrics."""


@dataclass(frozen=True)
class Speculation:
    """The proposer and k a vLLM engine is started with; vLLM cannot change them per request."""

    method: str = "draft_model"
    """``draft_model``, ``eagle`` (the draft checkpoint is then an EAGLE head), ``ngram``,
    ``suffix`` or ``none``."""
    num_speculative_tokens: int | str = 4
    """k >= 1, or ``"auto"``; ignored for ``none``."""

    def __post_init__(self) -> None:
        # SamplingParams validates method and k the same way the API does.
        SamplingParams(method=self.method, num_speculative_tokens=self.num_speculative_tokens)

    def serves(self, params: SamplingParams) -> bool:
        """Return whether a request asks for exactly this speculation."""
        if params.method != self.method:
            return False
        return self.method == "none" or params.num_speculative_tokens == self.num_speculative_tokens


def speculative_config(
    speculation: Speculation,
    draft_dir: str | Path | None,
    auto_batch_schedule: Sequence[Sequence[int]] | None = None,
    tensor_parallel_size: int = 1,
    draft_sample_method: str = "greedy",
) -> dict[str, Any] | None:
    """Return vLLM's ``speculative_config`` dict for ``speculation`` (None for method ``none``).

    ``draft_model`` proposes the draft's argmax (``draft_sample_method="greedy"``, vLLM's
    default) and shards the draft like the target (vLLM's draft-model proposer refuses any
    other ``draft_tensor_parallel_size``). Greedy drafts are verified as one-hot proposals:
    the answers still follow the target's law exactly, and a seeded request is reproducible.
    ``"probabilistic"`` samples drafts from the draft's distribution (higher acceptance at
    temperature > 0, as on the torch engine) but vLLM 0.32 draws that noise from the global
    RNG, not the request's seeded generator, so seeded answers differ run to run (measured,
    docs/vllm.md). ``auto`` maps to
    k = AUTO_NUM_SPECULATIVE_TOKENS; vLLM's batch-size-dependent k
    (``num_speculative_tokens_per_batch_size``) is passed only when ``auto_batch_schedule`` is
    given, after ``check_batch_schedule``: vLLM documents it as tested with EAGLE-family
    drafters, not ``draft_model``.
    """
    method, k = speculation.method, speculation.num_speculative_tokens
    if method == "none":
        return None
    num_tokens = AUTO_NUM_SPECULATIVE_TOKENS if k == "auto" else int(k)
    if method == "draft_model":
        if draft_dir is None:
            raise UnsupportedSpeculationError(
                "method: 'draft_model' needs a draft checkpoint; none was given"
            )
        config: dict[str, Any] = {
            "method": "draft_model",
            "model": str(draft_dir),
            "draft_sample_method": draft_sample_method,
            "draft_tensor_parallel_size": tensor_parallel_size,
        }
    elif method == "eagle":
        if draft_dir is None:
            raise UnsupportedSpeculationError(
                "method: 'eagle' needs an EAGLE head checkpoint (generation/spec_decode/eagle.py); none "
                "was given"
            )
        config = {"method": "eagle", "model": str(draft_dir)}
    elif method == "ngram":
        config = {
            "method": "ngram",
            "prompt_lookup_min": NGRAM_LOOKUP_MIN,
            "prompt_lookup_max": NGRAM_LOOKUP_MAX,
        }
    elif method == "suffix":
        # vLLM's global suffix tree is one per process, shared by every request whatever its
        # tenant: off (0 cached requests), so a request drafts from its own prompt and output
        # only and no tenant's answer is proposed to another (the torch engine's scopes).
        config = {
            "method": "suffix",
            "suffix_decoding_max_tree_depth": SUFFIX_MAX_TREE_DEPTH,
            "suffix_decoding_max_spec_factor": SUFFIX_MAX_SPEC_FACTOR,
            "suffix_decoding_min_token_prob": SUFFIX_MIN_TOKEN_PROB,
            "suffix_decoding_max_cached_requests": 0,
        }
    else:
        raise UnsupportedSpeculationError(f"method: vLLM engine does not support {method!r}")
    if method == "draft_model" and draft_sample_method not in DRAFT_SAMPLE_METHODS:
        raise UnsupportedSpeculationError(
            f"draft_sample_method: expected one of {', '.join(DRAFT_SAMPLE_METHODS)}, "
            f"got {draft_sample_method!r}"
        )
    config["num_speculative_tokens"] = num_tokens
    if auto_batch_schedule is not None:
        if k != "auto":
            raise UnsupportedSpeculationError(
                "auto_batch_schedule: only for num_speculative_tokens='auto'; "
                f"this engine starts with a fixed k={k}"
            )
        rows = check_batch_schedule(auto_batch_schedule, num_tokens)
        config["num_speculative_tokens_per_batch_size"] = [list(row) for row in rows]
    return config


def check_batch_schedule(rows: Sequence[Sequence[int]], max_k: int) -> list[tuple[int, int, int]]:
    """Return the rows of a batch-size schedule sorted, or raise naming the broken rule.

    vLLM's own rules (``validate_and_normalize_dynamic_sd_schedule``): a non-empty list of
    ``[min_bs, max_bs, k]`` rows, batch sizes positive, ``min_bs <= max_bs``, ``k >= 0``,
    ranges that do not overlap, the first starting at 1; and, from vLLM's documentation,
    every ``k <= num_speculative_tokens``. Checked here so a bad setting fails at start with
    our error rather than inside vLLM's engine process.
    """

    def refuse(reason: str) -> UnsupportedSpeculationError:
        return UnsupportedSpeculationError(f"auto_batch_schedule: {reason}")

    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise refuse("expected a non-empty list of [min_bs, max_bs, k] rows")
    parsed: list[tuple[int, int, int]] = []
    for row in rows:
        if (
            isinstance(row, (str, bytes))
            or not isinstance(row, Sequence)
            or len(row) != 3
            or any(isinstance(v, bool) or not isinstance(v, int) for v in row)
        ):
            raise refuse(f"row {row!r} is not [min_bs, max_bs, k] of three integers")
        lo, hi, k = (int(v) for v in row)
        if lo <= 0 or hi <= 0:
            raise refuse(f"row {list(row)}: batch sizes must be positive")
        if lo > hi:
            raise refuse(f"row {list(row)}: min_bs must be <= max_bs")
        if not 0 <= k <= max_k:
            raise refuse(f"row {list(row)}: k must be in [0, {max_k}] (num_speculative_tokens)")
        parsed.append((lo, hi, k))
    parsed.sort()
    for (_, prev_hi, _), (lo, hi, k) in zip(parsed, parsed[1:], strict=False):
        if lo <= prev_hi:
            raise refuse(f"row {[lo, hi, k]} overlaps the range ending at {prev_hi}")
    if parsed[0][0] != 1:
        raise refuse("the first range must start at batch size 1")
    return parsed


def sampling_kwargs(params: SamplingParams, stop_token_ids: list[int], max_tokens: int) -> dict:
    """Return ``vllm.SamplingParams`` keyword arguments for one request."""
    return {
        "n": 1,
        "temperature": float(params.temperature),
        # top_p=1 keeps the target's full distribution (no nucleus truncation).
        "top_p": 1.0,
        "seed": params.seed,
        "max_tokens": max_tokens,
        # vLLM starts without a tokenizer, so end-of-sequence ids are passed explicitly.
        "stop_token_ids": list(stop_token_ids),
        "detokenize": False,
    }


@dataclass
class SpecCounters:
    """Spec-decode counters of one request, read from vLLM's ``RequestSpecDecodeMetrics``."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    last_accepted: int | None = None
    """Drafts accepted in the request's last round, when vLLM reports rounds in order."""
    drafted_per_round: list[int] = field(default_factory=list)
    """Draft tokens of each round, in order (level "detailed" only)."""

    @classmethod
    def from_request(cls, metrics: Any) -> SpecCounters:
        """Read vLLM's per-request ``RequestSpecDecodeMetrics`` (object or dict).

        ``per_step_accepted``/``per_step_drafted`` (level "detailed") give every verification
        round; else ``histogram[j]`` counts rounds that accepted exactly j draft tokens.
        """
        accepted = [int(a) for a in _get(metrics, "per_step_accepted") or []]
        drafted = [int(d) for d in _get(metrics, "per_step_drafted") or []]
        if not accepted:
            histogram = [int(c) for c in _get(metrics, "histogram") or []]
            accepted = [j for j, count in enumerate(histogram) for _ in range(count)]
            drafted = []
        width = int(_get(metrics, "num_spec_tokens") or max(accepted, default=0))
        per_position = [sum(1 for a in accepted if a > i) for i in range(width)]
        return cls(
            # A round whose drafts were all invalidated drafted 0 tokens: not a draft round.
            num_drafts=sum(1 for d in drafted if d > 0) if drafted else len(accepted),
            num_draft_tokens=int(_get(metrics, "num_draft_tokens") or sum(drafted)),
            num_accepted_tokens=sum(accepted),
            accepted_per_position=per_position,
            last_accepted=accepted[-1] if drafted else None,
            drafted_per_round=drafted,
        )


def request_counters(
    completion: Any, speculation: Speculation, num_output_tokens: int, k_varies: bool
) -> SpecCounters:
    """Return the spec-decode counters of one finished request, never silent zeros.

    vLLM attaches ``spec_decode_metrics`` to the final output only, and (it seems) only once a
    round carried drafts, so None can be honest: a request that ended at its prefill, an
    n-gram request that never matched, a batch-size schedule at k = 0. A fixed-k draft model
    drafts in every round, so one that emitted more than k + 1 tokens had draft rounds:
    missing metrics there raise ``SpecMetricsMissingError`` rather than record zero drafts.
    Otherwise a request with decode steps and no metrics is logged as a warning.
    """
    if speculation.method == "none":
        return SpecCounters()
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is not None:
        return SpecCounters.from_request(metrics)
    k = speculation.num_speculative_tokens
    k_max = AUTO_NUM_SPECULATIVE_TOKENS if k == "auto" else int(k)
    if speculation.method == "draft_model" and not k_varies and num_output_tokens > k_max + 1:
        raise SpecMetricsMissingError(
            f"vLLM returned no per-request spec-decode metrics for a draft-model request of "
            f"{num_output_tokens} tokens (k={k_max}), which must have had draft rounds; "
            f"refusing to record zero drafts (is vllm=={VLLM_PIN} installed?)"
        )
    if num_output_tokens > 1:
        logger.warning(
            "vLLM returned no spec-decode metrics for a %s request of %d tokens; "
            "recording it as a request without draft rounds",
            speculation.method,
            num_output_tokens,
        )
    return SpecCounters()


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def request_timings_ms(metrics: Any) -> tuple[float | None, float | None]:
    """Return (ttft_ms, generation_ms) from vLLM's ``RequestStateStats``, or Nones without it.

    TTFT is ``first_token_latency`` (arrival to first token, frontend clock); generation adds
    ``last_token_ts - first_token_ts`` (engine-core clock, so only the difference is used).
    """
    ttft = _get(metrics, "first_token_latency") if metrics is not None else None
    if not ttft:
        return None, None
    first, last = _get(metrics, "first_token_ts") or 0.0, _get(metrics, "last_token_ts") or 0.0
    return ttft * 1000.0, (ttft + max(0.0, last - first)) * 1000.0


def cached_prompt_tokens(final: Any) -> int:
    """Return the prompt tokens vLLM's prefix cache supplied (``RequestOutput.num_cached_tokens``).

    vLLM leaves it None before the request was scheduled, and older builds lack it: 0 then.
    """
    cached = _get(final, "num_cached_tokens")
    return max(0, int(cached)) if cached is not None else 0


def build_stats(
    params: SamplingParams,
    num_output_tokens: int,
    counters: SpecCounters,
    ttft_ms: float | None,
    generation_ms: float | None,
    mean_batch_size: float = 1.0,
) -> GenerationStats:
    """Return the contract's stats for one vLLM request, counting only accepted tokens kept.

    The prefill emits one token and every later target forward emits 1 + its accepted drafts,
    so output = 1 + rounds + accepted - cut, where ``cut`` counts tokens of the last round that
    max_tokens or EOS dropped. vLLM counts acceptances before that cut and reports neither
    forwards nor draft-less rounds, so: d = output - 1 - draft rounds - accepted is (draft-less
    rounds - cut); d < 0 means at least -d tokens were cut (taken as exactly -d, i.e. no
    draft-less rounds: always so for a draft model), and of those cut - 1 were accepted drafts
    (the round's bonus/recovered token goes first). docs/vllm.md says when this is exact.
    """
    d = num_output_tokens - 1 - counters.num_drafts - counters.num_accepted_tokens
    dropped = max(0, -d - 1)  # accepted drafts of the last round that vLLM then cut
    per_position = list(counters.accepted_per_position)
    top = counters.last_accepted
    if top is None:  # "summary" metrics: the last round is unknown; take the longest run
        top = max((i + 1 for i, count in enumerate(per_position) if count > 0), default=0)
    for i in range(max(0, top - dropped), top):
        per_position[i] -= 1
    return GenerationStats(
        method=params.method,
        num_speculative_tokens=params.num_speculative_tokens,
        num_output_tokens=num_output_tokens,
        num_target_forwards=counters.num_drafts + max(0, d),
        num_drafts=counters.num_drafts,
        num_draft_tokens=counters.num_draft_tokens,
        num_accepted_tokens=counters.num_accepted_tokens - dropped,
        accepted_per_position=per_position,
        ttft_ms=ttft_ms,
        generation_ms=generation_ms,
        mean_batch_size=mean_batch_size,
    )
