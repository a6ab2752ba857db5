"""Acceptance length of each proposer on held-out questions, the torch engine alone.

    .venv/bin/python -m benchmarks.eagle_acceptance --questions 24

Held-out demo-corpus questions (training/corpus.py's held-out split, as benchmarks/instruct_goals.py
builds them), each prompted through the demo pair's chat template with its answering chunk and
one other held-out chunk as passages (no retrieval: the count does not depend on timing or on
the index). Greedy, 96 tokens, k = 4: tokens after the first per target pass, acceptance (overall and
per draft position: accepted at position i / rounds), one-stream decode tokens/s (tokens after
the first over the time after the first token; methods interleaved per prompt, so quote the
ratios) and whether every method's answer is ``none``'s. ``--eagle`` again compares heads side
by side on the same prompts (a new head against the shipped one). The counts need no quiet
machine; the speeds want ``flock /tmp/bench.lock``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from benchmarks.support import goal, write_result

GOALS = [
    goal(
        "eagle",
        "EAGLE head's tokens per target pass / the draft model's (held-out questions)",
        "eagle_vs_draft_length",
        ">=",
        1.3,
        "x",
    ),
    goal(
        "eagle",
        "one-stream decode tokens/s, EAGLE / draft model",
        "eagle_vs_draft_speed",
        ">=",
        1.25,
        "x",
    ),
    goal(
        "eagle", "one-stream decode tokens/s, EAGLE / none", "eagle_vs_none_speed", ">=", 1.8, "x"
    ),
    goal(
        "eagle",
        "float32 greedy answers identical to none's on every prompt",
        "identical",
        "==",
        True,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parent.parent


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    from generation import load_tokenizer
    from retrieval.chat import PromptFormat
    from retrieval.prompt import Passage
    from training.corpus import build_corpus
    from training.qa import chunk_documents, question_and_quote

    fmt = PromptFormat.for_tokenizer(load_tokenizer(ROOT / "models" / "demo" / "target"))
    docs = [d for d in build_corpus(seed).heldout if d.source.startswith("demo/corpus/")]
    chunks = chunk_documents(docs, 220)
    rng = random.Random(1234 + seed)
    out: list[list[int]] = []
    seen: set[str] = set()
    while len(out) < count:
        chunk = rng.choice(chunks)
        qa = question_and_quote(rng, chunk)
        if qa is None or qa[0] in seen:
            continue
        seen.add(qa[0])
        other = rng.choice([c for c in chunks if c.doc_title != chunk.doc_title])
        passages = [Passage(c.title, c.text) for c in (chunk, other)]
        out.append(fmt.encode(qa[0], passages))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (every method)")
    ap.add_argument("--models", type=Path, default=ROOT / "models" / "demo")
    ap.add_argument(
        "--eagle",
        type=Path,
        action="append",
        default=None,
        help="an EAGLE head directory (repeat to compare heads side by side; the first also "
        "serves none/draft_model/ngram); default: <models>/eagle",
    )
    ap.add_argument("--dtype", default="float32", help="float32 (bit-exact) or bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from generation import SamplingParams, SpeculativeEngine

    torch.set_num_threads(args.threads)
    m = args.models
    heads: list[Path] = args.eagle or [m / "eagle"]
    engines = [
        SpeculativeEngine.from_pretrained(
            m / "target", m / "draft", device="cpu", dtype=args.dtype, eagle_dir=h
        )
        for h in heads
    ]
    runs: list[tuple[str, Any, str]] = [
        (name, engines[0], name) for name in ("none", "draft_model", "ngram")
    ]
    labels = ["eagle"] + [
        f"eagle:{h.name}" if h.name != "eagle" else f"eagle:{h}" for h in heads[1:]
    ]
    runs += [(label, e, "eagle") for label, e in zip(labels, engines, strict=True)]
    asked = prompts(args.questions)
    for _, engine, method in runs:  # warm each engine's kernels and cost tables
        engine.generate(
            asked[0], SamplingParams(max_new_tokens=8, method=method, num_speculative_tokens=args.k)
        )
    results: dict[str, list[Any]] = {label: [] for label, _, _ in runs}
    for p in asked:  # methods interleaved per prompt: the machine's load falls on all alike
        for label, engine, method in runs:
            params = SamplingParams(
                max_new_tokens=args.max_tokens, method=method, num_speculative_tokens=args.k
            )
            results[label].append(engine.generate(p, params))
    base = [r.token_ids for r in results["none"]]
    table: dict[str, dict[str, Any]] = {}
    for label, rs in results.items():
        after_first = sum(len(r.token_ids) - 1 for r in rs)
        passes = sum(r.stats.num_target_forwards for r in rs)
        drafted = sum(r.stats.num_draft_tokens for r in rs)
        accepted = sum(r.stats.num_accepted_tokens for r in rs)
        rounds = sum(r.stats.num_drafts for r in rs)
        per_pos = [0] * args.k
        for r in rs:
            for i, a in enumerate(r.stats.accepted_per_position[: args.k]):
                per_pos[i] += a
        decode_s = sum((r.stats.generation_ms - r.stats.ttft_ms) / 1e3 for r in rs)
        table[label] = {
            "tokens_per_target_pass": after_first / passes,
            "acceptance": accepted / drafted if drafted else 0.0,
            "acceptance_per_position": [round(a / rounds, 3) for a in per_pos] if rounds else [],
            "decode_tokens_per_s": after_first / decode_s,
            "identical_to_none": sum(r.token_ids == b for r, b in zip(rs, base, strict=True)),
        }
        print(label, json.dumps(table[label]), file=sys.stderr, flush=True)
    d, n = table["draft_model"], table["none"]
    table["ratio"] = {
        f"{label} / draft_model": {
            "tokens_per_target_pass": table[label]["tokens_per_target_pass"]
            / d["tokens_per_target_pass"],
            "decode_tokens_per_s": table[label]["decode_tokens_per_s"] / d["decode_tokens_per_s"],
            "decode_tokens_per_s vs none": table[label]["decode_tokens_per_s"]
            / n["decode_tokens_per_s"],
        }
        for label in labels
    }
    if len(labels) > 1:  # each further head against the first, paired per prompt
        from scipy.stats import wilcoxon

        def per_prompt(label: str) -> list[float]:
            return [
                (len(r.token_ids) - 1) / max(1, r.stats.num_target_forwards) for r in results[label]
            ]

        first = per_prompt(labels[0])
        for label in labels[1:]:
            other = per_prompt(label)
            table["ratio"][f"{label} / {labels[0]}"] = {
                "tokens_per_target_pass": table[label]["tokens_per_target_pass"]
                / table[labels[0]]["tokens_per_target_pass"],
                "prompts_better_worse_equal": [
                    sum(b > a for a, b in zip(first, other, strict=True)),
                    sum(b < a for a, b in zip(first, other, strict=True)),
                    sum(b == a for a, b in zip(first, other, strict=True)),
                ],
                "wilcoxon_p_two_sided": float(wilcoxon(other, first).pvalue),
            }
    summary = {"questions": len(asked), "dtype": args.dtype, "k": args.k, **table}
    print(json.dumps(summary, indent=2))
    head = table["ratio"][f"{labels[-1]} / draft_model"]  # the last head given: the new one
    figures = {
        "eagle_vs_draft_length": head["tokens_per_target_pass"],
        "eagle_vs_draft_speed": head["decode_tokens_per_s"],
        "eagle_vs_none_speed": head["decode_tokens_per_s vs none"],
        "identical": all(table[m]["identical_to_none"] == len(asked) for m in labels),
        **summary,
    }
    notes = {"identical": f"{args.dtype}, {len(asked)} held-out prompts"}
    write_result("eagle_acceptance", figures, GOALS, notes)


if __name__ == "__main__":
    main()
