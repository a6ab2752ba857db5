"""Make docs/img/audit-report.png: the HTML audit report of seeded traffic (testkit/seeding.py,
plus a 40-item golden run) in headless Chromium at 1280 x 800, numbered callouts drawn on it.

    .venv/bin/python scripts/audit_screenshot.py [--out docs/img/audit-report.png]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.audit import render_report  # noqa: E402
from app.audit.records import GoldenItem, GoldenRun  # noqa: E402
from app.db.schema import upgrade  # noqa: E402
from testkit.seeding import seed  # noqa: E402

START = datetime(2026, 3, 10, tzinfo=UTC)
DAY = timedelta(days=1)
# (x, y) of each callout on the 1280 x 800 page, and what it points at (docs/audit.md).
CALLOUTS = [(86, 139), (86, 196), (86, 322), (452, 322), (811, 322), (86, 598)]


def golden_run(session: Session) -> None:
    """A golden run whose speculative and baseline answers score the same (greedy)."""
    run = GoldenRun(id=uuid.uuid4(), created_at=START + DAY / 2, source_file="golden.jsonl",
                    tenant="acme", model_pair="target-a+draft-a", method="draft_model",
                    num_speculative_tokens="4", num_items=40, summary={})  # fmt: skip
    session.add(run)
    for n in range(40):
        em, f1, faith = n % 3 == 0, 0.4 + (n % 7) / 10, (n % 5) / 4
        session.add(GoldenItem(run_id=run.id, line_no=n + 1, question="q", collection="docs",
                               reference="r", expected_sources=[], spec_answer="a",
                               baseline_answer="a", exact_match=em, token_f1=f1,
                               faithfulness=faith, baseline_exact_match=em,
                               baseline_token_f1=f1, baseline_faithfulness=faith,
                               identical=True))  # fmt: skip
    session.commit()


def annotate(png: Path) -> None:
    """Numbered red callouts on the screenshot, and a palette to keep the file small."""
    from PIL import Image, ImageDraw

    img = Image.open(png).convert("RGB")
    draw = ImageDraw.Draw(img)
    for n, (x, y) in enumerate(CALLOUTS, start=1):
        draw.ellipse((x - 13, y - 13, x + 13, y + 13), fill=(200, 0, 0))
        draw.text((x - 4, y - 7), str(n), fill=(255, 255, 255))
    img.quantize(colors=48).save(png, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("docs/img/audit-report.png"))
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{tmp}/audit.db")
        upgrade(engine)
        seed(engine, 3000, start=START, span=DAY, seed=1, shadow_share=0.3)
        seed(engine, 1000, start=START - DAY, span=DAY, seed=2)
        with Session(engine) as session:
            golden_run(session)
            _, body = render_report(
                session, since=START.isoformat(), until=(START + DAY).isoformat(), fmt="html"
            )
        engine.dispose()
        page = Path(tmp) / "report.html"
        page.write_text(body, encoding="utf-8")
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp}/profile", "--window-size=1280,800",
             f"--screenshot={args.out.resolve()}", page.as_uri()],
            check=True, capture_output=True,
        )  # fmt: skip
    annotate(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
