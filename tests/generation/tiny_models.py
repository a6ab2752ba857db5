"""Tiny random-weight causal LMs built from configs (no hub), and their saved checkpoints."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

FAMILIES = ("llama", "qwen2", "gpt2")


def build_model(
    family: str = "llama",
    *,
    vocab_size: int = 96,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    max_positions: int = 256,
    logit_scale: float = 1.0,
) -> Any:
    """Return a random-weight model of ``family`` in eval mode, with no end-of-sequence token.

    ``logit_scale`` multiplies the output embedding, sharpening the otherwise near-uniform
    next-token distributions of a random model.
    """
    torch.manual_seed(seed)
    if family == "llama":
        model: Any = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=vocab_size,
                hidden_size=hidden_size,
                intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=max_positions,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=None,
                pad_token_id=None,
            )
        )
    elif family == "qwen2":
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=vocab_size,
                hidden_size=hidden_size,
                intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=max_positions,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=None,
                pad_token_id=None,
            )
        )
    elif family == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=vocab_size,
                n_embd=hidden_size,
                n_layer=num_layers,
                n_head=4,
                n_positions=max_positions,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=None,
                pad_token_id=None,
            )
        )
    else:
        raise ValueError(family)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model.generation_config.bos_token_id = None
    return model.eval()


def perturbed_copy(model: Any, noise: float, seed: int = 1) -> Any:
    """Return a copy of ``model`` with Gaussian noise of relative size ``noise`` on every weight.

    A draft like this agrees with the target often but not always, so rounds end at every
    position and the rollback paths run.
    """
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            scale = noise * param.std() if param.numel() > 1 else 0.0
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return draft.eval()


def save_checkpoint(model: Any, path: Path, tokenizer: Any | None = None) -> Path:
    """Save ``model`` (and a tokenizer) as a Hugging Face checkpoint directory."""
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """Return a word-level tokenizer whose token-to-id map is ``words`` in order."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    inner = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    inner.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token=words[0])


def reference_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Return transformers' own greedy continuation (``generate(do_sample=False)``)."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return out[0, len(prompt) :].tolist()
