"""dpatlas mechanisms: per-tract DP simple linear regression estimators and privacy accounting.

Free of any orchestration framework. Two calls:

- ``estimate(name, x, y, epsilon, delta=None, **hyper)`` for one tract;
- ``estimate_batch(name, batch, epsilon, delta=None, reps=None, meter=None,
  publishable_only=False, **hyper)`` for many tracts (``TractBatch.from_labels(labels, x, y)``
  groups records by tract).

Each estimator's ``noise_steps(epsilon, delta, **hyper)`` lists the calibrated noise a run
draws (``privacy_maps.NoiseStep``); its ``guarantee`` is the composition of their privacy maps.
"""

# Registers the estimators, in the order of the table in docs/estimators.md (the registry keeps it).
from . import sufficient_stats, theil_sen, gradient_descent, mos  # noqa: F401, I001
from . import binagg, free_lunch  # noqa: F401, I001
from . import ddssp, adassp, modulated  # noqa: F401, I001
from .batch import TractBatch
from .privacy_filter import NO_METER, BudgetOverrun, PrivacyFilter
from .noise import OSRandomness, SeededRandomness
from .privacy import (GDP, PROJECT_RELATION, ZCDP, ApproxDP, MixedRelations, NotDP, PureDP,
                      Relation, convert_relation, parallel, sequential)
from .privacy_maps import NoiseStep, privacy_map
from .registry import (REGISTRY, BatchEstimate, NotPublishable, TractEstimate, estimate,
                       estimate_batch, get)

ESTIMATORS = tuple(REGISTRY)
# What a release may publish: DP estimators whose noise is drawn safely (not DPSSTheilSen).
PUBLISHABLE = tuple(name for name, e in REGISTRY.items() if e.publishable)
# The full-suite default: publishable estimators that do not opt out (a suite may hold one
# zCDP estimator, and BinAgg's place is its own synthesize step, not every release).
DEFAULT_SUITE = tuple(name for name, e in REGISTRY.items()
                      if e.publishable and getattr(e, "in_default_suite", True))

__all__ = [
    "ESTIMATORS", "PUBLISHABLE", "DEFAULT_SUITE", "REGISTRY", "BatchEstimate", "TractEstimate", "TractBatch",
    "estimate", "estimate_batch", "get", "OSRandomness", "SeededRandomness", "PureDP",
    "ApproxDP", "ZCDP", "GDP", "NotDP", "sequential", "parallel", "NoiseStep", "privacy_map",
    "PrivacyFilter", "BudgetOverrun", "NO_METER", "NotPublishable", "Relation",
    "MixedRelations", "convert_relation", "PROJECT_RELATION",
]
