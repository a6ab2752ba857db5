"""``/v1/batches``: submit a batch, read its progress, cancel it, fetch its report.

A tenant key submits batches of its own questions and re-runs of its own stored queries, and
sees only its own batches; a filter over another tenant's (or every tenant's) queries needs an
admin key.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

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
from app.api.schemas import ErrorOut
from app.api.tokens import check_question_tokens, token_counter
from app.batch import submit as sub
from app.batch.report import render
from app.batch.runner import cancel
from app.batch.views import batch_view, get_batch, item_views
from app.db import Tenant
from app.requests import RequestError
from app.settings import Settings

router = APIRouter(prefix="/v1/batches", tags=["batches"], route_class=ParsedRoute)
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut},
    404: {"model": ErrorOut},
    422: {"model": ErrorOut},
}


class StoredFilterIn(BaseModel):
    """Which stored queries to re-run; times are ISO 8601 on the query's submission time."""

    model_config = ConfigDict(extra="forbid", strict=True)

    since: str | None = None
    until: str | None = None
    tenant: str | None = Field(default=None, description="Another tenant's needs an admin key.")
    collection: str | None = None
    method: str | None = Field(default=None, description="Only queries that used this method.")
    failed_only: bool = False


class BatchCreate(BaseModel):
    """Exactly one source: ``jsonl`` (text, one question object a line), ``questions``, ``filter``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    jsonl: str | None = None
    questions: list[dict[str, Any]] | None = None
    filter: StoredFilterIn | None = None
    golden: bool = Field(default=False, description="Lines carry expected_source (golden set).")
    collection: str | None = Field(default=None, description="Default collection of lines.")
    method: str | None = None
    num_speculative_tokens: int | Literal["auto"] | None = None
    max_tokens: int | None = None


@router.post("", status_code=202, responses=ERRORS)
def submit_batch(
    body: BatchCreate,
    caller: TenantDep,
    session: SessionDep,
    settings: SettingsDep,
    dispatcher: DispatcherDep,
    enforcer: EnforcerDep,
    request: Request,
) -> dict[str, Any]:
    """Validate and store the batch (all or nothing), queue it; returns its id."""

    sources = [body.jsonl is not None, body.questions is not None, body.filter is not None]
    if sum(sources) != 1:
        raise ApiError(422, "body", "give exactly one of jsonl, questions, filter")
    overrides = {
        "method": body.method,
        "num_speculative_tokens": body.num_speculative_tokens,
        "max_tokens": body.max_tokens,
    }
    owner = session.get(Tenant, caller.tenant_id)
    assert owner is not None
    if body.filter is None:
        lines = (
            body.jsonl.splitlines()
            if body.jsonl is not None
            else [json.dumps(q) for q in body.questions or []]
        )
        # Counted before any line is validated: a batch over the item limit can never run.
        items = sum(1 for line in lines if line.strip())
        if items > settings.batch_max_items:
            field = "jsonl" if body.jsonl is not None else "questions"
            raise ApiError(
                413,
                field,
                f"{items} items is more than batch_max_items ({settings.batch_max_items})",
            )
        specs = sub.parse_jsonl(
            lines,
            settings,
            owner.id,
            collection=body.collection,
            overrides=overrides,
            golden=body.golden,
        )
        _check_tokens(request, settings, specs)
        source = "golden" if body.golden else "jsonl"
        detail: dict[str, Any] = {"items": len(specs)}
    else:
        f = body.filter
        tenant = f.tenant if caller.is_admin else (f.tenant or caller.tenant)
        if tenant != caller.tenant and not caller.is_admin:
            raise ApiError(403, "filter.tenant", "another tenant's queries need an admin key")
        flt = sub.StoredFilter(
            since=sub.parse_when("filter.since", f.since),
            until=sub.parse_when("filter.until", f.until),
            tenant=tenant,
            collection=f.collection,
            method=f.method,
            failed_only=f.failed_only,
        )
        specs = sub.select_stored(
            session, settings, flt, overrides=overrides, limit=settings.batch_max_items
        )
        source, detail = "filter", flt.to_dict()
    enforcer.submission(session, owner.id, batch_items=len(specs), rate=not rate_counted(request))
    batch = sub.create_batch(
        session, settings, owner, specs, source=source, source_detail=detail, overrides=overrides
    )
    sub.dispatch_new(batch, dispatcher.dispatch_batch)
    return {"id": str(batch.id), "status": batch.status, "total": batch.total}


def _check_tokens(request: Request, settings: Settings, specs: list[Any]) -> None:
    """RequestError naming the first new question over the token limit (item numbers from 1)."""
    counter = token_counter(request.app.state, settings)
    for number, spec in enumerate(specs, start=1):
        try:
            check_question_tokens(counter, settings, spec.request.question)
        except RequestError as exc:
            raise RequestError("questions", f"item {number}: {exc}") from None


def _owned(session: SessionDep, caller: TenantDep, batch_id: str) -> Any:

    batch = get_batch(session, batch_id, None if caller.is_admin else caller.tenant_id)
    if batch is None:
        # Another tenant's batch is reported exactly like a missing one.
        raise ApiError(404, "id", f"no batch {batch_id}")
    return batch


@router.get("/{batch_id}", responses=ERRORS)
def read_batch(
    batch_id: str,
    caller: TenantDep,
    session: SessionDep,
    items: bool = Query(default=False, description="Also list every item's status."),
) -> dict[str, Any]:
    """The batch's status and counters (total, done, failed, cancelled, per-item on request)."""

    batch = _owned(session, caller, batch_id)
    view = batch_view(batch)
    if items:
        view["items"] = item_views(session, batch.id)
    return view


@router.post("/{batch_id}/cancel", responses=ERRORS)
def cancel_batch(
    batch_id: str, caller: TenantDep, session: SessionDep, request: Request
) -> dict[str, Any]:
    """Cancel the batch: items not started are cancelled, in-flight ones finish."""

    batch = _owned(session, caller, batch_id)
    cancel(request.app.state.session_factory, batch.id)
    session.refresh(batch)
    return batch_view(batch)


@router.get("/{batch_id}/report", responses=ERRORS)
def batch_report(
    batch_id: str,
    caller: TenantDep,
    session: SessionDep,
    format: Literal["json", "csv", "html"] = Query(default="json"),
) -> Response:
    """How the answers changed vs the originals, latency and acceptance before/after."""

    batch = _owned(session, caller, batch_id)
    media_type, body = render(session, batch.id, format)
    return Response(content=body, media_type=media_type)
