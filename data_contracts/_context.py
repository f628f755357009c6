"""Quiet GX Data Contexts (no analytics, no progress bars).

- :func:`quiet_context`: a throw-away, in-memory context (checks that keep no record);
- :func:`release_context`: one file-backed context per release, in the release's internal
  folder: its suites, Checkpoints and validation results are files, and its single Data Docs
  site (``<docs_dir>/index.html``) lists every partition's validation and the output check.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx  # noqa: E402
from great_expectations.data_context import EphemeralDataContext, FileDataContext  # noqa: E402
from great_expectations.data_context.types.base import (  # noqa: E402
    DataContextConfig,
    InMemoryStoreBackendDefaults,
    ProgressBarsConfig,
)
from great_expectations.execution_engine import pandas_execution_engine  # noqa: E402

# GX stamps every in-memory batch below HASH_THRESHOLD bytes (1 GB) with an md5 of the whole
# frame, index included (batch marker ``pandas_data_fingerprint``, in every stored validation
# result and its Data Docs page). We turn it off, for two reasons:
# * on the input it is an unkeyed digest of person-level rows: whoever holds the result and
#   knows every row but one can confirm the last by re-hashing, which is why the manifest
#   names the input by a keyed commitment instead (docs/threat-model.md); nothing here reads it;
# * it cost 2.4 of the 6.2 CPU-s that the input contract took on the national input (5.2 M
#   records, 8 runs; hashing pyarrow text is slow), on the stretch where the runs take turns.
# GX 1.x offers no setting for it; the module constant is read at each batch.
# tests/integration/test_contracts.py checks that no result carries the fingerprint.
pandas_execution_engine.HASH_THRESHOLD = 0

DOCS_SITE = "dpatlas_contracts"


def docs_site_config(docs_dir: Path) -> dict:
    """A local filesystem Data Docs site writing into ``docs_dir``."""
    return {
        "class_name": "SiteBuilder",
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        "store_backend": {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": str(Path(docs_dir).resolve()),
        },
    }


def quiet_context(docs_dir: Path | None = None) -> EphemeralDataContext:
    """An in-memory context; with ``docs_dir``, also a local Data Docs site rooted there."""
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        data_docs_sites={DOCS_SITE: docs_site_config(docs_dir)} if docs_dir is not None else {},
    )
    return gx.get_context(mode="ephemeral", project_config=config)


_OPEN_CONTEXTS: "OrderedDict[tuple[str, str], tuple[tuple[int, int], FileDataContext]]" = \
    OrderedDict()
_KEPT_CONTEXTS = 4  # a process runs one release at a time; tests run many, one after another
_OPEN_LOCK = threading.Lock()
# A file-backed GX context is not safe to use from two threads at once (its stores and
# in-memory caches are shared): every use of a release's context holds this lock, so a flow
# may validate partitions in threads, reading and staging one while another is checked.
RELEASE_CONTEXT_LOCK = threading.RLock()


def _project_identity(project_dir: Path) -> tuple[int, int] | None:
    """The project folder's device and inode: a folder deleted and made again (a purged or
    restarted release) is another project, whose context must be loaded afresh."""
    try:
        st = (Path(project_dir) / "gx").stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def release_context(project_dir: Path, docs_dir: Path) -> FileDataContext:
    """The release's file-backed context in ``project_dir`` (created on first use), whose one
    Data Docs site is ``docs_dir``: GX's default ``local_site`` is replaced, so there is one
    site per release whatever the number of partitions.

    The context is loaded once per process and project folder and reused by every check of
    the release (loading it parsed the project's files again for each of 51 partitions); its
    stores still read and write the project's files, so what it holds is what is on disk."""
    key = (str(Path(project_dir).resolve()), str(Path(docs_dir).resolve()))
    identity = _project_identity(project_dir)
    with _OPEN_LOCK:
        kept = _OPEN_CONTEXTS.get(key)
        if kept is not None and identity is not None and kept[0] == identity:
            _OPEN_CONTEXTS.move_to_end(key)
            return kept[1]
    context = _load_release_context(project_dir, docs_dir)
    with _OPEN_LOCK:
        _OPEN_CONTEXTS[key] = (_project_identity(project_dir), context)
        _OPEN_CONTEXTS.move_to_end(key)
        while len(_OPEN_CONTEXTS) > _KEPT_CONTEXTS:
            _OPEN_CONTEXTS.popitem(last=False)
    return context


def _load_release_context(project_dir: Path, docs_dir: Path) -> FileDataContext:
    context = gx.get_context(mode="file", project_root_dir=Path(project_dir))
    sites = {DOCS_SITE: docs_site_config(docs_dir)}
    if context.variables.data_docs_sites != sites:
        context.variables.data_docs_sites = sites
        context.variables.progress_bars = ProgressBarsConfig(globally=False,
                                                             metric_calculations=False)
        context.variables.analytics_enabled = False
        context.variables.save()
    return context
