"""The web UI over HTTP (no browser): actions, their protections, bad input, streams, paging."""

from __future__ import annotations

import asyncio
import html
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import fusee
from fusee.core import records as rec
from fusee.ui.app import PAGE, on_engine
from tests.ui.ui_app import Served, invoice, order, populate, waiting_for_signal


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def post(url: str, fields: dict[str, str], headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(status, body, Location) of a form POST, redirects not followed."""
    data = urllib.parse.urlencode(fields).encode()
    req = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/x-www-form-urlencoded", **(headers or {})})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.read().decode(), r.headers.get("Location", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("Location", "")


def token(served: Served, wid: str = "order-1") -> str:
    status, page = get(f"{served.url}/runs/{urllib.parse.quote(wid, safe='')}")
    assert status == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def journal(served: Served, wid: str) -> list[rec.Record]:
    assert served.engine is not None
    return list(served.call(served.engine.journal, wid))


def summary(served: Served, wid: str) -> fusee.RunSummary:
    assert served.engine is not None
    return served.call(served.engine.describe, wid)  # type: ignore[no-any-return]


def test_actions_need_the_token_and_the_same_origin() -> None:
    with Served(populate) as served:
        before = journal(served, "order-1")
        url = f"{served.url}/action/signal/order-1"
        fields = {"name": "approve", "value": "true"}
        status, body, _ = post(url, fields)
        assert status == 403 and "CSRF token" in body
        status, body, _ = post(url, {**fields, "csrf": "forged"})
        assert status == 403
        good = token(served)
        status, body, _ = post(url, {**fields, "csrf": good}, {"Origin": "http://evil.example"})
        assert status == 403 and "cross-origin" in body
        assert journal(served, "order-1") == before  # nothing recorded for a refused request
        host = served.url.split("/")[2]
        status, _, location = post(url, {**fields, "csrf": good}, {"Origin": f"http://{host}"})
        assert status == 303 and location == "/ui/runs/order-1?done=signal"
        signals = [r for r in journal(served, "order-1") if isinstance(r, rec.Signal)]
        assert [(s.name, s.payload, s.by) for s in signals] == [("approve", b"true", b"web-ui")]


def test_bad_input_gets_a_clear_message_and_records_nothing() -> None:
    with Served(populate) as served:
        good = token(served)
        before = journal(served, "order-1")
        status, body, _ = post(f"{served.url}/action/signal/order-1",
                               {"csrf": good, "name": "approve", "value": "{not json"})
        assert status == 400 and "the signal&#39;s value is not JSON" in body
        status, body, _ = post(f"{served.url}/action/signal/order-1", {"csrf": good, "name": " "})
        assert status == 400 and "the signal needs a name" in body
        status, body, _ = post(f"{served.url}/action/signal/order-1",
                               {"csrf": good, "name": "approve", "value": '"yes"'})
        assert status == 400 and "signal refused" in body and "bool" in body
        status, body, _ = post(f"{served.url}/action/signal/order-1",
                               {"csrf": good, "name": "aprove", "value": "true"})
        assert status == 400 and "signal refused" in body and "&#39;approve&#39;" in body
        status, body, _ = post(f"{served.url}/action/reset/order-1", {"csrf": good, "step": "nope"})
        assert status == 400 and "reset refused" in body
        status, body, _ = post(f"{served.url}/action/explode/order-1", {"csrf": good})
        assert status == 404 and "no action" in body
        status, body, _ = post(f"{served.url}/action/cancel/no-such-run", {"csrf": good})
        assert status == 404 and "no workflow with id" in body
        assert journal(served, "order-1") == before
        status, body = get(f"{served.url}/runs/no-such-run")
        assert status == 404 and "no workflow with id &#39;no-such-run&#39; exists" in body
        status, body = get(f"{served.url}/?q=" + urllib.parse.quote("attrs.region = "))
        assert status == 400 and "invalid query at position" in body
        status, body = get(f"{served.url}/?q=" + urllib.parse.quote("status = 'ok' or"))
        assert status == 400 and "position 16" in body  # the position in the user's own text


def test_cancel_terminate_resume_and_reset_from_the_forms() -> None:
    with Served(populate) as served:
        good = token(served)

        def act(action: str, wid: str, **fields: str) -> None:
            status, body, _ = post(f"{served.url}/action/{action}/{wid}", {"csrf": good, **fields})
            assert status == 303, body

        act("cancel", "order-1", reason="customer left")
        served.call(_until_status, served.engine, "order-1", "cancelled")
        act("terminate", "order-4", reason="duplicate")
        assert summary(served, "order-4").status == "terminated"
        assert [(a.action, a.by, a.detail) for a in summary(served, "order-4").audit] == [
            ("terminate", "web-ui", "duplicate")]

        attempts = len([r for r in journal(served, "sync-1") if isinstance(r, rec.Attempt)])
        act("resume", "sync-1")
        assert any(isinstance(r, rec.Resume) and r.by == b"web-ui" for r in journal(served, "sync-1"))
        served.call(_until_more_attempts, served.engine, "sync-1", attempts)

        old = summary(served, "restock-1")
        act("reset", "restock-1", step="reserve")
        new = summary(served, "restock-1")
        assert new.run_id != old.run_id and ("reset", "web-ui") in [(a.action, a.by) for a in new.audit]
        status, page = get(f"{served.url}/runs/restock-1")
        assert status == 200 and "Run reset" not in page  # the flash shows after the redirect only
        status, page = get(f"{served.url}/runs/restock-1?done=reset")
        assert "Run reset: a new run continues" in page


async def _until_status(engine: fusee.Engine, wid: str, status: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while engine.describe(wid).status != status:
        assert loop.time() < deadline, f"{wid} never became {status}"
        await asyncio.sleep(0.005)


async def _until_more_attempts(engine: fusee.Engine, wid: str, than: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while len([r for r in await engine.journal(wid) if isinstance(r, rec.Attempt)]) <= than:
        assert loop.time() < deadline, f"{wid} never retried"
        await asyncio.sleep(0.005)


def test_a_stream_is_served_as_server_sent_events_from_any_offset() -> None:
    with Served(populate) as served:

        def events(headers: dict[str, str]) -> list[str]:
            status, body = get(f"{served.url}/stream/order-2?name=log", headers)
            assert status == 200
            return body.split("\n\n")

        out = events({})
        data = [e[len("data: "):] for e in out if e.startswith("data: ")]
        assert data[0] == '"quoted 42 for bolt"' and data[1].startswith('"charged: pay-')
        assert data[2:] == ['"shipped"']
        assert "event: end\ndata: {}" in out
        # A reconnecting EventSource sends the last ID it saw: it gets what follows.
        again = events({"Last-Event-ID": "2"})
        assert [e for e in again if e.startswith("data: ")] == ['data: "shipped"']
        status, body = get(f"{served.url}/stream/order-2?name=log&offset=-1")
        assert status == 400
        status, body = get(f"{served.url}/stream/nobody?name=log")
        assert "event: failure" in body and "no workflow with id" in body


def test_ids_that_need_quoting_and_paging_through_many_runs() -> None:
    odd = "tenant/a b'c?d"
    evil = "<img src=x onerror=alert(1)>"

    async def setup(engine: fusee.Engine) -> None:
        await engine.start(order, odd, "quoting")
        await waiting_for_signal(engine, odd)
        await engine.start(order, evil, "<script>alert(2)</script>")
        await waiting_for_signal(engine, evil)
        for i in range(PAGE + 5):
            await engine.execute(invoice, f"inv-{i:03d}", f"o{i}")

    with Served(setup) as served:
        status, page = get(f"{served.url}/runs/{urllib.parse.quote(odd, safe='')}")
        assert status == 200 and "tenant/a b&#39;c?d" in page
        for url in (f"{served.url}/runs/{urllib.parse.quote(evil, safe='')}", f"{served.url}/"):
            status, page = get(url)
            assert status == 200 and "&lt;img src=x onerror=alert(1)&gt;" in page
            assert "<img src=x" not in page and "<script>alert(2)" not in page
        q = urllib.parse.quote("workflow_id = 'tenant/a b''c?d'")
        status, page = get(f"{served.url}/?q={q}")
        assert page.count('class="run-row"') == 1
        status, page = get(f"{served.url}/?workflow=invoice")
        assert page.count('class="run-row"') == PAGE
        found = re.search(r'href="(\?[^"]*cursor=[^"]*)" id="next-page"', page)
        assert found is not None
        status, page = get(served.url + "/" + found.group(1).replace("&amp;", "&"))
        ids = re.findall(r'data-id="(inv-\d+)"', page)
        assert ids == [f"inv-{i:03d}" for i in range(PAGE, PAGE + 5)]
        assert 'id="next-page"' not in page
        # A search's order by stays last when the workflow filter joins it, and pages on.
        q = urllib.parse.quote("workflow_id != 'x' or shard = 0 order by workflow_id desc")
        status, page = get(f"{served.url}/?workflow=invoice&q={q}")
        assert status == 200 and re.findall(r'data-id="(inv-\d+)"', page) == [
            f"inv-{i:03d}" for i in range(PAGE + 4, 4, -1)]
        found = re.search(r'href="(\?[^"]*cursor=[^"]*)" id="next-page"', page)
        assert found is not None
        status, page = get(served.url + "/" + found.group(1).replace("&amp;", "&"))
        assert re.findall(r'data-id="(inv-\d+)"', page) == [f"inv-{i:03d}" for i in range(4, -1, -1)]


def test_the_ui_calls_an_engine_running_on_another_loop() -> None:
    # An app served on its own loop (or thread) still reaches the engine on the engine's loop.
    with Served(populate) as served:
        assert served.engine is not None
        engine = served.engine

        async def elsewhere() -> tuple[str, int]:
            s = await on_engine(engine, engine.describe, "order-2")
            j = await on_engine(engine, engine.journal, "order-2")
            return s.status, len(j)

        status, n = asyncio.run(elsewhere())
        assert status == "ok" and n == len(journal(served, "order-2"))


def test_a_live_stream_response_ends_in_time_and_the_browser_resumes_it(monkeypatch: Any) -> None:
    import fusee.ui.app

    monkeypatch.setattr(fusee.ui.app, "STREAM_SPAN", 0.3)
    monkeypatch.setattr(fusee.ui.app, "STREAM_WAIT", 0.1)
    with Served(populate) as served:
        # order-1 waits for a signal: its stream is open. The response ends anyway (no end event).
        status, body = get(f"{served.url}/stream/order-1?name=log")
        assert status == 200 and body.startswith("retry: 1000") and "event: end" not in body
        data = [e for e in body.split("\n\n") if e.startswith("data: ")]
        assert len(data) == 2 and "id: 2" in body
        status, body = get(f"{served.url}/stream/order-1?name=log", {"Last-Event-ID": "2"})
        assert [e for e in body.split("\n\n") if e.startswith("data: ")] == []


def test_live_regions_carry_a_version_that_changes_only_with_their_content() -> None:
    with Served(populate) as served:

        def version(url: str) -> str:
            with urllib.request.urlopen(url, timeout=30) as r:
                return str(r.headers["X-Fusee-Version"])

        for page, region, live in (
            (f"{served.url}/runs/order-2", "live", f"{served.url}/live/order-2"),
            (f"{served.url}/?status=ok", "rows", f"{served.url}/fragments/rows?status=ok"),
            (f"{served.url}/?status=ok", "counts", f"{served.url}/fragments/counts?status=ok"),
        ):
            _, html = get(page)
            found = re.search(f'id="{region}" data-live="[^"]*" data-every="\\d+" data-version="([0-9a-f]+)"', html)
            assert found is not None
            assert version(live) == found.group(1)  # the page's script swaps nothing
        before = version(f"{served.url}/live/order-1")
        assert served.engine is not None
        served.call(served.engine.signal, "order-1", fusee.signal("approve"), True)
        assert version(f"{served.url}/live/order-1") != before


async def _asgi_get(app: Any, path: str) -> tuple[int, str]:
    """One GET through an ASGI app, in this loop (no server)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body.decode()


async def test_a_closed_engine_gets_a_clear_page_not_a_server_error() -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    import fusee.ui

    engine = await fusee.Engine.open(workflows=[order])
    app = Starlette(routes=[Mount("/ui", routes=fusee.ui.routes(engine))])
    await engine.start(order, "o-1", "acme")
    status, page = await _asgi_get(app, "/ui/runs/o-1")
    assert status == 200 and "o-1" in page
    await engine.close()
    # The list and the metrics answer from memory (what the engine held at its close)...
    assert (await _asgi_get(app, "/ui/"))[0] == 200
    assert (await _asgi_get(app, "/ui/metrics"))[0] == 200
    # ...a journal cannot be read any more: a page that says why, not a server error.
    status, page = await _asgi_get(app, "/ui/runs/o-1")
    assert status == 503 and "the engine is closed: open it again" in page


def test_actions_from_a_sandboxed_frame_or_another_site_are_refused() -> None:
    """The UI mounted on its own: a page of another site cannot read the token, but a browser
    that says the request is cross-site (Sec-Fetch-Site) or from a sandboxed frame
    (Origin: null) is refused even so."""
    with Served(populate) as served:
        before = journal(served, "order-1")
        url = f"{served.url}/action/signal/order-1"
        fields = {"name": "approve", "value": "true", "csrf": token(served)}
        host = served.url.split("/")[2]
        for headers in ({"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
                        {"Origin": f"http://{host}", "Sec-Fetch-Site": "same-site"}):
            status, body, _ = post(url, fields, headers)
            assert status == 403 and "cross-origin" in body, (headers, body)
        assert journal(served, "order-1") == before
        status, _, _ = post(url, fields, {"Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"})
        assert status == 303


def test_resume_with_nothing_paused_says_so_and_records_nothing() -> None:
    with Served(populate) as served:
        before = journal(served, "order-1")
        status, body, _ = post(f"{served.url}/action/resume/order-1", {"csrf": token(served)})
        assert status == 409, body
        assert "resume refused" in body and "no paused step" in body
        assert "Paused steps resumed" not in body
        assert journal(served, "order-1") == before


async def test_a_form_over_the_limit_is_refused_before_it_is_read_whole() -> None:
    """The UI mounted on its own: a form's Content-Length over MAX_FORM is refused unread, and a
    chunked one once it passes the limit."""
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    import fusee.ui
    from fusee.ui.app import MAX_FORM

    async with fusee.Engine.open(workflows=[order]) as engine:
        await engine.start(order, "o-1", "acme")
        await waiting_for_signal(engine, "o-1")
        before = await engine.journal("o-1")
        app = Starlette(routes=[Mount("/ui", routes=fusee.ui.routes(engine))])
        sent = [0]

        async def body() -> Any:
            while sent[0] < 8 * MAX_FORM:
                sent[0] += 1 << 16
                yield b"x" * (1 << 16)

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            for declared in (True, False):
                sent[0] = 0
                headers = {"Content-Type": "application/x-www-form-urlencoded"}
                if declared:
                    headers["Content-Length"] = str(8 * MAX_FORM)
                r = await c.post("/ui/action/signal/o-1", content=body(), headers=headers)
                assert r.status_code == 413 and "at most" in r.text
                assert sent[0] <= (1 << 16 if declared else MAX_FORM + (1 << 16))
        assert await engine.journal("o-1") == before


def test_a_browsers_same_origin_form_passes_the_apps_checks() -> None:
    """Served as ``fusee serve`` serves it, over a real socket: what a browser sends for the UI's
    own form passes; the same form under another Host, or from another site, does not."""
    with Served(populate, full=True) as served:
        host = served.url.split("/")[2]
        fields = {"name": "approve", "value": "true", "csrf": token(served)}
        url = f"{served.url}/action/signal/order-1"
        before = journal(served, "order-1")
        status, _, _ = post(url, fields, {"Host": f"evil.example:{host.split(':')[1]}"})
        assert status == 400
        status, body, _ = post(url, fields, {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
        assert status == 403 and "cross-origin" in body
        assert journal(served, "order-1") == before
        status, body, location = post(url, fields, {"Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"})
        assert status == 303 and location == "/ui/runs/order-1?done=signal", body


def test_start_a_run_from_the_runs_page() -> None:
    async def nothing(engine: fusee.Engine) -> None:
        pass

    with Served(nothing) as served:
        engine: Any = served.engine
        status, page = get(f"{served.url}/")
        assert status == 200
        names = re.findall(r'<option value="([^"]+)" data-input="([^"]+)"', page)
        # The engine's internal workflows (the object's) are not offered.
        assert ("order", "str") in names and not any(n.startswith("fusee") for n, _ in names)
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None
        good = found.group(1)
        start = f"{served.url}/start"
        status, body, _ = post(start, {"csrf": good, "workflow": "order", "workflow_id": "o-9", "input": "acme"})
        assert status == 400 and "not JSON" in body and 'value="o-9"' in body  # what was typed is kept
        status, body, _ = post(start, {"csrf": good, "workflow": "order", "workflow_id": "o-9", "input": "42"})
        assert status == 400 and "nothing started" in body
        status, body, _ = post(start, {"csrf": good, "workflow": "fusee.object:cart", "workflow_id": "x",
                                       "input": ""})
        assert status == 400 and "choose a workflow" in body
        status, body, _ = post(start, {"csrf": good, "workflow": "order", "workflow_id": " ", "input": '"x"'})
        assert status == 400 and "workflow ID" in body
        assert served.call(engine.runs) == []
        status, _, location = post(start, {"csrf": good, "workflow": "order", "workflow_id": "o-9",
                                           "input": '"acme"'})
        assert status == 303 and location.endswith("/runs/o-9?done=start")
        assert served.call(engine.describe, "o-9").workflow == "order"
        status, body, _ = post(start, {"csrf": good, "workflow": "order", "workflow_id": "o-9", "input": '"b"'})
        assert status == 409 and "nothing started" in body


def test_fork_reset_by_position_dropping_signals_and_rerun_with_new_input() -> None:
    with Served(populate) as served:
        engine: Any = served.engine
        good = token(served, "order-2")
        _, page = get(f"{served.url}/runs/order-2")
        assert 'id="open-fork"' in page and 'id="open-rerun"' in page
        # The rerun dialog starts from the run's own input.
        assert re.search(r'id="rerun-input"[^>]*>&#34;bolt&#34;</textarea>', page)
        # Cut before the charge: the approval arrived while it retried, so after the cut.
        charge = next(r.seq for r in journal(served, "order-2") if isinstance(r, rec.Attempt))

        def waits_without_a_signal(wid: str) -> None:
            served.call(waiting_for_signal, engine, wid)
            assert not any(isinstance(r, rec.Signal) for r in journal(served, wid))
            assert summary(served, wid).status == "running"

        # A fork with the signal dropped waits for approval again; order-2 is left alone.
        status, _, location = post(f"{served.url}/action/fork/order-2", {
            "csrf": good, "new_id": "order-2-again", "step": "", "position": str(charge), "signals_choice": "1"})
        assert status == 303 and location.endswith("/runs/order-2-again?done=fork")
        waits_without_a_signal("order-2-again")
        assert summary(served, "order-2").status == "ok"
        assert ("reset", "web-ui") in [(a.action, a.by) for a in summary(served, "order-2-again").audit]

        # The same cut with the signal delivered again finishes as the original did.
        status, _, _ = post(f"{served.url}/action/fork/order-2", {
            "csrf": good, "new_id": "order-2-same", "position": str(charge), "signals_choice": "1",
            "reapply_signals": "on"})
        assert status == 303
        assert served.call(lambda: engine.get("order-2-same").result()) == served.call(
            lambda: engine.get("order-2").result())

        # Reset by position, dropping the signal: the run itself waits again.
        status, _, _ = post(f"{served.url}/action/reset/order-2", {
            "csrf": good, "position": str(charge), "signals_choice": "1"})
        assert status == 303
        waits_without_a_signal("order-2")

        status, body, _ = post(f"{served.url}/action/fork/order-2", {"csrf": good, "new_id": "", "step": "quote"})
        assert status == 400 and "ID of its own" in body
        status, body, _ = post(f"{served.url}/action/fork/order-2", {"csrf": good, "new_id": "x", "position": "two"})
        assert status == 400 and "operation&#39;s number" in body

        status, _, location = post(f"{served.url}/start", {"csrf": good, "workflow": "order",
                                                           "workflow_id": "order-2-rerun", "input": '"carla"'})
        assert status == 303 and location.endswith("/runs/order-2-rerun?done=start")
        served.call(waiting_for_signal, engine, "order-2-rerun")
        assert summary(served, "order-2-rerun").attributes["customer"] == "carla"


def test_the_steps_table_lists_every_failed_attempt_and_numbers_operations_one_way() -> None:
    with Served(populate) as served:
        _, page = get(f"{served.url}/runs/sync-1")
        row = re.search(r'<tr class="step-row" data-name="pull".*?</tr>', page, re.S)
        assert row is not None
        items = re.findall(r'<li value="(\d+)"><span class="bad">([^<]*)</span>( — paused)?', row.group(0))
        assert [(n, err, paused) for n, err, paused in items] == [
            ("1", "RuntimeError: warehouse API unreachable", ""),
            ("2", "RuntimeError: warehouse API unreachable", " — paused")]
        # Operations are numbered by position (#n, what a reset before a position takes), records by place.
        assert re.search(r'<td class="mono muted">#\d+</td>', row.group(0))
        _, page = get(f"{served.url}/runs/order-2")
        assert "signal approve (record " in page and "(#" not in page


def test_query_and_update_a_run_from_its_page() -> None:
    with Served(populate) as served:
        good = token(served, "order-1")
        url = f"{served.url}/action"
        status, body, _ = post(f"{url}/query/order-1", {"csrf": good, "name": "notes", "arg": ""})
        assert status == 200
        answer = re.search(r'<pre class="mono" id="answer-value">(.*?)</pre>', body, re.S)
        assert answer is not None and json.loads(html.unescape(answer.group(1))) == {"customer": "acme", "notes": []}

        status, body, _ = post(f"{url}/update/order-1", {"csrf": good, "name": "note", "arg": '"call back"'})
        assert status == 200 and "durable in the journal" in body
        assert re.search(r'id="answer-value">1</pre>', body)
        assert any(isinstance(r, rec.Update) for r in journal(served, "order-1"))

        records = len(journal(served, "order-1"))
        status, body, _ = post(f"{url}/update/order-1", {"csrf": good, "name": "note", "arg": '"  "'})
        assert status == 400 and "a note needs some text" in body
        status, body, _ = post(f"{url}/update/order-1", {"csrf": good, "name": "note", "arg": "call back"})
        assert status == 400 and "not JSON" in body
        status, body, _ = post(f"{url}/query/order-1", {"csrf": good, "name": "", "arg": ""})
        assert status == 400 and "needs the name" in body
        status, body, _ = post(f"{url}/query/order-1", {"csrf": good, "name": "notes"}, {"Origin": "http://evil.example"})
        assert status == 403
        assert len(journal(served, "order-1")) == records  # refused requests recorded nothing

        # An ended run answers queries too (its journal is replayed read-only).
        status, body, _ = post(f"{url}/query/order-2", {"csrf": good, "name": "notes"})
        assert status == 200 and "bolt" in html.unescape(body)
