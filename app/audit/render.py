"""Report renderers anyone can reuse: CSV from rows, a self-contained HTML page from sections.

``html_report(title, sections)`` writes one HTML file with no external references: styles inline,
charts as matplotlib figures embedded as base64 SVG images (an ``<img>`` per chart keeps each
figure's SVG ids to itself). A tiny inline script marks each chart's ``<figure>`` with the size it
rendered at (``data-rendered="WxH"``) or ``data-rendered="failed"``, so a headless browser can
check that the charts drew.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.validation import csv_cell

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1em auto;max-width:1100px;padding:0 1em;color:#222}
*{box-sizing:border-box} .wrap{overflow-x:auto;max-width:100%}
h1{font-size:1.6em} h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:right}
th{background:#f3f3f3} td.text,th.text{text-align:left}
.alert{padding:.5em .8em;margin:.3em 0;border-left:4px solid #c90;background:#fff8e6}
.alert.critical{border-color:#c00;background:#fdecec} .note{color:#555}
.cards{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:.6em}
.card{border:1px solid #ccc;border-radius:6px;padding:.5em .8em;background:#fafafa}
.card h3{margin:0;font-size:.8em;color:#555;font-weight:600;text-transform:uppercase}
.card .big{font-size:1.45em;font-weight:700} .card .sub{font-size:.8em;color:#555}
.card .vs{color:#777;font-weight:400} .card.bad{border-color:#c00}
figure{margin:1em 0} figure img{max-width:100%} figcaption{font-size:.85em;color:#555}
"""

_SCRIPT = """
var de = document.documentElement;
document.body.dataset.overflow = de.scrollWidth > de.clientWidth ? 'yes' : 'no';
document.querySelectorAll('[data-figure]').forEach(function (e) {
  e.dataset.bottom = Math.ceil(e.getBoundingClientRect().bottom + window.scrollY);
});
document.querySelectorAll('figure.chart').forEach(function (f) {
  var img = f.querySelector('img');
  function mark() { f.dataset.rendered = img.naturalWidth > 0
      ? img.naturalWidth + 'x' + img.naturalHeight : 'failed'; }
  if (img.complete) { mark(); } else { img.addEventListener('load', mark);
      img.addEventListener('error', mark); }
});
"""


@dataclass
class Section:
    """One part of an HTML report: a heading, then text, alerts, a table and charts, in order."""

    title: str
    text: str | None = None
    """A paragraph (plain text, escaped)."""
    alerts: list[dict[str, Any]] = field(default_factory=list)
    """``{"severity", "message"}`` items shown as highlighted boxes."""
    columns: Sequence[str] = ()
    """Table columns (keys of ``rows``); empty for no table."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    figures: list[tuple[Figure, str]] = field(default_factory=list)
    """Charts with their captions."""
    raw_html: str | None = None
    """Markup placed right under the heading (built by the caller, every value escaped)."""


def fmt_value(value: Any) -> str:
    """A cell's text: floats in plain notation (thousands separated, never an exponent), None
    as an empty cell, lists as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.4f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def to_csv(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """CSV text with a header row; ``columns`` default to the keys of the first row."""
    rows = list(rows)
    cols = list(columns) if columns is not None else (list(rows[0]) if rows else [])
    buf = io.StringIO()
    # RFC 4180 line ends: the csv module quotes a cell only for the delimiter, the quote char and
    # the characters of the line terminator, so with "\n" alone a bare CR went out unquoted and a
    # reader split the row there. With "\r\n" every cell holding CR or LF is quoted.
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow([csv_cell(c) for c in cols])
    for row in rows:
        # Numbers keep full precision in CSV; only structured values and None are reformatted.
        # Text that a spreadsheet would run as a formula (=, +, -, @, tab, CR) is neutralised.
        values = [row.get(c) for c in cols]
        writer.writerow(
            [
                csv_cell(fmt_value(v) if v is None or isinstance(v, (list, dict, bool)) else v)
                for v in values
            ]
        )
    return buf.getvalue()


def figure_svg_data_uri(fig: Figure) -> str:
    """``fig`` as an SVG ``data:`` URI (the figure is drawn, not shown)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _table(columns: Sequence[str], rows: list[dict[str, Any]]) -> str:
    def cls(value: Any) -> str:
        return "" if isinstance(value, (int, float)) and not isinstance(value, bool) else "text"

    head = "".join(f'<th class="text">{html.escape(c)}</th>' for c in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{cls(r.get(c))}">{html.escape(fmt_value(r.get(c)))}</td>' for c in columns
        )
        + "</tr>"
        for r in rows
    )
    return f'<div class="wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def html_report(title: str, sections: Sequence[Section]) -> str:
    """One self-contained HTML page: ``title``, then each section (charts inline as SVG)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for section in sections:
        parts.append(f"<section><h2>{html.escape(section.title)}</h2>")
        if section.raw_html:
            parts.append(section.raw_html)
        if section.text:
            parts.append(f'<p class="note">{html.escape(section.text)}</p>')
        for alert in section.alerts:
            severity = html.escape(str(alert.get("severity", "warning")))
            parts.append(
                f'<div class="alert {severity}"><b>{severity}</b>: '
                f"{html.escape(str(alert.get('message', '')))}</div>"
            )
        if section.columns and section.rows:
            parts.append(_table(section.columns, section.rows))
        for fig, caption in section.figures:
            uri = figure_svg_data_uri(fig)
            alt = html.escape(caption)
            parts.append(
                f'<figure class="chart"><img src="{uri}" alt="{alt}">'
                f"<figcaption>{alt}</figcaption></figure>"
            )
        parts.append("</section>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)
