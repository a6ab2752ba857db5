"""A small Python client for the web backend: submit, wait, get, stream -- and retry safely.

It retries as the SDKs web backends already use do (OpenAI's, Stripe's): a bounded number of
attempts with exponential backoff and full jitter on 429, 502, 503 and 504 and on connection
errors, honouring the server's ``Retry-After``. Every submit carries an ``Idempotency-Key`` (one
is generated when the caller gives none), so a retry after a lost response returns the same
query instead of making a second one. ``wait()`` and ``stream()`` ride out transient errors until
their own timeout. ``RetryPolicy`` configures all of it; ``RetryPolicy(max_attempts=1)`` turns
retries off. The retry loop is tenacity's.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

T = TypeVar("T")
TRANSIENT_STATUSES = frozenset({429, 502, 503, 504})
TRANSPORT_ERRORS = (httpx.TransportError,)
"""Connection refused or reset, timeouts, a response cut off: worth another try."""


GROUNDING_WAIT_SECONDS = 30.0
"""Longest ``wait(with_grounding=True)`` waits for a succeeded answer's grounding."""


class ClientError(RuntimeError):
    """A 4xx/5xx from the API; ``status`` and ``field`` say what was wrong.

    ``retry_after`` is the server's ``Retry-After`` in seconds (None when it sent none).
    """

    def __init__(
        self, status: int, field: str | None, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(f"HTTP {status}: {field + ': ' if field else ''}{message}")
        self.status = status
        self.field = field
        self.message = message
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Whether the same request may succeed later (429, 502, 503, 504)."""
        return self.status in TRANSIENT_STATUSES


@dataclass(frozen=True)
class RetryPolicy:
    """How the client retries a request that failed transiently."""

    max_attempts: int = 4
    """Tries per request, the first included (1: never retry)."""
    initial_backoff: float = 0.5
    """Seconds before the first retry, doubled for each further one (then jittered)."""
    max_backoff: float = 8.0
    """Most seconds of one backoff."""
    max_retry_after: float = 60.0
    """Most seconds the client waits for a server's Retry-After; longer ones are not waited for."""

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): full jitter, capped."""
        ceiling = min(self.max_backoff, self.initial_backoff * 2 ** (retry - 1))
        return random.uniform(0, ceiling)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying: a transport error or a 429/502/503/504."""
    if isinstance(exc, ClientError):
        return exc.transient
    return isinstance(exc, TRANSPORT_ERRORS)


@dataclass(frozen=True)
class StreamEvent:
    """One event of ``GET /v1/queries/{id}/stream``: ``token``, ``reset``, ``done`` or ``error``."""

    event: str
    id: str | None
    data: dict[str, Any]


class SpecragClient:
    """Talks to ``specrag api`` at ``base_url`` with one tenant's API key.

    ``retry`` is the policy of every call (``RetryPolicy()`` by default); ``sleep`` is how the
    client waits between tries (tests pass a recorder).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )
        self.retry = retry or RetryPolicy()
        self._sleep = sleep

    def __enter__(self) -> SpecragClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying HTTP connections."""
        self._http.close()

    def _retrying(self) -> Retrying:
        policy = self.retry

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            hinted = getattr(exc, "retry_after", None)
            if hinted is not None:
                return float(hinted) + random.uniform(0, policy.initial_backoff)
            return policy.backoff(state.attempt_number)

        def worth_it(exc: BaseException) -> bool:
            hinted = getattr(exc, "retry_after", None)
            too_long = hinted is not None and hinted > policy.max_retry_after
            return is_transient(exc) and not too_long

        return Retrying(
            stop=stop_after_attempt(max(1, policy.max_attempts)),
            wait=wait,
            retry=retry_if_exception(worth_it),
            sleep=self._sleep,
            reraise=True,
        )

    def _call(self, send: Callable[[], httpx.Response]) -> dict[str, Any]:
        """``send()``'s JSON, retried under the policy; ClientError or httpx errors otherwise."""
        result: dict[str, Any] = self._retrying()(lambda: self._check(send()))
        return result

    def submit(
        self,
        question: str,
        collection: str,
        *,
        idempotency_key: str | None = None,
        **params: Any,
    ) -> str:
        """The id of the queued query (the existing one when ``idempotency_key`` was used before).

        ``params``: method, num_speculative_tokens, max_tokens, temperature, seed. Without an
        ``idempotency_key`` one is made for this call, so its retries never make a second query.
        """
        headers = {"Idempotency-Key": idempotency_key or f"specrag-client-{uuid.uuid4()}"}
        body = {"question": question, "collection": collection, **params}
        data = self._call(lambda: self._http.post("/v1/queries", json=body, headers=headers))
        return str(data["id"])

    def get(self, query_id: str) -> dict[str, Any]:
        """The query as ``GET /v1/queries/{id}`` shows it (status, answer, sources, stats,
        grounding, error)."""
        return self._call(lambda: self._http.get(f"/v1/queries/{query_id}"))

    def wait(
        self,
        query_id: str,
        *,
        timeout: float = 300.0,
        poll: float = 0.2,
        with_grounding: bool = False,
    ) -> dict[str, Any]:
        """The query once it succeeded or failed; TimeoutError after ``timeout`` seconds.

        Transient errors (after ``get``'s own retries) do not end the wait: polling goes on,
        backing off, until the timeout; a permanent error (404, 401, ...) is raised at once.
        ``with_grounding``: a succeeded query is returned once it carries ``grounding`` (stored
        just after the answer), or as it is ``GROUNDING_WAIT_SECONDS`` after it succeeded.
        """
        deadline = time.monotonic() + timeout
        grounding_deadline: float | None = None
        failures = 0
        while True:
            try:
                data = self.get(query_id)
            except (ClientError, httpx.TransportError) as exc:
                if not is_transient(exc) or time.monotonic() >= deadline:
                    raise
                failures += 1
                self._sleep(self._pause(exc, failures, deadline))
                continue
            failures = 0
            if data["status"] == "succeeded" and with_grounding and "grounding" not in data:
                # Grounding is stored just after the answer; a service with it off never does.
                if grounding_deadline is None:
                    grounding_deadline = time.monotonic() + GROUNDING_WAIT_SECONDS
                if time.monotonic() < grounding_deadline:
                    self._sleep(poll)
                    continue
            if data["status"] in ("succeeded", "failed"):
                return data
            if time.monotonic() >= deadline:
                raise TimeoutError(f"query {query_id} still {data['status']} after {timeout:.0f} s")
            self._sleep(poll)

    def _pause(self, exc: BaseException, failures: int, deadline: float) -> float:
        hinted = getattr(exc, "retry_after", None)
        pause = float(hinted) if hinted is not None else self.retry.backoff(failures)
        return max(0.0, min(pause, deadline - time.monotonic()))

    def stream(
        self,
        query_id: str,
        *,
        last_event_id: str | None = None,
        timeout: float = 300.0,
        reconnects: int = 10,
    ) -> Iterator[StreamEvent]:
        """The query's events as they arrive; ends after ``done`` or ``error``.

        ``token`` data ``{"text", "token_ids"}`` (the texts add up to the answer), ``reset``
        (the query started over: drop the text so far), then ``done`` (the finished query, as
        ``get`` returns it) or ``error`` (the failed one). A dropped connection or a transient
        status (429, 502, 503, 504) is resumed from the last event received, backing off, up to
        ``reconnects`` times in a row; TimeoutError after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        last = last_event_id
        failures = 0
        while True:
            try:
                answered: list[int] = []
                for event in self._stream_once(query_id, last, deadline, answered):
                    last = event.id or last
                    failures = 0  # progress: the reconnect budget is for failures in a row
                    yield event
                    if event.event in ("done", "error"):
                        return
                if answered == [204]:
                    return  # the stream had already ended
                # A 200 whose body ended before done or error: cut short on the way (a proxy,
                # a restarting API); resume like any dropped connection.
                raise httpx.RemoteProtocolError("the stream ended before done or error")
            except (ClientError, httpx.TransportError) as exc:
                if not is_transient(exc) or failures >= reconnects:
                    raise
                if time.monotonic() >= deadline:
                    raise
                failures += 1
                self._sleep(self._pause(exc, failures, deadline))

    def _stream_once(
        self, query_id: str, last: str | None, deadline: float, answered: list[int]
    ) -> Iterator[StreamEvent]:
        headers = {"Accept": "text/event-stream"}
        if last is not None:
            headers["Last-Event-ID"] = last
        # Keep-alive comments arrive every 15 s by default: a read waits longer than that.
        read = httpx.Timeout(self._http.timeout.connect, read=60.0)
        url = f"/v1/queries/{query_id}/stream"
        with self._http.stream("GET", url, headers=headers, timeout=read) as response:
            answered.append(response.status_code)
            if response.status_code >= 400:
                response.read()
                self._check(response)
            if response.status_code == 204:
                return
            fields: dict[str, str] = {}
            data: list[str] = []
            for line in response.iter_lines():
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"query {query_id}: stream not finished after the timeout")
                if line == "":
                    if data:
                        name = fields.get("event", "message")
                        yield StreamEvent(name, fields.get("id"), json.loads("\n".join(data)))
                    fields, data = {}, []
                elif line.startswith(":"):
                    continue  # keep-alive comment
                else:
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "data":
                        data.append(value)
                    else:
                        fields[name] = value

    def ask(
        self,
        question: str,
        collection: str,
        *,
        timeout: float = 300.0,
        with_grounding: bool = False,
        **params: Any,
    ) -> dict[str, Any]:
        """Submit and wait: the finished query (``with_grounding``: as ``wait``)."""
        qid = self.submit(question, collection, **params)
        return self.wait(qid, timeout=timeout, with_grounding=with_grounding)

    @staticmethod
    def _check(response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            try:
                err = response.json().get("error", {})
            except ValueError:
                err = {}
            raise ClientError(
                response.status_code,
                err.get("field"),
                err.get("message", response.text),
                _retry_after(response.headers.get("Retry-After")),
            )
        data: dict[str, Any] = response.json()
        return data


def _retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent/bad."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
