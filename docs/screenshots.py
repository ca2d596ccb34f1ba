"""Takes the screenshots of the web UI in docs/img/ with Debian's headless Chromium.

    .venv/bin/python docs/screenshots.py

Serves the UI over a few demo runs (tests/ui/ui_app.py) and saves the runs
page, a run with its timeline and the metrics page.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from tests.ui.browser import chromium  # noqa: E402
from tests.ui.ui_app import Served, populate  # noqa: E402

OUT = ROOT / "docs" / "img"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with Served(populate) as served, chromium(1360, 900) as driver:
        wait = WebDriverWait(driver, 30)
        driver.get(served.url + "/")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr.run-row"))
        driver.save_screenshot(str(OUT / "ui-runs.png"))

        driver.set_window_size(1360, 1500)
        driver.get(served.url + "/runs/order-2")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.timeline"))
        driver.save_screenshot(str(OUT / "ui-run.png"))

        driver.set_window_size(1360, 1000)
        driver.get(served.url + "/metrics")
        # Let a few samples accumulate so the charts have lines.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            driver.get(served.url + "/metrics")
            time.sleep(1.1)
        driver.save_screenshot(str(OUT / "ui-metrics.png"))
    print("saved", ", ".join(p.name for p in sorted(OUT.glob("ui-*.png"))))


if __name__ == "__main__":
    main()
