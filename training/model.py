"""Model configs of the demo pair, and export to a Hugging Face checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from training.induction_init import ROPE_THETA, wire_induction

# Target: deep enough that one decode step costs >= 8x a draft step on this CPU, where a step is
# mostly per-layer overhead (12 x 384: 12.1 ms vs 1.1 ms for the draft at a 900-token context,
# measured with training/evaluate.py time_forward, one thread).  Draft: two layers, the least that
# holds an induction circuit (copying from the passages), and as narrow as the circuit allows
# (head_dim 64, hidden >= 1 + 3 x 63).  Both start from training/induction_init.py.
TARGET_SHAPE: dict[str, Any] = {
    "hidden_size": 384,
    "intermediate_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
}
DRAFT_SHAPE: dict[str, Any] = {
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
}
MAX_POSITIONS = 2048


def autocast_dtype() -> torch.dtype:
    """bfloat16 where the CPU has AMX or AVX-512 BF16 (8x faster linears measured here), else
    float32: the dtype training autocasts to."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    return torch.bfloat16 if ("amx_bf16" in flags or "avx512_bf16" in flags) else torch.float32


def make_config(shape: dict[str, Any], vocab_size: int, eos_token_id: int) -> LlamaConfig:
    """A Llama config of ``shape`` for the shared tokenizer."""
    return LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,  # the output reads what the induction heads write (init)
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        **shape,
    )


def make_model(
    shape: dict[str, int], vocab_size: int, eos_token_id: int, seed: int
) -> LlamaForCausalLM:
    """A freshly initialised model, seeded, with the induction circuit written in."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(make_config(shape, vocab_size, eos_token_id))
    wire_induction(model, seed)
    return model


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
    # An instruct tokenizer ends answers with its end of turn and pads with <|endoftext|>:
    # generation stops at either (as Llama 3 and Qwen2 list two).
    eos_ids = list(dict.fromkeys([tok.eos_token_id, tok.pad_token_id]))
    GenerationConfig(
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.pad_token_id,
        do_sample=False,
        max_new_tokens=96,
    ).save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    (out_dir / "training.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
