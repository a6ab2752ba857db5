"""The HTML report opened in headless Chromium: every chart loads, has a real size, and draws."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from sqlalchemy.orm import Session

from app.audit import render_report
from tests.audit.conftest import DAY, DIRTY, AuditDB

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)
def test_html_report_charts_render_in_chromium(audit_db: AuditDB, tmp_path: Path) -> None:
    if audit_db.dialect != "sqlite":
        pytest.skip("rendering does not depend on the database; checked once on SQLite")
    with Session(audit_db.engine) as session:
        media, body = render_report(
            session, since=DIRTY.isoformat(), until=(DIRTY + DAY).isoformat(), fmt="html"
        )
    assert media.startswith("text/html")
    assert "http://" not in body.replace("http://www.w3.org", "")  # self-contained
    page = tmp_path / "report.html"
    page.write_text(body, encoding="utf-8")

    dom = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", page.as_uri()).stdout
    marks = re.findall(r'<figure class="chart" data-rendered="([^"]+)"', dom)
    assert len(marks) == 4, f"expected 4 rendered charts, DOM marks: {marks}"
    for mark in marks:
        assert mark != "failed", "a chart image failed to load"
        width, height = (int(v) for v in mark.split("x"))
        assert width > 300 and height > 150, f"chart rendered at {mark}"
    assert 'class="alert critical"' in dom  # this window holds exactness violations

    shot = tmp_path / "report.png"
    chromium(tmp_path, "--window-size=1200,2600", f"--screenshot={shot}", page.as_uri())
    pixels = imread(shot)[..., :3]
    # Charts fill the page's lower part: it must not be a blank (single-colour) page.
    lower = pixels[pixels.shape[0] // 3 :]
    assert np.unique(lower.reshape(-1, 3), axis=0).shape[0] > 50
    assert lower.std() > 0.05
