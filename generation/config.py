"""``EngineConfig``: what an engine is set up with, built once (from Settings) and passed whole."""

from __future__ import annotations

from dataclasses import dataclass

from generation.model.dtypes import check_dtype_name


@dataclass(frozen=True)
class EngineConfig:
    """How an engine batches, speculates and prefills; every field is validated on construction."""

    max_batch_size: int = 16
    """Most requests in one step; the torch engine allocates this many KV slots (fewer if the
    device's memory cannot hold them at the full context: its ``max_concurrency``)."""
    max_speculative_tokens: int = 8
    """k_max: the largest fixed k a request may ask for, and the longest draft of ``"auto"``."""
    prefill_chunk: int = 512
    """Most prompt tokens prefilled in one step while other requests decode."""
    batch_prefill_chunk: int | None = 2048
    """The same for ``generate_many`` outside a running loop (None: ``prefill_chunk``): no one
    streams its answers, so a wider step (fuller decode rounds, fewer steps) costs no one a
    stall; vLLM's offline ``LLM`` likewise takes a larger token budget than its server."""
    background_prefill_chunk: int = 128
    """Most prompt tokens of a background (batch-job) request prefilled in one step, where
    background requests pause for foreground ones."""
    pause_background: bool | None = None
    """Background requests sit out the steps while a foreground one runs (None: on a CPU, where
    every extra row of a pass costs arithmetic; a GPU pass carries extra rows almost free)."""
    max_background_pause: float = 5.0
    """Seconds a paused background request waits at most before it takes a step anyway."""
    ngram_max_n: int = 4
    """Longest n-gram that prompt lookup matches (down to 1)."""
    suffix_max_depth: int = 64
    """Deepest path of a request's own suffix tree (method ``suffix``): the longest context it
    matches and the longest chain it proposes (a scope's tree has its ``SuffixMemory``'s)."""
    suffix_max_speculative_tokens: int = 32
    """Longest draft of a ``suffix`` row asking ``"auto"``: its trees decide the length (the
    match times ``suffix_max_spec_factor``, ``suffix_min_token_prob``) up to this, as vLLM's
    ``num_speculative_tokens`` caps its suffix proposer; a fixed k caps it at k instead."""
    suffix_max_spec_factor: float = 1.0
    """A suffix lookup proposes at most this x the matched length (vLLM's
    ``suffix_decoding_max_spec_factor``), and never more than the row's k."""
    suffix_min_token_prob: float = 0.1
    """A suffix chain stops before a token the tree's counts give less than this probability
    (vLLM's ``suffix_decoding_min_token_prob``)."""
    kv_memory_fraction: float = 0.8
    """Share of the device's free memory the KV slots may take at the full context."""
    fast_forward: bool = True
    """Run Llama-family models on the engine's own forward pass (False: transformers')."""
    packed_weights: bool | None = None
    """That pass's projections on weights packed once for oneDNN (None: on a CPU, in float32,
    or in bfloat16 where oneDNN has bf16 kernels; generation/model/forward.py); False keeps
    transformers' kernels, bit for bit."""
    dtype: str | None = None
    """Numerics of weights, KV and prefix blocks: "float32", "bfloat16" or "auto" (bfloat16 on
    CUDA and on CPUs with AMX / AVX-512 BF16; generation/model/dtypes.py). None: float32 when the
    engine loads checkpoints, the models' own dtype when it is handed loaded models. Logits,
    softmax, sampling and the rejection rule are float32 whatever this says."""
    prefix_cache_mb: float = 0.0
    """MB of KV kept for computed prompt prefixes, reused exactly by later requests (0: off;
    generation/engine/prefix_cache.py)."""
    prefix_block_size: int = 16
    """Tokens per prefix-cache block: the grain at which prompts share KV."""

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_speculative_tokens", "prefill_chunk",
                     "background_prefill_chunk", "batch_prefill_chunk", "ngram_max_n",
                     "prefix_block_size", "suffix_max_depth",
                     "suffix_max_speculative_tokens"):  # fmt: skip
            value = getattr(self, name)
            if value is None and name == "batch_prefill_chunk":
                continue  # None: prefill_chunk
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"engine config: {name} must be an int >= 1, got {value!r}")
        for name, want, ok in (
            ("max_background_pause", "a number >= 0", lambda v: v >= 0),
            ("kv_memory_fraction", "in (0, 1]", lambda v: 0 < v <= 1),
            ("prefix_cache_mb", "a number >= 0", lambda v: v >= 0),
            ("suffix_max_spec_factor", "a number >= 0", lambda v: v >= 0),
            ("suffix_min_token_prob", "in [0, 1]", lambda v: 0 <= v <= 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise ValueError(f"engine config: {name} must be {want}, got {value!r}")
        if self.dtype is not None:
            try:
                check_dtype_name(self.dtype)
            except ValueError as exc:
                raise ValueError(f"engine config: {exc}") from None
        for name in ("pause_background", "packed_weights"):
            if not isinstance(getattr(self, name), (bool, type(None))):
                raise ValueError(
                    f"engine config: {name} must be a bool or None, got {getattr(self, name)!r}"
                )
