"""The web UI end to end in a real headless Chromium: list, filter, open a run, signal it, see it finish."""

from __future__ import annotations

from typing import Any

from tests.ui import browser
from tests.ui.ui_app import Served, populate, populate_timed, waiting_for_signal

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
        assert len(d.find_elements(By.CSS_SELECTOR, "svg.timeline g.attempt-bar[data-status='retried']")) == 1
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


def test_the_run_page_draws_a_waterfall_to_scale() -> None:
    """Bars as wide as their durations on one time axis: steps, one bar per attempt, the sleep,
    and the queue delay of a step that waited for a permit."""
    browser.require()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    with Served(populate_timed) as served, browser.chromium() as driver:
        d: Any = driver
        d.get(served.url + "/runs/timed-1")
        WebDriverWait(d, TIMEOUT).until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.waterfall")))
        # What the browser laid out: each bar's rendered width, left edge and the duration it stands for.
        bars = d.execute_script("""
            return [...document.querySelectorAll('svg.waterfall g.op, svg.waterfall g.queued')].map(g => {
                const r = g.querySelector('rect').getBoundingClientRect();
                return {cls: g.getAttribute('class'), op: g.dataset.op || '', attempt: g.dataset.attempt || '',
                        status: g.dataset.status || '', ms: parseFloat(g.dataset.ms), left: r.left,
                        right: r.right, width: r.width};
            })""")
        ms_per_px = float(d.execute_script("return document.querySelector('svg.waterfall').dataset.msPerPx"))
        ops = {(b["op"], b["attempt"]): b for b in bars if b["cls"] != "queued"}
        assert set(ops) == {("load", "1"), ("backoff", ""), ("fetch", "1"), ("fetch", "2"), ("pay-0", "1"),
                            ("pay-1", "1"), ("pay-2", "1")}
        for b in bars:
            # To scale (a bar is 2 px at least, a queue delay 1 px, so an instant one still shows).
            least = 1.0 if b["cls"] == "queued" else 2.0
            assert abs(b["width"] - max(b["ms"] / ms_per_px, least)) < 1.0, b
        assert ops[("backoff", "")]["ms"] >= 300 and ops[("load", "1")]["ms"] >= 120
        assert ops[("backoff", "")]["width"] > ops[("load", "1")]["width"] * 300 / ops[("load", "1")]["ms"] - 1
        # In the order they ran: the sleep after the load, the retry after the failed attempt.
        assert ops[("backoff", "")]["left"] >= ops[("load", "1")]["right"] - 1
        assert ops[("fetch", "1")]["status"] == "retried" and ops[("fetch", "2")]["status"] == "ok"
        assert ops[("fetch", "2")]["left"] >= ops[("fetch", "1")]["right"] - 1
        # Two permits for three payments held 100 ms each: the third queued for one, drawn just before its bar.
        queued = max((b for b in bars if b["cls"] == "queued"), key=lambda b: b["ms"])
        assert queued["op"].startswith("pay-") and abs(queued["right"] - ops[(queued["op"], "1")]["left"]) < 1.0
        # It got its permit when another payment let one go (not a wall-clock bound: load only delays).
        others = [ops[(f"pay-{i}", "1")] for i in range(3) if f"pay-{i}" != queued["op"]]
        assert ops[(queued["op"], "1")]["left"] >= min(o["right"] for o in others) - 1.0, (queued, others)
        assert d.find_element(By.CSS_SELECTOR, "tr.step-row[data-name='backoff'] td.took").text.endswith(" ms")


def test_a_missing_browser_fails_under_ci(monkeypatch: Any) -> None:
    import pytest

    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("FUSEE_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="chromium-driver"):
        browser.require()


def test_fork_a_run_before_its_signal_dropping_it_in_the_browser() -> None:
    browser.require()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with Served(populate, full=True) as served, browser.chromium() as driver:
        d: Any = driver
        engine: Any = served.engine
        wait = WebDriverWait(d, TIMEOUT)
        d.get(served.url + "/runs/order-2")
        wait.until(lambda _: d.find_elements(By.ID, "open-fork"))
        d.find_element(By.ID, "open-fork").click()
        new_id = d.find_element(By.ID, "fork-id")
        wait.until(lambda _: new_id.is_displayed())
        new_id.clear()
        new_id.send_keys("order-2-b")
        position = Select(d.find_element(By.ID, "fork-position"))
        # Before the charge: the approval came while it retried, after the cut.
        position.select_by_visible_text(next(o.text for o in position.options if o.text.endswith("step charge")))
        d.find_element(By.ID, "fork-reapply").click()  # untick: the approval is not delivered again
        d.find_element(By.ID, "confirm-fork").click()
        wait.until(lambda _: d.find_elements(By.ID, "flash") and "/runs/order-2-b" in d.current_url)
        served.call(waiting_for_signal, engine, "order-2-b")
        journal = served.call(engine.journal, "order-2-b")
        assert not any(type(r).__name__ == "Signal" for r in journal)
        assert served.call(lambda: engine.describe("order-2-b").status) == "running"
        assert served.call(lambda: engine.describe("order-2").status) == "ok"


def test_query_a_run_and_start_another_in_the_browser() -> None:
    browser.require()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with Served(populate, full=True) as served, browser.chromium() as driver:
        d: Any = driver
        engine: Any = served.engine
        wait = WebDriverWait(d, TIMEOUT)
        d.get(served.url + "/runs/order-3")
        wait.until(lambda _: d.find_elements(By.ID, "open-query"))
        d.find_element(By.ID, "open-query").click()
        name = d.find_element(By.ID, "query-name")
        wait.until(lambda _: name.is_displayed())
        name.send_keys("notes")
        d.find_element(By.ID, "confirm-query").click()
        wait.until(lambda _: d.find_elements(By.ID, "answer-value"))
        assert '"customer": "zenith"' in d.find_element(By.ID, "answer-value").text

        d.get(served.url + "/")
        wait.until(lambda _: d.find_elements(By.ID, "open-start"))
        d.find_element(By.ID, "open-start").click()
        Select(d.find_element(By.ID, "start-workflow")).select_by_value("order")
        d.find_element(By.ID, "start-id").send_keys("order-9")
        d.find_element(By.ID, "start-input").send_keys('"quill"')
        d.find_element(By.ID, "confirm-start").click()
        wait.until(lambda _: "/runs/order-9" in d.current_url and d.find_elements(By.ID, "flash"))
        assert served.call(lambda: engine.describe("order-9").attributes["customer"]) == "quill"
