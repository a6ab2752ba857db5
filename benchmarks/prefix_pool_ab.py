"""What committing the prefix pool at allocation buys: pools touched at the start against pools
whose pages the prefills fault in, A/B in ONE process, float32 and bfloat16.

Four torch engines (float32 / bfloat16, each with its pool committed at allocation, as
generation/engine/prefix_cache.py allocates it, and with a pool of untouched pages, as it did before:
``torch.empty``) run benchmarks/dtypes.py's first three scenarios in its order, so each pool is as
full as it is there when each scenario runs (a bf16 pool holds twice the tokens of a float32 one
of the same MB, so it is still filling when float32's is full): prefill (each RAG prompt alone,
one new token, nothing reused), one stream (``--max-tokens``), ``generate_many`` of the prompts.
Engines alternate prompt by prompt (in the batch scenario engine by engine), so the machine's
drift hits them alike. Prints tokens/s and the bf16 / f32 ratios with either pool.

    flock /tmp/bench.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python \\
        benchmarks/prefix_pool_ab.py [--prompts 16] [--max-tokens 64] [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.vllm_engines import DEMO, rag_prompts  # noqa: E402

POOLS = ("untouched pool", "committed pool")


def untouch(engine: Any) -> int:
    """Give ``engine``'s prefix pool fresh, never-touched pages (the old ``torch.empty``
    allocation); returns the bytes replaced."""
    import torch

    replaced = 0
    cache = engine.prefix_cache
    for blocks in (cache.target, cache.draft):
        if blocks is None:
            continue
        # New tensors first, then the old ones dropped: a fresh mapping, not the freed pages.
        blocks.keys = [torch.empty_like(t) for t in blocks.keys]
        blocks.values = [torch.empty_like(t) for t in blocks.values]
        replaced += sum(t.numel() * t.element_size() for t in blocks.keys + blocks.values)
    return replaced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    from benchmarks.dtypes import isa
    from benchmarks.support import warm_up_torch_engine
    from generation import EngineConfig, SamplingParams, load_engine

    torch.set_num_threads(args.torch_threads)
    config = EngineConfig(max_batch_size=16, prefix_cache_mb=256.0)
    engines = {}
    for dtype in ("float32", "bfloat16"):
        for pool in POOLS:
            engine = load_engine("torch", DEMO / "target", DEMO / "draft", "cpu", config=config,
                                 dtype=dtype)  # fmt: skip
            if pool == POOLS[0]:
                untouch(engine)
            warm_up_torch_engine(engine, 16)
            engines[(dtype, pool)] = engine
    prompts = rag_prompts(args.prompts)
    params = SamplingParams(max_new_tokens=args.max_tokens, num_speculative_tokens=4)
    one = SamplingParams(max_new_tokens=1, num_speculative_tokens=4)
    done: dict[tuple[str, str, str], list[float]] = {}  # (scenario, dtype, pool) -> tokens, secs

    def timed(key: tuple[str, str, str], tokens: int, started: float) -> None:
        total = done.setdefault(key, [0.0, 0.0])
        total[0] += tokens
        total[1] += time.perf_counter() - started

    for scenario, marker, sampling in (("prefill", 100, one), ("one stream", 200, params)):
        for i, prompt in enumerate(prompts):
            for key in engines if i % 2 == 0 else list(engines)[::-1]:
                started = time.perf_counter()
                result = engines[key].generate([marker + i, *prompt], sampling)
                count = len(prompt) + 1 if scenario == "prefill" else len(result.token_ids)
                timed((scenario, *key), count, started)
    batch = [[300, *p] for p in prompts]
    for key, engine in engines.items():
        started = time.perf_counter()
        results = engine.generate_many(batch, params)
        timed(("generate_many", *key), sum(len(r.token_ids) for r in results), started)
    print(f"\n{isa()}")
    print(f"| demo pair, {args.prompts} RAG prompts, {args.max_tokens} tokens, tokens/s | "
          + " | ".join(f"{d} {p}" for d, p in engines)
          + " | bf16 / f32, " + " | bf16 / f32, ".join(POOLS) + " |")  # fmt: skip
    print("|---" * (1 + len(engines) + len(POOLS)) + "|")
    for scenario in ("prefill", "one stream", "generate_many"):
        rate = {key: done[(scenario, *key)][0] / done[(scenario, *key)][1] for key in engines}
        ratios = [rate[("bfloat16", p)] / rate[("float32", p)] for p in POOLS]
        print(f"| {scenario} | " + " | ".join(f"{r:.0f}" for r in rate.values()) + " | "
              + " | ".join(f"{r:.2f}x" for r in ratios) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
