"""Prefix reuse on production-like RAG traffic: the torch engine beside vLLM, in one run.

Traffic (benchmarks/prefix_workload.py): questions over the demo corpus with Zipf-popular
documents and repeated questions, prompts built by the product's retrieval and prompt code.
Both engines run the demo pair in float32, draft model k = 4, greedy, ``--max-tokens`` new
tokens, at most ``--max-batch`` requests at once; vLLM with ``enable_prefix_caching``. Every
scenario starts from an empty prefix cache on both engines, and runs the torch engine, then
vLLM, on the same requests:

- ``one by one``: each request alone after the last finished: TTFT p50 / p95, the request's
  tokens/s end to end, and the one-stream decode rate (tokens after the first / time after it);
- ``burst``: ``--burst`` requests submitted at once: tokens/s over the burst;
- ``poisson``: the same requests arriving as a Poisson process at ``--rate`` requests/s
  (default: 60 % of the slower engine's burst rate): TTFT p50 / p95.

Hit rate = prompt tokens reused / prompt tokens (vLLM: ``num_cached_tokens``). Answers are
compared token for token between the engines, and with the target alone (torch engine, method
none). The machine's load average is printed beside each scenario: the CPU is shared.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.prefix [--requests 48] [--burst 48]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from app.audit.stats import quantile
from benchmarks.prefix_workload import (
    Outcome,
    TorchRunner,
    VLLMRunner,
    build_traffic,
    shared_prefix_share,
    target_alone,
)
from benchmarks.support import goal, write_result

GOALS = [
    goal(
        "prefix reuse",
        "one-stream decode tokens/s / vLLM's (demo pair, float32)",
        "stream_vs_vllm",
        ">=",
        2.0,
        "x",
    ),
    goal(
        "prefix reuse",
        "burst of 48 over recurring passages, tokens/s / vLLM's",
        "burst_vs_vllm",
        ">=",
        1.3,
        "x",
    ),
    goal("prefix reuse", "median TTFT one by one / vLLM's", "ttft_vs_vllm", "<=", 0.5, "x"),
    goal(
        "prefix reuse",
        "answers identical to vLLM's and the target alone's (float32)",
        "identical",
        "==",
        True,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

REPO = Path(__file__).resolve().parents[1]


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def one_by_one(runner: Any, prompts: list[list[int]], max_tokens: int) -> list[Outcome]:
    return [runner.submit(p, max_tokens).result() for p in prompts]


def burst(runner: Any, prompts: list[list[int]], max_tokens: int) -> tuple[list[Outcome], float]:
    start = time.perf_counter()
    futures = [runner.submit(p, max_tokens) for p in prompts]
    outs = [f.result() for f in futures]
    return outs, time.perf_counter() - start


def poisson(
    runner: Any, prompts: list[list[int]], max_tokens: int, gaps: list[float]
) -> list[Outcome]:
    start, futures, at = time.perf_counter(), [], 0.0
    for prompt, gap in zip(prompts, gaps, strict=True):
        at += gap
        time.sleep(max(0.0, start + at - time.perf_counter()))
        futures.append(runner.submit(prompt, max_tokens))
    return [f.result() for f in futures]


def hit_rate(outs: list[Outcome], prompts: list[list[int]]) -> float:
    return sum(o.cached for o in outs) / sum(len(p) for p in prompts)


def tokens(outs: list[Outcome]) -> int:
    return sum(len(o.tokens) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=48, help="one-by-one and Poisson requests")
    ap.add_argument("--burst", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=int(os.environ.get("SPECRAG_TORCH_THREADS", "2"))
    )
    ap.add_argument("--engines", default="torch,vllm", help="of torch, torch-off, vllm")
    ap.add_argument("--prefix-mb", type=float, default=256.0, help="torch engine's prefix cache")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch

    from app.settings import Settings
    from generation.model.loading import load_tokenizer

    torch.set_num_threads(args.threads)
    target, draft = str(REPO / "models/demo/target"), str(REPO / "models/demo/draft")
    n = max(args.requests, args.burst)
    traffic = build_traffic(
        Settings(), load_tokenizer(target), 2 * n, seed=args.seed, max_tokens=args.max_tokens,
        cache=REPO / "var" / "bench" / f"prefix_traffic_{args.seed}.json",
    )  # fmt: skip
    # The one-by-one and Poisson scenarios take the first requests; the burst the next ones.
    seq = [r.prompt for r in traffic[: args.requests]]
    bur = [r.prompt for r in traffic[n : n + args.burst]]
    lens = [len(p) for p in seq + bur]
    print(f"traffic: {len(traffic)} requests, prompt tokens p50 {statistics.median(lens):.0f} "
          f"(min {min(lens)}, max {max(lens)}), repeated questions "
          f"{sum(r.repeat for r in traffic[:n])}/{n}; ideal reuse one-by-one "
          f"{shared_prefix_share(seq):.0%}, burst {shared_prefix_share(bur):.0%}")  # fmt: skip
    print(f"cpus {os.cpu_count()}, torch threads {args.threads}, load {load()}")
    runners: dict[str, Any] = {}
    for name in args.engines.split(","):
        t = time.perf_counter()
        if name in ("torch", "torch-off"):  # torch-off: the same engine with reuse off
            mb = args.prefix_mb if name == "torch" else 0.0
            runners[name] = TorchRunner(target, draft, args.k, args.max_batch, mb)
        else:
            runners[name] = VLLMRunner(target, draft, args.k, args.max_batch)
        warm = [random.Random(i).choices(range(300, 8000), k=200) for i in range(3)]
        burst(runners[name], warm, 8)
        print(f"{name}: loaded and warmed in {time.perf_counter() - t:.0f} s")
    rows: dict[str, dict[str, Any]] = {name: {} for name in runners}
    answers: dict[str, list[list[int]]] = {}
    for name, r in runners.items():
        r.reset_cache()
        before = load()
        outs = one_by_one(r, seq, args.max_tokens)
        wall = sum(o.done - o.submitted for o in outs)  # type: ignore[operator]
        decode = [(len(o.tokens) - 1) / (o.done - o.first) for o in outs if len(o.tokens) > 1]  # type: ignore[operator]
        ttft = [o.ttft * 1000 for o in outs]
        rows[name].update(
            ttft50=quantile(ttft, 0.5), ttft95=quantile(ttft, 0.95), seq_tps=tokens(outs) / wall,
            stream_tps=statistics.median(decode), seq_hit=hit_rate(outs, seq),
            seq_load=f"{before} -> {load()}",
        )  # fmt: skip
        answers[name] = [o.tokens for o in outs]
        print(f"{name} one by one: {rows[name]}", flush=True)
    for name, r in runners.items():
        r.reset_cache()
        before = load()
        outs, secs = burst(r, bur, args.max_tokens)
        rows[name].update(burst_tps=tokens(outs) / secs, burst_hit=hit_rate(outs, bur),
                          burst_load=f"{before} -> {load()}", burst_rps=len(bur) / secs)  # fmt: skip
        answers[name + "-burst"] = [o.tokens for o in outs]
        print(f"{name} burst: {rows[name]['burst_tps']:.1f} tokens/s", flush=True)
    rate = args.rate or 0.6 * min(row["burst_rps"] for row in rows.values())
    rng = random.Random(args.seed + 1)
    gaps = [rng.expovariate(rate) for _ in seq]
    for name, r in runners.items():
        r.reset_cache()
        before = load()
        outs = poisson(r, seq, args.max_tokens, gaps)
        ttft = [o.ttft * 1000 for o in outs]
        rows[name].update(p_ttft50=quantile(ttft, 0.5), p_ttft95=quantile(ttft, 0.95),
                          p_hit=hit_rate(outs, seq), p_load=f"{before} -> {load()}")  # fmt: skip
    report(rows, args, rate)
    others = [n for n in runners if n != "torch"]
    if "torch" in runners and others:
        for part in ("", "-burst"):
            a, b = answers["torch" + part], answers[others[0] + part]
            same = sum(x == y for x, y in zip(a, b, strict=True))
            print(f"answers torch == {others[0]}{part or ' (one by one)'}: {same}/{len(a)}")
    for r in runners.values():
        r.close()
    alone = target_alone(target, seq + bur, args.max_tokens)
    identical = True
    for name in runners:
        got = answers[name] + answers[name + "-burst"]
        same = sum(x == y for x, y in zip(got, alone, strict=True))
        identical = identical and same == len(got)
        print(f"answers {name} == target alone (one by one and burst): {same}/{len(got)}")
    record(rows, identical)


def record(rows: dict[str, dict[str, Any]], identical: bool) -> None:
    """The goals' figures: the torch engine against vLLM where both ran."""
    both = "torch" in rows and "vllm" in rows

    def over(key: str) -> float | None:
        return rows["torch"][key] / rows["vllm"][key] if both and rows["vllm"][key] else None

    figures = {
        "stream_vs_vllm": over("stream_tps"),
        "burst_vs_vllm": over("burst_tps"),
        "ttft_vs_vllm": over("ttft50"),
        "identical": identical,
        "rows": rows,
    }
    notes = {}
    if both:
        t, v = rows["torch"], rows["vllm"]
        notes = {
            "stream_vs_vllm": f"{t['stream_tps']:.0f} against {v['stream_tps']:.0f} tokens/s",
            "burst_vs_vllm": f"hit rate {t['burst_hit']:.1%} against {v['burst_hit']:.1%}",
            "ttft_vs_vllm": f"{t['ttft50']:.0f} against {v['ttft50']:.0f} ms",
        }
    write_result("prefix", figures, GOALS, notes)


def report(rows: dict[str, dict[str, Any]], args: Any, rate: float) -> None:
    names = list(rows)
    other = "vllm" if "vllm" in rows else "torch-off"
    base = rows.get(other) if "torch" in rows else None
    print(f"\n## prefix: {args.requests} one by one / burst of {args.burst} / Poisson "
          f"{rate:.2f} req/s; {args.max_tokens} new tokens, draft k={args.k}, "
          f"max batch {args.max_batch}")  # fmt: skip
    print("| metric | " + " | ".join(names) + (f" | torch / {other} |" if base else " |"))
    print("|---|" + "---|" * (len(names) + (1 if base else 0)))
    for key, label, fmt in (
        ("stream_tps", "one stream decode tokens/s (median)", "{:.1f}"),
        ("seq_tps", "one by one tokens/s (end to end)", "{:.1f}"),
        ("ttft50", "TTFT p50 one by one (ms)", "{:.0f}"),
        ("ttft95", "TTFT p95 one by one (ms)", "{:.0f}"),
        ("seq_hit", "prefix hit rate one by one", "{:.1%}"),
        ("burst_tps", f"burst of {args.burst} tokens/s", "{:.1f}"),
        ("burst_hit", "prefix hit rate burst", "{:.1%}"),
        ("p_ttft50", "TTFT p50 Poisson (ms)", "{:.0f}"),
        ("p_ttft95", "TTFT p95 Poisson (ms)", "{:.0f}"),
        ("p_hit", "prefix hit rate Poisson", "{:.1%}"),
    ):
        cells = [fmt.format(rows[n][key]) for n in names]
        ratio = ""
        if base and "hit" not in key:
            ratio = f" {rows['torch'][key] / base[key]:.2f} |" if base[key] else " - |"
        elif base:
            ratio = " |"
        print(f"| {label} | " + " | ".join(cells) + " |" + ratio)
    for n in names:
        print(f"load {n}: one by one {rows[n]['seq_load']}, burst {rows[n]['burst_load']}, "
              f"Poisson {rows[n]['p_load']}")  # fmt: skip


if __name__ == "__main__":
    main()
