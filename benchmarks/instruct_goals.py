"""The instruct demo pair's goals through a warmed worker: held-out questions over the demo corpus.

    .venv/bin/python -m benchmarks.instruct_goals --questions 30 --out runs/goals.json

30 questions about the demo-corpus topics the pair never trained on (training/corpus.py's seeded
held-out split), built as training/qa.py builds questions, each with the document and sentence
that answer it. The whole demo corpus is ingested once per method, into a tenant of that
method's own, so no answer reuses the prefix-cache blocks of another method's answer to the same
question; one live worker (Redis, PostgreSQL, the shipped pair, warmed in every tenant) answers
every question once per method, one query at a time, methods interleaved per question in a
rotated order. Reported from the stored answers and stats:

- cites the answer: the answer cites [n] and source n is a chunk of the question's document
  (strict: and that chunk holds the reference sentence's first six words);
- retrieved: some source is a chunk of the question's document (strict: holds the sentence),
  the ceiling retrieval sets on "cites the answer"; and how often each [n] is cited;
- loops: a 4-word sequence repeated three times or more in one answer;
- acceptance per method (accepted / drafted, summed), and each method's generation speedup over
  ``none`` (sums of the stored generation_ms); the answers of every method must be identical
  (greedy);
- acceptance length (tokens after the first per target pass) and one-stream decode tokens/s (tokens
  after the first over generation_ms - ttft_ms), with ``eagle``'s as ratios to the draft
  model's and to ``none`` (the EAGLE head's goals; the head is models/demo/eagle).

``--methods none:4,eagle:4`` runs a subset.

Needs PostgreSQL on 127.0.0.1:5432 and ``redis-server`` (a private one is started).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.support import (
    RedisServer,
    create_database,
    database_url,
    drop_database,
    goal,
    write_result,
)

GOALS = [
    goal(
        "instruct",
        "held-out questions whose answer cites the answering passage (of 30)",
        "cites_answer",
        ">=",
        25,
    ),
    goal("instruct", "answers that loop (of 30)", "loops", "<=", 0),
    goal("instruct", "draft acceptance rate through a warmed worker", "acceptance_rate", ">=", 0.6),
    goal(
        "instruct",
        "speedup of the best method over none through a warmed worker",
        "best_speedup",
        ">=",
        1.5,
        "x",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


METHODS = [
    ("none", 4),
    ("draft_model", 4),
    ("ngram", 4),
    ("draft_model", "auto"),
    ("eagle", 4),
    ("eagle", "auto"),
]


def held_out_questions(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``count`` seeded questions about held-out demo topics: question, file, reference quote."""
    from training.corpus import build_corpus

    docs = [d for d in build_corpus(seed).heldout if d.source.startswith("demo/corpus/")]
    return generated_questions(docs, count, random.Random(1234 + seed))


def demo_questions(count: int, seed: int, exclude: Iterable[str] = ()) -> list[dict[str, str]]:
    """``count`` questions built the same way over every demo-corpus document (trained-on
    topics too), none of them in ``exclude``: a larger set beside the held-out 30."""
    from training.corpus import build_corpus

    corpus = build_corpus(0)
    docs = [d for d in corpus.train + corpus.heldout if d.source.startswith("demo/corpus/")]
    return generated_questions(docs, count, random.Random(seed), exclude)


def generated_questions(
    docs: Sequence[Any], count: int, rng: random.Random, exclude: Iterable[str] = ()
) -> list[dict[str, str]]:
    """``count`` distinct questions from training/qa.py's generator over ``docs`` (220-word
    chunks), each with its document's file name and the verbatim span that answers it."""
    from training.qa import chunk_documents, question_and_quote

    chunks = chunk_documents(docs, 220)
    by_doc = {d.title: Path(d.source).name for d in docs}
    out: list[dict[str, str]] = []
    seen: set[str] = set(exclude)
    while len(out) < count:
        chunk = rng.choice(chunks)
        qa = question_and_quote(rng, chunk)
        if qa is None or qa[0] in seen:
            continue
        seen.add(qa[0])
        out.append({"question": qa[0], "file": by_doc[chunk.doc_title], "quote": qa[1]})
    return out


def loops(text: str) -> bool:
    """Whether some 4-word sequence occurs three times or more."""
    words = text.split()
    grams = Counter(tuple(words[i : i + 4]) for i in range(len(words) - 3))
    return any(n >= 3 for n in grams.values())


def cites_answer(
    answer: str, sources: list[dict[str, Any]], file: str, quote: str
) -> tuple[bool, bool]:
    """(cites a chunk of the question's document, and that chunk holds the reference's start)."""
    loose = strict = False
    for n in {int(m) for m in re.findall(r"\[(\d+)\]", answer)}:
        if 1 <= n <= len(sources) and sources[n - 1]["document"].endswith(file):
            loose = True
            strict = strict or holds_quote(sources[n - 1]["text"], quote)
    return loose, strict


def holds_quote(text: str, quote: str) -> bool:
    """Whether a passage holds the reference's start (its first six words, spacing ignored)."""
    return " ".join(quote.split()[:6]) in " ".join(text.split())


def retrieved_answer(sources: list[dict[str, Any]], file: str, quote: str) -> tuple[bool, bool]:
    """(some retrieved source is a chunk of the question's document, some holds the reference's
    start): the ceiling of ``cites_answer`` that retrieval sets before the model writes a word."""
    loose = strict = False
    for src in sources:
        if src["document"].endswith(file):
            loose = True
            strict = strict or holds_quote(src["text"], quote)
    return loose, strict


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from sqlalchemy import select

    from app.db import Query, make_engine, make_session_factory
    from app.db.schema import upgrade
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import (
        create_query,
        get_or_create_tenant,
        query_view,
        validate_request,
    )
    from app.resources import Resources
    from app.settings import Settings
    from workers import create_celery, send_query
    from workers.process import WorkerProcess, settings_env

    questions = held_out_questions(args.questions)
    if args.guard is not None:
        # A guard set beside the held-out 30, for choosing between training runs without tuning
        # on them: as many questions over every demo document, none of the held-out ones.
        held = [q["question"] for q in held_out_questions(30)]
        questions = demo_questions(args.questions, args.guard, exclude=held)
    dbname = create_database()
    redis = RedisServer(work)
    redis.start()
    worker = None
    rows: list[dict[str, Any]] = []
    try:
        settings = Settings(
            data_dir=work / "data",
            database_url=database_url(dbname),
            broker_url=redis.url(0),
            target_model=Path(args.models) / "target",
            draft_model=Path(args.models) / "draft",
            eagle_model=Path(args.models) / "eagle" if "eagle" in str(METHODS) else None,
            device="cpu",
            torch_threads=1,
            worker_concurrency=1,
            max_tokens_limit=args.max_tokens,
            default_top_k=args.top_k,
        )
        engine = make_engine(settings)
        upgrade(engine)
        factory = make_session_factory(engine)
        corpus = sorted((ROOT / "demo" / "corpus").glob("*.md"))
        # One tenant per method: the worker salts its prefix cache per tenant, so no method's
        # answer reuses the KV of another method's answer to the same question (asked first, it
        # would pay the whole prompt's prefill for the others). Each tenant still caches what a
        # tenant of the service caches: its own system prompt and recurring passages.
        labels = [f"{m}:{k}" for m, k in METHODS]
        retrieval = Resources(settings, factory).retrieval
        for label in labels:
            retrieval.ingest(corpus, collection="demo", tenant=f"bench-{label}")
        log = work / "worker.log"
        worker = WorkerProcess(settings_env(settings), log, name="goals", cwd=ROOT).start()
        worker.wait_ready(timeout=600)
        fmt_line = next((ln for ln in log.read_text().splitlines() if "prompt format:" in ln), "")
        celery = create_celery(settings)
        with factory() as session:
            tenants = {label: get_or_create_tenant(session, f"bench-{label}") for label in labels}

        def ask(question: str, method: str, k: int | str) -> dict[str, Any]:
            request = validate_request(
                settings,
                {"question": question, "collection": "demo", "max_tokens": args.max_tokens,
                 "method": method, "num_speculative_tokens": k},
            )  # fmt: skip
            with factory() as session:
                query, _ = create_query(session, tenants[f"{method}:{k}"], request)
            send_and_mark(
                factory, query.id, "answer", lambda q, queue: send_query(celery, q, queue)
            )
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                with factory() as session:
                    found = session.scalar(select(Query).where(Query.id == query.id))
                    if found is not None and found.status in ("succeeded", "failed"):
                        return json.loads(json.dumps(query_view(found), default=str))
                time.sleep(0.05)
            raise TimeoutError(f"query {query.id} still open")

        # Warm-up, in every method's tenant: kernels, the tenant's cached system prompt, the
        # adaptive-k costs. The first two held-out questions serve, under another phrasing, so
        # that no measured prompt is cached.
        for q in questions[:2]:
            for method, k in METHODS:
                ask(f"{q['question']} (warm-up)", method, k)
        for i, q in enumerate(questions):
            row = {**q, "answers": {}}
            # Methods in a rotated order per question: none is not always first.
            shift = i % len(METHODS)
            for method, k in METHODS[shift:] + METHODS[:shift]:
                view = ask(q["question"], method, k)
                row["answers"][f"{method}:{k}"] = view
            rows.append(row)
            print(f"[{time.strftime('%H:%M:%S')}] {i + 1}/{len(questions)}", file=sys.stderr)
        engine.dispose()
    finally:
        if worker is not None:
            worker.stop()
        redis.stop()
        drop_database(dbname)
    return summarise(rows, fmt_line)


def summarise(rows: list[dict[str, Any]], fmt_line: str) -> dict[str, Any]:
    """The goals' figures from the stored answers."""
    per: dict[str, dict[str, float]] = {}
    for key in (f"{m}:{k}" for m, k in METHODS):
        views = [r["answers"][key] for r in rows]
        stats = [v["stats"] for v in views if v["status"] == "succeeded"]
        drafted = sum(s["num_draft_tokens"] for s in stats)
        passes = sum(s["num_target_forwards"] for s in stats)
        decode_ms = sum(s["generation_ms"] - s["ttft_ms"] for s in stats)
        after_first = sum(s["num_output_tokens"] - 1 for s in stats)
        per[key] = {
            "tokens_per_target_pass": after_first / passes if passes else None,
            "decode_tokens_per_s": after_first / decode_ms * 1000.0 if decode_ms else None,
            "succeeded": len(stats),
            "generation_ms": sum(s["generation_ms"] for s in stats),
            "acceptance": sum(s["num_accepted_tokens"] for s in stats) / drafted
            if drafted
            else None,
            "tokens": sum(s["num_output_tokens"] for s in stats),
            "prompt_format": sorted({str(s.get("prompt_format")) for s in stats}),
        }
    base = per["none:4"]["generation_ms"]
    for v in per.values():
        v["speedup"] = base / v["generation_ms"] if v["generation_ms"] else None
    ratios: dict[str, float] = {}
    for eagle in (k for k in per if k.startswith("eagle:")):
        e = per[eagle]
        for other in ("draft_model:4", "draft_model:auto", "none:4"):
            o = per.get(other)
            if o is None or not o["decode_tokens_per_s"] or not e["decode_tokens_per_s"]:
                continue
            ratios[f"{eagle} / {other} decode tokens/s"] = (
                e["decode_tokens_per_s"] / o["decode_tokens_per_s"]
            )
            if o["tokens_per_target_pass"] and other != "none:4":
                ratios[f"{eagle} / {other} tokens per target pass"] = (
                    e["tokens_per_target_pass"] / o["tokens_per_target_pass"]
                )
    answers = [r["answers"]["none:4"] for r in rows]
    cited = [cites_answer(a.get("answer") or "", a.get("sources") or [], r["file"], r["quote"])
             for a, r in zip(answers, rows, strict=True)]  # fmt: skip
    held = [retrieved_answer(a.get("sources") or [], r["file"], r["quote"])
            for a, r in zip(answers, rows, strict=True)]  # fmt: skip
    cited_n = Counter(
        n for a in answers for n in set(re.findall(r"\[(\d+)\]", a.get("answer") or ""))
    )
    same = sum(len({r["answers"][k].get("answer") for k in r["answers"]}) == 1 for r in rows)
    return {
        "worker_prompt_format_line": fmt_line,
        "questions": len(rows),
        "cite_answer_document": sum(c[0] for c in cited),
        "cite_answer_strict": sum(c[1] for c in cited),
        "retrieved_answer_document": sum(h[0] for h in held),
        "retrieved_answer_strict": sum(h[1] for h in held),
        "cited_numbers": dict(sorted(cited_n.items())),
        "loops": sum(loops(a.get("answer") or "") for a in answers),
        "identical_across_methods": same,
        "methods": per,
        "eagle_ratios": ratios,
        "samples": [
            {
                "question": r["question"],
                "file": r["file"],
                "answer": a.get("answer"),
                # per method: output tokens, drafted, accepted (acceptance without the loops, ...)
                "tokens": {
                    k: [
                        (v.get("stats") or {}).get(f)
                        for f in ("num_output_tokens", "num_draft_tokens", "num_accepted_tokens")
                    ]
                    for k, v in r["answers"].items()
                },
            }
            for r, a in zip(rows, answers, strict=True)
        ],
    }


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local directories
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--guard",
        type=int,
        default=None,
        metavar="SEED",
        help="ask demo_questions(N, SEED) (every demo document, none of the held-out 30) instead",
    )
    ap.add_argument("--methods", default=None, help="method:k,... (default: all; none:4 first)")
    ap.add_argument(
        "--top-k", type=int, default=3, help="passages per question (the service's default_top_k)"
    )
    args = ap.parse_args()
    if args.methods:
        # "method" alone means k = 4
        pairs = (f"{item}:4".split(":")[:2] for item in args.methods.split(","))
        picked = [(m, int(k) if k.isdigit() else k) for m, k in pairs]
        METHODS[:] = picked
    with tempfile.TemporaryDirectory(prefix="instruct-goals-") as tmp:
        result = run(args, Path(tmp))
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    per = result["methods"]
    drafted = per.get("draft_model:4", {}).get("acceptance")
    best = max(((v["speedup"], k) for k, v in per.items() if k != "none:4" and v["speedup"]),
               default=(None, None))  # fmt: skip
    figures = {
        "cites_answer": result["cite_answer_document"],
        "loops": result["loops"],
        "acceptance_rate": drafted,
        "best_speedup": best[0],
        **summary,
    }
    notes = {"best_speedup": f"{best[1]}", "acceptance_rate": "draft_model k = 4",
             "cites_answer": f"of {result['questions']}; top-{args.top_k} retrieval holds the "
             f"answering document for {result['retrieved_answer_document']}"}  # fmt: skip
    write_result("instruct_goals", figures, GOALS, notes)


if __name__ == "__main__":
    main()
