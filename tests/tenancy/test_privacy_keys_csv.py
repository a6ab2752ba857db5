"""Privacy that holds (idempotent retries, batch re-runs), API key lifecycle, CSV neutralising."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.audit.render import to_csv
from app.cli import main
from app.db import ApiKey, Query, make_session_factory, utcnow
from app.privacy import scrub_question
from tests.tenancy.conftest import Api, make_api


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _finish_and_scrub(api: Api, query_id: str, mode: str) -> None:
    settings = api.settings.model_copy(update={"store_questions": mode})
    with Session(api.engine) as session:
        session.execute(
            update(Query).where(Query.id == uuid.UUID(query_id)).values(status="succeeded")
        )
        session.commit()
    scrub_question(make_session_factory(api.engine), settings, uuid.UUID(query_id))


def test_an_identical_retry_after_scrubbing_gets_the_same_id(api: Api) -> None:
    headers = api.key(_tenant())
    for mode in ("hashed", "redacted"):
        body = {"question": "Is +44 20 7946 0958 mine? me@example.com", "collection": "docs"}
        key = {**headers, "Idempotency-Key": f"k-{mode}"}
        first = api.client.post("/v1/queries", json=body, headers=key)
        assert first.status_code == 202
        _finish_and_scrub(api, first.json()["id"], mode)
        again = api.client.post("/v1/queries", json=body, headers=key)
        assert again.status_code == 202, again.text  # was 409: the stored question is a hash
        assert again.json()["id"] == first.json()["id"]
        other = api.client.post(
            "/v1/queries", json={**body, "question": "Something else?"}, headers=key
        )
        assert other.status_code == 409


def test_a_batch_rerun_of_hashed_questions_is_refused_with_the_reason(api: Api) -> None:
    name = _tenant()
    headers = api.key(name)
    made = api.client.post(
        "/v1/queries", json={"question": "What is a key?", "collection": "docs"}, headers=headers
    )
    _finish_and_scrub(api, made.json()["id"], "hashed")
    rerun = api.client.post("/v1/batches", json={"filter": {"tenant": name}}, headers=headers)
    assert rerun.status_code == 422, rerun.text
    assert rerun.json()["error"]["field"] == "filter"
    assert "hashed or redacted" in rerun.json()["error"]["message"]
    with Session(api.engine) as session:
        assert session.scalar(select(Query).where(Query.queue == "batch")) is None


def test_keys_list_revoke_and_expiry(tenancy_pg: str, tmp_path: Path) -> None:
    env = {"SPECRAG_DATABASE_URL": tenancy_pg, "SPECRAG_DATA_DIR": str(tmp_path)}
    runner = CliRunner()
    name = _tenant()
    import json

    made = json.loads(runner.invoke(main, ["keys", "create", "--tenant", name, "--json"],
                                    env=env).output)  # fmt: skip
    expiring = json.loads(
        runner.invoke(
            main, ["keys", "create", "--tenant", name, "--expires-in-days", "1", "--json"], env=env
        ).output  # fmt: skip
    )
    listed = json.loads(runner.invoke(main, ["keys", "list", "--tenant", name, "--json"],
                                      env=env).output)["keys"]  # fmt: skip
    assert [k["prefix"] for k in listed] == [made["key"][:12], expiring["key"][:12]]
    assert all(k["active"] for k in listed) and made["key"] not in json.dumps(listed)
    with make_api(tenancy_pg, tmp_path) as api:
        api.key(name)  # the tenant's collection exists
        body = {"question": "q?", "collection": "docs"}

        def status(key: str) -> int:
            headers = {"Authorization": f"Bearer {key}"}
            return int(api.client.post("/v1/queries", json=body, headers=headers).status_code)

        assert status(made["key"]) == 202 and status(expiring["key"]) == 202
        revoked = runner.invoke(main, ["keys", "revoke", made["key"][:12], "--json"], env=env)
        assert revoked.exit_code == 0 and json.loads(revoked.output)["revoked"] == 1
        assert status(made["key"]) == 401
        with Session(api.engine) as session:
            session.execute(
                update(ApiKey)
                .where(ApiKey.prefix == expiring["key"][:12])
                .values(expires_at=utcnow() - timedelta(seconds=1))
            )
            session.commit()
        assert status(expiring["key"]) == 401
    again = runner.invoke(main, ["keys", "revoke", made["key"][:12]], env=env)
    assert again.exit_code == 1 and "no live key" in again.output


def test_csv_cells_that_would_run_as_formulas_are_neutralised() -> None:
    rows = [
        {"collection": '=HYPERLINK("http://evil","x")', "n": -3, "a": "+1", "b": "@SUM(A1)"},
        {"collection": "\tcmd", "n": 2.5, "a": "-x", "b": "\rx"},
        {"collection": "plain", "n": 0, "a": "a=b", "b": None},
    ]
    text = to_csv(rows)
    cells = list(csv.reader(io.StringIO(text, newline="")))
    assert cells[1] == ['\'=HYPERLINK("http://evil","x")', "-3", "'+1", "'@SUM(A1)"]
    assert cells[2][0] == "'\tcmd" and cells[2][2] == "'-x"
    assert cells[2][3] == "'\rx"  # the CR cell too, quoted, so the row is not split there
    assert cells[-1] == ["plain", "0", "a=b", ""]  # numbers stay numbers, inner '=' is fine
