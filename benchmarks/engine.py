"""Speculative decoding engine benchmark: tokens/s, acceptance and efficiency per method.

One run, the same prompts and the same pair for every row: target alone (``none``), the draft
model at k in --ks and ``auto``, prompt lookup (``ngram``), the engine again on transformers'
forward pass (``fast_forward=False``: what the engine's own loop is worth without
generation/model/forward.py), and transformers' own assisted generation and prompt lookup with the
same pair and k. All rows decode greedily and must give
the baseline's tokens. Per row: E = num_output_tokens / num_target_forwards, the per-token
alpha solved from E = (1 - alpha^(k+1)) / (1 - alpha), and the speedup the measured pass costs
predict, S = E / (r_k + k c), against the measured one (efficiency).

    .venv/bin/python -m benchmarks.engine                      # random-weight pairs
    .venv/bin/python -m benchmarks.engine --target models/demo/target --draft models/demo/draft
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.support import goal, write_result
from generation import SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from generation.model.forward import Forward
from generation.model.loading import has_tokenizer, load_tokenizer
from generation.model.model_runner import ModelRunner

GOALS = [
    goal(
        "engine",
        "greedy output identical to the target alone, every method and k",
        "identical",
        "==",
        True,
    ),
    goal(
        "engine",
        "efficiency: measured speedup / speedup predicted from measured pass costs, lowest row",
        "min_efficiency",
        ">=",
        0.9,
    ),
    goal(
        "engine",
        "tokens/s against transformers' assisted generation, same pair and k",
        "vs_assisted",
        ">=",
        1.15,
        "x",
    ),
    goal(
        "engine",
        "tokens/s against transformers' prompt lookup, same pair and k",
        "vs_lookup",
        ">=",
        1.15,
        "x",
    ),
    goal("engine", "k auto against the best fixed k", "auto_vs_best", ">=", 0.95, "x"),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""


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


def probe_costs(
    target: Forward,
    draft: Forward | None,
    prompt: list[int],
    ks: list[int],
    clock: Any,
    repeats: int = 3,
) -> dict[str, list[float]]:
    """Return seconds of target passes over 1 and k+1 tokens and of 1-token draft passes.

    Timed as the engine runs the models (its ``Forward``s), after this prompt (the context the
    rows decode at), interleaved with the rows so that a change of machine load shows in both.
    """
    probes: dict[str, list[float]] = {"target_1": [], "draft_1": [], "draft_prefill": []}
    probes.update({f"target_{k + 1}": [] for k in ks})
    for name, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        runner = ModelRunner(model, 1, len(prompt) + max(ks) + 2)
        start = clock()
        runner.prefill(0, prompt)
        if name == "draft":
            probes["draft_prefill"].append(clock() - start)
        sizes = [1] + ([k + 1 for k in ks] if name == "target" else [])
        for _ in range(repeats):
            for size in sizes:
                ids = torch.tensor([prompt[:size]])
                start = clock()
                runner.run([0], ids, [size])
                probes[f"{name}_{size}"].append(clock() - start)
                runner.set_length(0, len(prompt))
    return probes


def hf_generate(target: Any, prompt: list[int], max_new: int, **kwargs: Any) -> list[int]:
    ids = torch.tensor([prompt])
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False, **kwargs
    )
    return out[0, len(prompt) :].tolist()


def run_rows(
    target: Any, draft: Any, prompts: list[list[int]], args: Any
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Time every row and the cost probes on every prompt, interleaved in a shuffled order.

    Returns per-row totals and the median probe times. Each prompt's prefill (a one-token
    generation) is timed too, so decode-phase speedups exclude it for every row alike.
    """
    max_new, ks, hf_ks, clock = args.max_new_tokens, args.ks, args.hf_ks, args.clock
    engine = SpeculativeEngine(target, draft, config=EngineConfig(max_speculative_tokens=max(ks)))
    on_hf = SpeculativeEngine(
        target, draft, config=EngineConfig(max_speculative_tokens=max(ks), fast_forward=False)
    )
    rows: list[tuple[str, Any, Any]] = [("none", "none", 1), ("transformers greedy", "hf_none", 1)]
    rows += [(f"draft_model k={k}", "draft_model", k) for k in [*ks, "auto"]]
    rows += [(f"ngram k={k}", "ngram", k) for k in (4, "auto")]
    rows += [("none, transformers forward", "none hf_fwd", 1)]
    rows += [
        (f"{m} k={k}, transformers forward", f"{m} hf_fwd", k)
        for m in ("draft_model", "ngram")
        for k in hf_ks
    ]
    rows += [(f"transformers assisted k={k}", "hf_assisted", k) for k in hf_ks]
    rows += [(f"transformers prompt lookup k={k}", "hf_lookup", k) for k in hf_ks]

    def run(method: str, k: Any, prompt: list[int], new: int = max_new) -> tuple[list[int], Any]:
        if method == "hf_assisted":
            # transformers reads the draft length from the draft's generation_config.
            draft.generation_config.num_assistant_tokens = k
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            return hf_generate(target, prompt, new, assistant_model=draft), None
        if method == "hf_none":
            return hf_generate(target, prompt, new), None
        if method == "hf_lookup":
            return hf_generate(target, prompt, new, prompt_lookup_num_tokens=k), None
        on = on_hf if method.endswith(" hf_fwd") else engine
        method = method.split()[0]
        params = SamplingParams(max_new_tokens=new, method=method, num_speculative_tokens=k)
        result = on.generate(prompt, params)
        return result.token_ids, result.stats

    totals = [
        dict(name=n, method=m, k=k, seconds=0.0, tokens=0, same=True, stats=[]) for n, m, k in rows
    ]
    probes: dict[str, list[float]] = {}
    prefill_seconds = 0.0
    with torch.inference_mode():
        for _, method, k in rows:  # warm-up (and adaptive-k cost calibration)
            run(method, k, prompts[0][:32], new=8)
        for i, prompt in enumerate(prompts):
            order = list(range(len(rows) + 2))
            random.Random(i).shuffle(order)  # no row always runs first (or last) on the machine
            for j in order:
                if j == len(rows):
                    start = clock()
                    run("none", 1, prompt, new=1)
                    prefill_seconds += clock() - start
                    continue
                if j == len(rows) + 1:
                    probe_ks = sorted({1, 2, 4, 8, *ks})  # r_k is not linear: probe a grid
                    probed = probe_costs(
                        engine.target_forward, engine.draft_forward, prompt, probe_ks, clock
                    )
                    for name, times in probed.items():
                        probes.setdefault(name, []).extend(times)
                    continue
                row = totals[j]
                start = clock()
                tokens, stats = run(row["method"], row["k"], prompt)
                row["seconds"] += clock() - start
                row["tokens"] += len(tokens)
                row.setdefault("outputs", []).append(tokens)
                if stats is not None:
                    row["stats"].append(stats)
    draft_prefill = sum(probes["draft_prefill"])
    for row in totals:
        row["same"] = row["outputs"] == totals[0]["outputs"]  # row 0: target alone
        # S models decode rounds only: take out the prompt's prefill by the target (every
        # row) and by the draft (rows that run one), both timed on the same prompts.
        row["decode_seconds"] = row["seconds"] - prefill_seconds
        if row["method"].split()[0] in ("draft_model", "hf_assisted"):
            row["decode_seconds"] -= draft_prefill
        row["decode_tokens"] = row["tokens"] - len(prompts)
    costs = {
        name: statistics.median(times)
        for name, times in probes.items()
        if times and name != "draft_prefill"
    }
    return totals, costs


def r_of(costs: dict[str, float], k: float) -> float:
    """Return r_k = target(k+1 tokens) / target(1 token), interpolated for fractional k."""
    measured = sorted(
        (int(name.split("_")[1]) - 1, t / costs["target_1"])
        for name, t in costs.items()
        if name.startswith("target_")
    )
    k0, r0 = measured[0]
    for k1, r1 in measured[1:]:
        if k <= k1:
            return r0 + (r1 - r0) * (k - k0) / (k1 - k0)
        k0, r0 = k1, r1
    return r0


def summarise(rows: list[dict[str, Any]], costs: dict[str, float]) -> list[list[str]]:
    """Return table lines: speedups, acceptance, E, alpha, r_k, c, predicted S, efficiency.

    The predicted S models decode rounds only, so efficiency compares it with the decode-phase
    speedup: the prompt's prefill by the target (all rows) and by the draft (draft rows) taken
    out, each timed on the same prompts.
    """
    base = rows[0]["tokens"] / rows[0]["seconds"]
    base_decode = rows[0]["decode_tokens"] / rows[0]["decode_seconds"]
    c = costs["draft_1"] / costs["target_1"] if "draft_1" in costs else 0.0
    table = []
    for row in rows:
        tps = row["tokens"] / row["seconds"]
        decode = (row["decode_tokens"] / row["decode_seconds"]) / base_decode
        line = [row["name"], f"{tps:.1f}", f"{tps / base:.2f}x", f"{decode:.2f}x"]
        line.append("yes" if row["same"] else "NO")
        stats = row["stats"]
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
        if row["method"].endswith("hf_fwd"):  # S is predicted from the engine's own passes
            table.append(line + ["—"] * 8)
            continue
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
            f"{decode / predicted:.2f}",
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


def print_table(title: str, lines: list[list[str]], costs: dict[str, float]) -> None:
    print(f"\n### {title}\n")
    passes = ", ".join(
        f"{name.replace('_', ' ')} tok {t * 1e3:.2f} ms" for name, t in sorted(costs.items())
    )
    print(f"Median measured passes ({passes})\n")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for line in lines:
        print("| " + " | ".join(line) + " |")


def benchmark(
    title: str, target: Any, draft: Any, prompts: list[list[int]], args: Any
) -> dict[str, Any]:
    """Print the pair's table and comparisons; returns the goals' figures for the pair."""
    rows, costs = run_rows(target, draft, prompts, args)
    lines = summarise(rows, costs)
    print_table(title, lines, costs)
    tps = {r["name"]: r["tokens"] / r["seconds"] for r in rows}
    fixed = [f"draft_model k={k}" for k in args.ks]
    best = max(fixed, key=lambda name: tps[name])
    print(f"\nauto vs best fixed k ({best}): {tps['draft_model k=auto'] / tps[best]:.2f}x tokens/s")
    efficiency = {line[0]: float(line[-1]) for line in lines if line[-1] != "—"}
    figures: dict[str, Any] = {
        "pair": title,
        "identical": all(r["same"] for r in rows),
        "min_efficiency": min(efficiency.values(), default=None),
        "efficiency": efficiency,
        "auto_vs_best": tps["draft_model k=auto"] / tps[best],
        "vs_assisted": None,
        "vs_lookup": None,
        "tokens_per_s": tps,
    }
    for k in args.hf_ks:
        for ours, theirs in (
            ("draft_model", "transformers assisted"),
            ("ngram", "transformers prompt lookup"),
        ):
            if f"{ours} k={k}" in tps:
                ratio = tps[f"{ours} k={k}"] / tps[f"{theirs} k={k}"]
                loop = tps[f"{ours} k={k}, transformers forward"] / tps[f"{theirs} k={k}"]
                print(
                    f"{ours} k={k} vs {theirs} k={k}: {ratio:.2f}x tokens/s "
                    f"(on transformers' forward pass: {loop:.2f}x)"
                )
                if (
                    k == 4
                    or figures["vs_assisted" if ours == "draft_model" else "vs_lookup"] is None
                ):
                    figures["vs_assisted" if ours == "draft_model" else "vs_lookup"] = ratio
    return figures


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
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: process CPU time (robust on a shared machine; one thread); wall: elapsed time",
    )
    args = parser.parse_args()
    args.clock = time.process_time if args.clock == "cpu" else time.perf_counter
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
    figures = benchmark(title, target, draft, prompts, args)
    notes = {
        "min_efficiency": min(figures["efficiency"], key=figures["efficiency"].get, default="")
    }
    write_result("engine", figures, GOALS, notes)  # the goals are read on the first pair

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
