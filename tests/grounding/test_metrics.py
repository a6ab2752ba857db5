"""The worker's groundedness histogram: one observation per answer that has a groundedness."""

from __future__ import annotations

import uuid

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.hooks import (
    Answered,
    register_after_grounding,
    run_after_grounding,
    unregister_after_grounding,
)
from app.metrics import WorkerMetrics


def _samples(metrics: WorkerMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        if f.name == "specrag_answer_groundedness"
        for s in f.samples
    }


def test_groundedness_is_observed_once_per_grounded_answer() -> None:
    metrics = WorkerMetrics()
    answered = Answered(uuid.uuid4(), "succeeded", method="draft_model", model_pair="p")
    register_after_grounding(metrics.observe_grounding)
    try:
        run_after_grounding(None, answered, {"groundedness": 0.5})
        run_after_grounding(None, answered, {"groundedness": None, "reason": "no passages"})
    finally:
        unregister_after_grounding(metrics.observe_grounding)
    found = _samples(metrics)
    labels = str(sorted({"method": "draft_model", "model_pair": "p"}.items()))
    assert found["specrag_answer_groundedness_count" + labels] == 1.0
    assert found["specrag_answer_groundedness_sum" + labels] == 0.5
    le = str(sorted({"method": "draft_model", "model_pair": "p", "le": "0.4"}.items()))
    assert found["specrag_answer_groundedness_bucket" + le] == 0.0
