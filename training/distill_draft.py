"""Distil the draft on the target's own answers: ``python -m training.distill_draft``.

The draft is judged on one thing: does it predict what the *target* will say next, on the
target's own greedy answers.  train_demo.py distils it on the reference answers of the
training data, which the target does not reproduce word for word, so the draft learns to
follow text the target never writes.  This script closes that gap (sequence-level
distillation, Kim & Rush 2016; "on-policy" data as in DistillSpec, Zhou et al. 2024):

1. ``generate``: the shipped target answers RAG prompts built from the *training* split
   (greedy, batched with left padding; the held-out prompts of training/evaluate.py stay
   unseen).  Answers are appended to ``--answers`` (shared by every round, so a later round
   with more ``--prompts`` only adds answers), and an interrupted run resumes.
2. ``train``: the draft is trained on prompt + target answer to match the target's full
   next-token distribution, KL(target || draft), answers carrying ``--answer-weight`` of the
   loss; checkpoints to ``<run-dir>/ckpt.pt`` (resumable), then the draft is exported over
   ``--out``/draft with its training card extended, and ``<run-dir>/done.json`` marks the
   round finished (running it again does nothing).

The shipped draft is three rounds of this after training/train_demo.py: ``make demo-pair``.

Only the draft changes; the target is read, never written.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

from retrieval.chat import PromptFormat
from training.checkpoint import load_checkpoint, save_checkpoint
from training.corpus import REPO_ROOT, build_corpus
from training.data import Batch, bucket, collate
from training.model import autocast_dtype, export
from training.qa import Example, make_examples
from training.train_demo import kl_losses, log_line, lr_at, weighted


def training_prompts(seed: int, count: int) -> list[Example]:
    """``count`` seeded RAG examples from the training split.

    Shaped like the held-out evaluation prompts (demo-corpus topics, ~220-word passages),
    with two- and three-passage prompts mixed.
    """
    corpus = build_corpus(seed)
    topics = [d for d in corpus.train if d.source.startswith("demo/corpus/")]
    return make_examples(
        topics, count, seed=20_000 + seed, max_words=(120, 220), n_passages=(2, 3, 3)
    )


def prompt_ids(tok: PreTrainedTokenizerFast, examples: list[Example]) -> list[list[int]]:
    """The examples' prompts as the service encodes them for this tokenizer (chat or raw)."""
    fmt = PromptFormat.for_tokenizer(tok)
    return [fmt.encode(e.question, e.passages) for e in examples]


def grow(model: LlamaForCausalLM, layers: int, seed: int) -> LlamaForCausalLM:
    """Return ``model`` deepened to ``layers`` decoder layers, computing the same function.

    New layers are appended before the final norm with fresh weights, except that the two
    projections writing into the residual stream (attention ``o_proj``, MLP ``down_proj``)
    start at zero: each new layer adds nothing until training gives it something to add.
    """
    have = model.config.num_hidden_layers
    if layers <= have:
        return model
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[0]] * layers
    torch.manual_seed(seed)
    bigger = LlamaForCausalLM(config)
    missing, unexpected = bigger.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected, unexpected
    with torch.no_grad():
        for layer in bigger.model.layers[have:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return bigger


def _log(run_dir: Path, msg: str) -> None:
    log_line(run_dir / "distill.log", msg)


@torch.inference_mode()
def generate(
    target: LlamaForCausalLM,
    tok: PreTrainedTokenizerFast,
    prompts: list[list[int]],
    out: Path,
    max_new_tokens: int,
    batch_size: int,
    run_dir: Path,
) -> None:
    """Append the target's greedy answer to every prompt not yet in ``out`` (JSON lines).

    Answers stop at any EOS id of the target's generation config and keep that EOS (the
    draft must predict it too).
    """
    done = sum(1 for _ in out.open()) if out.exists() else 0
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    pad = tok.pad_token_id
    t0 = time.perf_counter()
    for lo in range(done, len(prompts), batch_size):
        chunk = prompts[lo : lo + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = target.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=sorted(eos_ids),
        )
        with out.open("a") as f:
            for p, row in zip(chunk, gen, strict=True):
                answer = row[width:].tolist()
                ends = [i for i, t in enumerate(answer) if t in eos_ids]
                if ends:
                    answer = answer[: ends[0] + 1]
                f.write(json.dumps({"prompt": p, "answer": answer}) + "\n")
        n = lo + len(chunk)
        rate = (n - done) / (time.perf_counter() - t0)
        _log(run_dir, f"generate {n}/{len(prompts)} answers ({rate:.2f}/s)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=Path, default=REPO_ROOT / "models" / "demo")
    ap.add_argument("--out", type=Path, default=None, help="default: --models (draft replaced)")
    ap.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "distill")
    ap.add_argument(
        "--answers", type=Path, default=REPO_ROOT / "runs" / "distill" / "answers.jsonl"
    )
    ap.add_argument("--prompts", type=int, default=1200)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--gen-batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--answer-weight", type=float, default=0.9)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phase", choices=("all", "generate", "train"), default="all")
    ap.add_argument(
        "--draft-layers",
        type=int,
        default=0,
        help="deepen the draft to this many layers first (function-preserving; 0: keep)",
    )
    args = ap.parse_args(argv)
    out_root = args.out or args.models

    torch.set_num_threads(args.threads)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    args.answers.parent.mkdir(parents=True, exist_ok=True)
    if (args.run_dir / "done.json").exists():
        _log(args.run_dir, f"{args.run_dir} is done; nothing to do")
        return
    tdir, ddir = args.models / "target", args.models / "draft"
    tok = cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(str(tdir)))  # tokenizer.json
    target = LlamaForCausalLM.from_pretrained(str(tdir), dtype=torch.float32).eval()

    if args.phase in ("all", "generate"):
        prompts = prompt_ids(tok, training_prompts(args.seed, args.prompts))
        generate(
            target, tok, prompts, args.answers, args.max_new_tokens, args.gen_batch, args.run_dir
        )
        if args.phase == "generate":
            return

    rows = []
    for line in args.answers.read_text().splitlines():
        d = json.loads(line)
        rows.append((d["prompt"] + d["answer"], len(d["prompt"])))
    draft = LlamaForCausalLM.from_pretrained(str(ddir), dtype=torch.float32)
    draft = grow(draft, args.draft_layers, args.seed)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    plan = [
        b for e in range(args.epochs) for b in bucket(rows, args.tokens_per_batch, random.Random(e))
    ]
    state: dict[str, Any] = {"step": 0, "seconds": 0.0, "tokens": 0}
    ckpt = args.run_dir / "ckpt.pt"
    saved = load_checkpoint(ckpt, {"draft": draft}, {"opt": opt})
    if saved is not None:
        state = saved["state"]
        _log(args.run_dir, f"resumed at step {state['step']}")
    _log(args.run_dir, f"train: {len(rows)} answers, {len(plan)} steps ({args.epochs} epochs)")
    draft.train()
    amp = autocast_dtype()
    while state["step"] < len(plan):
        t0 = time.perf_counter()
        step = state["step"]
        b: Batch = collate(plan[step], tok.pad_token_id)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, len(plan), args.lr, warmup=10)
        with torch.autocast("cpu", dtype=amp, enabled=amp != torch.float32):
            with torch.no_grad():
                teacher = target(b.input_ids).logits
            student = draft(b.input_ids).logits
            loss = weighted(kl_losses(student, teacher), b, args.answer_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        state["step"] += 1
        state["seconds"] += dt
        state["tokens"] += int(b.is_real.sum())
        if step % 5 == 0:
            _log(
                args.run_dir,
                f"step {step}/{len(plan)} kl {loss.item():.3f} "
                f"tok/s {int(b.is_real.sum()) / dt:.0f} elapsed {state['seconds'] / 60:.1f} min",
            )
        if state["step"] % args.ckpt_every == 0 or state["step"] == len(plan):
            save_checkpoint(ckpt, {"draft": draft}, {"opt": opt}, state=state)

    card = json.loads((ddir / "training.json").read_text())
    # One entry per distillation round.
    card["distill_on_target_answers"] = card.get("distill_on_target_answers", []) + [
        {
            "answers": len(rows),
            "epochs": args.epochs,
            "steps": state["step"],
            "train_seconds": round(state["seconds"]),
            "train_tokens": state["tokens"],
            "lr": args.lr,
            "answer_weight": args.answer_weight,
            "draft_layers": draft.config.num_hidden_layers,
            "command": f"python -m training.distill_draft --seed {args.seed} --prompts {len(rows)}"
            f" --epochs {args.epochs}"
            + (f" --draft-layers {args.draft_layers}" if args.draft_layers else ""),
        }
    ]
    export(draft.eval(), tok, out_root / "draft", card)
    _log(args.run_dir, f"exported draft to {out_root / 'draft'}")
    (args.run_dir / "done.json").write_text(json.dumps(state) + "\n")


if __name__ == "__main__":
    main()
