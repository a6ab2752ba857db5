"""Helpers of the integration tests: free ports, subprocess environments, an API server thread,
private redis-server processes and ``specrag worker`` subprocesses."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from app.settings import Settings
from workers import process
from workers.process import settings_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class RedisServer:
    """A private redis-server on a free port that a test may stop and start again."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
        )
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


class WorkerProcess(process.WorkerProcess):
    """``specrag worker`` as a subprocess with the environment of the given Settings."""

    def __init__(self, settings: Settings, log: Path, name: str, queues: str = "answer") -> None:
        super().__init__(settings_env(settings), log, queues=queues, name=name, cwd=REPO_ROOT)
        self.settings = settings
