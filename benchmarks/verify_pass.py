"""Where a target pass's time goes: one pass of n tokens on the engine's forward, by operator.

A speculative round is one target pass over the last token and k drafts (n = k + 1). This times
that pass on a slot already holding ``--context`` tokens, for each n, and splits it with the
PyTorch profiler into matrix products (the projections and the LM head), attention (SDPA) and
everything else (norms, rotary, masks, copies, dispatch). It answers whether a slower pass than
a peer's is arithmetic (GEMM kernels) or overhead (the Python around them).

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

from generation.forward import forward_for  # noqa: E402
from generation.loading import load_causal_lm  # noqa: E402
from generation.model_runner import ModelRunner  # noqa: E402

GROUPS = {"aten::mm": "matrix products", "aten::addmm": "matrix products"}
ATTENTION = "scaled_dot_product"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="models/demo/target")
    parser.add_argument("--context", type=int, default=400, help="tokens already in the slot")
    parser.add_argument("--tokens", default="1,3,5,9", help="pass widths n (k + 1)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fwd = forward_for(load_causal_lm(args.target, "cpu"))
    widths = [int(n) for n in args.tokens.split(",")]
    runner = ModelRunner(fwd, 1, args.context + max(widths) + 1)
    vocab = int(fwd.config.vocab_size)
    print(
        f"{type(fwd).__name__} on {args.target}, context {args.context}, {args.threads} thread(s)"
    )
    print("| n | pass ms (median) | matrix products | attention | other |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        runner.prefill(0, [i % vocab for i in range(args.context)])

        def one_pass(n: int) -> float:
            runner.set_length(0, args.context)
            ids = torch.ones((1, n), dtype=torch.long)
            start = time.perf_counter()
            runner.run([0], ids, [n]).argmax(dim=-1).tolist()
            return time.perf_counter() - start

        for n in widths:
            for _ in range(5):
                one_pass(n)
            median = statistics.median(one_pass(n) for _ in range(args.repeats))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    one_pass(n)
            shares = {"matrix products": 0.0, "attention": 0.0, "other": 0.0}
            for event in prof.key_averages():
                group = GROUPS.get(event.key, "attention" if ATTENTION in event.key else "other")
                shares[group] += event.self_cpu_time_total
            total = sum(shares.values())
            cells = " | ".join(f"{100 * v / total:.0f} %" for v in shares.values())
            print(f"| {n} | {1000 * median:.2f} | {cells} |")


if __name__ == "__main__":
    main()
