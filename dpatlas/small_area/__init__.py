"""Model-based small-area estimates from published DP values (issue 20; docs/small-area.md).

Imports numpy, pandas and scipy only, nothing of ours (the import-linter contract
"small_area imports nothing of ours"), so that ``dpatlas audit`` can re-fit the model from the
published files."""

from dpatlas.small_area.fay_herriot import FayHerriotFit, eblup, fit
from dpatlas.small_area.model import fit_model, model_columns, tract_positions

__all__ = ["FayHerriotFit", "eblup", "fit", "fit_model", "model_columns", "tract_positions"]
