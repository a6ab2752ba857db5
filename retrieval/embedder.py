"""Sentence embeddings for chunks and questions, from a local sentence-transformers model.

It exists so that the model is loaded once per process (``Embedder.shared``), never fetched from
a hub, and always returns normalised float32 vectors: FAISS inner product is then cosine.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


class Embedder:
    """A loaded sentence-transformers model: ``encode(texts)`` gives ``[n, dim]`` unit vectors."""

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        batch_size: int = 64,
        query_threads: int | None = 1,
    ) -> None:
        path = Path(model_path)
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"embedding model directory {str(path)!r} holds no sentence-transformers model"
            )
        # Never reach for a model hub, even when a config names a remote repository.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer  # heavy
        from transformers.utils import logging as hf_logging  # heavy

        # Weight-loading progress bars would interleave with the CLI's own on stderr.
        hf_logging.disable_progress_bar()

        self.model_path = str(path)
        self.device = "cpu" if device == "auto" else device
        self.batch_size = batch_size
        # A single question is latency-bound: one CPU thread skips the OpenMP hand-offs that,
        # on a busy shared CPU, cost more than the work (docs/results.md, retrieval).
        self.query_threads = query_threads
        self._model = SentenceTransformer(self.model_path, device=self.device)
        self._model.eval()
        # A torch module is not safe to call from two threads at once (API thread pools).
        self._lock = threading.Lock()
        dim = self._model.get_embedding_dimension()
        assert dim is not None
        self.dim: int = int(dim)
        self.dtype = "float32"
        """What the model's matmuls compute in: ``float32``, or ``bfloat16`` (``in_dtype``)."""

    def in_dtype(self, dtype: str) -> Embedder:
        """This model with its matmuls in ``dtype``: itself for ``float32``; for ``bfloat16`` a
        copy whose linear layers hold bfloat16 weights and run under CPU autocast, so the matmuls
        run in bfloat16 while embeddings, layer norms, softmax and pooling stay float32 (the
        copy shares every tensor but the linear layers' with this one, which stays float32).

        Only on a CPU that computes bfloat16 natively (AMX or AVX-512 BF16) is that faster; the
        caller decides (``generation.model.dtypes.resolve_dtype``). Vectors differ from float32
        ones by float rounding (cosine between the two about 1e-4 off 1; docs/grounding.md)."""
        if dtype == "float32":
            return self
        if dtype != "bfloat16":
            raise ValueError(f"embedder dtype: {dtype!r}; expected float32 or bfloat16")
        import torch  # heavy

        linears = [m for m in self._model.modules() if isinstance(m, torch.nn.Linear)]
        own = {id(t) for m in linears for t in (*m.parameters(), *m.buffers())}
        shared = {id(t): t for t in (*self._model.parameters(), *self._model.buffers())
                  if id(t) not in own}  # fmt: skip
        clone = copy.copy(self)
        clone._model = copy.deepcopy(self._model, memo=dict(shared))
        for module in clone._model.modules():
            if isinstance(module, torch.nn.Linear):
                module.to(torch.bfloat16)
        # One lock for both: an encode sets torch's thread count for its block and restores it,
        # so the two must not interleave (as before the copy, when one model served both).
        clone._lock = self._lock
        clone.dtype = dtype
        return clone

    @classmethod
    def shared(cls, model_path: str | Path, device: str = "cpu") -> Embedder:
        """The process's one embedder for this model and device (loaded on first call)."""
        return _shared(str(model_path), device)

    @property
    def tokenizer(self) -> Any:
        """The model's own tokenizer (chunk sizes are counted in its tokens)."""
        return self._model.tokenizer

    @property
    def max_seq_length(self) -> int:
        """Longest input in tokens, special tokens included; longer inputs are truncated."""
        return int(self._model.max_seq_length or 256)

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """Unit-length float32 embeddings, one row per text: ``[len(texts), dim]``."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        threads = self.query_threads if len(texts) <= 4 else None
        with self._lock, _torch_threads(threads), _autocast(self.dtype):
            if len(texts) == 1:  # a question: latency-bound
                return self._encode_one(texts[0])
            vectors = self._model.encode(
                texts,
                batch_size=batch_size or self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _encode_one(self, text: str) -> np.ndarray:
        """``encode([text])`` without its per-call work for many texts (sorting, batching, device
        resolution over every parameter, the eval() walk): the same modules on the same tokens
        in the same order, so the same bits (tests/retrieval/test_embedder.py), and sooner
        (docs/results.md, retrieval)."""
        import torch  # heavy

        with torch.inference_mode():
            features = self._model.preprocess([text])
            features = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                        for k, v in features.items()}  # fmt: skip
            vector = self._model(features)["sentence_embedding"]
            # encode(normalize_embeddings=True) normalises after the model's own Normalize.
            vector = torch.nn.functional.normalize(vector, p=2, dim=1)
            return np.ascontiguousarray(vector.float().cpu().numpy(), dtype=np.float32)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (None: leave the setting alone)."""
    if threads is None:
        yield
        return
    import torch  # heavy

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def _autocast(dtype: str) -> Iterator[None]:
    """Run the block under CPU autocast to ``dtype`` (float32: as it is)."""
    if dtype == "float32":
        yield
        return
    import torch  # heavy

    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        yield


@functools.lru_cache(maxsize=4)
def _shared(model_path: str, device: str) -> Embedder:
    return Embedder(model_path, device=device)
