"""What the benchmarks share: services from testkit, worker subprocesses, and the results file.

Every benchmark runs as ``python -m benchmarks.NAME`` from the repository root and imports this
module (never ``tests/``); services the tests share too (scratch PostgreSQL databases, private
Redis, free ports) come from :mod:`testkit` and are re-exported here. ``write_result`` writes a
benchmark's figures, the goals they are read against and where they were measured to
``benchmarks/results/NAME.json``; ``python scripts/results.py`` renders docs/results.md from
those files. Percentiles everywhere are :func:`app.audit.stats.quantile`.
Nothing here imports torch, transformers, psycopg or Celery at import time.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testkit.services import (
    ADMIN_URL,
    RedisServer,
    claim_redis_db,
    create_database,
    database_url,
    drop_database,
    free_port,
    release_redis_db,
    scratch_database,
)
from testkit.tokenizer import train_tokenizer

if TYPE_CHECKING:
    from workers.process import WorkerProcess

__all__ = [
    "ADMIN_URL",
    "RedisServer",
    "claim_redis_db",
    "create_database",
    "database_url",
    "drop_database",
    "free_port",
    "release_redis_db",
    "scratch_database",
    "train_tokenizer",
]

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "demo" / "corpus"
DEMO = REPO / "models" / "demo"
"""The shipped demo pair: ``target/`` and ``draft/``."""
RESULTS = REPO / "benchmarks" / "results"
"""Where every benchmark writes its figures (``NAME.json``); docs/results.md is rendered from them."""


def start_worker(
    env: dict[str, str],
    log: Path,
    *,
    queues: str = "answer,batch",
    name: str | None = None,
    **extra: str,
) -> WorkerProcess:
    """A started ``specrag worker -Q queues`` subprocess (workers/process.py) on ``os.environ``
    updated with ``env`` and then with ``extra`` (more ``SPECRAG_*`` variables, one variant's)."""
    from workers.process import WorkerProcess  # celery: the tests import this module too

    return WorkerProcess({**os.environ, **env, **extra}, log, queues=queues, name=name).start()


def note(message: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def warm_up_torch_engine(engine: Any, max_batch: int) -> float:
    """Warm the torch engine as a worker's start does (app/resources.py): measure its step costs
    T(B, k) for every batch-size bucket up to ``max_batch`` now. Without it the first batch of
    each size measures them inside the timed traffic (a 16-row bucket: seconds). Returns the
    seconds it took, for the benchmark to report beside the engine's start."""
    from generation.spec_decode.goodput import buckets_up_to  # torch

    started = time.perf_counter()
    engine.warmup(batch_sizes=buckets_up_to(max_batch))
    return time.perf_counter() - started


def goal(area: str, text: str, figure: str, op: str, target: float | bool, unit: str = "") -> dict:
    """One row of the results page: ``figures[figure] op target`` is the goal ``text`` of ``area``.

    ``op`` is one of ``<=``, ``>=``, ``==``; ``unit`` follows the figure on the page ("ms", "x")."""
    if op not in ("<=", ">=", "=="):
        raise ValueError(f"goal {text!r}: op must be <=, >= or ==, not {op!r}")
    return {"area": area, "goal": text, "figure": figure, "op": op, "target": target, "unit": unit}


def host() -> dict[str, str]:
    """This CPU's model name and the widest instruction set the engine's paths use on it."""
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    isa = next(
        (name for name, flag in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"),
                                 ("avx512", "avx512f"), ("avx2", "avx2")) if flag in flags),
        "none",
    )  # fmt: skip
    return {"cpu": model, "isa": isa}


def commit() -> str:
    """The checked-out commit (short hash, ``+dirty`` when tracked files other than the results
    differ from it), or "unknown"."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout

    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    changed = git(
        "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"
    )
    return head + ("+dirty" if changed.strip() else "")


OUTPUT_FLAGS = ("--out",)
"""Arguments that say only where a run writes its files: left out of the reproducing command."""


def reproducing_args(argv: list[str]) -> list[str]:
    """``argv`` without its ``OUTPUT_FLAGS`` (``--out PATH`` or ``--out=PATH``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in OUTPUT_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in OUTPUT_FLAGS)):
            kept.append(arg)
    return kept


def command(name: str) -> str:
    """The command line that reproduces this run: the ``SPECRAG_*`` settings the process was
    started with (not those a benchmark sets for its workers), then the module and arguments
    (less where it wrote its files, ``OUTPUT_FLAGS``)."""
    try:  # the environment at exec time, before the benchmark changed os.environ
        raw = Path("/proc/self/environ").read_bytes().split(b"\0")
        started = dict(e.decode(errors="replace").partition("=")[::2] for e in raw if b"=" in e)
    except OSError:
        started = dict(os.environ)
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(started.items()) if k.startswith("SPECRAG_")]
    args = reproducing_args(sys.argv[1:])
    return " ".join([*env, "python -m", f"benchmarks.{name}", *map(shlex.quote, args)])


def write_result(
    name: str,
    figures: dict[str, Any],
    goals: list[dict],
    notes: dict[str, str] | None = None,
    out: Path | None = None,
) -> Path:
    """Write ``benchmarks/results/NAME.json`` (or ``out``): the figures, the goals read from
    them (``notes``: a figure's context on the page, by figure name), the date (UTC), the
    commit, the host's CPU and ISA and the command; returns its path."""
    missing = [g["figure"] for g in goals if g["figure"] not in figures]
    if missing:
        raise ValueError(f"{name}: the goals read figures the run did not produce: {missing}")
    record = {
        "benchmark": name,
        "command": command(name),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "host": host(),
        "provenance": "run",
        # The machines are shared: the load beside the figures says how busy this one was.
        "load_average": round(os.getloadavg()[0], 1),
        "figures": figures,
        "goals": [
            {**g, "note": notes[g["figure"]]} if g["figure"] in (notes or {}) else g for g in goals
        ],
    }
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)
    note(f"figures written to {path}")
    return path
