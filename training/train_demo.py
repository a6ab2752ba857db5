"""Train the demo pair and write it to models/demo/{target,draft}: ``python -m training.train_demo``.

One seeded command; it checkpoints to ``--run-dir`` and resumes from there when interrupted.
Both models start with an induction circuit written in (training/induction_init.py), so they
can copy from step 0.  Phase 1 trains the target on RAG examples whose answers quote their
passages, with a synthetic induction batch every ``--induction-every`` steps, while the draft
learns online from the target's logits (free: the teacher forward is already done).  Phase 2
distils the draft from the final target alone.  Then both are exported (float16 safetensors +
config + tokenizer).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerFast

from training.corpus import REPO_ROOT, build_corpus
from training.data import ANSWER_WEIGHT_SPLIT, Batch, BatchStream
from training.model import DRAFT_SHAPE, TARGET_SHAPE, export, make_model
from training.pair_run import PairRun
from training.qa import make_examples
from training.tokenizer import train_tokenizer


def weighted(values: torch.Tensor, b: Batch, split: float = ANSWER_WEIGHT_SPLIT) -> torch.Tensor:
    """Per-position losses [batch, seq-1] reduced so answers carry ``split`` of it (within the
    answers, each label by ``b.weight`` where the batch has one)."""
    real, ans = b.is_real[:, :-1], b.is_answer[:, :-1]
    prompt = real & ~ans
    if b.weight is None:
        answer = values[ans].mean()
    else:
        w = b.weight[:, :-1][ans].to(values.dtype)
        answer = (values[ans] * w).sum() / w.sum()
    return (1 - split) * values[prompt].mean() + split * answer


def log_line(path: Path, msg: str) -> None:
    """Print ``msg`` with the time, and append it to the log file ``path``."""
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    with path.open("a") as f:
        f.write(line + "\n")


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


# ~50 min of steps on an idle 2-core machine with two threads (measured: ~2.9 s per step).
TARGET_STEPS = 1000
DRAFT_STEPS = 50
INDUCTION_EVERY = 6  # every 6th step is a synthetic induction batch


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "demo")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "models" / "demo")
    ap.add_argument("--target-steps", type=int, default=TARGET_STEPS)
    ap.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    ap.add_argument("--induction-every", type=int, default=INDUCTION_EVERY, help="0: never")
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument(
        "--extra-steps",
        type=int,
        default=0,
        help="after the schedule: this many more target steps at --extra-lr (cosine), then "
        "--draft-steps draft-only steps again",
    )
    ap.add_argument("--extra-lr", type=float, default=3e-4)
    ap.add_argument("--ckpt-every", type=int, default=25)
    # Two threads on an idle machine; one where the other core is busy (two intra-op threads
    # on a shared core spin at barriers and ran 2-5x slower, measured).
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--export-now", action="store_true", help="export the latest checkpoint and exit"
    )
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = args.run_dir / "train.log"

    def log(msg: str) -> None:
        log_line(log_path, msg)

    corpus = build_corpus(args.seed)
    tok = tokenizer_for(args.run_dir, corpus.train, args.seed)
    vocab, eos = len(tok), tok.eos_token_id
    target = make_model(TARGET_SHAPE, vocab, eos, seed=args.seed)
    draft = make_model(DRAFT_SHAPE, vocab, eos, seed=args.seed + 1)
    run = PairRun(
        target, draft, lr=args.lr, draft_lr=args.draft_lr, ckpt=args.run_dir / "ckpt.pt", log=log
    )
    opt_t, opt_d, state, save = run.opt_t, run.opt_d, run.state, run.save

    def do_export() -> None:
        card = {
            "seed": args.seed,
            "steps": state["step"],
            "train_seconds": round(state["seconds"]),
            "train_tokens": state["tokens"],
            "target_steps": args.target_steps,
            "draft_steps": args.draft_steps,
            "extra_steps": args.extra_steps,
            "induction_every": args.induction_every,
            "tokens_per_batch": args.tokens_per_batch,
            "command": f"python -m training.train_demo --seed {args.seed}",
        }
        export(target, tok, args.out / "target", {**card, "role": "target"})
        export(draft, tok, args.out / "draft", {**card, "role": "draft"})
        log(f"exported step {state['step']} to {args.out}")

    if args.export_now:
        do_export()
        return

    first_end = args.target_steps + args.draft_steps
    extra_end = first_end + args.extra_steps
    total = extra_end + (args.draft_steps if args.extra_steps else 0)
    stream = BatchStream(corpus.train, tok, seed=args.seed, tokens_per_batch=args.tokens_per_batch)
    every = args.induction_every
    while state["step"] < total:
        t0 = time.perf_counter()
        step = state["step"]
        b, split, kind = run.next_batch(
            stream, every=every, seed=args.seed, vocab=vocab, eos=eos, tokens=args.tokens_per_batch
        )
        extra = step >= first_end
        train_target = step < args.target_steps or first_end <= step < extra_end
        target.train(train_target)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if train_target:
                for g in opt_t.param_groups:
                    g["lr"] = (
                        lr_at(step - first_end, args.extra_steps, args.extra_lr, warmup=10)
                        if extra
                        else lr_at(step, args.target_steps, args.lr)
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
                    lr_at(step - first_end, total - first_end, args.extra_lr * 2, warmup=10)
                    if extra
                    else lr_at(step, first_end, args.draft_lr)
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
        if step % 5 == 0 or kind == "ind":
            log(
                f"{kind} step {step} loss_t {loss_t.item():.3f} kl {kl.item():.3f} "
                f"ce_d {ce.item():.3f} tok/s {n_tok / dt:.0f} shape {tuple(b.input_ids.shape)} "
                f"elapsed {state['seconds'] / 60:.1f} min"
            )
        if state["step"] % args.ckpt_every == 0 or state["step"] == total:
            save()
    do_export()
    (args.run_dir / "done.json").write_text(json.dumps(state) + "\n")


if __name__ == "__main__":
    main()
