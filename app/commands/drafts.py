"""``specrag draft dataset | tune | evaluate``: tune the draft on stored traffic (docs/drafts.md)."""

from __future__ import annotations

from pathlib import Path

import click

from app.audit.window import parse_window
from app.commands.common import (
    CommandError,
    emit,
    get_dispatcher,
    get_settings,
    json_option,
    one_line_errors,
)
from app.db import prepare
from app.drafts.dataset import MIN_ITEMS, Filters, build_dataset


@click.group("draft")
def draft_group() -> None:
    """Tune the draft model on this deployment's own traffic, evaluate it, swap it in."""


def _names(values: tuple[str, ...]) -> tuple[str, ...] | None:
    names = tuple(n.strip() for v in values for n in v.split(",") if n.strip())
    return names or None


@draft_group.command("dataset")
@click.option(
    "--since", default=None, help="ISO 8601 start of the window (default: until - 1 day)."
)
@click.option("--until", default=None, help="ISO 8601 end of the window (default: now).")
@click.option(
    "--tenant", "tenants", multiple=True, help="Only these tenants (repeat or comma-separate)."
)
@click.option("--collection", "collections", multiple=True, help="Only these collections.")
@click.option("--method", "methods", multiple=True, help="Only answers decoded with these methods.")
@click.option(
    "--heldout",
    type=float,
    default=0.25,
    show_default=True,
    help="Share of the queries held out (split by query, seeded).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--min-items",
    type=int,
    default=MIN_ITEMS,
    show_default=True,
    help="Refuse a window with fewer usable answers.",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@json_option
@one_line_errors
def dataset(
    since: str | None, until: str | None, tenants: tuple[str, ...],
    collections: tuple[str, ...], methods: tuple[str, ...], heldout: float, seed: int,
    min_items: int, out: Path, as_json: bool,
) -> None:  # fmt: skip
    """Write a training set of the window's answers (exact prompt and output ids) to OUT."""
    window = parse_window(since, until)
    filters = Filters(_names(tenants), _names(collections), _names(methods))
    engine, session_factory = prepare(get_settings())
    try:
        with session_factory() as session:
            manifest = build_dataset(
                session, out, window, filters, heldout=heldout, seed=seed, min_items=min_items
            )
    finally:
        engine.dispose()
    summary = {k: v for k, v in manifest.items() if k != "queries"} | {"out": str(out)}
    emit(
        summary,
        as_json,
        f"wrote {manifest['items']} answers to {out} ({manifest['train_items']} train, "
        f"{manifest['heldout_items']} held out); left out: {manifest['left_out']['privacy']} "
        f"for privacy (questions not kept in clear), {manifest['left_out']['no_token_ids']} "
        "without stored token ids",
    )


@draft_group.command("tune")
@click.option(
    "--dataset",
    "dataset_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)
@click.option(
    "--draft",
    "draft_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The draft to start from (default: SPECRAG_DRAFT_MODEL).",
)
@click.option(
    "--eagle",
    "eagle_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Tune this EAGLE head (vLLM's EAGLE format) instead of the draft model.",
)
@click.option(
    "--target",
    "target_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The target (default: SPECRAG_TARGET_MODEL).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="New checkpoint directory; its name labels the draft in model_pair.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Checkpoint of the run, for resuming (default: OUT.run).",
)
@click.option("--epochs", type=int, default=3, show_default=True)
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option(
    "--time-budget", type=float, default=None, help="Stop after this many seconds of training."
)
@click.option("--lr", type=float, default=3e-4, show_default=True)
@click.option("--tokens-per-batch", type=int, default=4096, show_default=True)
@click.option(
    "--loss",
    type=click.Choice(["auto", "logits", "tokens"]),
    default="auto",
    show_default=True,
    help="logits: the target's distribution (target recomputed); "
    "tokens: its output tokens; auto: logits when the target's weights are here.",
)
@click.option(
    "--logit-share",
    type=float,
    default=0.5,
    show_default=True,
    help="--eagle: share of the next-token KL beside the feature regression.",
)
@click.option(
    "--noise",
    type=float,
    default=0.1,
    show_default=True,
    help="--eagle: uniform noise on the target features the head is fed.",
)
@click.option("--threads", type=int, default=None, help="torch threads (default: torch's).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--queue",
    "on_queue",
    is_flag=True,
    help="Send the tune to the `train` queue (a worker started with --queues train) "
    "instead of running it here.",
)
@json_option
@one_line_errors
def tune_cmd(
    dataset_dir: Path, draft_dir: Path | None, eagle_dir: Path | None, target_dir: Path | None,
    out: Path,
    run_dir: Path | None, epochs: int, max_steps: int | None, time_budget: float | None,
    lr: float, tokens_per_batch: int, loss: str, logit_share: float, noise: float,
    threads: int | None, no_progress: bool,
    on_queue: bool, as_json: bool,
) -> None:  # fmt: skip
    """Distil the draft (or, with --eagle, an EAGLE head) on DATASET's training split into a
    new checkpoint directory OUT."""
    from app.drafts.tune import TuneConfig, check_head_pair, check_pair, tune, tune_eagle

    settings = get_settings()
    if eagle_dir is not None and draft_dir is not None:
        raise CommandError("--eagle / --draft: give one (a head or a draft model is tuned)")
    draft_dir = draft_dir or (settings.draft_model if eagle_dir is None else None)
    target_dir = target_dir or settings.target_model
    if (draft_dir is None and eagle_dir is None) or target_dir is None:
        raise CommandError("--draft / --target: no model given and none configured")
    if max_steps is not None and max_steps < 1:
        raise CommandError("--max-steps: must be at least 1")
    if time_budget is not None and time_budget <= 0:
        raise CommandError("--time-budget: must be a positive number of seconds")
    if logit_share < 0 or noise < 0:
        raise CommandError("--logit-share / --noise: must not be negative")
    config = TuneConfig(
        epochs=epochs, max_steps=max_steps, time_budget=time_budget, lr=lr,
        tokens_per_batch=tokens_per_batch, loss=loss, threads=threads, noise=noise,
        logit_share=logit_share,
    )  # fmt: skip
    run_dir = run_dir or out.with_name(out.name + ".run")
    if on_queue:
        from dataclasses import asdict

        from app.drafts.dataset import read_manifest

        read_manifest(dataset_dir)  # a bad dataset fails here, not hours later on a worker
        if eagle_dir is not None:
            check_head_pair(Path(target_dir), Path(eagle_dir))
            model = {"eagle": str(Path(eagle_dir).resolve())}
        else:
            assert draft_dir is not None
            check_pair(Path(target_dir), Path(draft_dir))
            model = {"draft": str(Path(draft_dir).resolve())}
        job = {
            "dataset": str(dataset_dir.resolve()), **model,
            "target": str(Path(target_dir).resolve()), "out": str(out.resolve()),
            "run_dir": str(run_dir.resolve()), "config": asdict(config),
        }  # fmt: skip
        get_dispatcher(settings).send_tune(job)
        emit(job, as_json, f"queued the tune of {out} on the train queue")
        return
    run_tune = tune_eagle if eagle_dir is not None else tune
    base = eagle_dir if eagle_dir is not None else draft_dir
    assert base is not None
    manifest = run_tune(
        dataset_dir, Path(base), Path(target_dir), out,
        run_dir, config,
        progress=not no_progress, log=lambda m: click.echo(m, err=True),
    )  # fmt: skip
    what = "EAGLE head" if eagle_dir is not None else "draft"
    emit(manifest, as_json, f"tuned {what}: {out} ({manifest['steps']} steps)")


def _named_file(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise CommandError(f"--items: {value!r}; expected NAME=FILE.jsonl")
    if not Path(path).is_file():
        raise CommandError(f"--items: {path} does not exist")
    return name, Path(path)


@draft_group.command("evaluate")
@click.argument("old", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("new", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--dataset",
    "dataset_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Replay this dataset's held-out split (set `heldout`).",
)
@click.option(
    "--items",
    "items",
    multiple=True,
    help="NAME=FILE.jsonl: another set of prompts in the dataset's item form (repeat).",
)
@click.option(
    "--target",
    "target_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The target (default: SPECRAG_TARGET_MODEL).",
)
@click.option("-k", "--num-speculative-tokens", "k", type=int, default=4, show_default=True)
@click.option(
    "--chart",
    "chart_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a PNG (or SVG) chart of the comparison here.",
)
@click.option("--force", is_flag=True, help="Keep a draft that lowers held-out acceptance.")
@json_option
@one_line_errors
def evaluate_cmd(
    old: Path, new: Path, dataset_dir: Path | None, items: tuple[str, ...],
    target_dir: Path | None, k: int, chart_path: Path | None, force: bool, as_json: bool,
) -> None:  # fmt: skip
    """Replay held-out prompts with the OLD and the NEW draft on one target, side by side.

    Two EAGLE heads (told by their config.json) are compared the same way, with method eagle."""
    from app.drafts.evaluate import chart, evaluate, load_sets, record, render_text, verdict

    settings = get_settings()
    target_dir = target_dir or settings.target_model
    if target_dir is None:
        raise CommandError("--target: no target given and none configured")
    if dataset_dir is None and not items:
        raise CommandError("give --dataset and/or --items: there are no prompts to replay")
    if k < 1:
        raise CommandError("-k: must be at least 1")
    sets = load_sets(dataset_dir, [_named_file(v) for v in items])
    from app.drafts.tune import check_head_pair, check_pair
    from generation.spec_decode.eagle import is_eagle_head

    heads = (is_eagle_head(old), is_eagle_head(new))
    if heads[0] != heads[1]:
        which = old if heads[0] else new
        raise CommandError(
            f"OLD / NEW: {which} is an EAGLE head and the other a draft model; compare two "
            "heads or two drafts"
        )
    check = check_head_pair if heads[0] else check_pair
    check(Path(target_dir), old)
    check(Path(target_dir), new)
    report = evaluate(old, new, Path(target_dir), sets, k=k, dtype=settings.dtype,
                      method="eagle" if heads[0] else "draft_model",
                      log=lambda m: click.echo(m, err=True))  # fmt: skip
    if chart_path is not None:
        chart(report).savefig(chart_path, dpi=110)
        report["chart"] = str(chart_path)
    try:
        report["verdict"] = verdict(report, force)
    except ValueError:
        report["verdict"] = "refused"
        click.echo(render_text(report), err=True)
        raise
    record(new, report)
    emit(report, as_json, render_text(report))


COMMANDS = [draft_group]
