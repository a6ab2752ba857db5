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

``tune_eagle`` (``specrag draft tune --eagle HEAD``) tunes an EAGLE head (generation/spec_decode/eagle.py)
instead, in the same loop (``_train``: the same bounds, checkpoint, autocast, progress bar and
manifest): the target's features of each item are recorded once into ``<run-dir>``, and the
loss is training/train_eagle.py's. A tuned head, too, is labelled in ``model_pair`` by its
directory's name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.drafts.dataset import DatasetError, load_items, read_manifest, write_json

DRAFT_FORMAT = "specrag-tuned-draft/1"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")


def _splits(dataset: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A dataset's (train, held-out) items; an empty training split is refused."""
    train = load_items(dataset / "train.jsonl")
    if not train:
        raise DatasetError(f"{dataset}: the training split is empty")
    return train, load_items(dataset / "heldout.jsonl")


def _has_weights(model_dir: Path) -> bool:
    """Whether ``model_dir`` holds a checkpoint's weights (so its logits can be recomputed)."""
    return any((model_dir / f).exists() for f in _WEIGHT_FILES)


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
    noise: float = 0.1
    """EAGLE head only: uniform noise on the fed features (training/train_eagle.py's)."""
    logit_share: float = 0.5
    """EAGLE head only: the share of the next-token KL in the loss (beside the regression)."""


def check_pair(target_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose vocabulary differs from the target's, before anything is loaded."""
    from transformers import AutoConfig

    from generation.model.loading import check_vocab_compatible

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


@dataclass
class _Run:
    """What the shared loop needs of one kind of tune (a draft model, an EAGLE head)."""

    module: Any  # the torch module trained (its parameters, its state_dict in the checkpoint)
    key: str  # its name in ckpt.pt ("draft", "head")
    plan: list[Any]  # one entry per step (a batch's rows)
    step: Callable[[Any], tuple[Any, int]]  # a plan entry -> (loss tensor, real tokens)
    weight_decay: float
    describe: str  # the first log line's middle: what is trained, on what, with which loss


def _train(
    run: _Run,
    dataset: Path,
    run_dir: Path,
    config: TuneConfig,
    progress: bool,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], str, str]:
    """The loop both tunes share: AdamW, warm-up and cosine on the nearer of the step and time
    bounds, bf16 autocast where native, clipping, ``ckpt.pt`` every ``ckpt_every`` steps and at
    the end (resumed when there), a progress bar. Returns the counters, what stopped it, and
    the autocast dtype's name."""
    import torch
    from tqdm import tqdm

    from training.checkpoint import load_checkpoint, save_checkpoint
    from training.model import autocast_dtype

    total = min(len(run.plan), config.max_steps) if config.max_steps else len(run.plan)
    run_dir.mkdir(parents=True, exist_ok=True)
    params = [p for p in run.module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=run.weight_decay)
    state: dict[str, Any] = {"step": 0, "seconds": 0.0, "tokens": 0, "losses": []}
    ckpt = run_dir / "ckpt.pt"

    def same_run(saved: dict[str, Any]) -> None:
        if saved.get("dataset") != str(dataset.resolve()) or run.key not in saved:
            what = "a head" if "head" in saved else "a draft"
            raise DatasetError(
                f"{run_dir}: holds a run of {what} on {saved.get('dataset')}, not this "
                f"{run.key}'s on {dataset.resolve()}; give another --run-dir"
            )

    saved = load_checkpoint(ckpt, {run.key: run.module}, {"opt": opt}, check=same_run)
    if saved is not None:
        state = saved["state"]
        log(f"resumed at step {state['step']} ({state['seconds']:.0f} s trained)")

    def save() -> None:
        save_checkpoint(
            ckpt, {run.key: run.module}, {"opt": opt}, state=state, dataset=str(dataset.resolve())
        )

    amp = autocast_dtype()
    amp_name = str(amp).split(".")[-1]
    budget = config.time_budget
    log(
        f"tune: {run.describe}, up to {total} steps ({config.epochs} epochs of "
        f"{len(run.plan) // max(1, config.epochs)}), autocast {amp_name}"
        + (f", budget {budget:.0f} s" if budget else "")
    )
    run.module.train()
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
            frac = step / total
            if budget:
                frac = max(frac, state["seconds"] / budget)
            for g in opt.param_groups:
                g["lr"] = _lr(step, frac, config.lr)
            with torch.autocast("cpu", dtype=amp, enabled=amp != torch.float32):
                loss, tokens = run.step(run.plan[step])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            state["step"] += 1
            state["seconds"] += time.perf_counter() - t0
            state["tokens"] += tokens
            state["losses"].append(round(float(loss.item()), 4))
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", min=f"{state['seconds'] / 60:.1f}")
            if state["step"] % config.ckpt_every == 0:
                save()
        save()
    finally:
        bar.close()
    run.module.eval()
    log(f"trained {state['step']} steps in {state['seconds']:.0f} s (stopped by {reason})")
    return state, reason, amp_name


def _summary(
    dataset: Path,
    target_dir: Path,
    manifest: dict[str, Any],
    state: dict[str, Any],
    reason: str,
    amp_name: str,
    config: TuneConfig,
) -> dict[str, Any]:
    """The manifest fields both tunes write."""
    return {
        "format": DRAFT_FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "target": str(target_dir.resolve()),
        "dataset": str(dataset.resolve()),
        "data_window": manifest["window"],
        "data_filters": manifest["filters"],
        "steps": state["step"],
        "epochs_planned": config.epochs,
        "stopped_by": reason,
        "train_seconds": round(state["seconds"], 1),
        "train_tokens": state["tokens"],
        "lr": config.lr,
        "answer_weight": config.answer_weight,
        "autocast": amp_name,
        "first_loss": state["losses"][0] if state["losses"] else None,
        "last_loss": state["losses"][-1] if state["losses"] else None,
        "heldout_acceptance": None,
    }


def _publish(out: Path, write: Callable[[Path], None], result: dict[str, Any]) -> None:
    """Write the output into ``OUT.partial`` with ``write``, add the manifest, move it to OUT."""
    tmp_out = out.with_name(out.name + ".partial")
    if tmp_out.exists():
        shutil.rmtree(tmp_out)
    write(tmp_out)
    write_json(tmp_out / "manifest.json", result)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp_out, out)


def _done(out: Path, log: Callable[[str], None]) -> dict[str, Any] | None:
    if (out / "manifest.json").is_file():
        done: dict[str, Any] = json.loads((out / "manifest.json").read_text())
        log(f"{out} is tuned already; nothing to do")
        return done
    return None


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
    done = _done(out, log)
    if done is not None:
        return done
    manifest = read_manifest(dataset)
    check_pair(target_dir, draft_dir)
    if out.resolve() == draft_dir.resolve():
        raise DatasetError("--out: must not be the base draft's directory (write a new one)")
    train, heldout = _splits(dataset)

    import torch
    from transformers import AutoModelForCausalLM

    from training.data import bucket, collate
    from training.train_demo import kl_losses, token_losses, weighted

    if config.threads:
        torch.set_num_threads(config.threads)
    kind = config.loss
    if kind == "auto":
        kind = "logits" if _has_weights(target_dir) else "tokens"
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

    def step(rows_of_batch: Any) -> tuple[Any, int]:
        b = collate(rows_of_batch, pad)
        student = draft(b.input_ids).logits
        if target is not None:
            with torch.no_grad():
                teacher = target(b.input_ids).logits
            values = kl_losses(student, teacher)
        else:
            values = token_losses(student, b.input_ids)
        return weighted(values, b, config.answer_weight), int(b.is_real.sum())

    run = _Run(draft, "draft", plan, step, 0.1, f"{len(rows)} answers, loss {kind}")
    state, reason, amp_name = _train(run, dataset, run_dir, config, progress, log)

    base = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    match_before = greedy_match(base, heldout, pad)
    match_after = greedy_match(draft, heldout, pad)
    del base
    log(f"held-out greedy match: base {match_before:.3f}, tuned {match_after:.3f}")

    def write(tmp_out: Path) -> None:
        shutil.copytree(
            draft_dir, tmp_out, ignore=shutil.ignore_patterns(*_WEIGHT_FILES, "manifest.json")
        )
        dtype = getattr(torch, base_dtype, None) if isinstance(base_dtype, str) else base_dtype
        if isinstance(dtype, torch.dtype):
            for param in draft.parameters():  # the weights as the base draft shipped them
                param.data = param.data.to(dtype)
        draft.save_pretrained(str(tmp_out), safe_serialization=True)

    result = {
        **_summary(dataset, target_dir, manifest, state, reason, amp_name, config),
        "kind": "draft",
        "base_draft": str(draft_dir.resolve()),
        "train_items": len(rows),
        "heldout_items": len(heldout),
        "loss": kind,
        "heldout_greedy_match": {"base": round(match_before, 4), "tuned": round(match_after, 4)},
    }
    _publish(out, write, result)
    log(f"wrote the tuned draft to {out}")
    return result


def check_head_pair(target_dir: Path, head_dir: Path) -> None:
    """Refuse an EAGLE head whose width, attention shape or vocabulary is not the target's
    (the error names both sizes), before anything is loaded."""
    from transformers import AutoConfig, LlamaConfig

    from generation.spec_decode.eagle import check_head_config, is_eagle_head

    if not (target_dir / "config.json").is_file():
        raise DatasetError(
            f"target {str(target_dir)!r}: no config.json (not a checkpoint directory)"
        )
    if not is_eagle_head(head_dir):
        raise DatasetError(
            f"--eagle {str(head_dir)!r}: not an EAGLE head (its config.json must name "
            "EagleLlamaForCausalLM; generation/spec_decode/eagle.py)"
        )
    raw = json.loads((head_dir / "config.json").read_text())
    raw.pop("architectures", None)
    target = AutoConfig.from_pretrained(str(target_dir), local_files_only=True)
    check_head_config(LlamaConfig(**raw), target, head_dir)


def _head_rows(items: list[dict[str, Any]], max_len: int) -> tuple[list[list[int]], list[int]]:
    rows = _rows(items, max_len)
    return [r for r, _ in rows], [p for _, p in rows]


def head_match(head: Any, target: Any, rows: list[list[int]], prompt_lens: list[int],
               feats: list[Any]) -> float:  # fmt: skip
    """Share of answer tokens the head predicts as the target's next token, teacher-forced on
    the target's true features: the head's per-token acceptance of greedy decoding."""
    import torch

    hit = total = 0
    with torch.inference_mode():
        for row, plen, f in zip(rows, prompt_lens, feats, strict=True):
            ids = torch.tensor([row])
            g = head(target.model.embed_tokens(ids[:, 1:]), f[None, :-1].float())
            pred = target.lm_head(g)[0].argmax(-1)  # position t predicts x_{t+2}
            lo = max(0, plen - 2)
            hit += int((pred[lo : len(row) - 2] == ids[0, lo + 2 :]).sum())
            total += len(row) - 2 - lo
    return hit / total if total else 0.0


def _check_features(
    run_dir: Path, target_dir: Path, rows: list[list[int]], held_rows: list[list[int]]
) -> None:
    """Tie ``run_dir``'s recorded features to these answers and this target: they resume by
    count, so features of another dataset or target would be read as these."""
    weights = [target_dir / f for f in _WEIGHT_FILES if (target_dir / f).is_file()]
    key = json.dumps(
        {"rows": [rows, held_rows], "target": str(target_dir.resolve()),
         "weights": [w.stat().st_size for w in weights]}
    )  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()
    stamp = run_dir / "features.sha256"
    if stamp.exists() and stamp.read_text().strip() != digest:
        raise DatasetError(
            f"{run_dir}: its recorded features are of other answers or another target; "
            "give another --run-dir"
        )
    stamp.write_text(digest + "\n")


def tune_eagle(
    dataset: Path,
    head_dir: Path,
    target_dir: Path,
    out: Path,
    run_dir: Path,
    config: TuneConfig = TuneConfig(),
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Tune the EAGLE head in ``head_dir`` on ``dataset``'s training split into ``out``.

    The target's features for each item's prompt + answer are recorded once into
    ``<run-dir>/features.pt`` (resumable), then the head is trained from its current weights
    with training/train_eagle.py's loss (feature regression plus ``logit_share`` of the KL to
    the target's next-token distribution, ``noise`` on the fed features) in the loop the draft
    tune uses. The output is a head in vLLM's EAGLE format with ``manifest.json``.
    """
    done = _done(out, log)
    if done is not None:
        return done
    manifest = read_manifest(dataset)
    check_head_pair(target_dir, head_dir)
    if out.resolve() == head_dir.resolve():
        raise DatasetError("--out: must not be the base head's directory (write a new one)")
    if config.loss == "tokens":
        raise DatasetError("--loss tokens: an EAGLE head learns the target's features; it needs "
                           "the target's weights (--loss auto or logits)")  # fmt: skip
    if not _has_weights(target_dir):
        raise DatasetError(f"target {str(target_dir)!r}: no weights here; an EAGLE head is "
                           "tuned on the target's own features")  # fmt: skip
    train, heldout = _splits(dataset)

    import torch
    from transformers import LlamaForCausalLM

    from generation.spec_decode.eagle import load_head, save_head
    from training.train_eagle import batches, head_loss, pack, record_features

    if config.threads:
        torch.set_num_threads(config.threads)
    target = LlamaForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    head = load_head(head_dir, target)
    max_len = int(getattr(target.config, "max_position_embeddings", 4096) or 4096)
    rows, prompt_lens = _head_rows(train, max_len)
    held_rows, held_lens = _head_rows(heldout, max_len)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_features(run_dir, target_dir, rows, held_rows)
    log(f"tune: recording the target's features of {len(rows) + len(held_rows)} answers")
    with contextlib.redirect_stdout(sys.stderr):  # its progress lines: not into --json's stdout
        feats = record_features(target, rows, run_dir / "features.pt", run_dir)
        held_feats = record_features(target, held_rows, run_dir / "heldout-features.pt", run_dir)
    lengths = [len(r) for r in rows]
    plan = [
        g
        for e in range(config.epochs)
        for g in batches(lengths, config.tokens_per_batch, random.Random(config.seed * 1000 + e))
    ]
    hidden = int(target.config.hidden_size)

    def step(group: list[int]) -> tuple[Any, int]:
        ids, f, weight = pack(group, rows, prompt_lens, feats, hidden, config.answer_weight)
        loss, _parts = head_loss(head, target, ids, f, weight, config.noise, config.logit_share)
        return loss, sum(lengths[i] for i in group)

    describe = f"{len(rows)} answers, EAGLE head (logit share {config.logit_share})"
    run = _Run(head, "head", plan, step, 0.0, describe)
    state, reason, amp_name = _train(run, dataset, run_dir, config, progress, log)

    base = load_head(head_dir, target)
    match_before = head_match(base, target, held_rows, held_lens, held_feats)
    match_after = head_match(head, target, held_rows, held_lens, held_feats)
    del base
    log(f"held-out greedy match: base head {match_before:.3f}, tuned {match_after:.3f}")

    result = {
        **_summary(dataset, target_dir, manifest, state, reason, amp_name, config),
        "kind": "eagle",
        "base_head": str(head_dir.resolve()),
        "train_items": len(rows),
        "heldout_items": len(held_rows),
        "loss": "eagle",
        "logit_share": config.logit_share,
        "noise": config.noise,
        "heldout_greedy_match": {"base": round(match_before, 4), "tuned": round(match_after, 4)},
    }
    _publish(out, lambda tmp: save_head(head, tmp), result)
    log(f"wrote the tuned EAGLE head to {out}")
    return result
