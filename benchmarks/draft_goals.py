"""The draft-tuning goals: tune the demo draft on stored traffic over a corpus the pair never saw.

    nice -n 10 env .venv/bin/python -m benchmarks.draft_goals \
        --questions 400 --fresh 30 --demo 30 --tune-seconds 1500 --work runs/draft_goals

1. ``traffic``: a fresh PostgreSQL database and a private Redis; the standard-library modules
   held out of the pair's training (training/corpus.py's seeded split, ``stdlib:`` documents)
   ingested as collection ``stdlib`` and the demo corpus as ``demo``; one live worker with the
   shipped pair answers ``--questions`` generated questions over ``stdlib`` (traffic, source
   ``api``), ``--fresh`` other questions over it and ``--demo`` held-out demo-corpus questions
   (benchmarks/instruct_goals.py's) (both source ``benchmark``: never in a training set), all
   greedy, ``draft_model`` k=4, ``max_tokens`` 96. The worker keeps every answer's token ids.
2. ``dataset``: ``specrag draft dataset`` over the run's window (a quarter held out by query).
3. ``tune``: ``specrag draft tune`` from the shipped draft, bounded by ``--tune-seconds``.
4. ``evaluate``: ``specrag draft evaluate OLD NEW`` on the held-out traffic, the fresh and the
   demo questions (prompts as the worker built them), with its chart.
5. ``swap``: a worker started with the tuned draft answers the fresh questions again as
   traffic; the audit report grouped by model_pair shows both pairs.

Each phase leaves a marker in ``--work`` and is skipped when run again; ``--cleanup`` drops the
database at the end. Needs PostgreSQL on 127.0.0.1:5432 and ``redis-server``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.instruct_goals import held_out_questions
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
        "drafts",
        "tuned draft's acceptance gain on held-out stored traffic (absolute)",
        "traffic_acceptance_gain",
        ">=",
        0.1,
    ),
    goal(
        "drafts",
        "tuned draft's acceptance gain on fresh questions, same modules",
        "fresh_acceptance_gain",
        ">=",
        0.1,
    ),
    goal(
        "drafts",
        "tuned / shipped draft: decode speed on held-out stored traffic",
        "traffic_decode_speedup",
        ">=",
        1.15,
        "x",
    ),
    goal(
        "drafts",
        "tuned / shipped draft: decode speed on fresh questions",
        "fresh_decode_speedup",
        ">=",
        1.15,
        "x",
    ),
    goal(
        "drafts",
        "tuned / shipped draft: fresh questions counting the prompt's prefill",
        "fresh_with_prefill_speedup",
        ">=",
        1.15,
        "x",
    ),
    goal(
        "drafts",
        "acceptance change on held-out demo questions (no forgetting)",
        "demo_acceptance_change",
        ">=",
        -0.03,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


MAX_TOKENS = 96


def stdlib_documents(seed: int = 0) -> list[Any]:
    """The standard-library module documents held out of the pair's training split."""
    from training.corpus import build_corpus

    return [d for d in build_corpus(seed).heldout if d.source.startswith("stdlib:")]


def stdlib_questions(docs: list[Any], count: int, seed: int, skip: set[str]) -> list[str]:
    """``count`` seeded distinct questions over ``docs`` (training/qa.py's generator)."""
    from training.qa import chunk_documents, question_and_quote

    rng = random.Random(seed)
    chunks = chunk_documents(docs, 220)
    out: list[str] = []
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > count * 200:
            raise RuntimeError(f"only {len(out)} distinct questions after {tries} tries")
        qa = question_and_quote(rng, rng.choice(chunks))
        if qa is None or qa[0] in skip:
            continue
        skip.add(qa[0])
        out.append(qa[0])
    return out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Run:
    """The run's state in ``--work``: database, phase markers, settings for the worker and CLI."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work: Path = args.work.resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.state_path = self.work / "state.json"
        self.state: dict[str, Any] = (
            json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        )
        if "database" not in self.state:
            self.state["database"] = create_database("specrag_drafts")
            self.save()
        self.redis = RedisServer(self.work)

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=2) + "\n")

    def done(self, phase: str) -> bool:
        return phase in self.state.get("phases", {})

    def mark(self, phase: str, info: Any = None) -> None:
        self.state.setdefault("phases", {})[phase] = info if info is not None else True
        self.save()

    def settings(self, draft: Path) -> Any:
        from app.settings import Settings

        models = Path(self.args.models)
        return Settings(
            data_dir=self.work / "data",
            database_url=database_url(self.state["database"]),
            broker_url=self.redis.url(0),
            target_model=models / "target",
            draft_model=draft,
            device="cpu",
            torch_threads=1,
            worker_concurrency=1,
            max_tokens_limit=MAX_TOKENS,
        )

    def cli(self, *argv: str) -> str:
        """Run ``specrag ...`` (this checkout's code) on the run's database; its stdout."""
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SPECRAG_DATABASE_URL": database_url(self.state["database"]),
            "SPECRAG_DATA_DIR": str(self.work / "data"),
            "SPECRAG_TARGET_MODEL": str(Path(self.args.models) / "target"),
            "SPECRAG_DRAFT_MODEL": str(Path(self.args.models) / "draft"),
            "SPECRAG_TORCH_THREADS": "1",
        }
        code = "from workers.cli import main; main(prog_name='specrag')"
        cmd = [sys.executable, "-c", code, *argv]
        log("$ specrag " + " ".join(argv))
        done = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise SystemExit(f"specrag {argv[0]} {argv[1]} failed (exit {done.returncode})")
        return done.stdout


def ask_all(
    run: Run, draft: Path, asks: list[tuple[str, str, str]], name: str
) -> dict[str, list[str]]:
    """Answer every (question, collection, source) through one live worker; query ids by source.

    All queries are stored and sent at once; the worker (one query in flight) works through the
    queue while this waits for every one to be final.
    """
    from sqlalchemy import func, select

    from app.db import Query, make_engine, make_session_factory
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from workers import create_celery, send_query
    from workers.process import WorkerProcess, settings_env

    settings = run.settings(draft)
    engine = make_engine(settings)
    factory = make_session_factory(engine)
    worker = WorkerProcess(
        settings_env(settings), run.work / f"worker-{name}.log", name=name, cwd=ROOT
    ).start()
    ids: dict[str, list[str]] = {}
    try:
        worker.wait_ready(timeout=900)
        celery = create_celery(settings)
        with factory() as session:
            tenant = get_or_create_tenant(session, "acme")
        for question, collection, source in asks:
            request = validate_request(
                settings,
                {"question": question, "collection": collection, "max_tokens": MAX_TOKENS,
                 "method": "draft_model", "num_speculative_tokens": 4},
            )  # fmt: skip
            with factory() as session:
                query, _ = create_query(session, tenant, request, source=source)
            send_and_mark(
                factory, query.id, "answer", lambda q, queue: send_query(celery, q, queue)
            )
            ids.setdefault(source, []).append(str(query.id))
        all_ids = [i for v in ids.values() for i in v]
        deadline = time.monotonic() + run.args.ask_timeout
        last = -1
        while time.monotonic() < deadline:
            with factory() as session:
                final = session.scalar(
                    select(func.count())
                    .select_from(Query)
                    .where(Query.id.in_(all_ids), Query.status.in_(("succeeded", "failed")))
                )
            if final != last:
                log(f"{name}: {final}/{len(all_ids)} answered")
                last = final or 0
            if final == len(all_ids):
                break
            time.sleep(5)
        else:
            raise SystemExit(f"{name}: only {last}/{len(all_ids)} answered in time")
    finally:
        worker.stop()
        engine.dispose()
    return ids


def items_file(run: Run, query_ids: list[str], out: Path) -> None:
    """The queries' prompts and outputs as draft-dataset items (for evaluate's --items)."""
    import uuid

    from sqlalchemy import select

    from app.db import Query, make_engine, make_session_factory
    from app.drafts.records import AnswerTokens

    engine = make_engine(run.settings(Path(run.args.models) / "draft"))
    factory = make_session_factory(engine)
    with factory() as session, out.open("w") as f:
        rows = session.execute(
            select(Query, AnswerTokens)
            .join(AnswerTokens, AnswerTokens.query_id == Query.id)
            .where(Query.id.in_([uuid.UUID(i) for i in query_ids]))
        ).all()
        for q, t in rows:
            f.write(json.dumps({
                "query_id": str(q.id), "collection": q.collection, "method": "draft_model",
                "temperature": 0.0, "max_tokens": MAX_TOKENS,
                "prompt_ids": t.prompt_token_ids, "output_ids": t.output_token_ids,
            }) + "\n")  # fmt: skip
    engine.dispose()
    log(f"{out.name}: {len(rows)} items")


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local directories
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=str(ROOT / "models" / "demo"))
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "draft_goals")
    ap.add_argument("--questions", type=int, default=400)
    ap.add_argument("--fresh", type=int, default=30)
    ap.add_argument("--demo", type=int, default=30)
    ap.add_argument("--tune-seconds", type=int, default=1500)
    ap.add_argument("--ask-timeout", type=float, default=2400.0)
    ap.add_argument("--swap", type=int, default=30, help="fresh questions re-asked after the swap")
    ap.add_argument("--min-items", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--tokens-per-batch", type=int, default=2048)
    ap.add_argument("--cleanup", action="store_true")
    args = ap.parse_args(argv)
    run = Run(args)
    old = Path(args.models) / "draft"
    run.redis.start()
    try:
        if not run.done("traffic"):
            from app.db import make_engine, make_session_factory
            from app.db.schema import upgrade
            from app.resources import Resources

            docs = stdlib_documents()
            corpus_dir = run.work / "stdlib"
            corpus_dir.mkdir(exist_ok=True)
            for d in docs:
                (corpus_dir / f"{d.source.split(':', 1)[1]}.md").write_text(d.text())
            log(f"{len(docs)} held-out stdlib modules: {', '.join(d.title for d in docs)}")
            settings = run.settings(old)
            engine = make_engine(settings)
            upgrade(engine)
            res = Resources(settings, make_session_factory(engine))
            res.retrieval.ingest(
                sorted(corpus_dir.glob("*.md")), collection="stdlib", tenant="acme"
            )
            demo = sorted((ROOT / "demo" / "corpus").glob("*.md"))
            res.retrieval.ingest(demo, collection="demo", tenant="acme")
            engine.dispose()
            seen: set[str] = set()
            traffic = stdlib_questions(docs, args.questions, 38, seen)
            fresh = stdlib_questions(docs, args.fresh, 3838, seen)
            demo_qs = [q["question"] for q in held_out_questions(args.demo)]
            t0 = datetime.now(UTC).isoformat()
            asks = (
                [(q, "stdlib", "api") for q in traffic]
                + [(q, "stdlib", "benchmark") for q in fresh[:]]
                + [(q, "demo", "benchmark") for q in demo_qs]
            )
            started = time.monotonic()
            ids = ask_all(run, old, asks, "before")
            bench = ids.get("benchmark", [])
            info = {
                "since": t0,
                "until": datetime.now(UTC).isoformat(),
                "traffic": ids.get("api", []),
                "fresh": bench[: len(fresh)],
                "demo": bench[len(fresh) :],
                "fresh_questions": fresh,
                "seconds": round(time.monotonic() - started),
            }
            run.mark("traffic", info)
        info = run.state["phases"]["traffic"]
        dataset = run.work / "dataset"
        if not run.done("dataset"):
            out = run.cli(
                "draft", "dataset", "--since", info["since"], "--until", info["until"],
                "--out", str(dataset), "--heldout", "0.25", "--json",
                "--min-items", str(args.min_items),
            )  # fmt: skip
            run.mark("dataset", json.loads(out)["items"])
        tuned = run.work / "drafts" / "draft-stdlib-tuned"
        if not run.done("tune"):
            started = time.monotonic()
            run.cli(
                "draft", "tune", "--dataset", str(dataset), "--draft", str(old),
                "--out", str(tuned), "--time-budget", str(args.tune_seconds),
                "--run-dir", str(run.work / "tune-run"), "--threads", "2",
                "--epochs", str(args.epochs), "--lr", str(args.lr),
                "--tokens-per-batch", str(args.tokens_per_batch),
            )  # fmt: skip
            run.mark("tune", {"seconds": round(time.monotonic() - started)})
        if not run.done("evaluate"):
            items_file(run, info["fresh"], run.work / "fresh.jsonl")
            items_file(run, info["demo"], run.work / "demo.jsonl")
            out = run.cli(
                "draft", "evaluate", str(old), str(tuned), "--dataset", str(dataset),
                "--items", f"fresh={run.work / 'fresh.jsonl'}",
                "--items", f"demo={run.work / 'demo.jsonl'}",
                "--chart", str(run.work / "evaluate.png"), "--force", "--json",
            )  # fmt: skip
            (run.work / "evaluate.json").write_text(out)
            run.mark("evaluate")
        if args.swap and not run.done("swap"):
            since = datetime.now(UTC).isoformat()
            fresh_qs = info["fresh_questions"][: args.swap]
            ask_all(run, tuned, [(q, "stdlib", "api") for q in fresh_qs], "after")
            report = run.cli(
                "audit", "report", "--since", info["since"], "--format", "json",
                "--group-by", "model_pair",
            )  # fmt: skip
            (run.work / "audit.json").write_text(report)
            run.mark("swap", {"since": since})
        print(json.dumps(run.state, indent=2))
    finally:
        run.redis.stop()
        if args.cleanup:
            drop_database(run.state["database"])
    record(run.work / "evaluate.json")


def record(evaluated: Path) -> None:
    """The goals' figures from ``specrag draft evaluate --json``'s report, per set of prompts."""
    sets = json.loads(evaluated.read_text())["sets"]
    traffic, fresh, demo = sets["heldout"], sets["fresh"], sets["demo"]
    figures = {
        "traffic_acceptance_gain": traffic["acceptance_gain"],
        "fresh_acceptance_gain": fresh["acceptance_gain"],
        "traffic_decode_speedup": traffic["speed_ratio"],
        "fresh_decode_speedup": fresh["speed_ratio"],
        "fresh_with_prefill_speedup": fresh["generation_speed_ratio"],
        "demo_acceptance_change": demo["acceptance_gain"],
        "sets": sets,
    }
    notes = {
        name: f"acceptance {s['old']['acceptance_rate']:.3f} to {s['new']['acceptance_rate']:.3f}"
        for name, s in (("traffic_acceptance_gain", traffic), ("fresh_acceptance_gain", fresh))
    }
    write_result("draft_goals", figures, GOALS, notes)


if __name__ == "__main__":
    main()
