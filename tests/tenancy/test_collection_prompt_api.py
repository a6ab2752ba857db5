"""``/v1/collections/{collection}/system-prompt`` on PostgreSQL: tenant-scoped, checked, stored."""

from __future__ import annotations

from app.db import CollectionSettings
from app.settings import Settings
from tests.tenancy.conftest import Api

PATH = "/v1/collections/docs/system-prompt"


def test_set_show_and_clear_a_collections_system_prompt(api: Api) -> None:
    acme, other = api.key("acme"), api.key("other")
    default = Settings().system_prompt
    shown = api.client.get(PATH, headers=acme)
    assert shown.status_code == 200
    assert shown.json() == {"collection": "docs", "system_prompt": default, "source": "settings"}

    put = api.client.put(PATH, json={"system_prompt": "  Answer in French.  "}, headers=acme)
    assert put.status_code == 200, put.text
    assert put.json() == {
        "collection": "docs",
        "system_prompt": "Answer in French.",
        "source": "collection",
    }
    # Another tenant's collection of the same name keeps the service's prompt.
    assert api.client.get(PATH, headers=other).json()["source"] == "settings"

    too_long = api.client.put(PATH, json={"system_prompt": "x" * 4001}, headers=acme)
    assert too_long.status_code == 422
    assert too_long.json()["error"]["field"] == "system_prompt"
    assert "over the limit of 4000" in too_long.json()["error"]["message"]
    empty = api.client.put(PATH, json={"system_prompt": " "}, headers=acme)
    assert empty.status_code == 422
    assert api.client.get(PATH, headers=acme).json()["system_prompt"] == "Answer in French."

    cleared = api.client.delete(PATH, headers=acme)
    assert cleared.json()["source"] == "settings"
    assert api.count(CollectionSettings) == 1  # the row stays, its prompt is null


def test_unknown_collection_and_missing_key_are_refused(api: Api) -> None:
    acme = api.key("acme")
    missing = api.client.get("/v1/collections/nope/system-prompt", headers=acme)
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "collection"
    assert api.client.get(PATH).status_code == 401
