"""Audit's after-answer work, registered on the pipeline's hooks (app/hooks.py).

The pipeline knows nothing of audit: a process that answers queries (a worker, ``ask --local``)
calls ``install_hooks`` once, and every succeeded answer may then leave a shadow sample for the
baseline decode. Privacy needs no hook: the final-state transition itself stores the question
in its kept form (app/lifecycle/finish.py), so no process can forget it.
"""

from __future__ import annotations

from typing import Any

from app.evals.shadow import sample
from app.hooks import Answered, register_after_answer
from app.requests import QueryStatus


def shadow_sample(resources: Any, answered: Answered) -> None:
    """Store a pending shadow run for a succeeded answer when it is sampled."""
    if answered.status != QueryStatus.SUCCEEDED:
        return
    sample(
        resources.session_factory,
        resources.settings,
        answered.query_id,
        params=answered.params,
        prompt_ids=answered.prompt_token_ids,
        output_ids=answered.output_token_ids,
    )


def install_hooks() -> None:
    """Register audit's after-answer hooks (idempotent)."""
    register_after_answer(shadow_sample)
