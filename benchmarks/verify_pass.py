"""Where a target pass's time goes: one pass of n tokens on the engine's forward, by operator.

A speculative round is one target pass over the last token and k drafts (n = k + 1). This times
that pass on a slot already holding ``--context`` tokens, for each n, on the engine's forward
with its projections on oneDNN-packed weights (``packed``) and on transformers' GEMM kernels
(``unpacked``), in alternation, and splits each with the PyTorch profiler into matrix products
(the projections and the LM head), attention (SDPA) and everything else (norms, rotary, masks,
copies, dispatch): whether a pass is arithmetic (GEMM kernels) or overhead (the Python around).

    .venv/bin/python benchmarks/verify_pass.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generation.model.forward import FastLlamaForward  # noqa: E402
from generation.model.loading import load_causal_lm  # noqa: E402
from generation.model.model_runner import ModelRunner  # noqa: E402

GEMM = {"aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"}


def shares(prof: profile) -> str:
    """The profiled time's split: matrix products | attention | other, in percent."""
    split = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        kind = "attention" if "scaled_dot_product" in event.key else "other"
        split["gemm" if event.key in GEMM else kind] += event.self_cpu_time_total
    total = sum(split.values())
    return " / ".join(f"{100 * v / total:.0f}" for v in split.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="models/demo/target")
    parser.add_argument("--context", type=int, default=400, help="tokens already in the slot")
    parser.add_argument("--tokens", default="1,2,3,5,9", help="pass widths n (k + 1)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_causal_lm(args.target, "cpu")
    widths = [int(n) for n in args.tokens.split(",")]
    runners = {
        name: ModelRunner(FastLlamaForward(model, packed), 1, args.context + max(widths) + 1)
        for name, packed in (("unpacked", False), ("packed", True))
    }
    vocab = int(model.config.vocab_size)
    print(f"{args.target}, context {args.context}, {args.threads} thread(s)")
    print("| n | unpacked ms | packed ms | unpacked / packed | unpacked: GEMM / attention / other % "
          "| packed: GEMM / attention / other % |")  # fmt: skip
    print("|---" * 6 + "|")
    with torch.inference_mode():
        for runner in runners.values():
            runner.prefill(0, [i % vocab for i in range(args.context)])

        def one_pass(runner: ModelRunner, n: int) -> float:
            runner.set_length(0, args.context)
            ids = torch.ones((1, n), dtype=torch.long)
            start = time.perf_counter()
            runner.run([0], ids, [n]).argmax(dim=-1).tolist()
            return time.perf_counter() - start

        for n in widths:
            times: dict[str, list[float]] = {name: [] for name in runners}
            for i in range(args.repeats + 5):  # alternated; the first 5 warm up
                for name, runner in runners.items():
                    seconds = one_pass(runner, n)
                    if i >= 5:
                        times[name].append(seconds)
            split = {}
            for name, runner in runners.items():
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(10):
                        one_pass(runner, n)
                split[name] = shares(prof)
            old, new = (1000 * statistics.median(times[n]) for n in ("unpacked", "packed"))
            print(f"| {n} | {old:.2f} | {new:.2f} | {old / new:.2f} | {split['unpacked']} "
                  f"| {split['packed']} |")  # fmt: skip


if __name__ == "__main__":
    main()
