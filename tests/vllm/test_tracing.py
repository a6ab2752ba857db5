"""vLLM's own ``llm_request`` span is a child of ours: the loop hands vLLM the ``traceparent``.

On the real CPU build: an engine started with ``otlp_traces_endpoint`` (what app/resources.py
adds while the worker traces) exports to an OTLP/HTTP receiver in this process, and a request
submitted with a ``traceparent`` comes back as a span of that trace, under that span.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from generation import SamplingParams
from testkit.otlp import OtlpReceiver
from tests.generation.tiny_models import build_model, perturbed_copy, save_checkpoint
from tests.vllm.support import SMALL_KV, EnginePool


def test_vllms_request_span_is_a_child_of_the_callers(
    engine_pool: EnginePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A head size vLLM's CPU attention serves (the conformance suite's pair).
    target = build_model("llama", vocab_size=96, seed=3, hidden_size=256, logit_scale=4.0)
    target_dir = save_checkpoint(target, tmp_path / "target")
    draft_dir = save_checkpoint(perturbed_copy(target, noise=0.3), tmp_path / "draft")
    # vLLM reads only the traces-specific protocol name and defaults to gRPC; the worker sets it
    # (app/tracing/setup.py), this test does the same before the engine starts.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    with OtlpReceiver() as receiver:
        llm_kwargs = {**SMALL_KV, "otlp_traces_endpoint": f"{receiver.endpoint}/v1/traces"}
        engine = engine_pool.get(
            target_dir, draft_dir, "draft_model", 2, max_model_len=256, llm_kwargs=llm_kwargs
        )
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        loop = engine.start_loop(2)
        try:
            params = SamplingParams(
                max_new_tokens=4, method="draft_model", num_speculative_tokens=2
            )
            traced = {"traceparent": f"00-{trace_id}-{parent}-01"}
            result = loop.submit([5, 6, 7, 8], params, trace_headers=traced).result(120)
            loop.submit([5, 6, 7, 8], params).result(120)  # no context: a trace of its own
        finally:
            loop.close()
        assert result.token_ids
        (span,) = receiver.wait_for(trace_id, {"llm_request"}, timeout=60)
        assert span.parent_span_id == parent
        assert span.attributes["gen_ai.usage.completion_tokens"] == len(result.token_ids)
