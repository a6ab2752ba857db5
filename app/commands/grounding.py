"""``specrag grounding check FILE.jsonl``: the grounding of given answers against given passages;
``specrag grounding backfill``: the fused scorer's passage vectors for chunks ingested without them.

Each input line is ``{"answer": str, "passages": [str, ...]}``; each output line, in order, is
``{"groundedness", "sentences": [{"text", "start", "end", "score", "supported_by"}], ...}`` with
the citation shares and the reason beside (docs/grounding.md). Every line is read and checked
before anything is scored or printed: a line that does not parse is a one-line error naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from app.commands.common import CommandError, emit, get_settings, json_option, one_line_errors


@click.group("grounding")
def grounding_group() -> None:
    """Grounding of answers in their passages (docs/grounding.md)."""


def read_pairs(path: Path) -> list[tuple[str, list[str]]]:
    """``(answer, passages)`` of every line of ``path``; ValueError naming the first bad line."""
    pairs = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                item: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {number}: not JSON ({exc.msg})") from None
            if not isinstance(item, dict):
                raise ValueError(f"{path}: line {number}: must be a JSON object")
            answer, passages = item.get("answer"), item.get("passages")
            if not isinstance(answer, str):
                raise ValueError(f'{path}: line {number}: "answer" must be a string')
            if not isinstance(passages, list) or not all(isinstance(p, str) for p in passages):
                raise ValueError(f'{path}: line {number}: "passages" must be a list of strings')
            pairs.append((answer, passages))
    return pairs


@grounding_group.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
@one_line_errors
def check(file: Path, as_json: bool) -> None:
    """Ground each line's answer in its passages; one output line per input line, in order."""
    try:
        pairs = read_pairs(file)
    except UnicodeDecodeError as exc:
        raise CommandError(f"{file}: not UTF-8 text ({exc.reason})") from None
    from app.grounding import load_scorer  # heavy: sentence-transformers
    from retrieval.embedder import Embedder
    from retrieval.grounding import ScorerLoadError, ground

    settings = get_settings()
    try:
        embedder = None if settings.grounding_model else Embedder(settings.embedding_model)
        scorer = load_scorer(settings, embedder)
    except ScorerLoadError as exc:
        raise CommandError(str(exc)) from None
    # Scored in full before the first line is printed: a failure prints nothing half-done.
    results = [ground(answer, passages, scorer).to_dict() for answer, passages in pairs]
    for result in results:
        emit(result, as_json, text=_human(result))


@grounding_group.command("backfill")
@click.option("--collection", "-c", default=None, help="Only this collection (default: all).")
@click.option("--tenant", default=None, help="Only this tenant's chunks (default: all).")
@json_option
@one_line_errors
def backfill_command(collection: str | None, tenant: str | None, as_json: bool) -> None:
    """Store the grounding vectors of every chunk ingested without them (with grounding off, or
    before migration 0020), so that no answer citing them encodes its passages."""
    import sys

    from tqdm import tqdm

    from app.db import prepare
    from retrieval.embedder import Embedder  # heavy: torch
    from retrieval.grounding.stored import backfill

    settings = get_settings()
    _, session_factory = prepare(settings)
    embedder = Embedder.shared(settings.embedding_model, device="cpu")
    with tqdm(unit="chunk", desc="grounding vectors", file=sys.stderr, disable=as_json) as bar:
        done = backfill(session_factory, embedder, tenant, collection, bar.update)
    emit(done.to_dict(), as_json,
         f"{done.chunks} chunks given grounding vectors in {done.collections} collections")  # fmt: skip


def _human(result: dict[str, Any]) -> str:
    if result["groundedness"] is None:
        return f"groundedness: none ({result['reason']})"
    lines = [f"groundedness: {result['groundedness']:.2f}"]
    for s in result["sentences"]:
        mark = ",".join(str(j) for j in s["supported_by"]) or "-"
        lines.append(f"  {s['score']:.2f} [{mark}] {s['text']}")
    return "\n".join(lines)


COMMANDS = [grounding_group]
