"""``POST /v1/queries`` and ``GET /v1/queries/{id}``: submit a question, read its answer."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request

from app.api.deps import DispatcherDep, SessionDep, SettingsDep, TenantDep
from app.api.errors import ApiError
from app.api.schemas import ErrorOut, QueryAccepted, QueryCreate, QueryOut
from app.db import Tenant
from app.outbox import send_and_mark
from app.queries import create_query, get_query, query_view, require_collection, validate_request

router = APIRouter(prefix="/v1/queries", tags=["queries"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    404: {"model": ErrorOut},
    409: {"model": ErrorOut},
    422: {"model": ErrorOut},
}


@router.post("", status_code=202, response_model=QueryAccepted, responses=ERRORS)
def submit_query(
    body: QueryCreate,
    caller: TenantDep,
    session: SessionDep,
    settings: SettingsDep,
    dispatcher: DispatcherDep,
    request: Request,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> QueryAccepted:
    """Store the question and queue it; the same Idempotency-Key returns the same id."""
    validated = validate_request(settings, body.model_dump())
    tenant = session.get(Tenant, caller.tenant_id)
    assert tenant is not None
    require_collection(session, tenant.name, validated.collection)
    query, created = create_query(session, tenant, validated, idempotency_key=idempotency_key)
    if not created:
        same = (
            query.question == validated.question
            and query.collection == validated.collection
            and query.params == validated.params()
        )
        if not same:
            raise ApiError(409, "Idempotency-Key", "already used for a different request")
        return QueryAccepted(id=str(query.id), status=query.status)
    # A failed send leaves the query in the outbox (enqueued_at NULL): the sweeper sends it later.
    send_and_mark(request.app.state.session_factory, query.id, query.queue, dispatcher.send_query)
    return QueryAccepted(id=str(query.id), status="queued")


@router.get(
    "/{query_id}", response_model=QueryOut, response_model_exclude_none=True, responses=ERRORS
)
def read_query(query_id: str, caller: TenantDep, session: SessionDep) -> dict[str, Any]:
    """The query's status, and its answer, sources and stats once it succeeded."""
    query = get_query(session, query_id, caller.tenant_id)
    if query is None:
        # Another tenant's query is reported exactly like a missing one.
        raise ApiError(404, "id", f"no query {query_id}")
    return query_view(query)
