"""The torch engine against an older checkout of it, side by side in one run, on the demo pair.

Two worker processes, one per tree (this one and ``--old``, e.g. a ``git worktree add`` of an
earlier commit), each load the demo pair once; the driver sends them the same work in turns,
alternating which goes first, and prints each tree's median and the ratio new / old:

- ``generate``: each of ``--prompts`` RAG prompts alone (64 new tokens), per method, old and
  new back to back on the same prompt (ratios are taken per pair: load drifts between pairs);
- ``many``: the 16 RAG prompts as one ``generate_many`` at ``max_batch_size=16`` (k ``auto``);
- ``start``: a fresh process per tree: import, load, and a worker's warm-up (a 2-token
  ``generate``, ``warmup`` of the step costs for B = 1, 2, 4, a loop of 4 started), in turns.

Greedy answers of both trees must be identical. One torch thread per process.

    git worktree add /tmp/engine-old c1b5622
    .venv/bin/python benchmarks/engine_ab.py --old /tmp/engine-old
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFT = "models/demo/target", "models/demo/draft"
SETTINGS = [("draft_model", 4), ("draft_model", "auto"), ("ngram", 4), ("none", 1)]
"""Methods of the ``generate`` part (``--settings`` picks some by index)."""
MAX_NEW = 64


def load(tree: str, batch: int) -> Any:
    """Import the engine of ``tree`` and load the demo pair (``batch`` KV slots where the tree
    has an engine config)."""
    sys.path.insert(0, tree)
    import torch

    torch.set_num_threads(1)
    import generation

    kwargs: dict[str, Any] = {}
    if hasattr(generation, "EngineConfig"):
        kwargs["config"] = generation.EngineConfig(max_batch_size=batch)
    return generation.SpeculativeEngine.from_pretrained(TARGET, DRAFT, device="cpu", **kwargs)


def worker(tree: str) -> None:
    """Answer the driver's requests (one JSON line each) with timings (one JSON line each)."""
    engine = load(tree, 16)
    from generation import SamplingParams

    engine.warmup(batch_sizes=(1, 16))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        params = SamplingParams(
            max_new_tokens=MAX_NEW, method=job["method"], num_speculative_tokens=job["k"]
        )
        start, cpu = time.perf_counter(), time.process_time()
        if job["kind"] == "generate":
            outputs = [engine.generate(p, params).token_ids for p in job["prompts"]]
        else:
            results = engine.generate_many(job["prompts"], params, max_batch_size=16)
            outputs = [r.token_ids for r in results]
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(json.dumps({"seconds": seconds, "cpu": cpu, "outputs": outputs}), flush=True)


def start_time(tree: str) -> None:
    """Print the seconds from before the import to a worker's warmed-up, started loop."""
    started = time.perf_counter()
    engine = load(tree, 4)
    from generation import SamplingParams

    engine.generate(list(range(5, 25)), SamplingParams(max_new_tokens=2))
    engine.warmup(batch_sizes=(1, 2, 4))
    loop = engine.start_loop(4)
    ready = time.perf_counter() - started
    loop.close()
    print(json.dumps({"seconds": ready}))


class Worker:
    def __init__(self, tree: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", tree],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self.readline())["ready"]

    def readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("worker died")
        return line

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="a checkout of the older engine (required)")
    parser.add_argument("--new", default=str(ROOT))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--parts", default="generate,many,start")
    parser.add_argument("--settings", default="0,1,2,3", help="indexes into SETTINGS")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--start-time", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    if args.start_time:
        return start_time(args.start_time)
    if not args.old:
        parser.error("--old: a checkout of the older engine is required")
    sys.path.insert(0, str(ROOT))
    from benchmarks.batching import rag_prompts
    from generation.model.loading import load_tokenizer

    prompts = rag_prompts(load_tokenizer(TARGET), 16)
    trees = {"old": args.old, "new": args.new}
    parts = args.parts.split(",")
    rows: list[tuple[str, dict[str, list[float]]]] = []
    if "generate" in parts or "many" in parts:
        workers = {name: Worker(tree) for name, tree in trees.items()}
        jobs = []
        if "generate" in parts:
            for method, k in [SETTINGS[int(i)] for i in args.settings.split(",")]:
                for i in range(args.prompts):  # one prompt a job: old and new back to back
                    jobs.append((f"generate {method} k={k}", "generate", method, k, [prompts[i]]))
        if "many" in parts:
            jobs.append(
                ("generate_many x16, draft_model auto", "many", "draft_model", "auto", prompts)
            )
        results: dict[str, dict[str, list[float]]] = {}
        for r in range(args.rounds):
            for j, (label, kind, method, k, batch) in enumerate(jobs):
                rates = results.setdefault(label, {"old": [], "new": [], "ratio": [], "cpu": []})
                outputs, rate, cpu = {}, {}, {}
                for name in ["old", "new"] if (r + j) % 2 == 0 else ["new", "old"]:
                    got = workers[name].run(
                        {"kind": kind, "method": method, "k": k, "prompts": batch}
                    )
                    rate[name] = sum(len(o) for o in got["outputs"]) / got["seconds"]
                    cpu[name] = got["cpu"]
                    rates[name].append(rate[name])
                    outputs[name] = got["outputs"]
                rates["ratio"].append(rate["new"] / rate["old"])
                rates["cpu"].append(cpu["old"] / cpu["new"])  # CPU seconds: immune to waiting
                assert outputs["old"] == outputs["new"], f"{label}: greedy answers differ"
            print(f"round {r + 1} done", flush=True)
        rows.extend((label + " (tokens/s)", v) for label, v in results.items())
        for w in workers.values():
            w.close()
    if "start" in parts:
        starts: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.starts):
            for name in ["old", "new"] if r % 2 == 0 else ["new", "old"]:
                out = subprocess.run(
                    [sys.executable, __file__, "--start-time", trees[name]],
                    cwd=ROOT, capture_output=True, text=True, check=True,
                )  # fmt: skip
                starts[name].append(json.loads(out.stdout.splitlines()[-1])["seconds"])
        starts["ratio"] = [n / o for o, n in zip(starts["old"], starts["new"], strict=True)]
        rows.append(("worker start, warm-up included (s)", starts))
    print(f"\n{args.rounds} rounds, {args.prompts} prompts alone, 16 batched, {MAX_NEW} new tokens")
    print(
        "| measure | old (median) | new (median) | new / old: median of pairs [quartiles] | pairs "
        "| the same on CPU seconds of the process [quartiles] |"
    )
    print("|---|---|---|---|---|---|")
    for label, values in rows:
        old, new = statistics.median(values["old"]), statistics.median(values["new"])
        ratios = values["ratio"]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        cpu = values.get("cpu") or [float("nan")] * 3
        c = statistics.quantiles(cpu, n=4) if len(cpu) > 1 else [cpu[0]] * 3
        print(
            f"| {label} | {old:.2f} | {new:.2f} | {statistics.median(ratios):.3f} "
            f"[{q[0]:.3f}, {q[2]:.3f}] | {len(ratios)} | {statistics.median(cpu):.3f} "
            f"[{c[0]:.3f}, {c[2]:.3f}] |"
        )


if __name__ == "__main__":
    main()
