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
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from retrieval.grounding.checks import Evidence, content_terms, evidence
from retrieval.grounding.passages import (
    Encoder,
    PassageVectors,
    PassageView,
    encode_passages,
    encode_sorted,
    passage_view,
)

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
CACHE_PASSAGES = 4096
"""Passages a fused scorer keeps ready (about 7 vectors of 384 floats each: ~45 MB at most)."""


@dataclass(frozen=True)
class PreparedPassage:
    """A passage ready for scoring: its view and its vectors."""

    view: PassageView
    vectors: PassageVectors


@dataclass(frozen=True)
class Support:
    """Support scores ``[num_claims, num_passages]`` and, per pair, the passage span behind it."""

    scores: np.ndarray  # [num_claims, num_passages] float in [0, 1]
    spans: list[list[tuple[int, int]]]  # [num_claims][num_passages] (start, end) in the passage


Known = Mapping[str, bytes]
"""Passage vectors stored before (at ingest: ``PassageVectors.to_bytes``), by passage text."""


class SupportScorer(Protocol):
    """Scores claims against passages; ``threshold`` or more means supported. ``known``: the
    passages' vectors where they were stored (a scorer that needs none ignores them)."""

    name: str
    threshold: float

    def support(
        self, claims: Sequence[str], passages: Sequence[str], known: Known | None = None
    ) -> Support: ...


def _evidence(claim: str, claim_terms: set[str], view: PassageView) -> Evidence:
    windows = [(w[0], w[1]) for w in view.windows]
    return evidence(claim, claim_terms, view.text, view.terms, windows)


def _key(text: str) -> str:
    """``text`` with its white space runs as single spaces: what MiniLM's tokenizer reads the same."""
    return " ".join(text.split())


def fuse(features: Sequence[float]) -> float:
    """The fused support score in [0, 1] of one pair's ``FEATURES``."""
    z = BIAS + sum(w * f for w, f in zip(WEIGHTS, features, strict=True))
    return 1.0 / (1.0 + math.exp(-z))


class FusedScorer:
    """BM25-analyser containment and MiniLM cosine with number/name/negation checks, fused.

    What a passage needs for scoring (its terms and windows, its embedding and its sentences'
    embeddings) depends on its text alone. Its vectors come, in this order, from a bounded cache
    per passage text (``cache_passages`` most recently used; 0 keeps none), from ``known`` (the
    vectors stored at ingest, retrieval.grounding.passages), or are encoded now, every missing
    passage together (``encode_passages``): a passage found costs only the lexical checks, and an
    answer pays for the encoding of its own claims.

    ``claim_encoder`` (default ``encoder``) encodes the claims: the same model in other numerics
    (``Embedder.in_dtype``), so that a claim's vector costs less on a host that computes bfloat16
    natively while passages keep the float32 vectors stored for every host.
    """

    name = "fused-bm25-minilm"

    def __init__(
        self,
        encoder: Encoder,
        threshold: float | None = None,
        cache_passages: int = CACHE_PASSAGES,
        claim_encoder: Encoder | None = None,
    ) -> None:
        self.encoder = encoder
        self.claim_encoder = encoder if claim_encoder is None else claim_encoder
        self.threshold = THRESHOLD if threshold is None else float(threshold)
        self.cache_passages = cache_passages
        self._cache: OrderedDict[str, PreparedPassage] = OrderedDict()
        self._cache_lock = threading.Lock()

    def prepared(
        self, passages: Sequence[str], known: Known | None = None, dim: int | None = None
    ) -> list[PreparedPassage]:
        """Each passage's view and vectors: cached, known (when they fit the passage as it splits
        and the encoder's ``dim``), or the others encoded together now."""
        found: dict[str, PreparedPassage] = {}
        with self._cache_lock:
            for text in passages:
                hit = self._cache.get(text)
                if hit is not None:
                    self._cache.move_to_end(text)
                    found[text] = hit
        missing: dict[str, PassageView] = {}
        for text in dict.fromkeys(passages):
            if text in found:
                continue
            view = passage_view(text)
            blob = (known or {}).get(text)
            stored = None if blob is None else PassageVectors.from_stored(blob, view)
            if stored is not None and (dim is None or stored.vector.shape[0] == dim):
                found[text] = PreparedPassage(view, stored)
            else:
                missing[text] = view
        encoded = encode_passages(self.encoder, list(missing), list(missing.values()))
        for (text, view), vectors in zip(missing.items(), encoded, strict=True):
            found[text] = PreparedPassage(view, vectors)
        if self.cache_passages > 0:
            with self._cache_lock:
                for text in dict.fromkeys(passages):
                    self._cache[text] = found[text]
                    self._cache.move_to_end(text)
                while len(self._cache) > self.cache_passages:
                    self._cache.popitem(last=False)
        return [found[t] for t in passages]

    def passage_vectors(self, passages: Sequence[str]) -> list[PassageVectors]:
        """The vectors of ``passages`` (cached or encoded now): what a store keeps of them."""
        return [p.vectors for p in self.prepared(passages)]

    def claim_vectors(self, claims: Sequence[str], ready: Sequence[PreparedPassage]) -> np.ndarray:
        """Each claim's unit vector ``[num_claims, dim]``: a claim written as one of its passages'
        sentences (or as a whole passage), white space aside, takes the vector of that text at
        hand (the encoder reads the same tokens: the same vector to float rounding); the others
        are encoded now by ``claim_encoder``, together (``encode_sorted``)."""
        quoted: dict[str, np.ndarray] = {}
        for prep in ready:
            quoted.setdefault(_key(prep.view.text), prep.vectors.vector)
            for k, window in enumerate(prep.view.windows[: len(prep.vectors.singles)]):
                quoted.setdefault(_key(window[0]), prep.vectors.singles[k])
        rows = [quoted.get(_key(claim)) for claim in claims]
        todo = list(dict.fromkeys(c for c, r in zip(claims, rows, strict=True) if r is None))
        fresh = (
            dict(zip(todo, encode_sorted(self.claim_encoder, todo), strict=True)) if todo else {}
        )
        out = [r if r is not None else fresh[c] for c, r in zip(claims, rows, strict=True)]
        return np.vstack(out) if out else np.zeros((0, 1), np.float32)

    def features(
        self, claims: Sequence[str], passages: Sequence[str], known: Known | None = None
    ) -> tuple[np.ndarray, list[list[tuple[int, int]]]]:
        """``FEATURES`` per pair ``[num_claims, num_passages, len(FEATURES)]`` and the spans."""
        dim = getattr(self.encoder, "dim", None)
        if dim is None and claims:  # the claims' vectors say which stored vectors fit
            c_vec = self.claim_vectors(claims, [])
            ready = self.prepared(passages, known, dim=c_vec.shape[1])
        else:
            ready = self.prepared(passages, known, dim=dim)
            c_vec = self.claim_vectors(claims, ready)
        out = np.zeros((len(claims), len(passages), len(FEATURES)), dtype=np.float64)
        spans: list[list[tuple[int, int]]] = []
        for i, claim in enumerate(claims):
            claim_terms = content_terms(claim)
            row: list[tuple[int, int]] = []
            for j, prep in enumerate(ready):
                singles = prep.vectors.singles
                cosine = float(c_vec[i] @ prep.vectors.vector)
                best_cos = float((singles @ c_vec[i]).max()) if len(singles) else 0.0
                ev = _evidence(claim, claim_terms, prep.view)
                out[i, j] = (
                    ev.containment,
                    ev.window_containment,
                    cosine,
                    best_cos,
                    ev.missing_number,
                    ev.missing_name,
                    ev.negation_mismatch,
                )
                window = prep.view.windows[ev.window]
                row.append((window[2], window[3]))
            spans.append(row)
        return out, spans

    def support(
        self, claims: Sequence[str], passages: Sequence[str], known: Known | None = None
    ) -> Support:
        """Fused support of every (claim, passage) pair."""
        feats, spans = self.features(claims, passages, known)
        z = BIAS + feats @ np.asarray(WEIGHTS, dtype=np.float64)  # [num_claims, num_passages]
        return Support(1.0 / (1.0 + np.exp(-z)), spans)


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

    def support(
        self, claims: Sequence[str], passages: Sequence[str], known: Known | None = None
    ) -> Support:
        """The model's probability that each passage supports each claim (``known``: unused)."""
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
