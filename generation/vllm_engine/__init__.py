"""vLLM engine for GPU workers: the production path behind the same ``Engine`` protocol.

vLLM runs the target and a co-located draft with its own speculative decoding. Two facts of
vLLM shape this package:

- speculation (proposer and k) is fixed when vLLM starts, so a ``VLLMEngine`` serves the
  ``Speculation`` it was started with and refuses other requests with a clear error;
- the offline ``vllm.LLM`` is not thread-safe, so ``generate`` serves one request at a time,
  which also makes vLLM's aggregate spec-decode counters exact per request (the fallback when
  per-request metrics are missing).

Pinned: ``vllm==0.32.0``, the newest release whose torch pin (2.13.0) matches ours. Importing
this package does not import vLLM; ``VLLMEngine.from_pretrained`` does. Sources: docs/vllm.md.
"""

from generation.vllm_engine.engine import VLLMEngine, check_draft_vocab, checkpoint_limits
from generation.vllm_engine.mapping import (
    AUTO_NUM_SPECULATIVE_TOKENS,
    VLLM_PIN,
    SpecCounters,
    Speculation,
    UnsupportedSpeculationError,
    VLLMUnavailableError,
    build_stats,
    request_timings_ms,
    sampling_kwargs,
    speculative_config,
)

__all__ = [
    "AUTO_NUM_SPECULATIVE_TOKENS",
    "VLLM_PIN",
    "SpecCounters",
    "Speculation",
    "UnsupportedSpeculationError",
    "VLLMEngine",
    "VLLMUnavailableError",
    "build_stats",
    "check_draft_vocab",
    "checkpoint_limits",
    "request_timings_ms",
    "sampling_kwargs",
    "speculative_config",
]
