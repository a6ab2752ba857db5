"""Helpers of the integration tests: free ports, subprocess environments, an API server thread,
private redis-server processes and ``specrag worker`` subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from app.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a subprocess build the same Settings."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = json.dumps(list(value))
        env[f"SPECRAG_{name.upper()}"] = str(value)
    return env


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


class WorkerProcess:
    """``specrag worker`` as a subprocess, with the environment of the given Settings."""

    def __init__(self, settings: Settings, log: Path, name: str, queues: str = "answer") -> None:
        self.settings, self.log, self.name, self.queues = settings, log, name, queues
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "specrag"),
                    "worker",
                    "-Q",
                    self.queues,
                    "--loglevel",
                    "INFO",
                    "--hostname",
                    f"{self.name}@%h",
                ],
                env=settings_env(self.settings),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
            )
        return self

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            if " ready." in self.log.read_text():
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"worker {self.name} not ready in {timeout} s: {self.log.read_text()[-2000:]}"
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
