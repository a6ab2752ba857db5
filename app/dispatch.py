"""What app/ needs from a queue, as a protocol it owns; workers/ implements it with Celery.

The API and the CLI are handed a ``Dispatcher`` where they are built (``workers/cli.py`` is the
composition root), so nothing in app/ imports the queue. Task names are part of the seam: they are
the wire names a worker registers its tasks under and a producer sends to.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, Protocol

from app.requests import QueueName
from app.settings import Settings


class TaskName(StrEnum):
    """The stable names of the worker's tasks (messages in flight carry them: never rename)."""

    ANSWER = "specrag.answer_query"
    INGEST = "specrag.ingest"
    INGEST_UPLOADS = "specrag.ingest_uploads"
    DELETE_DOCUMENT = "specrag.delete_document"
    BATCH_CHUNK = "specrag.batch_chunk"
    SHADOW = "specrag.audit.shadow"
    DRAFT_TUNE = "specrag.draft_tune"


class DispatchError(RuntimeError):
    """No queue can take the work (none is wired in, or the broker cannot be reached)."""


class Dispatcher(Protocol):
    """Sends work to the workers. Every send raises at once (no retry loop) when it fails."""

    def send_query(self, query_id: uuid.UUID, queue: str = QueueName.ANSWER) -> None:
        """Put one stored query's id on ``queue`` (``answer`` or ``batch``)."""

    def send_ingest(self, paths: list[str], collection: str, tenant: str) -> None:
        """Queue the ingest of files or folders the workers can read."""

    def send_uploads(
        self, files: list[dict[str, str]], collection: str, tenant: str, max_chars: int = 0
    ) -> None:
        """Queue files uploaded over the API (``Upload.to_message()`` dicts) for ingest;
        ``max_chars`` is the tenant's extracted-characters limit per document (0: none)."""

    def send_delete(self, source: str, collection: str, tenant: str) -> None:
        """Queue the removal of one document from the index and the database."""

    def dispatch_batch(self, batch_id: uuid.UUID, epoch: int, lanes: int) -> None:
        """Start ``lanes`` chunk tasks of the batch for ``epoch``."""

    def send_tune(self, job: dict[str, Any]) -> None:
        """Queue a draft tune (``app.drafts.tune.tune``'s arguments as JSON) on ``train``."""

    def answer_waiting(self) -> bool:
        """Whether interactive answer work waits in the broker (False when it cannot tell)."""

    def queue_depths(self, queues: Sequence[str]) -> dict[str, int]:
        """Messages waiting in the broker per queue (the API's metrics); raises when unreadable."""


DispatcherFactory = Callable[[Settings], Dispatcher]
"""Builds the process's dispatcher for its Settings (the composition root supplies one)."""


class NoQueue:
    """The dispatcher of a process that was given none: every send raises ``DispatchError``.

    A query submitted then stays in the outbox (``enqueued_at`` NULL) for a process with a queue.
    """

    def _refuse(self) -> None:
        raise DispatchError("no queue is wired into this process (see workers/cli.py)")

    def send_query(self, query_id: uuid.UUID, queue: str = QueueName.ANSWER) -> None:
        """Refuse: there is no queue."""
        self._refuse()

    def send_ingest(self, paths: list[str], collection: str, tenant: str) -> None:
        """Refuse: there is no queue."""
        self._refuse()

    def send_uploads(
        self, files: list[dict[str, str]], collection: str, tenant: str, max_chars: int = 0
    ) -> None:
        """Refuse: there is no queue."""
        self._refuse()

    def send_delete(self, source: str, collection: str, tenant: str) -> None:
        """Refuse: there is no queue."""
        self._refuse()

    def dispatch_batch(self, batch_id: uuid.UUID, epoch: int, lanes: int) -> None:
        """Refuse: there is no queue."""
        self._refuse()

    def send_tune(self, job: dict[str, Any]) -> None:
        """Refuse: there is no queue."""
        self._refuse()

    def answer_waiting(self) -> bool:
        """Nothing waits where there is no queue."""
        return False

    def queue_depths(self, queues: Sequence[str]) -> dict[str, int]:
        """Refuse: there is no broker to read."""
        self._refuse()
        return {}
