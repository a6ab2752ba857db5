"""Loading a target/draft pair from local Hugging Face checkpoints, validated before use.

Nothing is fetched from a model hub: every path must be a local directory holding a
``config.json`` and weights that ``AutoModelForCausalLM`` can load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
    and, where both ship a tokenizer, their content: every id must stand for the same token,
    and the same tokens must be special (a draft tokenizing differently would propose ids
    meaning other strings).  The error names the first differing token.  The chat templates
    may differ: the prompt is always the target's.
    """
    if target_size != draft_size:
        raise IncompatibleDraftError(
            f"draft {str(draft_dir)!r} has vocabulary size {draft_size}, "
            f"target {str(target_dir)!r} has {target_size}{_SAME_VOCAB}"
        )
    if not (has_tokenizer(target_dir) and has_tokenizer(draft_dir)):
        return
    difference = first_token_difference(load_tokenizer(target_dir), load_tokenizer(draft_dir))
    if difference is not None:
        raise IncompatibleDraftError(
            f"draft {str(draft_dir)!r} and target {str(target_dir)!r} have different tokens: "
            f"{difference}{_SAME_VOCAB}"
        )


_SAME_VOCAB = (
    "; the draft must use the target's tokenizer (drafts with their own vocabulary are not "
    "supported)"
)


def first_token_difference(target: Any, draft: Any) -> str | None:
    """The first way two tokenizers' tokens differ, in words, or None when they are the same.

    Checked in order: each id's token (lowest differing id first), then which tokens are
    special (the added tokens and the named BOS/EOS/padding tokens).
    """
    t_by_id = {i: tok for tok, i in target.get_vocab().items()}
    d_by_id = {i: tok for tok, i in draft.get_vocab().items()}
    for i in sorted(set(t_by_id) | set(d_by_id)):
        if t_by_id.get(i) != d_by_id.get(i):
            return f"id {i} is {t_by_id.get(i)!r} in the target and {d_by_id.get(i)!r} in the draft"
    t_special, d_special = _special_tokens(target), _special_tokens(draft)
    for tok in sorted(t_special.keys() | d_special.keys()):
        if t_special.get(tok) != d_special.get(tok):
            return (
                f"token {tok!r} is special in the {'target' if tok in t_special else 'draft'} "
                f"only, or with another role (target {t_special.get(tok)}, "
                f"draft {d_special.get(tok)})"
            )
    return None


def _special_tokens(tokenizer: Any) -> dict[str, str]:
    """Special token -> what it is ("special", "bos", "eos", "pad", "unk")."""
    out: dict[str, str] = {}
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    for added in decoder.values():
        if getattr(added, "special", False):
            out[str(added)] = "special"
    for role in ("bos", "eos", "pad", "unk"):
        token = getattr(tokenizer, f"{role}_token", None)
        if token:
            out[str(token)] = role
    return out


@dataclass(frozen=True)
class CheckpointLimits:
    """What both engines read from a pair's configs: the one reader of these limits."""

    vocab_size: int | None
    """config.json's ``vocab_size`` of the target (None when it names none)."""
    max_context: int
    """Longest sequence both models accept (the smaller of the two)."""
    eos_token_ids: list[int]
    """Every id that ends an answer: generation_config.json's ``eos_token_id`` (one or a list,
    as Llama 3's end of text and end of turn), then config.json's, without repeats."""


def checkpoint_limits(
    target_config: Any, target_generation: Any = None, draft_config: Any = None
) -> CheckpointLimits:
    """The limits of a pair from its configs (objects or dicts; generation config optional)."""
    contexts = [max_context(c) for c in (target_config, draft_config) if c is not None]
    eos: list[int] = []
    for source in (target_generation, target_config):
        for value in _ids(_get(source, "eos_token_id")):
            if value not in eos:
                eos.append(value)
    vocab = _get(target_config, "vocab_size")
    return CheckpointLimits(vocab if isinstance(vocab, int) else None, min(contexts), eos)


def checkpoint_limits_from_files(target_dir: Path, draft_dir: Path | None) -> CheckpointLimits:
    """``checkpoint_limits`` read from the directories' config files (no model is loaded)."""

    def read(path: Path) -> dict[str, Any] | None:
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{str(path)!r}: unreadable ({exc})") from exc
        return data if isinstance(data, dict) else None

    return checkpoint_limits(
        read(target_dir / "config.json") or {},
        read(target_dir / "generation_config.json"),
        read(draft_dir / "config.json") if draft_dir is not None else None,
    )


def _get(config: Any, name: str) -> Any:
    if config is None:
        return None
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def max_context(config: Any) -> int:
    """Return the longest sequence a model of ``config`` (an object or a dict) accepts."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = _get(config, name)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 30


def eos_token_ids(model: Any) -> list[int]:
    """Return the model's end-of-sequence ids (``CheckpointLimits.eos_token_ids``)."""
    return checkpoint_limits(model.config, getattr(model, "generation_config", None)).eos_token_ids
