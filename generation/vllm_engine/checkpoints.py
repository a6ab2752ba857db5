"""Checks of the checkpoints a vLLM engine is started on, read from files only.

A 70B target is never loaded on the host to check it: limits and vocabularies come from
``config.json``, ``generation_config.json`` and the tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from generation.model.loading import (
    CheckpointError,
    check_vocab_compatible,
    checkpoint_limits_from_files,
)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def checkpoint_limits(target_dir: Path, draft_dir: Path | None) -> tuple[int, int, list[int]]:
    """Return (vocab_size, max_context, eos ids) read from the checkpoints' config files
    (generation/model/loading.py ``checkpoint_limits``, which the torch engine reads too)."""
    limits = checkpoint_limits_from_files(target_dir, draft_dir)
    if limits.vocab_size is None:
        raise CheckpointError(f"checkpoint {str(target_dir)!r}: config.json has no vocab_size")
    return limits.vocab_size, limits.max_context, limits.eos_token_ids


def check_draft_vocab(target_dir: Path, draft_dir: Path) -> None:
    """Raise ``IncompatibleDraftError`` unless the draft's vocabulary is the target's.

    Reads config files and tokenizers only: a 70B target is never loaded on the host to check.
    """
    sizes = [_read_json(d / "config.json").get("vocab_size") for d in (target_dir, draft_dir)]
    check_vocab_compatible(sizes[0], sizes[1], target_dir, draft_dir)
