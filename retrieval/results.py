"""What retrieval hands back: search hits and the per-file summary of an ingest.

Plain dataclasses with ``to_dict()`` so that the CLI, the API and the pipeline share one JSON
shape (CONTRACT.md: ``document``, ``chunk_id``, ``score``, ``text``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FileStatus = Literal["added", "updated", "unchanged", "deleted", "failed"]


@dataclass(frozen=True)
class SearchHit:
    """One retrieved passage: its source document (path as given), chunk id, score and text,
    and where each search leg ranked it (so an admin can see why it came back)."""

    document: str
    chunk_id: int
    score: float
    text: str
    title: str
    heading: str | None
    position: int
    index_version: int | None = None
    """Version of the collection's index the hit was found in (recorded with every answer)."""
    dense_rank: int | None = None
    """Rank (from 1) in the dense (FAISS) leg's candidates; None: not among them."""
    lexical_rank: int | None = None
    """Rank (from 1) in the lexical (BM25) leg's candidates; None: not among them."""
    dense_score: float | None = None
    """Cosine similarity in the dense leg (``score`` is the fused score in hybrid mode)."""
    lexical_score: float | None = None
    """BM25 score in the lexical leg."""

    @property
    def passage_title(self) -> str:
        """``"<document title> — <heading>"``, or just the title when there is no heading."""
        if self.heading and self.heading != self.title:
            return f"{self.title} — {self.heading}"
        return self.title

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of a search result."""
        return asdict(self)


@dataclass(frozen=True)
class FileResult:
    """What happened to one file of an ingest."""

    source: str
    status: FileStatus
    chunks: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON shape; ``error`` only for failed files."""
        data: dict[str, Any] = {"source": self.source, "status": self.status, "chunks": self.chunks}
        if self.error is not None:
            data["error"] = self.error
        return data


@dataclass
class IngestReport:
    """Per-file outcome of one ingest call, plus the collection's index version afterwards."""

    tenant: str
    collection: str
    files: list[FileResult] = field(default_factory=list)
    index_version: int | None = None
    seconds: float = 0.0

    def count(self, status: FileStatus) -> int:
        """How many files ended with ``status``."""
        return sum(1 for f in self.files if f.status == status)

    @property
    def ok(self) -> bool:
        """True when no file failed."""
        return self.count("failed") == 0

    def to_dict(self) -> dict[str, Any]:
        """JSON summary: totals per status and one entry per file."""
        statuses: tuple[FileStatus, ...] = ("added", "updated", "unchanged", "deleted", "failed")
        return {
            "tenant": self.tenant,
            "collection": self.collection,
            "index_version": self.index_version,
            "seconds": round(self.seconds, 3),
            "chunks": sum(f.chunks for f in self.files if f.status in ("added", "updated")),
            **{s: self.count(s) for s in statuses},
            "files": [f.to_dict() for f in self.files],
        }
