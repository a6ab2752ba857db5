"""``specrag ask``: one question through the queue and a worker, or in-process with ``--local``."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Any

import click

from app.commands.ask_stream import follow
from app.commands.common import (
    CommandError,
    emit,
    get_dispatcher,
    get_settings,
    json_option,
    one_line_errors,
)
from app.db import prepare, utcnow
from app.evals.hooks import install_hooks
from app.grounding import install_hooks as install_grounding_hooks
from app.grounding import wait_for_grounding
from app.lifecycle.lease import Claimed
from app.lifecycle.outbox import admit
from app.lifecycle.queries import (
    create_query,
    get_or_create_tenant,
    query_view,
    require_collection,
    wait_for,
)
from app.pipeline import answer_query, build_request, retrieve
from app.requests import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    METHOD_CHOICES,
    Method,
    QueryRequest,
    QueueName,
    validate_request,
)
from app.resources import Resources, apply_torch_threads

log = logging.getLogger(__name__)


def _spec_tokens(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter("expected an integer >= 1 or 'auto'") from None


@click.command("ask")
@click.argument("question")
@click.option("--collection", "-c", required=True, help="Collection to search.")
@click.option(
    "--tenant", default="default", show_default=True, help="Tenant that owns the collection."
)
@click.option("--method", default=None, help=f"{METHOD_CHOICES} (default from settings).")
@click.option(
    "--num-speculative-tokens",
    "k",
    default=None,
    help=f"k >= 1, or auto (default {DEFAULT_NUM_SPECULATIVE_TOKENS}).",
)
@click.option("--max-tokens", type=int, default=None, help="Most tokens to generate.")
@click.option("--temperature", type=float, default=None, help="0 = greedy.")
@click.option("--seed", type=int, default=None, help="Seed for reproducible sampling.")
@click.option("--local", is_flag=True, help="Answer in this process instead of through a worker.")
@click.option(
    "--stream", "stream", is_flag=True, help="Print the answer as it is generated (--json: events)."
)
@click.option(
    "--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for a worker."
)
@json_option
@one_line_errors
def ask(
    question: str,
    collection: str,
    tenant: str,
    method: str | None,
    k: str | None,
    max_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    local: bool,
    stream: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Ask QUESTION about a collection; prints the answer, its sources and decoding stats."""

    settings = get_settings()
    request = validate_request(
        settings,
        {
            "question": question,
            "collection": collection,
            "method": method,
            "num_speculative_tokens": None if k is None else _spec_tokens(k),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
        },
    )
    dispatcher = None if local else get_dispatcher(settings)  # refused before anything is stored
    _, session_factory = prepare(settings)
    with session_factory() as session:
        require_collection(session, tenant, request.collection)
    if local:
        install_hooks()
        install_grounding_hooks()
        apply_torch_threads(settings)  # SPECRAG_TORCH_THREADS, as a worker applies it
        resources = Resources(settings, session_factory)
        # A fresh process loads its models and makes its kernels ready in its first passes;
        # done before the query is stored (below), so its recorded times are the answer's own.
        with session_factory() as session:
            tenant_id = get_or_create_tenant(session, tenant).id
        warm_one_shot(resources, request, tenant_id)
    with session_factory() as session:
        owner = get_or_create_tenant(session, tenant)
        query, _ = create_query(session, owner, request, source="local" if local else "cli")
    if local:
        if stream:
            # The answer is generated beside the stream reader, as a worker would.
            threading.Thread(target=answer_query, args=(resources, query.id), daemon=True).start()
        else:
            answer_query(resources, query.id)
    else:
        assert dispatcher is not None
        # Through admission like the API: the tenant's fair share holds for the CLI too.
        admit(session_factory, settings, dispatcher.send_query, tenant_id=query.tenant_id)
    if stream:
        view = follow(settings, session_factory, query.id, timeout=timeout, as_json=as_json)
        emit(view, as_json, text=_human(view, with_answer=False))
    else:
        try:
            done = wait_for(session_factory, query.id, timeout=0 if local else timeout)
        except TimeoutError as exc:
            raise CommandError(str(exc)) from None
        view = query_view(done)
        if view["status"] == "succeeded" and settings.grounding and "grounding" not in view:
            # Grounding follows the commit of the answer: a moment later, from the worker.
            view = query_view(wait_for_grounding(session_factory, query.id, timeout=30.0))
        emit(view, as_json, text=_human(view))
    if view["status"] != "succeeded":
        raise CommandError(f"query {view['id']} failed: {view.get('error')}")


def warm_one_shot(resources: Resources, request: QueryRequest, tenant_id: int) -> None:
    """Load and warm what one local answer to ``request`` needs, so that its recorded times
    are the answer's own.

    A worker warms every method and batch size it can reach at start (``Resources.warm``) and
    keeps them for its life; a one-shot process warms only what its one answer uses, alone: the
    request's pass shapes and, for k "auto", its one step-cost table, loaded from the data dir
    when an earlier process of the same engine and machine measured it
    (``Resources.step_cost_cache``); then the answer's own prompt, retrieved and built as the
    pipeline will, decoded for two tokens under a prefix-cache salt of its own, so that the
    prefill's kernels at that length are made while the answer reuses none of its KV.
    """
    engine = resources.engine
    shared = resources.shared_suffix_memory
    if shared is not None and request.method == Method.SUFFIX:
        shared.fill()  # the stored answers a worker's trees hold
    warm_request = getattr(engine, "warm_request", None)
    if callable(warm_request):  # the torch engine; vLLM has nothing to measure
        k = request.num_speculative_tokens
        if k == "auto":
            engine.use_cost_cache(resources.step_cost_cache())  # type: ignore[attr-defined]
        warm_request(request.method, k)
    now = utcnow()
    claimed = Claimed(0, tenant_id, request.question, request.collection, request.params(),
                      now, now, QueueName.ANSWER)  # fmt: skip
    try:
        built = build_request(resources, claimed, retrieve(resources, claimed).hits)
    except Exception as exc:  # noqa: BLE001 - the answer meets it again, and records it
        log.info("one-shot warm-up: no prompt to warm (%s)", exc)
        return
    warm = dataclasses.replace(built.sampling, max_new_tokens=2, cache_salt=WARM_UP_SALT)
    engine.generate(built.prompt_ids, warm)


WARM_UP_SALT = "one-shot warm-up"
"""The prefix-cache salt of ``warm_one_shot``'s prompt: no tenant's answer reuses its blocks."""


def _human(view: dict[str, Any], with_answer: bool = True) -> str:
    if view["status"] != "succeeded":
        return f"query {view['id']}: {view['status']}"
    lines = [view["answer"] or "(empty answer)", ""] if with_answer else []
    lines.append("Sources:")
    for rank, src in enumerate(view.get("sources", []), start=1):
        lines.append(
            f"  [{rank}] {src['document']} (chunk {src['chunk_id']}, score {src['score']:.3f})"
        )
    stats = view.get("stats") or {}
    lines += ["", "Stats:", "  " + json.dumps(stats, default=str)]
    if view.get("grounding") is not None:
        lines += ["", grounding_line(view["grounding"])]
    return "\n".join(lines)


def grounding_line(grounding: dict[str, Any]) -> str:
    """One line for people: groundedness and citation shares, or why there are none."""
    if grounding.get("groundedness") is None:
        return f"Grounding: none ({grounding.get('reason')})"

    def share(name: str) -> str:
        value = grounding.get(name)
        return "n/a" if value is None else f"{value:.2f}"

    unsupported = sum(1 for s in grounding.get("sentences", []) if not s["supported_by"])
    return (
        f"Grounding: groundedness {share('groundedness')}, citation precision "
        f"{share('citation_precision')}, recall {share('citation_recall')}; "
        f"{unsupported} sentence(s) unsupported"
    )


COMMANDS = [ask]
