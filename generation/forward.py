"""How the engine runs a model: one forward pass over new tokens on a KV cache.

Single-stream decoding on a CPU (and small models anywhere) is bound by per-call overhead, not
arithmetic: a decode step of the demo target runs ~150 tiny kernels, and Hugging Face's module
tree adds its own Python around each (hooks, output dataclasses, mask construction, cache
bookkeeping).  So, as vLLM does with its own model implementations, the engine runs Llama-family
models through ``FastLlamaForward``: the same weights and the same operations in the same order,
with

- no modules, hooks, output objects or per-pass mask and position bookkeeping;
- rotary cos/sin tables computed once for every position, by the model's own rotary module;
- the engine's in-place KV cache (generation/kv_cache.py, the same one ``HFForward`` uses):
  each pass writes its keys and values, rollback moves the end;
- attention by ``scaled_dot_product_attention`` with the same masks transformers would pass.

Fusing q/k/v (and gate/up) into one matrix multiply, as vLLM does on GPUs, was tried and
dropped: on this CPU it was no faster (71 vs 74 us per layer at 384 wide), and for narrow
k/v projections the fused GEMM picked another kernel whose sums differ in the last bit, which
would break token-identity with transformers.

Every other model runs through ``HFForward`` (transformers' forward with the in-place cache of
generation/kv_cache.py).  Both return logits; tests/generation/test_forward.py checks the fast
path against transformers' forward for Llama and Qwen2 (with GQA and biases), through growth
and rollback.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from generation.kv_cache import MIN_CAPACITY, new_cache


class Forward(Protocol):
    """A model as the engine runs it."""

    config: Any
    device: torch.device

    def new_cache(self) -> Any:
        """An empty KV cache with ``crop(-n)`` (drop the last n positions)."""
        ...

    def __call__(
        self, input_ids: torch.Tensor, cache: Any, logits_to_keep: int = 0
    ) -> torch.Tensor:
        """Logits [n, vocab] of the last ``logits_to_keep`` (0: all) of ``input_ids`` [1, n]."""
        ...


class HFForward:
    """transformers' own forward pass, on the in-place cache (any causal LM)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device

    def new_cache(self) -> Any:
        return new_cache(self.config)

    def __call__(
        self, input_ids: torch.Tensor, cache: Any, logits_to_keep: int = 0
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=logits_to_keep
        )
        return out.logits[0]


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


class _Layer:
    """The tensors of one decoder layer (the module's own, not copies)."""

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.gate, self.up, self.down = (
            mlp.gate_proj.weight,
            mlp.up_proj.weight,
            mlp.down_proj.weight,
        )
        self.in_norm = layer.input_layernorm
        self.post_norm = layer.post_attention_layernorm
        self.q_size = attn.q_proj.weight.shape[0]
        self.scaling = attn.scaling


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """transformers' RMSNorm, operation for operation (float32 statistics)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


class FastLlamaForward:
    """A Llama-family model's forward pass without the module tree (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        reason = fast_path_refusal(model)
        if reason is not None:
            raise ValueError(f"FastLlamaForward: cannot run this model exactly: {reason}")
        self.model = model
        self.config = model.config
        self.max_positions = int(model.config.max_position_embeddings)
        inner = model.model
        self.device = next(model.parameters()).device
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.norm = inner.norm
        self.lm_head = model.lm_head.weight
        attn = inner.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = self.layers[0].q_size // self.head_dim
        self.kv_heads = attn.k_proj.weight.shape[0] // self.head_dim
        self.rotary = inner.rotary_emb
        self.cos = self.sin = self.embed.new_empty((0, self.head_dim))  # [positions, head_dim]

    def _rope(self, end: int) -> None:
        """Make the cos/sin tables cover positions < ``end`` (doubling; a model with a 128k
        context does not pay for 128k positions up front)."""
        if end <= self.cos.shape[0]:
            return
        count = min(max(end, 2 * self.cos.shape[0], MIN_CAPACITY), self.max_positions)
        positions = torch.arange(max(end, count), device=self.device).view(1, -1)
        with torch.no_grad():
            cos, sin = self.rotary(self.embed[:1], positions)
        self.cos, self.sin = cos[0], sin[0]

    def new_cache(self) -> DynamicCache:
        return new_cache(self.config)

    def __call__(
        self, input_ids: torch.Tensor, cache: DynamicCache, logits_to_keep: int = 0
    ) -> torch.Tensor:
        n = input_ids.shape[1]
        start = cache.get_seq_length()
        end = start + n
        self._rope(end)
        cos, sin = self.cos[start:end].unsqueeze(0), self.sin[start:end].unsqueeze(0)
        # The masks transformers passes to SDPA: none for one token or a prompt on an empty
        # cache (is_causal), a boolean causal mask for several tokens after cached ones.
        mask = None
        if n > 1 and start > 0:
            mask = torch.ones(n, end, dtype=torch.bool, device=self.device).tril(start)
        is_causal = n > 1 and start == 0
        groups = self.heads // self.kv_heads
        x = F.embedding(input_ids[0], self.embed)  # [n, hidden]
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.in_norm)
            q = F.linear(h, layer.q.weight, layer.q.bias)
            k = F.linear(h, layer.k.weight, layer.k.bias)
            v = F.linear(h, layer.v.weight, layer.v.bias)
            q = _rotate(q.view(n, self.heads, self.head_dim).transpose(0, 1), cos, sin)
            k = _rotate(k.view(n, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
            v = v.view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            # [1, kv_heads, end, head_dim]: the cache's views, this pass's positions written in.
            k_all, v_all = cache.update(k.unsqueeze(0), v.unsqueeze(0), i)
            # As transformers: SDPA's own grouped-query attention without a mask, else
            # keys/values repeated per query head.
            if groups > 1 and mask is not None:
                k_all = k_all.repeat_interleave(groups, dim=1)
                v_all = v_all.repeat_interleave(groups, dim=1)
            attn = F.scaled_dot_product_attention(
                q.unsqueeze(0),
                k_all,
                v_all,
                attn_mask=mask,
                is_causal=is_causal,
                scale=layer.scaling,
                enable_gqa=groups > 1 and mask is None,
            )  # [1, heads, n, head_dim]
            attn = attn[0].transpose(0, 1).reshape(n, layer.q_size)
            x = x + F.linear(attn, layer.o.weight, layer.o.bias)
            h = _rms_norm(x, layer.post_norm)
            x = x + F.linear(F.silu(F.linear(h, layer.gate)) * F.linear(h, layer.up), layer.down)
        if logits_to_keep:
            x = x[-logits_to_keep:]
        return F.linear(_rms_norm(x, self.norm), self.lm_head)


def forward_for(model: Any, fast: bool = True) -> Forward:
    """The fastest exact way to run ``model``: the fast Llama path where it applies."""
    if fast and fast_path_refusal(model) is None:
        return FastLlamaForward(model)
    return HFForward(model)
