"""``SPECRAG_ENGINE=vllm specrag worker`` where vLLM is not installed (the project's .venv): the
worker refuses to start with one line naming what to install, and never joins the queue."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import Settings
from workers.process import settings_env

pytestmark = pytest.mark.integration


def test_the_worker_names_what_to_install_in_one_line(migrated_pg_url: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed in this Python; this checks the refusal where it is not")
    settings = Settings(data_dir=tmp_path, database_url=migrated_pg_url, engine="vllm")
    worker = [str(Path(sys.executable).parent / "specrag"), "worker", "-Q", "answer"]
    proc = subprocess.run(
        worker, env=settings_env(settings), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "vLLM is not installed" in last and "make vllm-venv" in last, last
    assert "`vllm` extra" in last
    assert " ready." not in proc.stdout + proc.stderr  # it never consumed
