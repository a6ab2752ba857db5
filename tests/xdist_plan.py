"""How ``make test`` shares the machine between its pytest-xdist processes (tests/conftest.py).

Threads: each process gets its share of the cores for torch's and OpenMP's intra-op threads.
Two processes on two cores with torch's default (one thread per core) put four spinning threads
on two cores, and a tiny model's barrier-bound step then runs many times slower (the
``_one_torch_thread`` fixtures of tests/generation and tests/models say the same for one
process on a shared CPU). ``OMP_NUM_THREADS`` reaches the workers and CLIs the tests start.

Order: ``--dist loadfile`` hands out whole files, and xdist by default hands out the files with
the most tests first, so the few-test files that start live workers (the slowest of all) came
last and one process ran them alone while the other sat idle. Longest first instead: the files
in SLOWEST_FIRST lead, in that order; then the other files of WORKER_FOLDERS, whose every file
starts live workers (tens of seconds, however few its tests); then the rest. Within the last two
groups, most tests first, as xdist would order them (the Makefile passes
``--no-loadscope-reorder`` so that xdist keeps this order).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

SLOWEST_FIRST = (
    "tests/integration/test_faults_database.py",
    "tests/generation/test_sampling_distribution.py",
    "tests/retrieval/test_golden.py",
    "tests/integration/test_compose_cpu_worker.py",
    "tests/integration/test_concurrency.py",
    "tests/integration/test_service.py",
    "tests/integration/test_client_retries.py",
)
"""The files that took longest in ``make test`` (its ``--durations`` list), longest first."""
WORKER_FOLDERS = ("tests/integration/", "tests/batch/")
"""Folders whose files start live workers or services: after SLOWEST_FIRST, before the rest."""


def thread_share(workers: int) -> int:
    """Intra-op threads for one of ``workers`` processes on this machine's cores (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, workers))


def share_threads(config: pytest.Config) -> None:
    """In an xdist worker process: torch and OpenMP threads to its share of the cores, for it
    and the processes it starts."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    threads = thread_share(int(workerinput["workercount"]))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def slowest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker process: order ``items`` by file, SLOWEST_FIRST's files first, then
    WORKER_FOLDERS' files, then the rest, each group by number of tests (most first); within a
    file, as collected."""
    if getattr(config, "workerinput", None) is None:
        return
    root = config.rootpath
    files = [item.path.relative_to(root).as_posix() for item in items]
    counts = Counter(files)
    rank = {path: n for n, path in enumerate(SLOWEST_FIRST)}
    first_seen: dict[str, int] = {}
    for path in files:
        first_seen.setdefault(path, len(first_seen))

    def key(pair: tuple[str, pytest.Item]) -> tuple[int, int, int]:
        path = pair[0]
        group = rank.get(path, len(rank) + (0 if path.startswith(WORKER_FOLDERS) else 1))
        return (group, -counts[path], first_seen[path])

    items[:] = [item for _, item in sorted(zip(files, items, strict=True), key=key)]
