"""Finding and checking the Prefect API that the deployments live on.

Both the serving process and the trigger need a *running* Prefect server: without
``PREFECT_API_URL`` Prefect would quietly start a throwaway in-process ("ephemeral") server,
whose deployments no other process can see. So an unset URL is an error here, with the
commands that fix it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

SERVER_HELP = (
    "start a Prefect server and point this shell at it:\n"
    "    export PREFECT_HOME=$HOME/.dpatlas-prefect\n"
    "    prefect server start --host 127.0.0.1 --port 4200 &\n"
    "    export PREFECT_API_URL=http://127.0.0.1:4200/api\n"
    "(`dpatlas server start` starts the same server in the background; see deploy/README.md)"
)


class PrefectAPIUnavailable(RuntimeError):
    """No Prefect API is configured, or the configured one does not answer."""


def api_url() -> str | None:
    """The API URL to use: ``PREFECT_API_URL`` from the environment *now*, else the one of
    the active Prefect settings/profile (``prefect config set PREFECT_API_URL=...``).

    The environment is read at call time because Prefect snapshots its settings when it is
    first imported; a caller that sets the variable afterwards must still be honoured.
    """
    return os.environ.get("PREFECT_API_URL") or get_current_settings().api.url or None


@contextmanager
def use_api(url: str) -> Iterator[None]:
    """Make ``url`` the API of every Prefect client created inside the block."""
    if get_current_settings().api.url == url:
        yield
        return
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def require_api() -> str:
    """Return the configured API URL after checking that the server answers; raise
    :class:`PrefectAPIUnavailable` with instructions otherwise. Call inside ``use_api``
    or rely on the environment."""
    url = api_url()
    if not url:
        raise PrefectAPIUnavailable(
            "PREFECT_API_URL is not set, so there is no Prefect server to talk to; " + SERVER_HELP)
    with use_api(url):
        with get_client(sync_client=True) as client:
            err = client.api_healthcheck()
    if err is not None:
        raise PrefectAPIUnavailable(
            f"the Prefect API at {url} does not answer ({type(err).__name__}: {err}); is the "
            "server running? To " + SERVER_HELP)
    return url
