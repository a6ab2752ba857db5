"""Incremental detokenisation: bursts of any size add up exactly to the stored answer text."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from app.streams.detok import REPLACEMENT, IncrementalDetokenizer

DEMO_TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "demo" / "target"
TEXTS = [
    "  The assert statement checks a condition.  \n",
    "héllo wörld — naïve café, 日本語のテキスト 🙂🚀 end",
    "\n\n  spaces   inside   and a tab\there\n",
    "emoji at the end 🎉",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from generation import load_tokenizer

    return load_tokenizer(DEMO_TOKENIZER)


def _bursts(ids: list[int], rng: random.Random) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        out.append(ids[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_bursts_add_up_to_the_stripped_answer_and_never_split_a_character(
    tokenizer: Any, text: str
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.eos_token_id is not None:
        ids = ids + [tokenizer.eos_token_id]  # special tokens render as nothing
    answer = tokenizer.decode(ids, skip_special_tokens=True).strip()
    assert REPLACEMENT not in answer
    for seed in range(5):
        rng = random.Random(seed)
        bursts = _bursts(ids, rng) if seed else [[t] for t in ids]  # seed 0: one token per burst

        def decode(part: list[int]) -> str:
            return str(tokenizer.decode(part, skip_special_tokens=True))

        detok = IncrementalDetokenizer(decode)
        pieces = [detok.push(b) for b in bursts]
        rest = detok.finish(answer)
        assert rest is not None
        assert "".join(pieces) + rest == answer
        assert all(REPLACEMENT not in p for p in pieces), pieces
        assert not pieces[0].startswith((" ", "\n")) if pieces[0] else True


def test_multibyte_character_split_across_bursts_is_held_back() -> None:
    # Byte-level decoding: "é" is two bytes, delivered in two bursts.
    raw = list(b"caf") + list("é!".encode())

    def decode(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    detok = IncrementalDetokenizer(decode)
    assert detok.push(raw[:4]) == "caf"  # the first byte of "é" alone is not shown
    assert detok.push(raw[4:5]) == "é"
    assert detok.push(raw[5:]) == "!"
    assert detok.finish("café!") == ""


def test_trailing_whitespace_waits_for_more_text_and_is_dropped_at_the_end() -> None:
    def decode(ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    detok = IncrementalDetokenizer(decode)
    assert detok.push([ord(" "), ord("a"), ord(" ")]) == "a"
    assert detok.push([ord("b"), ord("\n")]) == " b"
    assert detok.finish("a b") == ""


def test_a_tokenizer_that_rewrites_earlier_text_is_reported_by_finish() -> None:
    renders = iter(["ab", "xy"])

    def decode(_: list[int]) -> str:
        return next(renders)

    detok = IncrementalDetokenizer(decode)
    assert detok.push([1]) == "ab"
    assert detok.push([2]) == ""  # "xy" does not continue "ab": nothing is sent
    assert detok.finish("xyz") is None
