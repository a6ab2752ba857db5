"""Tenant API keys: created once and shown once; only their SHA-256 hash is stored."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from app.db import ApiKey, Tenant, utcnow
from app.db.models import as_utc
from app.lifecycle.queries import get_or_create_tenant

KEY_PREFIX = "srk_"


def hash_key(key: str) -> str:
    """The stored form of a key: hex SHA-256 (keys are long random tokens, so no salt is needed)."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(
    session: Session, tenant: str, *, admin: bool = False, expires_at: datetime | None = None
) -> str:
    """A new key for ``tenant`` (created if new); returns the key itself, which is not stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    owner = get_or_create_tenant(session, tenant)
    session.add(
        ApiKey(
            tenant_id=owner.id,
            key_hash=hash_key(key),
            prefix=key[:12],
            is_admin=admin,
            expires_at=expires_at,
        )
    )
    session.commit()
    return key


def list_keys(session: Session, tenant: str | None = None) -> list[dict[str, Any]]:
    """Every key (or one tenant's) as an admin sees it: prefix, tenant, admin, dates; no secret."""
    stmt = select(ApiKey).options(joinedload(ApiKey.tenant)).order_by(ApiKey.id)
    if tenant is not None:
        stmt = stmt.join(Tenant).where(Tenant.name == tenant)
    now = utcnow()
    return [
        {
            "prefix": k.prefix,
            "tenant": k.tenant.name,
            "admin": k.is_admin,
            "created_at": k.created_at.isoformat(),
            "expires_at": k.expires_at.isoformat() if k.expires_at else None,
            "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
            "active": k.revoked_at is None and (k.expires_at is None or as_utc(k.expires_at) > now),
        }
        for k in session.scalars(stmt)
    ]


def revoke_key(session: Session, prefix: str) -> int:
    """Revoke the live keys whose prefix is ``prefix`` (as ``keys list`` shows it); how many.

    ValueError when none matches; a prefix is 12 characters, so two keys sharing one is not a
    practical concern, and both are revoked if it happens.
    """
    if len(prefix) < 8:
        raise ValueError("PREFIX: give the key's prefix as `keys list` shows it (12 characters)")
    keys = session.scalars(
        select(ApiKey).where(ApiKey.prefix == prefix[:12], ApiKey.revoked_at.is_(None))
    ).all()
    if not keys:
        raise ValueError(f"PREFIX: no live key with prefix {prefix!r}")
    for key in keys:
        key.revoked_at = utcnow()
    session.commit()
    return len(keys)


def find_key(session: Session, key: str) -> ApiKey | None:
    """The live ApiKey (tenant loaded) that ``key`` hashes to, or None (revoked, expired)."""
    found = session.scalar(
        select(ApiKey)
        .options(joinedload(ApiKey.tenant))
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    )
    if found is not None and found.expires_at is not None and as_utc(found.expires_at) <= utcnow():
        return None
    return found
