"""What a change to the forward pass buys: several revisions of generation/model/forward.py side by side.

Each ``--revs`` revision's forward.py (``git show REV:generation/model/forward.py``) is loaded as its own
module in ONE process and runs the demo pair in float32 and bfloat16; the sections are called in
alternation, revision by revision, so the shared machine's drift hits them alike:
- a 500-token prefill of the target;
- the draft's fill of the same prompt (``ModelRunner.fill``: its keys and values, no logits);
- a one-stream speculative round: 4 one-token draft passes and a 5-token target verification;
- a batch of 16 rows, each verifying 5 tokens after 300 cached ones.
Then the prefix cache's block save inside the engine's prefill (16 RAG prompts, one new token,
prefix cache 256 MB): ``--save-rev``'s ``PrefixCache.keep``/``ModelBlocks.save`` against the
working tree's, swapped in alternately on the same engines. Medians in ms (tokens/s for the
prefix part); 1 thread unless ``--threads``.

    flock /tmp/bench.lock env HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/forward_sections.py \\
        --revs 8ac4e55,e277b5d,a1bbed2 --save-rev 8ac4e55
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.vllm_engines import DEMO, rag_prompts  # noqa: E402
from generation.model.loading import load_causal_lm  # noqa: E402
from generation.model.model_runner import ModelRunner  # noqa: E402

PROMPT = [i % 8000 + 1 for i in range(500)]


def module_at(rev: str, path: str, tmp: Path) -> ModuleType:
    """``path`` as it is at git revision ``rev``, imported as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:{path}"], check=True, capture_output=True
    ).stdout
    file = tmp / f"{Path(path).stem}_{rev}.py"
    file.write_bytes(source)
    spec = importlib.util.spec_from_file_location(file.stem, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sections(forward: ModuleType, target: object, draft: object) -> dict[str, Callable[[], None]]:
    """The timed sections on this revision's forward pass of ``target`` and ``draft``."""
    rt = ModelRunner(forward.forward_for(target), 2, 1024)
    rd = ModelRunner(forward.forward_for(draft), 2, 1024)
    batch = ModelRunner(rt.fwd, 16, 320)
    one = torch.ones((1, 1), dtype=torch.long)
    with torch.inference_mode():
        rt.prefill(0, PROMPT)
        rd.prefill(0, PROMPT)
        for slot in range(16):
            batch.prefill(slot, PROMPT[:300])

    def prefill() -> None:
        rt.set_length(1, 0)
        rt.prefill(1, PROMPT)

    def draft_fill() -> None:
        rd.set_length(1, 0)
        rd.fill(1, PROMPT)

    def round_k4() -> None:
        rd.set_length(0, 500)
        rt.set_length(0, 500)
        for _ in range(4):
            rd.run([0], one, [1], last_only=True).argmax(-1).tolist()
        rt.run([0], torch.ones((1, 5), dtype=torch.long), [5]).argmax(-1).tolist()

    def batch16() -> None:
        for slot in range(16):
            batch.set_length(slot, 300)
        ids = torch.ones((16, 5), dtype=torch.long)
        batch.run(list(range(16)), ids, [5] * 16).argmax(-1).tolist()

    return {
        "prefill, 500 tokens (target)": prefill,
        "prompt fill, 500 tokens (draft: keys and values only)": draft_fill,
        "one-stream round: 4 draft passes + a 5-token verification": round_k4,
        "batch of 16 rows x 5-token verification": batch16,
    }


def forward_table(revs: list[str], rounds: int, tmp: Path) -> None:
    modules = {rev: module_at(rev, "generation/model/forward.py", tmp) for rev in revs}
    runs: dict[tuple[str, str], dict[str, Callable[[], None]]] = {}
    for dtype in ("float32", "bfloat16"):
        target = load_causal_lm(DEMO / "target", "cpu", getattr(torch, dtype))
        draft = load_causal_lm(DEMO / "draft", "cpu", getattr(torch, dtype))
        for rev, module in modules.items():
            runs[(dtype, rev)] = sections(module, target, draft)
    names = list(next(iter(runs.values())))
    times: dict[tuple[str, str], dict[str, list[float]]] = {k: {n: [] for n in names} for k in runs}
    with torch.inference_mode():
        for attempt in range(rounds + 1):  # the first warms up
            for name in names:
                for key, timed in runs.items():
                    start = time.perf_counter()
                    timed[name]()
                    if attempt:
                        times[key][name].append(time.perf_counter() - start)
    print("| section, median ms | " + " | ".join(f"{d} {r}" for d, r in runs) + " |")
    print("|---" * (1 + len(runs)) + "|")
    for name in names:
        cells = [f"{statistics.median(times[k][name]) * 1e3:.2f}" for k in runs]
        print(f"| {name} | " + " | ".join(cells) + " |")


def save_table(save_rev: str, tmp: Path) -> None:
    import generation.engine.prefix_cache as prefix_cache
    from generation import EngineConfig, SamplingParams, load_engine

    old = module_at(save_rev, "generation/engine/prefix_cache.py", tmp)
    versions = {
        f"save at {save_rev}": (old.PrefixCache.keep, old.ModelBlocks.save),
        "save in the working tree": (prefix_cache.PrefixCache.keep, prefix_cache.ModelBlocks.save),
    }
    engines = {
        dtype: load_engine(
            "torch",
            DEMO / "target",
            DEMO / "draft",
            "cpu",
            dtype=dtype,
            config=EngineConfig(max_batch_size=16, prefix_cache_mb=256.0),
        )  # fmt: skip
        for dtype in ("float32", "bfloat16")
    }
    one = SamplingParams(max_new_tokens=1, num_speculative_tokens=4)
    totals = {(d, v): [0, 0.0] for d in engines for v in versions}
    marker = 1000
    for attempt in range(3):  # the first warms up
        for prompt in rag_prompts(16):
            for version, (keep, save) in versions.items():
                prefix_cache.PrefixCache.keep, prefix_cache.ModelBlocks.save = keep, save  # type: ignore[method-assign]
                for dtype, engine in engines.items():
                    marker += 1  # nothing to reuse
                    start = time.perf_counter()
                    engine.generate([marker, *prompt[1:]], one)
                    if attempt:
                        totals[(dtype, version)][0] += len(prompt)
                        totals[(dtype, version)][1] += time.perf_counter() - start
    first, second = versions
    print(f"\n| engine prefill, 16 RAG prompts, prefix cache 256 MB, tokens/s | {first} | "
          f"{second} | gain |")  # fmt: skip
    print("|---|---|---|---|")
    for dtype in engines:
        a, b = (totals[(dtype, v)][0] / totals[(dtype, v)][1] for v in versions)
        print(f"| torch {dtype} | {a:.0f} | {b:.0f} | {b / a:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--revs", default="HEAD", help="comma-separated git revisions")
    parser.add_argument("--save-rev", default="", help="a revision's prefix-cache save to compare")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        forward_table(args.revs.split(","), args.rounds, Path(tmp))
        if args.save_rev:
            save_table(args.save_rev, Path(tmp))


if __name__ == "__main__":
    main()
