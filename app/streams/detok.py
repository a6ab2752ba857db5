"""Incremental detokenisation: text pieces of a growing answer that add up to the stored answer.

The stored answer is ``decode(token_ids, skip_special_tokens=True).strip()`` (app/pipeline.py).
Decoding each burst on its own would break a multi-byte character split across two bursts (byte
-level BPE) and would lose the spaces some tokenizers only render in context, so every push
decodes the whole sequence so far and emits what is new. Two things are held back until later
text makes them safe: a trailing run of U+FFFD (an incomplete UTF-8 sequence that the next token
may complete) and trailing whitespace (the final ``strip()`` drops it unless more text follows).
Leading whitespace is never emitted. A sequence is at most a few hundred tokens, so decoding all of
it per burst costs microseconds beside a target forward pass.
"""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """New text per burst of token ids; the pieces add up to ``decode(all).strip()``."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = ""

    @property
    def token_ids(self) -> list[int]:
        """Every token id pushed so far (a copy)."""
        return list(self._ids)

    @property
    def emitted(self) -> str:
        """The text handed out so far."""
        return self._emitted

    def push(self, token_ids: list[int]) -> str:
        """The text that ``token_ids`` (appended to what came before) make safe to show now."""
        self._ids.extend(token_ids)
        text = self._decode(self._ids).lstrip()
        safe = text.rstrip(REPLACEMENT).rstrip()
        # A tokenizer whose rendering of earlier tokens changes with later ones would make ``safe``
        # disagree with what was sent; then wait for the final text to settle it.
        if len(safe) <= len(self._emitted) or not safe.startswith(self._emitted):
            return ""
        new = safe[len(self._emitted) :]
        self._emitted = safe
        return new

    def finish(self, final_text: str) -> str | None:
        """The rest of ``final_text`` after what was emitted; None when it does not continue it.

        ``final_text`` is the stored answer. None means the pieces sent so far are not a prefix of
        it (only possible with a tokenizer that re-renders earlier tokens); the caller then resets
        the stream and sends the whole text again.
        """
        if not final_text.startswith(self._emitted):
            return None
        rest = final_text[len(self._emitted) :]
        self._emitted = final_text
        return rest
