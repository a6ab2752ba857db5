"""Speculative decoding: a draft model or n-gram lookup proposes, the target verifies.

Public names: the engine (``SpeculativeEngine``), its request and result types, the ``Engine``
protocol other engines (vLLM) implement, and loaders.
"""

from generation.base import Engine, GenerationResult
from generation.factory import load_engine
from generation.loading import (
    CheckpointError,
    IncompatibleDraftError,
    load_tokenizer,
    validate_checkpoint,
)
from generation.params import METHODS, SamplingParams
from generation.stats import GenerationStats
from generation.torch_engine import SpeculativeEngine

__all__ = [
    "METHODS",
    "CheckpointError",
    "Engine",
    "GenerationResult",
    "GenerationStats",
    "IncompatibleDraftError",
    "SamplingParams",
    "SpeculativeEngine",
    "load_engine",
    "load_tokenizer",
    "validate_checkpoint",
]
