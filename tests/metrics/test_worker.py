"""A worker's metrics: each final query counted once, labels bounded, the port refused when taken."""

from __future__ import annotations

import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.hooks import Answered
from app.metrics import MetricsPortError, WorkerMetrics, serve
from app.metrics.serve import start_worker_metrics
from app.settings import Settings
from workers.cli import main


def _stats(**over: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "num_output_tokens": 11,
        "num_target_forwards": 5,
        "num_drafts": 4,
        "num_draft_tokens": 16,
        "num_accepted_tokens": 7,
        "accepted_per_position": [4, 2, 1, 0],
        "queue_ms": 12.0,
        "retrieval_ms": 30.0,
        "ttft_ms": 40.0,
        "generation_ms": 250.0,
        "total_ms": 320.0,
        "mean_batch_size": 2.5,
        "mean_chosen_k": None,
    }
    return stats | over


def _answered(status: str = "succeeded", **over: Any) -> Answered:
    fields: dict[str, Any] = {
        "query_id": uuid.uuid4(),
        "status": status,
        "queue": "answer",
        "tenant": "acme-secret-tenant",
        "stats": _stats() if status == "succeeded" else None,
        "model_pair": "target+draft",
        "method": "draft_model",
        "prompt_token_ids": list(range(9)),
    }
    return Answered(**(fields | over))


def _samples(metrics: WorkerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_counters_add_up_the_stats_of_each_answer() -> None:
    metrics = WorkerMetrics()
    metrics(None, _answered())
    metrics(None, _answered(stats=_stats(num_output_tokens=3, accepted_per_position=[1, 1, 0])))
    s = _samples(metrics)
    base = {"method": "draft_model", "model_pair": "target+draft"}
    assert _value(s, "specrag_generation_tokens_total", **base) == 14
    assert _value(s, "specrag_spec_decode_num_drafts_total", **base) == 8
    assert _value(s, "specrag_spec_decode_num_draft_tokens_total", **base) == 32
    assert _value(s, "specrag_spec_decode_num_accepted_tokens_total", **base) == 14
    assert _value(s, "specrag_target_forwards_total", **base) == 10
    assert _value(s, "specrag_prompt_tokens_total", **base) == 18
    name = "specrag_spec_decode_num_accepted_tokens_per_pos_total"
    assert [_value(s, name, position=str(p)) for p in range(4)] == [5, 3, 1, 0]
    assert _value(s, "specrag_queries_total", queue="answer", status="succeeded") == 2
    for stage, ms in (("queue", 12), ("retrieval", 30), ("ttft", 40), ("generation", 250)):
        assert _value(s, "specrag_request_latency_seconds_count", stage=stage) == 2
        assert _value(s, "specrag_request_latency_seconds_sum", stage=stage) == pytest.approx(
            2 * ms / 1000
        )
    assert _value(s, "specrag_engine_batch_size_sum") == 5.0
    assert _value(s, "specrag_engine_chosen_k_count") == 0  # the engine chose no k


def test_prefix_cache_counters_are_prompt_tokens_queried_and_reused() -> None:
    metrics = WorkerMetrics()
    metrics(None, _answered(stats=_stats(num_cached_prompt_tokens=6)))
    metrics(None, _answered(stats=_stats(num_cached_prompt_tokens=0)))
    metrics(None, _answered(prompt_token_ids=list(range(30))))  # an engine that reports nothing
    s = _samples(metrics)
    assert _value(s, "specrag_prefix_cache_queries_total") == 18  # 9 + 9; the third not queried
    assert _value(s, "specrag_prefix_cache_hits_total") == 6
    assert _value(s, "specrag_prompt_tokens_total") == 48


def test_a_failed_query_is_counted_by_status_only() -> None:
    metrics = WorkerMetrics()
    metrics(None, _answered("failed", queue="batch", model_pair=None))
    s = _samples(metrics)
    assert _value(s, "specrag_queries_total", queue="batch", status="failed") == 1
    assert _value(s, "specrag_generation_tokens_total") == 0
    assert _value(s, "specrag_request_latency_seconds_count") == 0


def test_missing_timings_are_not_observed_and_the_tenant_stays_out_unless_asked() -> None:
    metrics = WorkerMetrics()
    metrics(None, _answered(stats=_stats(ttft_ms=None)))
    s = _samples(metrics)
    assert _value(s, "specrag_request_latency_seconds_count", stage="ttft") == 0
    assert _value(s, "specrag_request_latency_seconds_count", stage="total") == 1
    text = generate_latest(metrics.registry).decode()
    assert "acme-secret-tenant" not in text and "tenant=" not in text

    labelled = WorkerMetrics(tenant_label=True)
    labelled(None, _answered())
    s = _samples(labelled)
    assert _value(s, "specrag_queries_total", tenant="acme-secret-tenant") == 1


@pytest.fixture
def listening() -> Iterator[int]:
    """A port some other socket listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_serve_answers_scrapes_and_frees_the_port_on_close() -> None:
    metrics = WorkerMetrics()
    metrics(None, _answered())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = serve(metrics.registry, port, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            body = reply.read().decode()
        assert "specrag_generation_tokens_total" in body
    finally:
        server.close()
    serve(metrics.registry, port, "127.0.0.1").close()  # free again after close


def test_a_taken_port_is_refused_with_the_reason(listening: int) -> None:
    with pytest.raises(MetricsPortError, match=f"port {listening} .*taken"):
        serve(WorkerMetrics().registry, listening, "127.0.0.1")


def test_prefork_is_refused_and_unset_port_serves_nothing() -> None:
    assert start_worker_metrics(Settings(metrics_port=None)) is None
    with pytest.raises(MetricsPortError, match="prefork"):
        start_worker_metrics(Settings(metrics_port=9400, worker_pool="prefork"))


def test_specrag_worker_stops_at_start_on_a_taken_port(tmp_path: Path, listening: int) -> None:
    env = {
        "SPECRAG_DATA_DIR": str(tmp_path),
        "SPECRAG_METRICS_PORT": str(listening),
        "SPECRAG_METRICS_HOST": "127.0.0.1",
    }
    result = CliRunner().invoke(main, ["worker", "--queues", "answer"], env=env)
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert line.count("\n") == 0, line
    assert line.startswith("error: SPECRAG_METRICS_PORT") and str(listening) in line
    assert "taken" in line
