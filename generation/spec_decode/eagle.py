"""EAGLE: a draft head that reads the target's own features (Li et al. 2024, EAGLE-1 layout).

The head is one decoder layer of the target's width. At target position ``t`` it takes the
target's final hidden state ``f_t`` (after the final norm, as vLLM's Llama returns it) with the
embedding of the token that followed, ``x_{t+1}``:

    g_t = layer(fc(concat(embed(x_{t+1}), f_t)))        logits_t = lm_head(g_t)  -> x_{t+2}

sharing the target's embedding and LM head; the layer has no input norm and the head no final
norm (vLLM's ``model_executor/models/llama_eagle.py``). Drafting feeds a drafted token with the
head's own ``g`` in place of the target feature it does not have yet; after verification the
head's slot is rolled back to the last position whose true feature is known, and the features
of the accepted positions are fed next round (``draft_with_eagle``).

A checkpoint is vLLM's EAGLE format, so one directory serves both engines: ``config.json``
(a Llama config of one layer, ``architectures: ["EagleLlamaForCausalLM"]``) and
``model.safetensors`` with ``fc.weight`` and ``layers.0.*`` (no ``embed_tokens``/``lm_head``:
vLLM then shares the target's, as this engine does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from generation.model.forward import FastLlamaForward, Linear, _Layer, select_last
from generation.model.kv_store import KVStore
from generation.model.loading import CheckpointError, IncompatibleDraftError
from generation.model.model_runner import ModelRunner
from generation.spec_decode.rows import DraftRow
from generation.spec_decode.sampling import draft_position

ARCHITECTURE = "EagleLlamaForCausalLM"
"""vLLM's name for an EAGLE-1 head on a Llama-family target."""
WEIGHTS = "model.safetensors"


class EagleHeadModule(nn.Module):
    """The head as a trainable module; its ``state_dict`` is the checkpoint's tensors."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        # SDPA with no mask is causal (the eager default would attend both ways).
        config._attn_implementation = "sdpa"
        self.config = config
        hidden = int(config.hidden_size)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, layer_idx=0)])
        self.layers[0].input_layernorm = nn.Identity()  # EAGLE-1: no input norm
        self.rotary = LlamaRotaryEmbedding(config)
        self.name: str | None = None
        """The checkpoint directory's name (``load_head``): the head's label in ``model_pair``."""

    def forward(
        self,
        embeds: torch.Tensor,  # [B, n, hidden]: embeddings of x_{t+1}
        features: torch.Tensor,  # [B, n, hidden]: the target's f_t
    ) -> torch.Tensor:
        """Return the head's hidden states g [B, n, hidden] (causal over n; for training)."""
        x = self.fc(torch.cat((embeds, features), dim=-1))
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        position_embeddings = self.rotary(x, positions)
        for layer in self.layers:
            x = layer(x, position_embeddings=position_embeddings, position_ids=positions)
        return x


def head_config(target_config: Any) -> LlamaConfig:
    """The config of a head for a target of ``target_config``: its width, attention shape,
    rotary and vocabulary, one layer."""
    cfg = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    for drop in ("architectures", "num_hidden_layers", "layer_types", "_name_or_path"):
        cfg.pop(drop, None)
    config = LlamaConfig(**{**cfg, "num_hidden_layers": 1})
    config.architectures = [ARCHITECTURE]
    return config


def save_head(head: EagleHeadModule, out_dir: Path, card: dict[str, Any] | None = None) -> None:
    """Write ``head`` as a vLLM EAGLE checkpoint (float16 weights, as the demo pair ships)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    tensors = {k: v for k, v in tensors.items() if not k.startswith("rotary.")}
    save_file(tensors, str(out_dir / WEIGHTS), metadata={"format": "pt"})
    config = head.config.to_dict()
    config["architectures"] = [ARCHITECTURE]
    config["dtype"] = "float16"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if card is not None:
        (out_dir / "training.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")


def check_head_config(config: Any, target_config: Any, head_dir: str | Path) -> None:
    """Raise ``IncompatibleDraftError`` naming both sizes unless the head fits the target."""
    for name, what in (
        ("hidden_size", "hidden size"),
        ("vocab_size", "vocabulary size"),
        ("num_attention_heads", "attention heads"),
        ("num_key_value_heads", "key/value heads"),
        ("head_dim", "head dim"),
    ):
        mine, theirs = getattr(config, name, None), getattr(target_config, name, None)
        if mine != theirs:
            raise IncompatibleDraftError(
                f"EAGLE head {str(head_dir)!r} has {what} {mine}, the target has {theirs}; "
                "a head must be trained on this target's features"
            )


def load_head(head_dir: str | Path, target: Any) -> EagleHeadModule:
    """Return the head in ``head_dir`` on the target's device and dtype, checked against it."""
    path = Path(head_dir)
    if not path.is_dir():
        raise CheckpointError(f"EAGLE head {str(path)!r}: directory does not exist")
    for name in ("config.json", WEIGHTS):
        if not (path / name).is_file():
            raise CheckpointError(f"EAGLE head {str(path)!r}: no {name}")
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"EAGLE head {str(path)!r}: unreadable config.json ({exc})") from exc
    raw.pop("architectures", None)
    config = LlamaConfig(**raw)
    check_head_config(config, target.config, path)
    config.num_hidden_layers = 1
    head = EagleHeadModule(config)
    param = next(target.parameters())
    tensors = load_file(str(path / WEIGHTS))
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not m.startswith("rotary.")]
    if missing or unexpected:
        raise CheckpointError(
            f"EAGLE head {str(path)!r}: not an EAGLE-1 head (missing {missing}, "
            f"unexpected {unexpected})"
        )
    head.name = path.resolve().name
    return head.to(device=param.device, dtype=param.dtype).eval()


def is_eagle_head(path: str | Path) -> bool:
    """Whether ``path`` holds an EAGLE head (its config.json names vLLM's EAGLE architecture)."""
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return ARCHITECTURE in (raw.get("architectures") or [])


class EagleHead:
    """The head as the engine runs it: the target's ``decode`` over the head's one layer on
    the head's own KV store, projections packed as the target's are."""

    def __init__(self, head: EagleHeadModule, target: FastLlamaForward) -> None:
        self.module = head
        self.target = target
        self.config = head.config
        self.device, self.dtype = target.device, target.dtype
        self.fc = Linear(head.fc, target.packed)
        self.layers = [_Layer(head.layers[0], target.packed, input_norm=False)]

    def __call__(
        self,
        input_ids: torch.Tensor,
        store: KVStore,
        slots: list[int],
        starts: list[int],
        last: list[int] | None = None,
    ) -> torch.Tensor:
        raise TypeError("an EAGLE head needs the target's features: call run(..., features)")

    def run(
        self,
        input_ids: torch.Tensor,  # [B, n], right-padded: x_{t+1}
        store: KVStore,
        slots: list[int],
        starts: list[int],
        last: list[int] | None = None,
        features: torch.Tensor | None = None,  # [B, n, hidden]: f_t (or the head's own g)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return logits and the head's hidden states g, as ``FastLlamaForward.run``."""
        assert features is not None
        batch, n = input_ids.shape
        target = self.target
        embeds = F.embedding(input_ids.reshape(-1), target.embed)  # [B * n, hidden]
        x = self.fc(torch.cat((embeds, features.reshape(batch * n, -1).to(embeds.dtype)), -1))
        x = target.decode(x, self.layers, batch, n, store, slots, starts)
        g = select_last(x, batch, n, last)
        logits = target.lm_head(g)  # no final norm (vLLM's llama_eagle.py)
        if last is not None:
            return logits, g
        return logits.view(batch, n, -1), g.view(batch, n, -1)


def draft_with_eagle(
    runner: ModelRunner, rows: Sequence[DraftRow], ks: list[int], device: torch.device
) -> list[tuple[list[int], torch.Tensor | None]]:
    """Return each row's ``ks[i]`` draft tokens and, for a sampled row, their distributions.

    The head's slot lags the target's by the positions whose features arrived since it last
    ran (``seq.features``: the prompt after prefill, a round's accepted positions after
    verification); they are fed first with the tokens that followed them. Each drafted token
    is then fed with the head's own hidden state (every draft but the last); the engine's
    postprocess rolls the slot back to the target's length before the round.
    """
    slots = [s.slot for s in rows]
    ids, feats = [], []
    for seq in rows:
        assert seq.features is not None
        start = seq.head_base + runner.length(seq.slot)  # target position of the next entry
        ids.append(seq.tokens[start + 1 : start + 1 + seq.features.shape[0]])
        feats.append(seq.features)
        assert len(ids[-1]) == feats[-1].shape[0], (start, len(seq.tokens), feats[-1].shape)
        seq.features = None  # consumed
    counts = [len(p) for p in ids]
    width = max(counts)
    input_ids = torch.tensor(
        [p + [0] * (width - len(p)) for p in ids], dtype=torch.long, device=device
    )  # [R, width]
    features = torch.stack([F.pad(f, (0, 0, 0, width - f.shape[0])) for f in feats])  # [R, w, H]
    drafted: list[list[torch.Tensor]] = [[] for _ in rows]
    probs: list[list[torch.Tensor]] = [[] for _ in rows]
    for position in range(max(ks)):
        logits, hidden = runner.run_hidden(slots, input_ids, counts, True, features)
        input_ids = draft_position(logits, rows, ks, position, drafted, probs)  # [R, 1]
        features = hidden.unsqueeze(1)  # [R, 1, hidden]: g in place of the unknown f
        counts = [1 if position + 1 < k else 0 for k in ks]
    host = torch.stack([torch.cat(t) for t in drafted]).tolist()  # [R, max k]
    return [
        (row[:k], torch.stack(p) if p else None) for row, k, p in zip(host, ks, probs, strict=True)
    ]
