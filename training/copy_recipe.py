"""The ``--recipe copy`` fine-tune: a pair trained to copy, from an existing pair's weights.

It starts from a trained pair (``--init-from``, e.g. the base recipe's output) that already
knows the answer format, and makes copying the dominant signal from step 0: every step is either
a copy-phase RAG batch (short passages, answers carrying COPY_SPLIT of the loss) or a synthetic
induction batch (a random token span, then the same span again; loss only on the repeat), the
task on which small transformers form induction heads quickly.  The draft is distilled online
from the target on the same batches, then from the final target alone.
"""

from __future__ import annotations

import json
import os
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from training.corpus import build_corpus
from training.data import Batch, BatchStream
from training.model import export

COPY_RECIPE_STEPS = 240  # target steps (with online distillation)
COPY_RECIPE_DRAFT_STEPS = 30  # then draft-only distillation from the final target
COPY_SPLIT = 0.9  # share of the loss on answer tokens in RAG batches
INDUCTION_EVERY = 3  # every 3rd step is a synthetic induction batch
INDUCTION_LEN = (24, 160)  # span length range, in tokens
COPY_RECIPE_MAX_WORDS = (40, 60, 90, 160)


def induction_batch(
    vocab: int, eos: int, tokens: int, gen: torch.Generator, n_symbols: int = 0
) -> Batch:
    """Rows ``noise, span, noise, span``: only the repeated span's tokens carry the loss.

    Tokens are drawn from ids 256 .. 256 + ``n_symbols`` (0: the whole vocabulary).
    """
    top = min(vocab, 256 + n_symbols) if n_symbols else vocab
    lo, hi = INDUCTION_LEN
    n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
    pad = int(torch.randint(0, 16, (1,), generator=gen))
    width = 2 * (n + pad) + 1
    rows = max(1, tokens // width)
    span = torch.randint(256, top, (rows, n), generator=gen)
    noise = torch.randint(256, top, (rows, 2 * pad), generator=gen)
    ids = torch.cat([noise[:, :pad], span, noise[:, pad:], span, torch.full((rows, 1), eos)], dim=1)
    ids[ids == eos] = eos + 1 if eos + 1 < vocab else eos - 1
    ids[:, -1] = eos
    real = torch.zeros_like(ids, dtype=torch.bool)
    real[:, :-1] = True
    ans = torch.zeros_like(real)
    # Position t predicts t+1; the repeat starts at 2*pad+n, its first token is unpredictable.
    ans[:, 2 * pad + n : -1] = True
    return Batch(ids, real, ans)


def load_pair(init: Path) -> tuple[LlamaForCausalLM, LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The pair to start from, as float32, and its shared tokenizer."""
    t = LlamaForCausalLM.from_pretrained(str(init / "target"), dtype=torch.float32)
    d = LlamaForCausalLM.from_pretrained(str(init / "draft"), dtype=torch.float32)
    tok = PreTrainedTokenizerFast.from_pretrained(str(init / "target"))
    return t, d, tok


def run_copy_recipe(args: Namespace, log: Callable[[str], None]) -> None:
    """Fine-tune the pair at ``args.init_from`` to copy; checkpoint, resume, export to ``args.out``."""
    from training.train_demo import kl_losses, lr_at, token_losses, weighted

    if args.init_from is None:
        raise SystemExit("--recipe copy needs --init-from DIR (a pair with target/ and draft/)")
    target, draft, tok = load_pair(Path(args.init_from))
    vocab, eos = len(tok), tok.eos_token_id
    corpus = build_corpus(args.seed)
    opt_t = torch.optim.AdamW(target.parameters(), lr=args.copy_lr, betas=(0.9, 0.95))
    opt_d = torch.optim.AdamW(draft.parameters(), lr=args.draft_lr, betas=(0.9, 0.95))
    state: dict[str, Any] = {"step": 0, "rnd": 0, "idx": 0, "seconds": 0.0, "tokens": 0}
    ckpt = args.run_dir / "ckpt.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        for obj, key in ((target, "target"), (draft, "draft"), (opt_t, "opt_t"), (opt_d, "opt_d")):
            obj.load_state_dict(saved[key])
        state = saved["state"]
        log(f"resumed at step {state['step']}")
    stream = BatchStream(
        corpus.train,
        tok,
        seed=args.seed + 2,
        tokens_per_batch=args.tokens_per_batch,
        max_words=COPY_RECIPE_MAX_WORDS,
        n_passages=(2, 3),
    )
    t_steps, total = args.recipe_steps, args.recipe_steps + args.draft_steps
    while state["step"] < total:
        t0 = time.perf_counter()
        step = state["step"]
        every = args.induction_every
        if every and step % every == every - 1:
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
            b = induction_batch(vocab, eos, args.tokens_per_batch, gen, args.induction_symbols)
            split, kind = 1.0, "ind"
        else:
            n_batches = len(stream.round_batches(state["rnd"]))
            b, split, kind = stream.batch(state["rnd"], state["idx"]), COPY_SPLIT, "rag"
            state["idx"] += 1
            if state["idx"] >= n_batches:
                state["rnd"], state["idx"] = state["rnd"] + 1, 0
        train_target = step < t_steps
        target.train(train_target)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if train_target:
                for g in opt_t.param_groups:
                    g["lr"] = lr_at(step, t_steps, args.copy_lr, warmup=10)
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
                g["lr"] = lr_at(step, total, args.draft_lr, warmup=10)
            d_logits = draft(b.input_ids).logits
            kl = weighted(kl_losses(d_logits, teacher), b, split)
            ce = weighted(token_losses(d_logits, b.input_ids), b, split)
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
        log(
            f"{kind} step {step} loss_t {loss_t.item():.3f} kl {kl.item():.3f} "
            f"ce_d {ce.item():.3f} tok/s {n_tok / dt:.0f} shape {tuple(b.input_ids.shape)} "
            f"elapsed {state['seconds'] / 60:.1f} min"
        )
        if state["step"] % args.ckpt_every == 0 or state["step"] == total:
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
    card = {
        "seed": args.seed,
        "recipe": "copy",
        "init_from": str(args.init_from),
        "induction_every": args.induction_every,
        "induction_symbols": args.induction_symbols,
        "copy_lr": args.copy_lr,
        "steps": state["step"],
        "train_seconds": round(state["seconds"]),
        "train_tokens": state["tokens"],
        "command": f"python -m training.train_demo --recipe copy --seed {args.seed} "
        f"--init-from {args.init_from}",
    }
    export(target, tok, args.out / "target", {**card, "role": "target"})
    export(draft, tok, args.out / "draft", {**card, "role": "draft"})
    (args.run_dir / "done.json").write_text(json.dumps(state) + "\n")
    log(f"exported step {state['step']} to {args.out}")
