"""Suffix decoding (SuffixDecoding, Snowflake; vLLM's ``method="suffix"``): drafts looked up in
suffix trees over the request's own prompt and output, and over past answers of its scope.

The trees are arctic-inference's (``arctic_inference.suffix_decoding._C.SuffixTree``, the C++
core vLLM's suffix proposer uses): each node counts how many stored suffixes pass through it, so a
match of the context's longest suffix yields the most frequent continuation with an estimated
probability per token. The number of tokens proposed follows the match: at most
``max_spec_factor`` x match length, and no token whose estimated probability falls below
``min_token_prob``. Drafts are chains (the engine verifies chains); a proposal is deterministic
given the context and the trees, so its draft distribution is one-hot on its tokens.

``SuffixMemory`` holds one tree per scope (an opaque string: the service's tenant + collection),
so one scope's answers are never proposed for another's requests; ``SuffixProposer`` is one
request's view: its own tree, grown as tokens are accepted, and its scope's tree.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

INT32_MAX = 0x7FFFFFFF


def suffix_tree_class() -> Any:
    """Return arctic-inference's ``SuffixTree`` class; ImportError naming the fix when absent."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as exc:
        raise ImportError(
            f"method 'suffix' needs arctic-inference's suffix tree ({exc}); `make venv` builds "
            "it (docs/vllm.md, 'Suffix decoding')"
        ) from exc
    return SuffixTree


def suffix_available() -> bool:
    """Whether arctic-inference's suffix tree can be imported here."""
    try:
        suffix_tree_class()
    except ImportError:
        return False
    return True


def bad_token_ids(token_ids: object, vocab_size: int | None) -> str | None:
    """Return why ``token_ids`` is not a list of token ids (None when it is one)."""
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        return f"expected a sequence of ints, got {type(token_ids).__name__}"
    for i, t in enumerate(token_ids):
        if isinstance(t, bool) or not isinstance(t, int):
            return f"token {i} is {t!r}, not an int"
        if t < 0 or t > INT32_MAX or (vocab_size is not None and t >= vocab_size):
            return f"token {i} is {t}, outside the vocabulary [0, {vocab_size or INT32_MAX})"
    return None


@dataclass
class Draft:
    """One lookup's chain: proposed tokens, their estimated probabilities, and the match."""

    token_ids: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    """Sum of ``probs``: the expected accepted tokens by the tree's counts (higher wins)."""
    match_len: int = 0
    """Tokens of the context's suffix found in the tree."""


def speculate(tree: Any, context: list[int], k: int, factor: float, min_prob: float) -> Draft:
    """Return ``tree``'s chain of at most ``k`` tokens after ``context``."""
    found = tree.speculate(context, k, factor, 0.0, min_prob, False)
    return Draft(list(found.token_ids), list(found.probs), float(found.score), found.match_len)


@dataclass
class _Scope:
    tree: Any
    seq_ids: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)
    """answer id -> (the tree's sequence id, the answer's largest token id), oldest first."""
    next_seq: int = 0


class SuffixMemory:
    """The global suffix trees over past answers, one per scope; thread-safe.

    A scope is an opaque string the service builds (tenant + collection); the engine never
    looks inside it. Bounded: at most ``max_answers_per_scope`` answers per scope (oldest out).
    An id list that is not one (a non-int, a negative id, one at or past the vocabulary once
    ``set_vocab_size`` has told it) is skipped with a warning: it is never proposed.
    """

    def __init__(self, max_answers_per_scope: int = 1000, max_depth: int = 64) -> None:
        for name, value in (("max_answers_per_scope", max_answers_per_scope),
                            ("max_depth", max_depth)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"suffix memory: {name} must be an int >= 1, got {value!r}")
        self._tree_class = suffix_tree_class()
        self.max_answers_per_scope = max_answers_per_scope
        self.max_depth = max_depth
        """Deepest path of a tree: the longest context matched, the longest chain proposed."""
        self.vocab_size: int | None = None
        self._scopes: dict[str, _Scope] = {}
        self._lock = threading.Lock()

    def set_vocab_size(self, vocab_size: int) -> None:
        """Refuse ids at or past ``vocab_size`` from now on (the engine's vocabulary); answers
        already held are kept only if every id of theirs is inside it, so none held was for
        another vocabulary. Called by the engine that takes this memory."""
        with self._lock:
            if self.vocab_size is not None and self.vocab_size != vocab_size:
                raise ValueError(
                    f"suffix memory: serves a vocabulary of {self.vocab_size} ids; an engine of "
                    f"{vocab_size} cannot share it"
                )
            self.vocab_size = vocab_size
            for scope, held in self._scopes.items():
                for answer_id, (seq, top) in list(held.seq_ids.items()):
                    if top >= vocab_size:
                        log.warning("suffix memory: answer %s of scope %s dropped: token %d "
                                    "outside the vocabulary [0, %d)",
                                    answer_id, scope, top, vocab_size)  # fmt: skip
                        held.tree.remove(seq)
                        del held.seq_ids[answer_id]

    def add(self, scope: str, answer_id: str, token_ids: Sequence[int]) -> bool:
        """Add one past answer's token ids to ``scope``'s tree; return True when the tree took it
        (False: already held, or a bad id list, which is logged and skipped)."""
        with self._lock:
            problem = bad_token_ids(token_ids, self.vocab_size)
            if problem is not None:
                log.warning("suffix memory: answer %s of scope %s skipped: %s",
                            answer_id, scope, problem)  # fmt: skip
                return False
            held = self._scopes.get(scope)
            if held is None:
                held = self._scopes[scope] = _Scope(self._tree_class(self.max_depth))
            if answer_id in held.seq_ids:
                return False
            seq = held.next_seq
            held.next_seq = (held.next_seq + 1) & INT32_MAX
            ids = list(token_ids)
            held.seq_ids[answer_id] = (seq, max(ids, default=0))
            held.tree.extend(seq, ids)
            while len(held.seq_ids) > self.max_answers_per_scope:
                _, (oldest, _top) = held.seq_ids.popitem(last=False)
                held.tree.remove(oldest)
            return True

    def remove(self, scope: str, answer_id: str) -> None:
        """Forget one answer (unknown scope or id: nothing happens)."""
        with self._lock:
            held = self._scopes.get(scope)
            if held is not None and answer_id in held.seq_ids:
                held.tree.remove(held.seq_ids.pop(answer_id)[0])

    def drop_scope(self, scope: str) -> None:
        """Forget every answer of ``scope``."""
        with self._lock:
            self._scopes.pop(scope, None)

    def scopes(self) -> list[str]:
        """The scopes holding at least one answer, sorted."""
        with self._lock:
            return sorted(s for s, held in self._scopes.items() if held.seq_ids)

    def size(self, scope: str) -> int:
        """Answers ``scope`` holds."""
        with self._lock:
            held = self._scopes.get(scope)
            return len(held.seq_ids) if held is not None else 0

    def memory_bytes(self) -> int:
        """Bytes the trees take, as arctic-inference's ``estimate_memory`` counts them (nodes,
        child maps, stored sequences), plus the answer-id maps."""
        with self._lock:
            total = 0
            for held in self._scopes.values():
                total += int(held.tree.estimate_memory())
                total += sum(100 + len(a) for a in held.seq_ids)  # key, int, dict entry
            return total

    def speculate(
        self, scope: str, context: list[int], k: int, factor: float, min_prob: float
    ) -> Draft:
        """Return ``scope``'s chain of at most ``k`` tokens after ``context`` (empty without
        answers)."""
        with self._lock:
            held = self._scopes.get(scope)
            if held is None or not held.seq_ids:
                return Draft()
            return speculate(held.tree, context[-self.max_depth :], k, factor, min_prob)


class SuffixProposer:
    """One request's suffix lookups: its own tree over prompt and output, and its scope's.

    The request's tree grows with its tokens (only accepted tokens enter ``tokens``, so nothing
    is ever taken back); each lookup matches the context's last ``max_depth`` tokens in both
    trees and keeps the chain with the higher score, as arctic-inference's cache does.
    """

    def __init__(
        self,
        memory: SuffixMemory | None,
        scope: str | None,
        max_depth: int = 64,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        max_tokens: int = 32,
    ) -> None:
        self.memory = memory if scope is not None else None
        self.scope = scope
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.max_tokens = max_tokens
        """Longest chain when the request asks ``"auto"`` (a fixed k caps it at k)."""
        self._tree = suffix_tree_class()(max_depth)
        self._indexed = 0
        self.from_memory = 0
        """Rounds whose chain came from the scope's tree (the rest: the request's own)."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Return up to ``k`` tokens continuing ``tokens`` (the request's tree catches up)."""
        if len(tokens) > self._indexed:
            self._tree.extend(0, tokens[self._indexed :])
            self._indexed = len(tokens)
        context = tokens[-self.max_depth :]
        factor, min_prob = self.max_spec_factor, self.min_token_prob
        best = speculate(self._tree, context, k, factor, min_prob)
        if self.memory is not None and self.scope is not None:
            shared = self.memory.speculate(self.scope, context, k, factor, min_prob)
            if shared.score > best.score:
                best = shared
                self.from_memory += 1
        return best.token_ids[:k]
