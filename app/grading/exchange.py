"""Golden items out to graders (CSV, or a self-contained HTML form) and their grades back in.

An export lists a run's items: the question, the reference, the speculative answer and the
passages it cited, with empty ``faithful`` (faithful / partly / not), ``relevance`` (1-5) and
``note`` columns. The HTML form holds the same items and writes a CSV of the grades in the
browser (no server, no external references). ``import_grades`` reads such a CSV back (or JSONL
with the same keys), checks every line, and stores all of them or none.
"""

from __future__ import annotations

import csv
import html
import io
import json
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audit.records import GoldenItem
from app.audit.render import to_csv
from app.db.models import Answer, AnswerSource
from app.grading.records import FAITHFUL_LABELS, RELEVANCE, GoldenGrade

EXPORT_COLUMNS = ("item_id", "line_no", "question", "reference", "answer", "passages",
                  "faithful", "relevance", "note")  # fmt: skip
MAX_PROBLEMS = 20


def _items(session: Session, run_id: uuid.UUID) -> list[dict[str, Any]]:
    items = list(
        session.scalars(
            select(GoldenItem).where(GoldenItem.run_id == run_id).order_by(GoldenItem.line_no)
        )
    )
    qids = [i.spec_query_id for i in items if i.spec_query_id is not None]
    passages: dict[Any, list[str]] = {}
    if qids:
        stmt = (
            select(Answer.query_id, AnswerSource.rank, AnswerSource.text)
            .join(AnswerSource, AnswerSource.answer_id == Answer.id)
            .where(Answer.query_id.in_(qids))
            .order_by(Answer.query_id, AnswerSource.rank)
        )
        for qid, rank, text in session.execute(stmt):
            passages.setdefault(qid, []).append(f"[{rank}] {text}")
    return [
        {"item_id": i.id, "line_no": i.line_no, "question": i.question,
         "reference": i.reference, "answer": i.spec_answer or "",
         "passages": "\n\n".join(passages.get(i.spec_query_id, [])),
         "faithful": "", "relevance": "", "note": ""}
        for i in items
    ]  # fmt: skip


def export_csv(session: Session, run_id: uuid.UUID) -> str:
    """The run's items as CSV with empty grade columns, ready for a spreadsheet."""
    return to_csv(_items(session, run_id), EXPORT_COLUMNS)


_FORM_SCRIPT = """
function esc(v){v=String(v);return /[",\\r\\n]/.test(v)?'"'+v.replace(/"/g,'""')+'"':v;}
document.getElementById('save').onclick=function(){
  var rows=['item_id,faithful,relevance,note'];
  document.querySelectorAll('article').forEach(function(a){
    var f=a.querySelector('input[type=radio]:checked'), r=a.querySelector('select').value;
    if(!f&&!r)return;
    rows.push([a.dataset.item,f?f.value:'',r,a.querySelector('textarea').value].map(esc).join(','));
  });
  var link=document.createElement('a');
  link.href=URL.createObjectURL(new Blob([rows.join('\\r\\n')+'\\r\\n'],{type:'text/csv'}));
  link.download='grades.csv'; link.click();
};
"""
_FORM_STYLE = """
body{font-family:system-ui,sans-serif;max-width:60em;margin:1em auto;padding:0 1em;color:#222}
article{border:1px solid #ccc;padding:.6em 1em;margin:1em 0} pre{white-space:pre-wrap;
background:#f6f6f6;padding:.5em;font-size:.85em} textarea{width:100%} .q{font-weight:600}
"""


def export_html(session: Session, run_id: uuid.UUID) -> str:
    """A self-contained grading form for the run; its button saves ``grades.csv``."""
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>Grade golden run {run_id}</title><style>{_FORM_STYLE}</style></head><body>",
        f"<h1>Grade golden run {html.escape(str(run_id))}</h1><p>Faithful: every claim of the "
        "answer is supported by its passages; partly: some are; not: none. Relevance: 1 (off "
        "the question) to 5 (answers it fully). Ungraded items are left out of the file.</p>",
    ]
    for item in _items(session, run_id):
        i = item["item_id"]
        radios = "".join(
            f'<label><input type="radio" name="f{i}" value="{lab}"> {lab}</label> '
            for lab in FAITHFUL_LABELS
        )
        options = '<option value=""></option>' + "".join(f"<option>{r}</option>" for r in RELEVANCE)
        parts.append(
            f'<article data-item="{i}"><p class="q">{html.escape(item["question"])}</p>'
            f"<p><b>Reference:</b> {html.escape(item['reference'])}</p>"
            f"<p><b>Answer:</b> {html.escape(item['answer'])}</p>"
            f"<details><summary>Passages</summary><pre>{html.escape(item['passages'])}</pre>"
            f"</details><p>{radios} relevance <select>{options}</select></p>"
            '<textarea rows="2" placeholder="note"></textarea></article>'
        )
    parts.append(f'<button id="save">Save grades.csv</button><script>{_FORM_SCRIPT}</script>')
    parts.append("</body></html>")
    return "\n".join(parts)


def _records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, fields) of each record of a grades CSV or JSONL file."""
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() in (".jsonl", ".json"):
        out = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    data = {"__error__": f"not JSON ({exc.msg})"}
                out.append((n, data if isinstance(data, dict) else {"__error__": "not an object"}))
        return out
    reader = csv.DictReader(io.StringIO(text, newline=""))
    out, start = [], 2  # line 1 is the header
    for row in reader:
        out.append((start, dict(row)))
        start = reader.line_num + 1
    return out


def _check(
    fields: dict[str, Any], grader: str, known: set[int]
) -> tuple[tuple[int, str], dict[str, Any]] | str | None:
    """A grade's (key, values), a refusal reason, or None for a line left ungraded."""
    if "__error__" in fields:
        return str(fields["__error__"])
    faithful = str(fields.get("faithful") or "").strip().lower()
    relevance = str(fields.get("relevance") or "").strip()
    if not faithful and not relevance:
        return None
    raw_id = str(fields.get("item_id") or "").strip()
    if not raw_id.isdigit():
        return f"item_id: expected an item id, got {raw_id!r}"
    if int(raw_id) not in known:
        return f"item_id: unknown item id {raw_id}"
    if faithful not in FAITHFUL_LABELS:
        return f"faithful: {faithful!r} is not one of {', '.join(FAITHFUL_LABELS)}"
    if not relevance.isdigit() or int(relevance) not in RELEVANCE:
        return f"relevance: {relevance!r} is outside the scale 1-5"
    who = str(fields.get("grader") or grader).strip()
    if not who or len(who) > 100:
        return "grader: needs 1 to 100 characters"
    note = str(fields.get("note") or "").strip() or None
    values = {"faithful": faithful, "relevance": int(relevance), "note": note, "grader": who}
    return (int(raw_id), who), values


def import_grades(session: Session, path: Path, grader: str) -> dict[str, Any]:
    """Store every grade of ``path`` (all or nothing); ValueError naming each bad line.

    Refused: unknown item ids, a label or relevance outside the scale, the same item graded
    twice by one grader (in the file, or already stored). Lines with neither grade are skipped.
    """
    records = _records(path)
    ids = {int(str(f.get("item_id")).strip()) for _, f in records
           if str(f.get("item_id") or "").strip().isdigit()}  # fmt: skip
    known = (
        set(session.scalars(select(GoldenItem.id).where(GoldenItem.id.in_(ids)))) if ids else set()
    )
    stored = {
        (item, who)
        for item, who in session.execute(
            select(GoldenGrade.item_id, GoldenGrade.grader).where(GoldenGrade.item_id.in_(known))
        )
    }
    problems: list[str] = []
    seen: dict[tuple[int, str], int] = {}
    grades = []
    skipped = 0
    for line, fields in records:
        checked = _check(fields, grader, known)
        if checked is None:
            skipped += 1
            continue
        if isinstance(checked, str):
            problems.append(f"line {line}: {checked}")
            continue
        key, values = checked
        if key in seen:
            problems.append(f"line {line}: duplicate grade of item {key[0]} by {key[1]!r} "
                            f"(first on line {seen[key]})")  # fmt: skip
            continue
        if key in stored:
            problems.append(f"line {line}: item {key[0]} is already graded by {key[1]!r}")
            continue
        seen[key] = line
        grades.append(GoldenGrade(item_id=key[0], **values))
    if problems:
        more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
        raise ValueError(
            f"{path}: {len(problems)} bad line(s), nothing stored: "
            + "; ".join(problems[:MAX_PROBLEMS])
            + more
        )
    if not grades:
        raise ValueError(f"{path}: no grades (every line was left ungraded)")
    session.add_all(grades)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()  # a concurrent import stored one of these grades first
        raise ValueError(
            f"{path}: a grade was stored meanwhile by another import; nothing stored"
        ) from None
    return {"stored": len(grades), "skipped_ungraded": skipped,
            "items": sorted({g.item_id for g in grades})}  # fmt: skip
