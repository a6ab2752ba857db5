"""Retrieval: files in, numbered passages out.

Ingest (load → chunk → embed → FAISS per tenant and collection), tenant-scoped search, and the
prompt builder that numbers the passages for citation.
"""

from retrieval.embedder import Embedder
from retrieval.errors import (
    CollectionLimitError,
    DocumentError,
    InvalidNameError,
    QueryError,
    UnknownCollectionError,
)
from retrieval.prompt import Passage, build_prompt, format_prompt
from retrieval.results import FileResult, IngestReport, SearchHit
from retrieval.service import RetrievalService, open_retrieval

__all__ = [
    "CollectionLimitError",
    "DocumentError",
    "Embedder",
    "FileResult",
    "IngestReport",
    "InvalidNameError",
    "Passage",
    "QueryError",
    "RetrievalService",
    "SearchHit",
    "UnknownCollectionError",
    "build_prompt",
    "format_prompt",
    "open_retrieval",
]
