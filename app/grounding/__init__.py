"""Grounding in the service: the process's scorer, the after-answer hook, the stored results.

The scorer itself lives in ``retrieval.grounding`` (pure: no settings, no database); this room
chooses it from the settings, grounds recorded answers and stores the results (docs/grounding.md).
"""

from app.grounding.hooks import ground_answer, install_hooks
from app.grounding.scorer import load_scorer
from app.grounding.store import ground_stored, store, wait_for_grounding

__all__ = [
    "ground_answer",
    "ground_stored",
    "install_hooks",
    "load_scorer",
    "store",
    "wait_for_grounding",
]
