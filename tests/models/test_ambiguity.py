"""The position-ambiguity weight and the repeat rows of the instruct fine-tune (training/data.py).

An answer label is ambiguous when the n tokens before it (n in a range) also stand earlier in the
context -- passage or answer so far -- followed by another token: a copier that matches the last
n tokens may continue from the wrong occurrence, which is how the demo pair's loops start
(docs/models.md).  Checked on hand-made ids, where the flagged set is known
exactly, then on the real tokenizer and example stream through collate and the loss reduction.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from retrieval.chat import PromptFormat, encode_text
from training.corpus import build_corpus
from training.data import (
    BatchStream,
    Marks,
    ambiguity_marks,
    ambiguity_positions,
    answer_repeats,
    collate,
)
from training.train_demo import weighted

pytestmark = pytest.mark.models

ROOT = Path(__file__).resolve().parents[2]


def brute_force(ids: list[int], n_prompt: int, lo: int, hi: int) -> list[int]:
    """The definition, written out: answer position p is flagged when some n-gram ending at p
    ends at an earlier q too, with ids[q+1] != ids[p+1]."""
    out = []
    for p in range(n_prompt - 1, len(ids) - 1):
        if any(
            p - n + 1 >= 0
            and q - n + 1 >= 0
            and ids[q - n + 1 : q + 1] == ids[p - n + 1 : p + 1]
            and ids[q + 1] != ids[p + 1]
            for n in range(lo, hi + 1)
            for q in range(p)
        ):
            out.append(p)
    return out


def test_a_repeated_line_flags_the_label_after_its_second_copy() -> None:
    # passage: "A B C x ... A B C y" (a line that repeats with different continuations)
    prompt = [50, 10, 11, 12, 20, 51, 10, 11, 12, 21, 52]
    # the answer quotes from the second copy: "A B C y"
    answer = [10, 11, 12, 21, 99]
    ids = prompt + answer
    n = len(prompt)
    # position of the answer's "C" (index n+2) predicts y (21); "A B C" / "B C" was followed by
    # x (20) at its first occurrence: ambiguous.  So is the answer's "y" (n+3), which predicts
    # the end (99) where the passage's "A B C y" went on with 52 (where to stop the quote).
    # The first two answer labels are not.
    assert ambiguity_positions(ids, n, (2, 6)) == [n + 2, n + 3]
    # "A B C" is 3 tokens: at n >= 4 only the stop is ambiguous, at n >= 5 nothing
    assert ambiguity_positions(ids, n, (4, 6)) == [n + 3]
    assert ambiguity_positions(ids, n, (5, 6)) == []
    assert ambiguity_positions(ids, n, (2, 6)) == brute_force(ids, n, 2, 6)
    # a line repeated with the same continuation is no ambiguity: only the stop is left
    same = [50, 10, 11, 12, 21, 51, 10, 11, 12, 21, 52] + answer
    assert ambiguity_positions(same, n, (2, 6)) == [n + 3]


def test_the_answers_own_text_counts_as_context() -> None:
    # the answer repeats its own "A B C" with another continuation (the loop's shape)
    prompt = [1, 2, 3]
    answer = [10, 11, 12, 20, 10, 11, 12, 21, 9]
    ids = prompt + answer
    n = len(prompt)
    assert ambiguity_positions(ids, n, (3, 3)) == [n + 6]  # "A B C" before 21, once 20
    assert ambiguity_positions(ids, n, (2, 6)) == brute_force(ids, n, 2, 6)


def test_prompt_positions_are_never_flagged() -> None:
    prompt = [7, 8, 1, 7, 8, 2, 7, 8, 3]  # "7 8" with three continuations, all in the prompt
    ids = prompt + [4, 5]
    n = len(prompt)
    assert all(p >= n - 1 for p in ambiguity_positions(ids, n, (2, 2)))
    # the last prompt position predicts the answer's first token: "8 3" is new, nothing there
    assert ambiguity_positions(ids, n, (2, 2)) == []
    # but an answer that starts "7 8 ..." after the prompt's "... 3" is: position of its "8"
    ids2 = prompt + [7, 8, 6, 5]
    assert ambiguity_positions(ids2, n, (2, 2)) == [n + 1]


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_definition_on_random_ids(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 4, (60,), generator=g).tolist()  # 4 symbols: many repeats
    for lo, hi in ((2, 6), (3, 4), (1, 1)):
        assert ambiguity_positions(ids, 25, (lo, hi)) == brute_force(ids, 25, lo, hi)


def test_marks_multiply_weights_and_keep_the_mask() -> None:
    old = Marks(masked=(4, 7), weights=((8, 3.0), (9, 2.0)))
    new = ambiguity_marks([5, 8, 10], 4.0, old)
    assert new is not None
    assert new.masked == (4, 7)
    # 5 is masked: untouched; 8 was 3.0 -> 12.0; 9 stays; 10 new at 4.0
    assert new.weights == ((8, 12.0), (9, 2.0), (10, 4.0))
    assert ambiguity_marks([], 4.0) is None
    assert ambiguity_marks([3], 2.5) == Marks(weights=((3, 2.5),))


def test_answer_repeats() -> None:
    assert answer_repeats([0, 0, 1, 2, 3, 4, 9, 1, 2, 3, 4], 2, 4)
    assert not answer_repeats([0, 0, 1, 2, 3, 4, 9, 1, 2, 3, 5], 2, 4)
    # a repeat that straddles the prompt does not count
    assert not answer_repeats([1, 2, 3, 4, 1, 2, 3, 4], 4, 4)


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(ROOT / "models" / "demo" / "target"))


def test_the_shipped_loop_state_is_flagged(tok) -> None:  # type: ignore[no-untyped-def]
    """'except* OSError as e:' three times in the passage (exceptions.md): quoting it, the label
    after the answer's second 'as e:' line start is one the weight lands on."""
    code = (
        "try:\n    raise ExceptionGroup('eg', [OSError(1), OSError(2)])\n"
        "except* OSError as e:\n    print('one')\n"
        "except* OSError as e:\n    print('two')\n"
        "except* OSError as e:\n    print('three')\n"
    )
    prompt = encode_text(tok, "Passage: " + code + "\nQuestion: Explain Exceptions.\n")
    answer = encode_text(tok, code)
    ids = prompt + answer + [tok.eos_token_id]
    flagged = ambiguity_positions(ids, len(prompt))
    second = tok.decode(answer).index("    print('two')")
    # the answer position whose label starts the second print line's distinguishing text
    text_upto = [tok.decode(answer[: t + 1]) for t in range(len(answer))]
    where = next(t for t, s in enumerate(text_upto) if len(s) > second + len("    print('"))
    pos = len(prompt) + where - 1  # position predicting answer[where]
    assert pos in flagged, (tok.decode(answer[where - 3 : where + 1]), flagged)


def test_stream_weighs_exactly_the_flagged_labels(tok) -> None:  # type: ignore[no-untyped-def]
    docs = [d for d in build_corpus(0).train if d.source.startswith("demo/corpus/")]
    fmt = PromptFormat.for_tokenizer(tok)
    kw = dict(seed=4, tokens_per_batch=2048, examples_per_round=40, fmt=fmt)
    plain = BatchStream(docs, tok, **kw)  # type: ignore[arg-type]
    heavy = BatchStream(docs, tok, ambiguity_weight=4.0, **kw)  # type: ignore[arg-type]
    rows_plain = sorted((tuple(r[0]), r[1]) for b in plain.round_batches(0) for r in b)
    rows_heavy = [r for b in heavy.round_batches(0) for r in b]
    # the same examples, in the same number
    assert sorted((tuple(r[0]), r[1]) for r in rows_heavy) == rows_plain
    n_flagged = 0
    for row in rows_heavy:
        ids, n_prompt = row[0], row[1]
        want = ambiguity_positions(ids, n_prompt)
        if not want:
            assert len(row) == 2
            continue
        marks = row[2]
        assert marks.weights == tuple((p, 4.0) for p in want)
        n_flagged += len(want)
        # through collate: weight 4 at the flagged answer labels, 1 at every other label
        b = collate([row], tok.pad_token_id)
        assert b.weight is not None
        w = b.weight[0, : len(ids) - 1]
        expect = torch.ones(len(ids) - 1)
        expect[want] = 4.0
        assert torch.equal(w, expect)
        assert b.is_answer[0, want].all()
    assert n_flagged > 20
    # the reduction: a flagged label's loss counts 4x an unflagged answer label's
    row = next(r for r in rows_heavy if len(r) == 3)
    b = collate([row], tok.pad_token_id)
    values = torch.zeros(1, b.input_ids.shape[1] - 1)
    p = row[2].weights[0][0]
    values[0, p] = 1.0
    n_ans = int(b.is_answer[0, :-1].sum())
    n_w = len(row[2].weights)
    assert torch.allclose(weighted(values, b, 0.8), torch.tensor(0.8 * 4.0 / (n_ans + 3.0 * n_w)))


def test_stream_repeats_rows_whose_answer_repeats(tok) -> None:  # type: ignore[no-untyped-def]
    docs = [d for d in build_corpus(0).train if d.source.startswith("demo/corpus/")]
    fmt = PromptFormat.for_tokenizer(tok)
    kw = dict(seed=4, tokens_per_batch=2048, examples_per_round=80, fmt=fmt)
    plain = [r for b in BatchStream(docs, tok, **kw).round_batches(0) for r in b]  # type: ignore[arg-type]
    more = [r for b in BatchStream(docs, tok, ambiguity_repeat=3, **kw).round_batches(0) for r in b]  # type: ignore[arg-type]
    rep = [r for r in plain if answer_repeats(r[0], r[1])]
    assert rep, "no example in the round repeats itself"
    assert len(more) == len(plain) + 2 * len(rep)
    count = {}
    for r in more:
        count[tuple(r[0])] = count.get(tuple(r[0]), 0) + 1
    for r in plain:
        assert count[tuple(r[0])] == (3 if answer_repeats(r[0], r[1]) else 1)


def test_skip_end_leaves_the_answers_end_unweighted(tok) -> None:  # type: ignore[no-untyped-def]
    docs = [d for d in build_corpus(0).train if d.source.startswith("demo/corpus/")]
    fmt = PromptFormat.for_tokenizer(tok)
    kw = dict(seed=4, tokens_per_batch=2048, examples_per_round=40, fmt=fmt)
    rows = [
        r
        for b in BatchStream(
            docs, tok, ambiguity_weight=4.0, ambiguity_skip_end=True, **kw
        ).round_batches(0)  # type: ignore[arg-type]
        for r in b
    ]
    ends = 0
    for row in rows:
        ids, n_prompt = row[0], row[1]
        want = [p for p in ambiguity_positions(ids, n_prompt) if p < len(ids) - 3]
        ends += len(ambiguity_positions(ids, n_prompt)) - len(want)
        got = [p for p, _ in row[2].weights] if len(row) == 3 else []
        assert got == want
    assert ends > 5  # the quote's end is often ambiguous: the passage goes on after it
