"""Helpers of the integration tests: an API server thread and ``specrag worker`` subprocesses.

Free ports and private redis-server processes come from testkit/services.py (shared with the
benchmarks); they are re-exported here for the tests."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import func, select

from app.db import Answer, GenerationStatsRecord, Query, make_engine, make_session_factory
from app.settings import Settings
from testkit.services import RedisServer, free_port
from workers import process
from workers.process import settings_env

__all__ = ["ApiServer", "RedisServer", "WorkerProcess", "free_port", "settings_env"]

REPO_ROOT = Path(__file__).resolve().parents[2]


class ApiServer:
    """The API served by uvicorn in a thread on a loopback port."""

    def __init__(self, settings: Settings) -> None:
        import uvicorn

        from workers.cli import create_api

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_api(settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("API server did not start in 30 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class WorkerProcess(process.WorkerProcess):
    """``specrag worker`` as a subprocess with the environment of the given Settings."""

    def __init__(self, settings: Settings, log: Path, name: str, queues: str = "answer") -> None:
        super().__init__(settings_env(settings), log, queues=queues, name=name, cwd=REPO_ROOT)
        self.settings = settings


def stored_rows(settings: Settings, query_ids: list[str]) -> dict[str, tuple[Query, int, int]]:
    """Per query id: (the stored query, answers stored for it, stats rows stored for it)."""
    engine = make_engine(settings)
    out = {}
    with make_session_factory(engine)() as session:
        for query_id in query_ids:
            qid = uuid.UUID(query_id)
            query = session.get(Query, qid)
            assert query is not None, query_id
            answers = session.scalar(
                select(func.count()).select_from(Answer).where(Answer.query_id == qid)
            )
            stats = session.scalar(
                select(func.count())
                .select_from(GenerationStatsRecord)
                .where(GenerationStatsRecord.query_id == qid)
            )
            out[query_id] = (query, int(answers or 0), int(stats or 0))
    engine.dispose()
    return out
