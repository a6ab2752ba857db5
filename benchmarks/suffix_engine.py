"""Suffix decoding on repeated questions, the torch engine alone, on the demo pair.

    flock /tmp/bench.lock .venv/bin/python -m benchmarks.suffix_engine [--questions 16]

Held-out demo-corpus questions, each prompted through the demo pair's chat template with its
answering chunk and one other chunk as passages (as benchmarks/eagle_acceptance.py builds them).
First every question is answered greedily with ``draft_model`` k=4 and its answer's token ids
are put in one scope of a ``SuffixMemory``, as the service records answers. Then the same
prompts are asked again (``repeated``), each method in turn per prompt (the machine's load falls
on all alike): ``none``, ``ngram`` k=4, ``draft_model`` k=4, ``suffix`` at --suffix-ks, every
suffix request drafting from that scope. ``fresh``: other questions, never answered before, for
``none``, ``ngram`` and ``suffix`` (the scope holds only the other questions' answers). The
engine keeps a prefix cache (``--prefix-cache-mb``, 1024 by default: the run's prompts), as the
service does (``SPECRAG_PREFIX_CACHE_MB``), so a repeated question prefills from the cache its
first answer left, whichever method asks it: the repeated set is unsalted, and the first pass
caches every prompt, the target's KV and the draft model's (a ``none`` pass would leave the
draft model's out, and ``draft_model`` alone would prefill again). Greedy answers are compared
with the repeated set's ``none`` answers. Fresh questions are salted per method (each pays its
own prefill, as a question never asked before does). ``--prefix-cache-mb 0``: every ask prefills
its whole prompt.

Per method: generation tokens/s (output tokens / generation time, summed over requests),
decode tokens/s (tokens after the first / time after the first), mean acceptance length
(1 + accepted / rounds with drafts), and how many answers equal ``none``'s. Ratios against
``none``, ``ngram`` and ``draft_model`` are taken in the same run. Writes --json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.support import goal, write_result

GOALS = [
    goal("suffix", "Repeated questions, torch engine alone: mean acceptance length "
         "suffix / draft_model", "repeated_mal_vs_draft_model", ">=", 2.0, "x"),
    goal("suffix", "Repeated questions, torch engine alone: generation tokens/s suffix / none",
         "repeated_tps_vs_none", ">=", 3.0, "x"),
    goal("suffix", "Repeated questions, torch engine alone: generation tokens/s "
         "suffix / draft_model", "repeated_tps_vs_draft_model", ">=", 1.5, "x"),
    goal("suffix", "Fresh questions, torch engine alone: generation tokens/s suffix / ngram",
         "fresh_tps_vs_ngram", ">=", 0.95, "x"),
    goal("suffix", "Greedy answers of every method identical to none's (torch engine)",
         "identical_to_none", "==", True),
]  # fmt: skip
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parents[1]


def demo_prompts(count: int, skip: int = 0, seed: int = 0) -> list[list[int]]:
    """Return ``count`` chat prompts of held-out demo-corpus questions (after the first ``skip``)."""
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
    while len(out) < count + skip:
        chunk = rng.choice(chunks)
        qa = question_and_quote(rng, chunk)
        if qa is None or qa[0] in seen:
            continue
        seen.add(qa[0])
        other = rng.choice([c for c in chunks if c.doc_title != chunk.doc_title])
        out.append(fmt.encode(qa[0], [Passage(c.title, c.text) for c in (chunk, other)]))
    return out[skip:]


def summarise(results: list[Any], reference: list[list[int]]) -> dict[str, Any]:
    """Return one method's figures over its ``results`` (``reference``: none's answers)."""
    tokens = sum(len(r.token_ids) for r in results)
    after_first = sum(len(r.token_ids) - 1 for r in results)
    gen_s = sum(r.stats.generation_ms for r in results) / 1e3
    decode_s = sum((r.stats.generation_ms - r.stats.ttft_ms) for r in results) / 1e3
    rounds = sum(r.stats.num_drafts for r in results)
    accepted = sum(r.stats.num_accepted_tokens for r in results)
    drafted = sum(r.stats.num_draft_tokens for r in results)
    same = sum(r.token_ids == ref for r, ref in zip(results, reference, strict=True))
    return {
        "requests": len(results),
        "output_tokens": tokens,
        "generation_tokens_per_s": tokens / gen_s,
        "decode_tokens_per_s": after_first / decode_s,
        "mean_acceptance_length": 1 + accepted / rounds if rounds else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "target_passes": sum(r.stats.num_target_forwards for r in results),
        "cached_prompt_tokens": sum(r.stats.num_cached_prompt_tokens for r in results),
        "identical_to_none": same,
    }


def run_set(engine: Any, prompts: list[list[int]], methods: list[tuple[str, Any]], args: Any,
            salted: bool = False) -> dict[str, Any]:  # fmt: skip
    """Ask every prompt with every method (interleaved per prompt); return figures per method.
    ``salted``: each method's prompts are cached apart (none reuses another method's prefill)."""
    from generation import SamplingParams

    got: dict[str, list[Any]] = {f"{m} k={k}": [] for m, k in methods}
    for prompt in prompts:
        for m, k in methods:
            params = SamplingParams(
                max_new_tokens=args.max_tokens, method=m, num_speculative_tokens=k,
                suffix_scope=args.scope if m == "suffix" else None,
                cache_salt=f"{m} k={k}" if salted else None,
            )  # fmt: skip
            got[f"{m} k={k}"].append(engine.generate(prompt, params))
    base = [r.token_ids for r in got["none k=1"]]
    return {label: summarise(rs, base) for label, rs in got.items()}


def ratios(table: dict[str, Any], suffix_labels: list[str]) -> dict[str, float]:
    """Suffix rows over the baselines' figures, in the same run."""
    out = {}
    for label in suffix_labels:
        for base in ("none k=1", "ngram k=4", "draft_model k=4"):
            if base not in table:
                continue
            for field in ("generation_tokens_per_s", "mean_acceptance_length"):
                mine, theirs = table[label][field], table[base][field]
                if mine is not None and theirs is not None:
                    out[f"{label} / {base}: {field}"] = round(mine / theirs, 3)
    return out


def result_figures(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The goals' figures of one run's report (its first suffix row against the baselines) and
    each row's note."""
    label = next(k for k in report["repeated"] if k.startswith("suffix"))
    rep, fresh = report["repeated_ratios"], report["fresh_ratios"]
    tps, mal = "generation_tokens_per_s", "mean_acceptance_length"
    figures: dict[str, Any] = {
        "suffix_row": label,
        "repeated_mal_vs_draft_model": rep[f"{label} / draft_model k=4: {mal}"],
        "repeated_tps_vs_none": rep[f"{label} / none k=1: {tps}"],
        "repeated_tps_vs_draft_model": rep[f"{label} / draft_model k=4: {tps}"],
        "fresh_tps_vs_ngram": fresh[f"{label} / ngram k=4: {tps}"],
        "identical_to_none": all(
            row["identical_to_none"] == row["requests"]
            for table in (report["repeated"], report["fresh"])
            for row in table.values()
        ),
    }
    rows = report["repeated"]
    n_rep, n_fresh = rows[label]["requests"], report["fresh"][label]["requests"]
    notes = {
        "repeated_mal_vs_draft_model": f"{label}, {n_rep} questions: MAL "
        f"{rows[label][mal]:.2f} vs {rows['draft_model k=4'][mal]:.2f}",
        "repeated_tps_vs_none": f"{rows[label][tps]:.1f} vs {rows['none k=1'][tps]:.1f} tok/s; "
        f"prefix cache {report['prefix_cache_mb']:g} MB",
        "repeated_tps_vs_draft_model": f"{rows[label][tps]:.1f} vs "
        f"{rows['draft_model k=4'][tps]:.1f} tok/s",
        "fresh_tps_vs_ngram": f"{n_fresh} questions; the scope holds the other questions' answers",
        "identical_to_none": f"{n_rep} repeated and {n_fresh} fresh questions, every method",
    }
    return figures, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=16, help="repeated questions")
    ap.add_argument("--fresh", type=int, default=8, help="questions with no history")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--suffix-ks", default="16,auto", help="k of the suffix rows (comma list)")
    ap.add_argument("--spec-factor", type=float, default=1.0,
                    help="EngineConfig.suffix_max_spec_factor (vLLM's default: 1.0)")  # fmt: skip
    ap.add_argument("--scope", default="bench-tenant/demo")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=1024.0,
        help="the engine's prefix cache (0: none; every ask prefills its prompt)",
    )
    ap.add_argument("--json", type=Path, default=ROOT / "var" / "bench" / "suffix_engine.json")
    args = ap.parse_args()
    import torch

    from generation import SamplingParams, SpeculativeEngine
    from generation.config import EngineConfig
    from generation.spec_decode.suffix import SuffixMemory

    torch.set_num_threads(args.threads)
    models = ROOT / "models" / "demo"
    memory = SuffixMemory(max_answers_per_scope=10_000)
    engine = SpeculativeEngine.from_pretrained(
        models / "target", models / "draft", device="cpu", dtype="float32",
        config=EngineConfig(suffix_max_spec_factor=args.spec_factor,
                            prefix_cache_mb=args.prefix_cache_mb),
        suffix_memory=memory,
    )  # fmt: skip
    repeated = demo_prompts(args.questions)
    fresh = demo_prompts(args.fresh, skip=args.questions)
    ks: list[Any] = [int(k) if k.isdigit() else k for k in args.suffix_ks.split(",")]
    methods = [("none", 1), ("ngram", 4), ("draft_model", 4), *(("suffix", k) for k in ks)]
    for m, k in methods:  # kernels and cost tables ready before anything is timed
        engine.generate(repeated[0], SamplingParams(max_new_tokens=8, method=m,
                                                    num_speculative_tokens=k))  # fmt: skip
    started = time.time()
    first = [engine.generate(p, SamplingParams(max_new_tokens=args.max_tokens,
                                               method="draft_model", num_speculative_tokens=4))
             for p in repeated]  # fmt: skip
    for i, r in enumerate(first):
        memory.add(args.scope, f"answer-{i}", r.token_ids)
    table = run_set(engine, repeated, methods, args)
    fresh_table = run_set(engine, fresh, [("none", 1), ("ngram", 4), *(("suffix", k) for k in ks)],
                          args, salted=True)  # fmt: skip
    suffix_labels = [f"suffix k={k}" for k in ks]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    report = {
        "benchmark": "suffix_engine",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "commit": commit,
        "host": platform.processor() or platform.machine(),
        "torch_threads": args.threads,
        "model_pair": engine.model_pair,
        "max_tokens": args.max_tokens,
        "suffix_max_spec_factor": args.spec_factor,
        "prefix_cache_mb": args.prefix_cache_mb,
        "memory": {"answers": memory.size(args.scope), "bytes": memory.memory_bytes()},
        "repeated": table,
        "repeated_ratios": ratios(table, suffix_labels),
        "fresh": fresh_table,
        "fresh_ratios": ratios(fresh_table, suffix_labels),
        "seconds": round(time.time() - started, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    for name in ("repeated", "fresh"):
        print(f"== {name}")
        for label, row in report[name].items():
            mal = row["mean_acceptance_length"]
            print(f"{label:18} {row['generation_tokens_per_s']:8.1f} tok/s  "
                  f"MAL {mal if mal is None else round(mal, 2)}  "
                  f"identical {row['identical_to_none']}/{row['requests']}")  # fmt: skip
        for key, value in report[f"{name}_ratios"].items():
            print(f"  {key}: {value}")
    print(f"wrote {args.json}")
    figures, notes = result_figures(report)
    write_result("suffix_engine", figures, GOALS, notes)


if __name__ == "__main__":
    main()
