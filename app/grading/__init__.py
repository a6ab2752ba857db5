"""Human grades of golden runs: export items for graders, import their grades, agree with the
automatic faithfulness score (docs/audit.md, "Human grading")."""

from app.grading.agreement import graded_summary
from app.grading.exchange import export_csv, export_html, import_grades
from app.grading.records import FAITHFUL_LABELS, GoldenGrade

__all__ = [
    "FAITHFUL_LABELS",
    "GoldenGrade",
    "export_csv",
    "export_html",
    "graded_summary",
    "import_grades",
]
