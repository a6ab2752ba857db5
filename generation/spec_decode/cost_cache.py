"""Measured step-cost tables T(B, k) kept on disk, so a fresh process loads them instead of timing.

A worker measures its tables once at start and keeps them for its life; a one-shot
``specrag ask --local`` would measure them in every process (seconds of passes on a shared CPU).
``StepCostCache`` keeps them in one JSON file per *identity*: what the timings depend on (the
checkpoints' files, dtype, packed weights, the engine's forward, k_max, torch and its threads, the
CPU's flags). Any change of identity is another file, so a stale table is never read; a file
that cannot be read, or holds the wrong identity or shape, is ignored with a log line and
measured over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 1
"""Version of the file layout and of how tables are timed (bump when ``time_batch_steps``
changes what it measures)."""


class StepCostCache:
    """One identity's measured tables (k = 0 .. k_max seconds per table key) in ``directory``."""

    def __init__(self, directory: str | Path, identity: dict[str, Any]) -> None:
        text = json.dumps({"format": FORMAT, **identity}, sort_keys=True, default=str)
        self.identity: dict[str, Any] = json.loads(text)
        """As stored (JSON's types): a file holding another identity is not this engine's."""
        self.path = Path(directory) / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"

    def _read(self) -> dict[str, list[float]]:
        """The file's tables ({} when absent; a bad file is logged and ignored)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("step-cost cache %s: unreadable (%s); measuring again", self.path, exc)
            return {}
        same = isinstance(data, dict) and data.get("identity") == self.identity
        tables = data.get("tables") if isinstance(data, dict) else None
        if not same or not isinstance(tables, dict):
            log.warning("step-cost cache %s: not this engine's tables; measuring again", self.path)
            return {}
        return tables

    def load(self, key: str, length: int) -> list[float] | None:
        """The stored table ``key`` of ``length`` positive seconds, or None (absent or bad)."""
        table = self._read().get(key)
        if table is None:
            return None
        valid = isinstance(table, list) and len(table) == length
        if not valid or not all(isinstance(t, (int, float)) and t > 0 for t in table):
            log.warning(
                "step-cost cache %s: table %s is malformed; measuring again", self.path, key
            )
            return None
        return [float(t) for t in table]

    def save(self, key: str, table: list[float]) -> None:
        """Store table ``key`` beside the others (atomically: a reader sees the old or new file)."""
        tables = {**self._read(), key: list(table)}
        payload = json.dumps({"identity": self.identity, "tables": tables})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".costs-")
            with os.fdopen(fd, "w") as out:
                out.write(payload)
            os.replace(tmp, self.path)
        except OSError as exc:  # a read-only data dir costs a measurement, not the answer
            log.warning("step-cost cache %s: not written (%s)", self.path, exc)


def machine_identity() -> dict[str, Any]:
    """What a step's time depends on beyond the models: the CPU (its flags), torch and threads."""
    import torch  # heavy; the engine has loaded it

    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = next((ln.split(":", 1)[1] for ln in cpuinfo if ln.startswith("flags")), "")
    except OSError:
        pass
    return {
        "machine": platform.machine(),
        "cpu_flags": hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def files_identity(model_dir: str | Path) -> dict[str, Any]:
    """A checkpoint directory as the cache tells it apart: its path and each file's size and
    modification time (a retrained checkpoint rewrites its weights)."""
    path = Path(model_dir).resolve()
    files = {}
    for child in sorted(path.iterdir()) if path.is_dir() else []:
        if child.is_file():
            stat = child.stat()
            files[child.name] = [stat.st_size, stat.st_mtime_ns]
    return {"path": str(path), "files": files}
