"""Speed of recording the target's features for EAGLE training: one sequence per pass vs batched.

    PYTHONPATH=. .venv/bin/python benchmarks/eagle_features.py --rows 32

Training-split RAG prompts with their reference answers (training/train_eagle.py's
``reference_rows``), their final hidden states computed by ``target_features`` one row per
target pass (as the first head was recorded) and then in batches of at most ``--batch-tokens``
padded tokens, both with bf16 autocast where the CPU has it. Prints seconds per sequence for
each, the speed-up, and the largest difference between the two (float16 features).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from training.model import autocast_dtype
    from training.train_eagle import record_features, reference_rows, target_features

    torch.set_num_threads(args.threads)
    tdir = ROOT / "models" / "demo" / "target"
    tok = AutoTokenizer.from_pretrained(str(tdir))
    target = LlamaForCausalLM.from_pretrained(str(tdir), dtype=torch.float32).eval()
    rows, _ = reference_rows(tok, 0, args.rows)
    target_features(target, rows[:2])  # warm the kernels
    t0 = time.perf_counter()
    single = [target_features(target, [r])[0] for r in rows]
    t_single = time.perf_counter() - t0
    scratch = ROOT / "runs" / "eagle_features_bench"
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / "features.pt"
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    batched = record_features(target, rows, out, scratch, args.batch_tokens, chunk=10**9)
    t_batched = time.perf_counter() - t0
    out.unlink(missing_ok=True)
    diff = max(
        (a.float() - b.float()).abs().max().item() for a, b in zip(single, batched, strict=True)
    )
    scale = max(a.float().abs().max().item() for a in single)
    print(
        json.dumps(
            {
                "rows": len(rows),
                "mean_tokens": sum(map(len, rows)) / len(rows),
                "autocast": str(autocast_dtype()),
                "one_per_pass_s_per_sequence": t_single / len(rows),
                "batched_s_per_sequence": t_batched / len(rows),
                "speedup": t_single / t_batched,
                "max_abs_difference": diff,
                "max_abs_feature": scale,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
