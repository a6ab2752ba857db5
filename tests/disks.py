"""A real small disk for fault tests: a tmpfs mounted where a test wants its files to run out of
space, and filled until the file system itself says ENOSPC."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from retrieval.errors import public_reason


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``path`` (skips where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> None:
    """Write until the file system says ENOSPC, and check that it did."""
    with pytest.raises(OSError) as full, (disk / "filler").open("wb") as fh:
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
            os.fsync(fh.fileno())
    reason = public_reason(full.value)
    assert reason == "No space left on device (ENOSPC)" and str(disk) not in reason
