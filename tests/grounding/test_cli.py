"""``specrag grounding check``: one JSON line per input line on real MiniLM; bad lines named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main

PASSAGE = (
    "Assert statements are a convenient way to insert debugging assertions into a program. "
    "Assignments to __debug__ are illegal."
)


def test_check_prints_one_line_per_input_line_in_order(tmp_path: Path) -> None:
    lines = [
        {"answer": "Assert statements insert debugging assertions into a program [1].",
         "passages": [PASSAGE]},
        {"answer": "Assert statements do not insert debugging assertions into a program.",
         "passages": [PASSAGE]},
        {"answer": "", "passages": [PASSAGE]},
        {"answer": "Something.", "passages": []},
    ]  # fmt: skip
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = CliRunner().invoke(main, ["grounding", "check", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = [json.loads(line) for line in result.output.splitlines()]
    assert len(out) == 4
    first = out[0]
    assert first["groundedness"] == 1.0 and first["citation_precision"] == 1.0
    s = first["sentences"][0]
    assert {"text", "start", "end", "score", "supported_by"} <= set(s)
    assert lines[0]["answer"][s["start"] : s["end"]] == s["text"] and s["supported_by"] == [0]
    assert out[1]["groundedness"] == 0.0  # the negation flipped
    assert (out[2]["groundedness"], out[2]["reason"]) == (None, "empty answer")
    assert (out[3]["groundedness"], out[3]["reason"]) == (None, "no passages")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ('["a list"]', "line 2: must be a JSON object"),
        ('{"answer": 3, "passages": []}', 'line 2: "answer" must be a string'),
        ('{"answer": "a", "passages": [1]}', 'line 2: "passages" must be a list of strings'),
    ],
)
def test_a_bad_line_is_one_error_naming_it_and_nothing_is_printed(
    tmp_path: Path, bad: str, message: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"answer": "A.", "passages": ["A."]}) + "\n" + bad + "\n")
    result = CliRunner().invoke(main, ["grounding", "check", str(path), "--json"])
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
