"""``specrag draft tune``: distil the draft on a traffic dataset, starting from the current one.

The loss is the target's own next-token distribution, KL(target || draft), where the target's
logits can be recomputed (``--loss logits``, the default when the target's checkpoint is here);
``--loss tokens`` trains on the target's output tokens alone (cross-entropy), for a target that
cannot run on this host. Answers carry ``--answer-weight`` of the loss, prompts the rest (the
draft also drafts inside the answer's copy of a passage). The pieces are training/'s:
``kl_losses``, ``token_losses``, ``weighted``, ``lr_at`` (training/train_demo.py), ``bucket``
and ``collate`` (training/data.py), ``autocast_dtype`` (training/model.py: bfloat16 autocast
where the CPU has AMX / AVX-512 BF16).

Resumable: ``<run-dir>/ckpt.pt`` (draft, optimizer, counters) is written every ``--ckpt-every``
steps and at the end, atomically; a killed run started again continues from it. Bounded by
``--max-steps`` and/or ``--time-budget`` seconds (whichever comes first; the learning-rate
schedule follows whichever bound is nearer), and by ``--epochs`` over the training split.

The output directory holds the tuned draft (weights in the base draft's dtype, its tokenizer,
generation config and chat template copied) and ``manifest.json``: base draft, target, data
window, steps, seconds, loss, and the held-out greedy match of base and tuned draft (the share
of held-out answer tokens each draft predicts as the target's next token, teacher-forced: the
per-token acceptance of greedy decoding). ``specrag draft evaluate`` adds measured decoding.

The directory's name becomes the draft's label in ``model_pair`` (generation/torch_engine.py
labels a model by its directory), so name it apart from the base draft's.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.drafts.dataset import DatasetError, load_items, read_manifest, write_json

DRAFT_FORMAT = "specrag-tuned-draft/1"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")


@dataclass(frozen=True)
class TuneConfig:
    """How a tune runs (``specrag draft tune``'s options)."""

    epochs: int = 3
    max_steps: int | None = None
    time_budget: float | None = None
    lr: float = 3e-4
    tokens_per_batch: int = 4096
    answer_weight: float = 0.9
    loss: str = "auto"
    ckpt_every: int = 20
    threads: int | None = None
    seed: int = 0


def check_pair(target_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's, before anything is loaded."""
    from transformers import AutoConfig

    from generation.loading import check_vocab_compatible

    for what, d in (("target", target_dir), ("draft", draft_dir)):
        if not (d / "config.json").is_file():
            raise DatasetError(f"{what} {str(d)!r}: no config.json (not a checkpoint directory)")
    t = AutoConfig.from_pretrained(str(target_dir), local_files_only=True)
    dr = AutoConfig.from_pretrained(str(draft_dir), local_files_only=True)
    check_vocab_compatible(t.vocab_size, dr.vocab_size, target_dir, draft_dir)


def _rows(items: list[dict[str, Any]], max_len: int) -> list[tuple[list[int], int]]:
    rows = []
    for it in items:
        seq = list(it["prompt_ids"]) + list(it["output_ids"])
        rows.append((seq[:max_len], len(it["prompt_ids"])))
    return [r for r in rows if r[1] < len(r[0])]  # a prompt cut at max_len teaches no answer


def _lr(step: int, frac: float, peak: float, warmup: int = 10) -> float:
    # training/train_demo.lr_at's shape (warm-up, cosine to a tenth), on the nearer bound's share.
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def greedy_match(model: Any, items: list[dict[str, Any]], pad_id: int, batch: int = 8) -> float:
    """Share of answer tokens where ``model``'s argmax is the target's next token (teacher-forced)."""
    import torch

    from training.data import collate

    rows = _rows(items, 1 << 30)
    hit = total = 0
    with torch.inference_mode():
        for lo in range(0, len(rows), batch):
            b = collate(rows[lo : lo + batch], pad_id)
            pred = model(b.input_ids).logits[:, :-1].argmax(-1)
            ans = b.is_answer[:, :-1]
            hit += int((pred == b.input_ids[:, 1:])[ans].sum())
            total += int(ans.sum())
    return hit / total if total else 0.0


def tune(
    dataset: Path,
    draft_dir: Path,
    target_dir: Path,
    out: Path,
    run_dir: Path,
    config: TuneConfig = TuneConfig(),
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Tune ``draft_dir`` on ``dataset``'s training split into ``out``; returns out's manifest.

    Running it again after it finished returns the manifest and does nothing else.
    """
    if (out / "manifest.json").is_file():
        done: dict[str, Any] = json.loads((out / "manifest.json").read_text())
        log(f"{out} is tuned already; nothing to do")
        return done
    manifest = read_manifest(dataset)
    check_pair(target_dir, draft_dir)
    if out.resolve() == draft_dir.resolve():
        raise DatasetError("--out: must not be the base draft's directory (write a new one)")
    train = load_items(dataset / "train.jsonl")
    heldout = load_items(dataset / "heldout.jsonl")
    if not train:
        raise DatasetError(f"{dataset}: the training split is empty")

    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from training.data import bucket, collate
    from training.model import autocast_dtype
    from training.train_demo import kl_losses, token_losses, weighted

    if config.threads:
        torch.set_num_threads(config.threads)
    kind = config.loss
    if kind == "auto":
        kind = "logits" if any((target_dir / f).exists() for f in _WEIGHT_FILES) else "tokens"
    if kind not in ("logits", "tokens"):
        raise DatasetError(f"--loss: {config.loss!r}; choose auto, logits or tokens")
    draft = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32)
    base_dtype = getattr(draft.config, "dtype", None) or getattr(draft.config, "torch_dtype", None)
    target = None
    if kind == "logits":
        target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    pad = draft.config.pad_token_id
    if pad is None:
        eos = draft.config.eos_token_id
        pad = eos[0] if isinstance(eos, list) else (eos if eos is not None else 0)
    max_len = int(getattr(draft.config, "max_position_embeddings", 4096) or 4096)
    rows = _rows(train, max_len)
    plan = [
        b
        for e in range(config.epochs)
        for b in bucket(rows, config.tokens_per_batch, random.Random(config.seed * 1000 + e))
    ]
    total = min(len(plan), config.max_steps) if config.max_steps else len(plan)

    run_dir.mkdir(parents=True, exist_ok=True)
    opt = torch.optim.AdamW(draft.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
    state: dict[str, Any] = {"step": 0, "seconds": 0.0, "tokens": 0, "losses": []}
    ckpt = run_dir / "ckpt.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved.get("dataset") != str(dataset.resolve()):
            raise DatasetError(
                f"{run_dir}: holds a run on {saved.get('dataset')}, not {dataset.resolve()}; "
                "give another --run-dir"
            )
        draft.load_state_dict(saved["draft"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        log(f"resumed at step {state['step']} ({state['seconds']:.0f} s trained)")

    def save() -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save(
            {"draft": draft.state_dict(), "opt": opt.state_dict(), "state": state,
             "dataset": str(dataset.resolve())},
            tmp,
        )  # fmt: skip
        os.replace(tmp, ckpt)

    amp = autocast_dtype()
    budget = config.time_budget
    log(
        f"tune: {len(rows)} answers, up to {total} steps ({config.epochs} epochs of "
        f"{len(plan) // max(1, config.epochs)}), loss {kind}, autocast {str(amp).split('.')[-1]}"
        + (f", budget {budget:.0f} s" if budget else "")
    )
    draft.train()
    bar = tqdm(total=total, initial=state["step"], disable=not progress, unit="step",
               desc="tune", dynamic_ncols=True)  # fmt: skip
    reason = "steps"
    try:
        while state["step"] < total:
            if budget is not None and state["seconds"] >= budget:
                reason = "time budget"
                break
            t0 = time.perf_counter()
            step = state["step"]
            b = collate(plan[step], pad)
            frac = step / total
            if budget:
                frac = max(frac, state["seconds"] / budget)
            for g in opt.param_groups:
                g["lr"] = _lr(step, frac, config.lr)
            with torch.autocast("cpu", dtype=amp, enabled=amp != torch.float32):
                student = draft(b.input_ids).logits
                if target is not None:
                    with torch.no_grad():
                        teacher = target(b.input_ids).logits
                    values = kl_losses(student, teacher)
                else:
                    values = token_losses(student, b.input_ids)
                loss = weighted(values, b, config.answer_weight)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            state["step"] += 1
            state["seconds"] += time.perf_counter() - t0
            state["tokens"] += int(b.is_real.sum())
            state["losses"].append(round(float(loss.item()), 4))
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", min=f"{state['seconds'] / 60:.1f}")
            if state["step"] % config.ckpt_every == 0:
                save()
        save()
    finally:
        bar.close()
    log(f"trained {state['step']} steps in {state['seconds']:.0f} s (stopped by {reason})")

    draft.eval()
    base = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    match_before = greedy_match(base, heldout, pad)
    match_after = greedy_match(draft, heldout, pad)
    del base
    log(f"held-out greedy match: base {match_before:.3f}, tuned {match_after:.3f}")

    tmp_out = out.with_name(out.name + ".partial")
    if tmp_out.exists():
        shutil.rmtree(tmp_out)
    shutil.copytree(
        draft_dir, tmp_out, ignore=shutil.ignore_patterns(*_WEIGHT_FILES, "manifest.json")
    )
    if isinstance(base_dtype, str):
        base_dtype = getattr(torch, base_dtype, None)
    if isinstance(base_dtype, torch.dtype):
        for param in draft.parameters():  # the weights as the base draft shipped them
            param.data = param.data.to(base_dtype)
    draft.save_pretrained(str(tmp_out), safe_serialization=True)
    result = {
        "format": DRAFT_FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "base_draft": str(draft_dir.resolve()),
        "target": str(target_dir.resolve()),
        "dataset": str(dataset.resolve()),
        "data_window": manifest["window"],
        "data_filters": manifest["filters"],
        "train_items": len(rows),
        "heldout_items": len(heldout),
        "steps": state["step"],
        "epochs_planned": config.epochs,
        "stopped_by": reason,
        "train_seconds": round(state["seconds"], 1),
        "train_tokens": state["tokens"],
        "loss": kind,
        "lr": config.lr,
        "answer_weight": config.answer_weight,
        "autocast": str(amp).split(".")[-1],
        "first_loss": state["losses"][0] if state["losses"] else None,
        "last_loss": state["losses"][-1] if state["losses"] else None,
        "heldout_greedy_match": {"base": round(match_before, 4), "tuned": round(match_after, 4)},
        "heldout_acceptance": None,
    }
    write_json(tmp_out / "manifest.json", result)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp_out, out)
    log(f"wrote the tuned draft to {out}")
    return result
