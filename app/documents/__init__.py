"""Documents a tenant uploads: validated at the API, carried to an ingest worker, ingested there.

- ``upload``: an upload's validation at the API and its trip inside the task message.
- ``state``: an uploaded document's state (pending, indexed, failed with the reason).
- ``ingest``: the worker side: each file written privately, ingested under its own name.
- ``pdf_bounds``: a PDF's pages and content streams measured before its text is extracted.
- ``deadline``: a time limit for ingest work that holds on the solo pool.

The package ``__init__`` imports nothing, so importing one module never drags in the others.
"""
