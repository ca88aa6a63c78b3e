"""Reports: the HTML page and Markdown of one or more runs, with the head atlas and every figure.

Only `headscan.report.examples` loads models (for the example attention); the rest reads tables.
"""

from .build import build_report, check_report_options, check_runs, report_folder, write_report

__all__ = ["write_report", "build_report", "check_report_options", "check_runs", "report_folder"]
