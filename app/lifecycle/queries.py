"""Storing and reading queries: the stored query, its JSON view, waiting for it to finish.

The HTTP API, the CLI, the Python client's local mode and batch jobs all go through these
functions (and validate with app/requests.py), so one request is stored and shown the same way
everywhere.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from app.db import Answer, Query, Tenant
from app.db.models import QUERY_SOURCES
from app.requests import (
    ANSWER_QUEUES,
    FINAL_STATUSES,
    QueryRequest,
    QueryStatus,
    QueueName,
    RequestError,
    check_text,
    validate_request,
)
from app.tracing import current_traceparent
from retrieval.records import CollectionIndex

# Re-exported: callers of the query store import the request model's names from here too.
__all__ = [
    "QueryOut",
    "QueryRequest",
    "RequestError",
    "create_query",
    "get_or_create_tenant",
    "get_query",
    "query_json",
    "query_view",
    "require_collection",
    "validate_request",
    "wait_for",
]


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    """The tenant called ``name``, created (and committed) when it does not exist yet."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is not None:
        return tenant
    try:
        tenant = Tenant(name=name)
        session.add(tenant)
        session.commit()
        return tenant
    except IntegrityError:
        # Another process created it between our select and insert.
        session.rollback()
        return session.scalars(select(Tenant).where(Tenant.name == name)).one()


def create_query(
    session: Session,
    tenant: Tenant,
    request: QueryRequest,
    *,
    idempotency_key: str | None = None,
    queue: str = QueueName.ANSWER,
    source: str = "api",
) -> tuple[Query, bool]:
    """The stored query (committed, not yet enqueued) and whether this call created it.

    ``source`` says who asked (``QUERY_SOURCES``): traffic, or a check the audit keeps apart.

    With an ``idempotency_key`` the tenant's earlier query under that key is returned instead;
    the unique constraint (tenant, key) settles concurrent submissions.
    """
    if queue not in ANSWER_QUEUES:
        raise RequestError("queue", f"must be one of {', '.join(ANSWER_QUEUES)}")
    if source not in QUERY_SOURCES:
        raise RequestError("source", f"must be one of {', '.join(QUERY_SOURCES)}")
    if idempotency_key is not None:
        if not idempotency_key or len(idempotency_key) > 200:
            raise RequestError("Idempotency-Key", "must be 1 to 200 characters")
        check_text("Idempotency-Key", idempotency_key)
        existing = _by_key(session, tenant.id, idempotency_key)
        if existing is not None:
            return existing, False
    query = Query(
        id=uuid.uuid4(),
        tenant_id=tenant.id,
        collection=request.collection,
        question=request.question,
        params=request.params(),
        status=QueryStatus.QUEUED,
        idempotency_key=idempotency_key,
        queue=str(queue),
        source=source,
        attempts=0,
        # The span that stores it (an API request, a batch job): its send and answer join it.
        traceparent=current_traceparent(),
    )
    session.add(query)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        if idempotency_key is None:
            raise
        existing = _by_key(session, tenant.id, idempotency_key)
        if existing is None:
            raise
        return existing, False
    return query, True


def _by_key(session: Session, tenant_id: int, key: str) -> Query | None:
    return session.scalar(
        select(Query).where(Query.tenant_id == tenant_id, Query.idempotency_key == key)
    )


def get_query(session: Session, query_id: str | uuid.UUID, tenant_id: int | None) -> Query | None:
    """The query with its answer and stats, or None when absent or another tenant's."""
    try:
        qid = query_id if isinstance(query_id, uuid.UUID) else uuid.UUID(str(query_id))
    except ValueError:
        return None
    stmt = (
        select(Query)
        .where(Query.id == qid)
        .options(selectinload(Query.answer).selectinload(Answer.sources))
        .options(selectinload(Query.stats))
        .options(selectinload(Query.grounding))  # type: ignore[attr-defined]
        .execution_options(populate_existing=True)
    )
    if tenant_id is not None:
        stmt = stmt.where(Query.tenant_id == tenant_id)
    return session.scalar(stmt)


class QueryOut(BaseModel):
    """``GET /v1/queries/{id}``: the status, and the answer, sources and stats once known."""

    id: str
    status: Literal["queued", "running", "succeeded", "failed"]
    answer: str | None = None
    sources: list[dict[str, Any]] | None = None
    stats: dict[str, Any] | None = None
    error: str | None = None
    grounding: dict[str, Any] | None = None
    """Absent until computed (just after ``succeeded``); ``groundedness`` null with a reason
    when the answer cannot be judged (docs/grounding.md)."""
    model_pair: str | None = None
    index_version: int | None = None


def query_view(query: Query) -> dict[str, Any]:
    """The contract's JSON view: id and status, plus answer/sources/stats or error when known."""
    view: dict[str, Any] = {"id": str(query.id), "status": query.status}
    if query.answer is not None:
        view["answer"] = query.answer.text
        view["sources"] = [s.to_dict() for s in query.answer.sources]
        view["model_pair"] = query.answer.model_pair
        view["index_version"] = query.answer.index_version
    if query.stats is not None:
        view["stats"] = query.stats.to_dict()
    grounding = getattr(query, "grounding", None)  # Query.grounding: app/db/groundings.py
    if grounding is not None:
        view["grounding"] = grounding.to_dict()
    if query.error:
        view["error"] = query.error
    return view


def query_json(query: Query) -> dict[str, Any]:
    """The JSON of ``GET /v1/queries/{id}`` for ``query`` (the API's model and exclusions)."""
    return QueryOut.model_validate(query_view(query)).model_dump(mode="json", exclude_none=True)


def poll_query(
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    timeout: float,
    done: Callable[[Query], bool],
    poll: float = 0.1,
) -> Query:
    """The query once ``done(query)``, or as it is after ``timeout`` seconds (LookupError if it
    does not exist)."""
    deadline = time.monotonic() + timeout
    while True:
        with session_factory() as session:
            query = get_query(session, query_id, None)
            if query is None:
                raise LookupError(f"query {query_id} does not exist")
            if done(query) or time.monotonic() >= deadline:
                return query
        time.sleep(poll)


def wait_for(
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    timeout: float,
    poll: float = 0.1,
) -> Query:
    """The query once it succeeded or failed; TimeoutError (saying its status) after ``timeout``."""
    query = poll_query(
        session_factory, query_id, timeout, lambda q: q.status in FINAL_STATUSES, poll
    )
    if query.status not in FINAL_STATUSES:
        raise TimeoutError(
            f"query {query_id} still {query.status} after {timeout:.0f} s"
            " (is a worker running on this broker?)"
        )
    return query


def require_collection(session: Session, tenant: str, collection: str) -> None:
    """RequestError naming ``collection`` unless the tenant has ingested into it."""

    found = session.scalar(
        select(CollectionIndex.id).where(
            CollectionIndex.tenant == tenant, CollectionIndex.collection == collection
        )
    )
    if found is None:
        raise RequestError(
            "collection",
            f"no collection {collection!r} for tenant {tenant!r}: ingest documents first",
        )
