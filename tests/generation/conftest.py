"""Fixtures of the generation tests: tiny models, one CPU thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

# The vLLM stand-in's fixtures, for test_vllm_engine.py and test_vllm_loop.py.
from tests.generation.vllm_standin import engine_factory, standin_vllm  # noqa: F401


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    # The CPU is shared: two intra-op threads contending with other jobs run tiny models
    # about 40x slower than one thread.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
