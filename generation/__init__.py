"""Speculative decoding: a draft model or n-gram lookup proposes, the target verifies.

Public names: the engine (``SpeculativeEngine``), its request and result types, the ``Engine``
protocol other engines (vLLM) implement, the online loop (``EngineLoop``, continuous
batching) and its handles, and loaders.
"""

from generation.config import EngineConfig
from generation.engine.loop import EngineLoop
from generation.factory import load_engine
from generation.interface import (
    Cancelled,
    DeltaCallback,
    Engine,
    GenerationLoop,
    GenerationResult,
    RequestHandle,
)
from generation.model.loading import (
    CheckpointError,
    IncompatibleDraftError,
    load_tokenizer,
    validate_checkpoint,
)
from generation.params import METHODS, SamplingParams
from generation.requests import BatchRequestError
from generation.stats import GenerationStats
from generation.torch_engine import SpeculativeEngine

__all__ = [
    "METHODS",
    "BatchRequestError",
    "Cancelled",
    "CheckpointError",
    "DeltaCallback",
    "Engine",
    "EngineConfig",
    "EngineLoop",
    "GenerationLoop",
    "GenerationResult",
    "GenerationStats",
    "IncompatibleDraftError",
    "RequestHandle",
    "SamplingParams",
    "SpeculativeEngine",
    "load_engine",
    "load_tokenizer",
    "validate_checkpoint",
]
