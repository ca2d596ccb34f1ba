"""The browser tests need Debian's chromium and chromium-driver: under CI they fail without them."""

from __future__ import annotations

import os

import pytest

from tests.ui import browser


def require_browser() -> None:
    if browser.available():
        return
    message = (f"{browser.CHROMIUM} or {browser.CHROMEDRIVER} is missing: "
               "apt-get install -y chromium chromium-driver (.ci/run does)")
    if os.environ.get("CI") or os.environ.get("FUSEE_REQUIRE_BROWSER"):
        pytest.fail(message)
    pytest.skip(message)
