"""``specrag worker`` as a subprocess: start it, wait until it consumes, stop or kill it.

The one helper the demo script, the tests and the benchmarks share. The worker runs in its own
process group, so that a kill takes the whole worker (a prefork pool's children too) at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from app.settings import Settings

READY = " ready."
"""What Celery logs (at INFO) once the worker consumes."""


def settings_env(settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a subprocess build the same Settings (over ``base``)."""
    env = dict(os.environ if base is None else base)
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = json.dumps(list(value))
        elif isinstance(value, dict):  # pydantic-settings reads complex fields as JSON
            value = json.dumps(value)
        env[f"SPECRAG_{name.upper()}"] = str(value)
    return env


class WorkerProcess:
    """One ``specrag worker`` subprocess writing its log to ``log``."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        *,
        queues: str = "answer",
        name: str | None = None,
        loglevel: str = "INFO",
        cwd: Path | None = None,
    ) -> None:
        self.env, self.log, self.queues, self.name = env, log, queues, name
        self.loglevel, self.cwd = loglevel, cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> WorkerProcess:
        """Start the worker (returns at once; ``wait_ready`` waits until it consumes)."""
        argv = [str(Path(sys.executable).parent / "specrag"), "worker", "-Q", self.queues]
        argv += ["--loglevel", self.loglevel]
        if self.name:
            argv += ["--hostname", f"{self.name}@%h"]
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            argv,
            env=self.env,
            cwd=self.cwd,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        """The end of the worker's log (for error messages)."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def wait_ready(self, timeout: float = 180) -> None:
        """Return once the worker consumes (needs loglevel INFO); raises if it dies or times out."""
        deadline = time.monotonic() + timeout
        while READY not in self.tail(chars=1 << 20):
            if not self.alive():
                raise RuntimeError(f"worker {self.name or ''} exited early: {self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"worker {self.name or ''} not ready in {timeout} s: {self.tail()}"
                )
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the worker's whole process group at once, and reap it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        if self._out is not None:
            self._out.close()

    def stop(self, timeout: float = 30) -> None:
        """Warm shutdown (SIGTERM: the task in flight finishes), SIGKILL after ``timeout`` s."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
