"""How the engine runs a model: one forward pass over ``input_ids [B, n]`` on KV slots.

Prefill is one row over a prompt chunk, a step every running row's last token and drafts. Each
row's keys and values go into its slot at its own positions, so padding never shifts a real
token, and what padding writes past a length is never attended.

Decoding on a CPU is bound by per-call overhead, so, as vLLM does with its own model code,
Llama-family models run ``FastLlamaForward``: transformers' weights and operations in the same
order, without modules, hooks or output objects. One row gets the masks transformers passes to
SDPA; several rows one additive mask that lets each query see its slot up to its own position.
Other models run ``HFForward``.

On a CPU the projections run on weights packed once for oneDNN (``Linear``), as vLLM's CPU
build does: a verification pass of a few tokens is then priced about as one token, where the
default GEMM repacks every weight on every call. Its rounding differs from transformers' in the
last bits; unpacked (``packed=False``), a lone request is bit-identical to transformers.
Packed, a layer's q/k/v projections run as one GEMM on their stacked weights, and gate/up as
another (fewer, wider calls). Rotary embedding and RMSNorm are transformers' operations to the
bit, in fewer passes (see ``rotate``); no rule here depends on the dtype.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from generation.model.attention import slot_attention
from generation.model.kv_store import KVStore


class Forward(Protocol):
    """A model as the engine runs it."""

    config: Any
    device: torch.device
    dtype: torch.dtype

    def __call__(
        self,
        input_ids: torch.Tensor,  # [B, n], right-padded
        store: KVStore,
        slots: list[int],
        starts: list[int],
        last: list[int] | None = None,
    ) -> torch.Tensor:
        """Logits [B, n, vocab], or [B, vocab] at position ``last[b]`` of each row when given.

        Writes each row's keys and values at ``starts[b]`` of its slot; lengths are the caller's.
        """
        ...


class SlotLayer(DynamicLayer):
    """One layer of one slot as a transformers cache layer, for ``HFForward``: the pass's
    positions go into the store after ``start``."""

    def __init__(self, store: KVStore, layer: int, slot: int, start: int) -> None:
        super().__init__()
        self.store, self.layer, self.slot, self.start = store, layer, slot, start
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # the store is allocated

    def get_seq_length(self) -> int:
        return self.start

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's positions ([1, kv_heads, n, head_dim]); return the slot's so far."""
        end = self.start + key_states.shape[-2]
        keys, values = self.store.keys[self.layer], self.store.values[self.layer]
        keys[self.slot, :, self.start : end] = key_states[0]
        values[self.slot, :, self.start : end] = value_states[0]
        self.keys = keys[self.slot, :, :end].unsqueeze(0)
        self.values = values[self.slot, :, :end].unsqueeze(0)
        return self.keys, self.values


class HFForward:
    """transformers' own forward pass, one row at a time, writing through ``SlotLayer``."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        kinds = {type(layer) for layer in DynamicCache(config=self.config).layers}
        if kinds - {DynamicLayer}:
            raise ValueError(
                f"{type(model).__name__}: cache layers {sorted(k.__name__ for k in kinds)}; "
                "the engine's KV store holds full-attention layers only"
            )

    def __call__(
        self,
        input_ids: torch.Tensor,
        store: KVStore,
        slots: list[int],
        starts: list[int],
        last: list[int] | None = None,
    ) -> torch.Tensor:
        rows = []
        for b, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            n = input_ids.shape[1] if last is None else last[b] + 1
            cache = DynamicCache(config=self.config)
            cache.layers = [SlotLayer(store, i, slot, start) for i in range(len(cache.layers))]
            out = self.model(input_ids=input_ids[b : b + 1, :n], cache=cache, use_cache=True)
            rows.append(out.logits[0, -1] if last is not None else out.logits[0])
        return torch.stack(rows)


# Causal LMs whose decoder layer is exactly: RMSNorm, attention (q/k/v/o projections, optional
# q/k/v bias, rotary, softmax attention), residual, RMSNorm, SwiGLU MLP, residual.
SUPPORTED = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}


def fast_path_refusal(model: Any) -> str | None:
    """Why ``FastLlamaForward`` cannot run ``model`` exactly (None: it can)."""
    name = type(model).__name__
    if name not in SUPPORTED:
        return f"{name} is not a Llama-family model"
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if getattr(cfg, "mlp_bias", False):
        return "mlp_bias"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp"
    window = getattr(cfg, "sliding_window", None)
    if window and window < cfg.max_position_embeddings:
        return f"sliding-window attention ({window} positions)"
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"layer types {sorted(kinds)}"
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") not in ("default", "linear", "llama3", "yarn"):
        return f"rope_type {rope.get('rope_type')!r} changes with the sequence length"
    # Only SDPA: another implementation (eager softmax, flash kernels) rounds differently.
    if getattr(cfg, "_attn_implementation", "sdpa") != "sdpa":
        return f"attention implementation {cfg._attn_implementation!r} (the fast path is SDPA)"
    return None


def can_pack(weight: torch.Tensor) -> bool:
    """Whether oneDNN can run a projection of ``weight`` on packed weights (float32, or
    bfloat16 where oneDNN has bf16 kernels, on a CPU)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return False
    # Private ops (inductor's CPU path uses them): a torch build without them runs F.linear.
    ops = ("_reorder_linear_weight", "_linear_pointwise")
    built = torch.backends.mkldnn.is_available() and all(hasattr(torch.ops.mkldnn, o) for o in ops)
    if not built or weight.dtype == torch.float32:
        return built
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Linear:
    """One projection, ``x @ weight.T + bias``: F.linear on the module's weight, or oneDNN on a
    copy of it packed once (``packed``; the module's weight stays, so memory holds both, but
    not a third copy in ``dtype``).

    Several modules (``modules`` a list) make one projection whose output is theirs side by
    side: packed, one GEMM on their weights stacked (fewer, wider calls: a decode step is bound
    by per-call cost); unpacked, each module's F.linear as transformers runs it, concatenated.

    ``dtype``: run in this dtype on a copy of the weights (None: the module's); the input is
    cast to it."""

    def __init__(self, modules: Any, packed: bool, dtype: torch.dtype | None = None) -> None:
        parts = list(modules) if isinstance(modules, (list, tuple)) else [modules]
        self.dtype = dtype or parts[0].weight.dtype
        with_bias = any(m.bias is not None for m in parts)
        # (weight, bias) per part: the module's own tensors, or copies in ``dtype``; a part
        # without bias beside one with adds zeros.
        self.parts = [
            (_as(m.weight, self.dtype), _as(m.bias, self.dtype) if m.bias is not None else None)
            for m in parts
        ]
        self.bias: torch.Tensor | None = None
        if with_bias:
            biases = [w.new_zeros(w.shape[0]) if b is None else b for w, b in self.parts]
            self.parts = [(w, b) for (w, _), b in zip(self.parts, biases, strict=True)]
            self.bias = torch.cat(biases).detach()
        weights = [w for w, _ in self.parts]
        self.packed = (
            torch.ops.mkldnn._reorder_linear_weight(torch.cat(weights).detach()) if packed else None
        )
        if self.packed is not None:
            # Packed, only the packed copy runs: keep no copy of the weights in ``dtype`` (a
            # bf16 model's float32 output projection would otherwise be held twice).
            self.parts = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if len(self.parts) == 1:
            return F.linear(x, *self.parts[0])
        return torch.cat([F.linear(x, w, b) for w, b in self.parts], dim=-1)


def _as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` itself in its dtype, else a detached copy in ``dtype``."""
    return tensor if tensor.dtype == dtype else tensor.detach().to(dtype)


class _Layer:
    """The projections and norms of one decoder layer (the module's own tensors): q, k and v
    as one projection, gate and up as another."""

    def __init__(self, layer: Any, packed: bool, input_norm: bool = True) -> None:
        """``input_norm``: False for an EAGLE head's layer, whose input is not normalised."""
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = Linear([attn.q_proj, attn.k_proj, attn.v_proj], packed)
        self.o = Linear(attn.o_proj, packed)
        self.gate_up = Linear([mlp.gate_proj, mlp.up_proj], packed)
        self.down = Linear(mlp.down_proj, packed)
        self.in_norm = layer.input_layernorm if input_norm else None
        self.post_norm = layer.post_attention_layernorm
        self.q_size = attn.q_proj.weight.shape[0]
        self.kv_size = attn.k_proj.weight.shape[0]
        self.inter = mlp.gate_proj.weight.shape[0]
        self.scaling = attn.scaling


def rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """transformers' RMSNorm to the bit: float32 statistics, the weight applied after the cast
    back to ``x``'s dtype. ``F.rms_norm`` without a weight runs transformers' operations in one
    call (tests/generation/test_forward.py holds it to the bit); the weight is multiplied into
    the result, which is this function's own."""
    h = F.rms_norm(x.to(torch.float32), (x.shape[-1],), None, norm.variance_epsilon)
    out = h.to(x.dtype)
    return out.mul_(norm.weight) if norm.weight.dtype == out.dtype else norm.weight * out


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [..., n, head_dim] at the positions of ``cos``/``signed_sin``
    (``signed_sin``: sin with its first half negated, ``signed``).

    transformers' ``x * cos + cat(-x2, x1) * sin`` to the bit (negating a factor is exact),
    in fewer passes: the halves swapped by one roll, the sum added in place."""
    out = x * cos
    return out.add_(x.roll(x.shape[-1] // 2, -1) * signed_sin)


def signed(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` [..., head_dim] with its first half negated, as ``rotate`` takes it."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


class FastLlamaForward:
    """A Llama-family model's forward pass without the module tree (see the module docstring)."""

    def __init__(self, model: Any, packed: bool | None = None) -> None:
        """``packed``: projections on oneDNN-packed weights (None: where ``can_pack``)."""
        reason = fast_path_refusal(model)
        if reason is not None:
            raise ValueError(f"FastLlamaForward: cannot run this model exactly: {reason}")
        self.model = model
        self.config = model.config
        inner = model.model
        self.device = next(model.parameters()).device
        self.embed = inner.embed_tokens.weight
        self.dtype = self.embed.dtype
        able = can_pack(self.embed)
        if packed and not able:
            raise ValueError(
                "FastLlamaForward: packed weights need float32 (or oneDNN-supported bfloat16) "
                "weights on a CPU"
            )
        self.packed = able if packed is None else packed
        self.layers = [_Layer(layer, self.packed) for layer in inner.layers]
        self.norm = inner.norm
        # Logits in float32 whatever the weights' dtype: bf16 logits (8-bit mantissa) would
        # turn near-ties into exact ties and quantise every probability the sampler sees.
        self.lm_head = Linear(model.lm_head, self.packed, torch.float32)
        attn = inner.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = self.layers[0].q_size // self.head_dim
        self.kv_heads = attn.k_proj.weight.shape[0] // self.head_dim
        self.rotary = inner.rotary_emb
        # [positions, head_dim]; sin with its first half negated (``rotate``)
        self.cos = self.sin = self.embed.new_empty((0, self.head_dim))

    def _rope(self, end: int) -> None:
        """Make the cos/sin tables cover positions < ``end`` (the model's own rotary module)."""
        if end <= self.cos.shape[0]:
            return
        positions = torch.arange(max(end, 2 * self.cos.shape[0]), device=self.device)
        with torch.no_grad():
            cos, sin = self.rotary(self.embed[:1], positions.view(1, -1))
        self.cos, self.sin = cos[0], signed(sin[0])

    def __call__(
        self,
        input_ids: torch.Tensor,
        store: KVStore,
        slots: list[int],
        starts: list[int],
        last: list[int] | None = None,
    ) -> torch.Tensor:
        return self.run(input_ids, store, slots, starts, last)[0]

    def fill(
        self, input_ids: torch.Tensor, store: KVStore, slots: list[int], starts: list[int]
    ) -> None:
        """Write the rows' keys and values as ``__call__`` does, without what only the logits
        need (a draft's prompt: no one reads them): the last layer stops once its keys and
        values are written (no attention, MLP, final norm or output projection)."""
        batch, n = input_ids.shape
        x = F.embedding(input_ids.reshape(-1), self.embed)
        self.decode(x, self.layers, batch, n, store, slots, starts, kv_only=True)

    def run(
        self,
        input_ids: torch.Tensor,  # [B, n], right-padded
        store: KVStore,
        slots: list[int],
        starts: list[int],
        last: list[int] | None = None,
        all_hidden: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``__call__``'s logits with the final hidden states they were read from: after the
        final norm, as vLLM's Llama returns them to an EAGLE head ([B, n, hidden], or
        [B, hidden] with ``last``). ``all_hidden`` with ``last``: logits at ``last`` only, the
        hidden states of every position (a prompt's prefill for an EAGLE head: the output
        projection over every prompt position would be read by no one)."""
        batch, n = input_ids.shape
        # Activations stay 2-D, [B * n, hidden]: a 2-D linear runs the same GEMM without the
        # 3-D dispatch around it.
        x = F.embedding(input_ids.reshape(-1), self.embed)  # [B * n, hidden]
        x = self.decode(x, self.layers, batch, n, store, slots, starts)
        if all_hidden and last is not None:
            h = rms_norm(x, self.norm)  # [B * n, hidden]
            return self.lm_head(select_last(h, batch, n, last)), h.view(batch, n, -1)
        x = select_last(x, batch, n, last)
        h = rms_norm(x, self.norm)
        logits = self.lm_head(h)
        if last is not None:
            return logits, h
        return logits.view(batch, n, -1), h.view(batch, n, -1)

    def decode(
        self,
        x: torch.Tensor,  # [B * n, hidden]
        layers: list[_Layer],
        batch: int,
        n: int,
        store: KVStore,
        slots: list[int],
        starts: list[int],
        kv_only: bool = False,
    ) -> torch.Tensor:
        """Run ``layers`` (this model's, or an EAGLE head's on its own store) over ``x``,
        writing each row's keys and values at ``starts[b]`` of its slot; return [B * n, hidden].
        ``kv_only``: the last layer stops after writing its keys and values (what it returns
        is then that layer's input: for ``fill``, which reads nothing)."""
        device = self.device
        # Padding of a row near the end of its slot is written at the slot's last position,
        # which no real token reaches.
        end = min(max(starts) + n, store.capacity)
        self._rope(max(starts) + n)
        groups = self.heads // self.kv_heads
        mask, is_causal, gqa = None, False, groups > 1
        # bf16 on a CPU with AVX-512 BF16: generation/model/attention.py's kernel (None: SDPA below).
        attend = slot_attention(self.dtype, device, slots, starts, n, self.head_dim)
        if batch == 1:
            # One row: the masks transformers passes to SDPA (none for one token; causal for a
            # prompt on an empty slot; a causal mask after cached positions, additive).
            slot, start = slots[0], starts[0]
            write: Any = (slot, slice(None), slice(start, start + n))
            rows: Any = slot
            cos = self.cos[start : start + n].unsqueeze(0)  # [1, n, head_dim]
            sin = self.sin[start : start + n].unsqueeze(0)
            if n > 1 and start > 0 and attend is None:
                seen = torch.ones(n, end, dtype=torch.bool, device=device).tril(start)
                # Additive, as below (the same values SDPA would turn the boolean mask into).
                mask = torch.zeros(seen.shape, dtype=self.dtype, device=device)
                mask = mask.masked_fill_(~seen, float("-inf"))
                gqa = False
            is_causal = n > 1 and start == 0
        else:
            pos = torch.tensor(starts, device=device)[:, None] + torch.arange(n, device=device)
            pos = pos.clamp_(max=store.capacity - 1)  # [B, n]
            slot_ids = torch.tensor(slots, device=device)
            write = (slot_ids[:, None], slice(None), pos)
            dense = slots == list(range(slots[0], slots[0] + batch))
            rows = slice(slots[0], slots[0] + batch) if dense else slot_ids  # a view, or a gather
            cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [B, 1, n, hd]
            # Query (b, j) sees its slot's positions up to its own. Additive, not boolean:
            # SDPA's CPU kernel converts a boolean mask on every call.
            if attend is None:
                seen = torch.arange(end, device=device) <= pos[:, :, None]  # [B, n, end]
                mask = torch.zeros(seen.shape, dtype=self.dtype, device=device)
                mask = mask.masked_fill_(~seen, float("-inf")).unsqueeze(1)  # [B, 1, n, end]
            gqa = False
        for i, layer in enumerate(layers):
            # An EAGLE head's first layer has no input norm (vLLM's llama_eagle.py).
            h = x if layer.in_norm is None else rms_norm(x, layer.in_norm)
            qkv = layer.qkv(h)  # [B * n, q | k | v]
            qk = qkv[:, : layer.q_size + layer.kv_size].view(batch, n, -1, self.head_dim)
            qk = rotate(qk.transpose(1, 2), cos, sin)  # [B, heads + kv_heads, n, head_dim]
            q, k = qk[:, : self.heads], qk[:, self.heads :]
            v = qkv[:, layer.q_size + layer.kv_size :].view(batch, n, self.kv_heads, -1)
            keys, values = store.keys[i], store.values[i]  # [slots, kv, capacity, head_dim]
            keys[write] = k[0] if batch == 1 else k.transpose(1, 2)
            values[write] = v[0].transpose(0, 1) if batch == 1 else v
            if kv_only and i == len(layers) - 1:
                break
            if attend is not None:
                attn = attend(q, keys, values, layer.scaling)  # [B * n, q_size]
            else:
                attn = _sdpa(q, keys[rows, :, :end], values[rows, :, :end], batch, groups, gqa,
                             mask, is_causal, layer.scaling)  # fmt: skip
            x = x + layer.o(attn)  # a new tensor: the caller's x (an EAGLE head's input) stays
            h = rms_norm(x, layer.post_norm)
            gate_up = layer.gate_up(h)  # [B * n, gate | up]
            act = F.silu(gate_up[:, : layer.inter]).mul_(gate_up[:, layer.inter :])
            x.add_(layer.down(act))
        return x


def _sdpa(
    q: torch.Tensor,  # [B, heads, n, head_dim]
    k_all: torch.Tensor,  # [(B,) kv_heads, end, head_dim]
    v_all: torch.Tensor,
    batch: int,
    groups: int,
    gqa: bool,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """SDPA of ``q`` over the rows' keys and values; returns [B * n, heads * head_dim]."""
    if batch == 1:
        k_all, v_all = k_all.unsqueeze(0), v_all.unsqueeze(0)
    if groups > 1 and not gqa:
        k_all = k_all.repeat_interleave(groups, dim=1)
        v_all = v_all.repeat_interleave(groups, dim=1)
    attn = F.scaled_dot_product_attention(
        q, k_all, v_all, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
    )  # [B, heads, n, head_dim]
    return attn.transpose(1, 2).reshape(batch * q.shape[2], -1)


def select_last(x: torch.Tensor, batch: int, n: int, last: list[int] | None) -> torch.Tensor:
    """``x`` [B * n, hidden] at each row's position ``last[b]`` ([B, hidden]); all if None."""
    if last is None:
        return x
    if batch == 1:
        return x[last[0] : last[0] + 1]  # [1, hidden]
    rows_at = torch.arange(batch, device=x.device) * n + torch.tensor(last, device=x.device)
    return x[rows_at]  # [B, hidden]


def forward_for(model: Any, fast: bool = True, packed: bool | None = None) -> Forward:
    """The fastest way to run ``model``: the fast Llama path where it applies (``packed``: as
    ``FastLlamaForward`` takes it)."""
    if fast and fast_path_refusal(model) is None:
        return FastLlamaForward(model, packed)
    return HFForward(model)
