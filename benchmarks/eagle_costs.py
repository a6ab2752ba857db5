"""What acceptance the EAGLE head needs to meet issue 35's speed goals, from measured step costs.

    PYTHONPATH=. .venv/bin/python benchmarks/eagle_costs.py --draft-tokens-per-pass 3.76

Times, at batch 1 on the demo pair, the engine's own step costs T(k) (generation/spec_decode/goodput.py's
tables: one target pass over k + 1 tokens plus k drafting passes) for ``none``, the draft model
and the EAGLE head, in float32 and bfloat16 (where the CPU has it), at a context of
``--context`` tokens, and the LM head's share of a head pass (a [1, hidden] x [hidden, V]
product for the full vocabulary and for reduced draft vocabularies, as EAGLE-3's d2t/t2d
mapping would use). From those it derives, per k, the tokens per target pass E and the
per-position acceptance alpha (E = (1 - alpha^(k+1)) / (1 - alpha), Leviathan et al. 2023) that
the head needs for one-stream decode tokens/s

  * >= ``--vs-draft`` x the draft model's (which makes ``--draft-tokens-per-pass`` at k = 4), and
  * >= ``--vs-none`` x ``none``'s,

printing the lowest alpha over k (or "unreachable" where even alpha = 1 falls short).
``--answers`` (JSON lines of the target's answers, training/train_eagle.py's) adds the share of
answer tokens a reduced vocabulary of the most frequent V tokens covers: the ceiling on a reduced
head's acceptance per position.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KS = list(range(0, 9))
REDUCED = (4096, 2048, 1024)


def solve_alpha(tokens: float, k: int) -> float | None:
    """The alpha with expected_tokens(alpha, k) == ``tokens`` (None when above k + 1)."""
    from generation.spec_decode.goodput import expected_tokens

    if tokens > k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < tokens else (lo, mid)
    return hi


def lm_head_seconds(hidden: int, vocab: int, dtype: object, repeats: int = 200) -> float:
    """Median seconds of one [1, hidden] x [hidden, vocab] product (a head's logits)."""
    import torch

    w = torch.randn(vocab, hidden, dtype=dtype)  # type: ignore[call-overload]
    x = torch.randn(1, hidden, dtype=dtype)  # type: ignore[call-overload]
    times = []
    with torch.inference_mode():
        for i in range(repeats + 20):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w).argmax(-1)
            if i >= 20:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def requirement(
    t_none: dict[int, float],
    t_draft: dict[int, float],
    t_eagle: dict[int, float],
    draft_tokens: float,
    vs_draft: float,
    vs_none: float,
) -> dict[str, object]:
    """Per k: the E (tokens per target pass) and alpha the head needs for each goal."""
    draft_rate = draft_tokens / t_draft[4]  # tokens per second, in units of the table
    none_rate = 1.0 / t_none[0]
    rows = []
    for k in KS[1:]:
        need_d = vs_draft * draft_rate * t_eagle[k]
        need_n = vs_none * none_rate * t_eagle[k]
        rows.append(
            {
                "k": k,
                "step_vs_none": t_eagle[k] / t_none[0],
                "E_for_draft_goal": need_d,
                "alpha_for_draft_goal": solve_alpha(need_d, k),
                "E_for_none_goal": need_n,
                "alpha_for_none_goal": solve_alpha(need_n, k),
            }
        )

    def best(key: str) -> float | None:
        ok = [r[key] for r in rows if r[key] is not None]
        return min(ok) if ok else None  # type: ignore[type-var]

    return {
        "per_k": rows,
        "lowest_alpha_for_draft_goal": best("alpha_for_draft_goal"),
        "lowest_alpha_for_none_goal": best("alpha_for_none_goal"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=Path, default=ROOT / "models" / "demo")
    ap.add_argument("--eagle", type=Path, default=None, help="default: <models>/eagle")
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--draft-tokens-per-pass", type=float, default=3.76)
    ap.add_argument("--vs-draft", type=float, default=1.25)
    ap.add_argument("--vs-none", type=float, default=1.8)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="empty: coverage only")
    ap.add_argument("--answers", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from generation import SpeculativeEngine
    from generation.model.dtypes import cpu_bf16_flags
    from generation.model.model_runner import time_batch_steps

    torch.set_num_threads(1)
    m = args.models
    out: dict[str, object] = {
        "context": args.context,
        "draft_tokens_per_pass": args.draft_tokens_per_pass,
    }
    for dtype in filter(None, args.dtypes.split(",")):
        if dtype == "bfloat16" and not cpu_bf16_flags():
            continue
        engine = SpeculativeEngine.from_pretrained(
            m / "target", m / "draft", dtype=dtype, eagle_dir=args.eagle or m / "eagle"
        )
        target, draft, head = engine.target_forward, engine.draft_forward, engine.eagle_head
        t_none = time_batch_steps(target, None, 1, [0], args.context, repeats=5)
        t_draft = time_batch_steps(target, draft, 1, KS, args.context, repeats=5)
        t_eagle = time_batch_steps(target, None, 1, KS, args.context, repeats=5, head=head)
        hidden = int(engine.target.config.hidden_size)
        vocab = int(engine.target.config.vocab_size)
        tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        lm = {v: lm_head_seconds(hidden, v, tdt) for v in (vocab, *REDUCED)}
        per_tok_draft = (t_draft[4] - t_eagle[0]) / 4
        per_tok_eagle = (t_eagle[4] - t_eagle[0]) / 4
        res: dict[str, object] = {
            "none_step_ms": t_none[0] * 1e3,
            "draft_step_ms_per_drafted_token": per_tok_draft * 1e3,
            "eagle_step_ms_per_drafted_token": per_tok_eagle * 1e3,
            "eagle_per_token / draft_per_token": per_tok_eagle / per_tok_draft,
            "draft_per_token / target_pass": per_tok_draft / t_none[0],
            "eagle_per_token / target_pass": per_tok_eagle / t_none[0],
            "lm_head_ms": {str(v): s * 1e3 for v, s in lm.items()},
            "T_draft_ms": {k: t * 1e3 for k, t in t_draft.items()},
            "T_eagle_ms": {k: t * 1e3 for k, t in t_eagle.items()},
            "full_vocab": requirement(
                t_none, t_draft, t_eagle, args.draft_tokens_per_pass, args.vs_draft, args.vs_none
            ),
        }
        for v in REDUCED:
            saved = lm[vocab] - lm[v]
            t_red = {k: t - k * saved for k, t in t_eagle.items()}
            res[f"reduced_vocab_{v}"] = requirement(
                t_none, t_draft, t_red, args.draft_tokens_per_pass, args.vs_draft, args.vs_none
            )
        out[dtype] = res
        print(
            dtype, json.dumps({k: v for k, v in res.items() if "vocab" not in k}), file=sys.stderr
        )
    if args.answers is not None:
        counts: collections.Counter[int] = collections.Counter()
        for line in args.answers.read_text().splitlines():
            counts.update(json.loads(line)["answer"])
        total = sum(counts.values())
        ranked = [c for _, c in counts.most_common()]
        out["answer_tokens"] = total
        out["distinct_answer_tokens"] = len(ranked)
        out["reduced_vocab_coverage"] = {str(v): sum(ranked[:v]) / total for v in REDUCED}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
