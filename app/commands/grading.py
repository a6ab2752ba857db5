"""``specrag eval grades export | import | show``: human grades of golden runs from the shell."""

from __future__ import annotations

from pathlib import Path

import click

from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.commands.retrieval import eval_group
from app.db import prepare
from app.evals.golden import find_run
from app.grading import export_csv, export_html, graded_summary, import_grades


@eval_group.group("grades")
def grades_group() -> None:
    """Human grades of golden runs: export a form, import the grades, show agreement."""


@grades_group.command("export")
@click.argument("run")
@click.option("--format", "fmt", type=click.Choice(["csv", "html"]), default="csv",
              show_default=True, help="csv (a spreadsheet) or html (a self-contained form).")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@json_option
@one_line_errors
def export(run: str, fmt: str, out: Path, as_json: bool) -> None:
    """Write RUN's items (id or unique prefix) for graders to OUT."""
    engine, session_factory = prepare(get_settings())
    try:
        with session_factory() as session:
            found = find_run(session, run)
            body = (export_csv if fmt == "csv" else export_html)(session, found.id)
    finally:
        engine.dispose()
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(body, encoding="utf-8", newline="")
    tmp.replace(out)
    data = {"run_id": str(found.id), "out": str(out), "format": fmt, "items": found.num_items}
    emit(data, as_json, f"wrote {found.num_items} items of run {found.id} to {out}")


@grades_group.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--grader", default="default", show_default=True,
              help="Grader name for lines without a grader column.")  # fmt: skip
@json_option
@one_line_errors
def import_(file: Path, grader: str, as_json: bool) -> None:
    """Store the grades of FILE (CSV or JSONL: item_id, faithful, relevance, note): all or none."""
    engine, session_factory = prepare(get_settings())
    try:
        with session_factory() as session:
            data = import_grades(session, file, grader)
    finally:
        engine.dispose()
    emit(data, as_json, f"stored {data['stored']} grade(s); {data['skipped_ungraded']} ungraded")


@grades_group.command("show")
@click.argument("run")
@json_option
@one_line_errors
def show(run: str, as_json: bool) -> None:
    """RUN's graded figures and their agreement with the automatic faithfulness score."""
    engine, session_factory = prepare(get_settings())
    try:
        with session_factory() as session:
            found = find_run(session, run)
            data = {"run_id": str(found.id), **graded_summary(session, found.id)}
    finally:
        engine.dispose()
    emit(data, as_json, graded_text(data))


def graded_text(s: dict) -> str:
    """One paragraph of graded figures."""
    if not s["grades"]:
        return "no human grades yet (specrag eval grades export / import)"
    a = s["agreement"]

    def f(v: object) -> str:
        return "n/a" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)

    return (
        f"{s['grades']} grade(s) of {s['graded_items']} item(s) by {', '.join(s['graders'])}: "
        f"human faithfulness {f(s['human_faithfulness'])} (automatic "
        f"{f(s['automatic_faithfulness'])}), relevance {f(s['relevance'])} / 5; agreement with "
        f"the automatic score: same label {f(a['same_label'])}, kappa {f(a['cohen_kappa'])}, "
        f"Spearman {f(a['spearman'])} (n = {a['n']})"
    )


# The `grades` group joins retrieval's `eval` group (registered with it).
COMMANDS: list[click.Command] = []
