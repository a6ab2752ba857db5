"""Input hygiene shared by every entry point: text that PostgreSQL, JSON and UTF-8 can all hold.

A NUL byte cannot be stored in a PostgreSQL ``text`` column and a lone surrogate cannot be
encoded as UTF-8 (nor sent in a Celery message): unchecked, either surfaces as a 500 after part
of a request has been stored or queued. Every string a client sends is checked here first, and the
refusal names the field (``app.requests.check_text`` raises the RequestError). CSV cells are
neutralised here too (OWASP "CSV injection"). This module imports nothing of the app.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

# A UTF-16 surrogate code point on its own: JSON's "\ud800" decodes to one in Python.
_SURROGATE = re.compile("[\ud800-\udfff]")
# OWASP: a spreadsheet treats a cell starting with one of these as a formula.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# Times are kept in a range where window arithmetic (previous window, trailing week) and every
# database's timestamp type stay valid.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (NUL byte, lone surrogate), or None when it can."""
    if "\x00" in value:
        return "contains a NUL byte (\\u0000), which cannot be stored"
    if _SURROGATE.search(value):
        return "contains a lone UTF-16 surrogate, which is not valid Unicode"
    return None


def find_bad_text(value: Any, path: str = "") -> tuple[str, str] | None:
    """``(field path, reason)`` of the first string in a JSON value that cannot be stored.

    Keys count as well as values: ``{"a\\u0000": 1}`` is refused as ``a\\u0000``'s field would be.
    The path reads like the API's field names: ``documents[0].name``.
    """
    if isinstance(value, str):
        problem = text_problem(value)
        return (path or "body", problem) if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (problem := text_problem(key)):
                return (path or "body", f"a field name {problem}")
            found = find_bad_text(item, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = find_bad_text(item, f"{path}[{i}]")
            if found:
                return found
    return None


def check_time_range(field: str, when: datetime) -> datetime:
    """``when`` (aware) when it lies in [1970, 3000); ValueError naming ``field`` otherwise."""
    if not EARLIEST <= when < LATEST:
        raise ValueError(
            f"{field}: {when.isoformat()} is out of range "
            f"(between {EARLIEST.date()} and {LATEST.date()} UTC)"
        )
    return when


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: strings starting with = + - @ tab or CR get a '."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value
