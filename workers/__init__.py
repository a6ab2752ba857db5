"""Celery only: implements app/dispatch.py, routing, thin tasks, per-process resources.

``workers.cli`` is the composition root: the ``specrag`` console script, with this queue wired into
app/'s CLI and API.
"""

from workers.app import QUEUES, ROUTES, SpecragCelery, create_celery
from workers.dispatcher import CeleryDispatcher, chunk_signature, dispatch_batch, send_query

__all__ = [
    "QUEUES",
    "ROUTES",
    "CeleryDispatcher",
    "SpecragCelery",
    "chunk_signature",
    "create_celery",
    "dispatch_batch",
    "send_query",
]
