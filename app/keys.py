"""Tenant API keys: created once and shown once; only their SHA-256 hash is stored."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from app.db import ApiKey
from app.queries import get_or_create_tenant

KEY_PREFIX = "srk_"


def hash_key(key: str) -> str:
    """The stored form of a key: hex SHA-256 (keys are long random tokens, so no salt is needed)."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(session: Session, tenant: str, *, admin: bool = False) -> str:
    """A new key for ``tenant`` (created if new); returns the key itself, which is not stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    owner = get_or_create_tenant(session, tenant)
    session.add(ApiKey(tenant_id=owner.id, key_hash=hash_key(key), prefix=key[:12], is_admin=admin))
    session.commit()
    return key


def find_key(session: Session, key: str) -> ApiKey | None:
    """The live ApiKey (tenant loaded) that ``key`` hashes to, or None."""
    return session.scalar(
        select(ApiKey)
        .options(joinedload(ApiKey.tenant))
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    )
