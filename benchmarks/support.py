"""What the benchmarks share: scratch databases, Redis, worker subprocesses, a tiny tokenizer.

Benchmarks import this module and never ``tests/``: a test module may carry fixtures and
side effects a script does not want, and the tests' layout is free to change. Where a test needs
the same thing (a private redis-server, the tiny tokenizer) it imports it from here.
Nothing here imports torch, transformers, psycopg or Celery at import time (the tests' conftest
imports this module).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.process import WorkerProcess

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "demo" / "corpus"
PG_SERVER = "postgres@127.0.0.1:5432"
ADMIN_URL = os.environ.get("SPECRAG_BENCH_PG_ADMIN", f"postgresql://{PG_SERVER}/test")
"""libpq URL of a database the benchmarks connect to in order to create and drop their own."""


def database_url(name: str) -> str:
    """The SQLAlchemy URL of the scratch database ``name``."""
    return f"postgresql+psycopg://{PG_SERVER}/{name}"


def create_database(prefix: str = "specrag_bench") -> str:
    """Create an empty PostgreSQL database with a fresh name; returns the name."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        raise SystemExit(f"PostgreSQL not reachable at {ADMIN_URL}: {exc}") from exc
    return name


def drop_database(name: str) -> None:
    """Drop the scratch database ``name``, closing its connections."""
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def scratch_database(prefix: str = "specrag_bench", *, migrate: bool = True) -> Iterator[str]:
    """The SQLAlchemy URL of a new database (at the migrations' head), dropped on exit."""
    name = create_database(prefix)
    try:
        if migrate:
            from sqlalchemy import create_engine

            from app.db.schema import upgrade

            engine = create_engine(database_url(name))
            try:
                upgrade(engine)
            finally:
                engine.dispose()
        yield database_url(name)
    finally:
        drop_database(name)


def claim_redis_db() -> int:
    """A Redis database number no test session or other benchmark holds (tests/conftest.py's
    claim keys), flushed; the claim expires by itself after an hour."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, db=0)
    for number in range(15, 0, -1):
        if client.set(f"specrag-test-db-claim:{number}", os.getpid(), nx=True, ex=3600):
            redis.Redis(db=number).flushdb()
            return number
    raise SystemExit("no free Redis database number (1-15)")


def release_redis_db(number: int) -> None:
    """Flush the Redis database ``claim_redis_db`` handed out and give its claim back."""
    import redis

    redis.Redis(host="127.0.0.1", port=6379, db=number).flushdb()
    redis.Redis(host="127.0.0.1", port=6379, db=0).delete(f"specrag-test-db-claim:{number}")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private redis-server on a free port that a caller may stop and start again."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        import redis

        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None


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


def train_tokenizer(out_dir: Path, vocab_size: int = 512) -> None:
    """A byte-level BPE tokenizer trained in seconds on a few demo corpus files, saved to ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(str(p) for p in DEMO_CORPUS.glob("*.md"))[:12]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(out_dir)


def note(message: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile of ``values``, rounded to the nearest rank over ``len - 1`` gaps."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def warm_up_torch_engine(engine: Any, max_batch: int) -> float:
    """Warm the torch engine as a worker's start does (app/resources.py): measure its step costs
    T(B, k) for every batch-size bucket up to ``max_batch`` now. Without it the first batch of
    each size measures them inside the timed traffic (a 16-row bucket: seconds). Returns the
    seconds it took, for the benchmark to report beside the engine's start."""
    from generation.spec_decode.goodput import buckets_up_to  # torch

    started = time.perf_counter()
    engine.warmup(batch_sizes=buckets_up_to(max_batch))
    return time.perf_counter() - started
