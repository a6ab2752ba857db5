"""``specrag ask --stream`` on real PostgreSQL and Redis: the answer as it is generated, as events
(--json) or as text, adding up to the stored answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from app.settings import Settings
from tests.integration.helpers import settings_env

pytestmark = pytest.mark.integration


def test_ask_stream_prints_events_that_add_up_to_the_answer(
    service_settings: Settings, ingested: str
) -> None:
    from app.cli import main

    env = settings_env(service_settings)
    args = ["ask", "What does the assert statement do?", "--collection", ingested]
    args += ["--tenant", "acme", "--max-tokens", "8", "--local", "--stream"]
    result = CliRunner().invoke(main, [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    events: list[dict[str, Any]] = lines[:-1]
    view = lines[-1]
    assert view["status"] == "succeeded"
    assert events and {e["event"] for e in events} == {"token"}
    assert all(e["id"] for e in events)
    assert "".join(e["data"]["text"] for e in events) == view["answer"]
    ids = sum((e["data"]["token_ids"] for e in events), [])
    assert len(ids) == view["stats"]["num_output_tokens"]

    text = CliRunner().invoke(main, args, env=env)
    assert text.exit_code == 0, text.output
    again = json.loads(CliRunner().invoke(main, [*args, "--json"], env=env).output.splitlines()[-1])
    # Greedy: the same answer each time; printed as it streamed, then the sources.
    assert text.output.startswith(again["answer"] + "\n") and "Sources:" in text.output
