"""Reports: the HTML page and Markdown of one or more runs, with the head atlas and every figure.

``headscan.report(runs, out=None, **settings)`` writes one (`write_report`, the function behind ``headscan report``);
its sections are registered objects (`headscan.report.sections`), so a new one needs no edit here. Only
`headscan.report.examples` loads models (for the example attention); the rest reads tables.

>>> import headscan
>>> folder = headscan.report(["reports/runs/ewt-dev"], out="ewt-dev-report")  # doctest: +SKIP
>>> sorted(p.name for p in folder.iterdir())  # doctest: +SKIP
['figures', 'index.html', 'report.md']
"""

import sys
import types

from .build import build_report, write_report
from .inputs import check_report_options, check_runs, report_folder
from .sections import Context, Section, register_section

__all__ = ["write_report", "build_report", "check_report_options", "check_runs", "report_folder", "register_section",
           "Section", "Context"]


class _CallableModule(types.ModuleType):
    """This package, callable: ``headscan.report(runs, out=...)`` is `write_report`, while
    ``headscan.report.sections`` and the other modules stay importable under the same name."""

    def __call__(self, runs, out=None, **settings):
        return write_report(runs, out, **settings)

    __call__.__doc__ = write_report.__doc__


sys.modules[__name__].__class__ = _CallableModule
