"""``POST /v1/queries`` and ``GET /v1/queries/{id}``: submit a question, read its answer."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Request

from app.api.body import ParsedRoute
from app.api.deps import (
    DispatcherDep,
    EnforcerDep,
    SessionDep,
    SettingsDep,
    TenantDep,
    rate_counted,
)
from app.api.errors import ApiError
from app.api.schemas import ErrorOut, QueryAccepted, QueryOut
from app.api.tokens import check_question_tokens, token_counter
from app.db import Tenant
from app.lifecycle.outbox import admit
from app.lifecycle.queries import create_query, get_query, query_view, require_collection
from app.privacy import matches_stored
from app.requests import QueryRequest, QueryStatus, validate_request

router = APIRouter(prefix="/v1/queries", tags=["queries"], route_class=ParsedRoute)
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    404: {"model": ErrorOut},
    409: {"model": ErrorOut},
    422: {"model": ErrorOut},
}


# The body is validated once, by the one request model with this deployment's limits (FastAPI
# cannot hand Settings to a body model), so the route takes the JSON object and shows the model.
_BODY_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": QueryRequest.model_json_schema()}},
    }
}


@router.post(
    "",
    status_code=202,
    response_model=QueryAccepted,
    responses=ERRORS,
    openapi_extra=_BODY_SCHEMA,
)
def submit_query(
    body: Annotated[dict[str, Any], Body()],
    caller: TenantDep,
    session: SessionDep,
    settings: SettingsDep,
    dispatcher: DispatcherDep,
    request: Request,
    enforcer: EnforcerDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> QueryAccepted:
    """Store the question and queue it; the same Idempotency-Key returns the same id."""
    validated = validate_request(settings, body)
    counter = token_counter(request.app.state, settings)
    check_question_tokens(counter, settings, validated.question)
    tenant = session.get(Tenant, caller.tenant_id)
    assert tenant is not None
    require_collection(session, tenant.name, validated.collection)
    enforcer.submission(session, tenant.id, rate=not rate_counted(request))
    query, created = create_query(session, tenant, validated, idempotency_key=idempotency_key)
    if not created:
        same = (
            matches_stored(query.question, validated.question)
            and query.collection == validated.collection
            and query.params == validated.params()
        )
        if not same:
            raise ApiError(409, "Idempotency-Key", "already used for a different request")
        return QueryAccepted(id=str(query.id), status=query.status)
    # Admission: sent now if the tenant has a free slot, else held (enqueued_at NULL) until one
    # of its queries is answered; a failed send leaves it for the sweeper too (app/lifecycle/outbox.py).
    admit(request.app.state.session_factory, settings, dispatcher.send_query, tenant_id=tenant.id)
    return QueryAccepted(id=str(query.id), status=QueryStatus.QUEUED)


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
