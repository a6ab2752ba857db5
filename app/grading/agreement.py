"""Graded figures of a golden run, and how far human grades agree with the automatic score.

The automatic faithfulness of an answer is the share of its sentences supported by a cited
passage (``app.scoring.faithfulness``). Put on the graders' scale it reads: every sentence
supported = ``faithful``, none = ``not``, some = ``partly``. Agreement is reported three ways:
the share of grades on the same label, Cohen's kappa (that share corrected for chance), and
Spearman's rank correlation of the human score (faithful 1, partly 0.5, not 0) with the
automatic share.
"""

from __future__ import annotations

import statistics
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.audit.records import GoldenItem
from app.audit.stats import cohen_kappa, spearman
from app.grading.records import FAITHFUL_SCORE, GoldenGrade


def automatic_label(score: float) -> str:
    """The automatic faithfulness share on the graders' scale."""
    if score >= 1.0:
        return "faithful"
    return "not" if score <= 0.0 else "partly"


def graded_summary(session: Session, run_id: uuid.UUID) -> dict[str, Any]:
    """Grades of the run's items: counts, human means, and agreement with the automatic score."""
    rows = list(
        session.execute(
            select(GoldenGrade, GoldenItem.faithfulness)
            .join(GoldenItem, GoldenItem.id == GoldenGrade.item_id)
            .where(GoldenItem.run_id == run_id)
        )
    )
    grades = [g for g, _ in rows]
    human = [FAITHFUL_SCORE[g.faithful] for g in grades]
    paired = [(g, auto) for g, auto in rows if auto is not None]
    return {
        "grades": len(grades),
        "graded_items": len({g.item_id for g in grades}),
        "graders": sorted({g.grader for g in grades}),
        "human_faithfulness": statistics.fmean(human) if human else None,
        "faithful_share": (
            sum(g.faithful == "faithful" for g in grades) / len(grades) if grades else None
        ),
        "relevance": statistics.fmean(g.relevance for g in grades) if grades else None,
        "automatic_faithfulness": (
            statistics.fmean(auto for _, auto in paired) if paired else None
        ),
        "agreement": {
            "n": len(paired),
            "same_label": (
                sum(g.faithful == automatic_label(a) for g, a in paired) / len(paired)
                if paired
                else None
            ),
            "cohen_kappa": cohen_kappa([(g.faithful, automatic_label(a)) for g, a in paired]),
            "spearman": spearman(
                [FAITHFUL_SCORE[g.faithful] for g, _ in paired], [float(a) for _, a in paired]
            ),  # fmt: skip
        },
    }
