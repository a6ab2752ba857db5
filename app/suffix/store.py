"""What the suffix trees may hold, read from the database: the stored answers of each scope.

A scope is one tenant's collection (``scope_of``): a tree never mixes tenants, so no tenant's
drafts (nor their acceptance speed) can tell it what another tenant asked. An answer qualifies
when its token ids were stored (app/drafts/hooks.py) and its question is kept in clear: a query
stored hashed or redacted, or scrubbed later (app/privacy.py), contributes nothing. Recency is
the stored row's id, so "the most recent N of a scope" is the same set for every worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Query
from app.drafts.records import AnswerTokens
from app.privacy import kept_in_clear


def scope_of(tenant_id: int, collection: str) -> str:
    """The suffix scope of a tenant's collection (the tenant id first: never ambiguous)."""
    return f"{tenant_id}/{collection}"


@dataclass(frozen=True)
class StoredAnswer:
    """One answer the trees may hold: where it belongs, its output and prompt token ids
    (unchecked)."""

    query_id: uuid.UUID
    row_id: int
    """``answer_token_ids.id``: the recency order within a scope."""
    scope: str
    token_ids: object
    """The stored JSON as read: the trees check it (``SuffixMemory.add`` refuses a bad list)."""
    prompt_token_ids: object = None
    """The prompt's stored JSON as read (unchecked, like ``token_ids``)."""

    def held_tokens(self, prompt_tokens: int) -> object:
        """What the trees hold of this answer: the last ``prompt_tokens`` of its prompt, then
        its output. A repeated question ends its prompt the same way (question, passages, the
        chat template's turn), so its first draft already matches that far and the answer is
        proposed from the first token on; without them a draft can only grow with the output
        matched (one token, then two, four...). A prompt that is not a list is handed on as it
        is, for the trees to refuse and log."""
        prompt, output = self.prompt_token_ids, self.token_ids
        if prompt_tokens == 0:
            return output
        if not isinstance(prompt, list):
            return prompt
        if not isinstance(output, list):
            return output
        return prompt[-prompt_tokens:] + output


@dataclass(frozen=True)
class Held:
    """Which answer an id names, without its tokens (what a sync compares)."""

    query_id: uuid.UUID
    row_id: int
    scope: str


def recent_ids(session: Session, max_per_scope: int) -> list[Held]:
    """The most recent ``max_per_scope`` qualifying answers of every scope (ids only)."""
    ranked = (
        select(
            AnswerTokens.query_id.label("query_id"),
            AnswerTokens.id.label("row_id"),
            Query.tenant_id.label("tenant_id"),
            Query.collection.label("collection"),
            func.row_number()
            .over(
                partition_by=(Query.tenant_id, Query.collection),
                order_by=AnswerTokens.id.desc(),
            )
            .label("rank"),
        )
        .join(Query, Query.id == AnswerTokens.query_id)
        .where(kept_in_clear(), Query.status == "succeeded")
        .subquery()
    )
    rows = session.execute(
        select(ranked.c.query_id, ranked.c.row_id, ranked.c.tenant_id, ranked.c.collection).where(
            ranked.c.rank <= max_per_scope
        )
    )
    return [Held(r.query_id, r.row_id, scope_of(r.tenant_id, r.collection)) for r in rows]


def answers(session: Session, query_ids: Iterable[uuid.UUID]) -> list[StoredAnswer]:
    """The qualifying stored answers among ``query_ids`` (others are left out), oldest first."""
    wanted = list(query_ids)
    if not wanted:
        return []
    rows = session.execute(
        select(
            AnswerTokens.query_id,
            AnswerTokens.id,
            AnswerTokens.output_token_ids,
            AnswerTokens.prompt_token_ids,
            Query.tenant_id,
            Query.collection,
        )
        .join(Query, Query.id == AnswerTokens.query_id)
        .where(AnswerTokens.query_id.in_(wanted), kept_in_clear(), Query.status == "succeeded")
        .order_by(AnswerTokens.id)
    )
    return [
        StoredAnswer(
            r.query_id,
            r.id,
            scope_of(r.tenant_id, r.collection),
            r.output_token_ids,
            r.prompt_token_ids,
        )
        for r in rows
    ]
