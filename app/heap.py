"""The startup heap, frozen out of Python's cyclic garbage collector once a process is loaded.

A worker holds about a million long-lived objects once torch, transformers, the models and the
indexes are loaded; the API a few hundred thousand. Python's collector scans the whole oldest
generation on a full collection (hundreds of milliseconds on a shared 2-core host, every thread
stalled meanwhile), and it runs one whenever enough objects have survived into that generation
since the last. Short-lived work survives there when something holds it for a few seconds:
finished spans wait in the batch span processor's queue until the next export, so a traced
process reaches that point about twice as often, and each time pays for the whole heap.

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
