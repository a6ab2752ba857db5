"""The per-tenant collection limit: refused at upload, and again where a write creates one.

Each collection costs a worker memory and a thread while it is held (retrieval.host_indexes), so
a tenant has at most ``Limits.max_collections``. The API refuses an upload into one more (403
naming the limit, nothing stored or queued); the ingest worker and the CLI check again in the
transaction that would create the collection (retrieval.writes), which also covers uploads
racing through two API processes.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select, union
from sqlalchemy.orm import Session, sessionmaker

from app.db import Tenant
from app.settings import Settings
from app.tenancy.limits import LimitExceeded, Limits, stored_limits
from app.tenancy.records import DocumentUpload
from retrieval.records import CollectionIndex


def check_new_collection(session: Session, limits: Limits, tenant: str, collection: str) -> None:
    """Nothing when ``collection`` exists (or is awaiting its first ingest) or fits under the
    tenant's ``max_collections``; LimitExceeded (403) naming the limit otherwise."""
    cap = limits.max_collections
    if not cap:
        return
    names = set(
        session.scalars(
            union(
                select(CollectionIndex.collection).where(CollectionIndex.tenant == tenant),
                select(DocumentUpload.collection).where(
                    DocumentUpload.tenant == tenant, DocumentUpload.status == "pending"
                ),
            )
        )
    )
    if collection in names or len(names) < cap:
        return
    raise LimitExceeded(
        "collection",
        f"the tenant has {len(names)} collections and its max_collections is {cap}: delete "
        "one, or ask an admin to raise it",
        status=403,
    )


def collection_limit(
    session_factory: sessionmaker[Session], settings: Settings
) -> Callable[[str], int]:
    """``limit(tenant)``: the tenant's ``max_collections`` in force (an admin's override, else
    the setting), for retrieval's writer; 0 means no limit."""

    def limit(tenant: str) -> int:
        with session_factory() as session:
            tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == tenant))
            if tenant_id is None:  # a CLI-only tenant: no key, no overrides
                return settings.tenant_max_collections
            return stored_limits(session, settings, tenant_id).max_collections

    return limit
