"""The service's vocabularies: query statuses, speculation methods, broker queues.

Apart from app/requests.py so that Settings (whose defaults name a method) and the request model
(whose limits come from Settings) do not import each other.
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
    """How drafts are proposed: a draft model, n-gram lookup over the prompt, suffix trees over
    the prompt and the tenant's past answers, an EAGLE head on the target's own features, or not
    at all."""

    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    SUFFIX = "suffix"
    EAGLE = "eagle"
    NONE = "none"


METHOD_CHOICES = " | ".join(Method)
"""The methods as a help text shows them: ``draft_model | ngram | ...``."""


class QueueName(StrEnum):
    """The broker's queues: interactive answers, batch answers (lower priority), ingest (CPU),
    draft tuning (CPU, hours)."""

    ANSWER = "answer"
    BATCH = "batch"
    INGEST = "ingest"
    TRAIN = "train"
    """Draft tuning (``specrag draft tune --queue``): workers started with ``--queues train``."""


ANSWER_QUEUES = (QueueName.ANSWER, QueueName.BATCH)
"""The queues a stored query can be answered from (``queries.queue``)."""
