"""Collection names follow the rules of document names: no look-alike collections.

Bidi overrides, zero widths, the BOM, NBSP, U+2028 and edge spaces are refused with a 422 naming
the field and the character (API) or a one-line error (CLI), and nothing is stored or queued.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.tenancy.records import DocumentUpload
from retrieval.errors import InvalidNameError, check_name
from retrieval.records import CollectionIndex
from tests.tenancy.conftest import Api

BAD = [
    ("docs\u202e", "U+202E"),
    ("do\u200bcs", "U+200B"),
    ("\ufeffdocs", "U+FEFF"),
    ("docs\u00a0x", "U+00A0"),
    ("docs\u2028", "U+2028"),
    ("do\u0007cs", "U+0007"),
    (" docs", "space"),
    ("docs ", "space"),
]
IDS = ["bidi", "zero-width", "bom", "nbsp", "line-separator", "bell", "leading", "trailing"]


@pytest.mark.parametrize("name,words", BAD, ids=IDS)
def test_bad_collection_names_refused_naming_the_character(name: str, words: str) -> None:
    with pytest.raises(InvalidNameError) as caught:
        check_name("collection", name)
    assert words in str(caught.value)


def test_plain_names_with_inner_spaces_and_letters_pass() -> None:
    for name in ("docs", "my docs", "Résumés 2024", "日本語"):
        assert check_name("collection", name) == name


@pytest.mark.parametrize("name,words", BAD, ids=IDS)
def test_upload_into_bad_collection_is_422_and_stores_nothing(
    api: Api, name: str, words: str
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    headers = api.key(tenant)
    uploads, collections = api.count(DocumentUpload), api.count(CollectionIndex)
    body = {"collection": name, "documents": [{"name": "a.txt", "content": "hello"}]}
    response = api.post("/v1/documents", body, headers)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "collection" and words in error["message"]
    assert api.tasks == []
    assert api.count(DocumentUpload) == uploads and api.count(CollectionIndex) == collections


@pytest.mark.parametrize("name,words", BAD[:6], ids=IDS[:6])
def test_query_on_bad_collection_is_422_naming_the_character(
    api: Api, name: str, words: str
) -> None:
    headers = api.key(f"t-{uuid.uuid4().hex[:8]}")
    response = api.post("/v1/queries", {"question": "what?", "collection": name}, headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "collection"
    assert words in response.json()["error"]["message"]
    assert api.sent == []


@pytest.mark.parametrize("name,words", [BAD[0], BAD[3], BAD[6]], ids=["bidi", "nbsp", "leading"])
def test_cli_ingest_into_bad_collection_is_a_one_line_error(
    tmp_path: Path, name: str, words: str
) -> None:
    doc = tmp_path / "a.txt"
    doc.write_text("hello there")
    env = {"SPECRAG_DATA_DIR": str(tmp_path / "var"), "SPECRAG_DATABASE_URL": None}
    result = CliRunner().invoke(main, ["ingest", str(doc), "--collection", name], env=env)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: collection name") and words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "var" / "indexes").exists()


def test_upload_into_one_collection_over_the_limit_is_403_and_stores_nothing(
    tenancy_pg: str, tmp_path: Path
) -> None:
    from tests.tenancy.conftest import make_api

    with make_api(tenancy_pg, tmp_path, tenant_max_collections=2) as api:
        tenant = f"t-{uuid.uuid4().hex[:8]}"
        headers = api.key(tenant)  # the tenant's first collection, 'docs', exists
        doc = {"name": "a.txt", "content": "hello"}
        ok = api.post("/v1/documents", {"collection": "second", "documents": [doc]}, headers)
        assert ok.status_code == 202, ok.text  # pending uploads count as a collection
        uploads, collections, tasks = (api.count(DocumentUpload), api.count(CollectionIndex),
                                       len(api.tasks))  # fmt: skip
        over = api.post("/v1/documents", {"collection": "third", "documents": [doc]}, headers)
        assert over.status_code == 403, over.text
        error = over.json()["error"]
        assert error["field"] == "collection" and "max_collections is 2" in error["message"]
        assert (api.count(DocumentUpload), api.count(CollectionIndex), len(api.tasks)) == (
            uploads, collections, tasks)  # fmt: skip
        again = api.post("/v1/documents", {"collection": "docs", "documents": [doc]}, headers)
        assert again.status_code == 202  # an existing collection takes more documents
