"""Prompt-lookup proposer: no model, the context itself predicts the continuation.

In RAG the prompt holds the retrieved passages and answers quote them, so the longest recent
n-gram of the sequence (n from ``max_n`` down to ``min_n``) is searched earlier in the
context and the tokens that followed it are proposed. Its draft distribution is one-hot on the
proposed tokens.
"""

from __future__ import annotations

from bisect import bisect_right


def pick_start(starts: list[int], n: int, k: int, seq_len: int) -> int | None:
    """Return where the proposal begins, given the sorted earlier ``starts`` of the suffix n-gram.

    The most recent match with ``k`` following tokens wins (answers quote nearby text); when
    none has ``k``, the earliest (longest continuation) does — in a repetitive stream the most
    recent match sits just before the suffix and would leave a single token.
    """
    # Matches must end before the suffix begins, so that at least one token follows them.
    usable = bisect_right(starts, seq_len - n - 1)
    if usable == 0:
        return None
    full = bisect_right(starts, seq_len - n - k, hi=usable)
    return (starts[full - 1] if full else starts[0]) + n


class NgramProposer:
    """Drafts by prompt lookup from an index of every n-gram's start positions.

    The index grows with the sequence (``max_n`` dictionary updates per token), so a lookup
    costs ``max_n`` dictionary reads however long the context is (tests/generation check it
    against a direct scan).
    """

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n = max_n
        self.min_n = min_n
        self._index: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_n + 1)]
        self._indexed = 0

    def _extend(self, tokens: list[int]) -> None:
        for end in range(self._indexed + 1, len(tokens) + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(tokens[end - n : end])
                self._index[n].setdefault(key, []).append(end - n)
        self._indexed = len(tokens)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Return up to ``k`` looked-up tokens continuing ``tokens`` (the index catches up)."""
        self._extend(tokens)
        seq_len = len(tokens)
        found: list[int] = []
        for n in range(min(self.max_n, seq_len - 1), self.min_n - 1, -1):
            starts = self._index[n].get(tuple(tokens[seq_len - n :]))
            start = pick_start(starts, n, k, seq_len) if starts else None
            if start is not None:
                found = tokens[start : start + k]
                break
        return found
