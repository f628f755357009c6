"""One base for operator errors (dpatlas/core/errors.py): the classes the command line used to
list by hand are OperatorErrors, the ones the release events used to list are ReleaseRefused,
and the others are not (a failed publish stays ``dpatlas.release.failed``)."""

from __future__ import annotations

import pytest

from dpatlas.cli.common import operator_errors as _operator_errors
from dpatlas.cli.prefect_server import PrefectAPIUnreachable, ServerStartError
from dpatlas.core.config import ConfigError
from dpatlas.core.errors import OperatorError, ReleaseRefused
from dpatlas.core.ids import InvalidReason, InvalidReleaseId
from dpatlas.ledger import BudgetExceeded, LedgerError
from dpatlas.publication.feed import FeedError
from dpatlas.core.places import BoundaryError
from dpatlas.publication.tiles import TilesError
from dpatlas.publication.tract_files import PublishError
from dpatlas.publication.webmap import WebMapError
from dpatlas.release.contributions import ContributionError
from dpatlas.release.draws import PersistedDrawChanged
from dpatlas.release.events import _refusals
from dpatlas.release.ingest import InputError
from dpatlas.release.preflight import PreflightError
from dpatlas.release.run_state import ReleaseLocked
from dpatlas.release.validate import BoundaryCoverageError, ValidationFailed

# The events' list before the base class (flows/events.py on main): refusals.
REFUSALS = (ConfigError, BoundaryError, InvalidReleaseId, InputError, LedgerError,
            PreflightError, ReleaseLocked, ValidationFailed, BoundaryCoverageError)
# The rest of the command line's list (dpatlas/cli.py on main): operator errors, not refusals.
OTHER_OPERATOR_ERRORS = (FeedError, InvalidReason, ServerStartError, PublishError, TilesError,
                         WebMapError, PersistedDrawChanged, PrefectAPIUnreachable)
BUILT_IN_BASES = {ConfigError: ValueError, BoundaryError: ValueError,
                  InvalidReleaseId: ValueError, InputError: ValueError,
                  InvalidReason: ValueError, LedgerError: RuntimeError,
                  PreflightError: RuntimeError, ReleaseLocked: RuntimeError,
                  ValidationFailed: RuntimeError, BoundaryCoverageError: RuntimeError,
                  FeedError: RuntimeError, ServerStartError: RuntimeError,
                  PublishError: RuntimeError, TilesError: RuntimeError,
                  WebMapError: RuntimeError, PersistedDrawChanged: RuntimeError,
                  PrefectAPIUnreachable: RuntimeError}


@pytest.mark.parametrize("cls", REFUSALS, ids=lambda c: c.__name__)
def test_a_refusal_is_an_operator_error_the_events_call_refused(cls):
    assert issubclass(cls, ReleaseRefused) and issubclass(cls, OperatorError)
    assert issubclass(cls, _refusals()) and issubclass(cls, _operator_errors())


@pytest.mark.parametrize("cls", OTHER_OPERATOR_ERRORS, ids=lambda c: c.__name__)
def test_other_operator_errors_are_not_refusals(cls):
    assert issubclass(cls, OperatorError) and issubclass(cls, _operator_errors())
    assert not issubclass(cls, ReleaseRefused) and not issubclass(cls, _refusals())


@pytest.mark.parametrize("cls", list(BUILT_IN_BASES), ids=lambda c: c.__name__)
def test_each_error_keeps_its_built_in_base(cls):
    assert issubclass(cls, BUILT_IN_BASES[cls])


def test_subclasses_follow_their_base_and_a_bug_is_neither():
    assert issubclass(BudgetExceeded, ReleaseRefused)
    assert issubclass(ContributionError, ReleaseRefused)
    assert not isinstance(KeyError("bug"), _operator_errors())
    assert not isinstance(KeyError("bug"), _refusals())
    assert isinstance(OSError("disk full"), _operator_errors())  # the operator's, not ours
