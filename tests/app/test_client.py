"""SpecragClient's retry logic on a scripted transport (fast; the same behaviour against a live API
is in tests/integration/test_client_retries.py): which errors are retried, how long it waits,
that one submit keeps one Idempotency-Key, and that wait() and stream() ride out transient errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app.client import ClientError, RetryPolicy, SpecragClient


class Script:
    """An httpx transport answering from a list of responses (or exceptions), recording requests."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(request)
        return answer


def _error(status: int, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after else {}
    body = {"error": {"field": "x", "message": "nope"}, "detail": []}
    return httpx.Response(status, json=body, headers=headers)


def _client(script: Script, sleeps: list[float], **policy: Any) -> SpecragClient:
    return SpecragClient(
        "http://api", "key", transport=httpx.MockTransport(script),
        retry=RetryPolicy(**policy), sleep=sleeps.append,
    )  # fmt: skip


def test_submit_retries_transient_errors_with_one_idempotency_key() -> None:
    script = Script(
        _error(503),
        httpx.ConnectError("refused"),
        _error(429, retry_after="3"),
        _error(502),
        httpx.Response(202, json={"id": "q1", "status": "queued"}),
    )
    sleeps: list[float] = []
    with _client(script, sleeps, max_attempts=5, initial_backoff=1.0, max_backoff=8.0) as client:
        assert client.submit("Why?", "docs") == "q1"
    keys = {r.headers["Idempotency-Key"] for r in script.requests}
    assert len(script.requests) == 5 and len(keys) == 1  # every try is the same submit
    assert next(iter(keys)).startswith("specrag-client-")
    assert 0 <= sleeps[0] <= 1.0 and 0 <= sleeps[1] <= 2.0  # full jitter, doubling ceilings
    assert 3.0 <= sleeps[2] <= 4.0  # Retry-After honoured (plus a little jitter)
    assert 0 <= sleeps[3] <= 8.0


def test_two_submits_get_two_keys_and_a_given_key_is_kept() -> None:
    ok = httpx.Response(202, json={"id": "q", "status": "queued"})
    script = Script(ok, ok, ok)
    with _client(script, []) as client:
        client.submit("a?", "docs")
        client.submit("b?", "docs")
        client.submit("c?", "docs", idempotency_key="mine")
    keys = [r.headers["Idempotency-Key"] for r in script.requests]
    assert keys[0] != keys[1] and keys[2] == "mine"


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422, 500])
def test_permanent_errors_are_raised_at_once(status: int) -> None:
    script = Script(_error(status))
    sleeps: list[float] = []
    with _client(script, sleeps) as client, pytest.raises(ClientError) as err:
        client.submit("Why?", "docs")
    assert err.value.status == status and len(script.requests) == 1 and sleeps == []


def test_retries_are_bounded_and_expose_retry_after() -> None:
    script = Script(*[_error(429, retry_after="2")] * 3)
    sleeps: list[float] = []
    with _client(script, sleeps, max_attempts=3) as client, pytest.raises(ClientError) as err:
        client.get("q1")
    assert err.value.status == 429 and err.value.retry_after == 2.0 and err.value.transient
    assert len(script.requests) == 3 and len(sleeps) == 2


def test_a_retry_after_beyond_the_policy_is_not_waited_for() -> None:
    script = Script(_error(503, retry_after="3600"))
    sleeps: list[float] = []
    with _client(script, sleeps, max_retry_after=60) as client, pytest.raises(ClientError):
        client.get("q1")
    assert sleeps == [] and len(script.requests) == 1


def test_max_attempts_one_turns_retries_off() -> None:
    script = Script(_error(503))
    with _client(script, [], max_attempts=1) as client, pytest.raises(ClientError):
        client.get("q1")
    assert len(script.requests) == 1


def test_wait_rides_out_more_transient_errors_than_one_get_retries() -> None:
    queued = httpx.Response(200, json={"id": "q1", "status": "queued"})
    done = httpx.Response(200, json={"id": "q1", "status": "succeeded", "answer": "yes"})
    script = Script(queued, *[_error(503)] * 5, httpx.ReadError("cut"), queued, done)
    sleeps: list[float] = []
    with _client(script, sleeps, max_attempts=2) as client:
        assert client.wait("q1", timeout=60, poll=0.01)["answer"] == "yes"
    assert len(script.requests) == 9


def test_wait_raises_a_permanent_error_at_once() -> None:
    script = Script(_error(404))
    with _client(script, []) as client, pytest.raises(ClientError) as err:
        client.wait("q1", timeout=60)
    assert err.value.status == 404


def _sse(*events: tuple[str, str, dict[str, Any]]) -> Callable[[httpx.Request], httpx.Response]:
    text = "".join(f"id: {i}\nevent: {e}\ndata: {json.dumps(d)}\n\n" for i, e, d in events)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return answer


def test_stream_resumes_after_transient_statuses_from_the_last_event() -> None:
    token = ("1-0", "token", {"text": "Hel", "token_ids": [1]})
    script = Script(
        _sse(token),  # the connection ends after one token (a proxy cut it)
        _error(503),
        _error(429, retry_after="1"),
        _sse(("2-0", "token", {"text": "lo", "token_ids": [2]}),
             ("end", "done", {"status": "succeeded"})),
    )  # fmt: skip
    sleeps: list[float] = []
    with _client(script, sleeps) as client:
        events = list(client.stream("q1", timeout=60))
    assert [e.event for e in events] == ["token", "token", "done"]
    resumed = [r.headers.get("Last-Event-ID") for r in script.requests]
    assert resumed == [None, "1-0", "1-0", "1-0"]
    assert len(sleeps) == 3 and sleeps[2] >= 1.0  # the cut, the 503, the 429 (Retry-After)


def test_wait_with_grounding_polls_past_succeeded_until_grounding_is_there() -> None:
    done = {"id": "q", "status": "succeeded", "answer": "A."}
    grounded = {**done, "grounding": {"groundedness": 1.0, "sentences": []}}
    script = Script(
        httpx.Response(200, json={"id": "q", "status": "running"}),
        httpx.Response(200, json=done),
        httpx.Response(200, json=grounded),
    )
    sleeps: list[float] = []
    assert _client(script, sleeps).wait("q", poll=0.01, with_grounding=True) == grounded
    assert len(script.requests) == 3
    # Without it, succeeded is enough.
    again = Script(httpx.Response(200, json=done))
    assert _client(again, []).wait("q") == done


def test_wait_with_grounding_gives_up_on_it_after_its_own_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.client as client_module

    monkeypatch.setattr(client_module, "GROUNDING_WAIT_SECONDS", 0.0)
    done = {"id": "q", "status": "succeeded", "answer": "A."}
    script = Script(httpx.Response(200, json=done))
    assert _client(script, []).wait("q", with_grounding=True) == done
