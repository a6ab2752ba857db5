"""Where the torch engine's batched rounds go on benchmarks/dtypes.py's burst (issue 34).

The torch engine as benchmarks/dtypes.py loads it (``--dtype``, draft_model k, prefix cache
256 MB, warmed as a worker), then the same burst of ``--burst`` requests of benchmarks/prefix.py's
traffic (recurring passages) through ``generate_many``, twice:

1. timed by phase: each step's schedule, prefill (the target's chunks, the draft's fill, the
   prefix cache's reuse and keep), k choice, draft passes, target verification, rejection rule,
   per-row postprocess, release (slot moves) and the rest, with the step's decode rows and
   prefill tokens; printed as ms per step and share, split into steps with and without a
   prefill chunk, and the batch sizes seen;
2. under torch.profiler, each op's self time credited to the phase it ran in (``--ops`` rows
   of the top ops per phase): which kernels a phase's time is.

The profiler's per-op overhead inflates small ops: read shares from 1, op splits from 2.

    flock /tmp/bench.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python \\
        benchmarks/burst_profile.py [--dtype bfloat16] [--burst 48] [--threads 1]
        [--prefill-chunk 2048] [--ops 0]   # another prompt-token budget per step; no profile
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.dtypes import load_all, marked  # noqa: E402
from benchmarks.vllm_engines import DEMO  # noqa: E402

PHASES = ("schedule", "prefill target", "prefill draft fill", "prefix reuse", "prefix keep",
          "choose k", "draft passes", "target verification", "rejection rule", "postprocess",
          "release", "other")  # fmt: skip


class Phases:
    """Seconds per phase of the current step, and every finished step's."""

    def __init__(self) -> None:
        self.now: dict[str, float] = collections.defaultdict(float)
        self.steps: list[dict[str, Any]] = []
        self.label: Callable[[str], Any] | None = None  # torch.profiler's record_function
        self.rows = 0
        """Decode rows of the current step's round."""
        self.counts: collections.Counter[str] = collections.Counter()
        """Totals over the run (KV positions read, gathers, prefill tokens)."""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        mark = self.label(name) if self.label else None
        if mark is not None:
            mark.__enter__()
        t = time.perf_counter()
        try:
            yield
        finally:
            self.now[name] += time.perf_counter() - t
            if mark is not None:
                mark.__exit__(None, None, None)

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        """Time every call of ``owner.attr`` as phase ``name``."""
        inner = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return inner(*args, **kwargs)

        setattr(owner, attr, timed)


def instrument(engine: Any, phases: Phases) -> None:
    """Time the phases of every ``BatchEngine.step`` of ``engine`` (functions patched in place)."""
    from generation.engine import step as engine_step
    from generation.engine.step import BatchEngine

    core = engine._core
    phases.wrap(core.target, "prefill", "prefill target")
    phases.wrap(core.target, "prefill_hidden", "prefill target")
    if core.draft is not None:
        phases.wrap(core.draft, "fill", "prefill draft fill")
    if core.prefix is not None:
        phases.wrap(core.prefix, "reuse", "prefix reuse")
        phases.wrap(core.prefix, "keep", "prefix keep")
    phases.wrap(engine_step, "choose_k", "choose k")
    choose = engine_step.choose_k

    def counted(plans: list[Any], costs: Any) -> int:
        phases.rows = len(plans)  # the round's decode rows
        return choose(plans, costs)

    engine_step.choose_k = counted
    phases.wrap(engine_step, "propose", "draft passes")
    phases.wrap(engine_step, "verify", "rejection rule")
    for attr, name in (("_schedule", "schedule"), ("_run", "target verification"),
                       ("_postprocess", "postprocess"), ("_release_finished", "release")):  # fmt: skip
        phases.wrap(BatchEngine, attr, name)
    for runner, label in ((core.target, "verification"), (core.draft, "draft")):
        if runner is not None:
            observe_rows(runner, label, phases)
    prefill = core.target.prefill

    def counted_prefill(slot: int, token_ids: list[int]) -> Any:
        phases.counts["prefill chunks run"] += 1
        phases.counts["prefill tokens run"] += len(token_ids)  # after the reused prefix
        return prefill(slot, token_ids)

    core.target.prefill = counted_prefill
    step = BatchEngine.step

    def timed_step(self: Any) -> None:
        phases.now.clear()
        phases.rows = 0
        chunks = phases.counts["prefill chunks run"]
        tokens = phases.counts["prefill tokens run"]
        t = time.perf_counter()
        step(self)
        total = time.perf_counter() - t
        row = dict(phases.now)
        row["other"] = total - sum(row.values())
        row.update(
            total=total,
            chunks=phases.counts["prefill chunks run"] - chunks,
            prefill_tokens=phases.counts["prefill tokens run"] - tokens,
            rows=phases.rows,
        )
        phases.steps.append(row)

    BatchEngine.step = timed_step  # type: ignore[method-assign]


def observe_rows(runner: Any, label: str, phases: Phases) -> None:
    """Count a batched pass's KV read: positions every row attends over (padded to the
    longest row, as generation/model/forward.py's mask is) against the rows' own, and whether the
    rows' slots are contiguous (a view) or not (a gather of every layer's KV)."""
    run = runner.run

    def counted(slots: list[int], input_ids: Any, num_tokens: list[int], *a: Any, **kw: Any) -> Any:
        if len(slots) > 1:
            starts = [runner.length(s) for s in slots]
            n = input_ids.shape[1]
            phases.counts[f"{label} passes"] += 1
            phases.counts[f"{label} gathered passes"] += slots != list(
                range(slots[0], slots[0] + len(slots))
            )
            phases.counts[f"{label} KV positions read"] += len(slots) * (max(starts) + n)
            phases.counts[f"{label} KV positions valid"] += sum(starts) + n * len(slots)
        return run(slots, input_ids, num_tokens, *a, **kw)

    runner.run = counted


def burst_prompts(args: argparse.Namespace) -> list[list[int]]:
    """benchmarks/dtypes.py's burst: requests ``burst`` .. 2 * ``burst`` of the traffic."""
    from app.settings import Settings
    from benchmarks.prefix_traffic import build_traffic
    from generation import load_tokenizer

    traffic = build_traffic(
        Settings(), load_tokenizer(str(DEMO / "target")), 2 * args.burst, seed=0,
        max_tokens=args.max_tokens, cache=REPO / "var" / "bench" / "prefix_traffic_0.json",
    )  # fmt: skip
    return [r.prompt for r in traffic[args.burst : 2 * args.burst]]


def report(steps: list[dict[str, Any]], tokens: int, secs: float) -> None:
    decode = [s for s in steps if s["rows"]]
    print(f"\n{len(steps)} steps, {tokens} tokens in {secs:.2f} s ({tokens / secs:.0f} tokens/s); "
          f"{len(decode)} with a decode round")  # fmt: skip
    sizes = collections.Counter(s["rows"] for s in decode)
    print(
        "decode rows per round (count): " + ", ".join(f"{b}: {n}" for b, n in sorted(sizes.items()))
    )
    groups = {
        "all steps": steps,
        "decode only": [s for s in decode if not s["chunks"]],
        "decode + prefill chunk": [s for s in decode if s["chunks"]],
        "prefill only": [s for s in steps if not s["rows"]],
    }
    print("| phase | " + " | ".join(f"{g} ({len(v)}), ms/step" for g, v in groups.items())
          + " | share of all time |\n|---|" + "---|" * (len(groups) + 1))  # fmt: skip
    whole = sum(s["total"] for s in steps)
    for name in (*PHASES, "total"):
        cells = [f"{1000 * sum(s.get(name, 0.0) for s in v) / max(1, len(v)):.2f}"
                 for v in groups.values()]  # fmt: skip
        share = sum(s.get(name, 0.0) for s in steps) / whole
        print(f"| {name} | " + " | ".join(cells) + f" | {share:.1%} |")
    for label, key in (("prefill tokens", "prefill_tokens"), ("prefill chunks", "chunks"),
                       ("decode rows", "rows")):  # fmt: skip
        cells = [f"{sum(s[key] for s in v) / max(1, len(v)):.1f}" for v in groups.values()]
        print(f"| {label} per step | " + " | ".join(cells) + " | |")


def op_report(prof: Any, top: int) -> None:
    """Each op's self CPU time credited to the innermost phase label above it."""
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for ev in prof.events():
        if ev.name in PHASES or ev.name.startswith("ProfilerStep"):
            continue
        parent = ev.cpu_parent
        while parent is not None and parent.name not in PHASES:
            parent = parent.cpu_parent
        per["(outside)" if parent is None else parent.name][ev.name] += ev.self_cpu_time_total
    total = sum(sum(c.values()) for c in per.values())
    print(f"\nprofiled self time {total / 1e3:.0f} ms")
    for name in sorted(per, key=lambda n: -sum(per[n].values())):
        spent = sum(per[name].values())
        print(f"\n{name}: {spent / 1e3:.0f} ms ({spent / total:.1%})")
        for op, us in per[name].most_common(top):
            print(f"  {op:<45} {us / 1e3:8.1f} ms  {us / spent:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--burst", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ops", type=int, default=8, help="top ops per phase (0: no profile)")
    parser.add_argument(
        "--prefill-chunk", type=int, default=0, help="prompt tokens per step (0: generate_many's)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from generation import SamplingParams

    torch.set_num_threads(args.threads)
    name = {"float32": "torch f32", "bfloat16": "torch bf16"}[args.dtype]
    engine = load_all(argparse.Namespace(engines=name, max_batch=args.max_batch, k=args.k))[name]
    if args.prefill_chunk:  # generate_many's batch engine reads it from the engine's config
        engine._core.config = engine.config = dataclasses.replace(
            engine._core.config, batch_prefill_chunk=args.prefill_chunk
        )
    params = SamplingParams(max_new_tokens=args.max_tokens, num_speculative_tokens=args.k)
    prompts = burst_prompts(args)
    engine.generate(marked(prompts[:1], 7)[0], params)  # as dtypes.py: kernels once
    phases = Phases()
    instrument(engine, phases)
    t = time.perf_counter()
    results = engine.generate_many(marked(prompts, 401), params)
    secs = time.perf_counter() - t
    hit = sum(r.stats.num_cached_prompt_tokens for r in results) / sum(len(p) + 1 for p in prompts)
    print(f"torch {args.dtype}, {torch.get_num_threads()} thread(s), burst of {args.burst}, "
          f"prefill chunk {engine.config.batch_prefill_chunk or engine.config.prefill_chunk}, "
          f"prefix hit rate {hit:.0%}, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    report(phases.steps, sum(len(r.token_ids) for r in results), secs)
    print("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.counts.items())))
    print(f"prompt tokens {sum(len(p) + 1 for p in prompts)}")
    if not args.ops:
        return
    phases.steps.clear()
    phases.label = torch.profiler.record_function
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        engine.generate_many(marked(prompts, 402), params)
    op_report(prof, args.ops)


if __name__ == "__main__":
    main()
