"""A noise step's sensitivity: the number a draw uses, its formula and its derivation, in one.

A :class:`Sensitivity` is what a :class:`~mechanisms.privacy_maps.NoiseStep` is built with:

- ``norm``: how one record's change is measured (``L1`` for the grid Laplace, ``L2`` for the
  grid Gaussian, ``utility`` for an exponential mechanism's utility, ``values moved`` for the
  number of values a smooth-sensitivity median sees change);
- ``relation``: the neighbouring relation it was derived for (the step's guarantee is stated
  for it);
- ``function`` of named PUBLIC ``inputs`` (n, a released noisy slope, ...), vectorised over
  tracts, with public hyperparameters bound when the step is built (``fixed``: e.g. τ);
- ``formula`` (e.g. ``1 - 1/n``) and ``statement``, the text a manifest prints under
  "sensitivity" (formula, norm, relation and domain, as the audit derives it:
  ``dpatlas/audit/sensitivities.py``, SENSITIVITIES);
- ``derivation``: one sentence and its source.

A draw reads its number here (``step.sensitivity.value(n=...)``), never from an expression of
its own, so the text a manifest states and the number the noise was scaled to cannot part.
A sensitivity rebuilt from a manifest (:meth:`Sensitivity.published`) has the text only: it
maps, but gives no number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .privacy import PROJECT_RELATION, Relation

NORMS = ("L1", "L2", "utility", "values moved")


@dataclass(frozen=True)
class Sensitivity:
    """The sensitivity of one noisy query, as a function of public inputs with its derivation."""

    norm: str
    formula: str
    statement: str
    derivation: str
    function: Callable[..., Any] | None = field(default=None, compare=False)
    inputs: tuple[str, ...] = ()
    fixed: tuple[tuple[str, float], ...] = ()
    relation: Relation = PROJECT_RELATION

    def __post_init__(self) -> None:
        if self.norm not in NORMS and not (self.function is None and self.norm == ""):
            raise ValueError(f"sensitivity norm must be one of {NORMS}, got {self.norm!r}")
        if not isinstance(self.relation, Relation):
            raise ValueError(f"sensitivity {self.formula!r}: relation must be a Relation, got "
                             f"{self.relation!r}")
        if self.function is not None and not self.derivation.strip():
            raise ValueError(f"sensitivity {self.formula!r} has no derivation")

    @staticmethod
    def published(statement: str, derivation: str = "",
                  relation: Relation = PROJECT_RELATION) -> "Sensitivity":
        """A sensitivity rebuilt from a manifest's text: it states, it gives no number."""
        return Sensitivity("", statement, statement, derivation, relation=relation)

    def value(self, **public: Any) -> Any:
        """The sensitivity at these public inputs (arrays broadcast: one value per tract)."""
        if self.function is None:
            raise ValueError(f"sensitivity {self.statement!r} was rebuilt from published text: "
                             "it has no number")
        if set(public) != set(self.inputs):
            raise ValueError(f"sensitivity {self.formula!r} takes the public inputs "
                             f"{sorted(self.inputs)}, got {sorted(public)}")
        return self.function(**dict(self.fixed), **public)

    def __str__(self) -> str:
        return self.statement


def _the_number(number: float) -> float:
    return number


def constant(number: float, norm: str, formula: str, statement: str, derivation: str,
             relation: Relation = PROJECT_RELATION) -> Sensitivity:
    """A sensitivity that depends on no input (e.g. 1 for a count)."""
    return Sensitivity(norm, formula, statement, derivation, _the_number,
                       fixed=(("number", number),), relation=relation)
