"""Fixtures of the demo-pair tests: the shipped checkpoints, one CPU thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    # The CPU is shared with other jobs; two intra-op threads then spin at barriers.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def demo_dirs() -> tuple[Path, Path]:
    """The shipped (target, draft) directories; the tests fail, not skip, when they are absent."""
    return DEMO / "target", DEMO / "draft"
