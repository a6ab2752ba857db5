"""Model configs of the demo pair, and export to a Hugging Face checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# Target: as large as ~an hour of bf16 training on two shared cores allows (measured).  Draft: two layers (the least
# that can form an induction head, i.e. copy from the passages) and narrow, because on a CPU a
# decode step's cost is mostly per-layer overhead.
TARGET_SHAPE: dict[str, Any] = {
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
}
DRAFT_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}
MAX_POSITIONS = 2048


def make_config(shape: dict[str, Any], vocab_size: int, eos_token_id: int) -> LlamaConfig:
    """A Llama config of ``shape`` for the shared tokenizer."""
    return LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        **shape,
    )


def make_model(
    shape: dict[str, int], vocab_size: int, eos_token_id: int, seed: int
) -> LlamaForCausalLM:
    """A freshly initialised model, seeded."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(make_config(shape, vocab_size, eos_token_id))


def export(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, out_dir: Path, card: dict[str, object]
) -> None:
    """Write weights (float16 safetensors), config, generation config and tokenizer to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    half = LlamaForCausalLM(model.config)
    half.load_state_dict(model.state_dict())
    half.half()  # in place; float16 halves the files, loaders upcast on CPU
    half.config.dtype = "float16"
    half.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig(
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        do_sample=False,
        max_new_tokens=96,
    ).save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    (out_dir / "training.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
