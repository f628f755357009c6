"""A quiet, throw-away GX Data Context (no analytics, no progress bars)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx  # noqa: E402
from great_expectations.data_context import EphemeralDataContext  # noqa: E402
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
