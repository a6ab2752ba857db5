"""``/v1/collections/{collection}/system-prompt``: a collection's own system prompt
(tenant-scoped): ``GET`` shows the one in force and where it comes from, ``PUT`` stores one,
``DELETE`` goes back to the service's ``SPECRAG_SYSTEM_PROMPT``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from app.api.body import ParsedRoute
from app.api.deps import SessionDep, SettingsDep, TenantDep
from app.api.schemas import ErrorOut
from app.collection_prompts import set_system_prompt, system_prompt_view
from app.lifecycle.queries import require_collection
from app.requests import RequestError

router = APIRouter(prefix="/v1/collections", tags=["collections"], route_class=ParsedRoute)
ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorOut}, 422: {"model": ErrorOut}}


class SystemPromptIn(BaseModel):
    """A collection's own system prompt."""

    model_config = ConfigDict(extra="forbid", strict=True)

    system_prompt: str


@router.get("/{collection}/system-prompt", responses=ERRORS)
def show(collection: str, caller: TenantDep, session: SessionDep, settings: SettingsDep) -> dict:
    """``{"collection", "system_prompt", "source": "collection" | "settings"}``."""
    require_collection(session, caller.tenant, collection)
    return system_prompt_view(
        session, caller.tenant_id, collection, settings.system_prompt
    ).to_dict()


@router.put("/{collection}/system-prompt", responses=ERRORS)
def put(
    collection: str,
    body: SystemPromptIn,
    caller: TenantDep,
    session: SessionDep,
    settings: SettingsDep,
) -> dict:
    """Store the collection's system prompt (not empty, at most 4000 characters)."""
    require_collection(session, caller.tenant, collection)
    try:
        set_system_prompt(session, caller.tenant_id, collection, body.system_prompt)
    except ValueError as exc:
        raise RequestError("system_prompt", str(exc).removeprefix("system prompt: ")) from None
    return system_prompt_view(
        session, caller.tenant_id, collection, settings.system_prompt
    ).to_dict()


@router.delete("/{collection}/system-prompt", responses=ERRORS)
def clear(collection: str, caller: TenantDep, session: SessionDep, settings: SettingsDep) -> dict:
    """Forget the collection's own system prompt: its queries get the service's again."""
    require_collection(session, caller.tenant, collection)
    set_system_prompt(session, caller.tenant_id, collection, None)
    return system_prompt_view(
        session, caller.tenant_id, collection, settings.system_prompt
    ).to_dict()
