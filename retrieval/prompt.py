"""The product's prompt: numbered passages for citation and the question, in two shapes.

- ``chat``: the target tokenizer's chat template, a system message (the deployment's instruction,
  ``DEFAULT_SYSTEM_PROMPT`` unless the settings or the collection say otherwise) and a user
  message holding the numbered passages and the question (``chat_messages``).
- ``raw``: for checkpoints without a template, the completion text ``format_prompt`` (the
  model continues after ``Answer:``).

Both carry the same body (``user_message``).  The demo pair is trained on the chat shape
(training/qa.py builds its examples with these functions), so changing either means retraining.
Token ids are made in retrieval/chat.py; this module is text only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retrieval.results import SearchHit

DEFAULT_SYSTEM_PROMPT = (
    "You answer questions about the documents of this service. Answer only from the numbered "
    "passages in the user's message and cite the passage you use as [n]. If the passages do not "
    "hold the answer, say so."
)
"""The system message when neither ``SPECRAG_SYSTEM_PROMPT`` nor the collection sets one."""

MAX_SYSTEM_PROMPT_CHARS = 4000
"""Longest system prompt the settings, the CLI and the API accept (the worker also counts tokens)."""


@dataclass(frozen=True)
class Passage:
    """One retrieved passage as the prompt shows it."""

    title: str
    text: str


def format_passage(number: int, passage: Passage) -> str:
    """One numbered passage block: ``[n] title\\ntext``."""
    return f"[{number}] {passage.title}\n{passage.text.strip()}\n"


def user_message(question: str, passages: Sequence[Passage]) -> str:
    """The numbered passages, then the question: the body both prompt shapes share."""
    blocks = "".join(format_passage(i, p) for i, p in enumerate(passages, start=1))
    return f"Passages:\n{blocks}\nQuestion: {question.strip()}"


def format_prompt(question: str, passages: Sequence[Passage]) -> str:
    """The raw prompt text (no chat template); the model continues after ``Answer:``."""
    return f"{user_message(question, passages)}\nAnswer:"


def chat_messages(
    question: str, passages: Sequence[Passage], system_prompt: str
) -> list[dict[str, str]]:
    """The chat shape: ``[{"role": "system", ...}, {"role": "user", ...}]``."""
    return [
        {"role": "system", "content": system_prompt.strip()},
        {"role": "user", "content": user_message(question, passages)},
    ]


def check_system_prompt(text: str) -> str:
    """``text`` stripped; ValueError naming the problem when it is empty or over the limit."""
    stripped = text.strip()
    if not stripped:
        raise ValueError("system prompt: must not be empty")
    if len(stripped) > MAX_SYSTEM_PROMPT_CHARS:
        raise ValueError(
            f"system prompt: {len(stripped)} characters, over the limit of "
            f"{MAX_SYSTEM_PROMPT_CHARS}"
        )
    return stripped


def build_prompt(
    question: str,
    hits: Sequence[SearchHit],
    count_tokens: Callable[[str], int],
    budget_tokens: int,
) -> tuple[str, list[SearchHit]]:
    """The raw prompt text for ``question`` and the hits it cites as [1], [2], ... in order.

    As ``fit_passages`` with the raw text's token count; kept for callers that want text.
    """
    passages, kept = fit_passages(
        question, hits, lambda ps: count_tokens(format_prompt(question, ps)), budget_tokens
    )
    return format_prompt(question, passages), kept


def fit_passages(
    question: str,
    hits: Sequence[SearchHit],
    size: Callable[[list[Passage]], int],
    budget_tokens: int,
) -> tuple[list[Passage], list[SearchHit]]:
    """The passages the prompt shows and the hits they come from (cited as [1], [2], ...).

    ``size(passages)`` is the whole prompt's token count with those passages (templated or
    raw, as the caller encodes it).  Passages go in rank order while the prompt fits
    ``budget_tokens``; the first that does not fit is cut at a word boundary if enough of it
    fits, and it and every lower-ranked one are otherwise dropped.  ValueError when the
    prompt without passages is already over the budget.
    """
    bare = size([])
    if bare > budget_tokens:
        raise ValueError(
            f"the question alone takes {bare} tokens, over the budget of {budget_tokens}"
        )
    kept: list[SearchHit] = []
    passages: list[Passage] = []
    for hit in hits:
        passage = Passage(hit.passage_title, hit.text)
        if size([*passages, passage]) <= budget_tokens:
            kept.append(hit)
            passages.append(passage)
            continue
        cut = _longest_fitting_cut(passages, passage, size, budget_tokens)
        if cut is not None:
            kept.append(replace(hit, text=cut))
            passages.append(Passage(passage.title, cut))
        break
    return passages, kept


# A cut passage shorter than this says too little to be worth citing.
MIN_CUT_WORDS = 12


def _longest_fitting_cut(
    passages: list[Passage],
    passage: Passage,
    size: Callable[[list[Passage]], int],
    budget_tokens: int,
) -> str | None:
    """The longest word-boundary prefix of ``passage.text`` that still fits, or None."""
    ends = [m.end() for m in re.finditer(r"\S+", passage.text)]

    def fits(words: int) -> bool:
        cut = Passage(passage.title, passage.text[: ends[words - 1]])
        return size([*passages, cut]) <= budget_tokens

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
