"""One-shot ``specrag ask --local`` per method, against the same questions through a warmed engine.

    .venv/bin/python -m benchmarks.ask_oneshot --data-dir DIR [--questions 8]
        [--methods none,draft_model,ngram,eagle[,draft_model:auto]] [--max-tokens 96]
        [--threads 1]

Every (question, method) is a fresh process running the real CLI (``workers.cli``'s ``specrag``
entry point) with ``ask Q -c demo --local --method M --max-tokens N --json``; methods are
interleaved per question, their order rotated from one question to the next. The questions are
``benchmarks/instruct_goals.held_out_questions``. ``DIR`` is a data dir (SQLite, indexes) that
gets the demo corpus ingested as collection ``demo`` (tenant ``default``) if it has none.

Each process is started through this file's ``--probe`` mode, which times the CLI's phases (each
phase's own time, without the phases inside it) by wrapping the functions that do them, and
then runs the CLI unchanged. Printed: per method the sums of the stored ``generation_ms``
(speedup over ``none``), the acceptance, the process wall time, and the median breakdown of a
process's time; then the same questions and methods answered by one warmed in-process engine
(``Resources.warm``, as a worker warms; two warm-up questions first), for reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.support import goal, write_result

GOALS = [
    goal(
        "instruct",
        "one-shot ask --local: speedup of the best method over none (8 questions)",
        "best_speedup",
        ">=",
        1.5,
        "x",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent

PHASES = (
    "interpreter",
    "imports",
    "settings+db",
    "embedder load",
    "tokenizer load",
    "model load",
    "vocab check",
    "weight packing",
    "engine setup",
    "warm-up",
    "cost tables",
    "retrieval",
    "prompt",
    "generation",
    "record",
    "other",
)


# --- the probe: runs inside each one-shot process --------------------------------------------


class PhaseClock:
    """Each wrapped call's own time (less the wrapped calls inside it), summed per phase."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []

    def wrap(self, owner: Any, attr: str, phase: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            self._stack.append([0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                inner = self._stack.pop()[0]
                self.totals[phase] += spent - inner
                if self._stack:
                    self._stack[-1][0] += spent

        setattr(owner, attr, timed)


def probe(argv: list[str]) -> int:
    """Run ``specrag`` with ``argv``, timing its phases; write them to $ONESHOT_PHASES."""
    started = time.time()
    began = time.perf_counter()
    clock = PhaseClock()
    clock.totals["interpreter"] = started - float(os.environ["ONESHOT_LAUNCHED"])
    t = time.perf_counter()
    import faiss  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import app.commands.ask as ask_cmd
    import app.pipeline as pipeline
    import generation.spec_decode.goodput as goodput
    import generation.torch_engine as torch_engine
    import retrieval.embedder as embedder
    import workers.cli as cli

    clock.totals["imports"] = time.perf_counter() - t
    for owner, attr, phase in (
        (ask_cmd, "get_settings", "settings+db"),
        (ask_cmd, "prepare", "settings+db"),
        (ask_cmd, "require_collection", "settings+db"),
        (embedder.Embedder, "__init__", "embedder load"),
        (torch_engine, "load_causal_lm", "model load"),
        (torch_engine, "load_head", "model load"),
        (torch_engine, "check_vocab_compatible", "vocab check"),
        (torch_engine, "forward_for", "weight packing"),
        (torch_engine.EagleHead, "__init__", "weight packing"),
        (torch_engine.SpeculativeEngine, "__init__", "engine setup"),
        (ask_cmd, "warm_one_shot", "warm-up"),
        (goodput, "interpolate", "cost tables"),  # after time_batch_steps: outside its total
        (torch_engine, "time_batch_steps", "cost tables"),
        (pipeline, "retrieve", "retrieval"),
        (pipeline, "build_request", "prompt"),
        (pipeline, "generate", "generation"),
        (pipeline, "record", "record"),
    ):
        clock.wrap(owner, attr, phase)
    import generation.model.loading as loading

    clock.wrap(loading, "load_tokenizer", "tokenizer load")
    import generation

    clock.wrap(generation, "load_tokenizer", "tokenizer load")
    code = 0
    try:
        cli.main.main(args=argv, prog_name="specrag", standalone_mode=False)
    except SystemExit as exc:
        code = int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - reported through the exit code
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    total = time.perf_counter() - began
    clock.totals["other"] = total - sum(v for k, v in clock.totals.items() if k != "interpreter")
    Path(os.environ["ONESHOT_PHASES"]).write_text(json.dumps(dict(clock.totals)))
    return code


# --- the driver ------------------------------------------------------------------------------


def ensure_corpus(env: dict[str, str]) -> None:
    """Migrate the data dir and ingest the demo corpus as ``demo`` unless it is there."""
    specrag = [sys.executable, "-c", "from workers.cli import main; main()"]
    subprocess.run([*specrag, "db", "upgrade"], env=env, check=True, capture_output=True)
    listed = subprocess.run(
        [*specrag, "collections", "list", "--json"], env=env, capture_output=True, text=True
    )
    if '"demo"' not in listed.stdout:
        subprocess.run(
            [*specrag, "ingest", str(ROOT / "demo" / "corpus"), "--collection", "demo"],
            env=env,
            check=True,
            capture_output=True,
        )


def split(label: str) -> tuple[str, str | None]:
    """``"draft_model:auto"`` -> ("draft_model", "auto"); ``"ngram"`` -> ("ngram", None)."""
    method, _, k = label.partition(":")
    return method, k or None


def one_shot(env: dict[str, str], question: str, label: str, max_tokens: int) -> dict[str, Any]:
    """One fresh ``specrag ask --local`` process: its stored stats, wall seconds and phases."""
    method, k = split(label)
    with tempfile.NamedTemporaryFile(suffix=".json") as phases:
        argv = ["ask", question, "-c", "demo", "--local", "--method", method,
                "--max-tokens", str(max_tokens), "--json"]  # fmt: skip
        argv += ["--num-speculative-tokens", k] if k else []
        launched = time.time()
        start = time.perf_counter()
        res = subprocess.run(
            [sys.executable, __file__, "--probe", "--", *argv],
            env={**env, "ONESHOT_LAUNCHED": repr(launched), "ONESHOT_PHASES": phases.name},
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if res.returncode != 0:
            raise RuntimeError(f"{method} {question!r}: rc {res.returncode}: {res.stderr[-2000:]}")
        view = json.loads(res.stdout.strip().splitlines()[-1])
        times = json.loads(Path(phases.name).read_text())
    times["exit"] = wall - sum(times.values())  # interpreter teardown, after the probe wrote
    return {"view": view, "wall_s": wall, "phases": times}


def warmed(env: dict[str, str], questions: list[str], methods: list[str], max_tokens: int) -> str:
    """The same questions through one warmed in-process engine (a worker's warm-up): JSON rows."""
    code = f"""
import json, sys
from benchmarks.ask_oneshot import answer_warmed
print(json.dumps(answer_warmed({questions!r}, {methods!r}, {max_tokens})))
"""
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT
    )
    if res.returncode != 0:
        raise RuntimeError(f"warmed engine: rc {res.returncode}: {res.stderr[-2000:]}")
    return res.stdout.strip().splitlines()[-1]


def answer_warmed(questions: list[str], methods: list[str], max_tokens: int) -> list[Any]:
    """In this process: warm as a worker does, then answer every question by every method."""
    from app.db import prepare
    from app.lifecycle.queries import (
        create_query,
        get_or_create_tenant,
        query_view,
        validate_request,
    )
    from app.pipeline import answer_query, generate
    from app.resources import Resources, apply_torch_threads
    from app.settings import Settings

    settings = Settings()
    apply_torch_threads(settings)
    _, factory = prepare(settings)
    resources = Resources(settings, factory)
    resources.warm(answer=True, ingest=False)

    def salted(label: str) -> Any:
        # A prefix-cache salt per method: no method reuses the prompt another method has just
        # prefilled for the same question (a one-shot process never finds it), while each keeps
        # the system prompt's blocks, as a worker and a one-shot warm-up both do.
        def step(built: Any, deltas: Any) -> Any:
            sampling = dataclasses.replace(built.sampling, cache_salt=f"bench-{label}")
            return generate(resources.engine, dataclasses.replace(built, sampling=sampling), deltas)

        return step

    def ask(question: str, label: str) -> dict[str, Any]:
        method, k = split(label)
        req = validate_request(
            settings,
            {"question": question, "collection": "demo", "method": method,
             "max_tokens": max_tokens, "num_speculative_tokens": k if k == "auto" else
             int(k) if k else None},
        )  # fmt: skip
        with factory() as session:
            tenant = get_or_create_tenant(session, "default")
            query, _ = create_query(session, tenant, req, source="local")
        answer_query(resources, query.id, generate_step=salted(label))
        from app.db import Query

        with factory() as session:
            return json.loads(json.dumps(query_view(session.get(Query, query.id)), default=str))

    from benchmarks.instruct_goals import held_out_questions

    for extra in held_out_questions(len(questions) + 2)[len(questions) :]:  # warm-up questions
        for method in methods:
            ask(extra["question"], method)
    rows = []
    for i, question in enumerate(questions):
        for method in rotated(methods, i):
            rows.append({"question": question, "method": method, "view": ask(question, method)})
    resources.close()
    return rows


def rotated(methods: list[str], i: int) -> list[str]:
    """``methods`` starting at the ``i``-th (each method leads in turn)."""
    i %= len(methods)
    return methods[i:] + methods[:i]


def summarise(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method: generation sum, acceptance, tokens, and (one-shot rows) wall and phases."""
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        stats = [r["view"]["stats"] for r in mine]
        drafted = sum(s["num_draft_tokens"] for s in stats)
        summary: dict[str, Any] = {
            "generation_ms": sum(s["generation_ms"] for s in stats),
            "ttft_ms": sum(s["ttft_ms"] for s in stats),
            "decode_ms": sum(s["generation_ms"] - s["ttft_ms"] for s in stats),
            "acceptance": sum(s["num_accepted_tokens"] for s in stats) / drafted
            if drafted
            else None,
            "tokens": sum(s["num_output_tokens"] for s in stats),
        }
        if mine and "wall_s" in mine[0]:
            summary["wall_s"] = sum(r["wall_s"] for r in mine)
            summary["phases"] = {
                p: statistics.median(r["phases"].get(p, 0.0) for r in mine)
                for p in (*PHASES, "exit")
            }
        out[method] = summary
    base = out.get("none")
    for summary in out.values():
        summary["speedup"] = base["generation_ms"] / summary["generation_ms"] if base else None
        summary["decode_speedup"] = base["decode_ms"] / summary["decode_ms"] if base else None
    return out


def table(title: str, per: dict[str, dict[str, Any]]) -> str:
    lines = [f"{title}", "",
             "| method | acceptance | generation ms (sum) | speedup over none | ttft ms (sum) "
             "| decode speedup (generation - ttft) | tokens | process wall s (sum) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for method, s in per.items():
        acc = f"{s['acceptance']:.2f}" if s["acceptance"] is not None else "—"
        wall = f"{s['wall_s']:.1f}" if "wall_s" in s else "—"
        lines.append(
            f"| {method} | {acc} | {s['generation_ms']:,.0f} | {s['speedup']:.2f}x "
            f"| {s['ttft_ms']:,.0f} | {s['decode_speedup']:.2f}x | {s['tokens']} | {wall} |"
        )
    return "\n".join(lines)


def phase_table(per: dict[str, dict[str, Any]]) -> str:
    methods = [m for m, s in per.items() if "phases" in s]
    lines = ["| phase (median s of a process) | " + " | ".join(methods) + " |",
             "|---|" + "---|" * len(methods)]  # fmt: skip
    for phase in (*PHASES, "exit"):
        cells = " | ".join(f"{per[m]['phases'][phase]:.2f}" for m in methods)
        lines.append(f"| {phase} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local directories
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        sys.exit(probe(sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument(
        "--methods", default="none,draft_model,ngram,eagle", help="method[:k],... (none first)"
    )
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--threads", type=int, default=1, help="SPECRAG_TORCH_THREADS (0: unset, torch's default)"
    )
    ap.add_argument("--no-warmed", action="store_true", help="skip the warmed-engine reference")
    ap.add_argument("--warmed-only", action="store_true", help="only the warmed-engine reference")
    ap.add_argument("--out", type=Path, default=None, help="every row and summary as JSON")
    args = ap.parse_args()
    from benchmarks.instruct_goals import held_out_questions

    env = {**os.environ, "SPECRAG_DATA_DIR": str(args.data_dir.resolve()), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    env.pop("SPECRAG_TORCH_THREADS", None)
    if args.threads:
        env["SPECRAG_TORCH_THREADS"] = str(args.threads)
    ensure_corpus(env)
    methods = args.methods.split(",")
    questions = [q["question"] for q in held_out_questions(args.questions)]
    rows = []
    for i, question in enumerate([] if args.warmed_only else questions):
        for method in rotated(methods, i):
            row = {"question": question, "method": method,
                   **one_shot(env, question, method, args.max_tokens)}  # fmt: skip
            rows.append(row)
            s = row["view"]["stats"]
            print(f"[{time.strftime('%H:%M:%S')}] q{i + 1} {method}: generation "
                  f"{s['generation_ms']:,.0f} ms, {s['num_output_tokens']} tokens, acceptance "
                  f"{s.get('acceptance_rate')}, wall {row['wall_s']:.1f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    result: dict[str, Any] = {"rows": rows}
    if rows:
        one = result["one_shot"] = summarise(rows, methods)
        same = sum(len({r["view"]["answer"] for r in rows if r["question"] == q}) == 1
                   for q in questions)  # fmt: skip
        print(table(f"One-shot `ask --local` ({len(questions)} questions, a fresh process each; "
                    f"same answer for every method on {same} / {len(questions)})", one))  # fmt: skip
        print()
        print(phase_table(one))
        best = max((m for m in methods if m != "none"), key=lambda m: one[m]["speedup"])
        print(f"\none-shot: best method {best}, generation speedup over none "
              f"{one[best]['speedup']:.2f}x")  # fmt: skip
    if not args.no_warmed:
        warm_rows = json.loads(warmed(env, questions, methods, args.max_tokens))
        result["warmed"] = summarise(warm_rows, methods)
        print()
        print(table("The same questions through one warmed in-process engine (a prefix-cache "
                    "salt per method)", result["warmed"]))  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    figures: dict[str, Any] = {"best_speedup": None, "questions": len(questions)}
    notes = {}
    if rows:
        figures.update(best_speedup=one[best]["speedup"], one_shot=one)
        notes["best_speedup"] = f"{best}, {len(questions)} questions"
    if "warmed" in result:
        figures["warmed"] = result["warmed"]
    write_result("ask_oneshot", figures, GOALS, notes)


if __name__ == "__main__":
    main()
