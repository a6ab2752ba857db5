"""Audit reports from the database: speed, acceptance, exactness and golden-set quality."""

from app.audit.records import GoldenItem, GoldenRun, ShadowRun

__all__ = ["GoldenItem", "GoldenRun", "ShadowRun"]
