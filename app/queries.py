"""Asking and reading queries: request validation, the stored query, and its JSON view.

The HTTP API, the CLI, the Python client's local mode and batch jobs all go through these
functions, so one request is validated, stored and shown the same way everywhere.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from app.db import Answer, Query, Tenant
from app.settings import Settings
from app.validation import RequestError, check_text  # RequestError: re-exported as before

QUEUES = ("answer", "batch")


@dataclass(frozen=True)
class QueryRequest:
    """A validated question and its decoding parameters (all defaults filled in)."""

    question: str
    collection: str
    method: str
    num_speculative_tokens: int | str
    max_tokens: int
    temperature: float
    seed: int | None

    def params(self) -> dict[str, Any]:
        """The decoding parameters as stored in ``queries.params``."""
        data = asdict(self)
        del data["question"], data["collection"]
        return data


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(name, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise RequestError(name, f"must be {bound}, got {value}")
    return value


def validate_request(settings: Settings, data: dict[str, Any]) -> QueryRequest:
    """The request with defaults filled in, or RequestError naming the first bad field."""
    known = {
        "question",
        "collection",
        "method",
        "num_speculative_tokens",
        "max_tokens",
        "temperature",
        "seed",
    }
    for key in data:
        if key not in known:
            raise RequestError(key, "unknown field")
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise RequestError("question", "must be a non-empty string")
    check_text("question", question)
    if len(question) > settings.max_question_chars:
        raise RequestError(
            "question", f"longer than {settings.max_question_chars} characters ({len(question)})"
        )
    collection = data.get("collection")
    if not isinstance(collection, str) or not collection.strip() or len(collection) > 128:
        raise RequestError("collection", "must be a non-empty string of at most 128 characters")
    check_text("collection", collection)
    method = data.get("method") or settings.default_method
    if not isinstance(method, str) or method not in settings.allowed_methods:
        raise RequestError(
            "method", f"must be one of {', '.join(settings.allowed_methods)}, got {method!r}"
        )
    k = data.get("num_speculative_tokens")
    if k is None:
        k = 4
    if k != "auto":
        if isinstance(k, str) and k.isdigit():
            k = int(k)
        k = _int("num_speculative_tokens", k, 1, settings.max_speculative_tokens)
    max_tokens = data.get("max_tokens")
    if max_tokens is None:
        max_tokens = settings.default_max_tokens
    max_tokens = _int("max_tokens", max_tokens, 1, settings.max_tokens_limit)
    temperature = data.get("temperature")
    if temperature is None:
        temperature = 0.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise RequestError("temperature", f"must be a number, got {temperature!r}")
    if not 0.0 <= float(temperature) <= settings.max_temperature:
        raise RequestError(
            "temperature", f"must be between 0 and {settings.max_temperature}, got {temperature}"
        )
    seed = data.get("seed")
    if seed is not None:
        seed = _int("seed", seed, 0, 2**63 - 1)
    return QueryRequest(
        question=question,
        collection=collection.strip(),
        method=method,
        num_speculative_tokens=k,
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=seed,
    )


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
    queue: str = "answer",
) -> tuple[Query, bool]:
    """The stored query (committed, not yet enqueued) and whether this call created it.

    With an ``idempotency_key`` the tenant's earlier query under that key is returned instead;
    the unique constraint (tenant, key) settles concurrent submissions.
    """
    if queue not in QUEUES:
        raise RequestError("queue", f"must be one of {', '.join(QUEUES)}")
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
        status="queued",
        idempotency_key=idempotency_key,
        queue=queue,
        attempts=0,
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
        .execution_options(populate_existing=True)
    )
    if tenant_id is not None:
        stmt = stmt.where(Query.tenant_id == tenant_id)
    return session.scalar(stmt)


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
    if query.error:
        view["error"] = query.error
    return view


def wait_for(
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    timeout: float,
    poll: float = 0.1,
) -> Query:
    """The query once it succeeded or failed; TimeoutError (saying its status) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with session_factory() as session:
            query = get_query(session, query_id, None)
            if query is None:
                raise LookupError(f"query {query_id} does not exist")
            if query.status in ("succeeded", "failed") or time.monotonic() >= deadline:
                if query.status not in ("succeeded", "failed"):
                    raise TimeoutError(
                        f"query {query_id} still {query.status} after {timeout:.0f} s"
                        " (is a worker running on this broker?)"
                    )
                return query
        time.sleep(poll)


def require_collection(session: Session, tenant: str, collection: str) -> None:
    """RequestError naming ``collection`` unless the tenant has ingested into it."""
    from retrieval.records import CollectionIndex

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
