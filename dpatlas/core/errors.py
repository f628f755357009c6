"""The one base of the errors an operator causes and can fix (a bad config, input or id, the
cap, a busy release, a full disk in publishing...).

The command line prints an :class:`OperatorError`'s message and exits 2, never a traceback
(dpatlas/cli/commands.py). A :class:`ReleaseRefused` is the narrower kind by which the
pipeline refuses a release by its rules, before or instead of publishing it: the release flow
reports it as ``dpatlas.release.refused``, any other error as ``dpatlas.release.failed``
(dpatlas/release/events.py). Each error class keeps its built-in base (ValueError,
RuntimeError) as well, so existing ``except`` clauses still catch it.
"""


class OperatorError(Exception):
    """An error the operator caused and can fix: one line, exit 2, no traceback."""


class ReleaseRefused(OperatorError):
    """The pipeline refused the release by its rules (config, input, boundaries, the cap, a
    pre-charge check, a busy id): a refusal, not a failure."""
