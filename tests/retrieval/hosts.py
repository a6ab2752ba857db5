"""Helpers for multi-host tests: an embedder that counts its calls, hosts on one database."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from retrieval import Embedder, RetrievalService
from retrieval.records import CollectionIndex


class CountingEmbedder:
    """The real embedder, counting how many texts each host asked it to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.texts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """The inner model's vectors; every text counted."""
        self.texts += len(texts)
        return self.inner.encode(texts, batch_size)


HostFactory = Callable[..., RetrievalService]


def host_factory(
    session_factory: sessionmaker[Session], embedder: Embedder, root: Path
) -> HostFactory:
    """``make(name)``: a service with its own data directory ``root/name`` (a host) on the
    shared database and its own counting embedder (``service.embedder.texts``)."""

    def make(name: str, **kwargs: Any) -> RetrievalService:
        counting: Any = CountingEmbedder(embedder)
        return RetrievalService(session_factory, root / name / "indexes", counting, **kwargs)

    return make


def row(service: RetrievalService, tenant: str, collection: str) -> tuple[int, Any, int]:
    """``(version, updated_at, layout_version)`` of the collection as committed."""
    with service.session_factory() as session:
        found = session.execute(
            select(
                CollectionIndex.version, CollectionIndex.updated_at, CollectionIndex.layout_version
            ).where(CollectionIndex.tenant == tenant, CollectionIndex.collection == collection)
        ).one()
    return found[0], found[1], found[2]


def answers(service: RetrievalService, questions: list[str], tenant: str, collection: str,
            top_k: int = 5) -> list[list[tuple[str, int, float, str, int | None]]]:  # fmt: skip
    """Every question's hits as comparable tuples (document, chunk, score, text, version)."""
    return [
        [
            (h.document, h.chunk_id, h.score, h.text, h.index_version)
            for h in service.search(q, collection=collection, tenant=tenant, top_k=top_k)
        ]  # fmt: skip
        for q in questions
    ]
