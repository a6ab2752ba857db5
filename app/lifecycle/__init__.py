"""One query's life in the database, from stored to final: every state change lives here.

- ``queries``: storing a query (idempotency), its JSON view, waiting for it to finish.
- ``outbox``: getting stored queries onto the queue (admission in tenant round-robin, the sweep).
- ``reaper``: queries whose worker or message was lost, marked unsent again (or failed).
- ``lease``: a worker's claim on a query, its heartbeat, its release.
- ``finish``: the one transition to a final state (privacy applied in it).
- ``handback``: a query whose attempt cannot finish it, handed back or failed.
- ``outage``: telling a database outage from the query's own failure, and riding it out.
- ``failures``: the stable error text a client sees per kind of failure.

The package ``__init__`` imports nothing, so importing one module never drags in the others.
"""
