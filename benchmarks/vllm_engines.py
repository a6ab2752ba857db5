"""The torch engine beside vLLM (its CPU build) in ONE run: same pair, prompts, k and method.

Engine level, both engines loaded, measured in alternation (prompt by prompt, round by round)
so that the shared machine's drift hits both alike:
1. one stream: each of the RAG prompts alone, greedy, ``--max-tokens``; tokens/s over all of
   them and the median time to first token (the engine's own ``ttft_ms``);
2. ``generate_many`` of all prompts at once: tokens/s of the whole batch;
3. acceptance: mean acceptance length and rate, from each engine's per-request stats;
and every answer must be the torch engine's (float32 greedy: token-identical).
Then the service (``--burst`` > 0, PostgreSQL and Redis needed): one ``specrag worker`` per
engine, each with its engine's default concurrency unless ``--concurrency``, answers a burst of
``--burst`` queries sent at once (benchmarks/serving.py's burst); queries/s, P50/P95 total.

Run it from .venv-vllm (which has both engines; its workers are its own ``specrag``):

    .venv-vllm/bin/python -m benchmarks.vllm_engines [--prompts 16] [--max-tokens 64] [--k 4]
        [--rounds 2] [--burst 24] [--concurrency N] [--torch-threads 1] [--unpacked]

``--unpacked`` adds the torch engine on transformers' GEMM kernels (``packed_weights=False``) as
a third engine in the same alternation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.support import DEMO, goal, write_result

GOALS = [
    goal(
        "vllm",
        "vLLM's CPU build answers as the torch engine (float32 greedy, 16 RAG prompts)",
        "identical",
        "==",
        True,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

REPO = Path(__file__).resolve().parent.parent


def rag_prompts(count: int) -> list[list[int]]:
    """RAG prompts as the service makes them for the demo pair (its chat template), from the
    bundled demo corpus."""
    from generation import load_tokenizer
    from retrieval.chat import PromptFormat
    from retrieval.prompt import Passage

    fmt = PromptFormat.for_tokenizer(load_tokenizer(str(DEMO / "target")))
    files = sorted((REPO / "demo" / "corpus").glob("*.md"))
    prompts = []
    for i in range(count):
        docs = [files[(2 * i) % len(files)], files[(2 * i + 1) % len(files)]]
        passages = [Passage(d.stem, " ".join(d.read_text().split()[:60])) for d in docs]
        prompts.append(fmt.encode(f"What is {docs[0].stem}?", passages))
    return prompts


def engine_rows(args: argparse.Namespace) -> None:
    from generation import EngineConfig, SamplingParams, load_engine

    prompts = rag_prompts(args.prompts)
    params = SamplingParams(max_new_tokens=args.max_tokens, num_speculative_tokens=args.k)
    started = time.perf_counter()
    from benchmarks.support import warm_up_torch_engine

    engines = {"torch": load_engine("torch", DEMO / "target", DEMO / "draft", device="cpu")}
    if args.unpacked:  # the torch engine again on transformers' GEMM kernels
        config = EngineConfig(packed_weights=False)
        engines["unpacked"] = load_engine(
            "torch", DEMO / "target", DEMO / "draft", device="cpu", config=config
        )
    # The worker's start measures the torch engine's step costs; without it the first
    # generate_many would measure them inside the timed batch.
    warm = sum(warm_up_torch_engine(e, args.prompts) for e in engines.values())
    loaded = time.perf_counter()
    engines["vllm"] = load_engine(
        "vllm", DEMO / "target", DEMO / "draft", device="cpu",
        options={"num_speculative_tokens": args.k},
    )  # fmt: skip
    print(f"start: torch {loaded - started:.1f} s (warm-up {warm:.1f} s), "
          f"vllm {time.perf_counter() - loaded:.1f} s")  # fmt: skip
    for engine in engines.values():  # warm both
        engine.generate(prompts[0], SamplingParams(max_new_tokens=8, num_speculative_tokens=args.k))
    one: dict[str, list[tuple[int, float, float]]] = {n: [] for n in engines}
    answers: dict[str, list[list[int]]] = {n: [] for n in engines}
    stats: dict[str, list[Any]] = {n: [] for n in engines}
    many: dict[str, list[tuple[int, float]]] = {n: [] for n in engines}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for prompt in prompts:
            for name in order:
                t = time.perf_counter()
                result = engines[name].generate(prompt, params)
                one[name].append(
                    (len(result.token_ids), time.perf_counter() - t, result.stats.ttft_ms)
                )
                if r == 0:
                    answers[name].append(result.token_ids)
                    stats[name].append(result.stats)
        for name in order:
            t = time.perf_counter()
            results = engines[name].generate_many(prompts, params)
            many[name].append((sum(len(x.token_ids) for x in results), time.perf_counter() - t))
            if r == 0:
                assert [x.token_ids for x in results] == answers["torch"], (
                    f"{name}: batched differs"
                )
    identical = True
    for name in [n for n in engines if n != "torch"]:
        same = sum(a == b for a, b in zip(answers["torch"], answers[name], strict=True))
        identical = identical and same == len(prompts)
        print(f"\n{name}: answers identical to the torch engine's: {same}/{len(prompts)} "
              "(one by one and batched)")  # fmt: skip
    torches = [n for n in engines if n != "vllm"]
    print(f"\n| {args.prompts} RAG prompts, {args.max_tokens} tokens, draft_model k={args.k} | "
          + " | ".join([*torches, "vLLM", *(f"vLLM / {n}" for n in torches)]) + " |")  # fmt: skip
    print("|---" * (2 + 2 * len(torches)) + "|")
    rate = {n: sum(x[0] for x in v) / sum(x[1] for x in v) for n, v in one.items()}
    ttft = {n: statistics.median(x[2] for x in v) for n, v in one.items()}
    batch = {n: sum(x[0] for x in v) / sum(x[1] for x in v) for n, v in many.items()}
    accl = {
        n: statistics.mean(s.to_dict()["mean_acceptance_length"] or 1 for s in v)
        for n, v in stats.items()
    }
    acc = {
        n: sum(s.num_accepted_tokens for s in v) / max(1, sum(s.num_draft_tokens for s in v))
        for n, v in stats.items()
    }
    for label, values, fmt in (
        ("one stream, tokens/s", rate, "{:.0f}"),
        ("one stream, median TTFT ms", ttft, "{:.0f}"),
        (f"generate_many({args.prompts}), tokens/s", batch, "{:.0f}"),
        ("mean acceptance length", accl, "{:.2f}"),
        ("acceptance rate", acc, "{:.3f}"),
    ):
        cells = [fmt.format(values[n]) for n in [*torches, "vllm"]]
        cells += [f"{values['vllm'] / values[n]:.2f}" for n in torches]
        print(f"| {label} | " + " | ".join(cells) + " |")
    figures = {"identical": identical, "one_stream_tokens_per_s": rate, "ttft_ms": ttft,
               "generate_many_tokens_per_s": batch, "acceptance_rate": acc}  # fmt: skip
    write_result("vllm_engines", figures, GOALS, {"identical": f"{len(prompts)} RAG prompts"})
    for engine in engines.values():
        close = getattr(engine, "close", None)
        if callable(close):
            close()


def service_rows(args: argparse.Namespace) -> None:
    from app.audit.stats import quantile
    from app.db import prepare
    from app.resources import Resources
    from app.settings import Settings
    from benchmarks.batch import FILES, setup
    from benchmarks.serving import burst, wall_seconds
    from benchmarks.support import drop_database, start_worker
    from workers import create_celery

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SPECRAG_TARGET_MODEL"] = str(DEMO / "target")
        os.environ["SPECRAG_DRAFT_MODEL"] = str(DEMO / "draft")
        env, name = setup(Path(tmp))
        try:
            settings = Settings()
            _, sf = prepare(settings)
            Resources(settings, sf).retrieval.ingest(
                [REPO / "demo" / "corpus" / f for f in FILES], collection="demo"
            )
            celery = create_celery(settings)
            rows = []
            for engine in ("torch", "vllm"):
                extra = {"SPECRAG_ENGINE": engine, "SPECRAG_WORKER_POOL": "threads"}
                if args.concurrency:
                    extra["SPECRAG_WORKER_CONCURRENCY"] = str(args.concurrency)
                if engine == "vllm":
                    extra["SPECRAG_VLLM_OPTIONS"] = f'{{"num_speculative_tokens": {args.k}}}'
                worker = start_worker(
                    env, Path(tmp) / f"{engine}.log", queues="answer", name=engine, **extra
                )
                worker.wait_ready(timeout=600)
                burst(sf, settings, celery, 2, args.max_tokens)  # warm
                got = burst(sf, settings, celery, args.burst, args.max_tokens)
                worker.stop()
                assert all(r["status"] == "succeeded" for r in got), got
                totals = [r["total_ms"] for r in got if r["total_ms"] is not None]
                rows.append((engine, args.burst / wall_seconds(got), quantile(totals, 0.5), quantile(totals, 0.95),
                             [r["answer"] for r in got]))  # fmt: skip
            same = sum(a == b for a, b in zip(rows[0][4], rows[1][4], strict=True))
            print(f"\nburst of {args.burst} on one worker: answers identical {same}/{args.burst}")
            print("| engine | queries/s | P50 total ms | P95 total ms |\n|---|---|---|---|")
            for engine, qps, p50, p95, _ in rows:
                print(f"| {engine} | {qps:.2f} | {p50:.0f} | {p95:.0f} |")
            print(
                f"| vLLM / torch | {rows[1][1] / rows[0][1]:.2f} | {rows[1][2] / rows[0][2]:.2f} | {rows[1][3] / rows[0][3]:.2f} |"
            )
        finally:
            drop_database(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burst", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=0, help="0: each engine's default")
    parser.add_argument("--skip-engines", action="store_true")
    parser.add_argument(
        "--unpacked", action="store_true",
        help="also the torch engine on transformers' GEMM kernels (packed_weights=False)",
    )  # fmt: skip
    parser.add_argument(
        "--torch-threads", type=int, default=1,
        help="torch engine threads (0: torch's default); vLLM pins its threads to core 0, and "
        "a two-thread torch region waits for its thread there at every barrier",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
        os.environ["SPECRAG_TORCH_THREADS"] = str(args.torch_threads)  # the torch worker's too
    if not args.skip_engines:
        engine_rows(args)
    if args.burst:
        service_rows(args)


if __name__ == "__main__":
    main()
