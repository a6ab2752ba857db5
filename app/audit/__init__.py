"""Audit reports from the database: speed, acceptance, exactness and golden-set quality.

``render_report`` is what the admin route and ``specrag audit report`` call; ``html_report``,
``Section`` and ``to_csv`` are the renderers other reports (batch jobs) reuse.
"""

from app.audit.formats import render, render_report
from app.audit.records import GoldenItem, GoldenRun, ShadowRun
from app.audit.render import Section, html_report, to_csv
from app.audit.report import Thresholds, build_report
from app.audit.window import FORMATS, GROUPINGS, Window, parse_group_by, parse_window

__all__ = [
    "FORMATS",
    "GROUPINGS",
    "GoldenItem",
    "GoldenRun",
    "Section",
    "ShadowRun",
    "Thresholds",
    "Window",
    "build_report",
    "html_report",
    "parse_group_by",
    "parse_window",
    "render",
    "render_report",
    "to_csv",
]
