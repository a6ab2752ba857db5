"""A collection's own system prompt: set and shown by the CLI and the API, read by the pipeline.

The service's ``SPECRAG_SYSTEM_PROMPT`` is the system message of every chat-templated prompt
unless the query's collection stores its own (``collection_settings``).  The setter checks
what it can without the target's tokenizer (not empty, at most ``MAX_SYSTEM_PROMPT_CHARS``);
the worker counts tokens, and a query whose collection's prompt is over the token limit fails
naming the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import CollectionSettings
from retrieval.prompt import check_system_prompt


@dataclass(frozen=True)
class SystemPromptView:
    """What a collection's queries get as system message, and where it comes from."""

    collection: str
    system_prompt: str
    source: str  # "collection" (stored for it) or "settings" (SPECRAG_SYSTEM_PROMPT)

    def to_dict(self) -> dict[str, str]:
        """JSON of the CLI and the API."""
        return {
            "collection": self.collection,
            "system_prompt": self.system_prompt,
            "source": self.source,
        }


def stored_system_prompt(session: Session, tenant_id: int, collection: str) -> str | None:
    """The collection's own system prompt, or None when it uses the service's."""
    return session.scalar(
        select(CollectionSettings.system_prompt).where(
            CollectionSettings.tenant_id == tenant_id,
            CollectionSettings.collection == collection,
        )
    )


def system_prompt_view(
    session: Session, tenant_id: int, collection: str, default: str
) -> SystemPromptView:
    """The system prompt in force for ``collection`` (``default``: the settings' one)."""
    own = stored_system_prompt(session, tenant_id, collection)
    if own is None:
        return SystemPromptView(collection, default, "settings")
    return SystemPromptView(collection, own, "collection")


def set_system_prompt(session: Session, tenant_id: int, collection: str, text: str | None) -> None:
    """Store ``text`` as the collection's system prompt (None: back to the settings' one) and
    commit; ValueError naming the problem (empty, too long) stores nothing."""
    value = check_system_prompt(text) if text is not None else None
    row = session.scalar(
        select(CollectionSettings).where(
            CollectionSettings.tenant_id == tenant_id,
            CollectionSettings.collection == collection,
        )
    )
    if row is None:
        if value is None:
            return
        row = CollectionSettings(tenant_id=tenant_id, collection=collection)
        session.add(row)
    row.system_prompt = value
    session.commit()
