"""What bfloat16 can buy a prompt's prefill on this CPU, and what the slot-attention kernel buys it
(issue 34, session 17). Three tables, one thread, medians of alternating calls:

1. The projections alone: oneDNN-packed linear in float32 and bfloat16 at the demo target's
   shapes (rows = tokens in the pass). Its ratio is the ceiling of any engine's bf16 / f32
   prefill ratio on this CPU: the projections are most of a prefill.
2. Attention of one row's prompt chunk over its slot, 6 heads of 64: torch's SDPA (causal,
   or an additive mask after cached positions, as generation/model/forward.py passes it) against
   generation/model/attention.py's kernel, with both errors against float64.
3. The demo target's 500-token prefill through ``ModelRunner``: bf16 with the kernel on every
   pass, bf16 with SDPA for prompt chunks (the kernel on passes of <= 16 queries, as before
   session 17), and float32.

On a CPU with AMX the service leaves prompt chunks to SDPA (``generation/model/attention.py``: torch's
flash kernel can use the tile units there); this script forces the kernel on for its kernel rows
and says so, so that on such a host tables 2 and 3 are the measurement that rule waits for.

    flock /tmp/bench.lock env HF_HUB_OFFLINE=1 PYTHONPATH=$PWD taskset -c 1 \\
        .venv/bin/python benchmarks/prefill_attention.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import generation.model.attention as attention_module  # noqa: E402
import generation.model.forward as forward  # noqa: E402
from benchmarks.dtypes import isa  # noqa: E402
from benchmarks.vllm_engines import DEMO  # noqa: E402
from generation.model.attention import slot_attention  # noqa: E402
from generation.model.loading import load_causal_lm  # noqa: E402
from generation.model.model_runner import ModelRunner  # noqa: E402

PROMPT = [i % 8000 + 1 for i in range(500)]
HEADS, DIM, CAPACITY = 6, 64, 1024


def median_ms(fns: dict[str, Callable[[], object]], reps: int = 15) -> dict[str, float]:
    """Each callable's median time in ms, called in alternation (two warm-up rounds)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for attempt in range(reps + 2):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if attempt >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def projections() -> None:
    print("| rows x (in -> out), ms | float32 packed | bfloat16 packed | f32 / bf16 |")
    print("|---|---|---|---|")
    pack = torch.ops.mkldnn._reorder_linear_weight
    run = torch.ops.mkldnn._linear_pointwise
    for rows in (500, 80, 5):
        for k, n in ((384, 1152), (384, 384), (384, 2048), (1024, 384)):
            x, w = torch.randn(rows, k), torch.randn(n, k) * 0.05
            pf, pb, xb = pack(w), pack(w.bfloat16()), x.bfloat16()
            t = median_ms(
                {
                    "f32": lambda x=x, pf=pf: run(x, pf, None, "none", [], ""),
                    "bf16": lambda xb=xb, pb=pb: run(xb, pb, None, "none", [], ""),
                }
            )
            print(f"| {rows} x ({k} -> {n}) | {t['f32']:.3f} | {t['bf16']:.3f} | "
                  f"{t['f32'] / t['bf16']:.2f}x |")  # fmt: skip


def attention() -> None:
    print("\n| prompt chunk (queries, cached before) | SDPA bf16 ms | kernel ms | SDPA / kernel "
          "| max error SDPA | max error kernel |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    torch.manual_seed(0)
    keys = torch.randn(2, HEADS, CAPACITY, DIM).bfloat16()
    values = torch.randn(2, HEADS, CAPACITY, DIM).bfloat16()
    scale = DIM**-0.5
    for n, start in ((500, 0), (256, 0), (256, 300), (64, 400), (16, 400), (5, 600)):
        q = torch.randn(1, HEADS, n, DIM).bfloat16()
        end = start + n
        k, v = keys[1:2, :, :end], values[1:2, :, :end]
        seen = torch.ones(n, end, dtype=torch.bool).tril(start)
        mask = torch.zeros(seen.shape, dtype=torch.bfloat16).masked_fill_(~seen, float("-inf"))
        attend = slot_attention(torch.bfloat16, torch.device("cpu"), [1], [start], n, DIM)
        assert attend is not None, "the kernel cannot run here (no compiler or no AVX-512 BF16)"

        def sdpa(q=q, k=k, v=v, mask=mask, causal=start == 0):  # type: ignore[no-untyped-def]
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if causal else mask, is_causal=causal, scale=scale
            )

        def kernel(q=q, attend=attend):  # type: ignore[no-untyped-def]
            return attend(q, keys, values, scale)

        want = (
            F.scaled_dot_product_attention(
                q.double(), k.double(), v.double(), attn_mask=seen, scale=scale
            )
            .transpose(1, 2)
            .reshape(n, -1)
        )
        err_sdpa = (sdpa().transpose(1, 2).reshape(n, -1).double() - want).abs().max().item()
        err_kernel = (kernel().double() - want).abs().max().item()
        t = median_ms({"sdpa": sdpa, "kernel": kernel})
        print(f"| {n}, {start} | {t['sdpa']:.2f} | {t['kernel']:.2f} | "
              f"{t['sdpa'] / t['kernel']:.2f}x | {err_sdpa:.1e} | {err_kernel:.1e} |")  # fmt: skip


def prefill() -> None:
    bf16 = ModelRunner(forward.forward_for(load_causal_lm(DEMO / "target", "cpu", torch.bfloat16)), 2, 1024)  # fmt: skip
    f32 = ModelRunner(forward.forward_for(load_causal_lm(DEMO / "target", "cpu", torch.float32)), 2, 1024)  # fmt: skip

    def sdpa_for_chunks(*args):  # type: ignore[no-untyped-def]
        return None if args[4] > 16 else slot_attention(*args)

    def run(runner: ModelRunner, attention: Callable[..., object]) -> Callable[[], None]:
        def go() -> None:
            forward.slot_attention = attention  # type: ignore[assignment]
            runner.set_length(1, 0)
            runner.prefill(1, PROMPT)

        return go

    try:
        t = median_ms(
            {
                "bf16 kernel": run(bf16, slot_attention),
                "bf16 SDPA for chunks": run(bf16, sdpa_for_chunks),
                "f32": run(f32, slot_attention),
            },
            reps=11,
        )
    finally:
        forward.slot_attention = slot_attention
    print("\n| demo target, 500-token prefill | ms | f32 / this |")
    print("|---|---|---|")
    for name, ms in t.items():
        print(f"| {name} | {ms:.1f} | {t['f32'] / ms:.2f}x |")


def main() -> None:
    torch.set_num_threads(1)
    print(isa())
    if attention_module._cpu_has_amx():
        print("AMX present: the service gives prompt chunks to SDPA here; the kernel rows below "
              "force the kernel on")  # fmt: skip
        attention_module._cpu_has_amx = lambda: False  # type: ignore[assignment]
    print()
    with torch.inference_mode():
        projections()
        attention()
        prefill()


if __name__ == "__main__":
    main()
