"""Loop-stop rows and the citation weight of the instruct fine-tune (training/data.py).

A loop-stop row is an example whose answer is cut, caught in a repetition loop (a span of its
own last tokens repeated) and then closed: only the correct prefix and the way out (closing
quote, end of turn) carry loss, the repeated tokens none.  Checked on the real tokenizer and
the real example stream, through collate and the loss reduction the training loop uses.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from retrieval.chat import PromptFormat, encode_text
from training.corpus import build_corpus
from training.data import (
    LOOP_CYCLE,
    BatchStream,
    Marks,
    citation_marks,
    collate,
    encode_example,
    loop_stop_row,
)
from training.qa import make_examples
from training.train_demo import weighted

pytestmark = pytest.mark.models

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(ROOT / "models" / "demo" / "target"))


@pytest.fixture(scope="module")
def rows(tok):  # type: ignore[no-untyped-def]
    docs = [d for d in build_corpus(0).train if d.source.startswith("demo/corpus/")]
    fmt = PromptFormat.for_tokenizer(tok)
    return [encode_example(tok, e, fmt) for e in make_examples(docs, 60, seed=5)]


def test_loop_stop_row_repeats_its_own_tail_then_closes(tok, rows) -> None:  # type: ignore[no-untyped-def]
    close = encode_text(tok, '"')
    rng = random.Random(0)
    made = 0
    for ids, n_prompt in rows:
        row = loop_stop_row(ids, n_prompt, rng, close, 4.0)
        if row is None:
            assert len(ids) - n_prompt - 1 < 6 + LOOP_CYCLE[0] + 2
            continue
        made += 1
        seq, n, marks = row
        lo, hi = marks.masked
        assert n == n_prompt and seq[:n_prompt] == ids[:n_prompt]
        # correct prefix: the answer's own first tokens
        j = lo + 1 - n_prompt
        assert seq[n_prompt : lo + 1] == ids[n_prompt : n_prompt + j]
        # the injected tokens (labels of positions lo .. hi-1) repeat the prefix's tail cyclically
        loop = seq[lo + 1 : hi + 1]
        assert len(loop) >= 3
        prefix = seq[n_prompt : lo + 1]
        c = next(
            c
            for c in range(LOOP_CYCLE[0], LOOP_CYCLE[1] + 1)
            if all(loop[t] == prefix[len(prefix) - c + t % c] for t in range(len(loop)))
        )
        assert c <= len(prefix)
        # then the way out: the closing quote and the end of turn, weighed
        assert seq[hi + 1 :] == close + [tok.eos_token_id]
        assert marks.weights == tuple((p, 4.0) for p in range(hi, len(seq) - 1))
    assert made > 40


def test_resume_rows_repeat_the_span_whole_then_go_on_with_the_answer(tok, rows) -> None:  # type: ignore[no-untyped-def]
    close = encode_text(tok, '"')
    rng = random.Random(1)
    made = 0
    for ids, n_prompt in rows:
        row = loop_stop_row(ids, n_prompt, rng, close, 3.0, exit="resume")
        if row is None:
            continue
        made += 1
        seq, _, marks = row
        lo, hi = marks.masked
        j = lo + 1 - n_prompt
        answer = ids[n_prompt:-1]
        loop = seq[lo + 1 : hi + 1]
        # one or two whole copies of the prefix's last c tokens ...
        c = next(c for c in range(LOOP_CYCLE[0], LOOP_CYCLE[1] + 1) if len(loop) in (c, 2 * c)
                 and loop == answer[j - c : j] * (len(loop) // c))  # fmt: skip
        assert c >= LOOP_CYCLE[0]
        # ... then the answer's own rest and EOS; only the first token after the loop weighed
        assert seq[hi + 1 :] == answer[j:] + [tok.eos_token_id]
        assert marks.weights == ((hi, 3.0),)
        # without the loop it is the example itself
        assert seq[: lo + 1] + seq[hi + 1 :] == ids
    assert made > 40


def test_collate_masks_the_loop_and_weighs_the_way_out(tok, rows) -> None:  # type: ignore[no-untyped-def]
    close = encode_text(tok, '"')
    ids, n_prompt = next(r for r in rows if len(r[0]) - r[1] > 30)
    row = loop_stop_row(ids, n_prompt, random.Random(3), close, 4.0)
    assert row is not None
    seq, _, marks = row
    lo, hi = marks.masked
    b = collate([row, (ids, n_prompt)], tok.pad_token_id)
    assert not b.is_real[0, lo:hi].any() and not b.is_answer[0, lo:hi].any()
    assert b.is_real[0, hi : len(seq) - 1].all() and b.is_answer[0, hi : len(seq) - 1].all()
    assert b.is_answer[0, n_prompt - 1 : lo].all()
    assert b.weight is not None
    assert (b.weight[0, hi : len(seq) - 1] == 4.0).all()
    assert int((b.weight != 1.0).sum()) == len(seq) - 1 - hi
    # the plain row is as before: every label after the prompt is answer, weight 1
    assert b.is_answer[1, n_prompt - 1 : len(ids) - 1].all()
    assert (b.weight[1] == 1.0).all()

    # the reduction: answers' share is the weighted mean of their labels
    values = torch.rand(b.input_ids.shape[0], b.input_ids.shape[1] - 1)
    ans = b.is_answer[:, :-1]
    prompt = b.is_real[:, :-1] & ~ans
    w = b.weight[:, :-1][ans]
    expected = 0.2 * values[prompt].mean() + 0.8 * (values[ans] * w).sum() / w.sum()
    assert torch.allclose(weighted(values, b, 0.8), expected)
    # without weights, the plain mean (as before)
    plain = collate([(ids, n_prompt)], tok.pad_token_id)
    assert plain.weight is None


def test_citation_marks_pick_the_number(tok, rows) -> None:  # type: ignore[no-untyped-def]
    for ids, n_prompt in rows:
        marks = citation_marks(tok, ids, n_prompt, 3.0)
        answer = tok.decode(ids[n_prompt:])
        if "[" not in answer.split('"')[0]:
            continue
        assert marks is not None, answer
        ((p, w),) = marks.weights
        assert w == 3.0
        assert tok.decode([ids[p]]).strip() == "["
        assert tok.decode([ids[p + 1]]).strip().isdigit()
        assert p >= n_prompt
    assert citation_marks(tok, [1, 2, 3], 3, 3.0) is None


def test_stream_without_the_options_is_unchanged(tok) -> None:  # type: ignore[no-untyped-def]
    docs = [d for d in build_corpus(0).train if d.source.startswith("demo/corpus/")]
    fmt = PromptFormat.for_tokenizer(tok)
    plain = BatchStream(docs, tok, seed=4, tokens_per_batch=2048, examples_per_round=40, fmt=fmt)
    marked = BatchStream(
        docs,
        tok,
        seed=4,
        tokens_per_batch=2048,
        examples_per_round=40,
        fmt=fmt,
        loop_stop_rate=0.5,
        stop_weight=4.0,
        cite_weight=3.0,
    )
    a = [r for b in plain.round_batches(0) for r in b]
    assert all(len(r) == 2 for r in a)
    m = [r for b in marked.round_batches(0) for r in b]
    loops = [r for r in m if len(r) == 3 and r[2].masked != (0, 0)]
    cites = [r for r in m if len(r) == 3 and r[2].masked == (0, 0)]
    assert 5 < len(loops) < 35 and cites
    # the same examples underneath: every cited row is a plain row with its marks
    assert {tuple(r[0]) for r in cites} <= {tuple(r[0]) for r in a}
    assert isinstance(cites[0][2], Marks)
