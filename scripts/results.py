"""Render docs/results.md from the benchmarks' own figures (benchmarks/results/*.json).

    python scripts/results.py           # write docs/results.md (make results)
    python scripts/results.py --check   # exit 1 when docs/results.md differs from the JSON

Each JSON file is what ``benchmarks.support.write_result`` writes: the figures, the goals read
from them (area, goal, figure, op, target, unit), the date, commit, host CPU and ISA, the command
and where the figures come from. The page holds one row per goal, grouped by area.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
FIELDS = ("benchmark", "command", "date", "commit", "host", "provenance", "figures", "goals")
GOAL_FIELDS = ("area", "goal", "figure", "op", "target", "unit")
# Areas in the order of one query's path through the service, then the offline tools.
# Area -> the page's heading (its anchor is the heading in lower case, spaces as hyphens).
AREAS = {
    "engine": "Engine", "bf16": "bfloat16", "eagle": "EAGLE head", "suffix": "Suffix drafts", "instruct": "Instruct demo pair",
    "batching": "Continuous batching", "prefix reuse": "Prefix reuse", "vllm": "vLLM",
    "serving": "Serving", "service": "Service", "streaming": "Streaming", "batch": "Batch jobs",
    "tenants": "Tenants", "hostile traffic": "Hostile traffic", "metrics": "Metrics", "tracing": "Tracing",
    "retrieval": "Retrieval", "grounding": "Grounding", "scale-out": "Scale-out", "faults": "Faults", "audit": "Audit",
    "drafts": "Drafts tuned on traffic",
}  # fmt: skip

HEAD = """# Results

The figures specrag's benchmarks measure, one row per goal: the figure, the goal, whether the
figure meets it, the date (UTC), the commit and the host CPU's instruction set it was measured
on, and the command that reproduces it (run from the repository root). Every benchmark writes
its figures to one JSON file in `benchmarks/results/` (named after the benchmark); `make results` renders this page from those files,
and a test fails when the page and the files disagree. Do not edit this page by hand.

Source `run`: the benchmark wrote the file (with the host's one-minute load average when it
finished). Source `record`: the figure is carried from the project's measurement record
(a page of the repository at the entry's commit, in git history) with the date, commit, host and command recorded
with it; the JSON's `provenance` names the entry, and rerunning the command replaces it. The
machines are small shared VMs (2 cores); compared variants always run side by side in one run,
so ratios travel better than absolute figures. ISA: `avx2` (no AVX-512), `avx512_bf16`
(AVX-512 with bf16 dot products, no AMX), `amx` (Intel AMX tiles); `n/r` where the record does
not say.

Source `branch run`: the benchmark ran on the same host from a branch's tree before that branch
was merged; the JSON's `provenance` names the branch, its commit, how the command was read and
why the figure holds on the tree it is shown with. Rerunning the command replaces it.
"""


class BadResult(ValueError):
    """A results file that cannot be rendered: it names the file and the field."""


def load(path: Path) -> dict[str, Any]:
    """One results file, checked for the fields the page needs."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BadResult(f"{path.name}: not JSON ({exc})") from exc
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise BadResult(f"{path.name}: missing {', '.join(missing)}")
    if data["benchmark"] != path.stem:
        raise BadResult(f"{path.name}: benchmark is {data['benchmark']!r}, not {path.stem!r}")
    for i, goal in enumerate(data["goals"]):
        lacking = [f for f in GOAL_FIELDS if f not in goal]
        if lacking:
            raise BadResult(f"{path.name}: goal {i} misses {', '.join(lacking)}")
        if goal["area"] not in AREAS:
            raise BadResult(f"{path.name}: goal {i}: unknown area {goal['area']!r}")
        if goal["figure"] not in data["figures"]:
            raise BadResult(f"{path.name}: goal {i} reads figure {goal['figure']!r}, absent")
        if goal["op"] not in ("<=", ">=", "=="):
            raise BadResult(f"{path.name}: goal {i}: op {goal['op']!r}")
    return data


def number(value: Any, unit: str) -> str:
    """A figure as the page shows it: three significant digits, its unit after it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "not measured"
    text = str(value) if isinstance(value, int) else f"{value:.3g}"
    return text + (unit if unit in ("x", "%") else f" {unit}" if unit else "")


def met(value: Any, op: str, target: Any) -> str:
    """Whether ``value op target`` holds: yes, no, or n/a when nothing was measured."""
    if value is None:
        return "n/a"
    ok = {"<=": value <= target, ">=": value >= target, "==": value == target}[op]
    return "yes" if ok else "**no**"


def row(data: dict[str, Any], goal: dict[str, Any]) -> str:
    value = data["figures"][goal["figure"]]
    figure = number(value, goal["unit"]) + (f" ({goal['note']})" if goal.get("note") else "")
    target = "yes" if goal["target"] is True else number(goal["target"], goal["unit"])
    wanted = goal["goal"] + ("" if goal["op"] == "==" else f" ({goal['op']} {target})")
    source = "record"
    if data["provenance"] == "run" or data["provenance"].startswith("run on branch "):
        source = "run" if data["provenance"] == "run" else "branch run"
        load = data.get("load_average")
        source += "" if load is None else f", load {load:g}"
    date = str(data["date"])[:10]
    isa = data["host"].get("isa") or "n/r"
    cells = [wanted, figure, met(value, goal["op"], goal["target"]), date, f"`{data['commit']}`",
             isa, source, f"`{data['command']}`"]  # fmt: skip
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render(results: list[dict[str, Any]]) -> str:
    """The whole page, from every results file's goals, grouped by area in ``AREAS`` order."""
    by_area: dict[str, list[str]] = {area: [] for area in AREAS}
    for data in sorted(results, key=lambda d: d["benchmark"]):
        for goal in data["goals"]:
            by_area[goal["area"]].append(row(data, goal))
    out = [HEAD]
    for area, rows in by_area.items():
        if not rows:
            continue
        out.append(f"## {AREAS[area]}\n")
        out.append("| goal | figure | met | date | commit | ISA | source | command |")
        out.append("|---|---|---|---|---|---|---|---|")
        out.extend(rows)
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    try:
        page = render([load(p) for p in sorted(RESULTS.glob("*.json"))])
    except BadResult as exc:
        print(f"results: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != page:
            print(
                "docs/results.md differs from benchmarks/results/: run `make results`",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
