"""The error text a client sees for a failed query: a short, stable message per kind of failure.

Exception text can carry file paths, SQL, model internals or another library's wording that
changes between versions, so it goes to the worker's log (with the query id) and the stored
``error`` is one of the messages below (docs/tenants.md lists them).
"""

from __future__ import annotations

from retrieval.errors import QueryError, UnknownCollectionError

COLLECTION_GONE = "collection_unavailable: the collection has no index (was it deleted?)"
BAD_REQUEST = "invalid_request: the question cannot be answered with these parameters"
TIME_LIMIT = "time_limit: the answer took longer than the service's time limit"
WORKER_LOST = "worker_lost: the worker answering this query stopped, and retries ran out"
INTERNAL = "internal_error: the query could not be answered; the service logged the details"

TIME_LIMIT_ERRORS = ("SoftTimeLimitExceeded", "TimeLimitExceeded")
MESSAGES = (COLLECTION_GONE, BAD_REQUEST, TIME_LIMIT, WORKER_LOST, INTERNAL)


def public_error(exc: BaseException) -> str:
    """The stable message stored in ``queries.error`` for a query that failed with ``exc``."""
    if isinstance(exc, UnknownCollectionError):
        return COLLECTION_GONE
    # Celery's time-limit exceptions, by name: app/ imports nothing of the queue.
    if isinstance(exc, TimeoutError) or type(exc).__name__ in TIME_LIMIT_ERRORS:
        return TIME_LIMIT
    if isinstance(exc, (QueryError, ValueError)):
        return BAD_REQUEST
    return INTERNAL
