"""``specrag collections system-prompt``: show or set a collection's own system prompt."""

from __future__ import annotations

import click

from app.collection_prompts import set_system_prompt, system_prompt_view
from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.db import prepare
from app.lifecycle.queries import get_or_create_tenant, require_collection


@click.group("collections")
def collections() -> None:
    """Collections: the settings one collection overrides."""


@collections.command("system-prompt")
@click.argument("collection")
@click.option("--tenant", default="default", show_default=True, help="Tenant that owns it.")
@click.option("--set", "text", default=None, help="Store this as the collection's system prompt.")
@click.option("--clear", is_flag=True, help="Back to the service's SPECRAG_SYSTEM_PROMPT.")
@json_option
@one_line_errors
def system_prompt(
    collection: str, tenant: str, text: str | None, clear: bool, as_json: bool
) -> None:
    """Print the system prompt COLLECTION's queries get (the chat template's system message)
    and where it comes from; --set or --clear change it first."""
    if text is not None and clear:
        raise ValueError("--set and --clear: give one of them")
    settings = get_settings()
    engine, session_factory = prepare(settings)
    try:
        with session_factory() as session:
            require_collection(session, tenant, collection)
            tenant_id = get_or_create_tenant(session, tenant).id
            if text is not None or clear:
                try:
                    set_system_prompt(session, tenant_id, collection, None if clear else text)
                except ValueError as exc:
                    raise ValueError(f"--set: {exc}") from None
            view = system_prompt_view(session, tenant_id, collection, settings.system_prompt)
    finally:
        engine.dispose()
    emit(view.to_dict(), as_json, text=f"{view.system_prompt}\n(from the {view.source})")


COMMANDS = [collections]
