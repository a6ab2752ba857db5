"""Grounding of answers: which retrieved passages support each sentence (docs/grounding.md)."""

from retrieval.grounding.ground import Grounding, PassageSupport, SentenceGrounding, ground
from retrieval.grounding.scorer import (
    CrossEncoderScorer,
    FusedScorer,
    ScorerLoadError,
    Support,
    SupportScorer,
)
from retrieval.grounding.sentences import Sentence, split_sentences

__all__ = [
    "CrossEncoderScorer",
    "FusedScorer",
    "Grounding",
    "PassageSupport",
    "ScorerLoadError",
    "Sentence",
    "SentenceGrounding",
    "Support",
    "SupportScorer",
    "ground",
    "split_sentences",
]
