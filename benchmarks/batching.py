"""Continuous batching benchmark on the shipped demo pair (docs/results.md, "Continuous batching").

Parts (``--parts``, default all), each comparing its variants side by side in one run:

- ``many``: 16 RAG-shaped prompts (~300 tokens, 64 new), ``generate_many`` vs the same
  requests one by one through ``generate`` (draft model, k ``auto``), end to end including
  prefill; answers must be identical. Also a batch of one vs ``generate``.
- ``sweep``: tokens/s by batch size (1 .. 32) for none, fixed k = 1, 2, 4 and auto, and the
  mean k goodput chose.
- ``stall``: a long prompt arrives while rows decode: the longest gap between a running row's
  rounds, per prefill chunk size.
- ``memory``: KV bytes per slot and for the default batch.

    SPECRAG_TORCH_THREADS=1 .venv/bin/python -m benchmarks.batching
    .venv/bin/python -m benchmarks.batching --parts many --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.support import goal, write_result
from generation import SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from generation.model.kv_store import KVShape
from generation.model.loading import load_tokenizer

GOALS = [
    goal(
        "batching",
        "generate_many of 16 RAG prompts / the same one by one, tokens/s",
        "many_vs_one_by_one",
        ">=",
        2.5,
        "x",
    ),
    goal("batching", "a batch of one / generate, tokens/s", "batch_of_one", ">=", 0.95, "x"),
    goal(
        "batching",
        "k auto / the best fixed k at the worst batch size",
        "auto_vs_best_worst",
        ">=",
        0.95,
        "x",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

MAX_NEW = 64


def rag_prompts(tokenizer: Any, count: int, length: int = 300) -> list[list[int]]:
    """Return ``count`` RAG prompts in the product's format from the demo corpus (~``length``)."""
    from retrieval.prompt import Passage, format_prompt

    files = sorted(Path("demo/corpus").glob("*.md"))
    prompts = []
    for i in range(count):
        docs = [files[(3 * i + j) % len(files)] for j in range(3)]
        passages = [Passage(d.stem, " ".join(d.read_text().split()[:90])) for d in docs]
        text = format_prompt(f"What is {docs[0].stem.replace('-', ' ')}?", passages)
        prompts.append(tokenizer(text)["input_ids"][-length:])
    return prompts


def tokens_per_second(results: list[Any], seconds: float) -> float:
    return sum(len(r.token_ids) for r in results) / seconds


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def part_many(
    engine: SpeculativeEngine, prompts: list[list[int]], repeats: int, figures: dict
) -> None:
    params = SamplingParams(
        max_new_tokens=MAX_NEW, method="draft_model", num_speculative_tokens="auto"
    )
    one, many, alone, single = [], [], [], []
    same = True
    for _ in range(repeats):
        seq, t_seq = timed(lambda: [engine.generate(p, params) for p in prompts])
        bat, t_bat = timed(lambda: engine.generate_many(prompts, params, max_batch_size=16))
        same &= [r.token_ids for r in seq] == [r.token_ids for r in bat]
        one.append(tokens_per_second(seq, t_seq))
        many.append(tokens_per_second(bat, t_bat))
        # A batch of one against generate, prompt by prompt, alternating.
        for p in prompts[:8]:
            g, t_g = timed(lambda p=p: [engine.generate(p, params)])
            b, t_b = timed(lambda p=p: engine.generate_many([p], params))
            alone.append(tokens_per_second(g, t_g))
            single.append(tokens_per_second(b, t_b))
    print(f"\n## many: {len(prompts)} prompts x {MAX_NEW} new tokens, draft_model k=auto")
    print("| variant | tokens/s (median) | ratio |")
    print("|---|---|---|")
    base = statistics.median(one)
    print(f"| generate, one by one | {base:.1f} | 1.00 |")
    print(
        f"| generate_many, max_batch_size=16 | {statistics.median(many):.1f} | {statistics.median(many) / base:.2f} |"
    )
    print(f"answers identical: {same}")
    ratio = statistics.median(s / a for s, a in zip(single, alone, strict=True))
    print(f"batch of one (generate_many([p])) / generate, median over prompts: {ratio:.3f}")
    figures.update(many_vs_one_by_one=statistics.median(many) / base, batch_of_one=ratio,
                   identical=same)  # fmt: skip
    # Where the time goes: both paths prefill every prompt (target and draft) one by one, and
    # a prefill is arithmetic (hundreds of tokens a pass), which batching cannot share.
    tokens = sum(len(r.token_ids) for r in seq)
    t_one, t_many = tokens / base, tokens / statistics.median(many)
    t_pre = statistics.median(prefill_seconds(engine, prompts) for _ in range(repeats))
    print(
        f"phases: prefill of the {len(prompts)} prompts (target + draft) {t_pre:.2f} s of "
        f"{t_one:.2f} s one by one ({100 * t_pre / t_one:.0f} %) and of {t_many:.2f} s batched; "
        f"decode alone one by one {t_one - t_pre:.2f} s vs batched {t_many - t_pre:.2f} s "
        f"({(t_one - t_pre) / max(t_many - t_pre, 1e-9):.2f}x); ceiling if batched decode cost "
        f"nothing: {t_one / t_pre:.2f}x"
    )


def prefill_seconds(engine: SpeculativeEngine, prompts: list[list[int]]) -> float:
    """Seconds to prefill every prompt into a fresh slot, target and draft, as both paths do."""
    from generation.model.model_runner import ModelRunner

    capacity = max(map(len, prompts))
    runners = [ModelRunner(engine.target_forward, 1, capacity)]
    if engine.draft_forward is not None:
        runners.append(ModelRunner(engine.draft_forward, 1, capacity))
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            for runner in runners:
                runner.set_length(0, 0)
                runner.prefill(0, prompt)
    return time.perf_counter() - start


def part_sweep(
    engine: SpeculativeEngine, prompts: list[list[int]], sizes: list[int], repeats: int,
    figures: dict,
) -> None:  # fmt: skip
    """Each cell is the median of ``repeats`` runs; the settings alternate within a repeat."""
    settings: list[tuple[str, str, int | str]] = [
        ("none", "none", 1),
        ("k=1", "draft_model", 1),
        ("k=2", "draft_model", 2),
        ("k=4", "draft_model", 4),
        ("auto", "draft_model", "auto"),
    ]
    print(
        f"\n## sweep: tokens/s by batch size ({MAX_NEW} new tokens, max(16, B) prompts, median of {repeats})"
    )
    print(
        "| B | "
        + " | ".join(name for name, _, _ in settings)
        + " | auto / best fixed | auto's mean k |"
    )
    print("|---" * (len(settings) + 3) + "|")
    for size in sizes:
        batch = [prompts[i % len(prompts)] for i in range(max(16, size))]
        runs: dict[str, list[float]] = {name: [] for name, _, _ in settings}
        chosen_runs: list[float] = []
        for _ in range(repeats):
            for name, method, k in settings:
                params = SamplingParams(
                    max_new_tokens=MAX_NEW, method=method, num_speculative_tokens=k
                )
                results, seconds = timed(
                    lambda b=batch, p=params, s=size: engine.generate_many(b, p, max_batch_size=s)
                )
                runs[name].append(tokens_per_second(results, seconds))
                if k == "auto":
                    chosen_runs.append(
                        statistics.mean(r.stats.mean_chosen_k or 0.0 for r in results)
                    )
        rates = {name: statistics.median(v) for name, v in runs.items()}
        chosen = statistics.mean(chosen_runs)
        best = max(v for n, v in rates.items() if n != "auto")
        cells = " | ".join(f"{rates[n]:.1f}" for n, _, _ in settings)
        print(f"| {size} | {cells} | {rates['auto'] / best:.2f} | {chosen:.2f} |")
        figures.setdefault("auto_vs_best_by_size", {})[size] = rates["auto"] / best
    worst = min(figures["auto_vs_best_by_size"].values())
    figures["auto_vs_best_worst"] = worst


def part_stall(engine: SpeculativeEngine, prompts: list[list[int]], chunks: list[int]) -> None:
    long_prompt = [t for p in prompts for t in p][: engine.max_context - 80]
    print(f"\n## stall: a {len(long_prompt)}-token prompt arrives while 8 rows decode")
    print("| prefill chunk | median gap between steps (ms) | longest gap after arrival (ms) |")
    print("|---|---|---|")
    params = SamplingParams(max_new_tokens=400, method="draft_model", num_speculative_tokens=2)
    for chunk in chunks:
        config = dataclasses.replace(engine.config, max_batch_size=9, prefill_chunk=chunk)
        loop = SpeculativeEngine(engine.target, engine.draft, config=config).start_loop(9)
        # Every row's bursts are stamped; a step's bursts land together, so stamps more than a
        # millisecond apart mark the steps (any row may stop at EOS, the batch goes on).
        stamps: list[float] = []
        started = threading.Event()

        def mark(ids: list[int], stamps: list[float] = stamps, started: Any = started) -> None:
            stamps.append(time.perf_counter())
            if len(stamps) >= 40:
                started.set()

        handles = [loop.submit(p, params, on_delta=mark) for p in prompts[:8]]
        started.wait(300)
        arrival = time.perf_counter()
        handles.append(loop.submit(long_prompt, SamplingParams(max_new_tokens=4)))
        for h in handles:
            h.result(timeout=600)
        loop.close()
        steps = [t for i, t in enumerate(stamps) if i == 0 or t - stamps[i - 1] > 0.001]
        gaps = [(b, b - a) for a, b in zip(steps, steps[1:], strict=False)]
        before = [g for t, g in gaps if t < arrival]
        after = [g for t, g in gaps if t >= arrival][:10]
        worst = f"{1000 * max(after):.0f}" if after else "every row ended before the arrival"
        print(f"| {chunk} | {1000 * statistics.median(before):.0f} | {worst} |")


def part_memory(engine: SpeculativeEngine) -> None:
    print("\n## memory: KV cache bytes (float32 on CPU)")
    print("| model | bytes per token | per slot at 512 positions | per slot at the full context |")
    print("|---|---|---|---|")
    for name, model in (("target", engine.target), ("draft", engine.draft)):
        if model is None:
            continue
        per = KVShape.of(model).bytes_per_token()
        print(
            f"| {name} | {per} | {per * 512 / 2**20:.1f} MiB | {per * engine.max_context / 2**20:.1f} MiB |"
        )
    print(
        f"max_concurrency={engine.max_concurrency}: {engine.kv_bytes_per_slot / 2**20:.0f} MiB per slot "
        f"(the full context of {engine.max_context} and one round), "
        f"{engine.kv_bytes_per_slot * engine.max_concurrency / 2**20:.0f} MiB allocated"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="models/demo/target")
    parser.add_argument("--draft", default="models/demo/draft")
    parser.add_argument("--parts", default="memory,many,sweep,stall")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    parser.add_argument("--chunks", default="4096,512,256,128")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("SPECRAG_TORCH_THREADS", "1")))
    sizes = [int(s) for s in args.sizes.split(",")]
    config = EngineConfig(max_batch_size=max(16, *sizes))
    engine = SpeculativeEngine.from_pretrained(args.target, args.draft, device="cpu", config=config)
    tokenizer = load_tokenizer(args.target)
    prompts = rag_prompts(tokenizer, 16)
    print(f"prompt lengths: {min(map(len, prompts))}..{max(map(len, prompts))} tokens")
    start = time.perf_counter()
    engine.warmup(batch_sizes=tuple(sizes))
    print(f"warm-up (KV store and T(B, k) for B in {sizes}): {time.perf_counter() - start:.1f} s")
    parts = args.parts.split(",")
    figures: dict = {g["figure"]: None for g in GOALS}  # None: the part was not run
    if "memory" in parts:
        part_memory(engine)
    if "many" in parts:
        part_many(engine, prompts, args.repeats, figures)
    if "sweep" in parts:
        part_sweep(engine, prompts, sizes, args.repeats, figures)
    if "stall" in parts:
        part_stall(engine, prompts, [int(c) for c in args.chunks.split(",")])
    notes = {"many_vs_one_by_one": f"{torch.get_num_threads()} torch thread(s)"}
    write_result("batching", figures, GOALS, notes)


if __name__ == "__main__":
    main()
