"""The Objects pages: every key, one key's current state, and a versioned edit (HTTP and Chromium)."""

from __future__ import annotations

import html
import re
from typing import Any

import fusee
from tests.helpers import until
from tests.ui import browser
from tests.ui.test_pages import get, post
from tests.ui.ui_app import Served, add, cart

TIMEOUT = 30


async def carts(engine: fusee.Engine) -> None:
    await engine.call(add, "alice", "apple")
    await engine.call(add, "alice", "apple")
    await engine.call(add, "bob", "pear")


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def shown_state(page: str) -> str:
    found = re.search(r'<pre class="mono" id="state">(.*?)</pre>', page, re.S)
    assert found is not None
    return html.unescape(found.group(1))


def test_the_objects_page_lists_keys_and_a_key_shows_its_current_state() -> None:
    with Served(carts) as served:
        status, page = get(f"{served.url}/objects")
        assert status == 200
        assert re.findall(r'<tr class="object-row" data-object="([^"]+)" data-key="([^"]+)"', page) == [
            ("cart", "alice"), ("cart", "bob")]
        status, page = get(f"{served.url}/objects/cart/alice")
        assert status == 200
        # The current state, not the state the run started from.
        assert shown_state(page) == '{\n  "apple": 2\n}'
        assert 'data-version="2"' in page
        status, page = get(f"{served.url}/objects/cart/nobody")
        assert status == 200 and shown_state(page) == "{}" and "never written" in page
        assert get(f"{served.url}/objects/basket/alice")[0] == 404
        # The internal run's page points to the state page.
        status, page = get(f"{served.url}/runs/%40cart%2Falice")
        assert status == 200 and 'href="/ui/objects/cart/alice"' in page


def test_an_edit_applies_at_its_version_and_a_stale_or_bad_one_changes_nothing() -> None:
    with Served(carts) as served:
        engine: Any = served.engine
        url = f"{served.url}/objects/action/save/cart/alice"
        _, page = get(f"{served.url}/objects/cart/alice")
        good = csrf(page)
        status, body, _ = post(url, {"state": '{"apple": 5}', "if_version": "2"})
        assert status == 403 and "CSRF" in body
        status, body, _ = post(url, {"csrf": good, "state": "{not json", "if_version": "2"})
        assert status == 400 and "not JSON" in body
        status, body, _ = post(url, {"csrf": good, "state": '{"apple": "many"}', "if_version": "2"})
        assert status == 400 and "not a state of object" in body
        assert served.call(engine.object_state, cart, "alice").version == 2

        status, _, location = post(url, {"csrf": good, "state": '{"apple": 5, "kiwi": 1}', "if_version": "2"})
        assert status == 303 and location.endswith("/objects/cart/alice?done=save")
        got = served.call(engine.object_state, cart, "alice")
        assert (got.value, got.version) == ({"apple": 5, "kiwi": 1}, 3)

        # The page showed version 2: a second edit from it is refused and shows the current state.
        status, body, _ = post(url, {"csrf": good, "state": '{"apple": 0}', "if_version": "2"})
        assert status == 409 and "nothing changed" in body
        assert shown_state(body) == '{\n  "apple": 5,\n  "kiwi": 1\n}'
        assert '{&#34;apple&#34;: 0}' in body or '{"apple": 0}' in html.unescape(body)
        assert served.call(engine.object_state, cart, "alice").version == 3

        status, _, _ = post(f"{served.url}/objects/action/clear/cart/alice", {"csrf": good, "if_version": "3"})
        assert status == 303
        got = served.call(engine.object_state, cart, "alice")
        assert (got.value, got.version) == ({}, 4)
        assert served.call(engine.call, add, "alice", "fig") == 1  # the object goes on from the edit


def test_edit_an_objects_state_in_the_browser() -> None:
    browser.require()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with Served(carts, full=True) as served, browser.chromium() as driver:
        d: Any = driver
        engine: Any = served.engine
        wait = WebDriverWait(d, TIMEOUT)
        d.get(served.url + "/objects")
        d.find_element(By.LINK_TEXT, "bob").click()
        wait.until(lambda _: d.find_element(By.ID, "state").text == '{\n  "pear": 1\n}')
        d.find_element(By.ID, "open-save").click()
        box = d.find_element(By.ID, "edit-state")
        wait.until(lambda _: box.is_displayed())
        box.clear()
        box.send_keys('{"pear": 3, "plum": 2}')
        d.find_element(By.ID, "confirm-save").click()
        wait.until(lambda _: d.find_elements(By.ID, "flash"))
        assert d.find_element(By.ID, "version").get_attribute("data-version") == "2"
        assert served.call(engine.object_state, cart, "bob").value == {"pear": 3, "plum": 2}



async def scheduled_and_carts(engine: fusee.Engine) -> None:
    from tests.ui.ui_app import report

    await carts(engine)
    await engine.schedule("minutely", report, "ops", every="1s")
    await until(lambda: any(s.workflow_id.startswith("minutely@") and s.status == "ok" for s in engine.runs()))


def test_internal_runs_show_their_timers_as_timers_and_offer_no_actions() -> None:
    with Served(scheduled_and_carts) as served:
        status, page = get(f"{served.url}/runs/fusee%3Aschedule%3Aminutely")
        assert status == 200
        assert 'id="internal-note"' in page and 'href="/ui/schedules"' in page
        assert 'id="open-cancel"' not in page and 'id="open-terminate"' not in page
        # The schedule's wait for its next time is a timer that fired, not a wait that timed out.
        assert "timer fired" in page and "timed_out" not in re.sub(r"<div class=\"legend\".*?</div>", "", page,
                                                                    flags=re.S)
        status, page = get(f"{served.url}/runs/%40cart%2Falice")
        assert 'id="open-cancel"' not in page and 'href="/ui/objects/cart/alice"' in page
        status, body, _ = post(f"{served.url}/action/cancel/%40cart%2Falice", {"csrf": csrf(page), "reason": "x"})
        assert status == 409 and "itself" in body
        assert served.call(served.engine.describe, "@cart/alice").status == "running"  # type: ignore[union-attr]
