"""Token-aware chunking: sections to passages of about ``chunk_tokens`` embedding-model tokens.

It exists because the embedding model truncates long inputs, so a passage must be sized in that
model's own tokens; it cuts only between words (whitespace), prefers a paragraph or sentence end
near the limit, overlaps consecutive passages by about ``overlap`` tokens, never crosses a
heading, and is a pure function of its input (deterministic).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from retrieval.loaders import LoadedDocument

_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"[.!?:;][\"')\]]*$")
# A break this far into the chunk (fraction of the budget) is better than a full chunk cut mid-thought.
_MIN_BREAK_FRACTION = 0.7


@dataclass(frozen=True)
class ChunkDraft:
    """A passage before it has a database id."""

    position: int
    title: str
    heading: str | None
    text: str
    token_count: int

    @property
    def passage_title(self) -> str:
        """``"<title> — <heading>"`` or just the title (the prompt's passage header)."""
        if self.heading and self.heading != self.title:
            return f"{self.title} — {self.heading}"
        return self.title


def embedding_text(title: str, heading: str | None, text: str) -> str:
    """What is embedded for a chunk: its passage title, then its text (context helps recall)."""
    header = f"{title} — {heading}" if heading and heading != title else title
    return f"{header}\n{text}"


class Chunker:
    """Splits documents into ``ChunkDraft``s sized in the given tokenizer's tokens."""

    def __init__(self, tokenizer: Any, chunk_tokens: int = 224, overlap: int = 32) -> None:
        if chunk_tokens < 16:
            raise ValueError(f"chunk_tokens must be at least 16, got {chunk_tokens}")
        if not 0 <= overlap < chunk_tokens // 2:
            raise ValueError(f"chunk overlap must be in [0, {chunk_tokens // 2}), got {overlap}")
        self.chunk_tokens = chunk_tokens
        self.overlap = overlap
        # The Rust tokenizer gives offsets for a whole section in one call, without the
        # transformers wrapper's "sequence too long" warnings.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = None
        if backend is not None:
            from tokenizers import Tokenizer  # optional: HF tokenizers

            # A private copy: the model's own tokenizer truncates (to 128 here) and is shared.
            self._backend = Tokenizer.from_str(backend.to_str())
            self._backend.no_truncation()
            self._backend.no_padding()
        self._tokenizer = tokenizer

    def chunk(self, doc: LoadedDocument) -> list[ChunkDraft]:
        """The document's passages in reading order, numbered from 0."""
        drafts: list[ChunkDraft] = []
        for section in doc.sections:
            for text, tokens in self.split(section.text):
                drafts.append(ChunkDraft(len(drafts), doc.title, section.heading, text, tokens))
        return drafts

    def split(self, text: str) -> list[tuple[str, int]]:
        """``(passage text, token count)`` pieces of one section."""
        spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
        if not spans:
            return []
        counts = self._word_token_counts(text, spans)
        pieces: list[tuple[str, int]] = []
        start, n = 0, len(spans)
        while start < n:
            end, total = start, 0
            while end < n and (end == start or total + counts[end] <= self.chunk_tokens):
                total += counts[end]
                end += 1
            if end < n:
                end = self._best_break(text, spans, counts, start, end)
            total = sum(counts[start:end])
            pieces.append((text[spans[start][0] : spans[end - 1][1]], total))
            if end >= n:
                break
            # Step back over about `overlap` tokens, always moving forward at least one word.
            back, overlap_tokens = end, 0
            while back - 1 > start and overlap_tokens + counts[back - 1] <= self.overlap:
                back -= 1
                overlap_tokens += counts[back]
            start = back
        return pieces

    def _best_break(
        self, text: str, spans: list[tuple[int, int]], counts: list[int], start: int, end: int
    ) -> int:
        """The end word index (exclusive) to cut at: a paragraph end, else a sentence end,
        in the last part of the chunk; else ``end`` itself."""
        floor = self.chunk_tokens * _MIN_BREAK_FRACTION
        total = sum(counts[start:end])
        sentence: int | None = None
        for cut in range(end, start, -1):
            if total < floor:
                break
            gap = text[spans[cut - 1][1] : spans[cut][0]] if cut < len(spans) else "\n\n"
            if "\n\n" in gap:
                return cut
            if sentence is None and _SENTENCE_END.search(
                text[spans[cut - 1][0] : spans[cut - 1][1]]
            ):
                sentence = cut
            total -= counts[cut - 1]
        return sentence or end

    def _word_token_counts(self, text: str, spans: list[tuple[int, int]]) -> list[int]:
        counts = [0] * len(spans)
        if self._backend is None:
            return [len(self._tokenizer.tokenize(text[a:b])) for a, b in spans]
        encoding = self._backend.encode(text, add_special_tokens=False)
        starts = [a for a, _ in spans]
        word = 0
        # Word-piece tokens never straddle whitespace, so each lies inside exactly one word.
        for token_start, _ in encoding.offsets:
            while word + 1 < len(starts) and starts[word + 1] <= token_start:
                word += 1
            counts[word] += 1
        # A word the tokenizer drops entirely (control characters) still costs nothing.
        return counts
