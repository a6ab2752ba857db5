"""An answer's sentences with their character spans and the citation markers each one carries.

It exists because grounding is judged per sentence and shown per sentence: the product marks
spans of the answer exactly as generated, so every sentence keeps its ``start``/``end`` in the
original text and nothing is rewritten. A sentence ends at ``.``, ``!`` or ``?`` followed by
white space (citation markers right after the stop still belong to it: ``… in 3.12. [2] Next``),
at a blank line, or before a list item on a new line; a single newline inside a paragraph is
white space (passages are hard-wrapped). Known abbreviations (``e.g.``) and decimals do not end
a sentence. Markers are ``[n]``, ``[n, m]`` or runs of them; ``n`` counts from 1, as the prompt
numbers its passages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MARKER = re.compile(r"\[(\d{1,3}(?:\s*[,;]\s*\d{1,3})*)\]")
# A stop, closing quotes/brackets, then markers, then white space: the boundary is after them.
_STOP = re.compile(r"[.!?][\"')\]]*(?:\s*\[\d{1,3}(?:\s*[,;]\s*\d{1,3})*\])*(?=\s)")
_BREAK = re.compile(r"\n[ \t]*\n\s*|\n(?=[ \t]*(?:[-*\u2022]|\d{1,3}[.)])\s)")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "mr.", "dr.", "no.", "approx.")
MIN_CHARS = 2
"""Shorter pieces (a stray bullet, a lone marker) are not sentences."""


@dataclass(frozen=True)
class Sentence:
    """One sentence: its text as written, its span ``[start, end)`` and its citation markers."""

    text: str
    start: int
    end: int
    markers: tuple[int, ...] = ()
    """The ``[n]`` numbers in the sentence, in order, without repeats (1-based)."""

    @property
    def claim(self) -> str:
        """The sentence without its citation markers and list bullet: what is scored."""
        text = _MARKER.sub(" ", self.text)
        text = re.sub(r"^\s*(?:[-*\u2022]|\d{1,3}[.)])\s+", "", text)
        return " ".join(text.split())


def markers(text: str) -> tuple[int, ...]:
    """The citation numbers in ``text`` in order of appearance, each once."""
    seen: dict[int, None] = {}
    for match in _MARKER.finditer(text):
        for part in re.split(r"[,;]", match.group(1)):
            seen.setdefault(int(part), None)
    return tuple(seen)


def _boundaries(text: str) -> list[int]:
    cuts = []
    for match in _STOP.finditer(text):
        before = text[: match.start() + 1].lower()
        if before.endswith(_ABBREVIATIONS) and match.group(0)[0] == ".":
            continue
        cuts.append(match.end())
    cuts += [m.start() for m in _BREAK.finditer(text)]
    return sorted(set(cuts))


def split_sentences(text: str) -> list[Sentence]:
    """The sentences of ``text`` with spans into ``text`` (outer white space excluded)."""
    out: list[Sentence] = []
    start = 0
    for cut in [*_boundaries(text), len(text)]:
        piece = text[start:cut]
        lead = len(piece) - len(piece.lstrip())
        body = piece.strip()
        if body:
            sentence = Sentence(body, start + lead, start + lead + len(body), markers(body))
            if len(sentence.claim) >= MIN_CHARS:
                out.append(sentence)
            elif out and sentence.markers:
                # A lone marker after a sentence (``… ends here.\n[2]``) cites that sentence.
                last = out[-1]
                out[-1] = Sentence(
                    text[last.start : sentence.end],
                    last.start,
                    sentence.end,
                    tuple(dict.fromkeys(last.markers + sentence.markers)),
                )
        start = cut
    return out
