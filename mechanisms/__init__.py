"""dpatlas mechanisms: per-tract DP simple linear regression estimators and privacy accounting.

Free of any orchestration framework. Two calls:

- ``estimate(name, x, y, epsilon, delta=None, **hyper)`` for one tract;
- ``estimate_batch(name, batch, epsilon, delta=None, reps=None, **hyper)`` for many tracts
  (``TractBatch.from_labels(labels, x, y)`` groups records by tract).
"""

from . import gradient_descent, mos, sufficient_stats, theil_sen  # noqa: F401  (registers)
from .batch import TractBatch
from .noise import OSRandomness, SeededRandomness
from .privacy import GDP, ZCDP, ApproxDP, NotDP, PureDP, parallel, sequential
from .registry import REGISTRY, BatchEstimate, TractEstimate, estimate, estimate_batch, get

ESTIMATORS = tuple(REGISTRY)

__all__ = [
    "ESTIMATORS", "REGISTRY", "BatchEstimate", "TractEstimate", "TractBatch", "estimate",
    "estimate_batch", "get", "OSRandomness", "SeededRandomness", "PureDP", "ApproxDP", "ZCDP",
    "GDP", "NotDP", "sequential", "parallel",
]
