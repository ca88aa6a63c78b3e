"""Optional sweep work as registered passes (`headscan.scan.passes.base.Pass`), one module each: the weights table
(`weights`), composition scores (`composition`), the syntax baseline (`baseline`), head importance
(`importance`), head similarity (`similarity`) and each head's examples (`examples`),
registered here in the order they run and write. A pass of your own: subclass `Pass`, then
``register_pass(YourPass())`` (tests/test_passes.py registers one).

>>> list(PASSES)
['weights', 'composition', 'baseline', 'importance', 'similarity', 'examples']
"""

from .base import PASSES, BatchStep, Pass, PassRun, SweepRun, register_pass
from .baseline import BaselinePass
from .composition import CompositionPass
from .examples import ExamplesPass
from .importance import ImportancePass
from .similarity import SimilarityPass
from .weights import WeightsPass

__all__ = ["Pass", "PassRun", "SweepRun", "BatchStep", "PASSES", "register_pass"]

for _builtin in (WeightsPass(), CompositionPass(), BaselinePass(), ImportancePass(), SimilarityPass(), ExamplesPass()):
    register_pass(_builtin)
