"""Support scores of claims against passages: the default fused scorer, or a cross-encoder.

It exists so that every answer can be checked on the worker's CPU with what the worker already
holds. The default (``FusedScorer``) reads, per (claim, passage) pair, the lexical evidence of
``retrieval.grounding.checks`` (BM25-analyser containment, numbers, names, negation) and MiniLM
cosine (claim against the passage and against its best sentence), and fuses them with a
logistic model into one support score in [0, 1]; one threshold says "supported". Weights and
threshold come from ``python -m benchmarks.grounding_calibration`` (docs/grounding.md): they
measure support by overlap and similarity, not logical entailment.

``CrossEncoderScorer`` replaces it with a sentence-transformers ``CrossEncoder`` loaded from a
local directory (a relevance model with one output, or an NLI model whose labels name
"entailment"): the pair is (passage, claim) and the score is the probability of support.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from retrieval.grounding.checks import Evidence, content_terms, evidence
from retrieval.grounding.sentences import split_sentences

FEATURES = (
    "containment",
    "window_containment",
    "cosine",
    "window_cosine",
    "missing_number",
    "missing_name",
    "negation_mismatch",
)
# Fitted by ``python -m benchmarks.grounding_calibration --fit`` on the demo corpus's training
# split (logistic regression, balanced classes; the threshold maximises Youden's J there).
WEIGHTS = (2.653, 2.592, 0.474, 2.575, -1.426, -0.696, -3.716)
BIAS = -5.977
THRESHOLD = 0.57


class Encoder(Protocol):
    """What the fused scorer needs of an embedder: unit-length rows, one per text."""

    def encode(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class PassageView:
    """A passage split for scoring: its text, terms and windows (text, terms, span)."""

    text: str
    terms: set[str]
    windows: list[tuple[str, set[str], int, int]]


@dataclass(frozen=True)
class Support:
    """Support scores ``[num_claims, num_passages]`` and, per pair, the passage span behind it."""

    scores: np.ndarray  # [num_claims, num_passages] float in [0, 1]
    spans: list[list[tuple[int, int]]]  # [num_claims][num_passages] (start, end) in the passage


class SupportScorer(Protocol):
    """Scores claims against passages; ``threshold`` or more means supported."""

    name: str
    threshold: float

    def support(self, claims: Sequence[str], passages: Sequence[str]) -> Support: ...


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


def _evidence(claim: str, claim_terms: set[str], view: PassageView) -> Evidence:
    windows = [(w[0], w[1]) for w in view.windows]
    return evidence(claim, claim_terms, view.text, view.terms, windows)


def fuse(features: Sequence[float]) -> float:
    """The fused support score in [0, 1] of one pair's ``FEATURES``."""
    z = BIAS + sum(w * f for w, f in zip(WEIGHTS, features, strict=True))
    return 1.0 / (1.0 + math.exp(-z))


class FusedScorer:
    """BM25-analyser containment and MiniLM cosine with number/name/negation checks, fused."""

    name = "fused-bm25-minilm"

    def __init__(self, encoder: Encoder, threshold: float | None = None) -> None:
        self.encoder = encoder
        self.threshold = THRESHOLD if threshold is None else float(threshold)

    def features(
        self, claims: Sequence[str], passages: Sequence[str]
    ) -> tuple[np.ndarray, list[list[tuple[int, int]]]]:
        """``FEATURES`` per pair ``[num_claims, num_passages, len(FEATURES)]`` and the spans."""
        views = [passage_view(p) for p in passages]
        singles = [v.windows[: _singles(v)] for v in views]
        texts = [*claims, *passages, *(w[0] for ws in singles for w in ws)]
        vectors = self.encoder.encode(list(texts)) if texts else np.zeros((0, 1), np.float32)
        c_vec = vectors[: len(claims)]
        p_vec = vectors[len(claims) : len(claims) + len(passages)]
        w_vec = vectors[len(claims) + len(passages) :]
        out = np.zeros((len(claims), len(passages), len(FEATURES)), dtype=np.float64)
        spans: list[list[tuple[int, int]]] = []
        cosine = c_vec @ p_vec.T if len(passages) else np.zeros((len(claims), 0))
        window_cos = c_vec @ w_vec.T if len(w_vec) else np.zeros((len(claims), 0))
        for i, claim in enumerate(claims):
            claim_terms = content_terms(claim)
            row: list[tuple[int, int]] = []
            offset = 0
            for j, view in enumerate(views):
                n = len(singles[j])
                best_cos = float(window_cos[i, offset : offset + n].max()) if n else 0.0
                offset += n
                ev = _evidence(claim, claim_terms, view)
                out[i, j] = (
                    ev.containment,
                    ev.window_containment,
                    float(cosine[i, j]),
                    best_cos,
                    ev.missing_number,
                    ev.missing_name,
                    ev.negation_mismatch,
                )
                window = view.windows[ev.window]
                row.append((window[2], window[3]))
            spans.append(row)
        return out, spans

    def support(self, claims: Sequence[str], passages: Sequence[str]) -> Support:
        """Fused support of every (claim, passage) pair."""
        feats, spans = self.features(claims, passages)
        z = BIAS + feats @ np.asarray(WEIGHTS, dtype=np.float64)  # [num_claims, num_passages]
        return Support(1.0 / (1.0 + np.exp(-z)), spans)


def _singles(view: PassageView) -> int:
    # Windows list the single sentences first, then the pairs: n sentences give 2n - 1 windows.
    return (len(view.windows) + 1) // 2


class ScorerLoadError(RuntimeError):
    """A grounding checkpoint that cannot be loaded; the message names the directory."""


class CrossEncoderScorer:
    """A sentence-transformers ``CrossEncoder`` from a local directory as the support scorer."""

    def __init__(self, model_dir: str | Path, threshold: float | None = None) -> None:
        path = Path(model_dir)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            if not (path / "config.json").is_file():
                raise FileNotFoundError("no config.json")
            from sentence_transformers import CrossEncoder  # heavy

            self._model: Any = CrossEncoder(str(path), device="cpu")
        except Exception as exc:
            raise ScorerLoadError(
                f"grounding model {str(path)!r} cannot be loaded: {type(exc).__name__}: {exc}"
            ) from exc
        labels = {int(k): str(v).lower() for k, v in self._model.config.id2label.items()}
        self._label: int | None = None
        if self._model.num_labels > 1:
            found = [i for i, name in labels.items() if "entail" in name]
            if not found:
                raise ScorerLoadError(
                    f"grounding model {str(path)!r} has {self._model.num_labels} outputs and "
                    f"none is labelled entailment (labels: {sorted(labels.values())})"
                )
            self._label = found[0]
        self.name = f"cross-encoder:{path.name}"
        self.threshold = 0.5 if threshold is None else float(threshold)

    def support(self, claims: Sequence[str], passages: Sequence[str]) -> Support:
        """The model's probability that each passage supports each claim."""
        views = [passage_view(p) for p in passages]
        pairs = [(p, c) for c in claims for p in passages]
        scores = np.zeros((len(claims), len(passages)), dtype=np.float64)
        if pairs:
            if self._label is None:
                raw = self._model.predict(pairs, show_progress_bar=False)
                flat = np.asarray(raw, dtype=np.float64).reshape(-1)
            else:
                probs = self._model.predict(pairs, apply_softmax=True, show_progress_bar=False)
                flat = np.asarray(probs, dtype=np.float64)[:, self._label]
            scores = flat.reshape(len(claims), len(passages))
        spans = []
        for claim in claims:
            claim_terms = content_terms(claim)
            row = []
            for view in views:
                window = view.windows[_evidence(claim, claim_terms, view).window]
                row.append((window[2], window[3]))
            spans.append(row)
        return Support(scores, spans)
