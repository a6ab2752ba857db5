"""Train the demo pair and write it to models/demo/{target,draft}: ``python -m training.train_demo``.

One seeded command; it checkpoints to ``--run-dir`` and resumes from there when interrupted.
Phase 1 trains the target on RAG examples while the draft learns online from the target's
logits (free: the teacher forward is already done).  Phase 2 distils the draft from the final
target alone.  Then both are exported (float16 safetensors + config + tokenizer).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerFast

from training.copy_recipe import COPY_RECIPE_STEPS, INDUCTION_EVERY, run_copy_recipe
from training.corpus import REPO_ROOT, build_corpus
from training.data import ANSWER_WEIGHT_SPLIT, Batch, BatchStream
from training.model import DRAFT_SHAPE, TARGET_SHAPE, export, make_model
from training.qa import make_examples
from training.tokenizer import train_tokenizer


def weighted(values: torch.Tensor, b: Batch, split: float = ANSWER_WEIGHT_SPLIT) -> torch.Tensor:
    """Per-position losses [batch, seq-1] reduced so answers carry ``split`` of it."""
    real, ans = b.is_real[:, :-1], b.is_answer[:, :-1]
    prompt = real & ~ans
    return (1 - split) * values[prompt].mean() + split * values[ans].mean()


def lr_at(step: int, total: int, peak: float, warmup: int = 40) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each next token: [batch, seq-1]."""
    lg = logits[:, :-1].float()
    return F.cross_entropy(lg.transpose(1, 2), ids[:, 1:], reduction="none")


def kl_losses(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) at each position: [batch, seq-1]."""
    t = F.log_softmax(teacher[:, :-1].float(), dim=-1)
    s = F.log_softmax(student[:, :-1].float(), dim=-1)
    return (t.exp() * (t - s)).sum(-1)


def tokenizer_for(run_dir: Path, docs: list, seed: int) -> PreTrainedTokenizerFast:
    """The run's tokenizer: trained once on the corpus plus formatted examples, then reused."""
    path = run_dir / "tokenizer"
    if (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    texts = [d.text() for d in docs]
    texts += [e.prompt + e.answer for e in make_examples(docs, 2000, seed=seed + 1)]
    tok = train_tokenizer(texts)
    tok.save_pretrained(str(path))
    return tok


# Phases, in steps of --tokens-per-batch tokens.  Main: RAG examples of every length, answers half
# the loss, cosine planned over --target-steps.  The shipped run's main phase was cut at MAIN_STOP
# when the target still looped instead of copying; the copy phase then trains on denser,
# shorter examples with answers carrying COPY_ANSWER_SPLIT of the loss.  Draft: online
# distillation throughout, then draft-only distillation from the final target.
MAIN_STOP = 325
COPY_STEPS = 125
DRAFT_STEPS = 30
# Optional second round: more copy-phase training of the target (with online distillation), then
# draft-only steps, on their own schedules. Off by default: 200 + 20 steps of it lowered held-out
# perplexity (281 vs 313) but made greedy answers loop (bigram ratio 0.16), so it is not shipped.
EXTRA_COPY_STEPS = 0
EXTRA_DRAFT_STEPS = 0
COPY_ANSWER_SPLIT = 0.8
COPY_MAX_WORDS = (40, 60, 90, 160, 220)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "demo")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "models" / "demo")
    ap.add_argument("--target-steps", type=int, default=380)
    ap.add_argument(
        "--main-stop",
        type=int,
        default=MAIN_STOP,
        help="end the main phase early (its schedule stays)",
    )
    ap.add_argument("--copy-steps", type=int, default=COPY_STEPS)
    ap.add_argument("--copy-lr", type=float, default=6e-4)
    ap.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    ap.add_argument("--extra-copy-steps", type=int, default=EXTRA_COPY_STEPS)
    ap.add_argument("--extra-draft-steps", type=int, default=EXTRA_DRAFT_STEPS)
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--ckpt-every", type=int, default=25)
    # One thread: on two cores shared with other jobs, two intra-op threads spin at barriers
    # and ran 2-5x slower than one (measured).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--export-now", action="store_true", help="export the latest checkpoint and exit"
    )
    ap.add_argument(
        "--recipe",
        choices=("base", "copy"),
        default="base",
        help="base: train from scratch; copy: fine-tune --init-from to copy (copy_recipe.py)",
    )
    ap.add_argument("--init-from", type=Path, default=None, help="pair to start --recipe copy from")
    ap.add_argument("--recipe-steps", type=int, default=COPY_RECIPE_STEPS)
    ap.add_argument("--induction-every", type=int, default=INDUCTION_EVERY)
    ap.add_argument(
        "--induction-symbols", type=int, default=0, help="random-token alphabet (0: whole vocab)"
    )
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = args.run_dir / "train.log"

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        with log_path.open("a") as f:
            f.write(line + "\n")

    if args.recipe == "copy":
        run_copy_recipe(args, log)
        return
    corpus = build_corpus(args.seed)
    tok = tokenizer_for(args.run_dir, corpus.train, args.seed)
    vocab, eos = len(tok), tok.eos_token_id
    target = make_model(TARGET_SHAPE, vocab, eos, seed=args.seed)
    draft = make_model(DRAFT_SHAPE, vocab, eos, seed=args.seed + 1)
    opt_t = torch.optim.AdamW(target.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    opt_d = torch.optim.AdamW(
        draft.parameters(), lr=args.draft_lr, betas=(0.9, 0.95), weight_decay=0.1
    )
    state: dict[str, Any] = {"step": 0, "rnd": 0, "idx": 0, "seconds": 0.0, "tokens": 0}
    ckpt = args.run_dir / "ckpt.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        target.load_state_dict(saved["target"])
        draft.load_state_dict(saved["draft"])
        opt_t.load_state_dict(saved["opt_t"])
        opt_d.load_state_dict(saved["opt_d"])
        state = saved["state"]
        log(f"resumed at step {state['step']}")

    def save() -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save(
            {
                "target": target.state_dict(),
                "draft": draft.state_dict(),
                "opt_t": opt_t.state_dict(),
                "opt_d": opt_d.state_dict(),
                "state": state,
            },
            tmp,
        )
        os.replace(tmp, ckpt)

    def do_export() -> None:
        card = {
            "seed": args.seed,
            "steps": state["step"],
            "train_seconds": round(state["seconds"]),
            "train_tokens": state["tokens"],
            "target_steps": args.target_steps,
            "draft_steps": args.draft_steps,
            "tokens_per_batch": args.tokens_per_batch,
            "command": f"python -m training.train_demo --seed {args.seed}",
        }
        export(target, tok, args.out / "target", {**card, "role": "target"})
        export(draft, tok, args.out / "draft", {**card, "role": "draft"})
        log(f"exported step {state['step']} to {args.out}")

    if args.export_now:
        do_export()
        return

    main_end = min(args.main_stop, args.target_steps)
    copy_end = main_end + args.copy_steps
    first_end = copy_end + args.draft_steps
    extra_copy_end = first_end + args.extra_copy_steps
    total = extra_copy_end + args.extra_draft_steps
    streams = {
        "main": BatchStream(
            corpus.train, tok, seed=args.seed, tokens_per_batch=args.tokens_per_batch
        ),
        "copy": BatchStream(
            corpus.train,
            tok,
            seed=args.seed + 1,
            tokens_per_batch=args.tokens_per_batch,
            max_words=COPY_MAX_WORDS,
            n_passages=(2, 3),
        ),
    }
    while state["step"] < total:
        t0 = time.perf_counter()
        step = state["step"]
        phase = "main" if step < main_end else "copy"
        if phase == "copy" and state.get("phase") != "copy":
            state.update(phase="copy", rnd=0, idx=0)  # the copy stream starts at its own round 0
        stream = streams[phase]
        batches = stream.round_batches(state["rnd"])
        b = stream.batch(state["rnd"], state["idx"])
        state["idx"] += 1
        if state["idx"] >= len(batches):
            state["rnd"], state["idx"] = state["rnd"] + 1, 0
        extra = step >= first_end
        train_target = step < copy_end or first_end <= step < extra_copy_end
        split = ANSWER_WEIGHT_SPLIT if phase == "main" else COPY_ANSWER_SPLIT
        target.train(train_target)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if train_target:
                for g in opt_t.param_groups:
                    g["lr"] = (
                        lr_at(step, args.target_steps, args.lr)
                        if phase == "main"
                        else lr_at(step - main_end, args.copy_steps, args.copy_lr, warmup=10)
                        if not extra
                        else lr_at(step - first_end, args.extra_copy_steps, args.copy_lr, warmup=10)
                    )
                t_logits = target(b.input_ids).logits
                loss_t = weighted(token_losses(t_logits, b.input_ids), b, split)
                loss_t.backward()
                torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
                opt_t.step()
                opt_t.zero_grad(set_to_none=True)
                teacher = t_logits.detach()
            else:
                loss_t = torch.tensor(float("nan"))
                with torch.no_grad():
                    teacher = target(b.input_ids).logits
            for g in opt_d.param_groups:
                g["lr"] = (
                    lr_at(step, first_end, args.draft_lr)
                    if not extra
                    else lr_at(step - first_end, total - first_end, args.draft_lr / 2, warmup=10)
                )
            d_logits = draft(b.input_ids).logits
            kl = weighted(kl_losses(d_logits, teacher), b, split)
            ce = weighted(token_losses(d_logits, b.input_ids), b, split)
            # Early on the target is still poor, so the draft also learns from the data itself.
            loss_d = kl + (0.25 * ce if train_target else 0.0)
        loss_d.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        n_tok = int(b.is_real.sum())
        state["step"] += 1
        state["seconds"] += dt
        state["tokens"] += n_tok
        if step % 5 == 0:
            log(
                f"{phase} step {step} loss_t {loss_t.item():.3f} kl {kl.item():.3f} ce_d {ce.item():.3f} "
                f"tok/s {n_tok / dt:.0f} shape {tuple(b.input_ids.shape)} "
                f"elapsed {state['seconds'] / 60:.1f} min"
            )
        if state["step"] % args.ckpt_every == 0 or state["step"] == total:
            save()
    do_export()
    (args.run_dir / "done.json").write_text(json.dumps(state) + "\n")


if __name__ == "__main__":
    main()
