"""Debian's headless Chromium driven by Selenium (never a downloaded browser)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars",
)


def available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[object]:
    """A fresh headless Chromium (its own profile directory), closed on exit."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="fusee-chromium-")
    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def require() -> None:
    """Skips a browser test without Chromium, except under CI (``.ci/run``) where it fails."""
    import pytest

    if available():
        return
    message = (f"{CHROMIUM} or {CHROMEDRIVER} is missing: "
               "apt-get install -y chromium chromium-driver (.ci/run does)")
    if os.environ.get("CI") or os.environ.get("FUSEE_REQUIRE_BROWSER"):
        pytest.fail(message)
    pytest.skip(message)
