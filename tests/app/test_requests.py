"""The one request model: its vocabulary agrees with the engine's, and it needs Settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.requests import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    Method,
    QueryRequest,
    RequestError,
    validate_request,
)
from app.settings import Settings


def test_methods_are_the_engines() -> None:
    from generation.params import METHODS

    assert tuple(Method) == METHODS
    assert Settings().allowed_methods == METHODS


def test_stored_params_are_plain_json_with_every_default(sqlite_settings: Settings) -> None:
    request = validate_request(sqlite_settings, {"question": "q", "collection": "c"})
    assert request.params() == {
        "method": "draft_model",
        "num_speculative_tokens": DEFAULT_NUM_SPECULATIVE_TOKENS,
        "max_tokens": sqlite_settings.default_max_tokens,
        "temperature": 0.0,
        "seed": None,
    }
    assert type(request.params()["method"]) is str


def test_limits_come_from_settings(sqlite_settings: Settings) -> None:
    tight = sqlite_settings.model_copy(
        update={
            "max_tokens_limit": 8,
            "default_max_tokens": 4,
            "allowed_methods": ("ngram",),
            "default_method": "ngram",
        }
    )
    assert validate_request(tight, {"question": "q", "collection": "c", "max_tokens": 8})
    with pytest.raises(RequestError) as err:
        validate_request(tight, {"question": "q", "collection": "c", "max_tokens": 9})
    assert err.value.field == "max_tokens"
    with pytest.raises(RequestError) as err:
        validate_request(tight, {"question": "q", "collection": "c", "method": "draft_model"})
    assert err.value.field == "method"
    assert validate_request(tight, {"question": "q", "collection": "c"}).method == "ngram"


def test_k_is_named_whole_when_neither_int_nor_auto(sqlite_settings: Settings) -> None:
    with pytest.raises(RequestError) as err:
        validate_request(sqlite_settings, {"question": "q", "collection": "c", "num_speculative_tokens": 2.5})  # fmt: skip
    assert err.value.field == "num_speculative_tokens" and "'auto'" in err.value.message
    spelled = {"question": "q", "collection": "c", "num_speculative_tokens": "3"}
    assert validate_request(sqlite_settings, spelled).num_speculative_tokens == 3


def test_the_model_is_never_checked_without_settings() -> None:
    with pytest.raises((ValidationError, TypeError)):
        QueryRequest.model_validate({"question": "q", "collection": "c"})


@pytest.mark.parametrize(
    "given,field",
    [
        ({"method": 0}, "method"),
        ({"method": False}, "method"),
        ({"method": []}, "method"),
        ({"method": {}}, "method"),
        ({"num_speculative_tokens": "٤"}, "num_speculative_tokens"),
        ({"num_speculative_tokens": "9" * 5000}, "num_speculative_tokens"),
    ],
    ids=["method-0", "method-false", "method-list", "method-dict", "k-arabic-digit", "k-5000-digits"],
)  # fmt: skip
def test_loose_types_are_refused_naming_the_field(given: dict, field: str) -> None:
    from app.requests import RequestError, validate_request
    from app.settings import Settings

    with pytest.raises(RequestError) as err:
        validate_request(Settings(), {"question": "Why?", "collection": "docs", **given})
    assert err.value.field == field
    assert "set_int_max_str_digits" not in err.value.message and len(err.value.message) < 300


def test_suffix_asks_auto_unless_told(sqlite_settings: Settings) -> None:
    body = {"question": "q", "collection": "c", "method": "suffix"}
    assert validate_request(sqlite_settings, body).num_speculative_tokens == "auto"
    told = validate_request(sqlite_settings, {**body, "num_speculative_tokens": 3})
    assert told.num_speculative_tokens == 3
    ngram = validate_request(sqlite_settings, {**body, "method": "ngram"})
    assert ngram.num_speculative_tokens == DEFAULT_NUM_SPECULATIVE_TOKENS
