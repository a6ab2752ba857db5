"""A tiny byte-level BPE tokenizer for tests and benchmarks that need one in seconds."""

from __future__ import annotations

from pathlib import Path

DEMO_CORPUS = Path(__file__).resolve().parents[1] / "demo" / "corpus"


def train_tokenizer(out_dir: Path, vocab_size: int = 512) -> None:
    """A byte-level BPE tokenizer trained in seconds on a few demo corpus files, saved to ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(str(p) for p in DEMO_CORPUS.glob("*.md"))[:12]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(out_dir)
