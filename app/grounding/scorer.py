"""The process's grounding scorer, chosen by the settings: the fused default or a cross-encoder."""

from __future__ import annotations

from typing import Any

from app.settings import Settings
from retrieval.grounding import CrossEncoderScorer, FusedScorer, SupportScorer


def load_scorer(settings: Settings, embedder: Any) -> SupportScorer:
    """``SPECRAG_GROUNDING_MODEL``'s cross-encoder when set (ScorerLoadError naming the directory
    when it cannot load), else the fused scorer on ``embedder`` (the worker's MiniLM)."""
    if settings.grounding_model is not None:
        return CrossEncoderScorer(settings.grounding_model, settings.grounding_threshold)
    return FusedScorer(embedder, settings.grounding_threshold)
