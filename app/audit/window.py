"""A report's request: its time window, grouping and format, validated with errors naming the field.

Every error is a ``ValueError`` whose message starts with the field (``since: ...``), which the
admin route turns into a 422 naming that field and the CLI into a one-line error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.validation import check_time_range

FORMATS = ("json", "csv", "html")
GROUPINGS = (
    "tenant",
    "collection",
    "method",
    "model_pair",
    "index_version",
    "num_speculative_tokens",
    "batch_size",
    "chosen_k",
    "dtype",
    "prompt_format",
)
"""``batch_size``: buckets of mean_batch_size (load); ``chosen_k``: mean_chosen_k rounded;
``index_version``: the collection index version the passages came from;
``dtype``: the numerics of the answer (float32, bfloat16); ``prompt_format``: ``chat`` (the
target tokenizer's chat template) or ``raw``."""
DEFAULT_GROUP_BY = ("tenant", "collection", "method", "model_pair")
DEFAULT_SPAN = timedelta(days=1)


@dataclass(frozen=True)
class Window:
    """A half-open time window ``[since, until)`` in UTC."""

    since: datetime
    until: datetime

    @property
    def span(self) -> timedelta:
        """How long the window is."""
        return self.until - self.since

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> Window:
        """The window a report covers (its ``since`` and ``until``)."""
        return cls(datetime.fromisoformat(report["since"]), datetime.fromisoformat(report["until"]))

    def previous(self) -> Window:
        """The window of the same length that ends where this one starts."""
        return Window(self.since - self.span, self.since)

    def trailing(self, span: timedelta) -> Window:
        """The ``span`` before this window's start (e.g. the trailing week)."""
        return Window(self.since - span, self.since)


def parse_time(field: str, value: str | datetime) -> datetime:
    """``value`` as an aware UTC datetime; ValueError naming ``field`` when it is not ISO 8601.

    A time without a zone is taken as UTC; a bare date is its midnight.
    """
    if isinstance(value, datetime):
        parsed = value
    else:
        text = value.strip()
        if not text:
            raise ValueError(f"{field}: empty time; expected ISO 8601, e.g. 2026-11-29T12:00:00Z")
        try:
            parsed = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise ValueError(
                f"{field}: not an ISO 8601 time: {value!r} (e.g. 2026-11-29T12:00:00Z)"
            ) from None

    try:
        aware = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 lies before datetime.min in UTC
        raise ValueError(f"{field}: {value!s} is out of range") from None
    return check_time_range(field, aware)


def parse_window(
    since: str | datetime | None,
    until: str | datetime | None,
    *,
    now: datetime | None = None,
) -> Window:
    """The window ``[since, until)``; until defaults to now, since to one day before until.

    Raises ValueError (naming the field) for a malformed time or an inverted or empty window.
    """
    end = parse_time("until", until) if until is not None else (now or datetime.now(UTC))
    start = parse_time("since", since) if since is not None else end - DEFAULT_SPAN
    if start >= end:
        raise ValueError(
            f"since: {start.isoformat()} is not before until {end.isoformat()} "
            "(the window is inverted or empty)"
        )
    return Window(start, end)


def parse_group_by(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The grouping columns (comma-separated or a list); ValueError naming an unknown one."""
    if value is None:
        return DEFAULT_GROUP_BY
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(i.strip() for i in items if i.strip()))
    unknown = [n for n in names if n not in GROUPINGS]
    if unknown:
        raise ValueError(
            f"group_by: unknown grouping {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(GROUPINGS)}"
        )
    return names


def check_format(fmt: str) -> str:
    """``fmt`` when it is a known report format; ValueError naming the field otherwise."""
    if fmt not in FORMATS:
        raise ValueError(f"format: unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    return fmt
