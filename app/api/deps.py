"""FastAPI dependencies: settings, a database session, and the caller's tenant (or admin) key."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.api.body import SCOPE_KEY
from app.api.errors import ApiError
from app.dispatch import Dispatcher
from app.keys import find_key
from app.settings import Settings
from app.tenancy.limits import Enforcer

bearer = HTTPBearer(auto_error=False, description="A tenant API key from `specrag keys create`.")


def get_settings(request: Request) -> Settings:
    """The app's Settings (built once by ``create_app``)."""
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """A session for this request, closed afterwards."""
    with request.app.state.session_factory() as session:
        yield session


def get_dispatcher(request: Request) -> Dispatcher:
    """The queue the app was built with (``create_app``'s ``dispatcher``)."""
    dispatcher: Dispatcher = request.app.state.dispatcher
    return dispatcher


def get_enforcer(request: Request) -> Enforcer:
    """The app's per-tenant limit checks (app/tenancy/limits.py)."""
    enforcer: Enforcer = request.app.state.enforcer
    return enforcer


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
EnforcerDep = Annotated[Enforcer, Depends(get_enforcer)]


@dataclass(frozen=True)
class Caller:
    """Who is calling: the tenant the key belongs to, and whether the key is an admin key."""

    tenant_id: int
    tenant: str
    is_admin: bool


def lookup_caller(session: Session, key: str | None) -> Caller:
    """The caller behind the bearer ``key``; 401 when it is missing or unknown."""
    if not key:
        raise ApiError(401, "Authorization", "missing API key: send 'Authorization: Bearer KEY'")
    found = find_key(session, key)
    if found is None:
        raise ApiError(401, "Authorization", "unknown or revoked API key")
    return Caller(tenant_id=found.tenant_id, tenant=found.tenant.name, is_admin=found.is_admin)


def bearer_key(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header (None for none or another scheme)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        return None
    return credentials.credentials


def get_caller(
    request: Request,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    """The caller behind the bearer key (the guard's lookup, when it made one); 401 when it is
    missing or unknown."""
    known: Caller | None = request.scope.get(SCOPE_KEY, {}).get("caller")
    if known is not None:
        return known
    return lookup_caller(session, bearer_key(credentials))


def rate_counted(request: Request) -> bool:
    """Whether the guard already counted this request against the tenant's submission rate."""
    return bool(request.scope.get(SCOPE_KEY, {}).get("rate_counted"))


def get_admin(caller: Annotated[Caller, Depends(get_caller)]) -> Caller:
    """The caller, when its key is an admin key; 403 otherwise."""
    if not caller.is_admin:
        raise ApiError(403, "Authorization", "this endpoint needs an admin key")
    return caller


TenantDep = Annotated[Caller, Depends(get_caller)]
AdminDep = Annotated[Caller, Depends(get_admin)]
