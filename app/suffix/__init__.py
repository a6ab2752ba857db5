"""Suffix decoding's shared memory: each worker's suffix trees over the stored answers.

    answer recorded (app/pipeline.py) → token ids stored (app/drafts/hooks.py) → this worker
    learns it and announces it (app/suffix/hooks.py, memory.py) → every other worker hears it on
    the Redis stream (feed.py) and reads it from the database (store.py)

A scope is one tenant's collection: a query with method ``suffix`` drafts from its prompt, its
own output and the past answers of its scope only (``SamplingParams.suffix_scope``).
"""

from app.suffix.feed import request_sync
from app.suffix.memory import SharedSuffixMemory
from app.suffix.store import scope_of

__all__ = ["SharedSuffixMemory", "request_sync", "scope_of"]
