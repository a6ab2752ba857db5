"""What happens to a query whose attempt cannot finish it normally: handed back, or failed.

A query handed back (``hand_back``) did nothing wrong: the database was away, its engine died, or
its request was cancelled; it is queued again for another attempt. A failure (``fail``) is the
query's own. Both are fenced by the attempt (app/lifecycle/lease.py): an attempt that no longer holds the
query changes nothing. Database writes here ride out a short outage (app/lifecycle/outage.py).
"""

from __future__ import annotations

import logging
import uuid

from app.db import Query
from app.lifecycle.finish import finish_query
from app.lifecycle.lease import Claimed, release
from app.lifecycle.outage import DatabaseUnavailable, unreachable, with_database
from app.requests import QueryStatus
from app.resources import Resources

log = logging.getLogger(__name__)


def not_the_querys(resources: Resources, exc: Exception) -> bool:
    """Whether ``exc`` came from the service (database away, engine dead), not from the query."""
    return unreachable(exc) or engine_died(resources, exc)


def engine_died(resources: Resources, exc: Exception) -> bool:
    """Whether this process's engine is dead (then no query of it failed by its own fault)."""
    # vLLM's EngineDeadError, by name (vLLM is optional), may beat the engine's own flag.
    return resources.engine_dead() or type(exc).__name__ == "EngineDeadError"


def hand_back(resources: Resources, qid: uuid.UUID, attempt: int) -> None:
    """Release the query (this attempt's hold only); if the database stays away, the reaper will."""
    sf = resources.session_factory
    try:
        with_database(
            lambda: release(sf, qid, attempt),
            seconds=resources.settings.database_retry_seconds,
            what=f"release of query {qid}",
        )
    except DatabaseUnavailable:
        log.error("query %s: release failed; the reaper re-queues it once its lease expires", qid)


def fail(resources: Resources, qid: uuid.UUID, claimed: Claimed, error: str) -> bool:
    """Make the query failed with ``error`` if this attempt still holds it; True if it did."""
    sf, s = resources.session_factory, resources.settings

    def write() -> bool:
        with sf() as session:
            moved = finish_query(
                session, s, qid, QueryStatus.FAILED, question=claimed.question, error=error,
                where=(Query.attempts == claimed.attempt,),
            )  # fmt: skip
            session.commit()
        return moved

    moved = with_database(write, seconds=s.database_retry_seconds, what=f"failure of query {qid}")
    if not moved:
        log.info("query %s: attempt %d no longer holds it; failure dropped", qid, claimed.attempt)
    return moved
