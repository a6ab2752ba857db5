"""The HTML report opened in headless Chromium at 1280 x 800 and 1920 x 1080: every chart loads,
nothing runs off the right edge, and the headline figures (P95 speculative and baseline,
speedup, acceptance, quality verdict) are read back from the page, on its first screen."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from sqlalchemy.orm import Session

from app.audit import render_report, units
from tests.audit.conftest import DAY, MAIN, AuditDB

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENS = ((1280, 800), (1920, 1080))
FIVE = ("p95_total_spec", "p95_total_baseline", "speedup", "acceptance", "quality")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def figures(dom: str) -> dict[str, tuple[str, int]]:
    """Each ``data-figure``'s text and the page y of its bottom edge (set by the page's script)."""
    out = {}
    for tag in re.finditer(r"<span ([^>]*data-figure=[^>]*)>([^<]*)</span>", dom):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag.group(1)))
        out[attrs["data-figure"]] = (html.unescape(tag.group(2)), int(attrs["data-bottom"]))
    return out


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)
def test_html_report_in_chromium(audit_db: AuditDB, tmp_path: Path) -> None:
    if audit_db.dialect != "sqlite":
        pytest.skip("rendering does not depend on the database; checked once on SQLite")
    window = {"since": MAIN.isoformat(), "until": (MAIN + DAY).isoformat()}
    with Session(audit_db.engine) as session:
        media, body = render_report(session, fmt="html", **window)
        _, as_json = render_report(session, fmt="json", **window)
    report = json.loads(as_json)
    h = report["headline"]
    assert media.startswith("text/html")
    assert "http://" not in body.replace("http://www.w3.org", "")  # self-contained
    # Ids are not numbers: a query id (UUID) or trace id can hold "5e-4" in its hex.
    stripped = re.sub(r"data:[^\"]+|\b[0-9a-f]{8}-[0-9a-f-]{27}\b|\b[0-9a-f]{32}\b", "", body)
    found = re.search(r"\d[eE][+-]\d", stripped)
    assert not found, (
        f"scientific notation: {stripped[max(0, found.start() - 300) : found.end() + 40]}"
    )
    page = tmp_path / "report.html"
    page.write_text(body, encoding="utf-8")
    expected = {
        "p95_total_spec": units.ms(h["speculative"]["total_ms"]["p95"]),
        "p95_total_baseline": units.ms(h["baseline"]["total_ms"]["p95"]),
        "speedup": units.times(h["speedup"]["value"]),
        "acceptance": units.share(h["acceptance_rate"]),
        "quality": h["quality"]["verdict"],
    }
    for width, height in SCREENS:
        size = f"--window-size={width},{height}"
        dom = chromium(tmp_path, size, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
        dom_text = dom.stdout
        assert 'data-overflow="no"' in dom_text, f"horizontal overflow at {width}x{height}"
        marks = re.findall(r'<figure class="chart" data-rendered="([^"]+)"', dom_text)
        assert len(marks) == 4, f"expected 4 rendered charts, DOM marks: {marks}"
        for mark in marks:
            assert mark != "failed", "a chart image failed to load"
            w, hgt = (int(v) for v in mark.split("x"))
            assert w > 300 and hgt > 150, f"chart rendered at {mark}"
        found = figures(dom_text)
        for name in FIVE:
            text, bottom = found[name]
            assert text == expected[name], (name, text, expected[name])
            assert bottom <= height, f"{name} below the first screen at {width}x{height}"
        shot = tmp_path / f"report-{width}.png"
        chromium(tmp_path, size, f"--screenshot={shot}", page.as_uri())
        pixels = imread(shot)[..., :3]
        assert pixels.shape[:2] == (height, width)
        assert np.unique(pixels.reshape(-1, 3), axis=0).shape[0] > 50  # not a blank page
    # The numbers themselves: a real baseline, a real speedup, shadow-paired in this window.
    assert h["baseline"]["available"] and h["speedup"]["method"] == "shadow"
    assert expected["p95_total_spec"].endswith(("ms", " s"))
