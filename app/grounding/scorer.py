"""The process's grounding scorer, chosen by the settings: the fused default or a cross-encoder."""

from __future__ import annotations

from typing import Any

from app.settings import Settings
from retrieval.grounding import CrossEncoderScorer, FusedScorer, ScorerLoadError, SupportScorer


def load_scorer(settings: Settings, embedder: Any) -> SupportScorer:
    """``SPECRAG_GROUNDING_MODEL``'s cross-encoder when set (ScorerLoadError naming the directory
    when it cannot load), else the fused scorer on ``embedder`` (the worker's MiniLM), encoding
    the answers' claims in ``claim_dtype(settings)``."""
    if settings.grounding_model is not None:
        return CrossEncoderScorer(settings.grounding_model, settings.grounding_threshold)
    claims = embedder.in_dtype(claim_dtype(settings))
    return FusedScorer(embedder, settings.grounding_threshold, claim_encoder=claims)


def claim_dtype(settings: Settings) -> str:
    """``float32`` or ``bfloat16``: ``SPECRAG_GROUNDING_DTYPE`` on the CPU, decided as the engine
    decides ``auto`` (bfloat16 where the CPU has AMX or AVX-512 BF16); ValueError for bfloat16 on
    a CPU without them, naming the missing feature."""
    from generation.model.dtypes import resolve_dtype  # heavy: torch

    try:
        return resolve_dtype(settings.grounding_dtype, "cpu")
    except ValueError as exc:
        raise ScorerLoadError(f"grounding dtype: {exc}") from None
