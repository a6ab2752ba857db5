"""Per-tenant limits over HTTP: 429 with Retry-After, an admin's overrides, Redis-shared counters."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.cli import main
from app.db import Query, Tenant
from app.settings import Settings
from app.tenancy.ratestore import DatabaseStorage
from tests.tenancy.conftest import make_api


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _ask(api, headers, n: int = 1) -> list[int]:  # type: ignore[no-untyped-def]
    return [
        api.client.post(
            "/v1/queries", json={"question": f"q{i}?", "collection": "docs"}, headers=headers
        ).status_code
        for i in range(n)
    ]


def test_active_query_quota_and_admin_override(tenancy_pg: str, tmp_path: Path) -> None:
    with make_api(tenancy_pg, tmp_path, tenant_max_active_queries=3,
                        tenant_submissions_per_second=0) as api:  # fmt: skip
        name = _tenant()
        headers = api.key(name)
        assert _ask(api, headers, 3) == [202, 202, 202]
        refused = api.client.post(
            "/v1/queries", json={"question": "more?", "collection": "docs"}, headers=headers
        )
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["field"] == "question"
        with Session(api.engine) as session:
            tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
            assert session.query(Query).filter_by(tenant_id=tenant_id).count() == 3
        # Another tenant is not affected by this one's quota.
        assert _ask(api, api.key(_tenant()), 1) == [202]
        # An admin raises this tenant's quota (CLI); the API sees it within its cache period.
        env = {"SPECRAG_DATABASE_URL": tenancy_pg, "SPECRAG_DATA_DIR": str(tmp_path)}
        result = CliRunner().invoke(
            main, ["tenants", "limits", "--tenant", name, "--max-active-queries", "5", "--json"],
            env=env,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        api.client.app.state.enforcer._cache.clear()
        assert _ask(api, headers, 3) == [202, 202, 429]


@pytest.mark.parametrize("broker", ["redis", "embedded"])
def test_submission_rate_limit_is_shared_between_api_processes(
    broker: str, tenancy_pg: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Where Redis is the broker the window lives in Redis; on the embedded broker, in the
    database (app/tenancy/ratestore.py). Either way two API processes share it.

    0.2/s: one submission per 5-second window. Eight requests alternate between two API
    processes' worth of apps and take well under 5 s, so they span at most two windows: with
    one shared counter at most 2 pass; with a counter per process up to 4 would."""
    overrides: dict[str, object] = {
        "tenant_submissions_per_second": 0.2,
        "tenant_submission_burst": 0,
    }
    if broker == "redis":
        overrides["broker_url"] = request.getfixturevalue("redis_url")
    with (
        make_api(tenancy_pg, tmp_path / "a", **overrides) as first,
        make_api(tenancy_pg, tmp_path / "b", **overrides) as second,
    ):
        storage = first.client.app.state.enforcer.storage
        assert isinstance(storage, DatabaseStorage) == (broker == "embedded")
        headers = first.key(_tenant())
        responses = [
            app.client.post(
                "/v1/queries", json={"question": f"q{i}?", "collection": "docs"}, headers=headers
            )
            for i in range(4)
            for app in (first, second)
        ]
        codes = [r.status_code for r in responses]
        assert 1 <= codes.count(202) <= 2 and codes.count(429) >= 6, codes
        refused = next(r for r in responses if r.status_code == 429)
        assert 1 <= int(refused.headers["Retry-After"]) <= 5
        assert refused.json()["error"]["field"] == "submissions_per_second"


def test_upload_bytes_per_request_and_per_day(tenancy_pg: str, tmp_path: Path) -> None:
    with make_api(tenancy_pg, tmp_path, tenant_max_upload_bytes=1000,
                        tenant_max_upload_bytes_per_day=1500) as api:  # fmt: skip
        headers = api.key(_tenant())

        def upload(size: int, name: str) -> int:
            doc = {"name": name, "content": "x" * size}
            return int(
                api.client.post(
                    "/v1/documents",
                    json={"collection": "docs", "documents": [doc]},
                    headers=headers,
                ).status_code  # fmt: skip
            )

        assert upload(1200, "big.txt") == 413
        assert upload(900, "a.txt") == 202
        assert upload(900, "b.txt") == 429  # 1800 bytes today is over 1500
        assert [name for name, _ in api.tasks].count("uploads") == 1
        # The tenant's extracted-characters limit travels with the task to the ingest worker.
        assert api.tasks[0][1][3] == api.settings.tenant_max_extracted_chars


def test_batch_items_in_flight(tenancy_pg: str, tmp_path: Path) -> None:
    with make_api(tenancy_pg, tmp_path, tenant_max_batch_items=5) as api:
        headers = api.key(_tenant())
        questions = [{"question": f"q{i}?", "collection": "docs"} for i in range(4)]
        ok = api.client.post("/v1/batches", json={"questions": questions}, headers=headers)
        assert ok.status_code == 202, ok.text
        over = api.client.post("/v1/batches", json={"questions": questions}, headers=headers)
        assert over.status_code == 429 and over.json()["error"]["field"] == "questions"
        assert "Retry-After" in over.headers


@pytest.mark.parametrize("value", ["-1", "abc"])
def test_limits_cli_refuses_bad_values(tenancy_pg: str, tmp_path: Path, value: str) -> None:
    with make_api(tenancy_pg, tmp_path) as api:
        name = _tenant()
        api.key(name)
        env = {"SPECRAG_DATABASE_URL": tenancy_pg, "SPECRAG_DATA_DIR": str(tmp_path)}
        result = CliRunner().invoke(
            main, ["tenants", "limits", "--tenant", name, "--max-batch-items", value], env=env
        )
        assert result.exit_code != 0 and "max-batch-items" in result.output, result.output


def test_rates_fail_open_and_fast_when_the_brokers_redis_is_down(
    tenancy_pg: str, tmp_path: Path
) -> None:
    """A dead broker must not turn a submit into a 500 or a hang: it is stored and answered 202."""
    import socket
    import time

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = f"redis://127.0.0.1:{port}/0"
    with make_api(tenancy_pg, tmp_path, broker_url=dead, max_question_tokens=0) as api:
        headers = api.key(_tenant())
        assert _ask(api, headers, 1) == [202]  # the first request also warms the app up
        started = time.monotonic()
        assert _ask(api, headers, 2) == [202, 202]
        assert time.monotonic() - started < 10  # seconds; each refused connect is ~ms


def test_default_limits_admit_a_burst_then_hold_the_sustained_rate(
    tenancy_pg: str, tmp_path: Path
) -> None:
    """At default settings (20/s, bursts of 60) a web backend's burst of 48 at once is all
    accepted (it lost 4 of 24 to 429 with one second's worth as the window)."""
    from concurrent.futures import ThreadPoolExecutor

    defaults = Settings(data_dir=tmp_path)
    assert (defaults.tenant_submissions_per_second, defaults.tenant_submission_burst) == (20, 60)
    with make_api(tenancy_pg, tmp_path) as api:
        headers = api.key(f"t-{uuid.uuid4().hex[:8]}")

        def submit(i: int) -> int:
            body = {"question": f"burst {i}?", "collection": "docs"}
            return int(api.client.post("/v1/queries", json=body, headers=headers).status_code)

        with ThreadPoolExecutor(8) as pool:
            burst = list(pool.map(submit, range(48)))
        assert burst == [202] * 48, burst


def test_the_burst_window_keeps_the_sustained_rate() -> None:
    from app.tenancy.limits import burst_window

    assert burst_window(20, 60) == (60, 3)  # 60 at once, 20/s on average
    assert burst_window(20, 0) == (20, 1)  # no burst: one second's worth, as before
    assert burst_window(0.2, 0) == (1, 5)  # one per 5 s
    assert burst_window(100, 60) == (100, 1)  # a burst under one second's worth changes nothing
    for rate, burst in [(20, 60), (3, 10), (0.5, 60), (7, 1)]:
        amount, seconds = burst_window(rate, burst)
        assert amount >= burst and amount / seconds <= rate  # never above the sustained rate
