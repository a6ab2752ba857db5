"""Grounding an answered query from what its record holds, and storing the result.

The answer text and the passages it was given are read back from ``answers`` and
``answer_sources`` (the passages as copied there, in citation order), so grounding needs nothing
from the run that produced them and can follow the commit that made the query ``succeeded``.
The fused scorer's passage vectors are read from the sources' chunks, where ingest stored them
(retrieval.grounding.stored): grounding an answer encodes only its own sentences.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from app.db import Answer, AnswerGrounding
from app.lifecycle.queries import poll_query
from retrieval.grounding import FusedScorer, Grounding, SupportScorer, ground
from retrieval.grounding.stored import store_vectors, stored_vectors

log = logging.getLogger(__name__)


def ground_stored(
    session_factory: sessionmaker[Session], scorer: SupportScorer, query_id: uuid.UUID
) -> AnswerGrounding | None:
    """The stored grounding of the query's answer, computed and stored now unless it is there;
    None when the query has no answer (failed, or deleted meanwhile)."""
    with session_factory() as session:
        found = session.scalar(select(AnswerGrounding).where(AnswerGrounding.query_id == query_id))
        if found is not None:
            return found
        answer = session.scalar(
            select(Answer).where(Answer.query_id == query_id).options(selectinload(Answer.sources))
        )
        if answer is None:
            return None
        text, passages = answer.text, [s.text for s in answer.sources]
        started = time.perf_counter()
        known = passage_vectors(session, scorer, [(s.chunk_id, s.text) for s in answer.sources])
    result = ground(text, passages, scorer, known)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    return store(session_factory, query_id, result, elapsed_ms)


def passage_vectors(
    session: Session, scorer: SupportScorer, sources: list[tuple[int, str]]
) -> dict[str, bytes] | None:
    """The stored vectors of the sources' passages (retrieval.grounding.stored), those missing
    encoded and stored now (committed), so the next answer citing them finds them; None for a
    scorer that needs none (a cross-encoder). ``sources``: (chunk id, passage text) pairs."""
    if not isinstance(scorer, FusedScorer) or not sources:
        return None
    known = stored_vectors(session, sources)
    missing = {cid: text for cid, text in sources if text not in known}
    if missing:
        texts = list(dict.fromkeys(missing.values()))
        blobs = {t: v.to_bytes() for t, v in zip(texts, scorer.passage_vectors(texts), strict=True)}
        store_vectors(session, {cid: (text, blobs[text]) for cid, text in missing.items()})
        session.commit()
        known.update(blobs)
    return known


def store(
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    result: Grounding,
    grounding_ms: float,
) -> AnswerGrounding | None:
    """Store ``result`` for the query (the first one stored wins: a re-run task keeps it)."""
    data: dict[str, Any] = result.to_dict()
    row = AnswerGrounding(
        query_id=query_id,
        groundedness=result.groundedness,
        citation_precision=result.citation_precision,
        citation_recall=result.citation_recall,
        reason=result.reason,
        scorer=result.scorer or "unknown",
        threshold=float(result.threshold or 0.0),
        num_sentences=len(result.sentences),
        sentences=data["sentences"],
        grounding_ms=grounding_ms,
    )
    with session_factory() as session:
        session.add(row)
        try:
            session.commit()
        except IntegrityError:
            session.rollback()  # stored by another run of the same query, or the query is gone
            log.info("grounding of query %s not stored: present already or query gone", query_id)
            return session.scalar(
                select(AnswerGrounding).where(AnswerGrounding.query_id == query_id)
            )
        # Nothing to read back: ``id`` came back with the insert and ``created_at`` is set here.
        session.expunge(row)
    return row


def wait_for_grounding(
    session_factory: sessionmaker[Session], query_id: uuid.UUID, timeout: float, poll: float = 0.1
) -> Any:
    """The succeeded query (``app.lifecycle.queries.get_query``) once its grounding is stored, or as it
    is after ``timeout`` seconds (a worker with grounding off never stores one)."""
    return poll_query(
        session_factory,
        query_id,
        timeout,
        lambda q: getattr(q, "grounding", None) is not None,
        poll,
    )
