"""The passage side of the fused scorer: a passage's windows and its MiniLM vectors.

It exists so that what the scorer needs of a passage, which depends on the passage's text alone,
is computed in one place: at ingest (``retrieval.service``, stored with the chunk), by a backfill,
or by the scorer itself for a passage nobody stored. A passage's vectors are its text's unit
embedding and one per single-sentence window, in the windows' order; stored, they are one
float32 matrix ``[1 + sentences, dim]`` (row 0 the passage) under ``LAYOUT``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from retrieval.grounding.checks import content_terms
from retrieval.grounding.sentences import split_sentences
from retrieval.vectors import DTYPE, matrix_from_bytes, matrix_to_bytes

LAYOUT = 1
"""What stored vectors mean: the passage, then its sentences as ``split_sentences`` cuts them.
A change to the splitter or to the windows that changes which texts are encoded bumps it;
vectors stored under another layout are not used (and a backfill replaces them)."""
ENCODE_BATCH = 8
"""Texts per encoder call, longest first: small enough that a batch pads little."""


class Encoder(Protocol):
    """What the fused scorer needs of an embedder: unit-length rows, one per text."""

    def encode(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class PassageView:
    """A passage split for scoring: its text, terms and windows (text, terms, span)."""

    text: str
    terms: set[str]
    windows: list[tuple[str, set[str], int, int]]

    @property
    def singles(self) -> int:
        """How many windows are single sentences (they come first: n sentences give 2n - 1)."""
        return (len(self.windows) + 1) // 2


@dataclass(frozen=True)
class PassageVectors:
    """A passage's unit embedding and its single-sentence windows' ones, in order."""

    vector: np.ndarray  # [dim]
    singles: np.ndarray  # [num_sentences, dim]

    def to_bytes(self) -> bytes:
        """The stored form: ``[1 + num_sentences, dim]`` little-endian float32."""
        return matrix_to_bytes(np.vstack([self.vector[None, :], self.singles]))

    @classmethod
    def from_stored(cls, blob: bytes, view: PassageView) -> PassageVectors | None:
        """What ``to_bytes`` stored for ``view``'s passage; None when the bytes do not hold one
        row for the passage and one per sentence as it splits now."""
        rows = 1 + view.singles
        if not blob or len(blob) % (rows * DTYPE.itemsize):
            return None
        matrix = matrix_from_bytes(blob, len(blob) // (rows * DTYPE.itemsize))
        return cls(matrix[0], matrix[1:])


def passage_view(text: str) -> PassageView:
    """``text`` with its terms and windows: each sentence, and each two consecutive ones."""
    sentences = split_sentences(text) or []
    windows = [(s.text, content_terms(s.text), s.start, s.end) for s in sentences]
    for a, b in zip(sentences, sentences[1:], strict=False):
        joined = text[a.start : b.end]
        windows.append((joined, content_terms(joined), a.start, b.end))
    if not windows:
        windows = [(text, content_terms(text), 0, len(text))]
    return PassageView(text, content_terms(text), windows)


def encode_sorted(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """``encoder.encode(texts)`` in length-sorted batches of ``ENCODE_BATCH``, rows in order: a
    batch pads to a length close to its own texts' (the same vectors to float rounding)."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out: np.ndarray | None = None
    for start in range(0, len(order), ENCODE_BATCH):
        batch = order[start : start + ENCODE_BATCH]
        rows = np.asarray(encoder.encode([texts[i] for i in batch]))
        if out is None:
            out = np.zeros((len(texts), rows.shape[1]), dtype=rows.dtype)
        out[batch] = rows
    return out if out is not None else np.zeros((0, 1), np.float32)


def encode_passages(
    encoder: Encoder, texts: Sequence[str], views: Sequence[PassageView] | None = None
) -> list[PassageVectors]:
    """Each passage's vectors, all texts encoded together (``views``: theirs, when at hand)."""
    if not texts:
        return []
    views = list(views) if views is not None else [passage_view(t) for t in texts]
    singles = [[w[0] for w in v.windows[: v.singles]] for v in views]
    vectors = encode_sorted(encoder, [*texts, *(w for ws in singles for w in ws)])
    out, offset = [], len(texts)
    for k, ws in enumerate(singles):
        out.append(PassageVectors(vectors[k], vectors[offset : offset + len(ws)]))
        offset += len(ws)
    return out
