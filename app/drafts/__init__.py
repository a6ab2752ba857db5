"""Drafts tuned from stored traffic: token ids kept at answer time, datasets, tuning, evaluation.

    answer (app/pipeline.py) → ``answer_token_ids`` (app/drafts/hooks.py, clear-question tenants
    only) → ``specrag draft dataset`` (app/drafts/dataset.py) → ``specrag draft tune``
    (app/drafts/tune.py) → ``specrag draft evaluate OLD NEW`` (app/drafts/evaluate.py)

docs/drafts.md is the operator's walk through the loop.
"""
