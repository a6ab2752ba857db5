"""Dialect-aware SQL pieces the report is built from: percentiles, per-position sums, time buckets.

PostgreSQL computes percentiles with its ordered-set aggregate ``percentile_cont(p) WITHIN GROUP
(ORDER BY x)``. SQLite has none, so the fallback does the same arithmetic with window functions:
number each group's sorted values (``row_number``), take the row at ``floor((n-1)p)`` and the next
one (``lead``) and interpolate linearly between them -- exactly percentile_cont's definition (and
numpy's default "linear" method). Both stay in SQL; Python only builds the statement.

The per-position acceptance counts are read straight out of ``generation_stats.accepted_per_position``
(a JSON list) with the database's JSON table functions: ``json_array_elements_text ... WITH
ORDINALITY`` on PostgreSQL, ``json_each`` on SQLite. That needs no extra table, no extra write on
the answer path, and works for every answer stored before the audit existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    FromClause,
    Integer,
    Select,
    String,
    Subquery,
    case,
    cast,
    func,
    literal,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

PERCENTILES = (0.5, 0.95, 0.99)
PCT_NAMES = tuple(f"p{round(p * 100)}" for p in PERCENTILES)


def dialect(session: Session) -> str:
    """The session's database dialect name ("postgresql", "sqlite", ...)."""
    return session.get_bind().dialect.name


def c_collated(b: FromClause, keys: Sequence[str]) -> list[ColumnElement[Any]]:
    """``b``'s key columns, text ones in byte order (PostgreSQL sorts "C" far faster)."""
    return [
        b.c[k].collate("C").label(k) if isinstance(b.c[k].type, String) else b.c[k] for k in keys
    ]


def percentiles(
    session: Session,
    b: FromClause,
    keys: Sequence[str],
    metrics: dict[str, str],
    where: ColumnElement[bool] | None = None,
) -> dict[tuple[Any, ...], dict[str, dict[str, float | None]]]:
    """P50/P95/P99 per key tuple of each ``metrics`` column of ``b``, computed by the database.

    ``metrics`` maps a metric name to its column; NULLs are left out, and so are rows failing
    ``where``. Returns ``{key tuple: {metric: {"p50", "p95", "p99"}}}``.
    """
    out: dict[tuple[Any, ...], dict[str, dict[str, float | None]]] = {}
    n = len(keys)
    if dialect(session) == "postgresql":
        # One array-valued percentile_cont per metric sorts each group's values once.
        key_cols = c_collated(b, keys)
        fractions = postgresql.array([literal(p, Float) for p in PERCENTILES])
        aggs = [
            func.percentile_cont(fractions).within_group(b.c[col]).label(name)
            for name, col in metrics.items()
        ]
        stmt = select(*key_cols, *aggs).select_from(b).group_by(*key_cols)
        if where is not None:
            stmt = stmt.where(where)
        for row in session.execute(stmt):
            found = out.setdefault(tuple(row[:n]), {})
            for i, name in enumerate(metrics):
                vals = row[n + i]
                if vals is not None:
                    found[name] = {p: float(x) for p, x in zip(PCT_NAMES, vals, strict=True)}
        return out
    parts = []
    for name, col in metrics.items():
        part = select(*(b.c[k] for k in keys), literal(name).label("metric"), b.c[col].label("x"))
        part = part.where(b.c[col].is_not(None))
        parts.append(part if where is None else part.where(where))
    for row in session.execute(_percentiles_window(union_all(*parts).subquery("v"), keys)):
        found = out.setdefault(tuple(row[:n]), {})
        vals = row[n + 1 :]
        found[row[n]] = {
            p: None if x is None else float(x) for p, x in zip(PCT_NAMES, vals, strict=True)
        }
    return out


def _percentiles_window(v: Subquery, keys: Sequence[str]) -> Select[Any]:
    """percentile_cont's linear interpolation with window functions (for SQLite)."""
    part = [v.c[k] for k in keys] + [v.c.metric]
    ranked = select(
        *part,
        v.c.x,
        (func.row_number().over(partition_by=part, order_by=v.c.x) - 1).label("i"),
        func.lead(v.c.x).over(partition_by=part, order_by=v.c.x).label("x_next"),
        func.count().over(partition_by=part).label("n"),
    ).subquery("ranked")
    aggs = []
    for p, name in zip(PERCENTILES, PCT_NAMES, strict=True):
        h = (ranked.c.n - 1) * literal(p, Float)
        lo = cast(h, Integer)  # h >= 0, so the cast truncates to floor(h)
        nxt = func.coalesce(ranked.c.x_next, ranked.c.x)
        value = ranked.c.x + (h - lo) * (nxt - ranked.c.x)
        aggs.append(func.max(case((ranked.c.i == lo, value))).label(name))
    cols = [ranked.c[k] for k in keys] + [ranked.c.metric]
    return select(*cols, *aggs).group_by(*cols)


def position_sums(
    session: Session, base: FromClause, keys: Sequence[str], column: str = "accepted_per_position"
) -> dict[tuple[Any, ...], list[int]]:
    """Per key tuple, the sum over rows of the JSON list ``column`` element by element.

    Position 1 is the list's first element. Lists of different lengths add up as if the shorter
    ones were padded with zeros.
    """
    col = base.c[column]
    key_cols: list[ColumnElement[Any]] = [base.c[k] for k in keys]
    if dialect(session) == "postgresql":
        key_cols = c_collated(base, keys)
        elems = func.json_array_elements_text(col).table_valued(
            "value", with_ordinality="ordinality"
        )
        position: ColumnElement[Any] = elems.c.ordinality
        value = cast(elems.c.value, Integer)
    else:
        elems = func.json_each(col).table_valued("key", "value")
        position = elems.c.key + 1
        value = cast(elems.c.value, Integer)
    stmt = (
        select(*key_cols, position.label("position"), func.sum(value).label("accepted"))
        .select_from(base)
        .join(elems, true())
        .where(col.is_not(None))
        .group_by(*key_cols, position)
    )
    out: dict[tuple[Any, ...], list[int]] = {}
    for row in session.execute(stmt):
        key = tuple(row[: len(keys)])
        pos, accepted = int(row[len(keys)]), int(row[len(keys) + 1] or 0)
        curve = out.setdefault(key, [])
        curve.extend([0] * (pos - len(curve)))
        curve[pos - 1] += accepted
    return out


def bucket_index(
    session: Session, column: ColumnElement[Any], origin: datetime, width_s: int
) -> ColumnElement[Any]:
    """The 0-based index of the ``width_s``-second bucket, counted from ``origin``, of ``column``."""
    origin_epoch = origin.timestamp()
    if dialect(session) == "postgresql":
        epoch: ColumnElement[Any] = func.extract("epoch", column)
        return cast(func.floor((epoch - origin_epoch) / width_s), Integer)
    # SQLite stores UTC wall time; julianday() reads it as UTC and keeps the fraction of a second.
    epoch = (func.julianday(column) - 2440587.5) * 86400.0
    return cast((epoch - origin_epoch) / width_s, Integer)
