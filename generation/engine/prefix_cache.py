"""Exact prefix reuse: KV of computed prompt blocks kept in a bounded pool, copied into new slots.

``PrefixCache`` pairs the block index (generation/engine/block_index.py: hash chains, LRU, references)
with the tensors it indexes: per model and layer, keys and values ``[num_blocks, block_size,
kv_heads, head_dim]``, a slot's positions in the KV store (generation/model/kv_store.py, ``slot_kv``). A
request that starts with a cached prefix gets that prefix's keys and values *copied* into its slot
and prefills only the rest; when its prompt is prefilled, its full blocks not cached yet are copied
out of the slot into the pool. A slot owns its copy, so a block is referenced only while it is
copied (a block being filled is never handed to an eviction), and attention reads the dense slot
exactly as before.

Exactness: a position's keys and values depend only on the tokens up to it, so the copied prefix
holds what the request's own prefill would have computed (to the last bit only where the same
kernel ran the same chunking; otherwise as chunked prefill differs, ties excused as today). The
draft model's KV rides in the same blocks: a draft-model request reuses only blocks that carry
it (``"draft"`` extra), and fills it into a block cached by a request that ran no draft.

The pools are allocated once, at their bound (``blocks_for_budget``), and written through
(``torch.zeros``) so the operating system commits every page at the engine's start: the bytes held
never exceed the setting, and no prefill pays for first-touch page faults while the pool fills.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from generation.engine.block_index import (
    DEFAULT_BLOCK_SIZE,
    BlockIndex,
    CachedBlock,
    blocks_for_budget,
    root_hash,
)
from generation.model.kv_store import KVShape, SlotKV

SETTING = "SPECRAG_PREFIX_CACHE_MB"
DRAFT = "draft"


class ModelBlocks:
    """One model's keys and values of every block in the pool, per layer."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int, device: torch.device):
        size = (num_blocks, block_size, shape.kv_heads, shape.head_dim)
        # Zeros, not empty: the pages are committed now, not by the prefills that fill them
        # (a fault per 4 KB page inside a prefill's save).
        self.keys = [
            torch.zeros(size, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)
        ]
        self.values = [
            torch.zeros(size, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)
        ]
        self.block_size = block_size

    def nbytes(self) -> int:
        """Bytes this model's pool holds at most."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def load(self, blocks: Sequence[CachedBlock], slot: SlotKV) -> None:
        """Copy ``blocks`` (a prefix, in order) into the slot's first positions."""
        n = len(blocks) * self.block_size
        ids = torch.tensor(
            [b.block_id for b in blocks], dtype=torch.long, device=self.keys[0].device
        )
        for pool, dst in ((self.keys, slot[0]), (self.values, slot[1])):
            for layer, src in enumerate(pool):
                dst[layer][:n] = src.index_select(0, ids).flatten(0, 1)

    def save(self, blocks: Sequence[tuple[CachedBlock, int]], slot: SlotKV) -> None:
        """Copy each slot block number ``index`` (positions index*size ...) into its ``block``
        (pairs ``(block, index)``, indices ascending): per layer one gather of those positions
        and one copy into the pool, not a copy per block."""
        if not blocks:
            return
        size = self.block_size
        ids = torch.tensor([b.block_id for b, _ in blocks], device=self.keys[0].device)
        indices = [i for _, i in blocks]
        first, count = indices[0], len(indices)
        if indices == list(range(first, first + count)):  # a run of blocks: one slice
            positions: Any = slice(first * size, (first + count) * size)
        else:
            positions = torch.tensor(
                [i * size + j for i in indices for j in range(size)], device=ids.device
            )
        for pool, src in ((self.keys, slot[0]), (self.values, slot[1])):
            for layer, dst in enumerate(pool):
                dst.index_copy_(0, ids, src[layer][positions].unflatten(0, (count, size)))


class PrefixCache:
    """The worker's prefix cache: one bounded pool of blocks for the target and (optionally) draft.

    ``budget_bytes``: the memory setting; a budget that cannot hold one block is refused
    (``PrefixCacheBudgetError``, naming the minimum). ``root``: everything that makes KV differ
    (generation/engine/block_index.py ``root_hash``).
    """

    def __init__(
        self,
        budget_bytes: int,
        root: bytes,
        target: KVShape,
        draft: KVShape | None = None,
        *,
        device: torch.device | str = "cpu",
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        per_token = target.bytes_per_token() + (draft.bytes_per_token() if draft else 0)
        self.block_bytes = per_token * block_size
        self.budget_bytes = budget_bytes
        num_blocks = blocks_for_budget(budget_bytes, self.block_bytes, SETTING)
        self.index = BlockIndex(num_blocks, block_size)
        self.root = root
        dev = torch.device(device)
        self.target = ModelBlocks(target, num_blocks, block_size, dev)
        self.draft = ModelBlocks(draft, num_blocks, block_size, dev) if draft else None
        # The loop's thread reuses and keeps; a reset may come from any thread.
        self._lock = threading.Lock()

    @classmethod
    def for_models(
        cls, megabytes: float, target: Any, draft: Any | None, label: str, block_size: int
    ) -> PrefixCache | None:
        """The cache for a loaded pair at ``megabytes`` (None when 0: reuse off).

        The root names the pair, its dtypes and device, and this engine instance's weights
        (``id``): another checkpoint is another engine, and its cache starts empty.
        """
        if megabytes <= 0:
            return None
        target_shape = KVShape.of(target)
        draft_shape = KVShape.of(draft) if draft is not None else None
        device = next(target.parameters()).device
        root = root_hash(
            label, target_shape, draft_shape, str(device), id(target), id(draft), block_size
        )
        budget = int(megabytes * (1 << 20))
        return cls(budget, root, target_shape, draft_shape, device=device, block_size=block_size)

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.index.block_size

    def nbytes(self) -> int:
        """Bytes the pools hold at most (never above ``budget_bytes``)."""
        return self.target.nbytes() + (self.draft.nbytes() if self.draft else 0)

    def root_for(self, salt: str | None) -> bytes:
        """Return the chain's root for requests salted with ``salt`` (None: the unsalted root)."""
        return self.root if salt is None else root_hash(self.root, salt)

    def reuse(
        self, prompt: Sequence[int], target: SlotKV, draft: SlotKV | None, salt: str | None = None
    ) -> int:
        """Copy the longest cached prefix of ``prompt`` into the slot; return its length in tokens.

        ``draft``: the slot of the draft model when the request drafts with it (only blocks that
        carry the draft's KV are then reused). ``salt``: only blocks kept under the same salt are
        found. The caller sets the slot lengths.
        """
        need = DRAFT if draft is not None else None
        with self._lock:
            blocks = self.index.lookup(self.root_for(salt), prompt, need=need)
            if not blocks:
                return 0
            self.index.acquire(blocks)
            try:
                self.target.load(blocks, target)
                if draft is not None and self.draft is not None:
                    self.draft.load(blocks, draft)
            finally:
                self.index.release(blocks)
        return len(blocks) * self.block_size

    def keep(
        self, prompt: Sequence[int], target: SlotKV, draft: SlotKV | None, salt: str | None = None
    ) -> int:
        """Cache the full blocks of ``prompt`` whose KV the slot now holds; return how many are new.

        A block cached already is left as it is (its draft part filled in when it lacks one and
        ``draft`` has it). Stops at the first block the pool has no room for: every block is in
        use, so the rest of this prompt is not cached (the request itself is unaffected).
        """
        size, index = self.block_size, self.index
        with_draft = draft is not None and self.draft is not None
        parent, held = self.root_for(salt), []
        to_target: list[tuple[CachedBlock, int]] = []
        to_draft: list[tuple[CachedBlock, int]] = []
        self._lock.acquire()
        try:
            for i in range(len(prompt) // size):
                block, is_new = index.get_or_allocate(parent, prompt[i * size : (i + 1) * size])
                if block is None:
                    break
                held.append(block)
                if is_new:
                    to_target.append((block, i))
                if with_draft and DRAFT not in block.extras:
                    to_draft.append((block, i))
                    block.extras.add(DRAFT)
                parent = block.block_hash
            self.target.save(to_target, target)
            if to_draft:
                assert self.draft is not None and draft is not None
                self.draft.save(to_draft, draft)
            new = len(to_target)
        finally:
            index.release(held)
            self._lock.release()
        return new

    def reset(self) -> int:
        """Forget every cached prefix (a new index of passages, an operator's wish); return how many."""
        with self._lock:
            return self.index.clear()
