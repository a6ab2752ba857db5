"""The product's prompt: numbered passages for citation, the question, then the answer.

The demo model pair is trained on exactly this format, so changing it means retraining.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retrieval.results import SearchHit


@dataclass(frozen=True)
class Passage:
    """One retrieved passage as the prompt shows it."""

    title: str
    text: str


def format_passage(number: int, passage: Passage) -> str:
    """One numbered passage block: ``[n] title\\ntext``."""
    return f"[{number}] {passage.title}\n{passage.text.strip()}\n"


def format_prompt(question: str, passages: Sequence[Passage]) -> str:
    """The full prompt text; the model continues after ``Answer:``."""
    blocks = "".join(format_passage(i, p) for i, p in enumerate(passages, start=1))
    return f"Passages:\n{blocks}\nQuestion: {question.strip()}\nAnswer:"


def build_prompt(
    question: str,
    hits: Sequence[SearchHit],
    count_tokens: Callable[[str], int],
    budget_tokens: int,
) -> tuple[str, list[SearchHit]]:
    """The prompt for ``question`` and the hits it cites as [1], [2], ... in that order.

    Passages go in rank order while the prompt fits ``budget_tokens`` (as ``count_tokens``
    counts them); the first that does not fit is cut at a word boundary if enough of it fits,
    and it and every lower-ranked one are otherwise dropped.
    """
    bare = format_prompt(question, [])
    if count_tokens(bare) > budget_tokens:
        raise ValueError(
            f"the question alone takes {count_tokens(bare)} tokens, over the budget of {budget_tokens}"
        )
    kept: list[SearchHit] = []
    passages: list[Passage] = []
    for hit in hits:
        passage = Passage(hit.passage_title, hit.text)
        if count_tokens(format_prompt(question, [*passages, passage])) <= budget_tokens:
            kept.append(hit)
            passages.append(passage)
            continue
        cut = _longest_fitting_cut(question, passages, passage, count_tokens, budget_tokens)
        if cut is not None:
            kept.append(replace(hit, text=cut))
            passages.append(Passage(passage.title, cut))
        break
    return format_prompt(question, passages), kept


# A cut passage shorter than this says too little to be worth citing.
MIN_CUT_WORDS = 12


def _longest_fitting_cut(
    question: str,
    passages: list[Passage],
    passage: Passage,
    count_tokens: Callable[[str], int],
    budget_tokens: int,
) -> str | None:
    """The longest word-boundary prefix of ``passage.text`` that still fits, or None."""
    ends = [m.end() for m in re.finditer(r"\S+", passage.text)]

    def fits(words: int) -> bool:
        cut = Passage(passage.title, passage.text[: ends[words - 1]])
        return count_tokens(format_prompt(question, [*passages, cut])) <= budget_tokens

    lo, hi = 0, len(ends) - 1  # invariant: lo words fit (0 trivially), hi + 1 words do not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    if lo < MIN_CUT_WORDS:
        return None
    return passage.text[: ends[lo - 1]]
