"""``specrag batch submit|status|watch|cancel|report``: batch reprocessing jobs (operator side)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from app.batch import submit as sub
from app.batch.report import render
from app.batch.runner import cancel as cancel_batch
from app.batch.views import batch_view, get_batch, item_views, parse_id
from app.commands.ask import _spec_tokens
from app.commands.common import (
    CommandError,
    emit,
    get_dispatcher,
    get_settings,
    json_option,
    one_line_errors,
)
from app.db import prepare
from app.lifecycle.queries import get_or_create_tenant
from app.requests import METHOD_CHOICES


@click.group("batch")
def batch_group() -> None:
    """Re-run supplied or stored questions in bulk on the batch queue, and compare the answers."""


@batch_group.command("submit")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--golden", is_flag=True, help="FILE is a golden set (question + expected_source).")
@click.option("--stored", is_flag=True, help="Re-run stored queries chosen by the filter options.")
@click.option("--collection", "-c", default=None, help="Collection (JSONL default; filter).")
@click.option("--tenant", default="default", show_default=True, help="Tenant (owner; filter).")
@click.option("--all-tenants", is_flag=True, help="With --stored: queries of every tenant.")
@click.option("--since", default=None, help="With --stored: asked at or after (ISO 8601).")
@click.option("--until", default=None, help="With --stored: asked before (ISO 8601).")
@click.option("--original-method", default=None, help="With --stored: only queries that used M.")
@click.option("--failed-only", is_flag=True, help="With --stored: only queries that failed.")
@click.option("--method", default=None, help=f"Override: {METHOD_CHOICES}.")
@click.option("--num-speculative-tokens", "k", default=None, help="Override: k >= 1, or auto.")
@click.option("--max-tokens", type=int, default=None, help="Override: most tokens to generate.")
@json_option
@one_line_errors
def submit(
    file: Path | None,
    golden: bool,
    stored: bool,
    collection: str | None,
    tenant: str,
    all_tenants: bool,
    since: str | None,
    until: str | None,
    original_method: str | None,
    failed_only: bool,
    method: str | None,
    k: str | None,
    max_tokens: int | None,
    as_json: bool,
) -> None:
    """Submit a batch from a JSONL FILE (or golden set), or --stored with a filter; prints its id."""

    if stored == (file is not None):
        raise CommandError("give either a JSONL FILE or --stored (with filter options), not both")
    settings = get_settings()
    dispatcher = get_dispatcher(settings)  # refused before anything is stored
    overrides = {
        "method": method,
        "num_speculative_tokens": _spec_tokens(k) if k is not None else None,
        "max_tokens": max_tokens,
    }
    _, session_factory = prepare(settings)
    with session_factory() as session:
        owner = get_or_create_tenant(session, tenant)
        if file is not None:
            with file.open(encoding="utf-8") as lines:
                specs = sub.parse_jsonl(
                    lines,
                    settings,
                    owner.id,
                    collection=collection,
                    overrides=overrides,
                    golden=golden,
                )
            source = "golden" if golden else "jsonl"
            detail: dict[str, Any] = {"file": str(file), "items": len(specs)}
        else:
            flt = sub.StoredFilter(
                since=sub.parse_when("since", since),
                until=sub.parse_when("until", until),
                tenant=None if all_tenants else tenant,
                collection=collection,
                method=original_method,
                failed_only=failed_only,
            )
            specs = sub.select_stored(
                session, settings, flt, overrides=overrides, limit=settings.batch_max_items
            )
            source, detail = "filter", flt.to_dict()
        batch = sub.create_batch(
            session,
            settings,
            owner,
            specs,
            source=source,
            source_detail=detail,
            overrides=overrides,
        )
    sent = sub.dispatch_new(batch, dispatcher.dispatch_batch)
    data = {"id": str(batch.id), "status": batch.status, "total": batch.total, "dispatched": sent}
    emit(data, as_json, text=f"batch {batch.id}: {batch.total} items queued")


def _factory() -> Any:

    return prepare(get_settings())[1]


def _view(session_factory: Any, batch_id: str) -> dict[str, Any]:

    with session_factory() as session:
        batch = get_batch(session, batch_id, None)
        if batch is None:
            raise LookupError(f"no batch {batch_id}")
        return batch_view(batch)


def _load(batch_id: str) -> tuple[Any, dict[str, Any]]:
    session_factory = _factory()
    return session_factory, _view(session_factory, batch_id)


@batch_group.command("status")
@click.argument("batch_id")
@click.option("--items", is_flag=True, help="Also list every item's status.")
@json_option
@one_line_errors
def status(batch_id: str, items: bool, as_json: bool) -> None:
    """Show a batch's status and counters (and its items with --items)."""

    session_factory, view = _load(batch_id)
    if items:
        with session_factory() as session:
            bid = parse_id(batch_id)
            assert bid is not None
            view["items"] = item_views(session, bid)
    emit(view, as_json, text=None if items else _line(view))


def _line(view: dict[str, Any]) -> str:
    return (
        f"batch {view['id']}: {view['status']}, {view['done']}/{view['total']} done "
        f"({view['succeeded']} succeeded, {view['failed']} failed, {view['cancelled']} cancelled)"
    )


@batch_group.command("watch")
@click.argument("batch_id")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds per poll.")
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds.")
@json_option
@one_line_errors
def watch(batch_id: str, interval: float, timeout: float | None, as_json: bool) -> None:
    """Show a progress bar until the batch has finished; then its final status."""
    session_factory, view = _load(batch_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    with tqdm(total=view["total"], unit="item", disable=as_json, desc=view["id"][:8]) as bar:
        while True:
            bar.n = view["done"] + view["cancelled"]
            bar.set_postfix(status=view["status"], failed=view["failed"])
            bar.refresh()
            if view["finished"]:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still {view['status']} after {timeout} s")
            time.sleep(interval)
            view = _view(session_factory, batch_id)
    emit(view, as_json, text=_line(view))


@batch_group.command("cancel")
@click.argument("batch_id")
@json_option
@one_line_errors
def cancel(batch_id: str, as_json: bool) -> None:
    """Cancel a batch: items not started are cancelled, the ones in flight finish."""

    session_factory, _ = _load(batch_id)
    bid = parse_id(batch_id)
    assert bid is not None
    cancel_batch(session_factory, bid)
    view = _view(session_factory, batch_id)
    emit(view, as_json, text=_line(view))


@batch_group.command("report")
@click.argument("batch_id")
@click.option(
    "--format", "fmt", type=click.Choice(["json", "csv", "html"]), default="json", show_default=True
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@json_option
@one_line_errors
def report(batch_id: str, fmt: str, out: Path | None, as_json: bool) -> None:
    """How the batch's answers changed vs the originals; latency and acceptance before/after."""

    session_factory, _ = _load(batch_id)
    bid = parse_id(batch_id)
    assert bid is not None
    with session_factory() as session:
        _, body = render(session, bid, "json" if as_json else fmt)
    if out is not None:
        out.write_text(body, encoding="utf-8", newline="")  # CSV line ends are its own (CRLF)
        emit({"out": str(out), "format": fmt}, as_json, text=f"report written to {out}")
    else:
        click.echo(body)


COMMANDS = [batch_group]
