"""vLLM engine for GPU workers: the production path behind the same ``Engine`` protocol.

vLLM runs the target and a co-located draft with its own speculative decoding. Three facts of
vLLM shape this package:

- speculation (proposer and k) is fixed when vLLM starts, so a ``VLLMEngine`` serves the
  ``Speculation`` it was started with and refuses other requests with a clear error;
- vLLM batches every request in flight on one ``AsyncLLM``; ``start_loop`` gives the worker an
  online loop on it (submit, streamed deltas, cancel = ``AsyncLLM.abort``), and each result's
  stats come from that request's own spec-decode metrics, exact under batching;
- vLLM 0.32's CPU build samples from the wrong law while speculating (its rejection sampler's
  CPU fallback never writes the per-position temperatures), so on the CPU platform a
  speculating engine refuses temperature > 0 (docs/vllm.md).

Pinned: ``vllm==0.32.0``, the newest release whose torch pin (2.13.0) matches ours. Importing
this package does not import vLLM; ``VLLMEngine.from_pretrained`` does. Sources: docs/vllm.md.
"""

from generation.vllm_engine.checkpoints import check_draft_vocab, checkpoint_limits
from generation.vllm_engine.engine import DEFAULT_CONCURRENCY, DEFAULT_MAX_NUM_SEQS, VLLMEngine
from generation.vllm_engine.loop import VLLMLoop, VLLMRequest
from generation.vllm_engine.mapping import (
    AUTO_NUM_SPECULATIVE_TOKENS,
    VLLM_PIN,
    SpecCounters,
    SpecMetricsMissingError,
    Speculation,
    UnsupportedSpeculationError,
    VLLMOptionError,
    VLLMUnavailableError,
    build_stats,
    check_batch_schedule,
    request_counters,
    request_timings_ms,
    sampling_kwargs,
    speculative_config,
)

__all__ = [
    "AUTO_NUM_SPECULATIVE_TOKENS",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_NUM_SEQS",
    "VLLM_PIN",
    "SpecCounters",
    "SpecMetricsMissingError",
    "Speculation",
    "UnsupportedSpeculationError",
    "VLLMEngine",
    "VLLMLoop",
    "VLLMRequest",
    "VLLMOptionError",
    "VLLMUnavailableError",
    "build_stats",
    "check_batch_schedule",
    "check_draft_vocab",
    "checkpoint_limits",
    "request_counters",
    "request_timings_ms",
    "sampling_kwargs",
    "speculative_config",
]
