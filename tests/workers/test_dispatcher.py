"""The Celery side of the dispatch seam, without a broker: wire names, routes, what each send sends.

Celery reads a task's name from a ``.name`` attribute when it has one, and an enum member has one
(``TaskName.BATCH_CHUNK.name == "BATCH_CHUNK"``): every name must cross into Celery as a plain str.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from app.dispatch import Dispatcher, TaskName
from app.settings import Settings
from workers import CeleryDispatcher, chunk_signature, create_celery
from workers.app import ROUTES


@pytest.fixture
def celery(tmp_path: Path) -> Any:
    return create_celery(Settings(data_dir=tmp_path))


def test_registered_tasks_are_exactly_the_seam_s_names(celery: Any) -> None:
    registered = {name for name in celery.tasks if name.startswith("specrag.")}
    assert registered == {task.value for task in TaskName}
    assert set(ROUTES) == registered
    assert all(type(key) is str and type(value) is str for key, value in ROUTES.items())


def test_a_chunk_signature_names_its_task_and_queue(celery: Any) -> None:
    signature = chunk_signature(celery, uuid.UUID(int=1), 3)
    assert signature.task == "specrag.batch_chunk"
    assert signature.options["queue"] == "batch" and signature.args == (str(uuid.UUID(int=1)), 3)


def test_each_send_goes_to_its_task_and_queue(celery: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(celery, "send_task", lambda name, **kw: sent.append((name, kw)))
    dispatcher: Dispatcher = CeleryDispatcher(celery)
    qid = uuid.UUID(int=7)
    dispatcher.send_query(qid, "batch")
    dispatcher.send_uploads([{"name": "a.txt"}], "docs", "acme")
    dispatcher.send_delete("a.txt", "docs", "acme")
    dispatcher.send_ingest(["/x"], "docs", "acme")
    names = [name for name, _ in sent]
    assert names == [
        "specrag.answer_query",
        "specrag.ingest_uploads",
        "specrag.delete_document",
        "specrag.ingest",
    ]
    assert all(type(name) is str for name in names)
    assert sent[0][1]["queue"] == "batch" and sent[0][1]["args"] == [str(qid)]
    assert sent[0][1]["priority"] > 0  # batch answers below interactive ones


def test_the_dispatcher_builds_its_celery_app_only_when_it_sends(tmp_path: Path) -> None:
    built: list[Any] = []

    def make() -> Any:
        built.append(create_celery(Settings(data_dir=tmp_path)))
        return built[-1]

    dispatcher = CeleryDispatcher(make)
    assert built == []
    assert dispatcher.app is built[0] and dispatcher.app is built[0]
