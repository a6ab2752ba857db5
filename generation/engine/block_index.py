"""Which prompt prefixes have their KV kept, and which block of the pool holds each: the block index.

RAG prompts recur: a popular passage opens many prompts, and a repeated question repeats the whole
prompt. So, as vLLM v1 does (``core/kv_cache_manager.py``, ``core/block_pool.py``), a prompt's
KV is kept in *full blocks* of ``block_size`` tokens, each named by a hash chain: block i's hash
covers its parent's hash and its own tokens, so equal hashes mean equal whole prefixes. The chain
starts from a *root* that names everything else that makes KV differ (the model pair, its dtype,
the device; ``root_hash``), so another model pair never meets this one's blocks. A hit is also
checked token by token (``tokens`` are kept), so a hash collision cannot hand out wrong KV.

Blocks a running request uses are *referenced* and never evicted. A block nobody references stays
cached on an LRU list and is evicted only when a new block needs its place: the least recently
released first, and within one request's blocks the tail first (``release`` frees in reverse),
so a prefix's head, shared most widely, lives longest. The pool has a fixed number of blocks
(``blocks_for_budget``: the memory setting over the bytes of one block), so the memory held never
exceeds the setting. A full pool never fails a request: ``allocate`` returns None when every block
is referenced, and the request simply prefills without caching that block.

This module only does the bookkeeping (ids, hashes, counts); the engine owns the tensors a block
id points at.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_BLOCK_SIZE = 16
"""Tokens per block (vLLM's default): the grain at which prefixes are shared."""


class PrefixCacheBudgetError(ValueError):
    """The prefix-cache memory setting cannot hold a single block."""


def root_hash(*parts: object) -> bytes:
    """Return the chain's root for KV computed under ``parts`` (model pair, dtype, device, ...)."""
    return hashlib.sha256(repr(parts).encode()).digest()


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """Return the hash of the block holding ``tokens`` after the prefix hashed as ``parent``."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def blocks_for_budget(budget_bytes: int, block_bytes: int, setting: str = "prefix cache") -> int:
    """Return how many blocks of ``block_bytes`` fit in ``budget_bytes``; refuse fewer than one."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes: must be > 0, got {block_bytes}")
    count = budget_bytes // block_bytes
    if count < 1:
        minimum = -(-block_bytes // (1 << 20))
        raise PrefixCacheBudgetError(
            f"{setting}: {budget_bytes / (1 << 20):g} MB cannot hold one KV block of "
            f"{block_bytes} bytes for this model pair; set at least {minimum} MB (or 0 for off)"
        )
    return int(count)


@dataclass(eq=False)
class CachedBlock:
    """One full block of a cached prefix."""

    block_id: int
    """Index into the engine's KV pool."""
    block_hash: bytes
    """Hash of the whole prefix up to and including this block."""
    parent_hash: bytes
    tokens: tuple[int, ...]
    """This block's own tokens (a hit is confirmed against them)."""
    ref_count: int = 0
    """Running requests using this block; a referenced block is never evicted."""
    extras: set[str] = field(default_factory=set)
    """Which optional parts the engine filled (e.g. ``"draft"``: the draft model's KV too)."""


class BlockIndex:
    """Hash-chained full blocks over a pool of ``num_blocks`` block ids, with an LRU of free ones."""

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._by_hash: dict[bytes, CachedBlock] = {}
        self._lru: OrderedDict[bytes, CachedBlock] = OrderedDict()  # unreferenced, oldest first
        self._never_used = list(range(num_blocks - 1, -1, -1))  # block ids never handed out
        self.queries = 0
        """Prompt tokens looked up (vLLM's ``prefix_cache_queries``)."""
        self.hits = 0
        """Prompt tokens found cached (vLLM's ``prefix_cache_hits``)."""
        self.evictions = 0
        """Cached blocks evicted to make room for new ones."""

    # -- reading ---------------------------------------------------------------------------
    @property
    def num_cached(self) -> int:
        """Blocks holding a cached prefix (referenced or not)."""
        return len(self._by_hash)

    @property
    def num_referenced(self) -> int:
        """Blocks some running request uses."""
        return len(self._by_hash) - len(self._lru)

    def get(self, parent: bytes, tokens: Sequence[int]) -> CachedBlock | None:
        """Return the cached block of ``tokens`` after prefix ``parent``, or None."""
        found = self._by_hash.get(block_hash(parent, tokens))
        if found is None or found.parent_hash != parent or found.tokens != tuple(tokens):
            return None
        return found

    def lookup(
        self, root: bytes, tokens: Sequence[int], need: str | None = None, count: bool = True
    ) -> list[CachedBlock]:
        """Return the blocks of the longest cached prefix of ``tokens`` (full blocks only).

        At least the last token is left out: its logits start the answer, so it is always
        computed. ``need``: stop at the first block without that extra (e.g. ``"draft"``).
        ``count``: add the lookup to ``queries`` / ``hits``.
        """
        size = self.block_size
        usable = (len(tokens) - 1) // size
        found: list[CachedBlock] = []
        parent = root
        for i in range(usable):
            block = self.get(parent, tokens[i * size : (i + 1) * size])
            if block is None or (need is not None and need not in block.extras):
                break
            found.append(block)
            parent = block.block_hash
        if count:
            self.queries += len(tokens)
            self.hits += len(found) * size
        return found

    # -- references --------------------------------------------------------------------------
    def acquire(self, blocks: Sequence[CachedBlock]) -> None:
        """Reference ``blocks`` for a running request (they leave the LRU: never evicted)."""
        for block in blocks:
            if block.ref_count == 0:
                self._lru.pop(block.block_hash, None)
            block.ref_count += 1

    def release(self, blocks: Sequence[CachedBlock]) -> None:
        """Drop one reference from each of ``blocks``; unreferenced ones join the LRU, tail first."""
        for block in reversed(blocks):
            if block.ref_count <= 0:
                raise ValueError(f"release: block {block.block_id} is not referenced")
            block.ref_count -= 1
            if block.ref_count == 0 and self._by_hash.get(block.block_hash) is block:
                self._lru[block.block_hash] = block

    # -- writing -----------------------------------------------------------------------------
    def allocate(self, parent: bytes, tokens: Sequence[int]) -> CachedBlock | None:
        """Return a new referenced block for ``tokens`` after ``parent``, or None when full.

        The caller fills the block's KV, then the block is found by ``lookup``. An id comes from
        the never-used ones first, else from the least recently released block (evicted). None:
        every block is referenced (the request prefills that block without caching it).
        """
        if len(tokens) != self.block_size:
            raise ValueError(f"allocate: a block holds {self.block_size} tokens, got {len(tokens)}")
        if self.get(parent, tokens) is not None:
            raise ValueError("allocate: that block is cached already (lookup first)")
        if self._never_used:
            block_id = self._never_used.pop()
        elif self._lru:
            _, evicted = self._lru.popitem(last=False)
            del self._by_hash[evicted.block_hash]
            block_id = evicted.block_id
            self.evictions += 1
        else:
            return None
        block = CachedBlock(block_id, block_hash(parent, tokens), parent, tuple(tokens), 1)
        self._by_hash[block.block_hash] = block
        return block

    def get_or_allocate(
        self, parent: bytes, tokens: Sequence[int]
    ) -> tuple[CachedBlock | None, bool]:
        """Return ``(block, is_new)`` for ``tokens`` after ``parent``, referenced for the caller.

        A block cached already (the one holding a prompt's last token, which ``lookup`` leaves
        out, or one another request just cached) is shared, not written twice; a new one needs
        its KV filled. ``(None, False)``: the pool is full of referenced blocks.
        """
        found = self.get(parent, tokens)
        if found is not None:
            self.acquire([found])
            return found, False
        block = self.allocate(parent, tokens)
        return block, block is not None

    def clear(self) -> int:
        """Forget every unreferenced block (invalidation); return how many were dropped.

        Referenced blocks stay until released, then drop out as they are evicted; new lookups
        under a new root never reach them.
        """
        dropped = 0
        while self._lru:
            _, block = self._lru.popitem(last=False)
            del self._by_hash[block.block_hash]
            self._never_used.append(block.block_id)
            dropped += 1
        return dropped
