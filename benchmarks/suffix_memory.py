"""What a scope of past answers costs in memory: one ``SuffixMemory`` scope filled to --answers.

    .venv/bin/python -m benchmarks.suffix_memory [--answers 10000] [--depths 24,64]

Answers are demo-sized (100-400 tokens, uniform). Two kinds: ``corpus``, spans of the demo
corpus tokenized with the demo pair's tokenizer (answers quote their passages), and ``random``,
uniform ids over the vocabulary (nothing shared: the trees' worst case). For each kind and tree
depth: arctic-inference's own estimate (``memory_bytes``), the process's resident-set growth
while the scope fills, the fill rate, and the mean time of one lookup (``speculate`` of 16
tokens after a 32-token context from a held answer). Each row runs in a fresh process, so the
resident-set growth is its own (freed memory of an earlier row is not reused). Writes --json.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import random
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.support import goal, write_result

GOALS = [
    goal("suffix", "Memory of one scope of 10,000 demo-like answers at the default tree depth "
         "(64): the larger of arctic-inference's estimate and the resident-set growth, "
         "against its budget", "corpus_depth64_mib", "<=", 512.0, "MiB"),
]  # fmt: skip
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parents[1]


def rss_bytes() -> int:
    """The process's resident set now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def corpus_tokens() -> tuple[list[int], int]:
    """The demo corpus as one token stream, and the tokenizer's vocabulary size."""
    from generation import load_tokenizer

    tok = load_tokenizer(ROOT / "models" / "demo" / "target")
    ids: list[int] = []
    for path in sorted((ROOT / "demo" / "corpus").glob("*.md")):
        ids.extend(tok.encode(path.read_text(), add_special_tokens=False))
    return ids, len(tok)


def answers(kind: str, count: int, stream: list[int], vocab: int, seed: int) -> list[list[int]]:
    """``count`` answers of 100-400 tokens of ``kind`` ("corpus" or "random")."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(100, 400)
        if kind == "corpus":
            start = rng.randrange(len(stream) - n)
            out.append(stream[start : start + n])
        else:
            out.append([rng.randrange(vocab) for _ in range(n)])
    return out


def measure(kind: str, depth: int, count: int, stream: list[int], vocab: int) -> dict[str, Any]:
    """Fill one scope with ``count`` answers of ``kind`` at tree depth ``depth``; return its
    figures."""
    from generation.spec_decode.suffix import SuffixMemory

    held = answers(kind, count, stream, vocab, seed=0)
    gc.collect()
    before = rss_bytes()
    memory = SuffixMemory(max_answers_per_scope=len(held), max_depth=depth)
    memory.set_vocab_size(vocab)
    started = time.perf_counter()
    for i, ids in enumerate(held):
        memory.add("scope", f"answer-{i}", ids)
    fill_s = time.perf_counter() - started
    grown = rss_bytes() - before
    rng = random.Random(1)
    contexts = []
    for _ in range(200):
        ids = held[rng.randrange(len(held))]
        at = rng.randrange(32, len(ids) - 16)
        contexts.append(ids[at - 32 : at])
    started = time.perf_counter()
    for context in contexts:
        memory.speculate("scope", context, 16, 1.0, 0.1)
    lookup_us = (time.perf_counter() - started) / len(contexts) * 1e6
    tokens = sum(len(a) for a in held)
    estimate = memory.memory_bytes()
    row = {
        "kind": kind,
        "max_depth": depth,
        "answers": memory.size("scope"),
        "tokens": tokens,
        "estimate_mb": round(estimate / 2**20, 1),
        "rss_growth_mb": round(grown / 2**20, 1),
        "bytes_per_token": round(estimate / tokens, 1),
        "fill_answers_per_s": round(len(held) / fill_s),
        "lookup_us": round(lookup_us, 1),
    }
    return row


def result_figures(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each row's larger memory figure (MiB) by kind and depth, and the goal row's note."""
    figures: dict[str, Any] = {
        f"{r['kind']}_depth{r['max_depth']}_mib": max(r["estimate_mb"], r["rss_growth_mb"])
        for r in report["rows"]
    }
    figures.setdefault("corpus_depth64_mib", None)
    rows = {(r["kind"], r["max_depth"]): r for r in report["rows"]}
    notes = {}
    if ("corpus", 64) in rows:
        row, worst = rows["corpus", 64], rows.get(("random", 64))
        notes["corpus_depth64_mib"] = (
            f"{row['answers']} answers, {row['tokens']} tokens, {row['bytes_per_token']} B/token"
            + (f"; uniform random ids (worst case): {figures['random_depth64_mib']} MiB"
               if worst else "")
        )  # fmt: skip
    return figures, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=10_000, help="answers in the scope")
    ap.add_argument("--depths", default="24,64", help="tree depths (comma list)")
    ap.add_argument("--kinds", default="corpus,random")
    ap.add_argument("--json", type=Path, default=ROOT / "var" / "bench" / "suffix_memory.json")
    args = ap.parse_args()
    stream, vocab = corpus_tokens()
    rows = []
    spawn = multiprocessing.get_context("spawn")
    for kind in args.kinds.split(","):
        for depth in (int(d) for d in args.depths.split(",")):
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                row = pool.submit(measure, kind, depth, args.answers, stream, vocab).result()
            print(json.dumps(row), flush=True)
            rows.append(row)
    report = {
        "benchmark": "suffix_memory",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.processor() or platform.machine(),
        "corpus_tokens": len(stream),
        "vocab_size": vocab,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")
    figures, notes = result_figures(report)
    write_result("suffix_memory", figures, GOALS, notes)


if __name__ == "__main__":
    main()
