"""The startup heap, frozen out of Python's cyclic garbage collector once a process is loaded.

A ``specrag worker`` on the tiny demo pair holds about 600,000 tracked objects once torch,
transformers, the models and the indexes are loaded; ``specrag api`` about 190,000. A full
collection scans all of them (about half a second each on a busy 2-core host, every thread of
the process stalled meanwhile), and Python runs one whenever enough objects have survived into
the oldest generation since the last. Short-lived work lands there when something holds it for
a few seconds: finished spans wait in the batch span processor's queue until the next export,
so a traced process gets there sooner, and each time pays for the whole heap.

``freeze_startup_heap`` collects once and then moves every object alive into the permanent
generation (``gc.freeze``): full collections from then on scan only what was made since, which
keeps them short whatever a query leaves behind for a while. The frozen objects are the
process's modules, models and settings, which live as long as it does.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_heap() -> int:
    """Collect, then freeze every live object out of the collector's scans; how many were frozen.

    Called once a process has loaded what it keeps (``specrag worker`` after its resources are
    warm, ``specrag api`` before it serves). Calling it again freezes what was made since.
    """
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("startup heap frozen: %d objects out of the garbage collector's scans", frozen)
    return frozen
