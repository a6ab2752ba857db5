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
# A lead-in whose only object is a citation marker (``According to [1], …``, ``As stated in [2]:``)
# says where the claim comes from, not what it claims: it is not scored.
_MARKER_RUN = r"(?:\[\d{1,3}(?:\s*[,;]\s*\d{1,3})*\]\s*)+"
_ATTRIBUTION = re.compile(
    r"^\s*(?:according\s+to|as\s+(?:stated|noted|said|described|documented|shown|explained)\s+in"
    r"|per|from|in|see)\s+(?:(?:passage|source|document)s?\s*)?" + _MARKER_RUN + r"[,:;]?\s*",
    re.IGNORECASE,
)
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
        """What is scored: the sentence without its list bullet, an attribution lead-in whose
        object is a marker (``According to [1],``) and its citation markers."""
        text = re.sub(r"^\s*(?:[-*\u2022]|\d{1,3}[.)])\s+", "", self.text)
        text = _MARKER.sub(" ", _ATTRIBUTION.sub("", text, count=1))
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
