"""One TLS context per process for Prefect's API clients.

Every ``SyncPrefectClient`` Prefect makes builds a new ``ssl.SSLContext`` and loads its CA
bundle into it (certifi's, or ``PREFECT_API_SSL_CERT_FILE``), unless it is given one. On a
Dask worker that happens twice per task run (the task engine's hydrated context, then its
client context), about 46 ms of the worker's CPU each: 24.5 s of the two workers' 217 CPU-s
in a full-scale national release of one cell under py-spy, and whether the API is reached over
TLS at all makes no difference.

:func:`with_shared_tls` gives a client the context Prefect would build from the same settings
(verified against the same CA file, or unverified with ``PREFECT_API_TLS_INSECURE_SKIP_VERIFY``,
as Prefect does), built once per process and per pair of those settings and then shared: an
``SSLContext`` is meant to be shared by connections, and neither Prefect nor httpx changes it
after a client is made. A ``verify`` the caller gives is kept, as Prefect keeps it.

Installed over ``SyncPrefectClient.__init__`` when this module is imported (``tasks.common``
imports it, so every process that runs the release's tasks has it, the Dask workers
included). ``benchmarks/bench_task_submission.py`` measures the workers' CPU per task run with
and without it (:func:`use_shared_tls`).
"""

from __future__ import annotations

import ssl
import threading
from typing import Any, Optional

import certifi
from prefect.client.orchestration import SyncPrefectClient
from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

_PREFECT_INIT = SyncPrefectClient.__init__
_contexts: dict[tuple[bool, str], ssl.SSLContext] = {}
_lock = threading.Lock()


def tls_context(insecure: bool, cert_file: str) -> ssl.SSLContext:
    """The context Prefect builds for these settings, built once per process."""
    with _lock:
        context = _contexts.get((insecure, cert_file))
        if context is None:
            if insecure:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            else:
                context = ssl.create_default_context(cafile=cert_file)
            _contexts[(insecure, cert_file)] = context
        return context


def with_shared_tls(httpx_settings: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``httpx_settings`` with ``verify`` set to the shared context of the current settings,
    unless the caller set ``verify``."""
    settings = dict(httpx_settings or {})
    if "verify" not in settings:
        settings["verify"] = tls_context(bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value()),
                                         PREFECT_API_SSL_CERT_FILE.value() or certifi.where())
    return settings


def _init_with_shared_tls(self, api, *, httpx_settings: Optional[dict[str, Any]] = None,
                          **kwargs) -> None:
    _PREFECT_INIT(self, api, httpx_settings=with_shared_tls(httpx_settings), **kwargs)


def use_shared_tls(enabled: bool = True) -> None:
    """Make Prefect's sync clients share a TLS context (``enabled``) or build their own."""
    SyncPrefectClient.__init__ = _init_with_shared_tls if enabled else _PREFECT_INIT


use_shared_tls()
