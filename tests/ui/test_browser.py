"""The web UI end to end in a real headless Chromium: list, filter, open a run, signal it, see it finish."""

from __future__ import annotations

from typing import Any

from tests.ui import browser
from tests.ui.ui_app import Served, populate

TIMEOUT = 30


def test_runs_page_filter_open_run_signal_and_see_it_finish() -> None:
    browser.require()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    # Served as ``fusee serve`` serves it: the browser's own Host, Origin and Sec-Fetch-Site pass.
    with Served(populate, full=True) as served, browser.chromium() as driver:
        d: Any = driver
        wait = WebDriverWait(d, TIMEOUT)

        # Read with one script each time: live regions replace their elements every few seconds.
        def rows() -> list[str]:
            return list(d.execute_script(
                "return [...document.querySelectorAll('tr.run-row')].map(r => r.dataset.id)"))

        def steps() -> dict[str, str]:
            return dict(d.execute_script(
                "return [...document.querySelectorAll('tr.step-row')].map(r => [r.dataset.name, r.dataset.status])"))

        def text(css: str) -> str:
            return str(d.execute_script(f"const e = document.querySelector({css!r}); return e ? e.innerText : ''"))

        def status() -> str:
            return str(d.execute_script(
                "return document.querySelector('#live .summary-head .badge').dataset.status"))

        # The runs page lists every run, with counts by status.
        d.get(served.url + "/")
        wait.until(lambda _: len(rows()) == 7)
        assert set(rows()) == {"order-1", "order-2", "order-3", "order-4", "order-2-invoice", "restock-1",
                               "sync-1"}
        counts = dict(d.execute_script(
            "return [...document.querySelectorAll('#counts .count')]"
            ".map(c => [c.dataset.status, c.querySelector('.count-n').innerText])"))
        assert counts == {"all": "7", "running": "3", "paused": "1", "ok": "2", "failed": "1"}

        # Filter by status (the select applies at once), then search by attribute.
        Select(d.find_element(By.ID, "status-filter")).select_by_value("running")
        wait.until(lambda _: sorted(rows()) == ["order-1", "order-3", "order-4"])
        query = d.find_element(By.ID, "query")
        query.send_keys("attrs.region = 'us'")
        d.find_element(By.ID, "apply").click()
        wait.until(lambda _: sorted(rows()) == ["order-3", "order-4"])
        workflow = d.find_element(By.ID, "workflow-filter")
        workflow.send_keys("restock")
        d.find_element(By.ID, "apply").click()
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, "td.empty"))
        assert rows() == []
        # A mistake in the query is shown where it is, not as a server error.
        d.get(served.url + "/?q=attrs.region+%3D%3D+1")
        error = wait.until(ec.presence_of_element_located((By.ID, "query-error")))
        assert "invalid query at position" in error.text

        # Open a run from the filtered list: its steps, the retried charge, the timeline.
        d.get(served.url + "/?q=attrs.customer+%3D+%27zenith%27")
        wait.until(lambda _: rows() == ["order-3"])
        d.find_element(By.CSS_SELECTOR, "a.run-link").click()
        wait.until(ec.presence_of_element_located((By.ID, "steps")))
        assert d.find_element(By.ID, "run-id").text == "order-3"
        assert steps() == {"quote": "ok", "charge": "ok", "cool-off": "ok", "approve": "running"}
        assert "ConnectionError: payment gateway timed out" in text("tr.step-row[data-name='charge']")
        lanes = [t.text for t in d.find_elements(By.CSS_SELECTOR, "svg.timeline .lane-label[data-op]")]
        assert lanes == ["step quote", "step charge", "sleep cool-off", "wait for signal approve"]
        assert len(d.find_elements(By.CSS_SELECTOR, "svg.timeline g.attempt")) == 1
        assert status() == "running"
        # The stream written so far arrives over Server-Sent Events.
        wait.until(lambda _: "charged: pay-" in text("pre.stream"))

        # Send the signal through the confirmation dialog.
        d.find_element(By.ID, "open-signal").click()
        dialog = d.find_element(By.ID, "dlg-signal")
        wait.until(lambda _: dialog.is_displayed())
        name = d.find_element(By.ID, "signal-name")
        assert name.get_attribute("value") == "approve"  # the signal the run waits for
        name.clear()
        name.send_keys("approve")
        d.find_element(By.ID, "signal-value").send_keys("true")
        d.find_element(By.ID, "confirm-signal").click()
        flash = wait.until(ec.presence_of_element_located((By.ID, "flash")))
        assert "Signal sent" in flash.text

        # The run finishes: the live region shows it without a reload, the stream ends.
        wait.until(lambda _: status() == "ok")
        # The badge comes from describe() and the outcome from the durable journal: one refresh
        # may show the first before the ending's record is durable.
        wait.until(lambda _: text("#outcome") != "(running)")
        assert text("#outcome") == '"zenith: invoice for zenith, label for zenith"'
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, "pre.stream.ended"))
        lines = text("pre.stream").splitlines()
        assert [lines[0], lines[1][:len("charged: pay-")], lines[2]] == [
            "quoted 42 for zenith", "charged: pay-", "shipped"]
        assert steps() == {"quote": "ok", "charge": "ok", "cool-off": "ok", "approve": "ok",
                           "invoice": "ok", "label": "ok", "ship": "ok"}
        assert served.engine is not None
        summary = served.call(served.engine.describe, "order-3")
        assert summary.status == "ok"
        assert [(a.action, a.by, a.detail) for a in summary.audit] == [("signal", "web-ui", "approve")]

        # The child's lane links to the child's page.
        d.find_element(By.CSS_SELECTOR, "ul.children a").click()
        wait.until(lambda _: d.find_element(By.ID, "run-id").text == "order-3-invoice")
        assert status() == "ok"

        # The metrics page draws its charts.
        d.get(served.url + "/metrics")
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, "svg.chart"))
        assert d.find_element(By.ID, "stat-runs").text == "8"


def test_a_missing_browser_fails_under_ci(monkeypatch: Any) -> None:
    import pytest

    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("FUSEE_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="chromium-driver"):
        browser.require()
