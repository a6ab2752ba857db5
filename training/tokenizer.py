"""The pair's shared tokenizer: byte-level BPE trained on the corpus, saved for transformers."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer over ``texts`` with ``<|endoftext|>`` as EOS and padding."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Write the tokenizer files into a checkpoint directory."""
    tokenizer.save_pretrained(str(out_dir))


# The instruct pair's chat template: ChatML (as Qwen2's), no default system turn.
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def add_chat_tokens(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """``tokenizer`` with ChatML's two special tokens appended (ids ``len(tokenizer)`` and +1),
    ``<|im_end|>`` as EOS (it ends an answer; ``<|endoftext|>`` stays the padding) and the
    ChatML template."""
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.eos_token = IM_END
    tokenizer.pad_token = EOS_TOKEN
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
