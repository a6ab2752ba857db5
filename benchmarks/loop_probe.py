"""On-policy loop probe: the target's greedy answers to training-stream questions, and where they
leave the gold answer.

    PYTHONPATH=. .venv/bin/python benchmarks/loop_probe.py --models models/demo --count 120

Questions come from training/qa.py's generator over the demo corpus's *training* documents with
a seed of their own (``--seed``), never the held-out 30 (held-out documents) nor the guard set
(``instruct_goals.demo_questions(40, 99)``, excluded by question text). Examples whose gold
answer repeats itself (training/data.py ``answer_repeats``: a quoted code example's repeated
line) are drawn ``--repeat-share`` of the time, since that is where loops start. Each prompt is
the serving path's chat encoding (retrieval/chat.py); the target answers greedily
(``--max-tokens``, stopping at end of turn), in float32 with plain Hugging Face generate.

Printed: answers that loop (a 4-word sequence three times, as instruct_goals.py counts), and for
every answer that leaves the gold one, whether its first wrong token sits at a position
``ambiguity_positions`` flags (the n tokens before it occur earlier in the context with another
next token) -- against the share of flagged positions among all gold answer labels, the base
rate.  And teacher forced on the gold answers (past its first SKIP_OPENING tokens), how often the
target's argmax misses the label at flagged positions and at the others: the weight's aim is to
bring the first down.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


SKIP_OPENING = 8  # "According to [n], \"": the citation and the quote's start are another skill


def main() -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from benchmarks.instruct_goals import demo_questions, loops
    from retrieval.chat import PromptFormat
    from training.corpus import build_corpus
    from training.data import AMBIGUITY_N, ambiguity_positions, answer_repeats, encode_example
    from training.qa import make_examples

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=Path, default=ROOT / "models" / "demo")
    ap.add_argument("--count", type=int, default=120)
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--repeat-share", type=float, default=0.5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ambiguity-n", type=int, nargs=2, default=list(AMBIGUITY_N))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--teacher-forced-only", action="store_true", help="skip the greedy answers (fast)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)

    tok = AutoTokenizer.from_pretrained(str(args.models / "target"))
    model = LlamaForCausalLM.from_pretrained(str(args.models / "target"), dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    fmt = PromptFormat.for_tokenizer(tok)
    docs = [d for d in build_corpus(0).train if d.source.startswith("demo/corpus/")]
    guard = {q["question"] for q in demo_questions(40, 99)}
    pool = [
        e
        for e in make_examples(docs, 20 * args.count, seed=args.seed)
        if e.question not in guard and not e.answer.startswith("The passages")
    ]
    enc = [(e, ids, n_prompt, answer_repeats(ids, n_prompt))
           for e in pool for ids, n_prompt in [encode_example(tok, e, fmt)]]  # fmt: skip
    rep = [x for x in enc if x[3]]
    other = [x for x in enc if not x[3]]
    rng = random.Random(args.seed)
    n_rep = min(len(rep), round(args.count * args.repeat_share))
    picked = rng.sample(rep, n_rep) + rng.sample(other, args.count - n_rep)
    n_range = (args.ambiguity_n[0], args.ambiguity_n[1])

    flagged_labels = all_labels = 0
    tf_wrong = {True: 0, False: 0}  # teacher-forced argmax misses at flagged / other labels
    tf_count = {True: 0, False: 0}
    diverged = diverged_flagged = n_loops = n_loops_rep = 0
    samples = []
    for i, (ex, ids, n_prompt, is_rep) in enumerate(picked):
        prompt = torch.tensor([ids[:n_prompt]])
        gen: list[int] = []
        if not args.teacher_forced_only:
            with torch.no_grad():
                out = model.generate(
                    prompt,
                    max_new_tokens=args.max_tokens,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=tok.pad_token_id,
                )
            gen = out[0, n_prompt:].tolist()
        text = tok.decode(gen, skip_special_tokens=True)
        flags = set(ambiguity_positions(ids, n_prompt, n_range))
        with torch.no_grad():
            pred = model(torch.tensor([ids])).logits[0, :-1].argmax(-1).tolist()
        for p in range(n_prompt - 1 + SKIP_OPENING, len(ids) - 1):
            tf_count[p in flags] += 1
            tf_wrong[p in flags] += pred[p] != ids[p + 1]
        gold = ids[n_prompt:]
        flagged_labels += len(flags)
        all_labels += len(gold)
        first = next((t for t in range(min(len(gen), len(gold))) if gen[t] != gold[t]), None)
        looped = loops(text)
        n_loops += looped
        n_loops_rep += looped and is_rep
        if first is not None and gen:
            diverged += 1
            # the label of position n_prompt - 1 + first is the first wrong token
            diverged_flagged += (n_prompt - 1 + first) in flags
        samples.append(
            {
                "question": ex.question,
                "gold": ex.answer,
                "answer": text,
                "loops": looped,
                "answer_repeats": is_rep,
                "first_wrong": first,
                "first_wrong_flagged": first is not None and (n_prompt - 1 + first) in flags,
            }
        )
        if looped:
            print(f"LOOP {i}: {ex.question!r}\n  gold {ex.answer[:160]!r}\n  got  {text[:240]!r}")
    base = flagged_labels / max(1, all_labels)
    hit = diverged_flagged / max(1, diverged)
    summary = {
        "models": str(args.models),
        "answers": len(picked),
        "gold_repeats_itself": n_rep,
        "loops": n_loops,
        "loops_where_gold_repeats": n_loops_rep,
        "left_gold": diverged,
        "first_wrong_token_flagged": diverged_flagged,
        "flagged_share_of_first_wrong": round(hit, 3),
        "flagged_share_of_all_labels": round(base, 3),
        "teacher_forced_miss_flagged": round(tf_wrong[True] / max(1, tf_count[True]), 3),
        "teacher_forced_miss_other": round(tf_wrong[False] / max(1, tf_count[False]), 3),
        "teacher_forced_labels_flagged_other": [tf_count[True], tf_count[False]],
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "samples": samples}, indent=1) + "\n")


if __name__ == "__main__":
    main()
