"""Quiet GX Data Contexts (no analytics, no progress bars).

- :func:`quiet_context`: a throw-away, in-memory context (checks that keep no record);
- :func:`release_context`: one file-backed context per release, in the release's internal
  folder: its suites, Checkpoints and validation results are files, and its single Data Docs
  site (``<docs_dir>/index.html``) lists every partition's validation and the output check.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx  # noqa: E402
from great_expectations.data_context import EphemeralDataContext, FileDataContext  # noqa: E402
from great_expectations.data_context.types.base import (  # noqa: E402
    DataContextConfig,
    InMemoryStoreBackendDefaults,
    ProgressBarsConfig,
)

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


def release_context(project_dir: Path, docs_dir: Path) -> FileDataContext:
    """The release's file-backed context in ``project_dir`` (created on first use), whose one
    Data Docs site is ``docs_dir``: GX's default ``local_site`` is replaced, so there is one
    site per release whatever the number of partitions."""
    context = gx.get_context(mode="file", project_root_dir=Path(project_dir))
    sites = {DOCS_SITE: docs_site_config(docs_dir)}
    if context.variables.data_docs_sites != sites:
        context.variables.data_docs_sites = sites
        context.variables.progress_bars = ProgressBarsConfig(globally=False,
                                                             metric_calculations=False)
        context.variables.analytics_enabled = False
        context.variables.save()
    return context
