"""benchmarks/dtypes.py's burst of 48 on the torch engine: this tree against an older checkout
(and/or prompt-token budgets against each other), A/B in alternating runs (issue 34).

One worker process per tree (this one, and ``--old``: e.g. ``git worktree add /tmp/burst-old
main``) loads the demo pair as benchmarks/dtypes.py does (``--dtype``, draft_model, prefix cache
256 MB, warmed as a worker); the driver sends both the same burst (requests 48-95 of
benchmarks/prefix.py's traffic, seed 0) in turns, alternating which goes first, each run behind a
marker token of its own (its prefixes start cold, as dtypes.py's burst does). ``--budgets``:
also alternate the prompt-token budget per step (``generate_many``'s ``prefill_chunk``; 0: the
engine's default). Prints tokens/s per variant and round, medians, and each variant against
the first; then every variant once more on the same prompts: greedy float32 answers must be
identical across variants (the script checks; bf16 ones may differ at near-ties: counted).

    git worktree add /tmp/burst-old main
    flock /tmp/bench.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python \\
        benchmarks/burst_ab.py --old /tmp/burst-old [--dtype bfloat16] [--rounds 3] \\
        [--budgets 0,2048] [--core 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def worker(tree: str, dtype: str, burst: int, max_tokens: int, k: int) -> None:
    """Load the engine of ``tree``; answer the driver's jobs (JSON lines) with timings."""
    sys.path.insert(0, tree)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from benchmarks.burst_profile import burst_prompts
    from benchmarks.dtypes import load_all, marked
    from generation import SamplingParams

    name = {"float32": "torch f32", "bfloat16": "torch bf16"}[dtype]
    engine = load_all(argparse.Namespace(engines=name, max_batch=16, k=k))[name]
    params = SamplingParams(max_new_tokens=max_tokens, num_speculative_tokens=k)
    prompts = burst_prompts(argparse.Namespace(burst=burst, max_tokens=max_tokens))
    engine.generate(marked(prompts[:1], 7)[0], params)  # as dtypes.py: kernels once
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        kwargs: dict[str, Any] = {}
        if job["budget"]:
            kwargs["prefill_chunk"] = job["budget"]
        batch = marked(prompts, job["marker"])
        started = time.perf_counter()
        if kwargs:  # the budget of this run: a batch engine of the tree's own, as generate_many
            from generation.engine.step import BatchEngine
            from generation.torch_engine import run_many

            with engine._lock:
                size = min(16, engine.max_concurrency)
                results = run_many(BatchEngine(engine._core, size, False, **kwargs), batch,
                                   [params] * len(batch))  # fmt: skip
        else:
            results = engine.generate_many(batch, params)
        secs = time.perf_counter() - started
        tokens = [r.token_ids for r in results]
        print(json.dumps({"tokens": sum(map(len, tokens)), "secs": secs, "answers": tokens}),
              flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="", help="an older checkout (none: budgets only)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budgets", default="0", help="prompt tokens per step (0: default)")
    parser.add_argument("--burst", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--core", type=int, default=-1, help="pin the workers to this core")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.dtype, args.burst, args.max_tokens, args.k)
        return
    trees = {"new": str(ROOT)}
    if args.old:
        trees = {"old": str(Path(args.old).resolve()), **trees}
    procs = {}
    for label, tree in trees.items():
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", tree,
               "--dtype", args.dtype, "--burst", str(args.burst),
               "--max-tokens", str(args.max_tokens), "--k", str(args.k)]  # fmt: skip
        if args.core >= 0:
            cmd = ["taskset", "-c", str(args.core), *cmd]
        env = {**os.environ, "PYTHONPATH": tree}
        procs[label] = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree
        )
    for label, proc in procs.items():
        assert proc.stdout is not None
        for line in proc.stdout:  # loading messages until the worker says it is ready
            if line.startswith("{"):
                break
        print(f"{label}: ready", flush=True)
    budgets = [int(b) for b in args.budgets.split(",")]
    variants = [(t, b) for t in trees for b in budgets]
    rates: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    answers: dict[tuple[str, int], list[list[int]]] = {}
    marker = 500
    for r in range(args.rounds):
        for tree, budget in variants if r % 2 == 0 else variants[::-1]:
            proc = procs[tree]
            assert proc.stdin is not None and proc.stdout is not None
            marker += 1
            proc.stdin.write(json.dumps({"budget": budget, "marker": marker}) + "\n")
            proc.stdin.flush()
            out = json.loads(proc.stdout.readline())
            rates[(tree, budget)].append(out["tokens"] / out["secs"])
            print(f"round {r + 1} {tree} budget {budget or 'default'}: "
                  f"{out['tokens'] / out['secs']:.0f} tokens/s (load {os.getloadavg()[0]:.1f})",
                  flush=True)  # fmt: skip
    # Answers: every variant once more on the same prompts (one marker for all; timed runs
    # each had their own, so their answers are not comparable).
    for tree, budget in variants:
        proc = procs[tree]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"budget": budget, "marker": 900}) + "\n")
        proc.stdin.flush()
        answers[(tree, budget)] = json.loads(proc.stdout.readline())["answers"]
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    first = variants[0]
    print(f"\n| torch {args.dtype}, burst of {args.burst}, tokens/s | "
          + " | ".join(f"round {r + 1}" for r in range(args.rounds))
          + f" | median | vs {first[0]} {first[1] or 'default'} |\n|---" + "|---" * (args.rounds + 2)
          + "|")  # fmt: skip
    base = statistics.median(rates[first])
    for tree, budget in variants:
        med = statistics.median(rates[(tree, budget)])
        print(f"| {tree}, budget {budget or 'default'} | "
              + " | ".join(f"{x:.0f}" for x in rates[(tree, budget)])
              + f" | {med:.0f} | {med / base:.2f}x |")  # fmt: skip
    same = {v: sum(a == b for a, b in zip(answers[first], answers[v], strict=True))
            for v in variants}  # fmt: skip
    print("answers identical to the first variant's: "
          + ", ".join(f"{t} {b or 'default'} {n}/{args.burst}" for (t, b), n in same.items()))  # fmt: skip
    if args.dtype == "float32" and any(n != args.burst for n in same.values()):
        sys.exit("float32 answers differ between variants: not bit-exact")


if __name__ == "__main__":
    main()
