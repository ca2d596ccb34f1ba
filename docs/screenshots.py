"""Takes the screenshots of the web UI in docs/img/ with Debian's headless Chromium.

    .venv/bin/python docs/screenshots.py

Serves the UI over a few demo runs (tests/ui/ui_app.py) and saves the runs
page, a run with its timeline, a run's waterfall, the metrics, schedules and
limits pages.
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
from tests.ui.ui_app import (  # noqa: E402
    Served,
    add,
    charges,
    invoice,
    order,
    populate,
    report,
    restock,
    timed,
)

OUT = ROOT / "docs" / "img"


async def demo(engine: Any) -> None:
    await populate(engine)
    # The waterfall: steps that take time, a sleep, a retry, payments queueing for permits.
    await engine.execute(timed, "timed-1", 3)
    for i, customer in enumerate(["northwind", "globex", "initech", "umbrella", "hooli"]):
        await engine.start(order, f"order-{i + 5}", customer)
    for i in range(4):
        await engine.execute(invoice, f"invoice-{100 + i}", f"order-{i}")
    # The schedules page: a cron schedule, and an hourly one with a backfilled day.
    import datetime

    await engine.schedule("nightly-sales", report, "sales", cron="0 2 * * *", timezone="Europe/Paris")
    await engine.schedule("hourly-ops", report, "ops", every="1h", overlap="buffer_one")
    await engine.schedule("weekly-audit", report, "audit", cron="0 9 * * MON", paused=True)
    start = datetime.datetime(2026, 11, 30, 20, tzinfo=datetime.UTC)
    await engine.backfill_schedule("hourly-ops", start, start + datetime.timedelta(hours=4))
    await engine.trigger_schedule("nightly-sales")
    # The limits page: steps holding the "payments" permits, more waiting.
    await engine.start(charges, "charges-1", 7)
    # The objects pages: carts.
    for key, skus in (("alice", ["apple", "apple", "pear"]), ("bob", ["kiwi"]), ("carol", ["fig", "plum"])):
        for sku in skus:
            await engine.call(add, key, sku)


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

        driver.set_window_size(1360, 760)
        driver.get(served.url + "/runs/timed-1")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.waterfall"))
        driver.execute_script("document.getElementById('timeline').closest('section').scrollIntoView()")
        driver.save_screenshot(str(OUT / "ui-waterfall.png"))

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

        driver.set_window_size(1500, 600)
        driver.get(served.url + "/schedules")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr.schedule-row"))
        driver.save_screenshot(str(OUT / "ui-schedules.png"))

        driver.set_window_size(1360, 480)
        driver.get(served.url + "/limits")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr.limit-row"))
        driver.save_screenshot(str(OUT / "ui-limits.png"))

        driver.set_window_size(1360, 820)
        driver.get(served.url + "/objects/cart/alice")
        wait.until(lambda d: d.find_elements(By.ID, "state"))
        driver.find_element(By.ID, "open-save").click()
        driver.save_screenshot(str(OUT / "ui-object.png"))
    print("saved", ", ".join(p.name for p in sorted(OUT.glob("ui-*.png"))))


if __name__ == "__main__":
    main()
