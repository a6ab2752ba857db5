"""What Prometheus metrics cost: per answer in a worker, per request in the API, per scrape.

Answers go through the real pipeline in this process (embedded SQLite, the demo pair unless
--target/--draft, the demo corpus ingested), alternating between no after-answer hook and the
worker's metrics hook, so both arms share the machine's drift. The per-answer cost is then timed
directly: ``WorkerMetrics.observe`` replayed on the answers just recorded. The API's cost is the
request middleware around a bare ASGI app, interleaved with the bare app, and the scrape cost is
rendering both registries (off the answer path: a scrape comes every 15 s from another thread).

    SPECRAG_TORCH_THREADS=1 .venv/bin/python -m benchmarks.metrics --answers 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.support import goal, write_result

GOALS = [
    goal(
        "metrics",
        "Prometheus hook cost per answer / answer time (steady)",
        "hook_share_pct",
        "<=",
        1.0,
        "%",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent

QUESTIONS = [
    "How do I rotate API keys?",
    "What does the assert statement do?",
    "How does the pass statement work?",
    "What does del do to a name?",
]


def answer_arms(args: argparse.Namespace, data: Path) -> tuple[list[float], list[float], list[Any]]:
    """Answer times (ms, the stored total_ms) without and with the metrics hook, and what was answered."""
    import torch

    from app.db import prepare
    from app.hooks import Answered, register_after_answer, unregister_after_answer
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from app.metrics import WorkerMetrics
    from app.resources import Resources
    from app.settings import Settings

    torch.set_num_threads(int(os.environ.get("SPECRAG_TORCH_THREADS", "1")))
    over: dict[str, Any] = {"data_dir": data, "device": "cpu"}
    if args.target:
        over |= {"target_model": Path(args.target), "draft_model": Path(args.draft)}
    settings = Settings(**over)
    _, session_factory = prepare(settings)
    resources = Resources(settings, session_factory)
    corpus = sorted((ROOT / "demo" / "corpus").glob("*.md"))[:8]
    resources.retrieval.ingest(corpus, collection="bench", tenant="bench")
    resources.warm(answer=True, ingest=False)

    from app.pipeline import answer_query

    metrics = WorkerMetrics()
    seen: list[Answered] = []
    without: list[float] = []
    with_hook: list[float] = []

    def keep(_: Any, answered: Answered) -> None:
        seen.append(answered)

    for i in range(2 * args.answers):
        on = i % 2 == 1
        request = validate_request(
            settings,
            {"question": QUESTIONS[i // 2 % len(QUESTIONS)], "collection": "bench",
             "max_tokens": args.max_tokens, "method": "draft_model", "num_speculative_tokens": 4},
        )  # fmt: skip
        with session_factory() as session:
            query, _ = create_query(
                session, get_or_create_tenant(session, "bench"), request, source="benchmark"
            )
        register_after_answer(keep)
        if on:
            register_after_answer(metrics)
        try:
            answer_query(resources, query.id)
        finally:
            unregister_after_answer(metrics)
            unregister_after_answer(keep)
        stats = seen[-1].stats
        assert stats is not None, "the benchmark's answer failed"
        (with_hook if on else without).append(float(stats["total_ms"]))
    return without, with_hook, seen


def hook_cost_us(answers: list[Any], repeats: int) -> tuple[float, float]:
    """Microseconds per answer of WorkerMetrics.observe: first answer (label set new), then steady."""
    from app.metrics import WorkerMetrics

    first = []
    for _ in range(50):
        fresh = WorkerMetrics()
        t0 = time.perf_counter()
        fresh.observe(answers[0])
        first.append(time.perf_counter() - t0)
    metrics = WorkerMetrics()
    t0 = time.perf_counter()
    for i in range(repeats):
        metrics.observe(answers[i % len(answers)])
    steady = (time.perf_counter() - t0) / repeats
    return statistics.median(first) * 1e6, steady * 1e6


def scrape_ms(answers: list[Any]) -> float:
    """Milliseconds to render a worker registry holding every label set the run produced."""
    from prometheus_client import generate_latest

    from app.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    for answered in answers:
        metrics.observe(answered)
    t0 = time.perf_counter()
    for _ in range(200):
        generate_latest(metrics.registry)
    return (time.perf_counter() - t0) / 200 * 1000


def middleware_cost_us(requests: int) -> tuple[float, float]:
    """Microseconds per request of a bare ASGI app, and of the same app inside MetricsMiddleware."""
    from prometheus_client import CollectorRegistry

    from app.metrics.http import HttpMetrics, MetricsMiddleware

    class Route:
        path = "/v1/queries/{query_id}"

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = Route
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    wrapped = MetricsMiddleware(bare, HttpMetrics(CollectorRegistry()))

    async def noop(message: Any) -> None:
        return None

    async def run(app: Any, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await app({"type": "http", "method": "GET", "path": "/x"}, None, noop)
        return time.perf_counter() - t0

    async def rounds() -> tuple[float, float]:
        plain, metered = [], []
        for _ in range(10):  # interleaved, so both share the machine's drift
            plain.append(await run(bare, requests // 10))
            metered.append(await run(wrapped, requests // 10))
        per = requests // 10
        return statistics.median(plain) / per * 1e6, statistics.median(metered) / per * 1e6

    return asyncio.run(rounds())


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are local directories
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=20, help="answers per arm")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--target", default=None)
    parser.add_argument("--draft", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        without, with_hook, answers = answer_arms(args, Path(tmp))
    first_us, steady_us = hook_cost_us(answers, 20000)
    render_ms = scrape_ms(answers)
    bare_us, metered_us = middleware_cost_us(50000)
    answer_ms = statistics.median(without + with_hook)
    print(f"answers per arm: {args.answers}, max_tokens {args.max_tokens}, "
          f"torch threads {os.environ.get('SPECRAG_TORCH_THREADS', '1')}")  # fmt: skip
    print()
    print("| what | value |")
    print("|---|---|")
    print(f"| answer total_ms, median, no hook | {statistics.median(without):.1f} ms |")
    print(f"| answer total_ms, median, metrics hook | {statistics.median(with_hook):.1f} ms |")
    print(f"| metrics hook per answer, first of a label set | {first_us:.1f} µs |")
    print(f"| metrics hook per answer, steady | {steady_us:.1f} µs |")
    print(f"| hook / answer time (steady; first) | {steady_us / 1000 / answer_ms:.5%}; "
          f"{first_us / 1000 / answer_ms:.5%} |")  # fmt: skip
    print(f"| worker scrape (render registry) | {render_ms:.3f} ms "
          f"= {render_ms / 15000:.4%} of a 15 s scrape interval |")  # fmt: skip
    print(f"| API request, bare ASGI app | {bare_us:.1f} µs |")
    print(f"| API request, with MetricsMiddleware | {metered_us:.1f} µs "
          f"(+{metered_us - bare_us:.1f} µs) |")  # fmt: skip
    figures = {
        "hook_share_pct": steady_us / 1000 / answer_ms * 100,
        "hook_steady_us": steady_us,
        "hook_first_us": first_us,
        "answer_ms_median": answer_ms,
        "scrape_render_ms": render_ms,
        "middleware_us": metered_us - bare_us,
    }
    notes = {"hook_share_pct": f"{steady_us:.1f} µs per answer of {answer_ms:.0f} ms"}
    write_result("metrics", figures, GOALS, notes)


if __name__ == "__main__":
    main()
