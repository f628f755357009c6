"""The independent audit of a published release: ``dpatlas audit RELEASE_DIR``.

checks.py is the whole audit, one file that imports nothing of ours (an auditor may copy it
alone: ``python checks.py RELEASE_DIR``). Its entry points are re-exported on first use
(PEP 562), so ``python -m dpatlas.audit.checks`` runs it once."""

_ENTRY_POINTS = ("audit_release", "load_manifest", "main")


def __getattr__(name: str):
    if name in _ENTRY_POINTS:
        from dpatlas.audit import checks

        return getattr(checks, name)
    raise AttributeError(f"module 'dpatlas.audit' has no attribute {name!r}")
