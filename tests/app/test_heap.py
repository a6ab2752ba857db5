"""app/heap.py: what a process holds once loaded leaves the collector's scans; later objects not."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from app.heap import freeze_startup_heap


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()  # this test process goes on collecting as before


class Held:
    """A container the collector tracks (it scans only such objects)."""


def test_the_startup_heap_is_frozen_and_what_comes_later_is_scanned(unfrozen_after: None) -> None:
    loaded = Held()
    assert gc.is_tracked(loaded)
    # The count is not compared with a second read: a frozen object still dies when its last
    # reference goes, and other threads of this process free objects meanwhile.
    assert freeze_startup_heap() > 0
    scanned = {id(o) for o in gc.get_objects()}
    assert id(loaded) not in scanned
    later = Held()
    assert id(later) in {id(o) for o in gc.get_objects()}
