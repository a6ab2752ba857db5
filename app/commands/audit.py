"""``specrag audit report`` and ``specrag eval golden | compare``: audits from the shell."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import click

from app.audit import render_report
from app.audit.window import check_format, parse_group_by, parse_window
from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.commands.grading import graded_text
from app.commands.retrieval import eval_group
from app.db import prepare
from app.evals.golden import compare_runs, read_golden, run_golden
from app.grading import graded_summary
from app.requests import DEFAULT_NUM_SPECULATIVE_TOKENS, Method
from app.resources import Resources


@click.group("audit")
def audit_group() -> None:
    """Reports on speed, acceptance and exactness of stored answers."""


@audit_group.command("report")
@click.option(
    "--since", default=None, help="ISO 8601 start of the window (default: until - 1 day)."
)
@click.option("--until", default=None, help="ISO 8601 end of the window (default: now).")
@click.option("--format", "fmt", default="json", show_default=True, help="json, csv or html.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the report here instead of to stdout.")  # fmt: skip
@click.option(
    "--group-by",
    default=None,
    help="Comma-separated groupings (default tenant,collection,method,model_pair; "
    "also num_speculative_tokens).",
)
@json_option
@one_line_errors
def report(
    since: str | None,
    until: str | None,
    fmt: str,
    out: Path | None,
    group_by: str | None,
    as_json: bool,
) -> None:
    """The audit report over [since, until): requests, latency percentiles, acceptance, alerts."""

    # Bad input is refused before the database is touched.
    check_format(fmt)
    parse_window(since, until)
    parse_group_by(group_by)
    settings = get_settings()
    engine, session_factory = prepare(settings)
    try:
        with session_factory() as session:
            _, body = render_report(
                session, since=since, until=until, fmt=fmt, group_by=group_by, settings=settings
            )
    finally:
        engine.dispose()
    if out is None:
        click.echo(body, nl=not body.endswith("\n"))
        return
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(body, encoding="utf-8", newline="")  # CSV line ends are its own (CRLF)
    tmp.replace(out)  # never leave a half-written report behind
    summary = {"out": str(out), "format": fmt, "bytes": len(body.encode("utf-8"))}
    if fmt == "json":
        data = json.loads(body)
        summary.update(requests=data["requests"], alerts=len(data["alerts"]))
    emit(summary, as_json, f"wrote {fmt} report to {out} ({summary['bytes']} bytes)")


@eval_group.command("golden")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--collection", "-c", default=None, help="Collection for lines that name none.")
@click.option(
    "--tenant", default="default", show_default=True, help="Tenant owning the collections."
)
@click.option(
    "--method", default=Method.DRAFT_MODEL.value, show_default=True, help="Speculation method."
)
@click.option(
    "--num-speculative-tokens",
    "k",
    default=str(DEFAULT_NUM_SPECULATIVE_TOKENS),
    show_default=True,
    help="k or 'auto'.",
)
@click.option("--max-tokens", type=int, default=None, help="Answer length (default: settings).")
@json_option
@one_line_errors
def eval_golden(
    file: Path,
    collection: str | None,
    tenant: str,
    method: str,
    k: str,
    max_tokens: int | None,
    as_json: bool,
) -> None:
    """Answer FILE.jsonl with speculation and without; score, store and print the run."""

    items = read_golden(file, collection)  # a malformed file is refused before any model loads
    settings = get_settings()
    if method not in settings.allowed_methods or method == "none":
        allowed = ", ".join(m for m in settings.allowed_methods if m != "none")
        raise ValueError(f"method: must be a speculation method ({allowed}), got {method!r}")
    engine, session_factory = prepare(settings)
    try:
        summary = run_golden(
            Resources(settings, session_factory), items, source_file=str(file), tenant=tenant,
            method=method, num_speculative_tokens=int(k) if k.isdigit() else k,
            max_tokens=max_tokens,
        )  # fmt: skip
    finally:
        engine.dispose()
    emit(summary, as_json, _golden_text(summary))


def _fmt(value: object) -> str:
    return "n/a" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _golden_text(s: dict) -> str:
    return (
        f"run {s['run_id']}: {s['items']} items, {s['errors']} errors\n"
        f"exact match {_fmt(s['exact_match'])}  token F1 {_fmt(s['token_f1'])}  "
        f"retrieval recall {_fmt(s['retrieval_recall'])}  faithfulness {_fmt(s['faithfulness'])}\n"
        f"identical output {_fmt(s['identical_rate'])}  speedup {_fmt(s['speedup'])}  "
        f"total ms p50: speculative {_fmt(s['spec_total_ms']['p50'])}, "
        f"baseline {_fmt(s['baseline_total_ms']['p50'])}"
    )


@eval_group.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@json_option
@one_line_errors
def eval_compare(run_a: str, run_b: str, as_json: bool) -> None:
    """Compare golden run RUN_B against RUN_A (ids or unique id prefixes)."""

    engine, session_factory = prepare(get_settings())
    try:
        with session_factory() as session:
            data = compare_runs(session, run_a, run_b)
            data["graded"] = {
                side: graded_summary(session, uuid.UUID(data[f"run_{side}"])) for side in "ab"
            }
    finally:
        engine.dispose()
    lines = [f"{data['run_b']} vs {data['run_a']} ({data['common_items']} common items)"]
    for name, m in data["metrics"].items():
        lines.append(f"  {name:<22} {_fmt(m['a']):>10} -> {_fmt(m['b']):>10}  ({_fmt(m['delta'])})")
    for name in ("human_faithfulness", "relevance"):
        va, vb = data["graded"]["a"][name], data["graded"]["b"][name]
        delta = vb - va if va is not None and vb is not None else None
        lines.append(f"  {name:<22} {_fmt(va):>10} -> {_fmt(vb):>10}  ({_fmt(delta)})  human")
    for side in "ab":
        lines.append(f"  run {side.upper()}: {graded_text(data['graded'][side])}")
    lines.append(f"  {len(data['changed_items'])} item(s) changed")
    emit(data, as_json, "\n".join(lines))


# `eval golden` and `eval compare` join retrieval's `eval` group (registered with it).
COMMANDS = [audit_group]
