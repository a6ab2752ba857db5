"""Train an EAGLE head on the target's own features: ``python -m training.train_eagle``.

The head (generation/spec_decode/eagle.py) drafts from the target's final hidden states, so it is trained
on what the target computes over its own answers (Li et al. 2024, EAGLE-1):

1. ``generate``: the target answers RAG prompts of the training split (greedy; the held-out
   prompts of training/evaluate.py stay unseen) into ``--answers``, as
   training/distill_draft.py does (the same function, or the torch engine with
   ``--gen-engine``; resumable line by line). ``--reference-prompts N`` adds N more
   training-split prompts with their reference answers (no decoding needed).
2. ``features``: target passes over the prompts + answers, several sequences per pass
   (``--feature-batch-tokens`` padded tokens, bf16 autocast where the CPU has it), record every
   position's final hidden state (after the final norm, as vLLM hands it to a head) in float16
   to ``<run-dir>/features.pt`` (``features_ref.pt`` for the reference rows; resumable in
   chunks; ``--phase features`` stops there).
3. ``train``: for each position t the head reads (embed(x_{t+1}), f_t + noise) and is trained
   to give f_{t+1} (smooth L1, EAGLE's feature regression; answer positions weighted
   ``--answer-weight``) and, at answer positions, the target's next-token distribution through
   the target's LM head (KL, ``--logit-share`` of the loss);
   bf16 autocast where the CPU has AMX / AVX-512 BF16; checkpoints to ``<run-dir>/ckpt.pt``
   (resumable); then the head is written to ``--out`` in vLLM's EAGLE format and
   ``<run-dir>/done.json`` marks the run finished.

Only the head is trained; the target is read, never written. ``make demo-pair`` ends with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

from generation.spec_decode.eagle import EagleHeadModule, head_config, save_head
from retrieval.chat import PromptFormat
from training.checkpoint import load_checkpoint, save_checkpoint
from training.corpus import REPO_ROOT, build_corpus
from training.data import encode_example
from training.distill_draft import generate, prompt_ids, training_prompts
from training.model import autocast_dtype
from training.qa import make_examples
from training.train_demo import log_line, lr_at


def _log(run_dir: Path, msg: str) -> None:
    log_line(run_dir / "eagle.log", msg)


def check_same_target(target_dir: Path, run_dir: Path, answers: Path) -> None:
    """Refuse to resume a run whose answers and features came from another target: they are
    that target's outputs (a replaced target needs a fresh ``--run-dir``)."""
    digest = hashlib.sha256((target_dir / "model.safetensors").read_bytes()).hexdigest()
    stamp = run_dir / "target.sha256"
    if stamp.exists() and stamp.read_text().strip() != digest:
        raise SystemExit(
            f"{run_dir}: its answers and features were recorded from another target "
            f"(sha256 {stamp.read_text().strip()[:12]}, {target_dir} is {digest[:12]}); "
            f"start a fresh --run-dir (and --answers, now {answers})"
        )
    stamp.write_text(digest + "\n")


def engine_generate(
    models: Path,
    prompts: list[list[int]],
    out: Path,
    max_new_tokens: int,
    batch_size: int,
    run_dir: Path,
    chunk: int = 32,
) -> None:
    """Append the target's greedy answer to every prompt not yet in ``out`` (JSON lines, as
    training/distill_draft.py's ``generate`` writes them), through the torch engine: the draft
    model speculates (greedy answers are the target's own, tests/generation), continuous
    batching, bfloat16 where the CPU has it (so answers can differ from float32's at near-ties).
    Not shown faster than ``generate`` on a loaded machine (0.08 against 0.11
    answers/s, not side by side). Resumable every ``chunk`` answers."""
    from generation import SamplingParams, SpeculativeEngine

    done = sum(1 for _ in out.open()) if out.exists() else 0
    if done >= len(prompts):
        return
    dtype = "bfloat16" if autocast_dtype() == torch.bfloat16 else "float32"
    engine = SpeculativeEngine.from_pretrained(
        models / "target", models / "draft", device="cpu", dtype=dtype
    )
    eos = set(engine.eos_token_ids)
    params = SamplingParams(max_new_tokens=max_new_tokens, method="draft_model")
    t0 = time.perf_counter()
    for lo in range(done, len(prompts), chunk):
        part = prompts[lo : lo + chunk]
        results = engine.generate_many(part, params, max_batch_size=batch_size)
        with out.open("a") as f:
            for p, r in zip(part, results, strict=True):
                answer = list(r.token_ids)
                ends = [i for i, t in enumerate(answer) if t in eos]
                answer = answer[: ends[0] + 1] if ends else answer
                f.write(json.dumps({"prompt": p, "answer": answer}) + "\n")
        n = lo + len(part)
        rate = (n - done) / (time.perf_counter() - t0)
        _log(run_dir, f"generate {n}/{len(prompts)} answers ({rate:.2f}/s, {dtype} engine)")


@torch.inference_mode()
def target_features(
    target: LlamaForCausalLM, rows: list[list[int]], amp: torch.dtype | None = None
) -> list[torch.Tensor]:
    """Each row's final hidden states [len, hidden] (float16) from one batched target pass:
    right-padded with an attention mask, so every row's states are its own (causal attention
    never reads the padding after a row's end); autocast to ``amp`` (None: bf16 where the CPU
    has it)."""
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = 1
    amp = amp or autocast_dtype()
    with torch.autocast("cpu", dtype=amp, enabled=amp != torch.float32):
        hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
    return [hidden[b, : len(r)].to(torch.float16) for b, r in enumerate(rows)]


def record_features(
    target: LlamaForCausalLM,
    rows: list[list[int]],
    out: Path,
    run_dir: Path,
    batch_tokens: int = 8192,
    chunk: int = 50,
    amp: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """Each row's final hidden states [len, hidden] (float16), computed once into ``out``:
    rows of similar length share a target pass of at most ``batch_tokens`` padded tokens
    (``target_features``); saved every ``chunk`` rows, so an interrupted run resumes."""
    # A file of more rows (a run with more prompts) serves a prefix: the rows keep their order.
    feats: list[torch.Tensor] = (torch.load(out) if out.exists() else [])[: len(rows)]
    if len(feats) < len(rows):
        _log(run_dir, f"features: {len(feats)}/{len(rows)} sequences recorded, resuming")
    t0 = time.perf_counter()
    start = len(feats)
    saved = start
    i = start
    while i < len(rows):
        # Rows in file order (resumable by count); a batch is the run of rows whose padded
        # width times count fits batch_tokens.
        j = i + 1
        while j < len(rows) and max(len(r) for r in rows[i : j + 1]) * (j + 1 - i) <= batch_tokens:
            j += 1
        feats.extend(target_features(target, rows[i:j], amp))
        i = j
        if i - saved >= chunk or i == len(rows):
            tmp = out.with_suffix(".tmp")
            torch.save(feats, tmp)
            os.replace(tmp, out)
            saved = i
            _log(
                run_dir,
                f"features {i}/{len(rows)} sequences "
                f"({(time.perf_counter() - t0) / (i - start):.2f} s per sequence)",
            )
    return feats


def reference_rows(
    tok: PreTrainedTokenizerFast, seed: int, count: int
) -> tuple[list[list[int]], list[int]]:
    """``count`` more training-split RAG prompts (other draws than ``training_prompts``'), each
    with its *reference* answer (training/qa.py) in place of one the target generated: one
    batched target pass records their features, where an answer of the target's own costs a
    decode of ~60 steps. The loss still follows the target (its features, its next-token
    distribution at every position), only the text it reads is not its own."""
    corpus = build_corpus(seed)
    topics = [d for d in corpus.train if d.source.startswith("demo/corpus/")]
    examples = make_examples(
        topics, count, seed=30_000 + seed, max_words=(120, 220), n_passages=(2, 3, 3)
    )
    fmt = PromptFormat.for_tokenizer(tok)
    encoded = [encode_example(tok, e, fmt) for e in examples]
    return [ids for ids, _ in encoded], [n for _, n in encoded]


def batches(lengths: list[int], tokens: int, rng: random.Random) -> list[list[int]]:
    """Row indices grouped by similar length, each group at most ``tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    group: list[int] = []
    width = 0
    for i in order:
        width_then = max(width, lengths[i])
        if group and width_then * (len(group) + 1) > tokens:
            groups.append(group)
            group, width_then = [], lengths[i]
        group.append(i)
        width = width_then
    if group:
        groups.append(group)
    rng.shuffle(groups)
    return groups


def pack(
    group: list[int],
    rows: list[list[int]],
    prompt_lens: list[int],
    feats: list[torch.Tensor],
    hidden: int,
    answer_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch of ``group``'s rows, right-padded: ids [B, n], features [B, n, hidden] and the
    loss weight [B, n - 1] of each position (answer positions ``answer_weight``, the prompt's
    the rest, padding 0), as ``head_loss`` takes them."""
    width = max(len(rows[i]) for i in group)
    ids = torch.zeros((len(group), width), dtype=torch.long)
    f = torch.zeros((len(group), width, hidden))
    weight = torch.zeros((len(group), width - 1))
    for b, i in enumerate(group):
        n = len(rows[i])
        ids[b, :n] = torch.tensor(rows[i])
        f[b, :n] = feats[i].float()
        # Position t predicts x_{t+2}: an answer token from t = prompt_len - 2 on.
        weight[b, : n - 2] = 1.0 - answer_weight
        weight[b, max(0, prompt_lens[i] - 2) : n - 2] = answer_weight
    return ids, f, weight


def head_loss(
    head: EagleHeadModule,
    target: LlamaForCausalLM,
    ids: torch.Tensor,  # [B, n]
    feats: torch.Tensor,  # [B, n, hidden] the target's features
    weight: torch.Tensor,  # [B, n - 1] loss weight of the position predicting ids[:, t + 2]
    noise: float,
    logit_share: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE-1's loss: feature regression plus ``logit_share`` of the next-token KL."""
    embeds = target.model.embed_tokens(ids[:, 1:])  # x_{t+1}
    f_in = feats[:, :-1]
    if noise:
        f_in = f_in + (torch.rand_like(f_in) * 2 - 1) * noise
    g = head(embeds, f_in)  # [B, n - 1, hidden]
    want = feats[:, 1:]  # f_{t+1}
    real = weight > 0
    reg = F.smooth_l1_loss(g[real].float(), want[real].float(), reduction="none").mean(-1)
    w = weight[real]
    reg_loss = (reg * w).sum() / w.sum()
    # The KL through the 8k-token LM head costs more than the head itself: answer positions
    # only (where the head drafts); the prompt's positions train the features alone.
    answer = weight >= weight.max()
    student = F.log_softmax(target.lm_head(g[answer]).float(), -1)
    with torch.no_grad():
        teacher = F.softmax(target.lm_head(want[answer]).float(), -1)
    kl_loss = (teacher * (teacher.clamp_min(1e-9).log() - student)).sum(-1).mean()
    agree = (student.argmax(-1) == teacher.argmax(-1)).float()
    return reg_loss + logit_share * kl_loss, {
        "reg": reg_loss.item(),
        "kl": kl_loss.item(),
        "top1": agree.mean().item(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=Path, default=REPO_ROOT / "models" / "demo")
    ap.add_argument("--out", type=Path, default=None, help="default: <models>/eagle")
    ap.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "eagle")
    ap.add_argument("--answers", type=Path, default=None, help="default: <run-dir>/answers.jsonl")
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--gen-batch", type=int, default=8)
    ap.add_argument(
        "--gen-engine",
        action="store_true",
        help="generate through the torch engine (speculative, continuous batching, bf16 where "
        "the CPU has it) instead of transformers' generate",
    )
    ap.add_argument(
        "--feature-batch-tokens",
        type=int,
        default=8192,
        help="padded tokens per batched target pass when recording features",
    )
    ap.add_argument(
        "--reference-prompts",
        type=int,
        default=0,
        help="also train on this many more training-split prompts with their reference answers",
    )
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument(
        "--max-steps", type=int, default=0, help="stop the plan after this many steps (0: all)"
    )
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--answer-weight", type=float, default=0.9)
    ap.add_argument("--logit-share", type=float, default=0.5)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--ckpt-every", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phase", choices=("all", "generate", "features", "train"), default="all")
    args = ap.parse_args(argv)
    out = args.out or args.models / "eagle"
    answers = args.answers or args.run_dir / "answers.jsonl"

    torch.set_num_threads(args.threads)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    check_same_target(args.models / "target", args.run_dir, answers)
    if (args.run_dir / "done.json").exists():
        _log(args.run_dir, f"{args.run_dir} is done; nothing to do")
        return
    tdir = args.models / "target"
    tok = cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(str(tdir)))  # tokenizer.json
    target = LlamaForCausalLM.from_pretrained(str(tdir), dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)

    if args.phase in ("all", "generate"):
        prompts = prompt_ids(tok, training_prompts(args.seed, args.prompts))
        if args.gen_engine:
            engine_generate(
                args.models, prompts, answers, args.max_new_tokens, args.gen_batch, args.run_dir
            )
        else:
            generate(
                target, tok, prompts, answers, args.max_new_tokens, args.gen_batch, args.run_dir
            )
        if args.phase == "generate":
            return

    rows, prompt_lens = [], []
    for line in (answers.read_text().splitlines() if answers.exists() else [])[: args.prompts]:
        d = json.loads(line)
        rows.append(d["prompt"] + d["answer"])
        prompt_lens.append(len(d["prompt"]))
    generated = len(rows)
    feats = record_features(
        target, rows, args.run_dir / "features.pt", args.run_dir, args.feature_batch_tokens
    )
    if args.reference_prompts:
        ref_rows, ref_lens = reference_rows(tok, args.seed, args.reference_prompts)
        rows += ref_rows
        prompt_lens += ref_lens
        feats += record_features(
            target, ref_rows, args.run_dir / "features_ref.pt", args.run_dir,
            args.feature_batch_tokens,
        )  # fmt: skip
    if args.phase == "features":
        return

    torch.manual_seed(args.seed)
    head = EagleHeadModule(head_config(target.config))
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    lengths = [len(r) for r in rows]
    plan = [
        g
        for e in range(args.epochs)
        for g in batches(lengths, args.tokens_per_batch, random.Random(args.seed * 1000 + e))
    ]
    if args.max_steps:
        plan = plan[: args.max_steps]  # the learning-rate schedule spans the steps taken
    state: dict[str, Any] = {"step": 0, "seconds": 0.0, "tokens": 0}
    ckpt = args.run_dir / "ckpt.pt"
    saved = load_checkpoint(ckpt, {"head": head}, {"opt": opt})
    if saved is not None:
        state = saved["state"]
        _log(args.run_dir, f"resumed at step {state['step']}")
    _log(args.run_dir, f"train: {len(rows)} sequences, {len(plan)} steps ({args.epochs} epochs)")
    head.train()
    amp = autocast_dtype()
    hidden = int(target.config.hidden_size)
    while state["step"] < len(plan):
        t0 = time.perf_counter()
        step = state["step"]
        group = plan[step]
        ids, f, weight = pack(group, rows, prompt_lens, feats, hidden, args.answer_weight)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, len(plan), args.lr, warmup=10)
        with torch.autocast("cpu", dtype=amp, enabled=amp != torch.float32):
            loss, parts = head_loss(head, target, ids, f, weight, args.noise, args.logit_share)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        state["step"] += 1
        state["seconds"] += dt
        state["tokens"] += sum(lengths[i] for i in group)
        if step % 5 == 0:
            _log(
                args.run_dir,
                f"step {step}/{len(plan)} loss {loss.item():.3f} reg {parts['reg']:.3f} "
                f"kl {parts['kl']:.3f} answer top-1 {parts['top1']:.2f} "
                f"tok/s {sum(lengths[i] for i in group) / dt:.0f} "
                f"elapsed {state['seconds'] / 60:.1f} min",
            )
        if state["step"] % args.ckpt_every == 0 or state["step"] == len(plan):
            save_checkpoint(ckpt, {"head": head}, {"opt": opt}, state=state)

    card = {
        "method": "EAGLE-1 head (one decoder layer, fc over [embedding, target feature])",
        "target": str(tdir.relative_to(REPO_ROOT) if tdir.is_relative_to(REPO_ROOT) else tdir),
        "sequences": len(rows),
        "target_answers": generated,
        "reference_answers": len(rows) - generated,
        "epochs": round(state["tokens"] / sum(lengths), 2),
        "steps": state["step"],
        "train_seconds": round(state["seconds"]),
        "train_tokens": state["tokens"],
        "lr": args.lr,
        "logit_share": args.logit_share,
        "noise": args.noise,
        "answer_weight": args.answer_weight,
        "command": f"python -m training.train_eagle --seed {args.seed} --prompts {generated} "
        f"--reference-prompts {len(rows) - generated} --epochs {args.epochs}"
        + (f" --max-steps {args.max_steps}" if args.max_steps else ""),
    }
    save_head(head.eval(), out, card)
    _log(args.run_dir, f"exported the head to {out}")
    (args.run_dir / "done.json").write_text(json.dumps(state) + "\n")


if __name__ == "__main__":
    main()
