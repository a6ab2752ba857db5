"""A method the service lacks what it needs for: a 422 naming the methods it serves.

``eagle`` needs a head trained on the target's features (``SPECRAG_EAGLE_MODEL``, or the demo
head beside the demo target); ``suffix`` is served unless ``SPECRAG_SUFFIX=0`` turns it off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tenancy.conftest import Api, make_api


def test_eagle_without_a_head_is_422_naming_the_methods_served(
    tenancy_pg: str, tmp_path: Path
) -> None:
    with make_api(tenancy_pg, tmp_path, eagle_model=None) as api:
        response: Any = _ask(api, "eagle")
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == "method"
        assert "EAGLE head" in error["message"]
        assert "serves draft_model, ngram, suffix, none" in error["message"]
        assert api.sent == []


def test_suffix_turned_off_is_422_naming_the_methods_served(
    tenancy_pg: str, tmp_path: Path
) -> None:
    with make_api(tenancy_pg, tmp_path, suffix=False, eagle_model=None) as api:
        response: Any = _ask(api, "suffix")
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == "method"
        assert "SPECRAG_SUFFIX" in error["message"]
        assert error["message"].endswith("it serves draft_model, ngram, none")
        assert api.sent == []


@pytest.mark.parametrize(
    ("method", "overrides"), [("eagle", {"eagle_model": "head"}), ("suffix", {})]
)
def test_a_served_method_passes_validation(
    tenancy_pg: str, tmp_path: Path, method: str, overrides: dict[str, Any]
) -> None:
    if "eagle_model" in overrides:
        overrides = {"eagle_model": tmp_path / overrides["eagle_model"]}
    with make_api(tenancy_pg, tmp_path, **overrides) as api:
        response: Any = _ask(api, method)
        assert response.status_code == 202, response.text
        assert len(api.sent) == 1


def _ask(api: Api, method: str) -> Any:
    headers = api.key(f"t-{method}")
    body = {"question": "what?", "collection": "docs", "method": method}
    return api.post("/v1/queries", body, headers)
