"""Fakes for fast unit tests of what surrounds the queue and the engine."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from app.requests import QueueName


@dataclass
class RecordingDispatcher:
    """An ``app.dispatch.Dispatcher`` that records every send instead of reaching a broker."""

    sent: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    waiting: bool = False

    def send_query(self, query_id: uuid.UUID, queue: str = QueueName.ANSWER) -> None:
        """Record the query's send."""
        self.sent.append(("query", (query_id, str(queue))))

    def send_ingest(self, paths: list[str], collection: str, tenant: str) -> None:
        """Record the ingest."""
        self.sent.append(("ingest", (list(paths), collection, tenant)))

    def send_uploads(self, files: list[dict[str, str]], collection: str, tenant: str) -> None:
        """Record the upload."""
        self.sent.append(("uploads", (files, collection, tenant)))

    def send_delete(self, source: str, collection: str, tenant: str) -> None:
        """Record the deletion."""
        self.sent.append(("delete", (source, collection, tenant)))

    def dispatch_batch(self, batch_id: uuid.UUID, epoch: int, lanes: int) -> None:
        """Record the batch's dispatch."""
        self.sent.append(("batch", (batch_id, epoch, lanes)))

    def answer_waiting(self) -> bool:
        """What the test set in ``waiting``."""
        return self.waiting

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        """The recorded sends of one kind, in order."""
        return [args for k, args in self.sent if k == kind]
