"""``GET /v1/admin/audit`` (admin keys only, every access logged) and ``specrag audit report``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from app.api import create_app
from app.cli import main
from app.keys import create_key
from app.settings import Settings
from tests.audit.conftest import DAY, MAIN, AuditDB
from tests.fakes import RecordingDispatcher


@pytest.fixture
def settings(audit_db: AuditDB, tmp_path: Path) -> Settings:
    if audit_db.dialect != "sqlite":
        pytest.skip("access control and the CLI do not depend on the dialect; checked on SQLite")
    url = audit_db.engine.url.render_as_string(hide_password=False)
    return Settings(data_dir=tmp_path, database_url=url)


def test_admin_route_needs_admin_key_and_logs_access(
    settings: Settings, audit_db: AuditDB, caplog: pytest.LogCaptureFixture
) -> None:
    with Session(audit_db.engine) as session:
        admin = create_key(session, "ops", admin=True)
        tenant = create_key(session, "acme")
    app = create_app(settings, RecordingDispatcher(), sweeper=False)
    window = {"since": MAIN.isoformat(), "until": (MAIN + DAY).isoformat()}
    with TestClient(app) as client, caplog.at_level(logging.INFO, "app.api.routes.admin"):
        assert client.get("/v1/admin/audit", params=window).status_code == 401
        denied = client.get(
            "/v1/admin/audit", params=window, headers={"Authorization": f"Bearer {tenant}"}
        )
        assert denied.status_code == 403
        auth = {"Authorization": f"Bearer {admin}"}
        ok = client.get("/v1/admin/audit", params=window, headers=auth)
        assert ok.status_code == 200 and ok.json()["requests"] == 3000
        csv = client.get("/v1/admin/audit", params={**window, "format": "csv"}, headers=auth)
        assert csv.headers["content-type"].startswith("text/csv")
        html = client.get("/v1/admin/audit", params={**window, "format": "html"}, headers=auth)
        assert html.text.startswith("<!DOCTYPE html>")
        for params, field in (
            ({"since": "2026-03-11", "until": "2026-03-10"}, "since"),
            ({"format": "xml"}, "format"),
            ({"group_by": "planet"}, "group_by"),
        ):
            bad = client.get("/v1/admin/audit", params=params, headers=auth)
            assert bad.status_code == 422 and bad.json()["error"]["field"] == field
    logged = [r.getMessage() for r in caplog.records if r.name == "app.api.routes.admin"]
    assert sum("audit access by tenant ops" in m for m in logged) == 6, logged
    assert sum("refused" in m for m in logged) == 3


def test_cli_report_writes_file_and_refuses_bad_input(settings: Settings, tmp_path: Path) -> None:
    env = {"SPECRAG_DATABASE_URL": settings.database_url, "SPECRAG_DATA_DIR": str(tmp_path)}
    runner = CliRunner()
    out = tmp_path / "r.json"
    args = ["audit", "report", "--since", MAIN.isoformat(), "--until", (MAIN + DAY).isoformat()]
    result = runner.invoke(main, [*args, "--out", str(out), "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["requests"] == 3000
    assert json.loads(out.read_text())["requests"] == 3000
    for extra, words in (
        (["--format", "pdf"], "format: unknown format"),
        (["--group-by", "colour"], "group_by: unknown grouping"),
        (["--until", "2026-03-01"], "since: "),
    ):
        result = runner.invoke(main, [*args, *extra], env=env)
        assert result.exit_code == 1 and words in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
