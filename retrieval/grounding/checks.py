"""Lexical evidence for one claim against one passage: containment and the checks behind it.

It exists because similarity alone does not tell a sentence from the same sentence with a number,
a name or a negation changed (their embeddings are nearly the same), and word containment alone
misses a negation (``not`` is a stop word of the BM25 analyser). Terms come from the analyser the
lexical index uses (``retrieval.terms``), so ``os.path.join`` or ``1,000`` match here exactly as
they match in search. Everything is pure text work, deterministic and cheap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.terms import names, terms

_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nothing|neither|nor|cannot|without|unless)\b|n't\b", re.IGNORECASE
)
# Capitalised words inside a sentence name things (``Python``, ``AssertionError``).
_PROPER = re.compile(r"(?<=[\w,;:] )[A-Z][A-Za-z0-9_]+")


def content_terms(text: str) -> set[str]:
    """The distinct BM25 terms of ``text`` (stop words dropped, names whole and split)."""
    return set(terms(text))


def containment(claim_terms: set[str], passage_terms: set[str]) -> float:
    """Share of the claim's terms that the passage holds (1.0 for a claim without terms)."""
    if not claim_terms:
        return 1.0
    return len(claim_terms & passage_terms) / len(claim_terms)


def numbers(text: str) -> set[str]:
    """The numbers written in ``text``, thousands separators dropped (``1,000`` → ``1000``)."""
    found = set()
    for match in _NUMBER.finditer(text):
        value = match.group(0).rstrip(".,")
        found.add(value.replace(",", "") if re.fullmatch(r"\d{1,3}(,\d{3})+", value) else value)
    return found


def named(text: str) -> set[str]:
    """The names ``text`` writes: code names (``retrieval.terms.names``) and capitalised words
    after the first word, lowercased as the analyser keeps them."""
    found = {n.lower() for n in names(text)}
    found |= {m.group(0).lower() for m in _PROPER.finditer(text)}
    return found


def negated(text: str) -> bool:
    """Whether ``text`` carries a negation (``not``, ``never``, ``cannot``, ``n't``, ...)."""
    return _NEGATION.search(text) is not None


def negated_terms(text: str, reach: int = 3) -> set[str]:
    """The terms of the ``reach`` words after each negation cue: what ``text`` says is not so."""
    out: set[str] = set()
    for match in _NEGATION.finditer(text):
        words = text[match.end() :].split()[:reach]
        out |= set(terms(" ".join(words)))
    return out


def negation_mismatch(
    claim: str, claim_terms: set[str], window: str, window_terms: set[str]
) -> bool:
    """Whether claim and window disagree on what is negated: a term negated in one and present,
    not negated, in the other (``is not defined`` against ``is defined``, either way round)."""
    in_claim, in_window = negated_terms(claim), negated_terms(window)
    return bool((in_claim & window_terms) - in_window) or bool((in_window & claim_terms) - in_claim)


@dataclass(frozen=True)
class Evidence:
    """The lexical features of one (claim, passage) pair, as the fused score reads them."""

    containment: float
    """Share of the claim's terms found anywhere in the passage."""
    window_containment: float
    """Share found in the passage's best window (one or two consecutive sentences)."""
    window: int
    """Index of that window in the windows given."""
    missing_number: float
    """1.0 when the claim writes a number the passage does not, else 0.0."""
    missing_name: float
    """Share of the claim's names the passage does not hold."""
    negation_mismatch: float
    """1.0 when the claim and its best window disagree on what is negated."""


def evidence(
    claim: str,
    claim_terms: set[str],
    passage: str,
    passage_terms: set[str],
    windows: Sequence[tuple[str, set[str]]],
) -> Evidence:
    """The claim's lexical evidence in one passage, given the passage's windows and their terms."""
    best, best_share = 0, -1.0
    for i, (_, window_terms) in enumerate(windows):
        share = containment(claim_terms, window_terms)
        if share > best_share:
            best, best_share = i, share
    window_text, window_terms = windows[best] if windows else (passage, passage_terms)
    claim_numbers = numbers(claim)
    missing_number = float(bool(claim_numbers - numbers(passage)))
    claim_names = named(claim)
    passage_lower = passage.lower()
    missing = [n for n in claim_names if n not in passage_terms and n not in passage_lower]
    missing_name = len(missing) / len(claim_names) if claim_names else 0.0
    return Evidence(
        containment=containment(claim_terms, passage_terms),
        window_containment=max(best_share, 0.0),
        window=best,
        missing_number=missing_number,
        missing_name=missing_name,
        negation_mismatch=float(negation_mismatch(claim, claim_terms, window_text, window_terms)),
    )
