"""The torch engine's prefill with and without session 15's two engine-level changes, A/B in ONE
process: prompt chunks padded to a multiple of ``PREFILL_BUCKET`` (oneDNN builds a GEMM primitive
per input shape; a fresh prompt length pays for building them) and the draft's prompt filled
without its output projection (``ModelRunner.fill``).

Each round runs the ``--prompts`` RAG prompts through ``generate`` with one new token
(benchmarks/dtypes.py's prefill scenario: draft_model, prefix cache 256 MB) on a float32 and a
bfloat16 engine under each variant in alternating order, every prompt trimmed by a few tokens
more each round so that its length is fresh (as a new prompt's is), and one marker token of its
own in front (nothing cached to reuse). Prints prompt tokens/s, medians over rounds.

    flock /tmp/bench.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python \\
        benchmarks/prefill_buckets.py [--prompts 16] [--rounds 6] [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.vllm_engines import DEMO, rag_prompts  # noqa: E402

VARIANTS = ("before (exact lengths, draft logits)", "buckets", "buckets + draft fill")


def use(variant: str, runner_module: Any, original_fill: Any) -> None:
    """Switch the engine's prefill to ``variant`` (module state: one engine process)."""
    runner_module.PREFILL_BUCKET = 1 if variant == VARIANTS[0] else 16

    def prefill_instead(self: Any, slot: int, token_ids: list[int]) -> None:
        self.prefill(slot, token_ids)

    fill = original_fill if variant == VARIANTS[2] else prefill_instead
    runner_module.ModelRunner.fill = fill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    import generation.model.model_runner as runner_module
    from benchmarks.dtypes import isa
    from generation import EngineConfig, SamplingParams, load_engine

    torch.set_num_threads(args.torch_threads)
    config = EngineConfig(max_batch_size=16, prefix_cache_mb=256.0)
    engines = {
        d: load_engine("torch", DEMO / "target", DEMO / "draft", "cpu", config=config, dtype=d)
        for d in ("float32", "bfloat16")
    }
    for engine in engines.values():
        engine.warmup(batch_sizes=(1,))
    prompts = rag_prompts(args.prompts)
    one = SamplingParams(max_new_tokens=1, num_speculative_tokens=4)
    original_fill = runner_module.ModelRunner.fill
    marker = 1000
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for v, variant in enumerate(order):
            use(variant, runner_module, original_fill)
            for dtype, engine in engines.items():
                tokens, secs = 0, 0.0
                for prompt in prompts:
                    marker += 1
                    trim = 3 * (r * len(VARIANTS) + v) + 1  # a length this process has not run
                    ids = [marker, *prompt[: len(prompt) - trim]]
                    started = time.perf_counter()
                    engine.generate(ids, one)
                    secs += time.perf_counter() - started
                    tokens += len(ids)
                rates.setdefault((dtype, variant), []).append(tokens / secs)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    use(VARIANTS[2], runner_module, original_fill)
    print(f"\n{isa()}")
    print(f"| engine prefill, {args.prompts} RAG prompts of fresh lengths, prompt tokens/s "
          f"(median of {args.rounds}) | " + " | ".join(VARIANTS) + " | after / before |")  # fmt: skip
    print("|---" * (len(VARIANTS) + 2) + "|")
    median = {key: statistics.median(values) for key, values in rates.items()}
    for dtype in engines:
        cells = [f"{median[(dtype, v)]:.0f}" for v in VARIANTS]
        gain = median[(dtype, VARIANTS[2])] / median[(dtype, VARIANTS[0])]
        print(f"| torch {dtype} | " + " | ".join(cells) + f" | {gain:.2f}x |")
    ratio = [median[("bfloat16", v)] / median[("float32", v)] for v in VARIANTS]
    print("| bf16 / f32 | " + " | ".join(f"{x:.2f}x" for x in ratio) + " | |")


if __name__ == "__main__":
    main()
