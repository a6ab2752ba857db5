"""The grounding scorer's calibration: AUROC and the operating point on labeled hard pairs.

    python -m benchmarks.grounding_calibration --out runs/grounding_calibration.json

Builds the labeled sets of ``testkit.grounding_sets`` (demo corpus split by document into
train and held-out; the standard library's docstrings as a set the scorer was never fitted on),
computes the fused scorer's features with the real MiniLM, fits the logistic fusion on the train
split (``--fit`` prints the weights to ship in retrieval/grounding/scorer.py) and reports, per
set: AUROC of the shipped fused score and of each signal alone (cosine, best-sentence cosine,
containment), AUROC of positives against each kind of hard negative, and precision/recall at the
shipped threshold. The claims are encoded as a worker on this host encodes them (``--dtype``:
``SPECRAG_GROUNDING_DTYPE``, auto by default), the passages in float32 as stored at ingest.
JSON to ``--out``; a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import pickle
import platform
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from app.grounding.scorer import claim_dtype
from app.settings import Settings
from benchmarks.support import goal, write_result
from retrieval.embedder import Embedder
from retrieval.grounding.scorer import FEATURES, THRESHOLD, FusedScorer, fuse
from retrieval.grounding.sentences import split_sentences
from testkit.grounding_sets import Example, demo_passages, examples, prose, stdlib_passages

GOALS = [
    goal("grounding", "Scorer AUROC on the held-out demo labeled set (documents unseen in the fit)",
         "auroc_demo_held_out", ">=", 0.90),
    goal("grounding", "Scorer AUROC on the standard library's docstrings (never fitted on; its "
         "pairs are built here)", "auroc_stdlib", ">=", 0.90),
]  # fmt: skip
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def nearest_fn(embedder: Embedder, passages: list[tuple[str, str]]) -> Any:
    """``nearest(sentence, doc)``: the most similar prose sentence of another document."""
    pool = [(d, s.text) for d, p in passages for s in split_sentences(p) if prose(s.text)]
    docs = np.array([d for d, _ in pool])
    vectors = embedder.encode([s for _, s in pool])

    def nearest(sentence: str, doc: str) -> str:
        sims = vectors @ embedder.encode([sentence])[0]
        sims[docs == doc] = -2.0
        return pool[int(np.argmax(sims))][1]

    return nearest


def featurize(scorer: FusedScorer, rows: list[Example]) -> np.ndarray:
    """``FEATURES`` of every row ``[len(rows), len(FEATURES)]``, scored passage by passage."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by_group[row.group].append(i)
    out = np.zeros((len(rows), len(FEATURES)))
    for idx in by_group.values():
        feats, _ = scorer.features([rows[i].claim for i in idx], [rows[idx[0]].passage])
        out[idx] = feats[:, 0, :]
    return out


def relex(rows: list[Example], x: np.ndarray) -> np.ndarray:
    """Cached features with the lexical ones computed afresh (they need no model): a change to
    ``retrieval.grounding.checks`` is measured without re-embedding."""
    from retrieval.grounding.checks import content_terms
    from retrieval.grounding.passages import passage_view
    from retrieval.grounding.scorer import _evidence

    out = x.copy()
    views: dict[str, Any] = {}
    for i, row in enumerate(rows):
        view = views.setdefault(row.passage, passage_view(row.passage))
        ev = _evidence(row.claim, content_terms(row.claim), view)
        out[i, [0, 1, 4, 5, 6]] = (ev.containment, ev.window_containment, ev.missing_number,
                                   ev.missing_name, ev.negation_mismatch)  # fmt: skip
    return out


def report(rows: list[Example], x: np.ndarray, threshold: float) -> dict[str, Any]:
    """AUROCs (fused, each signal, per negative kind) and the operating point of one set."""
    y = np.array([r.supported for r in rows])
    fused = np.array([fuse(f) for f in x])
    kinds = sorted({r.kind for r in rows if not r.supported})
    per_kind = {}
    for kind in kinds:
        keep = np.array([r.supported or r.kind == kind for r in rows])
        per_kind[kind] = round(float(roc_auc_score(y[keep], fused[keep])), 4)
    said = fused >= threshold
    tp = int((said & y).sum())
    return {
        "pairs": len(rows),
        "positives": int(y.sum()),
        "passages": len({r.group for r in rows}),
        "auroc": round(float(roc_auc_score(y, fused)), 4),
        "auroc_by_negative_kind": per_kind,
        "auroc_signal_alone": {
            name: round(float(roc_auc_score(y, x[:, FEATURES.index(name)])), 4)
            for name in ("cosine", "window_cosine", "containment", "window_containment")
        },
        "threshold": threshold,
        "precision": round(tp / max(int(said.sum()), 1), 4),
        "recall": round(tp / max(int(y.sum()), 1), 4),
    }


def fit(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Logistic fusion fitted on the train split, and the threshold maximising Youden's J."""
    model = LogisticRegression(C=1.0, max_iter=2000, class_weight="balanced").fit(x, y)
    p = model.predict_proba(x)[:, 1]
    grid = np.linspace(0.05, 0.95, 91)
    j = [((p >= t) & y).sum() / y.sum() - ((p >= t) & ~y).sum() / (~y).sum() for t in grid]
    return {
        "weights": [round(float(w), 3) for w in model.coef_[0]],
        "bias": round(float(model.intercept_[0]), 3),
        "threshold": round(float(grid[int(np.argmax(j))]), 2),
    }


def result_figures(results: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The goals' figures of one run's JSON (AUROC, precision and recall per set) and notes."""
    figures: dict[str, Any] = {}
    notes = {}
    for name, r in results["sets"].items():
        figures[f"auroc_{name}"] = r["auroc"]
        figures[f"precision_{name}"] = r["precision"]
        figures[f"recall_{name}"] = r["recall"]
        weakest = min(r["auroc_by_negative_kind"].items(), key=lambda kv: kv[1])
        notes[f"auroc_{name}"] = (
            f"{r['pairs']} pairs; at threshold {r['threshold']}: precision {r['precision']}, "
            f"recall {r['recall']}; weakest negative kind {weakest[0]} {weakest[1]}"
        )
    return figures, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/grounding_calibration.json"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-passages", type=int, default=400)
    parser.add_argument("--fit", action="store_true", help="print weights fitted on train")
    parser.add_argument(
        "--features",
        type=Path,
        default=None,
        help="a .pkl of the sets' rows and features: read when present, else written",
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="the claims' numerics (SPECRAG_GROUNDING_DTYPE; auto: as a worker on this host)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    settings = Settings(grounding_dtype=args.dtype)
    embedder = Embedder(settings.embedding_model)
    # As a worker scores: passages float32 (as stored), claims in the host's grounding dtype.
    dtype = claim_dtype(settings)
    scorer = FusedScorer(embedder, claim_encoder=embedder.in_dtype(dtype))
    rng = random.Random(args.seed)
    results: dict[str, Any] = {"features": list(FEATURES), "claim_dtype": dtype, "sets": {}}
    demo = demo_passages(ROOT, embedder.tokenizer)
    docs = sorted({d for d, _ in demo})
    held = set(rng.sample(docs, int(len(docs) * 0.4)))
    lib = stdlib_passages()
    cached = (
        pickle.loads(args.features.read_bytes()) if args.features and args.features.exists() else {}
    )
    for name, passages, held_docs in (("demo", demo, held), ("stdlib", lib, {d for d, _ in lib})):
        if name in cached:
            rows, x = cached[name]
            x = relex(rows, x)
        else:
            if len(passages) > args.max_passages:
                passages = rng.sample(passages, args.max_passages)
            rows = examples(passages, held_docs, nearest_fn(embedder, passages), seed=args.seed)
            x = featurize(scorer, rows)
            cached[name] = (rows, x)
            if args.features:
                args.features.write_bytes(pickle.dumps(cached))
        print(f"{name}: {len(rows)} pairs featurised", flush=True)
        if name == "demo":
            train = np.array([r.split == "train" for r in rows])
            y = np.array([r.supported for r in rows])
            results["fitted_on_train"] = fit(x[train], y[train])
            results["sets"]["demo_train"] = report(
                [r for r, t in zip(rows, train, strict=True) if t], x[train], THRESHOLD
            )
            keep = ~train
            rows, x = [r for r, t in zip(rows, keep, strict=True) if t], x[keep]
            name = "demo_held_out"
        results["sets"][name] = report(rows, x, THRESHOLD)
    results["host"] = {"machine": platform.machine(), "processor": platform.processor()}
    results["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name, r in results["sets"].items():
        alone = " ".join(f"{k}={v}" for k, v in r["auroc_signal_alone"].items())
        print(
            f"{name:14} pairs={r['pairs']:5} AUROC={r['auroc']:.3f}  P={r['precision']:.3f} "
            f"R={r['recall']:.3f} @ {r['threshold']}  alone: {alone}"
        )
        print(f"{'':14} by kind: {r['auroc_by_negative_kind']}")
    if args.fit:
        print("fitted on train:", json.dumps(results["fitted_on_train"]))
    figures, notes = result_figures(results)
    write_result("grounding_calibration", figures, GOALS, notes)


if __name__ == "__main__":
    main()
