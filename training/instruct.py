"""Turn the raw-format demo pair into an instruct pair: ``python -m training.instruct``.

The pair in ``--models`` was trained on the raw completion prompt (training/train_demo.py and
training/distill_draft.py).  This fine-tunes it, rather than training again from scratch, onto
the chat shape the service now sends (retrieval/chat.py): ChatML's two special tokens are
appended to the tokenizer (training/tokenizer.py ``add_chat_tokens``), both models' embeddings
and output heads grow by two rows, and then

1. the target trains on RAG examples encoded through the chat template by the serving path's
   own encoder (system turn, user turn with numbered passages and the question, the answer
   ended by ``<|im_end|>``), with a synthetic induction batch every ``--induction-every``
   steps so the copying circuit stays exercised; the draft learns online from the target's
   logits on the same batches;
2. ``--draft-steps`` draft-only steps of KL on the final target;
3. export to ``--out`` (float16 safetensors, config, generation config listing both EOS ids,
   tokenizer with its chat template).

Then ``training.distill_draft --models <out>`` distils the draft on the target's own templated
answers, as for the raw pair.  Checkpoints every ``--ckpt-every`` steps under ``--run-dir``; a
rerun resumes there, and ``done.json`` marks the run finished.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

from retrieval.chat import PromptFormat
from training.corpus import REPO_ROOT, build_corpus
from training.data import AMBIGUITY_N, BatchStream
from training.model import autocast_dtype, export
from training.pair_run import PairRun
from training.qa import RETRIEVAL_GOLD_WEIGHTS, UNIFORM_GOLD_WEIGHTS
from training.tokenizer import EOS_TOKEN, IM_END, IM_START, add_chat_tokens
from training.train_demo import kl_losses, log_line, lr_at, token_losses, weighted


def grow_vocab(model: LlamaForCausalLM, new_size: int, like: int) -> None:
    """Append rows for the new special tokens, in place.

    Input rows: ``<|im_start|>`` the mean input row, ``<|im_end|>`` a copy of token ``like``
    (``<|endoftext|>``); output rows: both copies of ``like``'s, so the untrained model already
    ends an answer with ``<|im_end|>`` wherever it ended it with ``<|endoftext|>``.  The
    induction circuit's weights (training/induction_init.py) are untouched.
    """
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(new_size, mean_resizing=False)
    emb_in = model.get_input_embeddings().weight
    emb_out = model.get_output_embeddings().weight
    with torch.no_grad():
        emb_in[old] = emb_in[:old].mean(0)
        emb_out[old] = emb_out[like]
        for row in range(old + 1, new_size):
            emb_in[row] = emb_in[like]
            emb_out[row] = emb_out[like]


def has_chat_tokens(models: Path) -> bool:
    """Whether ``models``/target's tokenizer already holds ChatML (an instruct pair to continue)."""
    tok = AutoTokenizer.from_pretrained(str(models / "target"))
    return IM_END in tok.get_vocab()


def chat_tokenizer(run_dir: Path, models: Path) -> PreTrainedTokenizerFast:
    """The pair's tokenizer with ChatML added: made once from ``models``/target, then reused.

    An instruct pair's tokenizer (ChatML already there) is copied as it is."""
    path = run_dir / "tokenizer"
    if not (path / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(str(models / "target"))
        if IM_END not in tok.get_vocab():
            tok = add_chat_tokens(tok)
        tok.save_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


GOLD_WEIGHTS = {"retrieval": RETRIEVAL_GOLD_WEIGHTS, "uniform": UNIFORM_GOLD_WEIGHTS}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=Path, default=REPO_ROOT / "models" / "demo")
    ap.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "instruct")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "instruct" / "pair")
    ap.add_argument("--target-steps", type=int, default=160)
    ap.add_argument("--draft-steps", type=int, default=20)
    ap.add_argument("--induction-every", type=int, default=6, help="0: never")
    ap.add_argument("--no-answer-rate", type=float, default=0.04)
    ap.add_argument(
        "--loop-stop-rate",
        type=float,
        default=0.0,
        help="share of RAG rows whose answer is cut, caught in a repetition loop and then closed "
        "(training/data.py loop_stop_row): the model learns to end a quote that repeats itself",
    )
    ap.add_argument(
        "--stop-weight", type=float, default=1.0, help="loss weight of a loop-stop row's way out"
    )
    ap.add_argument(
        "--loop-exit",
        choices=("close", "resume"),
        default="close",
        help="a loop-stop row's way out: close the quote and end, or resume the passage's text",
    )
    ap.add_argument(
        "--cite-weight",
        type=float,
        default=1.0,
        help="loss weight of the answer's citation number (the token that picks the passage)",
    )
    ap.add_argument(
        "--ambiguity-weight",
        type=float,
        default=1.0,
        help="loss weight of answer labels whose preceding n tokens occur earlier in the context "
        "with another next token (training/data.py ambiguity_positions): where a copier must know "
        "which occurrence it is in, and where the demo pair's loops start",
    )
    ap.add_argument(
        "--ambiguity-n",
        type=int,
        nargs=2,
        default=list(AMBIGUITY_N),
        metavar=("LO", "HI"),
        help="n-gram lengths --ambiguity-weight looks back over",
    )
    ap.add_argument(
        "--ambiguity-skip-end",
        action="store_true",
        help="leave the answer's last token and its end of turn out of --ambiguity-weight",
    )
    ap.add_argument(
        "--repeat-rows",
        type=int,
        default=1,
        help="how many times each example whose answer repeats some 4 tokens (a quoted code "
        "example's repeated line; training/data.py answer_repeats) appears in its round",
    )
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--draft-lr", type=float, default=5e-4)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument(
        "--gold-position",
        choices=sorted(GOLD_WEIGHTS),
        default="retrieval",
        help="where the passage holding the answer sits: mostly [1] (retrieval) or anywhere",
    )
    ap.add_argument(
        "--stream-seed",
        type=int,
        default=None,
        help="seed of the example stream (default seed + 33); a continuation takes a new one",
    )
    # One thread: the machine's two cores are shared, and two intra-op threads on a busy core
    # spin at barriers (2-5x slower, measured).
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    args.run_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        log_line(args.run_dir / "instruct.log", msg)

    if (args.run_dir / "done.json").exists():
        log(f"{args.run_dir} is done; nothing to do")
        return
    continuing = has_chat_tokens(args.models)
    tok = chat_tokenizer(args.run_dir, args.models)
    base_vocab = tok.convert_tokens_to_ids(IM_START)
    text_end = tok.convert_tokens_to_ids(EOS_TOKEN)
    assert tok.convert_tokens_to_ids(IM_END) == base_vocab + 1 == len(tok) - 1
    target = LlamaForCausalLM.from_pretrained(str(args.models / "target"), dtype=torch.float32)
    draft = LlamaForCausalLM.from_pretrained(str(args.models / "draft"), dtype=torch.float32)
    for model in (target, draft):
        if not continuing:
            grow_vocab(model, len(tok), like=text_end)
        assert model.get_input_embeddings().weight.shape[0] == len(tok), "vocab mismatch"
        model.config.eos_token_id = tok.eos_token_id
        model.generation_config.eos_token_id = [tok.eos_token_id, text_end]
    run = PairRun(
        target, draft, lr=args.lr, draft_lr=args.draft_lr, ckpt=args.run_dir / "ckpt.pt", log=log
    )
    opt_t, opt_d, state, save = run.opt_t, run.opt_d, run.state, run.save

    fmt = PromptFormat.for_tokenizer(tok)
    corpus = build_corpus(args.seed)
    # fresh examples, not the raw pair's stream
    stream_seed = args.seed + 33 if args.stream_seed is None else args.stream_seed
    stream = BatchStream(
        corpus.train,
        tok,
        seed=stream_seed,
        tokens_per_batch=args.tokens_per_batch,
        fmt=fmt,
        no_answer_rate=args.no_answer_rate,
        gold_weights=GOLD_WEIGHTS[args.gold_position],
        loop_stop_rate=args.loop_stop_rate,
        stop_weight=args.stop_weight,
        cite_weight=args.cite_weight,
        loop_exit=args.loop_exit,
        ambiguity_weight=args.ambiguity_weight,
        ambiguity_n=(args.ambiguity_n[0], args.ambiguity_n[1]),
        ambiguity_repeat=args.repeat_rows,
        ambiguity_skip_end=args.ambiguity_skip_end,
    )
    amp = autocast_dtype()
    total = args.target_steps + args.draft_steps
    log(
        f"{total} steps ({args.target_steps} target), autocast {amp}, {args.threads} thread(s), "
        f"{'continuing an instruct pair' if continuing else 'from a raw pair'}, "
        f"gold position {args.gold_position}, loop-stop rows {args.loop_stop_rate} "
        f"(exit {args.loop_exit}, weight {args.stop_weight}), citation weight {args.cite_weight}, "
        f"ambiguity weight {args.ambiguity_weight} (n {args.ambiguity_n}, "
        f"skip end {args.ambiguity_skip_end}), "
        f"repeat rows x{args.repeat_rows}"
    )
    every = args.induction_every
    while state["step"] < total:
        t0 = time.perf_counter()
        step = state["step"]
        b, split, kind = run.next_batch(
            stream,
            every=every,
            seed=args.seed,
            vocab=base_vocab,
            eos=text_end,
            tokens=args.tokens_per_batch,
        )
        train_target = step < args.target_steps
        target.train(train_target)
        with torch.autocast("cpu", dtype=amp, enabled=amp != torch.float32):
            if train_target:
                for g in opt_t.param_groups:
                    g["lr"] = lr_at(step, args.target_steps, args.lr, warmup=10)
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
        kl.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        n_tok = int(b.is_real.sum())
        state["step"] += 1
        state["seconds"] += dt
        state["tokens"] += n_tok
        left = (total - state["step"]) * state["seconds"] / max(1, state["step"])
        log(
            f"{kind} step {step}/{total} loss_t {loss_t.item():.3f} kl {kl.item():.3f} "
            f"tok/s {n_tok / dt:.0f} elapsed {state['seconds'] / 60:.1f} min, "
            f"~{left / 60:.0f} min left"
        )
        if state["step"] % args.ckpt_every == 0 or state["step"] == total:
            save()

    step_card = {
        "steps": state["step"],
        "target_steps": args.target_steps,
        "draft_steps": args.draft_steps,
        "train_seconds": round(state["seconds"]),
        "train_tokens": state["tokens"],
        "lr": args.lr,
        "no_answer_rate": args.no_answer_rate,
        "autocast": str(amp),
        "gold_position": args.gold_position,
        "loop_stop_rate": args.loop_stop_rate,
        "stop_weight": args.stop_weight,
        "cite_weight": args.cite_weight,
        "loop_exit": args.loop_exit,
        "ambiguity_weight": args.ambiguity_weight,
        "ambiguity_n": args.ambiguity_n,
        "repeat_rows": args.repeat_rows,
        "ambiguity_skip_end": args.ambiguity_skip_end,
        "stream_seed": stream_seed,
        "command": "python -m training.instruct "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    for role, model in (("target", target), ("draft", draft)):
        prev = json.loads((args.models / role / "training.json").read_text())
        if continuing:  # keep the first fine-tune's card; list the continuations after it
            card = {**prev, "instruct_continued": [*prev.get("instruct_continued", []), step_card]}
        else:
            card = {**prev, "instruct": step_card}
        export(model.eval(), tok, args.out / role, card)
    log(f"exported to {args.out}")
    (args.run_dir / "done.json").write_text(json.dumps(state) + "\n")


if __name__ == "__main__":
    main()
