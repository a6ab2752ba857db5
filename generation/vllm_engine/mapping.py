"""vLLM mapping: our request and stats types to and from vLLM's config, params and metrics.

Pure functions on vLLM's documented shapes (vllm==0.32.0); nothing here imports vLLM, so it is
unit-tested on CPU against stand-ins. Sources for every field: docs/vllm.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from generation.params import SamplingParams
from generation.stats import GenerationStats

VLLM_PIN = "0.32.0"
AUTO_NUM_SPECULATIVE_TOKENS = 4
"""k for ``"auto"``: the k of a batch-size schedule at batch size 1 (see ``speculative_config``)."""
NGRAM_LOOKUP_MIN, NGRAM_LOOKUP_MAX = 1, 4
"""n-gram lengths prompt lookup matches; the same range as the torch engine's proposer."""
COUNTER_NAMES = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POSITION_COUNTER = "vllm:spec_decode_num_accepted_tokens_per_pos"


class VLLMUnavailableError(RuntimeError):
    """vLLM cannot run here: the package is not installed, or there is no (or too small a) GPU."""


class UnsupportedSpeculationError(ValueError):
    """A speculation method or k that vLLM, or this started engine, cannot serve."""


@dataclass(frozen=True)
class Speculation:
    """The proposer and k a vLLM engine is started with; vLLM cannot change them per request."""

    method: str = "draft_model"
    """``draft_model``, ``ngram`` or ``none``."""
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
    auto_batch_schedule: Sequence[tuple[int, int, int]] | None = None,
) -> dict[str, Any] | None:
    """Return vLLM's ``speculative_config`` dict for ``speculation`` (None for method ``none``).

    ``auto`` maps to k = AUTO_NUM_SPECULATIVE_TOKENS. vLLM's batch-size-dependent k
    (``num_speculative_tokens_per_batch_size``: rows ``[min_bs, max_bs, k]``) is passed only
    when ``auto_batch_schedule`` is given: at one request at a time it is a single fixed k, and
    vLLM documents it as tested with EAGLE-family drafters, not ``draft_model``.
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
        config: dict[str, Any] = {"method": "draft_model", "model": str(draft_dir)}
    elif method == "ngram":
        config = {
            "method": "ngram",
            "prompt_lookup_min": NGRAM_LOOKUP_MIN,
            "prompt_lookup_max": NGRAM_LOOKUP_MAX,
        }
    else:
        raise UnsupportedSpeculationError(f"method: vLLM engine does not support {method!r}")
    config["num_speculative_tokens"] = num_tokens
    if k == "auto" and auto_batch_schedule:
        rows = [[int(lo), int(hi), int(rk)] for lo, hi, rk in auto_batch_schedule]
        if any(not 0 <= rk <= num_tokens or lo > hi for lo, hi, rk in rows):
            raise UnsupportedSpeculationError(
                f"auto_batch_schedule: rows must be [min_bs <= max_bs, 0 <= k <= {num_tokens}]"
            )
        config["num_speculative_tokens_per_batch_size"] = rows
    return config


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
    """Spec-decode counters of one request (or deltas of vLLM's aggregate counters)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    last_accepted: int | None = None
    """Drafts accepted in the request's last round, when vLLM reports rounds in order."""

    @classmethod
    def from_metrics(cls, metrics: Sequence[Any]) -> SpecCounters:
        """Sum ``LLM.get_metrics()``'s spec-decode Counter/Vector entries (over engine labels)."""
        counters = cls()
        for metric in metrics:
            name = getattr(metric, "name", None)
            if name in COUNTER_NAMES:
                attr = COUNTER_NAMES[name]
                setattr(counters, attr, getattr(counters, attr) + int(metric.value))
            elif name == PER_POSITION_COUNTER:
                counters.accepted_per_position = _add(counters.accepted_per_position, metric.values)
        return counters

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
        )

    def minus(self, before: SpecCounters) -> SpecCounters:
        """Return the counts added since ``before`` (one request, when it ran alone)."""
        width = max(len(self.accepted_per_position), len(before.accepted_per_position))
        after_pos = _add([0] * width, self.accepted_per_position)
        before_pos = _add([0] * width, before.accepted_per_position)
        return SpecCounters(
            num_drafts=self.num_drafts - before.num_drafts,
            num_draft_tokens=self.num_draft_tokens - before.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - before.num_accepted_tokens,
            accepted_per_position=[a - b for a, b in zip(after_pos, before_pos, strict=True)],
        )


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _add(total: list[int], values: Sequence[int]) -> list[int]:
    out = list(total) + [0] * max(0, len(values) - len(total))
    for i, value in enumerate(values):
        out[i] += int(value)
    return out


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


def build_stats(
    params: SamplingParams,
    num_output_tokens: int,
    counters: SpecCounters,
    ttft_ms: float | None,
    generation_ms: float | None,
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
    if top is None:  # counter deltas: the last round is unknown; take the longest accepted run
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
    )
