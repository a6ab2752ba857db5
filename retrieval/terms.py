"""Lexical terms of a text: identifiers kept whole and also split, words, numbers.

It exists because exact names (``os.path.join``, ``__init_subclass__``, ``PYTHONSAFEPATH``,
``ERR-4012``, ``1,000``) are what dense embeddings blur, and a search engine's stock analyser
either keeps them whole (no match on a part) or splits them (no match on the whole name). Here a
text yields, for every span of word characters joined by ``. - : /`` or underscores:

- the whole span, lowercased (``os.path.join``, ``__init_subclass__``, ``err-4012``);
- for dotted names, every dotted suffix (``path.join``), which is how names are often written;
- its parts: split at the joiners, at underscores and at case changes (``CamelCase`` →
  ``camel``, ``case``; ``HTTPServer`` → ``http``, ``server``), numbers kept whole.

Numbers with thousands separators (``1,000,000``) are one span, also indexed without the commas.
English function words are dropped (they only cost time: BM25 gives them almost no weight) and
every term is cut to ``MAX_TERM_CHARS``. The function is pure and deterministic: the same text
gives the same terms on every host, and a question goes through the very same analysis, so
nothing in a question is ever read as query syntax.
"""

from __future__ import annotations

import re
from functools import lru_cache

MAX_TERM_CHARS = 64
# A question this long in terms is enough: the rest only costs time.
MAX_QUERY_TERMS = 64
SPAN_CACHE = 1 << 16
"""Distinct spans whose terms a process keeps (a few MB; least recently used let go)."""

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?"
_SPAN = re.compile(rf"{_NUMBER}|\w+(?:[.\-:/]\w+)*")
_JOINERS = re.compile(r"[.\-:/,_]+")
_CASE_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")

STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves""".split()
)


def _bounded(term: str) -> str:
    return term[:MAX_TERM_CHARS]


def _parts(piece: str) -> list[str]:
    # Case changes split ASCII names only; other scripts' words stay whole.
    if not piece.isascii():
        return [piece.lower()]
    return [m.group(0).lower() for m in _CASE_PARTS.finditer(piece)]


@lru_cache(maxsize=SPAN_CACHE)
def span_terms(span: str) -> tuple[str, ...]:
    """The terms of one span: whole (and dotted suffixes) and parts, without duplicates.
    Memoised: a span's terms depend on its text alone, and text repeats its words (ingest,
    queries and grounding analyse the same words again and again)."""
    whole = span.lower()
    pieces = [p for p in _JOINERS.split(span) if p]
    parts = [part for piece in pieces for part in _parts(piece)]
    out: list[str] = []
    if parts != [whole]:
        out.append(whole)
        if "." in whole and "," not in whole:
            dotted = [p for p in whole.split(".") if p]
            out += [".".join(dotted[i:]) for i in range(1, len(dotted) - 1)]
        if "," in whole:  # 1,000,000 -> 1000000 as well
            out.append(whole.replace(",", ""))
    out += parts
    seen: set[str] = set()
    unique = []
    for term in out:
        term = _bounded(term)
        if term not in seen and term not in STOP_WORDS:
            seen.add(term)
            unique.append(term)
    return tuple(unique)


def terms(text: str) -> list[str]:
    """Every term of ``text`` in order (repeats kept: they are BM25's term frequencies)."""
    return [t for m in _SPAN.finditer(text) for t in span_terms(m.group(0))]


def query_terms(question: str) -> list[str]:
    """A question's distinct terms, in order, at most ``MAX_QUERY_TERMS`` (may be empty:
    a question of punctuation or function words only has no lexical leg)."""
    seen: dict[str, None] = {}
    for term in terms(question):
        seen.setdefault(term, None)
        if len(seen) >= MAX_QUERY_TERMS:
            break
    return list(seen)


def names(question: str) -> list[str]:
    """The spans of ``question`` written as code names: with a joiner or underscore, a case
    change inside, letters and digits mixed, or all capitals (``DEDENT``); plain words are not."""
    found = []
    for match in _SPAN.finditer(question):
        span = match.group(0)
        if (
            _JOINERS.search(span.strip("_")) is not None
            or span.startswith("__")
            or re.search(r"[a-z][A-Z]", span) is not None
            or (re.search(r"\d", span) is not None and re.search(r"[^\W\d]", span) is not None)
            or (len(span) >= 3 and span.isupper() and span.isalpha())
        ):
            found.append(span)
    return found


def chunk_terms(title: str, heading: str | None, text: str) -> str:
    """What the lexical index stores for a chunk: its title, heading and text's terms,
    space-separated (a term never holds a space), as ``chunks.lexical_terms`` keeps them."""
    header = f"{title} {heading}" if heading and heading != title else title
    return " ".join(terms(f"{header}\n{text}"))
