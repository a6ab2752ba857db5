"""CSV exports read back cell for cell: CR, LF, quotes and separators are quoted, formulas neutralised.

The audit report and the batch report share one writer (app/audit/render.py ``to_csv``); the
finding was a bare CR written unquoted, which splits the row for any RFC 4180 reader.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.audit.render import to_csv
from app.batch.report import CSV_FIELDS
from app.batch.report import to_csv as batch_csv
from app.validation import csv_cell

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# Text made mostly of the characters that matter here, so that every mix of them is tried.
TRICKY = st.text(
    alphabet=st.sampled_from(list("\r\n\",=+-@\t'; ab")) | st.characters(), max_size=12
)
CELL = st.one_of(st.none(), st.integers(-(10**6), 10**6), TRICKY)


def _read(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def _expected(value: Any) -> str:
    return "" if value is None else str(csv_cell(value))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(CELL, min_size=3, max_size=3), min_size=1, max_size=5))
def test_every_cell_reads_back_and_none_runs_as_a_formula(rows: list[list[Any]]) -> None:
    columns = ["a", "b", "c"]
    text = to_csv([dict(zip(columns, row, strict=True)) for row in rows], columns)
    cells = _read(text)
    assert cells[0] == columns
    assert cells[1:] == [[_expected(v) for v in row] for row in rows]
    for row in rows:
        for value in row:
            if isinstance(value, str):
                read = _expected(value)
                assert not read.startswith(FORMULA_START)
                if any(c in value for c in '\r\n",'):  # quoted in the raw text
                    assert '"' + read.replace('"', '""') + '"' in text
            elif isinstance(value, int):
                assert _expected(value) == str(value)  # numbers stay numbers (-3 is not '-3)


def test_batch_report_answers_with_bare_cr_keep_their_row() -> None:
    item = dict.fromkeys(CSV_FIELDS)
    item.update(
        position=1, status="succeeded", answer_before="first line\rsecond line",
        answer_after="=cmd|' /C calc'!A0\r\nmore", service_ms_before=-2,
    )  # fmt: skip
    text = batch_csv({"items": [item, {**item, "position": 2}]})
    cells = _read(text)
    assert len(cells) == 3 and cells[0] == list(CSV_FIELDS)
    row = dict(zip(CSV_FIELDS, cells[1], strict=True))
    assert row["answer_before"] == "first line\rsecond line"
    assert row["answer_after"] == "'=cmd|' /C calc'!A0\r\nmore"
    assert row["service_ms_before"] == "-2" and row["position"] == "1"
    assert cells[2][0] == "2"
