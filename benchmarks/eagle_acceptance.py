"""Acceptance length of each proposer on held-out questions (issue 35), the torch engine alone.

    PYTHONPATH=. .venv/bin/python benchmarks/eagle_acceptance.py --questions 24

Held-out demo-corpus questions (training/corpus.py's held-out split, as benchmarks/instruct_goals.py
builds them), each prompted through the demo pair's chat template with its answering chunk and
one other held-out chunk as passages (no retrieval: the count does not depend on timing or on
the index). Greedy, 96 tokens, k = 4: tokens after the first per target pass, acceptance, and
whether every method's answer is ``none``'s. Counts only, so it needs no quiet machine; speed is
benchmarks/instruct_goals.py's.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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
    ap.add_argument("--models", type=Path, default=ROOT / "models" / "demo")
    args = ap.parse_args()
    import torch

    from generation import SamplingParams, SpeculativeEngine

    torch.set_num_threads(1)
    m = args.models
    engine = SpeculativeEngine.from_pretrained(
        m / "target", m / "draft", device="cpu", eagle_dir=m / "eagle"
    )
    asked = prompts(args.questions)
    table: dict[str, dict[str, float]] = {}
    base: list[list[int]] = []
    for method in ("none", "draft_model", "ngram", "eagle"):
        params = SamplingParams(max_new_tokens=args.max_tokens, method=method)
        results = [engine.generate(p, params) for p in asked]
        if method == "none":
            base = [r.token_ids for r in results]
        after_first = sum(len(r.token_ids) - 1 for r in results)
        passes = sum(r.stats.num_target_forwards for r in results)
        drafted = sum(r.stats.num_draft_tokens for r in results)
        accepted = sum(r.stats.num_accepted_tokens for r in results)
        table[method] = {
            "tokens_per_target_pass": after_first / passes,
            "acceptance": accepted / drafted if drafted else 0.0,
            "identical_to_none": sum(r.token_ids == b for r, b in zip(results, base, strict=True)),
        }
        print(method, json.dumps(table[method]), file=sys.stderr, flush=True)
    e, d = table["eagle"], table["draft_model"]
    table["ratio"] = {
        "eagle / draft_model tokens per target pass": e["tokens_per_target_pass"]
        / d["tokens_per_target_pass"]
    }
    print(json.dumps({"questions": len(asked), **table}, indent=2))


if __name__ == "__main__":
    main()
