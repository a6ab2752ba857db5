"""One trace per query on the real parts: ``specrag api`` and ``specrag worker`` subprocesses on
PostgreSQL and Redis, exporting OTLP/HTTP protobuf to a receiver in this process.

The client's ``traceparent`` must reach every span: the API's server span, the Celery publish,
the worker's task, claim, retrieval with its legs, prompt build, generation and record, each
under the right parent; no question or answer text leaves the service while content is off; a
malformed ``traceparent`` starts a new trace; a collector that refuses costs no answer.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from testkit.otlp import OtlpReceiver, ReceivedSpan
from tests.conftest import claimed_redis_db, fresh_pg_database
from tests.integration.conftest import ingest_corpus, make_keys
from tests.integration.helpers import REPO_ROOT, free_port, settings_env
from workers.process import WorkerProcess

SERVER, CLIENT, PRODUCER, CONSUMER = 2, 3, 4, 5  # OTLP's SpanKind numbers
PUBLISH, RUN = "apply_async/specrag.answer_query", "run/specrag.answer_query"
QUESTION = "What does the assert statement check in Python?"
SPEC_DECODE = (
    "method",
    "num_speculative_tokens",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "mean_chosen_k",
    "num_cached_prompt_tokens",
    "mean_batch_size",
    "dtype",
)


@dataclass
class Traced:
    """A traced deployment: its receiver, API URL, keys, and the worker (for its log)."""

    receiver: OtlpReceiver
    url: str
    keys: dict[str, str]
    collection: str
    worker: WorkerProcess


def _env(settings: Settings, endpoint: str) -> dict[str, str]:
    env = settings_env(settings)
    for name in [n for n in env if n.startswith("OTEL_")]:
        del env[name]
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_TRACES_SAMPLER="parentbased_always_on",
        OTEL_BSP_SCHEDULE_DELAY="100",  # export within a tenth of a second, not five
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        SPECRAG_TRACE_SQL="true",  # the SQL spans are asked for (off by default: their cost)
    )
    return env


@pytest.fixture(scope="module")
def traced(
    service_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Traced]:
    """A ``specrag api`` and a ``specrag worker`` (answer and batch queues, every answer shadowed)
    on a database and a Redis database of their own, tracing to a receiver in this process."""
    tmp = tmp_path_factory.mktemp("traced")
    with fresh_pg_database(migrated=True) as url, claimed_redis_db() as broker:
        settings = service_settings.model_copy(
            update={"database_url": url, "data_dir": tmp / "data", "broker_url": broker,
                    "shadow_sample_rate": 1.0}
        )  # fmt: skip
        keys, collection = make_keys(settings), ingest_corpus(settings)
        with OtlpReceiver() as receiver:
            env = _env(settings, receiver.endpoint)
            worker = WorkerProcess(
                env, tmp / "worker.log", queues="answer,batch", name="traced", cwd=REPO_ROOT
            ).start()
            port = free_port()
            api_log = (tmp / "api.log").open("wb")
            api = subprocess.Popen(
                [str(Path(sys.executable).parent / "specrag"), "api", "--host", "127.0.0.1",
                 "--port", str(port)],
                env=env, cwd=REPO_ROOT, stdout=api_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                url = f"http://127.0.0.1:{port}"
                _wait_healthy(url, api)
                worker.wait_ready()
                yield Traced(receiver, url, keys, collection, worker)
            finally:
                api.terminate()
                api.wait(timeout=30)
                api_log.close()
                worker.stop()


def _wait_healthy(url: str, api: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert api.poll() is None, "specrag api exited"
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("specrag api not healthy in 120 s")


def _ask(t: Traced, headers: dict[str, str]) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {t.keys['acme']}"}
    body = {"question": QUESTION, "collection": t.collection, "method": "draft_model",
            "num_speculative_tokens": 3, "max_tokens": 8}  # fmt: skip
    made = httpx.post(f"{t.url}/v1/queries", json=body, headers={**auth, **headers}, timeout=30)
    assert made.status_code == 202, made.text
    qid = made.json()["id"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        view = httpx.get(f"{t.url}/v1/queries/{qid}", headers=auth, timeout=30).json()
        if view["status"] in ("succeeded", "failed"):
            assert view["status"] == "succeeded", view
            return dict(view)
        time.sleep(0.2)
    raise TimeoutError(f"query {qid} not answered in 180 s")


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def test_one_trace_from_the_clients_traceparent_to_the_engine(traced: Traced) -> None:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    view = _ask(traced, {"traceparent": f"00-{trace_id}-{parent}-01"})
    assert view["stats"]["trace_id"] == trace_id
    model = Path(os.fspath(traced.worker.env["SPECRAG_TARGET_MODEL"])).name
    fmt = view["stats"]["prompt_format"]
    generation = f"{'chat' if fmt == 'chat' else 'text_completion'} {model}"
    names = {"POST /v1/queries", PUBLISH, RUN, "answer query", "claim",
             f"retrieval {traced.collection}", "dense search", "lexical search", "fusion",
             "prompt build", generation, "record"}  # fmt: skip
    spans = traced.receiver.wait_for(trace_id, names)
    by_id = {s.span_id: s for s in spans}

    server = _one(spans, "POST /v1/queries")
    assert (server.service, server.kind, server.parent_span_id) == ("specrag-api", SERVER, parent)
    # One span for the request: no ASGI ``http receive`` / ``http send`` spans under it.
    assert not [s for s in spans if s.parent_span_id == server.span_id and s.name.startswith(
        "POST /v1/queries ")]  # fmt: skip
    publish, run = _one(spans, PUBLISH), _one(spans, RUN)
    # Sent by the API's admission, or first by a sweeper (every 0.5 s here) that found it stored:
    # either way inside the stored trace, under the request that stored it.
    assert publish.service in ("specrag-api", "specrag-worker")
    assert (publish.kind, publish.parent_span_id) == (PRODUCER, server.span_id)
    assert (run.service, run.kind, run.parent_span_id) == (
        "specrag-worker", CONSUMER, publish.span_id)  # fmt: skip
    answer = _one(spans, "answer query")
    assert answer.parent_span_id == run.span_id
    assert answer.attributes["specrag.query.id"] == view["id"]
    assert answer.attributes["specrag.query.outcome"] == "succeeded"
    for step in ("claim", f"retrieval {traced.collection}", "prompt build", generation, "record"):
        assert _one(spans, step).parent_span_id == answer.span_id, step
    retrieval = _one(spans, f"retrieval {traced.collection}")
    for leg in ("dense search", "lexical search", "fusion"):
        assert _one(spans, leg).parent_span_id == retrieval.span_id, leg
    assert retrieval.attributes["gen_ai.operation.name"] == "retrieval"
    assert retrieval.attributes["gen_ai.data_source.id"] == traced.collection
    # The instrumentation libraries' SQL spans (SPECRAG_TRACE_SQL), inside the trace (the claim's
    # UPDATE at least).
    sql = [s for s in spans if s.kind == CLIENT and s.service == "specrag-worker"]
    assert any(by_id.get(s.parent_span_id) == _one(spans, "claim") for s in sql), sql
    # And Redis's: the broker's LPUSH of the message, inside the request that sent it.
    lpush = [s for s in spans if s.kind == CLIENT and s.name == "LPUSH"]
    assert any(by_id.get(s.parent_span_id) in (server, publish) for s in lpush), lpush

    gen = _one(spans, generation).attributes
    stats = view["stats"]
    assert gen["gen_ai.operation.name"] in ("chat", "text_completion")
    assert gen["gen_ai.request.model"] == model
    assert gen["gen_ai.usage.input_tokens"] > 0
    assert gen["gen_ai.usage.output_tokens"] == stats["num_output_tokens"]
    assert gen["gen_ai.usage.cache_read.input_tokens"] == stats["num_cached_prompt_tokens"]
    assert gen["gen_ai.response.finish_reasons"] in (["stop"], ["length"])
    for name in SPEC_DECODE:
        key = f"specrag.spec_decode.{name}"
        expected = stats[name]
        if expected is None:
            assert key not in gen, key
        elif isinstance(expected, float):
            assert gen[key] == pytest.approx(expected), key
        else:
            assert str(gen[key]) == str(expected), key

    # Content off: neither the question nor the answer is in any exported attribute.
    exported = json.dumps([s.attributes for s in traced.receiver.spans])
    assert QUESTION not in exported
    assert view["answer"].strip() and view["answer"] not in exported


def test_a_malformed_traceparent_starts_a_new_trace(traced: Traced) -> None:
    view = _ask(traced, {"traceparent": "00-not-a-trace-id-01"})
    trace_id = view["stats"]["trace_id"]
    assert isinstance(trace_id, str) and len(trace_id) == 32 and int(trace_id, 16)
    spans = traced.receiver.wait_for(trace_id, {"POST /v1/queries", "record"})
    assert _one(spans, "POST /v1/queries").parent_span_id == ""


def _named(receiver: OtlpReceiver, name: str, key: str, value: str) -> ReceivedSpan:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = [s for s in receiver.spans if s.name == name and s.attributes.get(key) == value]
        if found:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no {name!r} span with {key}={value}")


def test_a_shadow_redecode_is_a_trace_of_its_own_linked_to_its_query(traced: Traced) -> None:
    trace_id = secrets.token_hex(16)
    view = _ask(traced, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    shadow = _named(traced.receiver, "shadow re-decode", "specrag.query.id", view["id"])
    assert shadow.trace_id != trace_id and shadow.parent_span_id == ""
    server = _one(traced.receiver.wait_for(trace_id, {"POST /v1/queries"}), "POST /v1/queries")
    assert shadow.links == [(trace_id, server.span_id)]


def test_a_batch_is_a_trace_and_each_item_a_trace_linked_to_it(traced: Traced) -> None:
    auth = {"Authorization": f"Bearer {traced.keys['acme']}"}
    questions = [{"question": QUESTION, "collection": traced.collection}] * 2
    made = httpx.post(f"{traced.url}/v1/batches", headers=auth, timeout=30,
                      json={"questions": questions, "max_tokens": 8})  # fmt: skip
    assert made.status_code == 202, made.text
    batch_id = made.json()["id"]
    deadline = time.monotonic() + 240
    while True:
        view = httpx.get(f"{traced.url}/v1/batches/{batch_id}", headers=auth,
                         params={"items": "true"}, timeout=30).json()  # fmt: skip
        if view["status"] in ("succeeded", "failed", "cancelled"):
            break
        assert time.monotonic() < deadline, view
        time.sleep(0.5)
    assert view["status"] == "succeeded", view
    job = _named(traced.receiver, "batch", "specrag.batch.id", batch_id)
    assert job.service == "specrag-api"
    for item in view["items"]:
        query = httpx.get(f"{traced.url}/v1/queries/{item['query_id']}", headers=auth).json()
        item_trace = query["stats"]["trace_id"]
        assert item_trace != job.trace_id
        spans = traced.receiver.wait_for(item_trace, {"batch item", "answer query", "record"})
        root = _one(spans, "batch item")
        assert root.parent_span_id == "" and _one(spans, "answer query").parent_span_id == (
            root.span_id)  # fmt: skip
        # Linked to a chunk task of the job's trace.
        ((linked_trace, linked_span),) = root.links
        assert linked_trace == job.trace_id
        # The chunk task's span ends (and is exported) after its items: wait for it.
        chunk = traced.receiver.wait_for(job.trace_id, {"run/specrag.batch_chunk"})
        assert [s.name for s in chunk if s.span_id == linked_span] == ["run/specrag.batch_chunk"]


def test_a_golden_run_is_a_trace_with_each_baseline_linked_to_its_answer(
    traced: Traced, tmp_path: Path
) -> None:
    golden = tmp_path / "golden.jsonl"
    line = {"question": QUESTION, "collection": traced.collection, "reference": "It checks."}
    golden.write_text(json.dumps(line) + "\n")
    env = dict(traced.worker.env)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "specrag"), "eval", "golden", str(golden),
         "--tenant", "acme", "--max-tokens", "4", "--json"],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    deadline = time.monotonic() + 60
    while not [s for s in traced.receiver.spans if s.name == "golden run"]:
        assert time.monotonic() < deadline, "no golden run span"
        time.sleep(0.2)
    (run,) = [s for s in traced.receiver.spans if s.name == "golden run"]
    assert (run.service, run.parent_span_id) == ("specrag-cli", "")
    spans = traced.receiver.wait_for(run.trace_id, {"golden speculative", "golden baseline"})
    speculative, baseline = _one(spans, "golden speculative"), _one(spans, "golden baseline")
    assert speculative.parent_span_id == baseline.parent_span_id == run.span_id
    assert baseline.links == [(run.trace_id, speculative.span_id)]
    answers = [s for s in spans if s.name == "answer query"]
    assert sorted(s.parent_span_id for s in answers) == sorted(
        [speculative.span_id, baseline.span_id])  # fmt: skip


def test_a_refusing_collector_costs_no_answer(traced: Traced) -> None:
    traced.receiver.refuse = True
    first, second = _ask(traced, {}), _ask(traced, {})
    assert first["answer"] is not None and second["answer"] is not None
    deadline = time.monotonic() + 30
    while "spans are dropped" not in traced.worker.tail(1 << 20):
        assert time.monotonic() < deadline, traced.worker.tail()
        time.sleep(0.2)
    time.sleep(1.5)  # the second answer's spans fail too, and are not logged again
    assert traced.worker.tail(1 << 20).count("spans are dropped") == 1
    traced.receiver.refuse = False
    view = _ask(traced, {})
    traced.receiver.wait_for(view["stats"]["trace_id"], {"record"})
    assert "works again" in traced.worker.tail(1 << 20)
