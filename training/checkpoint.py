"""A training run's checkpoint: its modules, their optimizers and the loop's counters, in one file.

Every trainer here (the pair from nothing and onto a chat template, draft distillation, the EAGLE
head, the tunes from stored traffic) resumes the same way, so the rule lives here once: the file
is written beside the old one and moved over it (a kill never leaves half a checkpoint), and a
resumed run loads each module and optimizer under the name it was saved with.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch


def load_checkpoint(
    path: Path,
    modules: Mapping[str, Any],
    optimizers: Mapping[str, Any],
    check: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any] | None:
    """Load ``path`` (if it exists) into ``modules`` and ``optimizers``, each by its name in the
    file; returns everything the file holds (``state``, and any extra entries), or None.
    ``check``: called with the file's contents before anything is loaded (it raises to refuse a
    checkpoint of another run)."""
    if not path.exists():
        return None
    saved: dict[str, Any] = torch.load(path, weights_only=False)
    if check is not None:
        check(saved)
    for name, module in {**modules, **optimizers}.items():
        module.load_state_dict(saved[name])
    return saved


def save_checkpoint(
    path: Path, modules: Mapping[str, Any], optimizers: Mapping[str, Any], **extra: Any
) -> None:
    """Write ``modules``' and ``optimizers``' state dicts under their names, and ``extra``
    (``state``: the loop's counters), to ``path`` atomically."""
    tmp = path.with_suffix(".tmp")
    payload = {name: obj.state_dict() for name, obj in {**modules, **optimizers}.items()}
    torch.save({**payload, **extra}, tmp)
    os.replace(tmp, path)
