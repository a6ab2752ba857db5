"""Tiny random-weight instruct checkpoints: a Llama with Llama 3's chat template and special
tokens, a Qwen2 with Qwen2's ChatML template.  Templates are written in here (no hub).

Each checkpoint's target is nudged so that greedy decoding of ``PROBE`` ends its turn within a
few tokens (its end-of-turn row in the output head is a scaled copy of the row greedy picks
third), so tests can see generation stop at the end-of-turn id on both engines. head_dim 64:
vLLM's CPU attention takes no smaller head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from retrieval.chat import PromptFormat
from retrieval.prompt import Passage
from testkit.tokenizer import train_tokenizer
from tests.generation.tiny_models import build_model, perturbed_copy

# Meta-Llama-3-8B-Instruct's template, as its tokenizer_config.json ships it.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
# Qwen2-7B-Instruct's template (ChatML, with a default system turn when none is given).
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

KINDS: dict[str, dict[str, Any]] = {
    "llama3": {
        "family": "llama",
        "template": LLAMA3_TEMPLATE,
        "specials": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",  # as Llama-3-Instruct's tokenizer names it
        "end_of_turn": "<|eot_id|>",
        "end_of_text": "<|end_of_text|>",
        "headers": ["<|start_header_id|>", "<|end_header_id|>"],
    },
    "qwen2": {
        "family": "qwen2",
        "template": QWEN2_TEMPLATE,
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "end_of_turn": "<|im_end|>",
        "end_of_text": "<|endoftext|>",
        "headers": ["<|im_start|>"],
    },
}

PROBE = ("What does assert do?", [Passage("assert — The assert statement", "Assert checks.")])
"""The prompt whose greedy answer each saved target ends with its end-of-turn token."""


def chat_tokenizer(kind: str, root: Path, specials: list[str] | None = None) -> Any:
    """A small byte-level BPE tokenizer with ``kind``'s special tokens and chat template."""
    spec = KINDS[kind]
    base_dir = root / "base_tokenizer"
    if not (base_dir / "tokenizer.json").exists():
        train_tokenizer(base_dir)
    inner = AutoTokenizer.from_pretrained(base_dir).backend_tokenizer
    inner.add_special_tokens(specials or spec["specials"])
    if spec["bos"]:  # Llama 3 puts BOS in front of every encoded text
        bos = inner.token_to_id(spec["bos"])
        inner.post_processor = processors.TemplateProcessing(
            single=f"{spec['bos']} $A",
            pair=f"{spec['bos']} $A {spec['bos']} $B",
            special_tokens=[(spec["bos"], bos)],
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=inner,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["end_of_text"],
    )
    tok.chat_template = spec["template"]
    return tok


def save_chat_pair(kind: str, root: Path) -> dict[str, Path]:
    """``{"target": dir, "draft": dir}``: a tiny ``kind`` pair sharing one chat tokenizer, with
    generation_config listing end of text and end of turn as EOS (as the real checkpoints do)."""
    spec = KINDS[kind]
    tok = chat_tokenizer(kind, root)
    end_of_turn = tok.convert_tokens_to_ids(spec["end_of_turn"])
    end_of_text = tok.convert_tokens_to_ids(spec["end_of_text"])
    target = build_model(
        spec["family"], vocab_size=len(tok), hidden_size=256, max_positions=1024, logit_scale=4.0
    )
    prompt = PromptFormat.for_tokenizer(tok).encode(*PROBE)
    with torch.no_grad():
        ids = list(prompt)
        for _ in range(3):  # greedy's third token: the end of turn takes its place
            ids.append(int(target(torch.tensor([ids])).logits[0, -1].argmax()))
        head = target.get_output_embeddings().weight
        head[end_of_turn] = 2.0 * head[ids[-1]]
    draft = perturbed_copy(target, 0.05)
    dirs = {}
    for name, model in (("target", target), ("draft", draft)):
        model.config.eos_token_id = end_of_turn if kind == "qwen2" else end_of_text
        model.config.bos_token_id = tok.bos_token_id
        model.generation_config.eos_token_id = [end_of_text, end_of_turn]
        model.generation_config.pad_token_id = end_of_text
        out_dir = root / kind / name
        model.save_pretrained(out_dir)
        tok.save_pretrained(out_dir)
        dirs[name] = out_dir
    return dirs
