"""One batched forward pass: many requests' new tokens on their KV slots, per-row positions.

A pass takes ``input_ids`` [B, n], right-padded: row b holds ``num_tokens[b]`` real tokens
(the last emitted token and its draft tokens, or a draft model's pending tokens) at positions
``length[b] .. length[b] + n - 1`` of its slot. Rotary embeddings are taken per position, every
row's keys and values are written into its own slot, and an explicit mask lets each query see
its slot's positions up to its own. Padding therefore never shifts a real token's position
(the trap of left padding), and what padding writes past a row's length is overwritten later
and never attended. After the pass each slot's length grows by its real tokens only;
rejected draft tokens are rolled back by the caller by lowering the length.

Llama-family models (generation/forward.py's ``FastLlamaForward``) run the batch in one pass.
A batch of one, a prefill, and every other model run row by row through the single-sequence
forward pass on the row's slot, which is exactly what ``SpeculativeEngine.generate`` does.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from generation.forward import FastLlamaForward, Forward, _rms_norm, _rotate
from generation.slots import RowCaches, SlotCache

log = logging.getLogger(__name__)


class ModelRunner:
    """A model (target or draft) with a KV slot per running request."""

    def __init__(self, fwd: Forward, name: str) -> None:
        self.fwd = fwd
        self.batched = isinstance(fwd, FastLlamaForward)
        """Whether a batch runs as one pass (else row after row)."""
        self.cache: SlotCache | RowCaches
        if isinstance(fwd, FastLlamaForward):
            self.cache = SlotCache(
                len(fwd.layers),
                fwd.kv_heads,
                fwd.head_dim,
                dtype=fwd.embed.dtype,
                device=fwd.device,
                max_length=fwd.max_positions,
            )
        else:
            log.info("%s: %s runs batched requests one after another", name, type(fwd).__name__)
            self.cache = RowCaches(fwd.config)

    def length(self, slot: int) -> int:
        """Positions of slot ``slot`` that hold the sequence's keys and values."""
        return self.cache.lengths[slot]

    def set_length(self, slot: int, length: int) -> None:
        """Roll slot ``slot`` back to ``length`` positions (rejected drafts are forgotten)."""
        if isinstance(self.cache, SlotCache):
            self.cache.lengths[slot] = length
        else:
            self.cache.set_length(slot, length)

    def clear(self, slot: int) -> None:
        """Free slot ``slot``."""
        self.cache.reserve(slot + 1, 0)
        self.set_length(slot, 0)

    def move(self, src: int, dst: int) -> None:
        """Move the sequence in slot ``src`` to slot ``dst``."""
        self.cache.move(src, dst)

    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor:
        """Append ``token_ids`` to slot ``slot``; return the logits after the last one [vocab]."""
        self.cache.reserve(slot + 1, 0)
        self.cache.reserve(slot + 1, self.length(slot) + len(token_ids))
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.fwd.device)
        return self.fwd(ids, self.cache.view(slot), logits_to_keep=1)[-1].float()

    @torch.inference_mode()
    def run(
        self,
        slots: list[int],
        input_ids: torch.Tensor,  # [B, n] right-padded
        num_tokens: list[int],
        last_only: bool = False,
    ) -> torch.Tensor:
        """Return logits [B, n, vocab] (``last_only``: [B, vocab] at each row's last real token).

        Rows with ``num_tokens[b] == 0`` are carried along (their logits are meaningless).
        """
        if self.batched and len(slots) > 1:
            return self._run_batched(slots, input_ids, num_tokens, last_only)
        rows: list[torch.Tensor | None] = []
        for b, slot in enumerate(slots):
            count = num_tokens[b]
            if count == 0:
                rows.append(None)
                continue
            self.cache.reserve(slot + 1, 0)
            self.cache.reserve(slot + 1, self.length(slot) + count)
            logits = self.fwd(
                input_ids[b : b + 1, :count], self.cache.view(slot), 1 if last_only else 0
            )
            rows.append(logits.float())
        return _stack(rows, input_ids.shape[1], last_only)

    def _run_batched(
        self, slots: list[int], input_ids: torch.Tensor, num_tokens: list[int], last_only: bool
    ) -> torch.Tensor:
        fwd = self.fwd
        cache = self.cache
        assert isinstance(fwd, FastLlamaForward) and isinstance(cache, SlotCache)
        device = fwd.device
        batch, n = input_ids.shape
        starts = [cache.lengths[s] for s in slots]
        end = max(starts) + n
        cache.reserve(max(slots) + 1, end)
        fwd._rope(end)
        start = torch.tensor(starts, device=device)
        pos = start[:, None] + torch.arange(n, device=device)  # [B, n]
        cos, sin = fwd.cos[pos].unsqueeze(1), fwd.sin[pos].unsqueeze(1)  # [B, 1, n, head_dim]
        # Query (b, j) sees its slot's positions up to its own, len[b] + j. Additive, not
        # boolean: SDPA's CPU kernel converts a boolean mask on every call (3x slower here).
        seen = torch.arange(end, device=device) <= pos[:, :, None]  # [B, n, end]
        mask = torch.zeros(seen.shape, dtype=x_dtype(fwd), device=device)
        mask = mask.masked_fill_(~seen, float("-inf")).unsqueeze(1)  # [B, 1, n, end]
        slot_ids = torch.tensor(slots, device=device)
        # A dense run of slots is read as a view; any other set is gathered (a copy).
        rows: slice | torch.Tensor = (
            slice(slots[0], slots[0] + batch)
            if slots == list(range(slots[0], slots[0] + batch))
            else slot_ids
        )
        groups = fwd.heads // fwd.kv_heads
        x = F.embedding(input_ids, fwd.embed)  # [B, n, hidden]
        for i, layer in enumerate(fwd.layers):
            h = _rms_norm(x, layer.in_norm)
            q = F.linear(h, layer.q.weight, layer.q.bias).view(batch, n, fwd.heads, fwd.head_dim)
            k = F.linear(h, layer.k.weight, layer.k.bias).view(batch, n, fwd.kv_heads, -1)
            v = F.linear(h, layer.v.weight, layer.v.bias).view(batch, n, fwd.kv_heads, -1)
            q = _rotate(q.transpose(1, 2), cos, sin)  # [B, heads, n, head_dim]
            k = _rotate(k.transpose(1, 2), cos, sin)  # [B, kv_heads, n, head_dim]
            keys, values = cache.keys[i], cache.values[i]  # [slots, capacity, kv, head_dim]
            keys[slot_ids[:, None], pos] = k.transpose(1, 2)
            values[slot_ids[:, None], pos] = v
            k_all = keys[rows, :end].transpose(1, 2)  # [B, kv_heads, end, head_dim]
            v_all = values[rows, :end].transpose(1, 2)
            if groups > 1:
                k_all = k_all.repeat_interleave(groups, dim=1)
                v_all = v_all.repeat_interleave(groups, dim=1)
            attn = F.scaled_dot_product_attention(
                q, k_all, v_all, attn_mask=mask, scale=layer.scaling
            )  # [B, heads, n, head_dim]
            attn = attn.transpose(1, 2).reshape(batch, n, layer.q_size)
            x = x + F.linear(attn, layer.o.weight, layer.o.bias)
            h = _rms_norm(x, layer.post_norm)
            x = x + F.linear(F.silu(F.linear(h, layer.gate)) * F.linear(h, layer.up), layer.down)
        for b, slot in enumerate(slots):
            cache.lengths[slot] = starts[b] + num_tokens[b]
        if last_only:
            last = torch.tensor([max(c, 1) - 1 for c in num_tokens], device=device)
            x = x[torch.arange(batch, device=device), last]  # [B, hidden]
        return F.linear(_rms_norm(x, fwd.norm), fwd.lm_head).float()


def x_dtype(fwd: FastLlamaForward) -> torch.dtype:
    """The dtype of the model's activations (its embedding's)."""
    return fwd.embed.dtype


def _stack(rows: list[torch.Tensor | None], width: int, last_only: bool) -> torch.Tensor:
    """Stack per-row logits ([m, vocab] each) into [B, width, vocab] (or [B, vocab])."""
    like = next(r for r in rows if r is not None)
    vocab = like.shape[-1]
    if last_only:
        return torch.stack([like.new_zeros(vocab) if r is None else r[-1] for r in rows])
    out = like.new_zeros((len(rows), width, vocab))
    for b, r in enumerate(rows):
        if r is not None:
            out[b, : r.shape[0]] = r
    return out
