"""Batch reprocessing jobs: re-run supplied or stored questions on the ``batch`` queue, compare.

Submit (``app.batch.submit``) validates everything and stores the batch, its items and one queued
query per item in one transaction; chunk tasks (workers/batch_tasks.py) run ``app.batch.runner``;
``app.batch.report`` compares the new answers with the ones they re-ran.

Only the tables and pure helpers are re-exported here; ``app.tables`` registers the tables on the
shared metadata.
"""

from app.batch.records import BATCH_STATUSES, ITEM_STATUSES, Batch, BatchItem

__all__ = ["BATCH_STATUSES", "ITEM_STATUSES", "Batch", "BatchItem"]
