"""``method=eagle`` on a service without an EAGLE head: a 422 naming the methods it serves.

A head is trained on one target's features, so a worker has one only when
``SPECRAG_EAGLE_MODEL`` names it (or it runs the demo target, whose head ships beside it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.tenancy.conftest import Api, make_api


def test_eagle_without_a_head_is_422_naming_the_methods_served(
    tenancy_pg: str, tmp_path: Path
) -> None:
    with make_api(tenancy_pg, tmp_path, eagle_model=None) as api:
        response: Any = _ask_eagle(api)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == "method"
        assert "EAGLE head" in error["message"]
        assert "serves draft_model, ngram, none" in error["message"]
        assert api.tasks == []


def test_eagle_with_a_head_passes_validation(tenancy_pg: str, tmp_path: Path) -> None:
    with make_api(tenancy_pg, tmp_path, eagle_model=tmp_path / "head") as api:
        response: Any = _ask_eagle(api)
        assert response.status_code != 422 or response.json()["error"]["field"] != "method"


def _ask_eagle(api: Api) -> Any:
    headers = api.key("t-eagle")
    body = {"question": "what?", "collection": "docs", "method": "eagle"}
    return api.post("/v1/queries", body, headers)
