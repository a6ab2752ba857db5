"""Prompt-lookup proposer: no model, the context itself predicts the continuation.

In RAG the prompt holds the retrieved passages and answers quote them, so the longest recent
n-gram of the sequence (n from ``max_n`` down to ``min_n``) is searched earlier in the
context and the tokens that followed its most recent earlier occurrence are proposed.
Its draft distribution is one-hot on the proposed tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from generation.proposers.base import Draft


def find_continuation(tokens: np.ndarray, k: int, max_n: int, min_n: int = 1) -> np.ndarray:
    """Return up to ``k`` tokens that followed an earlier match of the longest suffix n-gram.

    ``tokens``: [seq_len] int64. Longer matches are tried first because they predict better.
    Among matches of one length the most recent with ``k`` following tokens wins (answers quote
    nearby text); when none has ``k``, the earliest (longest continuation) does — in a
    repetitive stream the most recent match is just before the suffix and leaves one token.
    """
    seq_len = tokens.shape[0]
    for n in range(min(max_n, seq_len - 1), min_n - 1, -1):
        suffix = tokens[seq_len - n :]
        # windows[i] = tokens[i : i + n]; only starts whose match ends before the suffix starts
        # (i + n < seq_len) leave at least one following token to propose.
        windows = sliding_window_view(tokens[: seq_len - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            full = hits[hits + n + k <= seq_len]
            start = int(full[-1] if full.size else hits[0]) + n
            return tokens[start : min(start + k, seq_len)]
    return tokens[:0]


class NgramProposer:
    """Drafts by prompt lookup; stateless between rounds apart from a host copy of the ids."""

    def __init__(self, device: torch.device, max_n: int = 4, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.device = device
        self.max_n = max_n
        self.min_n = min_n
        self._buffer = np.zeros(0, dtype=np.int64)
        self._len = 0

    def begin(self, tokens: list[int]) -> None:
        """Copy the prompt into a growable host buffer (no per-round list conversion)."""
        self._buffer = np.zeros(max(64, 2 * len(tokens)), dtype=np.int64)
        self._len = 0
        self._sync(tokens)

    def _sync(self, tokens: list[int]) -> None:
        if len(tokens) > self._buffer.shape[0]:
            grown = np.zeros(2 * len(tokens), dtype=np.int64)
            grown[: self._len] = self._buffer[: self._len]
            self._buffer = grown
        self._buffer[self._len : len(tokens)] = tokens[self._len :]
        self._len = len(tokens)

    def propose(
        self, tokens: list[int], k: int, temperature: float, generator: torch.Generator | None
    ) -> Draft:
        """Return the looked-up continuation (possibly empty) with a one-hot distribution."""
        self._sync(tokens)
        found = find_continuation(self._buffer[: self._len], k, self.max_n, self.min_n)
        return Draft(token_ids=torch.from_numpy(found.copy()).to(self.device), probs=None)

    def rollback(self, tokens: list[int], num_draft_tokens: int, num_accepted: int) -> None:
        """Nothing to undo: drafts never entered the buffer."""
