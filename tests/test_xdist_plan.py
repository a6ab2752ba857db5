"""tests/xdist_plan.py: the threads each xdist process gets and the files it starts first."""

from __future__ import annotations

import os
from pathlib import Path

from tests.xdist_plan import SLOWEST_FIRST, WORKER_FOLDERS, thread_share

ROOT = Path(__file__).resolve().parents[1]


def test_each_process_gets_its_share_of_the_cores_and_at_least_one() -> None:
    cores = len(os.sched_getaffinity(0))
    assert thread_share(1) == cores
    assert thread_share(2) == max(1, cores // 2)
    assert thread_share(cores + 1) == 1
    assert thread_share(0) == cores  # no worker count: the whole machine


def test_the_slowest_files_and_worker_folders_exist_and_run_under_xdist() -> None:
    # A renamed or moved file would silently lose its place at the front.
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    for path in SLOWEST_FIRST:
        assert (ROOT / path).is_file(), path
        assert not path.startswith("tests/vllm/"), path  # tests/vllm runs in one process
    assert all((ROOT / folder).is_dir() for folder in WORKER_FOLDERS), WORKER_FOLDERS
