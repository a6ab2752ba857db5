"""The draft-tune task (``train`` queue): a job in, app/drafts/tune.py does the work.

Workers started with ``--queues train`` take it (no engine is loaded for that queue alone). One
tune runs at a time per host: the task holds an exclusive lock file in the data directory for
its whole run, and a second tune on the same host waits for it (re-queued, not spinning). A
killed tune resumes from its run directory's checkpoint when the message comes back.
"""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path
from typing import Any

from celery import Celery, Task

from app.dispatch import TaskName

log = logging.getLogger(__name__)
LOCK_NAME = "draft-tune.lock"


def register(app: Celery) -> None:
    """Register the train task on ``app`` under its stable name."""

    @app.task(name=TaskName.DRAFT_TUNE.value, bind=True, shared=False, acks_late=True)
    def draft_tune(self: Task, job: dict[str, Any]) -> dict[str, Any]:
        """Tune a draft (or, with ``job["eagle"]``, an EAGLE head) as ``specrag draft tune``
        would; returns the new checkpoint's out and steps."""
        from app.drafts.tune import TuneConfig, tune, tune_eagle

        data_dir = Path(self.app.settings.data_dir)  # type: ignore[attr-defined]
        data_dir.mkdir(parents=True, exist_ok=True)
        with (data_dir / LOCK_NAME).open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("a draft tune already runs on this host; %s waits", job.get("out"))
                raise self.retry(countdown=60, max_retries=None) from None
            run_tune, base = (tune_eagle, job["eagle"]) if "eagle" in job else (tune, job["draft"])
            manifest = run_tune(
                Path(job["dataset"]), Path(base), Path(job["target"]), Path(job["out"]),
                Path(job["run_dir"]), TuneConfig(**job.get("config", {})), progress=False,
                log=log.info,
            )  # fmt: skip
        return {"out": job["out"], "steps": manifest["steps"]}
