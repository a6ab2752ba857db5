"""Batches on a live worker subprocess (real Redis broker, real PostgreSQL, tiny random models):
exactly-once completion, interactive work served first, cancel."""

from __future__ import annotations

import functools
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select

from tests.batch.conftest import batch_row, submit_questions, wait_until

pytestmark = pytest.mark.timeout(600)


def ask(session_factory: Any, settings: Any, celery_app: Any, question: str) -> uuid.UUID:
    """Store and send one interactive query (as the API does); returns its id."""
    return ask_timed(session_factory, settings, celery_app, question)[0]


def ask_timed(
    session_factory: Any, settings: Any, celery_app: Any, question: str
) -> tuple[uuid.UUID, datetime]:
    """``ask``, also returning the wall-clock time just before its message went to the broker."""
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from workers import send_query

    request = validate_request(
        settings, {"question": question, "collection": "demo", "max_tokens": 2}
    )
    with session_factory() as session:
        query, _ = create_query(session, get_or_create_tenant(session, "default"), request)
    sent: list[datetime] = []

    def send(query_id: uuid.UUID, queue: str) -> None:
        sent.append(datetime.now(UTC))
        send_query(celery_app, query_id, queue)

    assert send_and_mark(session_factory, query.id, "answer", send)
    return query.id, sent[0]


def query_status(session_factory: Any, query_id: uuid.UUID) -> Any:
    from app.db import Query

    with session_factory() as session:
        return session.get(Query, query_id)


@pytest.fixture(scope="module")
def worker(
    start_worker: Any, session_factory: Any, settings: Any, celery_app: Any, ingested: str
) -> Any:
    """One live worker on answer,batch, warmed by an interactive query it answered.

    One query in flight: a batch item holds the worker's only slot, so an interactive query can
    only get in by the batch yielding or its request being cancelled in the loop (preemption).
    """
    proc = start_worker(SPECRAG_WORKER_CONCURRENCY="1")
    qid = ask(session_factory, settings, celery_app, "warm up: what is assert?")
    wait_until(
        lambda: query_status(session_factory, qid).status in ("succeeded", "failed"),
        240,
        "the worker to answer its first query",
    )
    assert query_status(session_factory, qid).status == "succeeded", proc.tail()
    yield proc
    proc.stop()


def test_200_item_batch_completes_with_each_item_answered_exactly_once(
    worker: Any, session_factory: Any, settings: Any, celery_app: Any
) -> None:
    from app.batch import BatchItem
    from app.db import Answer, GenerationStatsRecord, Query

    batch_id = submit_questions(session_factory, settings, celery_app, 200)
    wait_until(
        lambda: batch_row(session_factory, batch_id).finished_at is not None,
        240,
        "the 200-item batch to finish",
        poll=0.5,
        explain=lambda: f"{batch_row(session_factory, batch_id).__dict__}\n{worker.tail()}",
    )
    batch = batch_row(session_factory, batch_id)
    assert (batch.status, batch.succeeded, batch.failed, batch.cancelled) == (
        "succeeded",
        200,
        0,
        0,
    ), worker.tail()
    with session_factory() as session:
        items = session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id)).all()
        qids = [i.query_id for i in items]
        assert sorted(i.position for i in items) == list(range(200))
        assert {i.status for i in items} == {"succeeded"}
        assert len(set(qids)) == 200 and None not in qids
        queries = session.scalars(select(Query).where(Query.id.in_(qids))).all()
        assert {q.queue for q in queries} == {"batch"}
        assert {q.status for q in queries} == {"succeeded"}
        # Claimed once each: no item was started twice (no reaping happened here).
        assert {q.attempts for q in queries} == {1}
        n_answers = session.scalar(
            select(func.count()).select_from(Answer).where(Answer.query_id.in_(qids))
        )
        n_stats = session.scalar(
            select(func.count())
            .select_from(GenerationStatsRecord)
            .where(GenerationStatsRecord.query_id.in_(qids))
        )
        assert n_answers == 200 and n_stats == 200


def test_interactive_query_is_served_before_the_remaining_batch_items(
    worker: Any, session_factory: Any, settings: Any, celery_app: Any
) -> None:
    from app.batch import BatchItem

    batch_id = submit_questions(session_factory, settings, celery_app, 80)
    wait_until(
        lambda: batch_row(session_factory, batch_id).succeeded >= 5, 120, "5 batch items done"
    )
    qid, sent_at = ask_timed(session_factory, settings, celery_app, "How do I loop asynchronously?")
    wait_until(
        lambda: query_status(session_factory, qid).status in ("succeeded", "failed"),
        60,
        "the interactive query",
    )
    interactive = query_status(session_factory, qid)
    assert interactive.status == "succeeded"
    wait_until(
        lambda: batch_row(session_factory, batch_id).finished_at is not None, 120, "batch end"
    )
    with session_factory() as session:
        during = session.scalar(
            select(func.count())
            .select_from(BatchItem)
            .where(
                BatchItem.batch_id == batch_id,
                BatchItem.done_at > sent_at,
                BatchItem.done_at < interactive.done_at,
            )
        )
        after = session.scalar(
            select(func.count())
            .select_from(BatchItem)
            .where(BatchItem.batch_id == batch_id, BatchItem.done_at > interactive.done_at)
        )
    # Counted from when its message went to the broker: that is when the worker can first see
    # it. From then on at most the item in flight (and one whose check just missed the message)
    # finish before it; a chunk of 10 that did not yield would let up to 10 through.
    assert during <= 2, f"{during} batch items finished while the interactive query waited"
    assert after > 20, "the batch should still have had most of its items left"


def test_cancel_stops_the_batch_and_in_flight_items_finish(
    worker: Any, session_factory: Any, settings: Any, celery_app: Any
) -> None:
    from app.batch import BatchItem
    from app.batch.runner import cancel
    from app.db import Query

    batch_id = submit_questions(session_factory, settings, celery_app, 120)
    wait_until(lambda: batch_row(session_factory, batch_id).succeeded >= 3, 120, "3 items done")
    assert cancel(session_factory, batch_id) == "cancelled"
    wait_until(
        lambda: batch_row(session_factory, batch_id).finished_at is not None, 60, "cancel to settle"
    )
    batch = batch_row(session_factory, batch_id)
    assert batch.status == "cancelled"
    assert batch.succeeded + batch.failed + batch.cancelled == 120
    assert batch.cancelled >= 100, f"only {batch.cancelled} of 120 items cancelled"
    done = batch.succeeded
    # A window in which nothing may happen: no event marks the absence of work, so the test
    # lets time pass (several of the workers' item turns) and checks nothing more ran.
    time.sleep(2.0)
    assert batch_row(session_factory, batch_id).succeeded == done
    with session_factory() as session:
        statuses = session.execute(
            select(BatchItem.status, Query.status)
            .outerjoin(Query, Query.id == BatchItem.query_id)
            .where(BatchItem.batch_id == batch_id)
        ).all()
    # Cancelled items' never-run queries are gone; every answered item has its answer.
    assert all(q is None for s, q in statuses if s == "cancelled")
    assert all(q == s for s, q in statuses if s != "cancelled")
    assert cancel(session_factory, batch_id) == "cancelled"  # idempotent


def test_rerun_of_stored_queries_through_the_cli_reports_identical_answers(
    worker: Any, batch_env: dict[str, str], session_factory: Any, settings: Any, celery_app: Any
) -> None:
    import csv
    import io
    import json

    from click.testing import CliRunner

    from workers.cli import main

    def cli(*args: str) -> str:
        result = CliRunner().invoke(main, ["batch", *args], env=batch_env)
        assert result.exit_code == 0, result.output
        return result.output

    for question in ("Is assert skipped under -O?", "What is a starred target?"):
        qid = ask(session_factory, settings, celery_app, question)
        wait_until(
            functools.partial(lambda q: query_status(session_factory, q).done_at, qid),
            60,
            "an interactive query",
        )
    # Every finished interactive query so far (greedy, max_tokens 2) re-run with the same models
    # and the same index: the answers must come out identical.
    submitted = json.loads(cli("submit", "--stored", "--collection", "demo", "--json"))
    assert submitted["total"] >= 3 and submitted["dispatched"] is True
    final = json.loads(
        cli("watch", submitted["id"], "--json", "--timeout", "120", "--interval", "0.2")
    )
    assert (final["status"], final["succeeded"]) == ("succeeded", submitted["total"])
    report = json.loads(cli("report", submitted["id"], "--json"))
    assert report["counts"]["identical"] == submitted["total"], report["counts"]
    assert report["compared"] == submitted["total"]
    assert report["before"]["model_pairs"] == report["after"]["model_pairs"]
    assert report["after"]["service_ms"]["p95"] is not None
    rows = list(csv.DictReader(io.StringIO(cli("report", submitted["id"], "--format", "csv"))))
    assert len(rows) == submitted["total"] and {r["class"] for r in rows} == {"identical"}
    assert all(r["original_query_id"] for r in rows)
    page = cli("report", submitted["id"], "--format", "html")
    assert page.lower().startswith("<!doctype html>") and "identical" in page
    assert "data:image/svg+xml;base64," in page  # the charts, via app/audit's renderer
    status = json.loads(cli("status", submitted["id"], "--items", "--json"))
    assert [i["status"] for i in status["items"]] == ["succeeded"] * submitted["total"]


def test_golden_set_batch_reports_whether_answers_cite_the_expected_source(
    worker: Any, batch_env: dict[str, str], tmp_path: Any
) -> None:
    import json

    from click.testing import CliRunner

    from workers.cli import main

    def cli(*args: str) -> Any:
        result = CliRunner().invoke(main, ["batch", *args, "--json"], env=batch_env)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    golden = tmp_path / "golden.jsonl"
    golden.write_text(
        "\n".join(
            json.dumps({"question": q, "expected_source": s, "max_tokens": 2})
            for q, s in (
                ("If an assert condition is false, what exception is raised?", "assert.md"),
                ("How do I loop over an asynchronous iterator?", "async.md"),
                ("What are augmented assignment statements?", "no-such-file.md"),
            )
        )
    )
    submitted = cli("submit", str(golden), "--golden", "--collection", "demo")
    final = cli("watch", submitted["id"], "--timeout", "120", "--interval", "0.2")
    assert final["succeeded"] == 3
    report = cli("report", submitted["id"])
    hits = [item["source_hit"] for item in report["items"]]
    # Real MiniLM retrieval over four documents: the first two are found, the third cannot be.
    assert hits[2] is False and hits[:2] == [True, True], hits
    assert report["source_hit_rate"] == round(2 / 3, 4)
    assert report["counts"]["answered"] == 3
