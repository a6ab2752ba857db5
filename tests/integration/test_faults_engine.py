"""A dead engine is a dead worker: its queries go back, it exits non-zero, none of them fails.

The torch engine's loop thread is ended inside a live ``specrag worker`` subprocess (fault
injected by tests/integration/inject/sitecustomize.py) with queries in flight. The worker must
stop taking queries, hand back what it held and exit with status 70 within seconds; a second
worker then answers every query exactly once. (vLLM's EngineCore: tests/vllm/test_worker.py.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.client import SpecragClient
from app.settings import Settings
from tests.integration.conftest import Deployment
from tests.integration.helpers import ApiServer, RedisServer, WorkerProcess, stored_rows
from workers.engine_guard import EXIT_ENGINE_DEAD

pytestmark = pytest.mark.integration

INJECT = Path(__file__).resolve().parent / "inject"


def dying_worker(settings: Settings, log: Path, trigger: Path) -> WorkerProcess:
    """A ``specrag worker`` whose engine loop dies once ``trigger`` exists."""
    worker = WorkerProcess(settings, log, "answer")
    worker.env["PYTHONPATH"] = os.pathsep.join([str(INJECT), worker.env.get("PYTHONPATH", "")])
    worker.env["SPECRAG_TEST_KILL_LOOP_FILE"] = str(trigger)
    return worker.start()


def test_a_worker_whose_torch_engine_loop_dies_hands_back_its_queries_and_exits(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    keys, collection = private_deployment.keys, private_deployment.collection
    settings = private_deployment.settings.model_copy(
        update={"broker_url": private_redis.url(3), "max_tokens_limit": 1500}
    )
    trigger = tmp_path / "kill-engine-loop"
    first = dying_worker(settings, tmp_path / "first.log", trigger)
    try:
        first.wait_ready()
        with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
            ids = [
                client.submit(f"What does assert do? ({n})", collection, max_tokens=1500,
                              method="none")
                for n in range(6)
            ]  # fmt: skip
            deadline = time.monotonic() + 60
            while not any(client.get(q)["status"] == "running" for q in ids):
                assert time.monotonic() < deadline, f"nothing ran: {first.tail()}"
                time.sleep(0.02)
            trigger.touch()
            killed_at = time.monotonic()
            assert first.proc is not None
            status = first.proc.wait(timeout=30)
            exited_in = time.monotonic() - killed_at
            assert status == EXIT_ENGINE_DEAD, first.tail()
            # Nothing failed for the dead engine; what it held is queued again, not running.
            views = [client.get(q) for q in ids]
            assert not [v for v in views if v["status"] == "failed"], views
            second = worker_process(settings, "second")
            second.wait_ready()
            done = {q: client.wait(q, timeout=150) for q in ids}
            recovered_in = time.monotonic() - killed_at
    finally:
        first.kill()
    assert all(d["status"] == "succeeded" for d in done.values()), done
    rows = stored_rows(settings, ids)
    assert all((answers, stats) == (1, 1) for _, answers, stats in rows.values()), rows
    assert "engine died" in first.tail(20000)
    print(f"\nengine loop dead: worker exited {exited_in:.2f} s later; all answered "
          f"{recovered_in:.1f} s after the death (second worker's start included)")  # fmt: skip
