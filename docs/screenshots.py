"""Takes the screenshots of the web UI in docs/img/ with Debian's headless Chromium.

    .venv/bin/python docs/screenshots.py

Serves the UI over a few demo runs (tests/ui/ui_app.py) and saves the runs
page, a run with its timeline and the metrics page.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from tests.ui.browser import chromium  # noqa: E402
from tests.ui.ui_app import Served, invoice, order, populate, restock  # noqa: E402

OUT = ROOT / "docs" / "img"


async def demo(engine: Any) -> None:
    await populate(engine)
    for i, customer in enumerate(["northwind", "globex", "initech", "umbrella", "hooli"]):
        await engine.start(order, f"order-{i + 5}", customer)
    for i in range(4):
        await engine.execute(invoice, f"invoice-{100 + i}", f"order-{i}")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with Served(demo) as served, chromium(1360, 900) as driver:
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
        # Let samples accumulate, with some work going on, so the charts have lines.
        engine = served.engine
        for k in range(12):
            for j in range(k % 4 + 1):
                served.call(engine.start, invoice, f"batch-{k}-{j}", "batch")
            if k % 5 == 2:
                served.call(engine.start, restock, f"restock-{k}", f"sku-{k}")
            driver.get(served.url + "/metrics")
            time.sleep(1.05)
        driver.save_screenshot(str(OUT / "ui-metrics.png"))
    print("saved", ", ".join(p.name for p in sorted(OUT.glob("ui-*.png"))))


if __name__ == "__main__":
    main()
