"""The Schedules and Limits pages over HTTP (no browser): tables, actions, their protections."""

from __future__ import annotations

import html
import re
import urllib.parse
from typing import Any

import fusee
from tests.helpers import until
from tests.ui.test_pages import get, post
from tests.ui.ui_app import Served, charges, released, report


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


async def scheduled(engine: fusee.Engine) -> None:
    await engine.schedule("nightly", report, "sales", cron="0 2 * * *", timezone="Europe/Paris")
    await engine.schedule("hourly", report, "ops", every="1h", paused=True, overlap="allow_all")
    await until(lambda: len(engine.schedules()) == 2)


def test_the_schedules_page_shows_each_schedule_and_its_runs() -> None:
    with Served(scheduled) as served:
        engine: Any = served.engine
        served.call(engine.trigger_schedule, "hourly")
        served.call(until, lambda: any(s.workflow_id.startswith("hourly@") and s.status == "ok"
                                       for s in engine.runs()))
        status, page = get(f"{served.url}/schedules")
        assert status == 200
        assert '<a class="nav-item active" href="/ui/schedules">Schedules</a>' in page
        rows = re.findall(r'<tr class="schedule-row" data-id="([^"]+)">(.*?)</tr>', page, re.S)
        assert [sid for sid, _ in rows] == ["hourly", "nightly"]
        hourly, nightly = rows[0][1], rows[1][1]
        assert "every 1h" in hourly and "allow_all" in hourly and "badge-paused" in hourly
        run = next(s.workflow_id for s in served.call(engine.runs) if s.workflow_id.startswith("hourly@"))
        assert f'href="/ui/runs/{urllib.parse.quote(run, safe="")}"' in hourly
        assert "cron 0 2 * * * (Europe/Paris)" in nightly and "none yet" in nightly
        assert "Unpause" in hourly and "Pause" in nightly
        info = {s.schedule_id: s for s in served.call(engine.schedules)}["nightly"]
        assert info.next_time is not None and info.next_time.strftime("%Y-%m-%d %H:%M") in nightly


def test_the_schedules_and_runs_pages_on_a_parted_directory(tmp_path: Any) -> None:
    async def many(engine: fusee.Engine) -> None:
        for sid in ("s1", "s2", "s3", "s4", "s5"):  # on more than one of the parts
            await engine.schedule(sid, report, "ops", every="1h", paused=True)

    with Served(many, path=str(tmp_path / "parted"), parts=3) as served:
        status, page = get(f"{served.url}/schedules")
        assert status == 200, page
        rows = re.findall(r'<tr class="schedule-row" data-id="([^"]+)">', page)
        assert rows == ["s1", "s2", "s3", "s4", "s5"]
        engine: Any = served.engine
        for i in range(6):
            served.call(engine.start, report, f"r-{i}", "ops")
        status, page = get(f"{served.url}/")
        assert status == 200, page
        status, page = get(f"{served.url}/runs/r-4")
        assert status == 200 and "r-4" in page, page
        status, page = get(f"{served.url}/metrics")
        assert status == 200, page


def test_schedule_actions_need_the_token_and_act_once_confirmed() -> None:
    with Served(scheduled) as served:
        engine: Any = served.engine
        url = f"{served.url}/schedules/action/unpause/hourly"
        status, body, _ = post(url, {})
        assert status == 403 and "CSRF token" in body
        _, page = get(f"{served.url}/schedules")
        good = csrf(page)
        status, body, _ = post(url, {"csrf": good}, {"Origin": "http://evil.example"})
        assert status == 403 and "cross-origin" in body
        assert {s.schedule_id: s.paused for s in served.call(engine.schedules)}["hourly"] is True

        status, _, location = post(url, {"csrf": good})
        assert status == 303 and location == "/ui/schedules?done=unpause"
        assert {s.schedule_id: s.paused for s in served.call(engine.schedules)}["hourly"] is False
        _, page = get(f"{served.url}{location[3:]}")
        assert "Schedule unpaused" in page

        status, _, _ = post(f"{served.url}/schedules/action/pause/nightly", {"csrf": good})
        assert status == 303
        assert {s.schedule_id: s.paused for s in served.call(engine.schedules)}["nightly"] is True
        status, _, _ = post(f"{served.url}/schedules/action/trigger/nightly", {"csrf": good})
        assert status == 303
        served.call(until, lambda: any(s.workflow_id.startswith("nightly@") for s in engine.runs()))

        status, body, _ = post(f"{served.url}/schedules/action/explode/nightly", {"csrf": good})
        assert status == 404 and "no schedule action" in body
        status, body, _ = post(f"{served.url}/schedules/action/pause/nope", {"csrf": good})
        assert status == 404 and "pause refused" in html.unescape(body)

        status, _, _ = post(f"{served.url}/schedules/action/delete/nightly", {"csrf": good})
        assert status == 303
        served.call(until, lambda: [s.schedule_id for s in engine.schedules()] == ["hourly"])
        _, page = get(f"{served.url}/schedules")
        assert re.findall(r'<tr class="schedule-row" data-id="([^"]+)">', page) == ["hourly"]


def test_backfill_a_schedule_from_its_dialog() -> None:
    with Served(scheduled) as served:
        engine: Any = served.engine
        _, page = get(f"{served.url}/schedules")
        good = csrf(page)
        assert 'id="open-backfill-1"' in page
        url = f"{served.url}/schedules/action/backfill/hourly"
        status, body, _ = post(url, {"csrf": good, "start": "yesterday", "end": "2026-01-01T05:00"})
        assert status == 400 and "date and time" in body
        status, body, _ = post(url, {"csrf": good, "start": "2026-01-01T05:00", "end": "2026-01-01T02:00"})
        assert status == 400 and "the range is empty" in body
        assert not any(s.workflow_id.startswith("hourly@") for s in served.call(engine.runs))
        # Three hourly times in [02:00, 05:00), run though the schedule is paused (allow_all: at once).
        status, _, location = post(url, {"csrf": good, "start": "2026-01-01T02:00", "end": "2026-01-01T05:00"})
        assert status == 303 and location == "/ui/schedules?done=backfill"
        served.call(until, lambda: sorted(s.workflow_id for s in engine.runs() if s.workflow_id.startswith("hourly@")
                                          and s.status == "ok") == [
            "hourly@2026-01-01T02:00:00Z", "hourly@2026-01-01T03:00:00Z", "hourly@2026-01-01T04:00:00Z"])
        _, page = get(f"{served.url}{location[3:]}")
        assert "Backfill recorded" in page


async def busy(engine: fusee.Engine) -> None:
    await engine.start(charges, "charges-1", 5)
    await until(lambda: engine.limits()["payments"].in_use == 2 and engine.limits()["payments"].waiting == 3)


def test_the_limits_page_shows_in_use_and_waiting_and_resizes() -> None:
    with Served(busy) as served:
        engine: Any = served.engine
        status, page = get(f"{served.url}/limits")
        assert status == 200
        assert '<a class="nav-item active" href="/ui/limits">Limits</a>' in page
        rows = dict(re.findall(r'<tr class="limit-row" data-id="([^"]+)">(.*?)</tr>', page, re.S))
        assert list(rows) == ["email", "payments"]
        cells = re.findall(r'<td class="mono">(.*?)</td>', rows["payments"], re.S)
        assert cells[1:] == ["2", "50", '2 <span class="muted small">of 2</span>', "3"]
        assert re.findall(r'<td class="mono">(.*?)</td>', rows["email"], re.S)[1:3] == ["—", "5"]

        good = csrf(page)
        url = f"{served.url}/limits/resize/payments"
        status, body, _ = post(url, {"concurrency": "9"})
        assert status == 403
        for bad, message in [({"concurrency": "0"}, "concurrency must be above 0"),
                             ({"concurrency": "many"}, "concurrency must be a whole number"),
                             ({"concurrency": "2", "per_second": "-1"}, "per second must be above 0")]:
            status, body, _ = post(url, {"csrf": good, **bad})
            assert status == 400 and message in html.unescape(body), body
        status, body, _ = post(f"{served.url}/limits/resize/nope", {"csrf": good, "concurrency": "1"})
        assert status == 404 and "no limit named" in html.unescape(body)
        assert served.call(engine.limits)["payments"].concurrency == 2

        status, _, location = post(url, {"csrf": good, "concurrency": "5", "per_second": ""})
        assert status == 303 and location == "/ui/limits?done=resize"
        served.call(until, lambda: engine.limits()["payments"].in_use == 5)
        lim = served.call(engine.limits)["payments"]
        assert (lim.concurrency, lim.per_second, lim.waiting) == (5, None, 0)
        served.call(lambda: released().set())
        served.call(until, lambda: engine.describe("charges-1").status == "ok")
