"""Per-tenant limits: the defaults from Settings, an admin's overrides, and the checks at submit.

Two kinds of limit, each kept where it is cheapest to keep right:

- Rates (submissions per second, upload bytes per day) use the ``limits`` library's fixed
  windows: in its Redis storage where the broker is Redis, in the service's database on the
  embedded default (``DatabaseStorage``, app/tenancy/ratestore.py). Either way every API process
  shares one counter, and a restart forgets nothing.
- Counts (queries queued or running, batch items in flight) are read from the database, so they
  are right on every deployment and need no second bookkeeping; a count is reused for a second
  with this process's own submissions added (``Enforcer._room``), so a busy tenant's request
  costs no query.

A refusal is a ``LimitExceeded`` (429, or 413 for one over-sized request) with ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Any

from limits import RateLimitItemPerDay, RateLimitItemPerSecond, storage, strategies
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from app.db.models import Query, utcnow
from app.settings import Settings
from app.tenancy.ratestore import DatabaseStorage
from app.tenancy.records import TenantLimits

log = logging.getLogger(__name__)
CACHE_SECONDS = 5.0
"""An admin's change to a tenant's limits takes effect within this long on every API process."""
COUNT_SECONDS = 1.0
"""How long a tenant's count of active work is reused (plus this process's own submissions)."""


class LimitExceeded(Exception):
    """A request over one of its tenant's limits; the API answers ``status`` naming ``field``."""

    def __init__(self, field: str, message: str, *, status: int = 429, retry_after: int = 1):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status
        self.retry_after = max(1, retry_after)


@dataclass(frozen=True)
class Limits:
    """One tenant's limits in force (0 means no limit)."""

    submissions_per_second: float
    """Queries and batches submitted per second (a burst of up to one second's worth is fine)."""
    max_active_queries: int
    """Interactive queries queued or running at once."""
    max_batch_items: int
    """Batch items queued or running at once, over all the tenant's batches."""
    max_upload_bytes: int
    """Bytes of file content in one upload request."""
    max_upload_bytes_per_day: int
    """Bytes of file content uploaded per UTC day."""
    max_extracted_chars: int
    """Characters of text extracted from one document (larger ones fail at ingest)."""
    max_collections: int
    """Collections the tenant may have (an upload or ingest into one more is refused)."""


def default_limits(settings: Settings) -> Limits:
    """The limits of a tenant no admin has set anything for."""
    return Limits(
        submissions_per_second=settings.tenant_submissions_per_second,
        max_active_queries=settings.tenant_max_active_queries,
        max_batch_items=settings.tenant_max_batch_items,
        max_upload_bytes=settings.tenant_max_upload_bytes,
        max_upload_bytes_per_day=settings.tenant_max_upload_bytes_per_day,
        max_extracted_chars=settings.tenant_max_extracted_chars,
        max_collections=settings.tenant_max_collections,
    )


def stored_limits(session: Session, settings: Settings, tenant_id: int) -> Limits:
    """The tenant's limits: the defaults with an admin's overrides (from the database) applied."""
    row = session.get(TenantLimits, tenant_id)
    limits = default_limits(settings)
    if row is None:
        return limits
    given = {f.name: getattr(row, f.name) for f in fields(Limits)}
    return replace(limits, **{k: v for k, v in given.items() if v is not None})


def set_limits(session: Session, tenant_id: int, values: dict[str, Any]) -> None:
    """Store an admin's overrides (None leaves a limit as it is); committed."""
    row = session.get(TenantLimits, tenant_id) or TenantLimits(tenant_id=tenant_id)
    for name, value in values.items():
        if name not in {f.name for f in fields(Limits)}:
            raise ValueError(f"{name}: not a tenant limit")
        if value is not None:
            if value < 0:
                raise ValueError(f"{name}: must be >= 0 (0 = no limit), got {value}")
            setattr(row, name, value)
    row.updated_at = utcnow()
    session.add(row)
    session.commit()


class Enforcer:
    """The limit checks of one API process: limits cached briefly, rates in ``limits`` storage.

    ``engine`` is the service's database: the rate windows live there unless the broker is Redis.
    """

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        broker = settings.resolved_broker_url
        self.storage: storage.Storage
        if broker.startswith(("redis://", "rediss://")):
            # A dead broker must not hold a submit: it answers 202 and the outbox sends later.
            timeout = settings.broker_timeout_seconds
            redis = storage.storage_from_string(
                broker, key_prefix="specrag-limits",
                socket_connect_timeout=timeout, socket_timeout=timeout,
            )  # fmt: skip
            assert isinstance(redis, storage.Storage)  # the synchronous one, for a redis:// URI
            self.storage = redis
        else:
            self.storage = DatabaseStorage(engine)
        self.window = strategies.FixedWindowRateLimiter(self.storage)
        self._cache: dict[int, tuple[float, Limits]] = {}
        self._counts: dict[tuple[int, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def limits(self, session: Session, tenant_id: int) -> Limits:
        """The tenant's limits, read from the database at most every ``CACHE_SECONDS``."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(tenant_id)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        found = stored_limits(session, self.settings, tenant_id)
        with self._lock:
            self._cache[tenant_id] = (now, found)
        return found

    def rate(self, session: Session, tenant_id: int) -> Limits:
        """Count one submission against the tenant's rate; LimitExceeded when over it.

        The API's guard calls this before it reads the request's body, and the route then calls
        ``submission`` or ``upload`` with ``rate=False``.
        """
        limits = self.limits(session, tenant_id)
        self._rate(tenant_id, limits.submissions_per_second)
        return limits

    def submission(
        self, session: Session, tenant_id: int, *, batch_items: int = 0, rate: bool = True
    ) -> Limits:
        """Count one submission; LimitExceeded when over the rate or an active-work quota.

        A batch larger than the tenant's whole quota can never be admitted: 413, not 429.
        """
        limits = self.limits(session, tenant_id)
        if rate:
            self._rate(tenant_id, limits.submissions_per_second)
        if batch_items:
            cap = limits.max_batch_items
            if cap and batch_items > cap:
                raise LimitExceeded(
                    "questions",
                    f"{batch_items} items is more than the tenant's max_batch_items ({cap}) "
                    "in flight at once: split the batch",
                    status=413,
                )
            if cap and not self._room(session, tenant_id, "batch", batch_items, cap):
                raise LimitExceeded(
                    "questions",
                    f"the tenant may have {cap} batch items queued or running; wait for "
                    "earlier batches to finish or submit a smaller batch",
                    retry_after=30,
                )
        else:
            cap = limits.max_active_queries
            if cap and not self._room(session, tenant_id, "answer", 1, cap):
                raise LimitExceeded(
                    "question",
                    f"the tenant already has {cap} queries queued or running",
                    retry_after=5,
                )
        return limits

    def _room(self, session: Session, tenant_id: int, queue: str, adding: int, cap: int) -> bool:
        """Whether ``adding`` more items fit under ``cap``; counts them when they do.

        The database count is cached for ``COUNT_SECONDS`` and this process's own submissions are
        added to it, so a busy tenant's request costs no query; answers finished meanwhile are not
        subtracted, so the cache can only err towards refusing, and a refusal is always confirmed
        by a fresh count. Other API processes' submissions show at the next refresh.
        """
        key = (tenant_id, queue)
        now = time.monotonic()
        with self._lock:
            hit = self._counts.get(key)
        if hit is None or now - hit[0] > COUNT_SECONDS or hit[1] + adding > cap:
            hit = (now, _active(session, tenant_id, queue))
        if hit[1] + adding > cap:
            with self._lock:
                self._counts[key] = hit
            return False
        with self._lock:
            self._counts[key] = (hit[0], hit[1] + adding)
        return True

    def upload(self, session: Session, tenant_id: int, size: int, *, rate: bool = True) -> Limits:
        """Count an upload of ``size`` bytes; LimitExceeded when over a request or daily quota."""
        limits = self.limits(session, tenant_id)
        if rate:
            self._rate(tenant_id, limits.submissions_per_second)
        if limits.max_upload_bytes and size > limits.max_upload_bytes:
            raise LimitExceeded(
                "documents",
                f"{size} bytes in one upload; the limit is {limits.max_upload_bytes}",
                status=413,
            )
        daily = limits.max_upload_bytes_per_day
        if daily:
            if size > daily:
                raise LimitExceeded(
                    "documents",
                    f"{size} bytes is over the tenant's max_upload_bytes_per_day ({daily})",
                    status=413,
                )
            item = RateLimitItemPerDay(daily)
            if not self._hit(item, "upload-bytes", str(tenant_id), cost=max(1, size)):
                reset = self.window.get_window_stats(item, "upload-bytes", str(tenant_id))[0]
                raise LimitExceeded(
                    "documents",
                    f"the tenant's daily upload quota of {daily} bytes is used up",
                    retry_after=math.ceil(reset - time.time()),
                )
        return limits

    def refund_upload(self, session: Session, tenant_id: int, size: int) -> None:
        """Give back ``size`` bytes of today's upload quota (an upload refused after ``upload``)."""
        daily = self.limits(session, tenant_id).max_upload_bytes_per_day
        if not daily:
            return
        item = RateLimitItemPerDay(daily)
        try:
            key = item.key_for("upload-bytes", str(tenant_id))
            self.storage.incr(key, item.get_expiry(), amount=-max(1, size))
        except Exception as exc:  # the store is down: the quota errs towards refusing
            log.warning("rate limit store unreachable, upload quota not refunded: %s", exc)

    def _hit(self, item: Any, *keys: str, cost: int = 1) -> bool:
        """Count ``cost`` against ``item``; True (allowed) when the rate store cannot be reached.

        Failing open: the store is the broker's Redis, and while it is down nothing can be queued
        anyway; the submit is stored and answered 202, as the outbox promises. (On the embedded
        default the store is the database, and a submit cannot be stored without it either.)
        """
        try:
            return bool(self.window.hit(item, *keys, cost=cost))
        except Exception as exc:  # redis errors, timeouts: the limit waits for Redis
            log.warning("rate limit store unreachable, request allowed: %s", exc)
            return True

    def _rate(self, tenant_id: int, per_second: float) -> None:
        if per_second <= 0:
            return
        amount, seconds = burst_window(per_second, self.settings.tenant_submission_burst)
        item = RateLimitItemPerSecond(amount, seconds)
        if not self._hit(item, "submit", str(tenant_id)):
            reset = self.window.get_window_stats(item, "submit", str(tenant_id))[0]
            raise LimitExceeded(
                "submissions_per_second",
                f"more than {per_second:g} submissions per second for this tenant",
                retry_after=math.ceil(reset - time.time()),
            )


def burst_window(per_second: float, burst: int) -> tuple[int, int]:
    """The fixed window that gives ``per_second`` sustained with bursts of ``burst``:
    ``(submissions, seconds)``.

    ``burst`` submissions at once are admitted, then the window refills at the sustained rate on
    average: a bucket of ``burst`` that a window of ``burst / per_second`` seconds refills (the
    ``limits`` library's fixed window, on storage every API process shares). ``burst`` below one
    second's worth means one second's worth; a rate below 1/s becomes one submission per
    ``ceil(1 / rate)`` seconds unless the burst is larger.
    """
    amount = max(int(burst), math.floor(per_second), 1)
    return amount, max(1, math.ceil(amount / per_second))


def _active(session: Session, tenant_id: int, queue: str) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(Query)
            .where(
                Query.tenant_id == tenant_id,
                Query.queue == queue,
                Query.status.in_(("queued", "running")),
            )
        )
        or 0
    )
