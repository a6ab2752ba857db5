"""``specrag index backfill``: store the vectors (migration 0004) and lexical terms (0008) of older chunks."""

from __future__ import annotations

import sys
from typing import Any

import click
from sqlalchemy import select
from tqdm import tqdm

from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.db import prepare
from retrieval.records import CollectionIndex


@click.group("index")
def index_group() -> None:
    """Retrieval indexes (docs/scaleout.md)."""


@index_group.command("backfill")
@click.option("--collection", "-c", default=None, help="Only this collection (default: all).")
@click.option("--tenant", default=None, help="Only this tenant's collections (default: all).")
@json_option
@one_line_errors
def backfill(collection: str | None, tenant: str | None, as_json: bool) -> None:
    """Store missing chunk vectors (from this host's index files, else embedded) and missing
    lexical terms (analysed from the chunk text), counted per collection."""
    from retrieval import Embedder  # heavy: faiss, torch
    from retrieval.backfill import backfill_collection  # heavy: faiss
    from retrieval.index_store import IndexStore  # heavy: faiss

    settings = get_settings()
    _, session_factory = prepare(settings)
    query = select(CollectionIndex.tenant, CollectionIndex.collection).order_by(
        CollectionIndex.tenant, CollectionIndex.collection
    )
    if tenant is not None:
        query = query.where(CollectionIndex.tenant == tenant)
    if collection is not None:
        query = query.where(CollectionIndex.collection == collection)
    with session_factory() as session:
        targets = session.execute(query).all()
    embedder: list[Any] = []

    def encode(texts: list[str]) -> Any:
        # The model loads only when some chunk is in no index file of this host.
        if not embedder:
            embedder.append(Embedder.shared(settings.embedding_model, device="cpu"))
        return embedder[0].encode(texts)

    store = IndexStore(settings.index_dir)
    results = []
    for t, c in targets:
        # Progress of the lexical terms (every chunk of a pre-0008 collection is analysed).
        with tqdm(unit="chunk", desc=f"terms {t}/{c}", file=sys.stderr, disable=as_json) as bar:
            results.append(backfill_collection(session_factory, store, encode, t, c, bar.update))
    lines = [
        f"{r.tenant}/{r.collection}: {r.from_files} from index files, {r.embedded} embedded, "
        f"{r.terms} lexical terms stored" + (f", centroids {r.centroids}" if r.centroids else "")
        for r in results
    ]
    emit({"collections": [r.to_dict() for r in results]}, as_json,
         "\n".join(lines) or "no collections")  # fmt: skip


COMMANDS = [index_group]
