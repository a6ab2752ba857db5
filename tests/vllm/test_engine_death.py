"""Real vLLM: SIGKILL of the EngineCore child under ``SPECRAG_ENGINE=vllm specrag worker``.

With queries in flight, the worker must not fail them (``internal_error``) nor stay up failing
every later query: it hands them back, exits with status 70 (its supervisor restarts it), and a
second vLLM worker answers each exactly once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from app.client import SpecragClient
from tests.integration.conftest import Deployment
from tests.integration.helpers import ApiServer, RedisServer, WorkerProcess, stored_rows
from tests.vllm.test_worker import _vllm_settings
from workers.engine_guard import EXIT_ENGINE_DEAD


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _engine_core(pid: int) -> int:
    for child in _children(pid):
        try:
            if "EngineCore" in (Path("/proc") / str(child) / "cmdline").read_text(errors="replace"):
                return child
        except OSError:
            continue
    raise AssertionError(f"no EngineCore child of {pid}: {_children(pid)}")


def test_killing_vllms_engine_core_hands_queries_back_and_the_worker_exits(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    keys, docs = private_deployment.keys, private_deployment.collection
    settings = _vllm_settings(private_deployment, private_redis, worker_concurrency=8)
    first = worker_process(settings, "vllm-dying")
    first.wait_ready(timeout=600)
    assert first.proc is not None
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
        ids = [client.submit(f"What does del do? ({n})", docs, max_tokens=400) for n in range(6)]
        deadline = time.monotonic() + 120
        while not any(client.get(q)["status"] == "running" for q in ids):
            assert time.monotonic() < deadline, f"nothing ran: {first.tail()}"
            time.sleep(0.05)
        os.kill(_engine_core(first.proc.pid), signal.SIGKILL)
        killed_at = time.monotonic()
        status = first.proc.wait(timeout=60)
        exited_in = time.monotonic() - killed_at
        assert status == EXIT_ENGINE_DEAD, first.tail()
        views = [client.get(q) for q in ids]
        assert not [v for v in views if v["status"] == "failed"], views
        second = worker_process(settings, "vllm-second")
        second.wait_ready(timeout=600)
        done = {q: client.wait(q, timeout=300) for q in ids}
    assert all(d["status"] == "succeeded" for d in done.values()), done
    rows = stored_rows(settings, ids)
    assert all((answers, stats) == (1, 1) for _, answers, stats in rows.values()), rows
    print(f"\nEngineCore killed: worker exited {exited_in:.2f} s later with status {status}")
