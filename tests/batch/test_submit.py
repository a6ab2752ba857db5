"""Bad batch input is refused with a clear error and nothing stored (real PostgreSQL; no worker).

CLI and HTTP API are both exercised; dispatch is replaced by a recorder in the API test because
no batch here may reach a worker (every one of them is refused before that point).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select


def counts(session_factory: Any) -> tuple[int, int, int]:
    from app.batch import Batch, BatchItem
    from app.db import Query

    with session_factory() as session:
        return tuple(  # type: ignore[return-value]
            session.scalar(select(func.count()).select_from(t)) for t in (Batch, BatchItem, Query)
        )


def run_cli(batch_env: dict[str, str], *args: str) -> Any:
    from workers.cli import main

    return CliRunner().invoke(main, ["batch", *args], env=batch_env, catch_exceptions=False)


def test_malformed_lines_are_all_listed_and_nothing_is_queued(
    batch_env: dict[str, str], session_factory: Any, ingested: str, tmp_path: Path
) -> None:
    lines = [
        json.dumps({"question": "What does assert do?"}),
        "{not json",
        json.dumps({"question": "ok", "colour": "red"}),
        "",
        json.dumps({"question": ""}),
        json.dumps({"question": "ok", "max_tokens": 10**6}),
        json.dumps(["a list"]),
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = counts(session_factory)
    result = run_cli(batch_env, "submit", str(path), "--collection", ingested, "--json")
    assert result.exit_code == 1
    error = result.output.strip()
    assert error.startswith("error: file: 5 bad line(s), nothing queued")
    for number, field in ((2, "not valid JSON"), (3, "colour"), (5, "question"), (6, "max_tokens")):
        assert f"line {number}: {field}" in error, error
    assert "line 7: line: must be a JSON object" in error
    assert "line 1:" not in error and "line 4:" not in error
    assert counts(session_factory) == before


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("", ["--collection", "demo"], "no questions"),
        ('{"question": "q"}\n', ["--collection", "no-such"], "unknown collection 'no-such'"),
        ('{"question": "q"}\n', [], "collection: missing"),
        ('{"question": "q"}\n', ["--collection", "demo", "--max-tokens", "100000"], "max_tokens"),
        ('{"question": "q"}\n', ["--collection", "demo", "--method", "magic"], "method"),
        ('{"question": "q"}\n' * 501, ["--collection", "demo"], "batch_max_items (500)"),
        ('{"question": "q"}\n', ["--collection", "demo", "--golden"], "expected_source"),
    ],
)
def test_bad_file_or_options_are_refused(
    batch_env: dict[str, str],
    session_factory: Any,
    ingested: str,
    tmp_path: Path,
    content: str,
    args: list[str],
    message: str,
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(content)
    before = counts(session_factory)
    result = run_cli(batch_env, "submit", str(path), *args)
    assert result.exit_code == 1, result.output
    assert message in result.output and result.output.startswith("error: "), result.output
    assert counts(session_factory) == before


def test_empty_filter_and_unknown_batch_are_refused(
    batch_env: dict[str, str], session_factory: Any
) -> None:
    before = counts(session_factory)
    result = run_cli(batch_env, "submit", "--stored", "--collection", "never-asked")
    assert result.exit_code == 1
    assert (
        "filter: matched no finished stored queries (tenant=default, collection=never-asked)"
        in result.output
    )
    result = run_cli(batch_env, "submit", "--stored", "--since", "yesterday")
    assert "since: not an ISO 8601 time" in result.output
    assert counts(session_factory) == before
    result = run_cli(batch_env, "status", "00000000-0000-0000-0000-000000000000")
    assert result.exit_code == 1 and "no batch" in result.output


def test_api_refuses_bad_batches_and_scopes_tenants(
    settings: Any, session_factory: Any, ingested: str
) -> None:
    from fastapi.testclient import TestClient

    from app.api import create_app
    from app.keys import create_key
    from tests.fakes import RecordingDispatcher

    with session_factory() as session:
        key = create_key(session, "default")
        other = create_key(session, "someone-else")
    queue = RecordingDispatcher()
    app = create_app(settings, queue, sweeper=False)
    before = counts(session_factory)
    with TestClient(app) as client:
        auth = {"Authorization": f"Bearer {key}"}
        bad = client.post(
            "/v1/batches",
            headers=auth,
            json={"jsonl": '{"question": 1}\n{', "collection": ingested},
        )
        assert bad.status_code == 422
        assert bad.json()["error"]["field"] == "file"
        assert "line 1: question" in bad.json()["error"]["message"]
        assert "line 2: not valid JSON" in bad.json()["error"]["message"]
        both = client.post("/v1/batches", headers=auth, json={"jsonl": "", "filter": {}})
        assert both.status_code == 422
        cross = client.post(
            "/v1/batches", headers=auth, json={"filter": {"tenant": "someone-else"}}
        )
        assert cross.status_code == 403 and cross.json()["error"]["field"] == "filter.tenant"
        assert counts(session_factory) == before and queue.of("batch") == []
        ok = client.post(
            "/v1/batches",
            headers=auth,
            json={"questions": [{"question": "What is assert?"}], "collection": ingested},
        )
        assert ok.status_code == 202, ok.text
        batch_id = ok.json()["id"]
        sent = queue.of("batch")
        assert sent and str(sent[0][0]) == batch_id
        seen = client.get(f"/v1/batches/{batch_id}", headers=auth, params={"items": True})
        assert seen.json()["total"] == 1 and len(seen.json()["items"]) == 1
        hidden = client.get(f"/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {other}"})
        assert hidden.status_code == 404
        cancelled = client.post(f"/v1/batches/{batch_id}/cancel", headers=auth)
        assert cancelled.json()["status"] == "cancelled" and cancelled.json()["cancelled"] == 1
