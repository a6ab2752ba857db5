"""Checks of the checkpoints a vLLM engine is started on, read from files only.

A 70B target is never loaded on the host to check it: limits and vocabularies come from
``config.json``, ``generation_config.json`` and the tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from generation.loading import CheckpointError, check_vocab_compatible


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def checkpoint_limits(target_dir: Path, draft_dir: Path | None) -> tuple[int, int, list[int]]:
    """Return (vocab_size, max_context, eos ids) read from the checkpoints' config files."""
    target = _read_json(target_dir / "config.json")
    contexts = [
        _read_json(d / "config.json").get("max_position_embeddings")
        for d in (target_dir, draft_dir)
        if d
    ]
    eos = _read_json(target_dir / "generation_config.json").get("eos_token_id")
    if eos is None:
        eos = target.get("eos_token_id")
    eos_ids = [int(e) for e in eos] if isinstance(eos, list) else [] if eos is None else [int(eos)]
    max_context = min((c for c in contexts if isinstance(c, int) and c > 0), default=1 << 30)
    if not isinstance(target.get("vocab_size"), int):
        raise CheckpointError(f"checkpoint {str(target_dir)!r}: config.json has no vocab_size")
    return target["vocab_size"], max_context, eos_ids


def check_draft_vocab(target_dir: Path, draft_dir: Path) -> None:
    """Raise ``IncompatibleDraftError`` unless the draft's vocabulary is the target's.

    Reads config files and tokenizers only: a 70B target is never loaded on the host to check.
    """
    sizes = [_read_json(d / "config.json").get("vocab_size") for d in (target_dir, draft_dir)]
    check_vocab_compatible(sizes[0], sizes[1], target_dir, draft_dir)
