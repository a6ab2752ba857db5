"""A small Python client for the web backend: submit, wait, get — the HTTP API, nothing more."""

from __future__ import annotations

import time
from typing import Any

import httpx


class ClientError(RuntimeError):
    """A 4xx/5xx from the API; ``status`` and ``field`` say what was wrong."""

    def __init__(self, status: int, field: str | None, message: str) -> None:
        super().__init__(f"HTTP {status}: {field + ': ' if field else ''}{message}")
        self.status = status
        self.field = field
        self.message = message


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
