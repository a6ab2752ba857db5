"""The grounding vectors stored with the chunks: read for an answer's sources, written for the
chunks that have none.

It exists so that no answer pays for encoding its passages: ingest stores each chunk's vectors
(``RetrievalService(grounding_vectors=True)``), an answer reads them by the chunk ids of its
sources, and a passage found without them is encoded once and stored, so the next answer that
cites it (on any worker) finds them. A source's text is a copy of its chunk's (app/db
``AnswerSource``): stored vectors are used only while the chunk still holds that very text, under
the current ``LAYOUT``. ``backfill`` fills in the chunks ingested without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from retrieval.grounding.passages import LAYOUT, Encoder, encode_passages
from retrieval.records import Chunk, Document

log = logging.getLogger(__name__)
BACKFILL_BATCH = 64
"""Chunks encoded and committed together by ``backfill``."""


def stored_vectors(session: Session, sources: Sequence[tuple[int, str]]) -> dict[str, bytes]:
    """By passage text, the vectors stored for ``(chunk id, passage text)`` pairs whose chunk
    still holds that text under ``LAYOUT`` (the others are absent)."""
    wanted = dict(sources)
    if not wanted:
        return {}
    rows = session.execute(
        select(Chunk.id, Chunk.text, Chunk.grounding_vectors).where(
            Chunk.id.in_(wanted), Chunk.grounding_layout == LAYOUT
        )
    )
    return {text: blob for cid, text, blob in rows if blob and wanted.get(cid) == text}


def store_vectors(session: Session, vectors: Mapping[int, tuple[str, bytes]]) -> int:
    """Store ``chunk id -> (passage text, vectors)`` where the chunk still holds that text; how
    many chunks took them (the caller commits)."""
    if not vectors:
        return 0
    result = session.connection().execute(
        update(Chunk.__table__)  # type: ignore[arg-type]
        .where(Chunk.id == bindparam("cid"), Chunk.text == bindparam("passage"))
        .values(grounding_vectors=bindparam("blob"), grounding_layout=LAYOUT),
        [{"cid": cid, "passage": text, "blob": blob} for cid, (text, blob) in vectors.items()],
    )
    return int(result.rowcount or 0)


@dataclass
class GroundingBackfill:
    """What a backfill stored: chunks given vectors, in how many collections."""

    chunks: int = 0
    collections: int = 0

    def to_dict(self) -> dict[str, int]:
        """JSON shape for the CLI."""
        return dict(vars(self))


def backfill(
    session_factory: sessionmaker[Session],
    encoder: Encoder,
    tenant: str | None = None,
    collection: str | None = None,
    progress: Callable[[int], object] | None = None,
) -> GroundingBackfill:
    """Store the vectors of every chunk without them (or with another ``LAYOUT``'s), in
    ``BACKFILL_BATCH`` chunks per transaction; ``tenant``/``collection`` narrow it down."""
    missing = or_(Chunk.grounding_layout.is_(None), Chunk.grounding_layout != LAYOUT)
    where = [missing]
    if tenant is not None:
        where.append(Document.tenant == tenant)
    if collection is not None:
        where.append(Document.collection == collection)
    done = GroundingBackfill()
    seen: set[tuple[str, str]] = set()
    after = 0
    while True:
        with session_factory() as session:
            rows = session.execute(
                select(Chunk.id, Chunk.text, Document.tenant, Document.collection)
                .join(Document, Document.id == Chunk.document_id)
                .where(and_(*where), Chunk.id > after)
                .order_by(Chunk.id)
                .limit(BACKFILL_BATCH)
            ).all()
            if not rows:
                break
            found = encode_passages(encoder, [r.text for r in rows])
            done.chunks += store_vectors(
                session, {r.id: (r.text, v.to_bytes()) for r, v in zip(rows, found, strict=True)}
            )
            session.commit()
        seen |= {(r.tenant, r.collection) for r in rows}
        after = rows[-1].id
        if progress is not None:
            progress(len(rows))
    done.collections = len(seen)
    log.info("grounding backfill: %d chunks in %d collections", done.chunks, done.collections)
    return done
