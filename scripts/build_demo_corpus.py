"""Write the bundled demo corpus: one Markdown file per topic of Python's language reference.

Every machine has ``pydoc_data.topics``; the output is deterministic (sorted, no timestamps), so
re-running it changes nothing. Usage: ``python scripts/build_demo_corpus.py [OUT_DIR]``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from pydoc_data.topics import topics


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def topic_markdown(name: str, text: str) -> str:
    lines = text.strip("\n").splitlines()
    # pydoc topics start with a title line underlined by '*' or '='; make it a Markdown heading.
    if len(lines) > 1 and set(lines[1].strip()) <= {"*", "=", "-"} and lines[1].strip():
        title, body = lines[0].strip(), lines[2:]
    else:
        title, body = name, lines
    out = [f"# {title}", ""]
    i = 0
    while i < len(body):
        line = body[i]
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if (
            line.strip()
            and nxt.strip()
            and set(nxt.strip()) <= {"=", "-", "*", "~", "^"}
            and len(nxt.strip()) >= 3
        ):
            out.append(f"## {line.strip()}")
            i += 2
            continue
        out.append(line.rstrip())
        i += 1
    return "\n".join(out).rstrip() + "\n"


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(topics):
        (out_dir / f"{slug(name)}.md").write_text(
            topic_markdown(name, topics[name]), encoding="utf-8"
        )
    print(f"wrote {len(topics)} files to {out_dir}")


if __name__ == "__main__":
    main(
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).resolve().parent.parent / "demo" / "corpus"
    )
