"""The prefix-cache block index: hash chains, references, LRU eviction, the memory bound.

Checked against a brute-force reference (every cached prefix as a tuple, eviction by scanning
for the oldest release) on random traffic of recurring passages (hypothesis).
"""

from __future__ import annotations

import ctypes
import os
import random
import sys
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from generation.engine.block_index import (
    BlockIndex,
    CachedBlock,
    PrefixCacheBudgetError,
    blocks_for_budget,
    root_hash,
)
from generation.engine.prefix_cache import PrefixCache
from generation.model.kv_store import KVShape, SlotKV

ROOT = root_hash("target", "draft", "float32", "cpu")


def serve(index: BlockIndex, root: bytes, prompt: list[int]) -> list[CachedBlock]:
    """What the engine does for one prompt: reuse the cached head, cache the full blocks after it."""
    blocks = index.lookup(root, prompt)
    index.acquire(blocks)
    size = index.block_size
    parent = blocks[-1].block_hash if blocks else root
    for i in range(len(blocks), len(prompt) // size):
        block, is_new = index.get_or_allocate(parent, prompt[i * size : (i + 1) * size])
        if block is None:  # every block in use: the rest is prefilled, not cached
            break
        if is_new:
            block.extras.add("draft")
        blocks.append(block)
        parent = block.block_hash
    return blocks


def test_a_repeated_prompt_reuses_every_full_block_but_the_last_token() -> None:
    index = BlockIndex(num_blocks=8, block_size=4)
    prompt = list(range(100, 112))  # 3 full blocks
    first = serve(index, ROOT, prompt)
    assert len(first) == 3 and index.hits == 0
    index.release(first)
    # The last token is always computed: 12 tokens reuse 2 blocks, 13 reuse 3.
    assert len(index.lookup(ROOT, prompt)) == 2
    assert len(index.lookup(ROOT, prompt + [7])) == 3
    assert index.queries == 12 + 12 + 13 and index.hits == 8 + 12


def test_a_shared_head_is_reused_and_a_different_root_never_is() -> None:
    index = BlockIndex(num_blocks=8, block_size=4)
    passage = [5, 6, 7, 8, 9, 10, 11, 12]
    index.release(serve(index, ROOT, passage + [1, 2, 3, 4, 99]))
    assert len(index.lookup(ROOT, passage + [40, 41, 42, 43, 44])) == 2
    other_pair = root_hash("target-v2", "draft", "float32", "cpu")
    assert index.lookup(other_pair, passage + [1, 2, 3, 4, 99]) == []
    # Equal blocks after different heads are different prefixes.
    assert index.lookup(ROOT, [0, 0, 0, 0] + passage + [1]) == []


def test_a_referenced_block_is_never_evicted_and_a_full_pool_fails_nothing() -> None:
    index = BlockIndex(num_blocks=2, block_size=2)
    held = serve(index, ROOT, [1, 2, 3, 4, 5])
    assert [b.block_id for b in held] == [0, 1]
    # Every block referenced: the next prompt is served without caching anything.
    assert serve(index, ROOT, [7, 8, 9, 10, 11]) == []
    assert index.lookup(ROOT, [1, 2, 3, 4, 5]) == held
    index.release(held)
    # Released tail first: the tail is evicted first, the shared head stays.
    again = serve(index, ROOT, [1, 2, 30, 31, 32])
    assert [b.block_id for b in again] == [0, 1] and again[0] is held[0]
    assert index.get(held[0].block_hash, [3, 4]) is None


def test_lookup_needing_the_draft_stops_where_only_the_target_was_cached() -> None:
    index = BlockIndex(num_blocks=4, block_size=2)
    blocks = serve(index, ROOT, [1, 2, 3, 4, 5])
    blocks[1].extras.discard("draft")
    assert len(index.lookup(ROOT, [1, 2, 3, 4, 5], need="draft")) == 1
    assert len(index.lookup(ROOT, [1, 2, 3, 4, 5])) == 2


def test_clear_drops_unreferenced_blocks_only() -> None:
    index = BlockIndex(num_blocks=4, block_size=2)
    kept = serve(index, ROOT, [1, 2, 3])
    index.release(serve(index, ROOT, [9, 9, 9]))
    assert index.clear() == 1 and index.num_cached == 1
    assert index.lookup(ROOT, [1, 2, 3]) == kept
    with pytest.raises(ValueError, match="not referenced"):
        index.release(kept + kept)


def test_a_budget_below_one_block_is_refused_naming_the_minimum() -> None:
    one_block = 16 * 39_936  # 16 tokens of the demo pair in float32
    assert blocks_for_budget(10 << 20, one_block) == (10 << 20) // one_block
    with pytest.raises(
        PrefixCacheBudgetError, match=r"SPECRAG_PREFIX_CACHE_MB: 0.5 MB .* at least 1 MB"
    ):
        blocks_for_budget(1 << 19, one_block, "SPECRAG_PREFIX_CACHE_MB")


# -- against a brute-force reference --------------------------------------------------------
@dataclass
class Reference:
    """Every cached prefix as (root, tokens); eviction by scanning for the oldest release."""

    num_blocks: int
    size: int
    entries: dict[tuple[bytes, tuple[int, ...]], dict] = field(default_factory=dict)
    next_fresh: int = 0
    clock: int = 0

    def lookup(self, root: bytes, prompt: list[int]) -> int:
        n = 0
        while (n + 1) * self.size <= len(prompt) - 1 and (
            root,
            tuple(prompt[: (n + 1) * self.size]),
        ) in self.entries:
            n += 1
        return n

    def serve(self, root: bytes, prompt: list[int]) -> list[tuple[bytes, tuple[int, ...]]]:
        n = self.lookup(root, prompt)
        keys = [(root, tuple(prompt[: (i + 1) * self.size])) for i in range(n)]
        for key in keys:
            self.entries[key]["refs"] += 1
        for i in range(n, len(prompt) // self.size):
            key = (root, tuple(prompt[: (i + 1) * self.size]))
            if key in self.entries:
                self.entries[key]["refs"] += 1
                keys.append(key)
                continue
            free = [k for k, e in self.entries.items() if e["refs"] == 0]
            if self.next_fresh < self.num_blocks:
                block_id, self.next_fresh = self.next_fresh, self.next_fresh + 1
            elif free:
                oldest = min(free, key=lambda k: self.entries[k]["stamp"])
                block_id = self.entries.pop(oldest)["id"]
            else:
                break
            self.entries[key] = {"id": block_id, "refs": 1, "stamp": None}
            keys.append(key)
        return keys

    def release(self, keys: list[tuple[bytes, tuple[int, ...]]]) -> None:
        for key in reversed(keys):
            entry = self.entries[key]
            entry["refs"] -= 1
            if entry["refs"] == 0:
                self.clock += 1
                entry["stamp"] = self.clock


PASSAGES = [[p * 10 + t % 3 for t in range(7)] for p in range(4)]
prompts = st.builds(
    lambda heads, tail: [t for h in heads for t in PASSAGES[h]] + tail,
    st.lists(st.integers(0, 3), min_size=0, max_size=3),
    st.lists(st.integers(0, 2), min_size=0, max_size=5),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("serve"), prompts, st.integers(0, 1)),
        st.tuples(st.just("finish"), st.integers(0, 7), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 6), st.integers(1, 4))
def test_index_matches_the_brute_force_reference(
    steps: list[tuple], num_blocks: int, size: int
) -> None:
    roots = [ROOT, root_hash("another pair")]
    index, ref = BlockIndex(num_blocks, size), Reference(num_blocks, size)
    running: list[tuple[list[CachedBlock], list]] = []
    for op, arg, r in steps:
        if op == "serve":
            root = roots[r]
            assert len(index.lookup(root, arg, count=False)) == ref.lookup(root, arg)
            got, want = serve(index, root, arg), ref.serve(root, arg)
            assert [b.block_id for b in got] == [ref.entries[k]["id"] for k in want]
            running.append((got, want))
        elif running:
            got, want = running.pop(arg % len(running))
            index.release(got)
            ref.release(want)
        # Memory bound, and a block in use is never evicted or reassigned.
        assert index.num_cached == len(ref.entries) <= num_blocks
        in_use = [b for blocks, _ in running for b in blocks]
        assert all(index.get(b.parent_hash, b.tokens) is b for b in in_use)
        assert len({b.block_id for b in in_use}) == len(set(map(id, in_use)))
        assert index.num_referenced == len({id(b) for b in in_use})


# -- the KV pool ------------------------------------------------------------------------------
def _slot(shape: KVShape, positions: int, seed: int) -> SlotKV:
    g = torch.Generator().manual_seed(seed)
    size = (positions, shape.kv_heads, shape.head_dim)
    return (
        [torch.randn(size, generator=g) for _ in range(shape.num_layers)],
        [torch.randn(size, generator=g) for _ in range(shape.num_layers)],
    )


TARGET, DRAFT_SHAPE = KVShape(3, 2, 8, torch.float32), KVShape(1, 2, 4, torch.float32)


def test_kept_blocks_are_copied_back_exactly_and_the_draft_only_where_it_was_kept() -> None:
    block_bytes = 4 * (TARGET.bytes_per_token() + DRAFT_SHAPE.bytes_per_token())
    cache = PrefixCache(8 * block_bytes, ROOT, TARGET, DRAFT_SHAPE, block_size=4)
    assert cache.nbytes() == 8 * block_bytes <= cache.budget_bytes
    prompt = list(range(1, 14))  # 3 full blocks and one token
    src_t, src_d = _slot(TARGET, 16, 0), _slot(DRAFT_SHAPE, 16, 1)
    assert cache.keep(prompt, src_t, None) == 3  # a request without the draft model
    dst_t, dst_d = _slot(TARGET, 16, 2), _slot(DRAFT_SHAPE, 16, 3)
    assert cache.reuse(prompt, dst_t, dst_d) == 0  # drafting needs the draft's KV too
    assert cache.reuse(prompt + [99], dst_t, None) == 12
    for got, want in zip([*dst_t[0], *dst_t[1]], [*src_t[0], *src_t[1]], strict=True):
        assert torch.equal(got[:12], want[:12]) and not torch.equal(got[12:], want[12:])
    # A draft-model request fills the draft part in; the target part is not rewritten.
    assert cache.keep(prompt, _slot(TARGET, 16, 4), src_d) == 0
    assert cache.reuse(prompt, dst_t, dst_d) == 12
    for got, want in zip([*dst_d[0], *dst_d[1]], [*src_d[0], *src_d[1]], strict=True):
        assert torch.equal(got[:12], want[:12])
    assert torch.equal(dst_t[0][0][:12], src_t[0][0][:12])


def test_the_pool_stays_at_its_bound_under_a_long_soak() -> None:
    block_bytes = 4 * TARGET.bytes_per_token()
    cache = PrefixCache(5 * block_bytes + block_bytes // 2, ROOT, TARGET, block_size=4)
    assert cache.index.num_blocks == 5 and cache.nbytes() == 5 * block_bytes
    rng = random.Random(0)
    kept = 0
    for i in range(400):
        prompt = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        slot = _slot(TARGET, 32, i)
        cached = cache.reuse(prompt, slot, None)
        assert cached % 4 == 0 and cached <= len(prompt) - 1
        kept += cache.keep(prompt, slot, None)
        assert cache.index.num_cached <= 5 and cache.index.num_referenced == 0
    assert kept > 5 and cache.nbytes() == 5 * block_bytes  # it evicted, and never grew
    assert cache.reset() == 5 and cache.index.num_cached == 0
    assert cache.reuse(prompt + [1], slot, None) == 0  # invalidated: nothing is reused
    with pytest.raises(PrefixCacheBudgetError, match="at least 1 MB"):
        PrefixCache(block_bytes - 1, ROOT, TARGET, block_size=4)


def _resident_fraction(t: torch.Tensor) -> float:
    """Share of ``t``'s pages the kernel holds in memory now (mincore(2) on its own address
    range: unlike the process's RSS, it cannot be fooled by the allocator handing back memory an
    earlier test already made resident)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    start = t.data_ptr() // page * page
    length = t.data_ptr() + t.numel() * t.element_size() - start
    pages = -(-length // page)
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0
    return sum(v & 1 for v in vec) / pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux's mincore(2)")
def test_the_pool_is_committed_at_allocation_not_by_the_prefills_that_fill_it() -> None:
    # A page first touched inside a prefill's save costs a fault there; the pool takes its
    # pages when the engine starts (it is bounded by the setting either way). torch.empty's
    # large blocks are fresh mappings with no page resident: this fails on it.
    shape = KVShape(num_layers=2, kv_heads=4, head_dim=64, dtype=torch.bfloat16)
    budget = 64 * 2**20
    cache = PrefixCache(budget, ROOT, shape)
    assert cache.nbytes() > 0.9 * budget
    for t in cache.target.keys + cache.target.values:
        assert _resident_fraction(t) == 1.0
