"""Measure the shipped pair: held-out perplexity, per-step cost, acceptance and speedup.

    python -m training.evaluate --models models/demo --prompts 24 --out runs/demo/eval.json

Held-out RAG prompts are built from documents the training split never saw, in the product's
shape (three passages of up to ~220 words).  Every method decodes greedily through
``SpeculativeEngine``; outputs must equal the target-only ones.  Beside every acceptance figure
stands the answers' distinct word-bigram ratio (looping text would make acceptance meaningless).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from generation import SamplingParams, SpeculativeEngine, load_tokenizer
from generation.model.forward import Forward, HFForward
from generation.model.model_runner import ModelRunner
from retrieval.chat import PromptFormat
from training.corpus import build_corpus
from training.data import encode_example
from training.qa import chunk_documents, make_examples


def time_forward(model: Any, context_len: int, num_tokens: int, repeats: int = 5) -> float:
    """Return the median seconds of a one-row pass over ``num_tokens`` after ``context_len``
    (CPU timing).

    ``model`` is a ``Forward`` (as the engine runs it) or a transformers model (its own forward).
    """
    fwd: Forward = HFForward(model) if isinstance(model, torch.nn.Module) else model
    runner = ModelRunner(fwd, 1, context_len + num_tokens)
    vocab = int(fwd.config.vocab_size)
    ids = torch.arange(context_len + num_tokens, device=fwd.device).remainder(vocab).view(1, -1)
    times = []
    with torch.inference_mode():
        runner.run([0], ids[:, :context_len], [context_len])
        for _ in range(repeats + 1):  # the first pass warms up allocators and kernels
            start = time.perf_counter()
            runner.run([0], ids[:, context_len:], [num_tokens])
            times.append(time.perf_counter() - start)
            runner.set_length(0, context_len)
    return statistics.median(times[1:])


@dataclass
class Tally:
    """Totals of one decoding method over the evaluation prompts."""

    ms: float = 0.0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    fwd: int = 0
    cites: int = 0
    verbatim: int = 0
    bigram: list[float] = field(default_factory=list)
    longest: list[int] = field(default_factory=list)


def bigram_ratio(text: str) -> float:
    """Distinct word bigrams / word bigrams of ``text`` (1.0 when it has fewer than 2 words)."""
    words = text.split()
    pairs = list(zip(words, words[1:], strict=False))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


@torch.inference_mode()
def perplexity(model: Any, seqs: list[tuple[list[int], int]]) -> float:
    """exp(mean NLL) over each sequence's tokens from index ``start`` on."""
    total, count = 0.0, 0
    for ids, start in seqs:
        x = torch.tensor([ids])
        logits = model(input_ids=x).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none")
        total += float(nll[max(0, start - 1) :].sum())
        count += len(ids) - max(1, start)
    return math.exp(total / count)


def _words(text: str) -> list[str]:
    return text.replace('"', " ").replace("“", " ").replace("”", " ").split()


def grounded(answer: str, prompt: str, run: int = 8) -> tuple[bool, bool, int]:
    """(cites a passage, quotes >= ``run`` consecutive words of it verbatim, longest such run).

    Words are compared with quote characters dropped (passages quote keywords themselves, so a
    quoted answer's own quotation marks cannot delimit it) and whitespace normalised.
    """
    m = re.search(r"\[(\d+)\]", answer)
    if not m:
        return False, False, 0
    blocks = re.split(r"\n\[\d+\] ", prompt.split("\nQuestion:")[0])
    n = int(m.group(1))
    if n >= len(blocks):
        return True, False, 0
    source = " " + " ".join(_words(blocks[n])) + " "
    words = _words(answer[m.end() :])
    longest = 0
    for i in range(len(words)):
        j = i + longest + 1  # only a longer run than the best so far matters
        while j <= len(words) and f" {' '.join(words[i:j])} " in source:
            longest = j - i
            j += 1
    return True, longest >= run, longest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=Path, default=Path("models/demo"))
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ppl-chunks", type=int, default=80)
    ap.add_argument("--ppl-prompts", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    tdir, ddir = args.models / "target", args.models / "draft"
    tok = load_tokenizer(tdir)
    engine = SpeculativeEngine.from_pretrained(tdir, ddir, device="cpu")
    corpus = build_corpus(args.seed)
    result: dict[str, Any] = {}

    # Held-out perplexity: plain text of held-out documents, and answers of held-out RAG prompts.
    chunks = chunk_documents(corpus.heldout, 220)[::3][: args.ppl_chunks]
    text_seqs = [(tok(f"{c.title}\n{c.text}")["input_ids"], 0) for c in chunks]
    # RAG prompts from the held-out demo-corpus topics: their sections are long enough to give
    # the product's prompt shape (three ~220-word passages); docstring sections mostly are not.
    topics = [d for d in corpus.heldout if d.source.startswith("demo/corpus/")]
    rag = make_examples(
        topics,
        max(args.ppl_prompts, args.prompts),
        seed=10_000 + args.seed,
        max_words=(220,),
        n_passages=(3,),
    )
    # Prompts as the service makes them for this pair (its chat template, or raw text).
    fmt = PromptFormat.for_tokenizer(tok)
    result["prompt_format"] = fmt.name
    ans_seqs = [
        encode_example(tok, e, fmt if fmt.name == "chat" else None) for e in rag[: args.ppl_prompts]
    ]
    for role, model in (("target", engine.target), ("draft", engine.draft)):
        result[f"{role}_ppl_text"] = perplexity(model, text_seqs)
        result[f"{role}_ppl_answers"] = perplexity(model, ans_seqs)
    result["heldout_text_tokens"] = sum(len(s) for s, _ in text_seqs)

    # Per-step cost, side by side, at the product's prompt length: as the engine runs the
    # models (generation/model/forward.py), and on transformers' own forward pass.
    ctx = 900
    runs: dict[str, tuple[Any, Any]] = {
        "": (engine.target_forward, engine.draft_forward),
        "_transformers": (engine.target, engine.draft),
    }
    for suffix, (t_model, d_model) in runs.items():
        t_costs, d_costs = [], []
        for _ in range(5):
            t_costs.append(time_forward(t_model, ctx, 1, repeats=5))
            d_costs.append(time_forward(d_model, ctx, 1, repeats=5))
        result[f"target_step_ms{suffix}"] = 1000 * statistics.median(t_costs)
        result[f"draft_step_ms{suffix}"] = 1000 * statistics.median(d_costs)
        result[f"step_cost_ratio{suffix}"] = statistics.median(t_costs) / statistics.median(d_costs)

    # Decoding through the engine, methods interleaved per prompt so load noise hits all alike.
    # (method, k): the goals' rows at k = --k, and adaptive k beside them.
    methods = ("none", "draft_model", "ngram", "draft_model auto", "ngram auto")
    agg = {m: Tally() for m in methods}
    identical = True
    prompts = rag[: args.prompts]
    prefill_ms = 0.0  # the target's prompt pass, common to every method (a one-token answer)
    for e in prompts:
        ids = fmt.encode(e.question, e.passages)
        t0 = time.perf_counter()
        engine.generate(ids, SamplingParams(max_new_tokens=1, temperature=0.0, method="none"))
        prefill_ms += 1000 * (time.perf_counter() - t0)
        outs = {}
        for m in methods:
            params = SamplingParams(
                max_new_tokens=args.max_new_tokens,
                temperature=0.0,
                method=m.split()[0],
                num_speculative_tokens="auto" if m.endswith("auto") else args.k,
            )
            t0 = time.perf_counter()
            r = engine.generate(ids, params)
            dt = time.perf_counter() - t0
            outs[m] = r.token_ids
            s = r.stats.to_dict()
            a = agg[m]
            a.ms += 1000 * dt
            a.drafted += int(s["num_draft_tokens"])
            a.accepted += int(s["num_accepted_tokens"])
            a.tokens += int(s["num_output_tokens"])
            a.fwd += int(s["num_target_forwards"])
            text = str(tok.decode(r.token_ids, skip_special_tokens=True))
            a.bigram.append(bigram_ratio(text))
            c, v, longest = grounded(text, e.prompt)
            a.cites += c
            a.verbatim += v
            a.longest.append(longest)
        identical &= all(outs[m] == outs["none"] for m in methods)
    base = agg["none"].ms
    for m in methods:
        a = agg[m]
        result[m] = {
            "acceptance_rate": a.accepted / a.drafted if a.drafted else None,
            "speedup": base / a.ms,
            "decode_speedup": (base - prefill_ms) / (a.ms - prefill_ms),
            "tokens_per_s": 1000 * a.tokens / a.ms,
            "tokens_per_target_forward": a.tokens / max(1, a.fwd),
            "bigram_ratio": statistics.mean(a.bigram),
            "cites_passage": a.cites / len(prompts),
            "verbatim_quote": a.verbatim / len(prompts),
            "median_longest_quoted_run_words": statistics.median(a.longest),
            "mean_output_tokens": a.tokens / len(prompts),
        }
    result["identical_greedy_output"] = identical
    result["mean_prefill_ms"] = prefill_ms / len(prompts)
    result["prompts"] = len(prompts)
    result["mean_prompt_tokens"] = statistics.mean(
        len(fmt.encode(e.question, e.passages)) for e in prompts
    )
    sample = prompts[0]
    result["sample_question"] = sample.prompt.rsplit("Question:", 1)[1]
    result["sample_answer"] = tok.decode(
        engine.generate(
            fmt.encode(sample.question, sample.passages),
            SamplingParams(
                max_new_tokens=args.max_new_tokens,
                temperature=0.0,
                method="ngram",
                num_speculative_tokens=args.k,
            ),
        ).token_ids,
        skip_special_tokens=True,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
