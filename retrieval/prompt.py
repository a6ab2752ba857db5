"""The product's prompt: numbered passages for citation, the question, then the answer.

The demo model pair is trained on exactly this format, so changing it means retraining.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    """The prompt for ``question`` and the hits it cites as [1], [2], ... in that order."""
    raise NotImplementedError
