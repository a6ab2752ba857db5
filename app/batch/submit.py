"""Submitting a batch: questions from JSONL, a golden set or a filter over stored queries.

Everything is validated before anything is stored: a JSONL file with any bad line is refused as a
whole, with every bad line number in the error (a partial batch would make "how did answers
change" harder to read, and the operator fixes the file once). Then the batch, its items and one
query per item are written in one transaction, so a refused or failed submit leaves nothing.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.batch.records import Batch, BatchItem
from app.db.models import Query, Tenant, utcnow
from app.privacy import stored_in_clear
from app.requests import QueryRequest, RequestError, validate_request
from app.settings import Settings
from app.tracing import span
from app.validation import check_time_range
from retrieval.records import CollectionIndex

log = logging.getLogger(__name__)

OVERRIDES = ("method", "num_speculative_tokens", "max_tokens")
LINE_FIELDS = {
    "question",
    "collection",
    "method",
    "num_speculative_tokens",
    "max_tokens",
    "temperature",
    "seed",
    "expected_source",
}
MAX_LISTED_LINES = 50


@dataclass(frozen=True)
class ItemSpec:
    """One validated batch item: whose question, the request, and what it re-runs or expects."""

    tenant_id: int
    request: QueryRequest
    original_query_id: uuid.UUID | None = None
    expected_source: str | None = None


@dataclass(frozen=True)
class StoredFilter:
    """Which stored queries to re-run (all fields optional; windows are on ``queued_at``)."""

    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    collection: str | None = None
    method: str | None = None
    failed_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The filter as stored in the batch's ``source_detail``."""
        return {
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "tenant": self.tenant,
            "collection": self.collection,
            "method": self.method,
            "failed_only": self.failed_only,
        }


def clean_overrides(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The decoding overrides that were actually given (None values dropped, names checked)."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key in given:
        if key not in OVERRIDES:
            raise RequestError(key, f"cannot be overridden in a batch (allowed: {OVERRIDES})")
    return given


def parse_jsonl(
    lines: Iterable[str],
    settings: Settings,
    tenant_id: int,
    *,
    collection: str | None,
    overrides: dict[str, Any] | None = None,
    golden: bool = False,
) -> list[ItemSpec]:
    """Validated items, one per non-blank line; RequestError listing every bad line otherwise."""
    given = clean_overrides(overrides)
    specs: list[ItemSpec] = []
    bad: list[str] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            specs.append(_line_spec(raw, settings, tenant_id, collection, given, golden))
        except RequestError as exc:
            bad.append(f"line {number}: {exc}")
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            bad.append(f"line {number}: not valid JSON ({exc})")
        except RecursionError:
            bad.append(f"line {number}: not valid JSON (nested too deeply)")
    if bad:
        shown = "; ".join(bad[:MAX_LISTED_LINES])
        more = f"; and {len(bad) - MAX_LISTED_LINES} more" if len(bad) > MAX_LISTED_LINES else ""
        raise RequestError("file", f"{len(bad)} bad line(s), nothing queued: {shown}{more}")
    if not specs:
        raise RequestError("file", "no questions: the file has no non-blank lines")
    return specs


def _line_spec(
    raw: str,
    settings: Settings,
    tenant_id: int,
    collection: str | None,
    overrides: dict[str, Any],
    golden: bool,
) -> ItemSpec:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise RequestError("line", "must be a JSON object")
    unknown = sorted(set(data) - LINE_FIELDS)
    if unknown:
        raise RequestError(unknown[0], "unknown field")
    expected = data.pop("expected_source", None)
    if golden and (not isinstance(expected, str) or not expected.strip()):
        raise RequestError("expected_source", "a golden set line needs a non-empty string")
    if data.get("collection") is None:
        if collection is None:
            raise RequestError("collection", "missing (give it on the line or for the whole batch)")
        data["collection"] = collection
    data.update(overrides)
    return ItemSpec(tenant_id, validate_request(settings, data), expected_source=expected)


def select_stored(
    session: Session,
    settings: Settings,
    flt: StoredFilter,
    *,
    overrides: dict[str, Any] | None = None,
    limit: int,
) -> list[ItemSpec]:
    """Items that re-run the stored queries ``flt`` selects (oldest first).

    Only finished interactive queries are taken (never earlier batch re-runs, so re-running twice
    does not snowball); each keeps its own parameters except the overrides.
    """
    given = clean_overrides(overrides)
    statuses = ("failed",) if flt.failed_only else ("succeeded", "failed")
    stmt = (
        select(Query, Tenant.name)
        .join(Tenant, Tenant.id == Query.tenant_id)
        .where(Query.queue == "answer", Query.status.in_(statuses))
        .order_by(Query.queued_at, Query.id)
        # One more than allowed, so that "too many" is reported instead of silently cut.
        .limit(limit + 1)
    )
    if flt.since is not None:
        stmt = stmt.where(Query.queued_at >= flt.since)
    if flt.until is not None:
        stmt = stmt.where(Query.queued_at < flt.until)
    if flt.tenant is not None:
        stmt = stmt.where(Tenant.name == flt.tenant)
    if flt.collection is not None:
        stmt = stmt.where(Query.collection == flt.collection)

    specs = []
    scrubbed = 0
    for query, _tenant in session.execute(stmt).all():
        params = dict(query.params)
        if flt.method is not None and params.get("method") != flt.method:
            continue
        if not stored_in_clear(query):
            scrubbed += 1
            continue
        data = {"question": query.question, "collection": query.collection, **params, **given}
        specs.append(ItemSpec(query.tenant_id, validate_request(settings, data), query.id))
    if scrubbed:
        # Re-running a hash (or a redacted text) would ask a different question and compare
        # its answer with the original's as if it were the same.
        raise RequestError(
            "filter",
            f"{scrubbed} of the matched queries kept their question hashed or redacted "
            "(store_questions), so they cannot be re-run; narrow the filter (since/until) to "
            "queries stored in clear",
        )
    if not specs:
        raise RequestError("filter", f"matched no finished stored queries ({_describe(flt)})")
    return specs


def _describe(flt: StoredFilter) -> str:
    parts = [f"{k}={v}" for k, v in flt.to_dict().items() if v not in (None, False)]
    return ", ".join(parts) or "no conditions"


def check_collections(session: Session, specs: Sequence[ItemSpec]) -> None:
    """RequestError naming the first collection that has never been ingested for its tenant."""

    names = dict(session.execute(select(Tenant.id, Tenant.name)).tuples().all())
    wanted = sorted({(s.tenant_id, s.request.collection) for s in specs})
    known = set(
        session.execute(select(CollectionIndex.tenant, CollectionIndex.collection)).tuples().all()
    )
    for tenant_id, collection in wanted:
        if (names.get(tenant_id), collection) not in known:
            raise RequestError(
                "collection",
                f"unknown collection {collection!r} for tenant {names.get(tenant_id)!r}"
                " (ingest it first)",
            )


def parse_when(field: str, value: str | None) -> datetime | None:
    """An ISO 8601 time as an aware UTC datetime (naive means UTC); RequestError naming ``field``."""
    if value is None or value == "":
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise RequestError(field, f"not an ISO 8601 time: {value!r}") from None

    try:
        aware = when.astimezone(UTC) if when.tzinfo is not None else when.replace(tzinfo=UTC)
        return check_time_range(field, aware)
    except (OverflowError, ValueError):
        raise RequestError(field, f"{value!r} is out of range (1970 to 3000 UTC)") from None


def dispatch_new(batch: Batch, dispatch: Callable[[uuid.UUID, int, int], None]) -> bool:
    """Send a new batch's first chunk tasks; False (the watchdog sends them later) on failure."""
    try:
        # The job's span: its chunk tasks (and each item's link) hang from it.
        attrs = {"specrag.batch.id": str(batch.id), "specrag.batch.lanes": batch.lanes}
        with span("batch", attrs):
            dispatch(batch.id, batch.epoch, batch.lanes)
    except Exception as exc:  # broker down: the batch is stored, the watchdog revives it
        log.warning("dispatch of batch %s failed, left for the watchdog: %s", batch.id, exc)
        return False
    return True


def create_batch(
    session: Session,
    settings: Settings,
    tenant: Tenant,
    specs: Sequence[ItemSpec],
    *,
    source: str,
    source_detail: dict[str, Any],
    overrides: dict[str, Any] | None = None,
) -> Batch:
    """The stored batch with its items and their queued queries (committed together), or an error.

    Raises RequestError, storing nothing, for an empty batch, one over ``batch_max_items``, or an
    unknown collection.
    """
    if not specs:
        raise RequestError("questions", "the batch has no items")
    if len(specs) > settings.batch_max_items:
        raise RequestError(
            "questions",
            f"more than batch_max_items ({settings.batch_max_items}) items;"
            " split the batch or narrow the filter",
        )
    check_collections(session, specs)
    now = utcnow()
    chunks = math.ceil(len(specs) / settings.batch_chunk_size)
    batch = Batch(
        id=uuid.uuid4(),
        tenant_id=tenant.id,
        status="queued",
        source=source,
        source_detail=source_detail,
        params=clean_overrides(overrides),
        total=len(specs),
        succeeded=0,
        failed=0,
        cancelled=0,
        epoch=0,
        lanes=max(1, min(settings.batch_max_concurrency, chunks)),
        created_at=now,
        heartbeat_at=now,
    )
    session.add(batch)
    queries = []
    for spec in specs:
        query = Query(
            id=uuid.uuid4(),
            tenant_id=spec.tenant_id,
            collection=spec.request.collection,
            question=spec.request.question,
            params=spec.request.params(),
            status="queued",
            queue="batch",
            source="batch",
            attempts=0,
            queued_at=now,
            # The batch's chunk tasks carry these queries; the outbox must not send each one.
            enqueued_at=now,
        )
        queries.append(query)
    session.add_all(queries)
    # Without ORM relationships the unit of work does not order these inserts: queries first.
    session.flush()
    session.add_all(
        BatchItem(
            batch_id=batch.id,
            position=position,
            query_id=query.id,
            original_query_id=spec.original_query_id,
            expected_source=spec.expected_source,
            status="pending",
        )
        for position, (spec, query) in enumerate(zip(specs, queries, strict=True))
    )
    session.commit()
    return batch
