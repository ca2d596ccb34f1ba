"""What the HTTP API and the UI refuse from other sites: a foreign Host, a cross-origin write,
a write that is not JSON, a body over the limit (issue 22, finding B).

Loopback is not a boundary: any page the operator opens can POST ``text/plain`` to
127.0.0.1, and a DNS-rebinding page reaches the server under its own name.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import fusee
from fusee.core import records as rec
from fusee.http import app
from fusee.ui.app import MAX_FORM
from tests.helpers import until

sys.path.insert(0, str(Path(__file__).parent))
import ops_app

HOST = "127.0.0.1:8233"
SAME = {"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin"}
EVIL = "http://evil.example"


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[fusee.Engine]:
    ops_app.TOKENS.clear()
    ops_app.FIXED.clear()
    async with fusee.Engine.open(tmp_path / "e", workflows=ops_app.WORKFLOWS, segment_bytes=1 << 20) as e:
        yield e


def client(engine: fusee.Engine, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app(engine, **kw)), base_url=f"http://{HOST}")


async def _waiting(engine: fusee.Engine, wid: str = "o-1") -> int:
    """Starts ``wid`` and returns the records appended once it waits for its approval."""
    await engine.start(ops_app.order, wid, "acme")
    await until(lambda: any(isinstance(x, rec.Wait) for x in engine._rt.wf[wid].journal))
    await until(lambda: engine.metrics().records_pending == 0 and not engine.metrics().steps_executing)
    return sum(engine._log._appended)


#: The writes a page of another site could make if the API took them.
WRITES = [
    ("/api/runs", b'{"workflow": "order", "workflow_id": "o-evil", "input": "x"}'),
    ("/api/runs/o-1/signal", b'{"name": "approve", "value": true}'),
    ("/api/runs/o-1/cancel", b'{"reason": "csrf"}'),
    ("/api/runs/o-1/terminate", b'{"reason": "csrf"}'),
]


@pytest.mark.parametrize(("path", "body"), WRITES)
@pytest.mark.parametrize(("headers", "status"), [
    # A <form enctype="text/plain"> or fetch(..., {mode: "no-cors"}) from another site.
    ({"Content-Type": "text/plain", "Origin": EVIL, "Sec-Fetch-Site": "cross-site"}, 403),
    # The same without the browser's headers (an old browser, a stripped Origin): still not JSON.
    ({"Content-Type": "text/plain"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    # JSON, but from another site (or a sandboxed frame, whose Origin is "null").
    ({"Content-Type": "application/json", "Origin": EVIL}, 403),
    ({"Content-Type": "application/json", "Origin": "null"}, 403),
    ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
    ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403),
])
async def test_a_write_from_another_site_is_refused_and_changes_nothing(
        engine: fusee.Engine, path: str, body: bytes, headers: dict[str, str], status: int) -> None:
    before = await _waiting(engine)
    async with client(engine) as c:
        r = await c.post(path, content=body, headers=headers)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] in ("CrossOriginRequest", "UnsupportedMediaType") and error["message"]
    assert "access-control-allow-origin" not in r.headers
    assert sum(engine._log._appended) == before
    assert [s.workflow_id for s in engine.runs()] == ["o-1"]
    assert engine.describe("o-1").status == "running"


async def test_a_same_origin_json_write_still_works(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "acme"},
                         headers=SAME)
        assert r.status_code == 201, r.text
        await until(lambda: any(isinstance(x, rec.Wait) for x in engine._rt.wf["o-1"].journal))
        r = await c.post("/api/runs/o-1/signal", json={"name": "approve", "value": True},
                         headers={**SAME, "Content-Type": "application/json; charset=utf-8"})
        assert r.status_code == 200, r.text
        # A client that is no browser sends neither Origin nor Sec-Fetch-Site (the CLI, curl).
        r = await c.get("/api/runs")
        assert [s["status"] for s in r.json()["items"]] in (["running"], ["ok"])
    assert await engine.get("o-1").result() == "shipped"


@pytest.mark.parametrize("path", ["/api/runs", "/api/runs/o-1", "/ui/", "/ui/runs/o-1", "/openapi.json",
                                  "/api/no-such-endpoint"])
async def test_a_foreign_host_is_refused_before_routing(engine: fusee.Engine, path: str) -> None:
    """A DNS-rebinding page reaches the server under its own name: it reads nothing (neither the
    runs nor the UI's CSRF token)."""
    await _waiting(engine)
    async with client(engine) as c:
        r = await c.get(path, headers={"Host": "evil.example"})
        assert r.status_code == 400, r.text
        assert "o-1" not in r.text and "csrf" not in r.text
        r = await c.get(path, headers={"Host": "evil.example:8233"})
        assert r.status_code == 400
        assert (await c.get(path, headers={"Host": HOST})).status_code in (200, 404)


async def test_a_foreign_host_cannot_write_either(engine: fusee.Engine) -> None:
    async with client(engine) as c:
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "x"},
                         headers={"Host": "evil.example", "Origin": "http://evil.example"})
    assert r.status_code == 400
    assert engine.runs() == []


@pytest.mark.parametrize("host", ["127.0.0.1:8233", "localhost:8233", "[::1]:8233", "127.0.0.1", "localhost"])
async def test_the_loopback_names_are_answered_by_default(engine: fusee.Engine, host: str) -> None:
    async with client(engine) as c:
        assert (await c.get("/api/runs", headers={"Host": host})).status_code == 200


async def test_the_allowed_hosts_are_configurable(engine: fusee.Engine) -> None:
    async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app(engine, allowed_hosts=["fusee.internal", "*.ops.example"])),
            base_url="http://fusee.internal:8233") as c:
        assert (await c.get("/api/runs")).status_code == 200
        assert (await c.get("/api/runs", headers={"Host": "a.ops.example"})).status_code == 200
        assert (await c.get("/api/runs", headers={"Host": "127.0.0.1:8233"})).status_code == 400
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "acme"},
                         headers={"Origin": "http://fusee.internal:8233"})
        assert r.status_code == 201, r.text
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app(engine, allowed_hosts=["*"])),
                                 base_url="http://anything.example") as c:
        assert (await c.get("/api/runs")).status_code == 200
    with pytest.raises(ValueError, match="allowed_hosts"):
        app(engine, allowed_hosts=["bad*pattern"])
    with pytest.raises(ValueError, match="allowed_hosts"):
        app(engine, allowed_hosts="localhost")  # type: ignore[arg-type]


async def test_the_ui_refuses_a_form_from_another_site(engine: fusee.Engine) -> None:
    """Through the app: the form carries the page's CSRF token, yet another site (or a sandboxed
    frame) posted it."""
    before = await _waiting(engine)
    async with client(engine) as c:
        page = (await c.get("/ui/runs/o-1")).text
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None
        fields = {"csrf": found.group(1), "name": "approve", "value": "true"}
        for headers in ({"Origin": EVIL}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
                        {"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-site"},
                        {"Referer": f"{EVIL}/page.html"}):
            r = await c.post("/ui/action/signal/o-1", data=fields, headers=headers)
            assert r.status_code == 403, (headers, r.text)
        assert sum(engine._log._appended) == before
        r = await c.post("/ui/action/signal/o-1", data=fields, headers=SAME)
        assert r.status_code == 303, r.text
    assert await engine.get("o-1").result() == "shipped"


async def test_no_answer_grants_cross_origin_reads(engine: fusee.Engine) -> None:
    """The UI's pages hold the CSRF token: no answer lets another origin's script read them."""
    await _waiting(engine)
    async with client(engine) as c:
        for path in ("/ui/", "/ui/runs/o-1", "/api/runs", "/api/runs/o-1", "/openapi.json"):
            r = await c.get(path, headers={"Origin": EVIL})
            assert not any(h.startswith("access-control-") for h in r.headers), (path, r.headers)
            r = await c.options(path, headers={"Origin": EVIL, "Access-Control-Request-Method": "POST",
                                               "Access-Control-Request-Headers": "content-type"})
            assert not any(h.startswith("access-control-") for h in r.headers), (path, r.headers)


class Body:
    """A request body streamed in chunks, counting what the server consumed."""

    def __init__(self, total: int, chunk: int = 64 << 10) -> None:
        self.total = total
        self.chunk = chunk
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.sent < self.total:
            n = min(self.chunk, self.total - self.sent)
            self.sent += n
            yield b" " * n


@pytest.mark.parametrize("path", ["/api/runs", "/api/runs/o-1/signal", "/ui/action/signal/o-1"])
@pytest.mark.parametrize("declared", [True, False])
async def test_a_32_mib_body_is_refused_without_being_read_whole(
        engine: fusee.Engine, path: str, declared: bool) -> None:
    before = await _waiting(engine)
    body = Body(32 << 20)
    headers = {"Content-Type": "application/json" if path.startswith("/api") else
               "application/x-www-form-urlencoded"}
    if declared:
        headers["Content-Length"] = str(body.total)  # else it is sent chunked, its size unknown
    async with client(engine) as c:
        r = await c.post(path, content=body, headers=headers)
    assert r.status_code == 413, r.text
    if declared:
        assert r.json()["error"]["type"] == "RequestTooLarge"
        assert body.sent <= body.chunk  # refused on its Content-Length, before reading
    elif path.startswith("/api"):
        assert r.json()["error"]["type"] == "RequestTooLarge"
        assert body.sent <= fusee.http.DEFAULT_MAX_BODY + body.chunk  # it stopped reading at the limit
    else:
        assert "at most" in r.text
        assert body.sent <= MAX_FORM + body.chunk  # the UI takes smaller forms
    assert sum(engine._log._appended) == before


async def test_the_body_limit_is_configurable(engine: fusee.Engine) -> None:
    async with client(engine, max_body=1024) as c:
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "x" * 2000})
        assert r.status_code == 413, r.text
        assert "1024" in r.json()["error"]["message"]
        r = await c.post("/api/runs", json={"workflow": "order", "workflow_id": "o-1", "input": "x" * 500})
        assert r.status_code == 201, r.text
    with pytest.raises(ValueError, match="max_body"):
        app(engine, max_body=0)
