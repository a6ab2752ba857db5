"""``specrag draft dataset``: a draft's training set from the stored traffic of a time window.

Each item is one succeeded query: the exact prompt ids the target saw and the target's output
ids, both stored at answer time (app/drafts/records.py says why they are stored, not rebuilt).
Only queries whose question is kept in clear contribute: a query stored hashed or redacted
(``store_questions``, app/privacy.py) is counted, never read. Traffic only: the checks the audit
keeps apart (``local``, ``golden``, ``benchmark`` sources) are left out.

The held-out split is by query: a seeded hash of each query id orders the items and the first
``heldout`` fraction of that order is held out, so the same window always splits alike.

Written to ``OUT``: ``train.jsonl`` and ``heldout.jsonl`` (one item a line) and
``manifest.json`` (window, filters, counts, which queries went where, what was left out).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.audit.window import Window
from app.db.models import Answer, Query, Tenant
from app.drafts.records import AnswerTokens
from app.privacy import kept_in_clear

FORMAT = "specrag-draft-dataset/1"
TRAFFIC_SOURCES = ("api", "cli", "batch")
"""Who asked, for a query to count as traffic (the checks' sources are left out)."""
MIN_ITEMS = 50


class DatasetError(ValueError):
    """The window cannot make a training set (too few items, bad filters)."""


@dataclass(frozen=True)
class Filters:
    """Which traffic of the window goes in (None: all)."""

    tenants: tuple[str, ...] | None = None
    collections: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None


def split_key(query_id: str, seed: int) -> str:
    """The seeded order of the held-out split: a hash of the query id."""
    return hashlib.sha256(f"{seed}:{query_id}".encode()).hexdigest()


def _scope(stmt: Any, window: Window, filters: Filters) -> Any:
    stmt = stmt.where(
        Query.status == "succeeded",
        Query.source.in_(TRAFFIC_SOURCES),
        Query.done_at >= window.since,
        Query.done_at < window.until,
    )
    if filters.tenants:
        stmt = stmt.where(Tenant.name.in_(filters.tenants))
    if filters.collections:
        stmt = stmt.where(Query.collection.in_(filters.collections))
    return stmt


def collect(
    session: Session, window: Window, filters: Filters
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The window's usable items and the counts of what was left out, and why.

    Queries whose question is not kept in clear are counted by one aggregate and their rows are
    never selected: neither their question nor any token id leaves the database.
    """
    base = select(func.count()).select_from(Query).join(Tenant, Tenant.id == Query.tenant_id)
    private = session.scalar(_scope(base, window, filters).where(~kept_in_clear())) or 0
    stmt = (
        select(Query, Tenant.name, Answer.model_pair, AnswerTokens)
        .join(Tenant, Tenant.id == Query.tenant_id)
        .join(Answer, Answer.query_id == Query.id)
        .outerjoin(AnswerTokens, AnswerTokens.query_id == Query.id)
        .where(kept_in_clear())
    )
    items: list[dict[str, Any]] = []
    left = Counter[str]()
    for query, tenant, pair, tokens in session.execute(_scope(stmt, window, filters)):
        method = str((query.params or {}).get("method", ""))
        if filters.methods and method not in filters.methods:
            continue
        if tokens is None:
            left["no_token_ids"] += 1  # answered before 0016, or with store_token_ids off
            continue
        params = query.params or {}
        items.append(
            {
                "query_id": str(query.id),
                "tenant": tenant,
                "collection": query.collection,
                "method": method,
                "temperature": float(params.get("temperature") or 0.0),
                "max_tokens": int(params.get("max_tokens") or len(tokens.output_token_ids)),
                "model_pair": pair,
                "done_at": query.done_at.isoformat() if query.done_at else None,
                "prompt_ids": list(tokens.prompt_token_ids),
                "output_ids": list(tokens.output_token_ids),
            }
        )
    return items, {"privacy": int(private), "no_token_ids": left["no_token_ids"]}


def split(
    items: list[dict[str, Any]], heldout: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) by query, the held-out share ``heldout`` of the seeded order."""
    if not 0.0 < heldout < 1.0:
        raise DatasetError(f"heldout: {heldout} must lie strictly between 0 and 1")
    ordered = sorted(items, key=lambda it: split_key(it["query_id"], seed))
    n_held = max(1, round(len(ordered) * heldout))
    return ordered[n_held:], ordered[:n_held]


def build_dataset(
    session: Session,
    out: Path,
    window: Window,
    filters: Filters = Filters(),
    *,
    heldout: float = 0.25,
    seed: int = 0,
    min_items: int = MIN_ITEMS,
) -> dict[str, Any]:
    """Write the window's training set to ``out``; returns its manifest.

    Raises DatasetError naming how many items were found and how many are needed when the
    window holds fewer than ``min_items``.
    """
    items, left_out = collect(session, window, filters)
    if len(items) < max(min_items, 2):
        raise DatasetError(
            f"the window [{window.since.isoformat()}, {window.until.isoformat()}) holds "
            f"{len(items)} usable answers (succeeded traffic with stored token ids, questions "
            f"kept in clear); at least {max(min_items, 2)} are needed (--min-items); left out: "
            f"{left_out['privacy']} for privacy, {left_out['no_token_ids']} without token ids"
        )
    train, held = split(items, heldout, seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("heldout", held)):
        tmp = out / f"{name}.jsonl.partial"
        with tmp.open("w", encoding="utf-8") as f:
            for it in rows:
                f.write(json.dumps(it) + "\n")
        os.replace(tmp, out / f"{name}.jsonl")
    manifest = {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "window": {"since": window.since.isoformat(), "until": window.until.isoformat()},
        "filters": {
            "tenants": list(filters.tenants or []),
            "collections": list(filters.collections or []),
            "methods": list(filters.methods or []),
        },
        "seed": seed,
        "heldout_fraction": heldout,
        "items": len(items),
        "train_items": len(train),
        "heldout_items": len(held),
        "train_tokens": sum(len(i["output_ids"]) for i in train),
        "left_out": left_out,
        "model_pairs": sorted({str(i["model_pair"]) for i in items}),
        "queries": {
            "train": [i["query_id"] for i in train],
            "heldout": [i["query_id"] for i in held],
        },
    }
    write_json(out / "manifest.json", manifest)
    return manifest


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (beside it, then moved over)."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def load_items(path: Path) -> list[dict[str, Any]]:
    """The items of one ``.jsonl`` split."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def read_manifest(dataset: Path) -> dict[str, Any]:
    """A dataset directory's manifest; DatasetError when it is not one."""
    path = dataset / "manifest.json"
    if not path.is_file():
        raise DatasetError(f"{dataset}: no manifest.json; make one with `specrag draft dataset`")
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise DatasetError(f"{dataset}: manifest format {manifest.get('format')!r}, not {FORMAT}")
    return manifest
