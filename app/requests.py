"""The request vocabulary shared by API, CLI, batch and workers: statuses, methods, queues.

Each name is a ``StrEnum``, so a member compares and serialises as the plain string the database
and the JSON contract hold (``QueryStatus.QUEUED == "queued"``).
"""

from __future__ import annotations

from enum import StrEnum


class QueryStatus(StrEnum):
    """Where a stored query stands; ``succeeded`` and ``failed`` are final."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


FINAL_STATUSES = (QueryStatus.SUCCEEDED, QueryStatus.FAILED)
"""The statuses a query never leaves."""


class Method(StrEnum):
    """How drafts are proposed: a draft model, n-gram lookup over the prompt, or not at all."""

    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    NONE = "none"


class QueueName(StrEnum):
    """The broker's queues: interactive answers, batch answers (lower priority), ingest (CPU)."""

    ANSWER = "answer"
    BATCH = "batch"
    INGEST = "ingest"


ANSWER_QUEUES = (QueueName.ANSWER, QueueName.BATCH)
"""The queues a stored query can be answered from (``queries.queue``)."""
