"""One deployment of benchmarks/tracing.py: an API and a worker of their own, traced or not.

Each arm runs ``specrag api`` and ``specrag worker`` (threads pool, tiny random-weight pair) on a
PostgreSQL database, a Redis database and a data directory of its own; a traced one sets
``OTEL_EXPORTER_OTLP_ENDPOINT`` to the run's OTLP sink. ``measure`` runs one phase (a burst, then
questions one at a time) and returns its raw figures; ``census`` says what the sink received.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.support import create_database, database_url, drop_database, free_port
from testkit.otlp import ReceivedSpan

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What does assert do?"
CLIENT = 3  # OTLP's SpanKind number


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Deployment:
    """One arm's API and worker on a database, Redis database and data directory of its own."""

    def __init__(self, arm: str, work: Path, redis_url: str, models: tuple[Path, Path]) -> None:
        self.arm, self.work, self.redis_url, self.models = arm, work, redis_url, models
        self.dbname = create_database()
        self.api: subprocess.Popen[bytes] | None = None
        self.worker: Any = None
        self.url = ""
        self.auth: dict[str, str] = {}

    def prepare(
        self, extra_env: dict[str, str], endpoint: str, *, traced: bool, sampler: str = "always_on"
    ) -> None:
        """Migrate, ingest the demo documents, make a key; start the API and the worker."""
        from app.db import make_engine, make_session_factory
        from app.db.schema import upgrade
        from app.keys import create_key
        from app.resources import Resources
        from app.settings import Settings
        from workers.process import WorkerProcess, settings_env

        target, draft = self.models
        settings = Settings(
            data_dir=self.work / "data", database_url=database_url(self.dbname),
            broker_url=self.redis_url, target_model=target, draft_model=draft, device="cpu",
            tenant_submissions_per_second=0, tenant_max_in_flight=10_000,
        )  # fmt: skip
        self.engine = make_engine(settings)
        upgrade(self.engine)
        self.factory = make_session_factory(self.engine)
        corpus = ROOT / "demo" / "corpus"
        Resources(settings, self.factory).retrieval.ingest(
            [corpus / n for n in ("assert.md", "pass.md", "del.md")], collection="docs",
            tenant="bench",
        )  # fmt: skip
        with self.factory() as session:
            self.auth = {"Authorization": f"Bearer {create_key(session, 'bench')}"}
        env = {k: v for k, v in settings_env(settings).items() if not k.startswith("OTEL_")}
        env.update(extra_env)
        if traced:
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_TRACES_SAMPLER=sampler)
        self.worker = WorkerProcess(
            env, self.work / "worker.log", name=f"bench-{self.arm}", cwd=ROOT
        ).start()
        port = free_port()
        self._log = (self.work / "api.log").open("ab")
        self.api = subprocess.Popen(
            [str(Path(sys.executable).parent / "specrag"), "api", "--host", "127.0.0.1",
             "--port", str(port)], env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self) -> None:
        """Until the API answers /healthz and the worker consumes."""
        assert self.api is not None
        deadline = time.monotonic() + 120
        while True:
            if self.api.poll() is not None:
                raise RuntimeError(f"specrag api ({self.arm}) exited")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"specrag api ({self.arm}) not healthy in 120 s")
            time.sleep(0.2)
        self.worker.wait_ready()

    def submit(self, client: httpx.Client, max_tokens: int) -> uuid.UUID:
        """POST one question; its id."""
        body = {"question": QUESTION, "collection": "docs", "max_tokens": max_tokens}
        made = client.post(f"{self.url}/v1/queries", json=body, headers=self.auth)
        made.raise_for_status()
        return uuid.UUID(made.json()["id"])

    def wait(self, ids: list[uuid.UUID], timeout: float) -> None:
        """Until none of ``ids`` is queued or running (read from the database every 20 ms)."""
        from sqlalchemy import func, select

        from app.db import Query

        deadline = time.monotonic() + timeout
        while True:
            with self.factory() as session:
                open_ = session.scalar(
                    select(func.count()).select_from(Query)
                    .where(Query.id.in_(ids), Query.status.in_(("queued", "running")))
                )  # fmt: skip
            if not open_:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{open_} queries still open ({self.arm})")
            time.sleep(0.02)

    def cpu(self) -> dict[str, float]:
        """CPU seconds of the API and the worker so far."""
        assert self.api is not None
        return {"api": _cpu_s(self.api.pid), "worker": _cpu_s(self.worker.proc.pid)}

    def measure(self, client: httpx.Client, burst_n: int, sequential_n: int, max_tokens: int
                ) -> dict[str, Any]:  # fmt: skip
        """One phase on this deployment: ``burst_n`` questions at once, then ``sequential_n`` one
        at a time; the burst's wall time, each sequential query's stored stages, the CPU used."""
        from sqlalchemy import select

        from app.db import Query

        cpu0 = self.cpu()
        burst = [self.submit(client, max_tokens) for _ in range(burst_n)]
        self.wait(burst, 1800)
        sequential = []
        for _ in range(sequential_n):
            sequential.append(self.submit(client, max_tokens))
            self.wait(sequential[-1:], 120)
        cpu1 = self.cpu()
        with self.factory() as session:
            rows = session.execute(
                select(Query.queued_at, Query.done_at, Query.status).where(Query.id.in_(burst))
            ).all()
            stats = [
                q.stats
                for q in session.scalars(select(Query).where(Query.id.in_(sequential)))
                if q.stats is not None and q.stats.total_ms is not None
            ]
        # Where a sequential query's time went: the stored stages, and the rest (claim, prompt,
        # record, the broker's hop) as total minus them.
        stages = []
        for st in stats:
            parts = {"queue_ms": st.queue_ms or 0.0, "retrieval_ms": st.retrieval_ms or 0.0,
                     "generation_ms": st.generation_ms or 0.0}  # fmt: skip
            stages.append({**parts, "rest_ms": float(st.total_ms or 0.0) - sum(parts.values())})
        assert all(r.status == "succeeded" for r in rows), "a burst query did not succeed"
        assert len(stats) == sequential_n, "a sequential query has no stats"
        wall = (max(r.done_at for r in rows) - min(r.queued_at for r in rows)).total_seconds()
        return {
            "arm": self.arm,
            "burst": burst_n,
            "burst_wall_s": wall,
            "totals_ms": [float(st.total_ms or 0.0) for st in stats],
            "stages": stages,
            "queries": burst_n + sequential_n,
            # CPU over both parts (the deployment is idle otherwise).
            "api_cpu_s": cpu1["api"] - cpu0["api"],
            "worker_cpu_s": cpu1["worker"] - cpu0["worker"],
        }

    def stop(self) -> None:
        """Stop the API and the worker; drop the database."""
        if self.api is not None:
            self.api.terminate()
            self.api.wait(timeout=30)
            self._log.close()
        if self.worker is not None:
            self.worker.stop()
        if hasattr(self, "engine"):
            self.engine.dispose()
        drop_database(self.dbname)


def _sql(s: ReceivedSpan) -> bool:
    system = s.attributes.get("db.system.name", s.attributes.get("db.system"))
    return s.kind == CLIENT and system not in (None, "redis")


def census(spans: list[ReceivedSpan]) -> dict[str, Any]:
    """What a traced query exports: spans per query trace (those with an ``answer query``), by
    name and by service, and how many spans arrived outside query traces."""
    traces: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    queries = [t for t in traces.values() if any(s.name == "answer query" for s in t)]
    others = [t for t in traces.values() if not any(s.name == "answer query" for s in t)]
    n = max(len(queries), 1)
    names = Counter(s.name for t in queries for s in t)
    services = Counter(s.service for t in queries for s in t)
    inside = sum(len(t) for t in queries)
    return {
        "query_traces": len(queries),
        "spans_per_query": round(inside / n, 2),
        "per_query_by_name": {k: round(v / n, 2) for k, v in names.most_common()},
        "per_query_by_service": {k: round(v / n, 2) for k, v in services.most_common()},
        "sql_spans_per_query": round(sum(1 for t in queries for s in t if _sql(s)) / n, 2),
        "spans_outside_query_traces": len(spans) - inside,
        "outside_by_name": dict(Counter(s.name for t in others for s in t).most_common(8)),
    }
