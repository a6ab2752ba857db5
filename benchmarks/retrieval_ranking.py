"""Where retrieval ranks the passage that answers, on generated questions over the demo corpus.

    PYTHONPATH=$PWD HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/retrieval_ranking.py --bonus 0 1

No language model: the ceiling that retrieval sets on "the answer cites a passage that holds the
answer" (issue 33), measured in seconds instead of a worker run. The whole demo corpus is
ingested once through the service's own path (``Resources(...).retrieval``: MiniLM, FAISS,
Tantivy, SQLite) and every question is searched with ``RetrievalService.search`` at ``--top-k``
(the service's default 3), once per ``--bonus`` (the service's ``all_terms_bonus``; 0: the
fusion alone). Two question sets, both from training/qa.py's generator:

- held-out 30: ``instruct_goals.held_out_questions(30)``, the issue's set;
- demo N: ``instruct_goals.demo_questions(N, --seed)`` over every demo document, none of the 30:
  a larger set, so that a change is not tuned to 30 questions.

Per set and bonus: how often the first passage is a chunk of the question's document (loose)
and one holding the reference sentence's start (strict), the same for any of the top k, and how
often a passage of *any* document holds the sentence (the corpus repeats many sections
verbatim: ``compound.md`` holds ``try.md``'s text). The shipped model cites [1], so "first"
is its citation score. Each later bonus is compared with the first question by question
(better / worse on "first", two-sided exact sign test). Search time is the mean of warm
searches, the bonuses interleaved question by question. ``--failures N`` prints the first N
questions whose first passage is from another document: the winners, and where the answering
document's best chunk stands in the fused ranking and in each leg.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.instruct_goals import (  # noqa: E402
    demo_questions,
    held_out_questions,
    holds_quote,
    retrieved_answer,
)
from retrieval.fusion import ALL_TERMS_BONUS  # noqa: E402

COLLECTION, TENANT = "demo", "bench"
# Outcomes per question, in table order.
FIGURES = ("first", "first strict", "top k", "top k strict", "first any doc", "top k any doc")


def outcome(hits: list[Any], q: dict[str, str]) -> dict[str, bool]:
    """One question's figures from its ranked hits."""
    sources = [{"document": h.document, "text": h.text} for h in hits]
    first = retrieved_answer(sources[:1], q["file"], q["quote"])
    top = retrieved_answer(sources, q["file"], q["quote"])
    anywhere = [holds_quote(h.text, q["quote"]) for h in hits]
    values = (*first, *top, bool(anywhere[:1] and anywhere[0]), any(anywhere))
    return dict(zip(FIGURES, values, strict=True))


def sign_test(better: int, worse: int) -> float:
    """Two-sided exact sign test: the chance of a split at least this uneven if neither order
    were better (ties dropped)."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1)) / 2**n
    return min(1.0, 2 * tail)


def failures(service: Any, questions: list[dict[str, str]], top_k: int, limit: int) -> list[str]:
    """The first ``limit`` questions whose first passage is from another document."""
    lines: list[str] = []
    shown = 0
    for q in questions:
        if shown >= limit:
            break
        hits = service.search(q["question"], collection=COLLECTION, tenant=TENANT, top_k=100)
        if not hits or hits[0].document.endswith(q["file"]):
            continue
        shown += 1
        lines.append(f"Q: {q['question']}  (answer: {q['file']})")
        for h in hits[:top_k]:
            lines.append(f"   won  {_where(h)}")
        rank, best = next(((i, h) for i, h in enumerate(hits, 1)
                           if h.document.endswith(q["file"])), (None, None))  # fmt: skip
        if best is None:
            lines.append("   answering document: not among 100 fused candidates")
        else:
            held = holds_quote(best.text, q["quote"])
            lines.append(
                f"   answer's best {_where(best)} fused #{rank}, holds the sentence: {held}"
            )
    return lines


def _where(h: Any) -> str:
    return (f"{Path(h.document).name}#{h.position} [{h.passage_title}] score {h.score:.3f} "
            f"dense #{h.dense_rank} lexical #{h.lexical_rank}")  # fmt: skip


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from app.db import make_engine, make_session_factory
    from app.db.schema import upgrade
    from app.resources import Resources
    from app.settings import Settings

    settings = Settings(data_dir=work)
    engine = make_engine(settings)
    upgrade(engine)
    service = Resources(settings, make_session_factory(engine)).retrieval
    corpus = sorted((ROOT / "demo" / "corpus").glob("*.md"))
    started = time.perf_counter()
    report = service.ingest(corpus, collection=COLLECTION, tenant=TENANT)
    print(f"ingest: {len(corpus)} files, {report.to_dict()['chunks']} chunks added or updated, "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)  # fmt: skip
    held = held_out_questions(30)
    sets = {
        "held-out 30": held,
        f"demo {args.questions}": demo_questions(
            args.questions, args.seed, {q["question"] for q in held}
        ),
    }
    for q in sets["held-out 30"]:  # warm-up: the timings below are of warm searches
        service.search(q["question"], collection=COLLECTION, tenant=TENANT, top_k=args.top_k)
    results: dict[str, Any] = {}
    for name, questions in sets.items():
        runs = {b: {"outcomes": [], "seconds": 0.0} for b in args.bonus}
        for q in questions:  # bonuses interleaved per question: the load falls on each alike
            for bonus in args.bonus:
                service.all_terms_bonus = bonus
                started = time.perf_counter()
                hits = service.search(q["question"], collection=COLLECTION, tenant=TENANT,
                                      top_k=args.top_k)  # fmt: skip
                runs[bonus]["seconds"] += time.perf_counter() - started
                runs[bonus]["outcomes"].append(outcome(hits, q))
        for bonus, run in runs.items():
            ms = run["seconds"] * 1000 / len(questions)
            results[f"{name} | bonus {bonus:g}"] = {
                "outcomes": run["outcomes"],
                "ms_per_search": ms,
            }
    if args.failures:
        service.all_terms_bonus = args.bonus[-1]
        for name, questions in sets.items():
            print(f"\nFailures, {name}, bonus {args.bonus[-1]:g}:")
            print("\n".join(failures(service, questions, args.top_k, args.failures)))
    engine.dispose()
    return {"sets": {n: len(q) for n, q in sets.items()}, "top_k": args.top_k, "runs": results}


def table(result: dict[str, Any], bonuses: list[float]) -> list[str]:
    """The Markdown table of every set and bonus, with the paired comparison to the first."""
    k = result["top_k"]
    heads = [f.replace("top k", f"top {k}") for f in FIGURES]
    out = [
        f"| set | all_terms_bonus | {' | '.join(heads)} | first: better / worse (sign test p) "
        "| ms per search |",
        "|---|---|" + "---|" * len(FIGURES) + "---|---|",
    ]
    for name, n in result["sets"].items():
        base = result["runs"][f"{name} | bonus {bonuses[0]:g}"]["outcomes"]
        for bonus in bonuses:
            run = result["runs"][f"{name} | bonus {bonus:g}"]
            cells = [f"{sum(o[f] for o in run['outcomes'])} / {n}" for f in FIGURES]
            if bonus == bonuses[0]:
                paired = "—"
            else:
                pairs = list(zip(base, run["outcomes"], strict=True))
                parts = []
                for fig in ("first", "first strict"):
                    better = sum(b[fig] and not a[fig] for a, b in pairs)
                    worse = sum(a[fig] and not b[fig] for a, b in pairs)
                    parts.append(f"{fig}: {better} / {worse} (p {sign_test(better, worse):.3g})")
                paired = "; ".join(parts)
            out.append(f"| {name} | {bonus:g} | {' | '.join(cells)} | {paired} "
                       f"| {run['ms_per_search']:.1f} |")  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--questions", type=int, default=300, help="size of the larger set")
    ap.add_argument("--seed", type=int, default=99, help="seed of the larger set")
    ap.add_argument("--top-k", type=int, default=3, help="passages per question")
    ap.add_argument("--bonus", type=float, nargs="+", default=[0.0, ALL_TERMS_BONUS],
                    help="all_terms_bonus values, compared with the first")  # fmt: skip
    ap.add_argument("--failures", type=int, default=0, help="print this many failures per set")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="keep the ingest here (reused next time: unchanged files are skipped)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="write every outcome as JSON")
    args = ap.parse_args()
    if args.data_dir is not None:
        result = run(args, args.data_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="retrieval-ranking-") as tmp:
            result = run(args, Path(tmp))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + "\n".join(table(result, args.bonus)))


if __name__ == "__main__":
    main()
