"""RetrievalService: ingest files, delete them, and search one tenant's collection.

(Skeleton: the public signatures are fixed; the bodies land next.)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from retrieval.embedder import Embedder
from retrieval.results import IngestReport, SearchHit


class RetrievalService:
    """Tenant-scoped ingest, delete and search over per-collection FAISS indexes."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        index_dir: str | Path,
        embedder: Embedder,
        *,
        chunk_tokens: int = 224,
        chunk_overlap: int = 32,
        max_file_bytes: int = 20 * 1024 * 1024,
        approx_index_threshold: int = 200_000,
        max_query_chars: int = 2000,
    ) -> None:
        self.session_factory = session_factory
        self.index_dir = Path(index_dir)
        self.embedder = embedder

    def ingest(
        self,
        paths: Iterable[str | Path],
        *,
        collection: str,
        tenant: str = "default",
        progress: bool = False,
    ) -> IngestReport:
        """Per-file outcome of ingesting files or folders into the tenant's collection."""
        raise NotImplementedError

    def delete(self, source: str, *, collection: str, tenant: str = "default") -> bool:
        """True when the document was found and removed from the database and the index."""
        raise NotImplementedError

    def search(
        self, question: str, *, collection: str, tenant: str = "default", top_k: int = 3
    ) -> list[SearchHit]:
        """The ``top_k`` best passages of the tenant's collection, best first."""
        raise NotImplementedError

    def index_version(self, *, collection: str, tenant: str = "default") -> int | None:
        """The collection's current index version, or None when it does not exist."""
        raise NotImplementedError
