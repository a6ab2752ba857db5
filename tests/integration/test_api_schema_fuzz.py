"""The whole HTTP API, property-based from its own OpenAPI schema (schemathesis on hypothesis),
against a live API served by uvicorn on PostgreSQL and Redis: no input gives a 5xx, and every 4xx
is the shared error shape naming a field.

Bounded: a fixed number of examples per operation, each request with a timeout, all to 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from app.settings import Settings
from tests.integration.helpers import ApiServer

pytestmark = pytest.mark.integration
EXAMPLES = 25
"""Examples per operation: about a dozen operations, a few hundred requests, under a minute."""


@pytest.fixture(scope="module")
def fuzzed_api(service_settings: Settings, keys: dict[str, str]) -> Iterator[tuple[str, str]]:
    """An API of this module's own (short keep-alives, so that a stream answers quickly)."""
    live = service_settings.model_copy(update={"stream_keepalive_seconds": 0.5})
    with ApiServer(live) as server:
        yield server.url, keys["admin"]


def _operations(url: str) -> list[Any]:
    loaded = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in loaded.get_all_operations()]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_input_gives_a_5xx_and_every_4xx_names_a_field(
    fuzzed_api: tuple[str, str], mode: str
) -> None:
    """Every operation of the schema, with data that fits it (positive) and data that breaks it
    (negative: wrong types, missing fields, out-of-range values)."""
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable

    url, admin_key = fuzzed_api
    generation = schemathesis.GenerationMode(mode)
    seen: dict[str, int] = {}
    for operation in _operations(url):

        @given(case=operation.as_strategy(generation))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,  # the same examples every run: a failure is reproducible
            database=None,
        )
        def check(case: Any) -> None:
            headers = {"Authorization": f"Bearer {admin_key}"}
            if case.path.endswith("/stream"):
                headers["Last-Event-ID"] = "end"  # a complete stream: 204, never a wait
            response = case.call(base_url=url, headers=headers, timeout=15)
            label = case.operation.label
            seen[label] = seen.get(label, 0) + 1
            assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
            if 400 <= response.status_code < 500:
                body = response.json()
                assert set(body) >= {"error", "detail"}, (case.as_curl_command(), body)
                field = body["error"].get("field")
                assert isinstance(field, str) and field, (case.as_curl_command(), body)
                assert isinstance(body["error"].get("message"), str), body

        try:
            check()
        except Unsatisfiable:
            # Nothing breaks an operation without parameters (GET /healthz): no negative data.
            assert mode == "negative", operation.label
    assert len(seen) >= (10 if mode == "positive" else 6), (
        seen
    )  # every operation of the API was exercised
