"""float32 and bfloat16 on both engines in ONE run: torch f32, torch bf16, vLLM bf16, vLLM f32.

Same demo pair, prompts, draft_model k and greedy decoding for all four, loaded together and
measured in alternation (prompt by prompt) so the shared machine's drift hits them alike:
1. prefill: each RAG prompt alone with one new token and nothing cached; prompt tokens/s;
2. one stream: each RAG prompt alone, ``--max-tokens``; tokens/s and median TTFT (``ttft_ms``);
3. ``generate_many`` of the ``--prompts`` RAG prompts at once: tokens/s of the batch;
4. burst: ``--burst`` requests of benchmarks/prefix.py's traffic (recurring passages) at once,
   prefix caching on in both engines (torch: 256 MB, as a worker); tokens/s and hit rate.
Every scenario starts cold: its prompts begin with a token of their own, so no engine reuses
KV across scenarios (and the prefill prompts one each, so none reuses any).

Then exactness: the torch bf16 answers against the torch bf16 ``none`` run (divergences only at
near-ties, generation/exactness.py) and against float32 (how often bf16 changes an answer, and
the float32 top-2 gap where it does). The CPU's ISA heads every table, and the timing table's
the core binding: vLLM's EngineCore processes on core 0 (VLLM_CPU_OMP_THREADS_BIND, overridable),
this process (the torch engines) on the others, each engine one dedicated core (``pin_engines``).
After each vLLM request the next engine's request waits until vLLM's worker stops spinning
(``Settle``): that spin, though pinned to core 0, pushed other users' processes onto the torch
engines' core and ran their prompt-by-prompt scenarios 2-3x slow.

    flock /tmp/bench.lock .venv-vllm/bin/python -m benchmarks.dtypes [--prompts 16]
        [--max-tokens 64] [--k 4] [--burst 48] [--torch-threads 1] [--only burst]
    .venv/bin/python -m benchmarks.dtypes --ties 96   # only how often bf16 changes answers
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.support import goal, write_result
from benchmarks.vllm_engines import DEMO, rag_prompts

GOALS = [
    goal(
        "bf16",
        "torch bf16 / float32: prefill prompt tokens/s",
        "prefill_bf16_vs_f32",
        ">=",
        3.0,
        "x",
    ),
    goal(
        "bf16",
        "torch bf16 / float32: generate_many(16) tokens/s",
        "many_bf16_vs_f32",
        ">=",
        2.0,
        "x",
    ),
    goal("bf16", "torch bf16 / float32: one-stream TTFT p50", "ttft_bf16_vs_f32", "<=", 0.5, "x"),
    goal("bf16", "torch bf16 / vLLM bf16: one-stream tokens/s", "stream_vs_vllm", ">=", 1.2, "x"),
    goal("bf16", "torch bf16 / vLLM bf16: burst of 48 tokens/s", "burst_vs_vllm", ">=", 1.0, "x"),
    goal("bf16", "torch bf16 / vLLM bf16: one-stream TTFT p50", "ttft_vs_vllm", "<=", 0.8, "x"),
    goal(
        "bf16",
        "bf16 answers differing from bf16 none at a clear margin (not a near-tie)",
        "clear_margin_divergences",
        "<=",
        0,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

REPO = Path(__file__).resolve().parent.parent


ENGINES = ("torch f32", "torch bf16", "vllm bf16", "vllm f32")


VLLM_CORE = "0"
"""The core vLLM's EngineCore processes run on (VLLM_CPU_OMP_THREADS_BIND, which this host's vLLM
only passes to OpenMP as OMP_PLACES: its threads stay allowed on every core, so ``pin_engines``
binds them too); this process, the torch engines, gets the other cores."""


def _cores(spec: str) -> set[int]:
    """ "0", "0,2", "0-3" (vLLM's list form) as a set; ValueError for "auto" / "nobind"."""
    cores: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        cores |= set(range(int(low), int(high or low) + 1))
    return cores


def _pin_threads(pid: int, cores: set[int]) -> None:
    """Bind every thread of process ``pid`` (sched_setaffinity binds one thread id)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (vLLM's EngineCore processes are this process's children)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def pin_engines(vllm_cores: str) -> str:
    """Give each engine its own core: vLLM's EngineCore processes (every thread) the cores
    ``vllm_cores``, this process (the torch engines and vLLM's front end, which never run at
    once) the rest. Unpinned, the torch engine shared both cores with everything else and swung
    40 % between runs. Returns the binding, for the tables."""
    try:
        taken = _cores(vllm_cores)
    except ValueError:
        return f"engines unpinned (VLLM_CPU_OMP_THREADS_BIND={vllm_cores!r})"
    free = os.sched_getaffinity(0) - taken
    if not free:
        return f"engines unpinned (vLLM's cores {vllm_cores!r} are all there are)"
    engine_cores = _descendants(os.getpid())
    for pid in engine_cores:
        _pin_threads(pid, taken)
    _pin_threads(os.getpid(), free)
    return (
        f"torch engines pinned to core {','.join(map(str, sorted(free)))}, vLLM's EngineCore "
        f"({len(engine_cores)} processes) to core {vllm_cores}"
    )


def vllm_spin_s() -> float:
    """Seconds a vLLM worker busy-loops after its last request: its ``MultiprocExecutor``
    worker reads requests from a shared-memory queue and spins there (``sched_yield``) for
    ``SpinCondition``'s ``busy_loop_s`` (1 s in vLLM 0.32) before it sleeps on a socket. vLLM's
    CPU platform always uses that executor ("uni" is turned into "mp"), so the spin cannot be
    configured away."""
    import inspect

    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:  # no vLLM, or another layout: vLLM 0.32's value
        return 1.0
    default = inspect.signature(SpinCondition.__init__).parameters["busy_loop_s"].default
    return float(default) if isinstance(default, (int, float)) else 1.0


class Settle:
    """Runs the engines' timed requests, so no request starts while a vLLM worker still spins.

    A vLLM worker spins on its core (core 0) for ``vllm_spin_s()`` after each request. It never
    touches the torch engines' core, but a busy core 0 makes the kernel's load balancer move
    whatever else runs on the machine (other users' processes, in autogroups of their own,
    so their nice 19 does not count against this one) onto core 1, and the torch request
    there got about half its core: 2-3x slower prefill and one stream whenever engines
    alternate request by request, while vLLM's rates and the scenarios that run one engine
    for seconds hardly moved. So before the request of an engine other than the
    vLLM engine that ran last, this waits until that engine's worker has gone idle (for
    every engine alike, the vLLM ones included: the spin also shares core 0 with the other
    vLLM engine's worker)."""

    def __init__(self) -> None:
        self.spin_s = vllm_spin_s() + 0.1
        self.last: str | None = None
        self.vllm_done = 0.0
        self.waited = 0.0

    @contextlib.contextmanager
    def turn(self, name: str) -> Iterator[None]:
        """Engine ``name``'s request inside: waited for first, its end noted after."""
        if self.last is not None and self.last != name and self.last.startswith("vllm"):
            wait = self.vllm_done + self.spin_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
                self.waited += wait
        self.last = name
        yield
        if name.startswith("vllm"):
            self.vllm_done = time.perf_counter()


SETTLE = Settle()


def isa() -> str:
    """The CPU's bf16 features and torch's vector ISA, for every table's head."""
    import torch

    from generation.model.dtypes import BF16_CPU_FLAGS, cpu_bf16_flags

    have = cpu_bf16_flags()
    flags = ", ".join(f"{f} {'yes' if f in have else 'no'}" for f in BF16_CPU_FLAGS)
    return f"CPU: {flags}, amx_tile {'yes' if _flag('amx_tile') else 'no'}; " + (
        f"torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads"
    )


def _flag(name: str) -> bool:
    try:
        return name in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def load_all(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.support import warm_up_torch_engine
    from generation import EngineConfig, load_engine

    engines: dict[str, Any] = {}
    for name in args.engines.split(","):
        kind, dtype = name.split()
        t = time.perf_counter()
        if kind == "torch":
            config = EngineConfig(max_batch_size=args.max_batch, prefix_cache_mb=256.0)
            engines[name] = load_engine(
                "torch", DEMO / "target", DEMO / "draft", "cpu", config=config,
                dtype={"f32": "float32", "bf16": "bfloat16"}[dtype],
            )  # fmt: skip
            warm_up_torch_engine(engines[name], args.max_batch)
        else:
            options = {
                "num_speculative_tokens": args.k,
                "max_num_seqs": args.max_batch,
                "llm_kwargs": {"enable_prefix_caching": True},
            }
            engines[name] = load_engine(
                "vllm", DEMO / "target", DEMO / "draft", "cpu", options,
                dtype={"f32": "float32", "bf16": "bfloat16"}[dtype],
            )  # fmt: skip
        print(f"{name}: loaded and warmed in {time.perf_counter() - t:.0f} s", flush=True)
    return engines


def marked(prompts: list[list[int]], marker: int) -> list[list[int]]:
    """``prompts`` behind one leading token of their own: KV of other scenarios never matches."""
    return [[marker, *p] for p in prompts]


def measure(engines: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from generation import SamplingParams

    prompts = rag_prompts(args.prompts)
    params = SamplingParams(max_new_tokens=args.max_tokens, num_speculative_tokens=args.k)
    one = SamplingParams(max_new_tokens=1, num_speculative_tokens=args.k)  # prefill only
    rows: dict[str, dict[str, Any]] = {n: {"prefill": [], "stream": []} for n in engines}
    for name, engine in engines.items():  # kernels of every shape once, outside the timings
        with SETTLE.turn(name):
            engine.generate(marked(prompts[:1], 7)[0], params)
    if args.only != "burst":
        rows["_prompts"] = rows_of_prompts(engines, rows, prompts, params, one)
    burst_rows(engines, rows, args, params)
    return rows


def rows_of_prompts(
    engines: dict[str, Any],
    rows: dict[str, dict[str, Any]],
    prompts: list[list[int]],
    params: Any,
    one: Any,
) -> dict[str, list[list[int]]]:
    """Scenarios 1-3 into ``rows``; returns the prompts the exactness table replays."""
    for i, prompt in enumerate(marked(prompts, 0)):
        prompt[0] = 100 + i  # one marker per prompt: nothing to reuse
        for name in engines if i % 2 == 0 else list(engines)[::-1]:
            with SETTLE.turn(name):
                t = time.perf_counter()
                engines[name].generate(prompt, one)
                rows[name]["prefill"].append((len(prompt), time.perf_counter() - t))
    stream = marked(prompts, 200)
    for i, prompt in enumerate(stream):
        for name in engines if i % 2 == 0 else list(engines)[::-1]:
            with SETTLE.turn(name):
                t = time.perf_counter()
                result = engines[name].generate(prompt, params)
                rows[name]["stream"].append(
                    (len(result.token_ids), time.perf_counter() - t, result.stats.ttft_ms)
                )
            rows[name].setdefault("answers", []).append(result.token_ids)
    batch = marked(prompts, 300)
    for name in engines:
        with SETTLE.turn(name):
            t = time.perf_counter()
            results = engines[name].generate_many(batch, params)
            rows[name]["many"] = (sum(len(r.token_ids) for r in results), time.perf_counter() - t)
        rows[name]["many_answers"] = [r.token_ids for r in results]
    return {"stream": stream, "many": batch}


def burst_rows(
    engines: dict[str, Any], rows: dict[str, dict[str, Any]], args: Any, params: Any
) -> None:
    """Scenario 4 into ``rows``: ``args.burst_rounds`` times, the engines' order alternating,
    each run behind a marker of its own (cold prefixes)."""
    from app.settings import Settings
    from benchmarks.prefix_workload import build_traffic
    from generation import load_tokenizer

    tokenizer = load_tokenizer(str(DEMO / "target"))
    traffic = build_traffic(
        Settings(), tokenizer, 2 * args.burst, seed=0, max_tokens=args.max_tokens,
        cache=REPO / "var" / "bench" / f"prefix_traffic_{0}.json",
    )  # fmt: skip
    burst = [r.prompt for r in traffic[args.burst : 2 * args.burst]]
    marker = 400
    for r in range(args.burst_rounds):
        for name in engines if r % 2 == 0 else list(engines)[::-1]:
            with SETTLE.turn(name):
                t = time.perf_counter()
                results = engines[name].generate_many(marked(burst, marker), params)
                secs = time.perf_counter() - t
            marker += 1
            cached = sum(r.stats.num_cached_prompt_tokens for r in results)
            rows[name].setdefault("burst", []).append(
                (sum(len(r.token_ids) for r in results), secs)
            )
            rows[name]["burst_hit"] = cached / sum(len(p) + 1 for p in burst)


def table(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, float]:
    """Print the timing table; returns the goals' ratios that the engines run make."""
    names = [n for n in ENGINES if n in rows]
    ratio = [(a, b) for a, b in (("torch bf16", "torch f32"), ("torch bf16", "vllm bf16"))
             if a in names and b in names]  # fmt: skip
    print(f"\n{isa()}; {args.binding}; {SETTLE.waited:.0f} s waited for vLLM's workers to "
          f"stop spinning ({SETTLE.spin_s:.1f} s after each vLLM request)")  # fmt: skip
    print(f"| demo pair, {args.prompts} RAG prompts, {args.max_tokens} tokens, draft_model "
          f"k={args.k} | " + " | ".join(names) + " | " + " | ".join(f"{a} / {b}" for a, b in ratio)
          + " |")  # fmt: skip
    print("|---" * (1 + len(names) + len(ratio)) + "|")
    burst = {n: statistics.median(t / s for t, s in rows[n]["burst"]) for n in names}
    hit = {n: rows[n]["burst_hit"] for n in names}
    lines: list[tuple[str, dict[str, float], str]] = []
    if args.only != "burst":
        prefill = {n: sum(x[0] for x in r["prefill"]) / sum(x[1] for x in r["prefill"])
                   for n, r in rows.items() if n in names}  # fmt: skip
        stream = {n: sum(x[0] for x in r["stream"]) / sum(x[1] for x in r["stream"])
                  for n, r in rows.items() if n in names}  # fmt: skip
        ttft = {n: statistics.median(x[2] for x in rows[n]["stream"]) for n in names}
        many = {n: rows[n]["many"][0] / rows[n]["many"][1] for n in names}
        lines += [
            ("prefill, prompt tokens/s", prefill, "{:.0f}"),
            ("one stream, tokens/s", stream, "{:.0f}"),
            ("one stream, TTFT p50 ms", ttft, "{:.1f}"),
            (f"generate_many({args.prompts}), tokens/s", many, "{:.0f}"),
        ]
    rounds = f", median of {args.burst_rounds}" if args.burst_rounds > 1 else ""
    lines += [
        (f"burst of {args.burst} (recurring passages), tokens/s{rounds}", burst, "{:.0f}"),
        ("burst prefix hit rate", hit, "{:.0%}"),
    ]
    for label, values, fmt in lines:
        cells = [fmt.format(values[n]) for n in names]
        cells += [f"{values[a] / values[b]:.2f}x" if values[b] else "-" for a, b in ratio]
        print(f"| {label} | " + " | ".join(cells) + " |")
    by = {label: values for label, values, _ in lines}

    def over(label: str, a: str, b: str) -> float | None:
        values = by.get(label, {})
        return values[a] / values[b] if a in values and b in values and values[b] else None

    burst_label = next(label for label in by if label.startswith("burst of"))
    return {
        "prefill_bf16_vs_f32": over("prefill, prompt tokens/s", "torch bf16", "torch f32"),
        "many_bf16_vs_f32": over(
            f"generate_many({args.prompts}), tokens/s", "torch bf16", "torch f32"
        ),
        "ttft_bf16_vs_f32": over("one stream, TTFT p50 ms", "torch bf16", "torch f32"),
        "stream_vs_vllm": over("one stream, tokens/s", "torch bf16", "vllm bf16"),
        "burst_vs_vllm": over(burst_label, "torch bf16", "vllm bf16"),
        "ttft_vs_vllm": over("one stream, TTFT p50 ms", "torch bf16", "vllm bf16"),
    }


def exactness(engines: dict[str, Any], rows: dict[str, dict[str, Any]], args: Any) -> int | None:
    """Print the exactness table; returns the torch bf16 engine's clear-margin divergences."""
    from generation import SamplingParams
    from generation.exactness import check_greedy

    if not {"torch bf16", "torch f32"} <= set(engines):
        return None
    bf16, f32 = engines["torch bf16"], engines["torch f32"]
    stream, many = rows["_prompts"]["stream"], rows["_prompts"]["many"]
    none = SamplingParams(max_new_tokens=args.max_tokens, method="none")
    spec = SamplingParams(max_new_tokens=args.max_tokens, num_speculative_tokens=args.k)
    ref: dict[str, list[list[int]]] = {
        "bf16 none": [bf16.generate(p, none).token_ids for p in stream],
        "f32 none": [f32.generate(p, none).token_ids for p in stream],
        "bf16 none (batch prompts)": [bf16.generate(p, none).token_ids for p in many],
    }
    for name in ("torch bf16", "vllm bf16"):  # the batch's prompts once more, each alone
        if name in engines:
            ref[f"{name} alone"] = [engines[name].generate(p, spec).token_ids for p in many]
    print(f"\n{isa()}")
    print("| greedy answers vs a reference | differ | all at near-ties | largest gap excused | "
          "clear-margin divergences |\n|---|---|---|---|---|")  # fmt: skip
    # (label, answers' engine, their key in rows, reference, the forward judging near-ties)
    cases = (
        ("torch bf16 draft_model one stream vs bf16 none", "torch bf16", "answers", "bf16 none",
         bf16, stream),
        ("torch bf16 draft_model generate_many vs bf16 none", "torch bf16", "many_answers",
         "bf16 none (batch prompts)", bf16, many),
        ("torch bf16 generate_many vs the same alone (batch company)", "torch bf16",
         "many_answers", "torch bf16 alone", bf16, many),
        ("vllm bf16 generate_many vs the same alone (batch company)", "vllm bf16",
         "many_answers", "vllm bf16 alone", bf16, many),
        ("torch bf16 none vs torch f32 none (cross-dtype rounding)", None, "", "f32 none", f32,
         stream),
        ("torch f32 draft_model one stream vs f32 none", "torch f32", "answers", "f32 none", f32,
         stream),
        # Other kernels (vLLM's attention, its bf16 logits): judged by the torch engine's own
        # shape rounding, so a "clear margin" here says the engines round differently.
        ("vllm bf16 vs torch bf16 none", "vllm bf16", "answers", "bf16 none", bf16, stream),
        ("vllm f32 vs torch f32 none", "vllm f32", "answers", "f32 none", f32, stream),
    )  # fmt: skip
    clear = 0
    for label, name, key, reference, engine, prompts in cases:
        if (name is not None and name not in rows) or reference not in ref:
            continue
        outs = ref["bf16 none"] if name is None else rows[name][key]
        # bf16 against float32: the rounding between the two dtypes, not between two shapes.
        other = bf16.target_forward if name is None else None
        divs = [check_greedy(engine.target_forward, p, r, o, other_fwd=other)
                for p, r, o in zip(prompts, ref[reference], outs, strict=True)]  # fmt: skip
        found = [d for d in divs if d is not None]
        excused = [d for d in found if d.excused]
        largest = max((d.gap for d in excused), default=None)
        print(f"| {label} | {len(found)}/{len(prompts)} | {len(excused)} | "
              f"{'-' if largest is None else f'{largest:.4f}'} | {len(found) - len(excused)} |")  # fmt: skip
        if name == "torch bf16":
            clear += len(found) - len(excused)
    return clear


def ties(args: argparse.Namespace) -> None:
    """How often bf16 changes a greedy answer of the torch engine, and at what float32 margin:
    ``--ties N`` RAG prompts, method none in both dtypes (no timing: needs no quiet machine)."""
    from generation import SamplingParams, SpeculativeEngine
    from generation.exactness import check_greedy

    engines = {d: SpeculativeEngine.from_pretrained(DEMO / "target", DEMO / "draft", dtype=d)
               for d in ("float32", "bfloat16")}  # fmt: skip
    prompts = rag_prompts(args.ties)
    none = SamplingParams(max_new_tokens=args.max_tokens, method="none")
    spec = SamplingParams(max_new_tokens=args.max_tokens, num_speculative_tokens=args.k)
    f32 = [r.token_ids for r in engines["float32"].generate_many(prompts, none)]
    bf16 = [r.token_ids for r in engines["bfloat16"].generate_many(prompts, none)]
    bf16_spec = [r.token_ids for r in engines["bfloat16"].generate_many(prompts, spec)]
    print(f"\n{isa()}")
    print(f"| {args.ties} RAG prompts, {args.max_tokens} tokens, greedy | answers differing | "
          "of them at near-ties | first-divergence position p50 | reference's top-2 gap there, "
          "p50 / max | tolerance p50 (rounding measured on the run) |\n|---|---|---|---|---|---|")  # fmt: skip
    for label, outs, refs, judge, other in (
        ("bf16 none vs float32 none", bf16, f32, engines["float32"], engines["bfloat16"]),
        ("bf16 draft_model (batched) vs bf16 none", bf16_spec, bf16, engines["bfloat16"], None),
    ):
        other_fwd = None if other is None else other.target_forward
        divs = [check_greedy(judge.target_forward, p, r, o, other_fwd=other_fwd)
                for p, r, o in zip(prompts, refs, outs, strict=True)]  # fmt: skip
        found = [d for d in divs if d is not None]
        near = [d for d in found if d.excused]
        pos = statistics.median(d.position for d in found) if found else None
        gaps = sorted(d.gap for d in found)
        tols = sorted(d.tolerance for d in found)
        print(f"| {label} | {len(found)}/{len(prompts)} | {len(near)} | "
              f"{'-' if pos is None else f'{pos:.0f}'} | "
              + (f"{statistics.median(gaps):.4f} / {gaps[-1]:.4f} | "
                 f"{statistics.median(tols):.4f} |" if found else "- | - |"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--burst", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--torch-threads", type=int, default=1, help="0: torch's default")
    parser.add_argument("--engines", default=",".join(ENGINES), help="a subset, for a dry run")
    parser.add_argument("--ties", type=int, default=0, help="only: bf16 vs f32 answers of N")
    parser.add_argument("--only", default="", choices=("", "burst"), help="burst: scenario 4 only")
    parser.add_argument("--burst-rounds", type=int, default=1, help="burst runs per engine")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", VLLM_CORE)
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    print(isa(), flush=True)
    if args.ties:
        ties(args)
        return
    engines = load_all(args)
    # After loading: the EngineCore processes exist (and did not inherit this process's mask).
    args.binding = pin_engines(os.environ["VLLM_CPU_OMP_THREADS_BIND"])
    print(args.binding, flush=True)
    rows = measure(engines, args)
    figures: dict[str, Any] = {**table(rows, args), "clear_margin_divergences": None}
    if args.only != "burst":
        figures["clear_margin_divergences"] = exactness(engines, rows, args)
    figures["binding"] = args.binding
    write_result("dtypes", figures, GOALS)
    for engine in engines.values():
        close = getattr(engine, "close", None)
        if callable(close):
            close()


if __name__ == "__main__":
    main()
