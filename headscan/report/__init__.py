"""Reports: the HTML page and Markdown of one or more runs, with the head atlas and every figure.

Only `headscan.report.examples` loads models (for the example attention); the rest reads tables.
"""

from .build import build_report, write_report
from .inputs import check_report_options, check_runs, report_folder

__all__ = ["write_report", "build_report", "check_report_options", "check_runs", "report_folder"]
