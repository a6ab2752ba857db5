"""A small Python client for the web backend: submit, wait, get — the HTTP API, nothing more."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


class ClientError(RuntimeError):
    """A 4xx/5xx from the API; ``status`` and ``field`` say what was wrong."""

    def __init__(self, status: int, field: str | None, message: str) -> None:
        super().__init__(f"HTTP {status}: {field + ': ' if field else ''}{message}")
        self.status = status
        self.field = field
        self.message = message


@dataclass(frozen=True)
class StreamEvent:
    """One event of ``GET /v1/queries/{id}/stream``: ``token``, ``reset``, ``done`` or ``error``."""

    event: str
    id: str | None
    data: dict[str, Any]


class SpecragClient:
    """Talks to ``specrag api`` at ``base_url`` with one tenant's API key."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> SpecragClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying HTTP connections."""
        self._http.close()

    def submit(
        self,
        question: str,
        collection: str,
        *,
        idempotency_key: str | None = None,
        **params: Any,
    ) -> str:
        """The id of the queued query (the existing one when ``idempotency_key`` was used before).

        ``params``: method, num_speculative_tokens, max_tokens, temperature, seed.
        """
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = {"question": question, "collection": collection, **params}
        data = self._check(self._http.post("/v1/queries", json=body, headers=headers))
        return str(data["id"])

    def get(self, query_id: str) -> dict[str, Any]:
        """The query as ``GET /v1/queries/{id}`` shows it (status, answer, sources, stats, error)."""
        return self._check(self._http.get(f"/v1/queries/{query_id}"))

    def wait(self, query_id: str, *, timeout: float = 300.0, poll: float = 0.2) -> dict[str, Any]:
        """The query once it succeeded or failed; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            data = self.get(query_id)
            if data["status"] in ("succeeded", "failed"):
                return data
            if time.monotonic() >= deadline:
                raise TimeoutError(f"query {query_id} still {data['status']} after {timeout:.0f} s")
            time.sleep(poll)

    def stream(
        self,
        query_id: str,
        *,
        last_event_id: str | None = None,
        timeout: float = 300.0,
        reconnects: int = 3,
    ) -> Iterator[StreamEvent]:
        """The query's events as they arrive; ends after ``done`` or ``error``.

        ``token`` data ``{"text", "token_ids"}`` (the texts add up to the answer), ``reset``
        (the query started over: drop the text so far), then ``done`` (the finished query, as
        ``get`` returns it) or ``error`` (the failed one). A dropped connection is resumed from
        the last event received, up to ``reconnects`` times; TimeoutError after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        last = last_event_id
        while True:
            try:
                for event in self._stream_once(query_id, last, deadline):
                    last = event.id or last
                    yield event
                    if event.event in ("done", "error"):
                        return
                return  # 204: the stream had already ended
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectError):
                if reconnects <= 0 or time.monotonic() >= deadline:
                    raise
                reconnects -= 1
                time.sleep(0.2)

    def _stream_once(
        self, query_id: str, last: str | None, deadline: float
    ) -> Iterator[StreamEvent]:
        headers = {"Accept": "text/event-stream"}
        if last is not None:
            headers["Last-Event-ID"] = last
        # Keep-alive comments arrive every 15 s by default: a read waits longer than that.
        read = httpx.Timeout(self._http.timeout.connect, read=60.0)
        url = f"/v1/queries/{query_id}/stream"
        with self._http.stream("GET", url, headers=headers, timeout=read) as response:
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
        self, question: str, collection: str, *, timeout: float = 300.0, **params: Any
    ) -> dict[str, Any]:
        """Submit and wait: the finished query."""
        return self.wait(self.submit(question, collection, **params), timeout=timeout)

    @staticmethod
    def _check(response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            try:
                err = response.json().get("error", {})
            except ValueError:
                err = {}
            raise ClientError(
                response.status_code, err.get("field"), err.get("message", response.text)
            )
        data: dict[str, Any] = response.json()
        return data
