"""docs/results.md is what scripts/results.py renders from benchmarks/results/*.json, exactly.

Every benchmark that backs a goal has its results file, and every results file a benchmark.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def results_script() -> ModuleType:
    """scripts/results.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("results_page", ROOT / "scripts" / "results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_equals_the_page_rendered_from_the_json() -> None:
    page = results_script().render(
        [results_script().load(p) for p in sorted(RESULTS.glob("*.json"))]
    )
    assert (ROOT / "docs" / "results.md").read_text(encoding="utf-8") == page, (
        "docs/results.md differs from benchmarks/results/: run `make results`"
    )


def test_check_mode_exits_zero_on_the_committed_tree() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/results.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_goal_backing_benchmark_has_its_results_file_and_back() -> None:
    writers = {
        p.stem
        for p in (ROOT / "benchmarks").glob("*.py")
        if re.search(r"^GOALS = \[", p.read_text(encoding="utf-8"), flags=re.M)
    }
    files = {p.stem for p in RESULTS.glob("*.json")}
    assert writers == files
    for name in writers:  # and each writes its own file when it runs
        source = (ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
        assert f'write_result("{name}", ' in source, name


def test_results_files_carry_where_and_how_they_were_measured() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["command"].count("benchmarks.") >= 1, path.name
        assert data["date"] and data["commit"], path.name
        assert set(data["host"]) == {"cpu", "isa"}, path.name
        assert data["provenance"] == "run" or data["provenance"].startswith(
            ("carried from the record", "run on branch ")
        ), path.name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("commit"), "missing commit"),
        (lambda d: d["goals"][0].update(figure="nope"), "reads figure 'nope', absent"),
        (lambda d: d["goals"][0].update(area="elsewhere"), "unknown area 'elsewhere'"),
        (lambda d: d["goals"][0].update(op="<"), "op '<'"),
    ],
)
def test_a_bad_results_file_is_refused_by_name(tmp_path: Path, change, message: str) -> None:
    data = json.loads((RESULTS / "audit.json").read_text(encoding="utf-8"))
    change(data)
    bad = tmp_path / "audit.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    module = results_script()
    with pytest.raises(module.BadResult, match=re.escape(message)):
        module.load(bad)


def test_met_reads_the_goal_and_says_when_nothing_was_measured() -> None:
    module = results_script()
    assert module.met(0.88, ">=", 0.9) == "**no**"
    assert module.met(3.0, "<=", 5.0) == "yes"
    assert module.met(True, "==", True) == "yes"
    assert module.met(None, ">=", 1.0) == "n/a"


def declared_goals(path: Path) -> list[dict]:
    """The ``GOALS`` a benchmark declares, read from its source (tests import no benchmark)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "GOALS":
            assert isinstance(node.value, ast.List)
            goals = []
            for call in node.value.elts:
                assert isinstance(call, ast.Call)
                args = [ast.literal_eval(a) for a in call.args]
                goals.append(dict(zip(("area", "goal", "figure", "op", "target", "unit"),
                                      [*args, ""][:6], strict=True)))  # fmt: skip
            return goals
    return []


def test_each_results_file_reads_the_goals_its_benchmark_declares() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        stored = [{k: g[k] for k in ("area", "goal", "figure", "op", "target", "unit")}
                  for g in data["goals"]]  # fmt: skip
        assert stored == declared_goals(ROOT / "benchmarks" / f"{path.stem}.py"), path.name


def test_the_source_cell_tells_a_run_here_from_a_branch_run_and_a_record() -> None:
    module = results_script()
    data = json.loads((RESULTS / "audit.json").read_text(encoding="utf-8"))
    goal = data["goals"][0]
    cells = {}
    for provenance, load in (("run", 2.5), ("run on branch b at abc1234", None),
                             ("carried from the record: x", None)):  # fmt: skip
        data.update(provenance=provenance, load_average=load)
        cells[provenance] = module.row(data, goal).split(" | ")[6]
    assert list(cells.values()) == ["run, load 2.5", "branch run", "record"]
