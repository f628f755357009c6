"""The independent audit of a published release: ``dpatlas audit RELEASE_DIR``.

checks.py is the whole audit, one file that imports nothing of ours (an auditor may copy it
alone: ``python checks.py RELEASE_DIR``); this package only re-exports its entry points."""

from dpatlas.audit.checks import audit_release, load_manifest, main

__all__ = ["audit_release", "load_manifest", "main"]
