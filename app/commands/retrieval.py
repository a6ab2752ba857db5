"""``specrag ingest | search | delete | eval retrieval``: the retrieval layer from the shell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from app.commands.common import CommandError, emit, get_settings, json_option, one_line_errors
from app.db import prepare
from app.tenancy.collections import collection_limit
from retrieval import Embedder, RetrievalService
from retrieval.errors import check_name

if TYPE_CHECKING:
    from retrieval import RetrievalService

collection_option = click.option("--collection", "-c", required=True, help="Collection name.")
tenant_option = click.option("--tenant", default="default", show_default=True, help="Tenant name.")
# The choices are retrieval.fusion.SEARCH_MODES (not imported here: the CLI starts without faiss).
mode_option = click.option(
    "--mode",
    type=click.Choice(["hybrid", "dense", "lexical"]),
    default=None,
    help="hybrid: dense and lexical legs fused; dense: FAISS only; lexical: BM25 only "
    "(default: SPECRAG_SEARCH_MODE, hybrid).",
)


def _service(tenant: str, collection: str) -> RetrievalService:
    """The retrieval service on the configured database (schema made current) and data dir,
    once ``tenant`` and ``collection`` are usable names (InvalidNameError naming the problem,
    before the embedding model loads)."""
    check_name("tenant", tenant)
    check_name("collection", collection)
    settings = get_settings()
    _, session_factory = prepare(settings)
    device = "cuda" if settings.device == "cuda" else "cpu"
    return RetrievalService(
        session_factory,
        settings.index_dir,
        Embedder.shared(settings.embedding_model, device=device),
        chunk_tokens=settings.chunk_tokens,
        chunk_overlap=settings.chunk_overlap,
        max_file_bytes=settings.max_file_bytes,
        approx_index_threshold=settings.approx_index_threshold,
        max_query_chars=settings.max_question_chars,
        max_collections=collection_limit(session_factory, settings),
        all_terms_bonus=settings.all_terms_bonus,
    )


@click.command()
@click.argument("paths", nargs=-1, required=True)
@collection_option
@tenant_option
@json_option
@one_line_errors
def ingest(paths: tuple[str, ...], collection: str, tenant: str, as_json: bool) -> None:
    """Ingest files or folders (.txt, .md, .html, .pdf); exit status 1 when any file failed."""
    report = _service(tenant, collection).ingest(
        paths, collection=collection, tenant=tenant, progress=True
    )
    data = report.to_dict()
    lines = []
    for f in report.files:
        detail = f"error: {f.error}" if f.error else f"{f.chunks} chunks"
        lines.append(f"{f.status:<9} {f.source}  ({detail})")
    totals = ", ".join(
        f"{data[s]} {s}" for s in ("added", "updated", "unchanged", "deleted", "failed")
    )
    lines.append(f"{collection} (tenant {tenant}): {totals}; index version {report.index_version}")
    emit(data, as_json, "\n".join(lines))
    if not report.ok:
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("question")
@collection_option
@click.option("--top-k", type=int, default=None, help="Passages to return (default: settings).")
@tenant_option
@mode_option
@json_option
@one_line_errors
def search(
    question: str, collection: str, top_k: int | None, tenant: str, mode: str | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Retrieval only: the best passages for QUESTION, best first, with each leg's rank."""
    k = top_k if top_k is not None else get_settings().default_top_k
    mode = mode or get_settings().search_mode
    service = _service(tenant, collection)
    hits = service.search(question, collection=collection, tenant=tenant, top_k=k, mode=mode)  # type: ignore[arg-type]
    data = {"mode": mode, "results": [h.to_dict() for h in hits]}
    lines = [f"[{i}] {h.score:.3f}  {h.document}  ({h.passage_title})  dense #{_rank(h.dense_rank)}"
             f" lexical #{_rank(h.lexical_rank)}\n    {h.text[:300]!r}"
             for i, h in enumerate(hits, start=1)]  # fmt: skip
    emit(data, as_json, "\n".join(lines) or "no results")


def _rank(rank: int | None) -> str:
    return "-" if rank is None else str(rank)


@click.command()
@click.argument("source")
@collection_option
@tenant_option
@json_option
@one_line_errors
def delete(source: str, collection: str, tenant: str, as_json: bool) -> None:
    """Remove the document ingested from SOURCE (its path as given) from index and database."""
    service = _service(tenant, collection)
    if not service.delete(source, collection=collection, tenant=tenant):
        raise CommandError(
            f"no document {source!r} in collection {collection!r} of tenant {tenant!r}"
        )
    version = service.index_version(collection=collection, tenant=tenant)
    emit(
        {"deleted": True, "source": source, "index_version": version}, as_json, f"deleted {source}"
    )


@click.group("eval")
def eval_group() -> None:
    """Measure quality against a labelled set."""


def read_golden(path: Path) -> list[dict[str, str]]:
    """The ``{"question", "expected_source"}`` lines of a JSONL file; every bad line named."""
    items: list[dict[str, str]] = []
    problems: list[str] = []
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not JSON ({exc.msg})")
            continue
        fields = ("question", "expected_source")
        if not isinstance(item, dict) or not all(
            isinstance(item.get(f), str) and item[f].strip() for f in fields
        ):
            problems.append(f"line {number}: needs non-empty string fields {', '.join(fields)}")
            continue
        items.append({f: item[f] for f in fields})
    if problems:
        raise CommandError(f"{path}: {len(problems)} malformed line(s): " + "; ".join(problems[:5]))
    if not items:
        raise CommandError(f"{path}: no questions")
    return items


@eval_group.command("retrieval")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@collection_option
@click.option("--top-k", "k", type=int, default=5, show_default=True, help="Cut-off k.")
@tenant_option
@mode_option
@json_option
@one_line_errors
def eval_retrieval(
    file: Path, collection: str, k: int, tenant: str, mode: str | None, as_json: bool
) -> None:
    """Recall@k and MRR of search on FILE.jsonl ({"question", "expected_source"} per line)."""
    mode = mode or get_settings().search_mode
    items = read_golden(file)
    service = _service(tenant, collection)
    found, reciprocal = 0, 0.0
    misses: list[dict[str, Any]] = []
    for item in items:
        hits = service.search(item["question"], collection=collection, tenant=tenant, top_k=k,
                              mode=mode)  # type: ignore[arg-type]  # fmt: skip
        rank = next(
            (i for i, h in enumerate(hits, 1) if h.document.endswith(item["expected_source"])), None
        )
        if rank is None:
            misses.append({**item, "got": [h.document for h in hits]})
        else:
            found += 1
            reciprocal += 1.0 / rank
    n = len(items)
    data = {"n": n, "k": k, "mode": mode, "recall_at_k": found / n, "mrr": reciprocal / n,
            "misses": misses}  # fmt: skip
    text = (f"mode={mode}  n={n}  recall@{k}={found / n:.3f}  mrr={reciprocal / n:.3f}  "
            f"misses={len(misses)}")  # fmt: skip
    emit(data, as_json, text)


COMMANDS = [ingest, search, delete, eval_group]
