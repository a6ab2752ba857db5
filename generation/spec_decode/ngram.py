"""Prompt lookup: in RAG the prompt holds the retrieved passages and answers quote them, so the
longest recent n-gram is searched earlier in the context and the tokens that followed it are
proposed.
"""

from __future__ import annotations

from bisect import bisect_right


def pick_start(starts: list[int], n: int, k: int, seq_len: int) -> int | None:
    """Return where the proposal begins, given the sorted earlier ``starts`` of the suffix n-gram.

    The most recent match with ``k`` following tokens wins (answers quote nearby text); when
    none has ``k``, the earliest (longest continuation) does: in a repetitive stream the most
    recent match sits just before the suffix and would leave a single token.
    """
    # Matches must end before the suffix begins, so that at least one token follows them.
    usable = bisect_right(starts, seq_len - n - 1)
    if usable == 0:
        return None
    full = bisect_right(starts, seq_len - n - k, hi=usable)
    return (starts[full - 1] if full else starts[0]) + n


class NgramProposer:
    """Prompt lookup (n from ``max_n`` down to 1) over an index of every n-gram's starts.

    The index grows with the sequence, so a lookup costs ``max_n`` dictionary reads however long
    the context is (tests/generation check it against a direct scan).
    """

    def __init__(self, max_n: int = 4) -> None:
        if max_n < 1:
            raise ValueError(f"ngram: max_n must be >= 1, got {max_n}")
        self.max_n = max_n
        self._index: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_n + 1)]
        self._indexed = 0

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Return up to ``k`` looked-up tokens continuing ``tokens`` (the index catches up)."""
        for end in range(self._indexed + 1, len(tokens) + 1):
            for n in range(1, min(self.max_n, end) + 1):
                self._index[n].setdefault(tuple(tokens[end - n : end]), []).append(end - n)
        self._indexed = seq_len = len(tokens)
        for n in range(min(self.max_n, seq_len - 1), 0, -1):
            starts = self._index[n].get(tuple(tokens[seq_len - n :]))
            start = pick_start(starts, n, k, seq_len) if starts else None
            if start is not None:
                return tokens[start : start + k]
        return []
