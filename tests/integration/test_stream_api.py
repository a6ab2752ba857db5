"""GET /v1/queries/{id}/stream on real PostgreSQL and Redis: the live worker's answer as events,
resumption, keep-alives, lost end markers, the embedded (database) mode and bad input."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.client import ClientError, SpecragClient
from app.settings import Settings
from tests.integration.streaming import (
    api_server,
    finish_query,
    read_events,
    running_query,
    worker_stream,
)

pytestmark = pytest.mark.integration
QUESTION = "What does the assert statement do?"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_live_answer_streams_token_bursts_that_add_up_to_done(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str
) -> None:
    with SpecragClient(api.url, keys["acme"]) as client:
        qid = client.submit(QUESTION, ingested, max_tokens=8)
        events = list(client.stream(qid, timeout=120))
        view = client.get(qid)
        again = list(client.stream(qid, timeout=30))
    assert all(e.id for e in events), events
    assert len({e.id for e in events}) == len(events)
    tokens = [e for e in events if e.event == "token"]
    assert tokens and events[-1].event == "done"
    assert events[-1].data == view  # exactly the JSON of GET /v1/queries/{id}
    assert view["status"] == "succeeded"
    assert "".join(e.data["text"] for e in tokens) == view["answer"]
    assert sum(len(e.data["token_ids"]) for e in tokens) == view["stats"]["num_output_tokens"]
    # A finished query's stream: done at once, nothing before it.
    assert [e.event for e in again] == ["done"] and again[0].data == view


def test_client_that_disconnects_mid_stream_changes_nothing(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str
) -> None:
    with SpecragClient(api.url, keys["acme"]) as client:
        qid = client.submit(QUESTION, ingested, max_tokens=8)
        with httpx.stream(
            "GET", f"{api.url}/v1/queries/{qid}/stream", headers=_auth(keys["acme"]), timeout=30
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            next(response.iter_lines())  # the first line, then hang up
        cut = client.wait(qid, timeout=120)
        plain = client.ask(QUESTION, ingested, max_tokens=8, timeout=120)
    assert cut["status"] == "succeeded" and cut["answer"] == plain["answer"]


def test_last_event_id_resumes_after_that_event_without_repeats(
    api: Any, keys: dict[str, str], service_settings: Settings
) -> None:
    qid = running_query(service_settings, "acme")
    stream, pub = worker_stream(service_settings, qid)
    for word in ("Hel", "lo", " wor"):
        stream.on_delta([ord(c) for c in word])
    assert pub.flush()
    with SpecragClient(api.url, keys["acme"]) as client:
        seen = []
        for event in client.stream(str(qid), timeout=30):
            seen.append(event)
            if len(seen) == 2:
                break  # the client goes away after two bursts
        assert [e.data["text"] for e in seen] == ["Hel", "lo"]
        stream.on_delta([ord(c) for c in "ld"])
        stream.finish("Hello world", [ord(c) for c in "Hello world"])
        finish_query(service_settings, qid, "Hello world")
        stream.end("succeeded")
        rest = list(client.stream(str(qid), last_event_id=seen[-1].id, timeout=30))
        view = client.get(str(qid))
    assert [e.event for e in rest] == ["token", "token", "done"]
    assert not {e.id for e in seen} & {e.id for e in rest}
    assert "".join(e.data["text"] for e in seen + rest[:-1]) == "Hello world" == view["answer"]
    assert rest[-1].data == view and rest[-1].id == "end"
    # After the final event nothing follows: 204 stops an EventSource from reconnecting.
    gone = httpx.get(
        f"{api.url}/v1/queries/{qid}/stream",
        headers=_auth(keys["acme"]) | {"Last-Event-ID": "end"},
    )
    assert gone.status_code == 204


def test_failed_query_ends_with_error_and_a_retry_announces_reset(
    api: Any, keys: dict[str, str], service_settings: Settings
) -> None:
    qid = running_query(service_settings, "acme")
    stream, pub = worker_stream(service_settings, qid)
    stream.on_delta([ord("x")])
    stream.reset(2)  # the first attempt's worker was lost; attempt 2 starts over
    finish_query(service_settings, qid, None)
    stream.end("failed")
    assert pub.flush()
    with SpecragClient(api.url, keys["acme"]) as client:
        events = list(client.stream(str(qid), last_event_id="0-0", timeout=30))
        view = client.get(str(qid))
    assert [e.event for e in events] == ["token", "reset", "error"]
    assert events[1].data == {"attempt": 2}
    assert events[-1].data == view and view["status"] == "failed" and view["error"]


def test_keepalives_and_a_lost_end_marker_still_end_with_done(
    keys: dict[str, str], service_settings: Settings
) -> None:
    settings = service_settings.model_copy(update={"stream_keepalive_seconds": 0.3})
    qid = running_query(settings, "acme")
    with api_server(settings) as url:
        with httpx.stream(
            "GET", f"{url}/v1/queries/{qid}/stream", headers=_auth(keys["acme"]), timeout=30
        ) as response:
            blocks = read_events(response)
            assert next(blocks).get("retry") == "1000"
            assert next(blocks)["comments"] == [": keep-alive"]
            # The worker recorded its answer but died before writing ``end``.
            finish_query(settings, qid, "fine")
            rest = list(blocks)
    finals = [b for b in rest if b.get("event") == "done"]
    assert len(finals) == 1 and finals[0]["data"]["answer"] == "fine" and finals[0]["id"] == "end"


def test_embedded_broker_stream_sends_the_answer_then_done(
    keys: dict[str, str], service_settings: Settings, tmp_path: Any
) -> None:
    settings = service_settings.model_copy(
        update={
            "broker_url": f"sqla+sqlite:///{tmp_path / 'broker.db'}",
            "stream_poll_seconds": 0.1,
        }
    )
    qid = running_query(settings, "acme")
    with api_server(settings) as url:
        with httpx.stream(
            "GET", f"{url}/v1/queries/{qid}/stream", headers=_auth(keys["acme"]), timeout=30
        ) as response:
            blocks = read_events(response)
            assert next(blocks).get("retry") == "1000"  # the stream is open, the query running
            finish_query(settings, qid, "from the database")
            got = [b for b in blocks if "event" in b]
        with SpecragClient(url, keys["acme"]) as client:
            view = client.get(str(qid))
    assert [(b["event"], b["id"]) for b in got] == [("token", "answer"), ("done", "end")]
    assert got[0]["data"] == {"text": "from the database", "token_ids": []}
    assert got[1]["data"] == view


def test_stream_needs_a_key_and_hides_other_tenants_queries(
    api: Any, keys: dict[str, str], service_settings: Settings
) -> None:
    qid = running_query(service_settings, "acme")
    url = f"{api.url}/v1/queries/{qid}/stream"
    assert httpx.get(url).status_code == 401
    other = httpx.get(url, headers=_auth(keys["globex"]))
    assert other.status_code == 404 and other.json()["error"]["field"] == "id"
    for missing in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        r = httpx.get(f"{api.url}/v1/queries/{missing}/stream", headers=_auth(keys["acme"]))
        assert r.status_code == 404
    bad = httpx.get(url, headers=_auth(keys["acme"]) | {"Last-Event-ID": "yesterday"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "Last-Event-ID"
    with SpecragClient(api.url, keys["globex"]) as client, pytest.raises(ClientError) as err:
        next(client.stream(str(qid), timeout=10))
    assert err.value.status == 404
    finish_query(service_settings, qid, None)  # leave nothing running behind


def test_a_client_that_stops_reading_slows_neither_the_writer_nor_other_streams(
    api: Any, keys: dict[str, str], service_settings: Settings
) -> None:
    import socket
    from urllib.parse import urlsplit

    slow_qid = running_query(service_settings, "acme")
    fast_qid = running_query(service_settings, "acme")
    host = urlsplit(api.url)
    slow = socket.create_connection((host.hostname, host.port), timeout=30)
    # A client that asks for the stream and then never reads: the server's buffers fill up.
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(
        f"GET /v1/queries/{slow_qid}/stream HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {keys['acme']}\r\n\r\n".encode()
    )
    try:
        from app.streams import QueryStream

        _, pub = worker_stream(service_settings, slow_qid)
        writer = QueryStream(pub, slow_qid, lambda ids: "z" * (65536 * len(ids)))
        for _ in range(200):  # ~13 MB of text for the reader that does not read
            writer.on_delta([1])
        assert pub.flush(60)  # the worker's writes all went through
        with httpx.stream(
            "GET",
            f"{api.url}/v1/queries/{fast_qid}/stream",
            headers=_auth(keys["acme"]),
            timeout=30,
        ) as response:
            blocks = read_events(response)
            assert next(blocks).get("retry") == "1000"
            fast, _ = worker_stream(service_settings, fast_qid)
            fast.on_delta([ord(c) for c in "quick"])
            fast.finish("quick", [])
            finish_query(service_settings, fast_qid, "quick")
            fast.end("succeeded")
            events = [b for b in blocks if "event" in b]
        assert [e["event"] for e in events] == ["token", "done"]
        assert events[0]["data"]["text"] == "quick"
    finally:
        slow.close()
        finish_query(service_settings, slow_qid, None)


def test_a_poisoned_last_event_id_is_refused_and_stalls_no_other_stream(
    api: Any, keys: dict[str, str], service_settings: Settings
) -> None:
    import time

    mine = running_query(service_settings, "acme")
    theirs = running_query(service_settings, "globex")
    poison = {"Last-Event-ID": "99999999999999999999999-0"}
    bad = httpx.get(f"{api.url}/v1/queries/{mine}/stream", headers=_auth(keys["acme"]) | poison)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "Last-Event-ID"
    # The attacker keeps a stream of its own open (with a valid, huge-but-64-bit cursor) while
    # the other tenant reads: that one's first token comes as fast as on an idle API.
    huge = {"Last-Event-ID": "18446744073709551615-0"}
    stream, pub = worker_stream(service_settings, theirs)
    with httpx.stream(
        "GET", f"{api.url}/v1/queries/{mine}/stream", headers=_auth(keys["acme"]) | huge
    ) as held:
        assert held.status_code == 200
        with httpx.stream(
            "GET", f"{api.url}/v1/queries/{theirs}/stream", headers=_auth(keys["globex"])
        ) as response:
            blocks = read_events(response)
            assert next(blocks).get("retry") == "1000"
            started = time.monotonic()
            stream.on_delta([ord(c) for c in "hi"])
            assert pub.flush()
            first = next(b for b in blocks if b.get("event") == "token")
            waited = time.monotonic() - started
    assert first["data"]["text"] == "hi"
    assert waited < 1.0, waited
    finish_query(service_settings, mine, None)
    finish_query(service_settings, theirs, None)


def test_a_query_deleted_while_streaming_ends_with_error_not_a_bare_close(
    keys: dict[str, str], service_settings: Settings
) -> None:
    # What cancelling a batch does to its items' never-run queries (app/batch/runner.py).
    from sqlalchemy import delete

    from app.db import Query, make_engine, make_session_factory

    settings = service_settings.model_copy(update={"stream_keepalive_seconds": 0.3})
    # Running (its heartbeat in the future), not queued: a queued one the session's sweepers
    # would send to the session's worker, which might answer it before the delete.
    qid = running_query(settings, "acme")
    with api_server(settings) as url:
        with httpx.stream(
            "GET", f"{url}/v1/queries/{qid}/stream", headers=_auth(keys["acme"]), timeout=30
        ) as response:
            blocks = read_events(response)
            assert next(blocks).get("retry") == "1000"
            engine = make_engine(settings)
            with make_session_factory(engine)() as session:
                session.execute(delete(Query).where(Query.id == qid))
                session.commit()
            engine.dispose()
            rest = [b for b in blocks if "event" in b]
    assert [(b["event"], b["id"]) for b in rest] == [("error", "end")]
    assert rest[0]["data"]["status"] == "cancelled" and rest[0]["data"]["id"] == str(qid)
