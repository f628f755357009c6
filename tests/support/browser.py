"""The headless Chromium fixture the browser tests share (the web map's and the validation
report's)."""

import pytest

from dpatlas.publication.webmap import screenshot as B


@pytest.fixture(scope="module")
def browser():
    """Headless system Chromium; a missing browser FAILS the test, with how to install it."""
    try:
        with B.sync_playwright() as playwright:
            launched = B.launch_chromium(playwright)
            yield launched
            launched.close()
    except B.BrowserMissing as err:
        pytest.fail(f"{err}; or run the other tests with -m 'not browser'", pytrace=False)
