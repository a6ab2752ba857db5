"""Speculative decoding engine benchmark: tokens/s, acceptance and efficiency per method.

One run, the same prompts and the same pair for every row: target alone (``none``), the draft
model at k in --ks and ``auto``, prompt lookup (``ngram``), and transformers' own assisted
generation and prompt lookup with the same pair and k. All rows decode greedily and must give
the baseline's tokens. Per row: E = num_output_tokens / num_target_forwards, the per-token
alpha solved from E = (1 - alpha^(k+1)) / (1 - alpha), and the speedup the measured pass costs
predict, S = E / (r_k + k c), against the measured one (efficiency).

    .venv/bin/python benchmarks/engine.py                      # random-weight pairs
    .venv/bin/python benchmarks/engine.py --target models/demo/target --draft models/demo/draft
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generation import SamplingParams, SpeculativeEngine  # noqa: E402
from generation.costs import time_forward  # noqa: E402
from generation.loading import has_tokenizer, load_tokenizer  # noqa: E402


def random_pair(vocab: int, hidden: int, layers: int, weak: float, seed: int) -> tuple[Any, Any]:
    """Return a random Llama target and a draft that is its first layer alone.

    Layers after the first are damped by ``weak``, so the target is a lightly perturbed copy
    of its one-layer draft: the draft agrees often but not always, and costs one layer.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(weak)
            layer.mlp.down_proj.weight.mul_(weak)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:1]
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = None
    return target, draft


def token_prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    """Return a mixed workload: random prompts, and prompts that repeat one passage."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        if i % 2 == 0:
            prompts.append([rng.randrange(vocab) for _ in range(length)])
        else:
            passage = [rng.randrange(vocab) for _ in range(length // 4)]
            prompts.append((passage * 4)[:length])
    return prompts


def corpus_prompts(tokenizer: Any, count: int, length: int) -> list[list[int]]:
    """Return RAG prompts in the product's format, built from the bundled demo corpus."""
    from retrieval.prompt import Passage, format_prompt

    files = sorted(Path("demo/corpus").glob("*.md"))[: 2 * count]
    prompts = []
    for i in range(count):
        docs = files[2 * i : 2 * i + 2]
        passages = [Passage(d.stem, " ".join(d.read_text().split()[:60])) for d in docs]
        text = format_prompt(f"What is {docs[0].stem}?", passages)
        prompts.append(tokenizer(text)["input_ids"][-length:])
    return prompts


def solve_alpha(e: float, k: float) -> float | None:
    """Return alpha with (1 - alpha^(k+1)) / (1 - alpha) = e (bisection), or None when k = 0."""
    if k <= 0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        value = (1 - mid ** (k + 1)) / (1 - mid) if mid < 1 else k + 1
        lo, hi = (mid, hi) if value < e else (lo, mid)
    return (lo + hi) / 2


def measure_costs(target: Any, draft: Any | None, ks: list[int], context: int) -> dict[str, Any]:
    """Return measured seconds of target passes (1 and k+1 tokens) and of a draft pass."""
    costs: dict[str, Any] = {"target_1": time_forward(target, context, 1, repeats=15)}
    costs["target"] = {k: time_forward(target, context, k + 1, repeats=15) for k in ks}
    costs["draft_1"] = time_forward(draft, context, 1, repeats=15) if draft is not None else None
    return costs


def r_of(costs: dict[str, Any], k: float) -> float:
    """Return r_k = target(k+1 tokens) / target(1 token), interpolated for fractional k."""
    points = [(0.0, 1.0)] + sorted((q, t / costs["target_1"]) for q, t in costs["target"].items())
    for (k0, r0), (k1, r1) in zip(points[:-1], points[1:], strict=True):
        if k <= k1:
            return r0 + (r1 - r0) * (k - k0) / (k1 - k0)
    (k0, r0), (k1, r1) = points[-2], points[-1]
    return r1 + (r1 - r0) * (k - k1) / (k1 - k0)


def hf_generate(target: Any, prompt: list[int], max_new: int, **kwargs: Any) -> list[int]:
    ids = torch.tensor([prompt])
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False, **kwargs
    )
    return out[0, len(prompt) :].tolist()


def run_rows(
    target: Any, draft: Any, prompts: list[list[int]], max_new: int, ks: list[int], hf_ks: list[int]
) -> list[dict[str, Any]]:
    """Time every row on every prompt (rows interleaved per prompt); return per-row totals."""
    engine = SpeculativeEngine(target, draft, max_speculative_tokens=max(ks))
    rows: list[tuple[str, Any, Any]] = [("none", "none", 1), ("transformers greedy", "hf_none", 1)]
    rows += [(f"draft_model k={k}", "draft_model", k) for k in [*ks, "auto"]]
    rows += [(f"ngram k={k}", "ngram", k) for k in (4, "auto")]
    rows += [(f"transformers assisted k={k}", "hf_assisted", k) for k in hf_ks]
    rows += [(f"transformers prompt lookup k={k}", "hf_lookup", k) for k in hf_ks]

    def run(method: str, k: Any, prompt: list[int]) -> tuple[list[int], Any]:
        if method == "hf_assisted":
            # transformers reads the draft length from the draft's generation_config.
            draft.generation_config.num_assistant_tokens = k
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            return hf_generate(target, prompt, max_new, assistant_model=draft), None
        if method == "hf_none":
            return hf_generate(target, prompt, max_new), None
        if method == "hf_lookup":
            return hf_generate(target, prompt, max_new, prompt_lookup_num_tokens=k), None
        params = SamplingParams(max_new_tokens=max_new, method=method, num_speculative_tokens=k)
        result = engine.generate(prompt, params)
        return result.token_ids, result.stats

    with torch.inference_mode():
        for _, method, k in rows:  # warm-up (and adaptive-k cost calibration)
            run(method, k, prompts[0][:32])
    totals = [
        dict(name=n, method=m, k=k, seconds=0.0, tokens=0, same=True, stats=[]) for n, m, k in rows
    ]
    baseline: dict[int, list[int]] = {}
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            order = list(range(len(rows)))
            random.Random(i).shuffle(order)  # no row always runs first (or last) on the machine
            for j in [0] + [o for o in order if o != 0]:
                row = totals[j]
                start = time.perf_counter()
                tokens, stats = run(row["method"], row["k"], prompt)
                row["seconds"] += time.perf_counter() - start
                row["tokens"] += len(tokens)
                baseline.setdefault(i, tokens)
                row["same"] = row["same"] and tokens == baseline[i]
                if stats is not None:
                    row["stats"].append(stats)
    return totals


def summarise(rows: list[dict[str, Any]], costs: dict[str, Any]) -> list[list[str]]:
    """Return table lines: speedups, acceptance, E, alpha, r_k, c, predicted S, efficiency.

    The predicted S models decode rounds only, so efficiency compares it with the decode-phase
    speedup: tokens after the first over the time after the first (both rows exclude the
    prompt's prefill, which speculation cannot shorten).
    """

    def decode_tps(row: dict[str, Any]) -> float:
        stats = row["stats"]
        tokens = sum(s.num_output_tokens - 1 for s in stats)
        return tokens / (sum(s.generation_ms - s.ttft_ms for s in stats) / 1e3)

    base, base_decode = rows[0]["tokens"] / rows[0]["seconds"], decode_tps(rows[0])
    c = costs["draft_1"] / costs["target_1"] if costs["draft_1"] else 0.0
    table = []
    for row in rows:
        tps = row["tokens"] / row["seconds"]
        stats = row["stats"]
        line = [row["name"], f"{tps:.1f}", f"{tps / base:.2f}x"]
        line.append(f"{decode_tps(row) / base_decode:.2f}x" if stats else "—")
        line.append("yes" if row["same"] else "NO")
        drafted = sum(s.num_draft_tokens for s in stats)
        if not stats or not drafted:
            table.append(line + ["—"] * 8)
            continue
        out = sum(s.num_output_tokens for s in stats)
        passes = sum(s.num_target_forwards for s in stats)
        accepted = sum(s.num_accepted_tokens for s in stats)
        drafts = sum(s.num_drafts for s in stats)
        e = out / passes
        k_bar = drafted / passes  # drafted tokens per target pass (k, less for short drafts)
        alpha = solve_alpha(e, k_bar)
        cost_c = c if row["method"] == "draft_model" else 0.0
        r_k = r_of(costs, k_bar)
        predicted = e / (r_k + k_bar * cost_c)
        line += [
            f"{accepted / drafted:.2f}",
            f"{1 + accepted / drafts:.2f}",
            f"{e:.2f}",
            f"{alpha:.2f}" if alpha is not None else "—",
            f"{r_k:.2f}",
            f"{cost_c:.2f}",
            f"{predicted:.2f}x",
            f"{(decode_tps(row) / base_decode) / predicted:.2f}",
        ]
        table.append(line)
    return table


HEADER = [
    "row",
    "tok/s",
    "speedup",
    "decode speedup",
    "same tokens",
    "accept rate",
    "mean acc len",
    "E",
    "alpha",
    "r_k",
    "c",
    "predicted S",
    "efficiency",
]


def print_table(title: str, lines: list[list[str]], costs: dict[str, Any]) -> None:
    print(f"\n### {title}\n")
    t1 = costs["target_1"] * 1e3
    parts = ", ".join(f"{k + 1} tok {v * 1e3:.2f} ms" for k, v in costs["target"].items())
    draft = f"{costs['draft_1'] * 1e3:.2f} ms" if costs["draft_1"] else "—"
    print(f"Measured passes: target 1 tok {t1:.2f} ms, {parts}; draft 1 tok {draft}\n")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for line in lines:
        print("| " + " | ".join(line) + " |")


def benchmark(title: str, target: Any, draft: Any, prompts: list[list[int]], args: Any) -> None:
    rows = run_rows(target, draft, prompts, args.max_new_tokens, args.ks, args.hf_ks)
    context = len(prompts[0]) + args.max_new_tokens // 2
    costs = measure_costs(target, draft, sorted({*args.ks, 4}), context)
    print_table(title, summarise(rows, costs), costs)
    auto = next(r for r in rows if r["name"] == "draft_model k=auto")
    fixed = [r for r in rows if r["method"] == "draft_model" and r["k"] != "auto"]
    best = max(fixed, key=lambda r: r["tokens"] / r["seconds"])
    ratio = (auto["tokens"] / auto["seconds"]) / (best["tokens"] / best["seconds"])
    print(f"\nauto vs best fixed k ({best['name']}): {ratio:.2f}x")
    tps = {r["name"]: r["tokens"] / r["seconds"] for r in rows}
    for k in args.hf_ks:
        for ours, theirs in (
            ("draft_model", "transformers assisted"),
            ("ngram", "transformers prompt lookup"),
        ):
            if f"{ours} k={k}" in tps:
                ratio = tps[f"{ours} k={k}"] / tps[f"{theirs} k={k}"]
                print(f"{ours} k={k} vs {theirs} k={k}: {ratio:.2f}x tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target checkpoint dir (default: random-weight pair)")
    parser.add_argument("--draft", help="draft checkpoint dir")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    parser.add_argument("--hf-ks", type=lambda s: [int(x) for x in s.split(",")], default=[4])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (shared CPU: 1)")
    parser.add_argument("--no-large", action="store_true", help="skip the >=50M draft=target row")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.target:
        engine = SpeculativeEngine.from_pretrained(args.target, args.draft)
        target, draft = engine.target, engine.draft
        if has_tokenizer(args.target):
            prompts = corpus_prompts(load_tokenizer(args.target), args.prompts, args.prompt_len)
        else:
            prompts = token_prompts(engine.vocab_size, args.prompts, args.prompt_len, seed=0)
        title = f"{Path(args.target).name} + {Path(args.draft).name if args.draft else '—'}"
    else:
        target, draft = random_pair(vocab=4096, hidden=256, layers=8, weak=0.05, seed=0)
        prompts = token_prompts(4096, args.prompts, args.prompt_len, seed=0)
        params = sum(p.numel() for p in target.parameters()) / 1e6
        dparams = sum(p.numel() for p in draft.parameters()) / 1e6
        title = f"random Llama {params:.1f}M target + its first layer ({dparams:.1f}M) as draft"
    benchmark(title, target, draft, prompts, args)

    if not args.no_large:
        big, _ = random_pair(vocab=8192, hidden=768, layers=8, weak=1.0, seed=1)
        params = sum(p.numel() for p in big.parameters()) / 1e6
        prompts = token_prompts(8192, max(2, args.prompts // 3), args.prompt_len, seed=1)
        args.ks, args.hf_ks = [4], [4]
        benchmark(
            f"random Llama {params:.0f}M, draft = target (alpha = 1)", big, big, prompts, args
        )


if __name__ == "__main__":
    main()
