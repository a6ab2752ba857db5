"""``specrag index backfill | verify``: store older chunks' vectors (migration 0004) and lexical
terms (0008); check this host's index files and rebuild damaged ones from the database."""

from __future__ import annotations

import sys
from typing import Any

import click
from sqlalchemy import select
from tqdm import tqdm

from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.db import prepare
from retrieval.records import CollectionIndex


def _collections(session_factory: Any, tenant: str | None, collection: str | None) -> list[Any]:
    """(tenant, collection) rows of the collections named, in order; all when neither is given."""
    query = select(CollectionIndex.tenant, CollectionIndex.collection).order_by(
        CollectionIndex.tenant, CollectionIndex.collection
    )
    if tenant is not None:
        query = query.where(CollectionIndex.tenant == tenant)
    if collection is not None:
        query = query.where(CollectionIndex.collection == collection)
    with session_factory() as session:
        return list(session.execute(query).all())


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
    targets = _collections(session_factory, tenant, collection)
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


@index_group.command("verify")
@click.option("--collection", "-c", default=None, help="Only this collection (default: all).")
@click.option("--tenant", default=None, help="Only this tenant's collections (default: all).")
@click.option("--no-repair", is_flag=True, help="Only report; remove and rebuild nothing.")
@json_option
@one_line_errors
def verify(collection: str | None, tenant: str | None, no_repair: bool, as_json: bool) -> None:
    """Check every index file of this host (FAISS checksums, lexical CRCs); damaged ones are
    logged, removed and rebuilt from the database's vectors. Exit status 1 when damage remains
    (with --no-repair, when any was found)."""
    from retrieval.host_indexes import HostIndexes  # heavy: faiss
    from retrieval.index_store import IndexStore  # heavy: faiss
    from retrieval.verify import verify_collection  # heavy: faiss, tantivy

    settings = get_settings()
    _, session_factory = prepare(settings)
    targets = _collections(session_factory, tenant, collection)
    indexes = HostIndexes(session_factory, IndexStore(settings.index_dir), max_held=1)
    results = []
    for t, c in tqdm(targets, unit="collection", desc="verify", file=sys.stderr, disable=as_json):
        results.append(verify_collection(indexes, t, c, repair=not no_repair))
    damaged = [(r, f) for r in results for f in r.damaged]
    lines = [
        f"{r.tenant}/{r.collection} {f.leg} v{f.version}: {f.problem}"
        + ("; rebuilt" if r.rebuilt else "; not repaired")
        for r, f in damaged
    ]
    checked = sum(len(r.checked) for r in results)
    lines.append(f"{checked} index files of {len(results)} collections checked, "
                 f"{len(damaged)} damaged")  # fmt: skip
    emit({"collections": [r.to_dict() for r in results], "checked": checked,
          "damaged": len(damaged)}, as_json, "\n".join(lines))  # fmt: skip
    if any(r.damaged and not r.rebuilt for r in results):
        raise SystemExit(1)


COMMANDS = [index_group]
