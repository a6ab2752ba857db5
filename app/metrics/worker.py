"""A worker's Prometheus metrics: counters named after vLLM's spec-decode metrics, fed once per answer.

Every number comes from the stats the pipeline stores for the same answer (``Answered.stats`` is
``GenerationStats.to_dict()`` with the service timings filled in), so a counter's increase over a
window equals the sum of the stored stats of the answers recorded in it, and each answer adds one
observation to every stage of ``specrag_request_latency_seconds``.

Labels stay bounded: ``method`` (one per ``app.enums.Method``), ``model_pair`` (one per worker),
``queue``, ``status``, ``stage``, ``position`` (below the largest k) and, only when
``SPECRAG_METRICS_TENANT_LABEL`` is on, ``tenant``. Question text is never a label.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from app.hooks import Answered
from app.tracing import dropped_spans

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
"""Seconds; from a cached retrieval (ms) to a long answer behind a backed-up queue (minutes)."""
BATCH_SIZE_BUCKETS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)
GROUNDEDNESS_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""Share of an answer's sentences that a retrieved passage supports (docs/grounding.md)."""
CHOSEN_K_BUCKETS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
STAGES = ("queue", "retrieval", "ttft", "generation", "total")
"""Stages of ``specrag_request_latency_seconds`` and the stats field (``<stage>_ms``) each reads."""
UNKNOWN = "unknown"

# Stored stats field -> counter name (without the ``_total`` that prometheus_client appends).
_COUNTED = {
    "num_drafts": "specrag_spec_decode_num_drafts",
    "num_draft_tokens": "specrag_spec_decode_num_draft_tokens",
    "num_accepted_tokens": "specrag_spec_decode_num_accepted_tokens",
    "num_output_tokens": "specrag_generation_tokens",
    "num_target_forwards": "specrag_target_forwards",
}
_HELP = {
    "num_drafts": "Verification rounds that carried at least one draft token.",
    "num_draft_tokens": "Draft tokens proposed and verified by the target.",
    "num_accepted_tokens": "Draft tokens the target accepted.",
    "num_output_tokens": "Tokens generated (accepted, recovered and bonus tokens).",
    "num_target_forwards": "Target forward passes after the prompt's prefill.",
}


class TraceExport(Collector):
    """Spans this process could not export (app/tracing/export.py counts them), read at scrape."""

    def collect(self) -> Any:
        """One counter family: the dropped spans so far (0 while tracing is off)."""
        yield CounterMetricFamily(
            "specrag_trace_spans_dropped",
            "Spans dropped because their export failed (collector down, refusing or too slow).",
            value=dropped_spans(),
        )


class WorkerMetrics:
    """The metrics of one worker process in their own registry; ``observe`` is the after-answer hook.

    ``tenant_label`` adds a ``tenant`` label (off by default: tenants can be many, and a tenant's
    name may itself be sensitive).
    """

    def __init__(self, *, tenant_label: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tenant_label = tenant_label
        base = ["method", "model_pair"] + (["tenant"] if tenant_label else [])
        reg = self.registry
        self.counters = {
            field: Counter(name, _HELP[field], base, registry=reg)
            for field, name in _COUNTED.items()
        }
        self.accepted_per_pos = Counter(
            "specrag_spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0-based, as vLLM).",
            [*base, "position"],
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "specrag_prompt_tokens", "Prompt tokens the target prefilled.", base, registry=reg
        )
        # vLLM's prefix_cache_queries / prefix_cache_hits, counted in prompt tokens.
        self.prefix_queries = Counter(
            "specrag_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache (answers whose engine reports reuse).",
            base,
            registry=reg,
        )
        self.prefix_hits = Counter(
            "specrag_prefix_cache_hits",
            "Prompt tokens whose KV was reused from earlier requests.",
            base,
            registry=reg,
        )
        self.queries = Counter(
            "specrag_queries",
            "Queries that became final on this worker, by queue and final status.",
            ["queue", "status", *base],
            registry=reg,
        )
        self.latency = Histogram(
            "specrag_request_latency_seconds",
            "Per-answer latency by stage (queue, retrieval, ttft, generation, total).",
            ["stage", *base],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.batch_size = Histogram(
            "specrag_engine_batch_size",
            "Mean number of requests in the target passes an answer took part in.",
            base,
            buckets=BATCH_SIZE_BUCKETS,
            registry=reg,
        )
        self.chosen_k = Histogram(
            "specrag_engine_chosen_k",
            "Mean k the engine chose over an answer's target passes (engines that choose k).",
            base,
            buckets=CHOSEN_K_BUCKETS,
            registry=reg,
        )
        self.groundedness = Histogram(
            "specrag_answer_groundedness",
            "Per-answer share of sentences a retrieved passage supports (answers with sentences).",
            base,
            buckets=GROUNDEDNESS_BUCKETS,
            registry=reg,
        )
        reg.register(TraceExport())
        # Labelled children per label set: .labels() costs a lock and a dict lookup per call.
        self._children: dict[tuple[str, ...], _Children] = {}
        self._lock = threading.Lock()

    def __call__(self, resources: Any, answered: Answered) -> None:
        """The after-answer hook (``app.hooks.register_after_answer(metrics)``)."""
        self.observe(answered)

    def observe(self, answered: Answered) -> None:
        """Count one final query: its status always; counters and latencies when it has stats."""
        stats = answered.stats
        method = answered.method or (stats or {}).get("method") or UNKNOWN
        base: tuple[str, ...] = (str(method), answered.model_pair or UNKNOWN)
        if self.tenant_label:
            base += (answered.tenant or UNKNOWN,)
        self.queries.labels(answered.queue, answered.status, *base).inc()
        if stats is None:
            return
        children = self._children_for(base)
        for field, counter in children.counters.items():
            counter.inc(stats.get(field) or 0)
        for position, count in enumerate(stats.get("accepted_per_position") or ()):
            children.per_pos(position).inc(count)
        children.prompt_tokens.inc(len(answered.prompt_token_ids))
        cached = stats.get("num_cached_prompt_tokens")
        if cached is not None:
            children.prefix_queries.inc(len(answered.prompt_token_ids))
            children.prefix_hits.inc(int(cached))
        for stage, histogram in children.latency.items():
            ms = stats.get(f"{stage}_ms")
            if ms is not None:
                histogram.observe(max(0.0, float(ms)) / 1000.0)
        if stats.get("mean_batch_size") is not None:
            children.batch_size.observe(float(stats["mean_batch_size"]))
        if stats.get("mean_chosen_k") is not None:
            children.chosen_k.observe(float(stats["mean_chosen_k"]))

    def observe_grounding(
        self, resources: Any, answered: Answered, grounding: dict[str, Any]
    ) -> None:
        """The after-grounding hook: one observation per answer that has a groundedness."""
        value = grounding.get("groundedness")
        if value is None:
            return
        method = answered.method or (answered.stats or {}).get("method") or UNKNOWN
        base: tuple[str, ...] = (str(method), answered.model_pair or UNKNOWN)
        if self.tenant_label:
            base += (answered.tenant or UNKNOWN,)
        self._children_for(base).groundedness.observe(float(value))

    def _children_for(self, base: tuple[str, ...]) -> _Children:
        found = self._children.get(base)
        if found is None:
            with self._lock:
                found = self._children.get(base)
                if found is None:
                    found = self._children[base] = _Children(self, base)
        return found


class _Children:
    """The labelled series of one (method, model_pair[, tenant]) label set."""

    def __init__(self, metrics: WorkerMetrics, base: tuple[str, ...]) -> None:
        self._metrics, self._base = metrics, base
        self.counters = {f: c.labels(*base) for f, c in metrics.counters.items()}
        self.prompt_tokens = metrics.prompt_tokens.labels(*base)
        self.prefix_queries = metrics.prefix_queries.labels(*base)
        self.prefix_hits = metrics.prefix_hits.labels(*base)
        self.latency = {stage: metrics.latency.labels(stage, *base) for stage in STAGES}
        self.batch_size = metrics.batch_size.labels(*base)
        self.chosen_k = metrics.chosen_k.labels(*base)
        self.groundedness = metrics.groundedness.labels(*base)
        self._per_pos: list[Any] = []

    def per_pos(self, position: int) -> Any:
        if position >= len(self._per_pos):
            with self._metrics._lock:  # two answers growing the list at once must not skip a label
                while len(self._per_pos) <= position:
                    label = str(len(self._per_pos))
                    self._per_pos.append(self._metrics.accepted_per_pos.labels(*self._base, label))
        return self._per_pos[position]
