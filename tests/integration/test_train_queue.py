"""The ``train`` queue: ``specrag draft tune --queue`` runs on a live ``specrag worker -Q train``
(real Redis and PostgreSQL, the tiny pair), and its output is the CLI's own."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.settings import Settings
from tests.app.test_drafts import _tiny_dataset, _tiny_head

pytestmark = pytest.mark.integration


def test_tune_sent_to_the_train_queue_runs_on_a_train_worker(
    service_settings: Settings,
    worker_process: Callable[..., Any],
    tiny_models: dict[str, Path],
    tmp_path: Path,
) -> None:
    from workers.cli import main

    settings = service_settings.model_copy(update={"data_dir": tmp_path / "data"})
    worker = worker_process(settings, "trainer", queues="train")
    worker.wait_ready()
    ds = _tiny_dataset(tiny_models, tmp_path / "ds", n=8)
    out = tmp_path / "draft-queued"
    env = {
        "SPECRAG_DATABASE_URL": str(settings.database_url),
        "SPECRAG_BROKER_URL": str(settings.broker_url),
        "SPECRAG_DATA_DIR": str(settings.data_dir),
        "SPECRAG_TARGET_MODEL": str(tiny_models["target"]),
        "SPECRAG_DRAFT_MODEL": str(tiny_models["draft"]),
    }
    sent = CliRunner().invoke(
        main,
        ["draft", "tune", "--dataset", str(ds), "--out", str(out), "--max-steps", "2",
         "--tokens-per-batch", "64", "--queue", "--json"],
        env=env,
    )  # fmt: skip
    assert sent.exit_code == 0, sent.output
    job = json.loads(sent.output.strip().splitlines()[-1])
    assert job["config"]["max_steps"] == 2 and not out.exists()  # queued, not run here
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (out / "manifest.json").exists():
        time.sleep(0.5)
    assert (out / "manifest.json").exists(), worker.tail()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["steps"] == 2 and manifest["loss"] == "logits"
    assert (settings.data_dir / "draft-tune.lock").exists()  # the per-host lock it held
    # An EAGLE head's tune goes the same way (the job names the head instead of a draft).
    head = _tiny_head(tiny_models, tmp_path / "eagle")
    head_out = tmp_path / "eagle-queued"
    sent = CliRunner().invoke(
        main,
        ["draft", "tune", "--dataset", str(ds), "--eagle", str(head), "--out", str(head_out),
         "--max-steps", "2", "--tokens-per-batch", "64", "--queue", "--json"],
        env={k: v for k, v in env.items() if k != "SPECRAG_DRAFT_MODEL"},
    )  # fmt: skip
    assert sent.exit_code == 0, sent.output
    job = json.loads(sent.output.strip().splitlines()[-1])
    assert job["eagle"] == str(head.resolve()) and "draft" not in job
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (head_out / "manifest.json").exists():
        time.sleep(0.5)
    assert (head_out / "manifest.json").exists(), worker.tail()
    manifest = json.loads((head_out / "manifest.json").read_text())
    assert manifest["steps"] == 2 and manifest["kind"] == "eagle"
