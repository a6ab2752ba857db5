"""Loading a target/draft pair from local Hugging Face checkpoints, validated before use.

Nothing is fetched from a model hub: every path must be a local directory holding a
``config.json`` and weights that ``AutoModelForCausalLM`` can load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete or not a causal language model."""


class IncompatibleDraftError(ValueError):
    """The draft's vocabulary differs from the target's, so its tokens cannot be verified."""


def validate_checkpoint(model_dir: str | Path) -> Path:
    """Return the checkpoint directory as a Path once it holds a loadable causal LM."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r}: directory does not exist")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r}: no config.json")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise CheckpointError(
            f"checkpoint {str(path)!r}: no weights (expected one of {', '.join(WEIGHT_FILES)})"
        )
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r}: unreadable config.json ({exc})") from exc
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: model_type {model_type!r} is not a causal language model"
        )
    return path


def resolve_device(device: str | torch.device) -> torch.device:
    """Return a torch device for "cpu", "cuda", "cuda:N" or "auto" (CUDA when available)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_causal_lm(
    model_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> Any:
    """Return the checkpoint's model in eval mode on ``device``, its weights in ``dtype``
    (None: float32 on CPU, bf16 on CUDA)."""
    path = validate_checkpoint(model_dir)
    dev = resolve_device(device)
    if dtype is None:  # bf16 matmuls are slow on most CPUs; on GPUs they are the fast path.
        dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=dtype, local_files_only=True
    )
    return model.to(dev).eval()  # type: ignore[arg-type]


def has_tokenizer(model_dir: str | Path) -> bool:
    """Return whether the checkpoint directory ships tokenizer files."""
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """Return the tokenizer shipped in ``model_dir``; a clear error names the dir when absent."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"tokenizer {str(path)!r}: directory does not exist")
    if not has_tokenizer(path):
        raise CheckpointError(
            f"tokenizer {str(path)!r}: no tokenizer files (expected one of "
            f"{', '.join(TOKENIZER_FILES)})"
        )
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def output_vocab_size(model: Any) -> int:
    """Return the number of logits the model produces per position."""
    return int(model.get_output_embeddings().weight.shape[0])


def check_vocab_compatible(
    target_size: Any, draft_size: Any, target_dir: str | Path, draft_dir: str | Path
) -> None:
    """Raise ``IncompatibleDraftError`` unless the draft scores the same token ids as the target.

    Compared: the vocabulary sizes the caller read (a loaded model's logits, or config.json),
    and the token-to-id maps where both ship a tokenizer (a draft tokenizing differently would
    propose ids meaning other strings).
    """
    if target_size != draft_size:
        raise IncompatibleDraftError(
            f"draft {str(draft_dir)!r} has vocabulary size {draft_size}, "
            f"target {str(target_dir)!r} has {target_size}"
        )
    if not (has_tokenizer(target_dir) and has_tokenizer(draft_dir)):
        return
    target_vocab = load_tokenizer(target_dir).get_vocab()
    draft_vocab = load_tokenizer(draft_dir).get_vocab()
    if target_vocab == draft_vocab:
        return
    differing = sorted(
        tok
        for tok in set(target_vocab) | set(draft_vocab)
        if target_vocab.get(tok) != draft_vocab.get(tok)
    )
    examples = ", ".join(
        f"{tok!r}: target {target_vocab.get(tok)} vs draft {draft_vocab.get(tok)}"
        for tok in differing[:3]
    )
    raise IncompatibleDraftError(
        f"draft {str(draft_dir)!r} and target {str(target_dir)!r} map {len(differing)} tokens "
        f"to different ids (e.g. {examples})"
    )


def max_context(config: Any) -> int:
    """Return the longest sequence a model of ``config`` (an object or a dict) accepts."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 30


def eos_token_ids(model: Any) -> list[int]:
    """Return the model's end-of-sequence ids (generation config first, then model config)."""
    value = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if value is None:
        value = getattr(model.config, "eos_token_id", None)
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
