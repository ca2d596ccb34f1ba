"""Who is asking: per-person tokens and the host's own check, named in the audit."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import HTTPConnection

import fusee
from fusee.http import app
from fusee.http.serve import read_tokens
from tests.helpers import until

sys.path.insert(0, str(Path(__file__).parent))
import ops_app

PEOPLE = {"ada": "tok-ada-1", "grace": "tok-grace-2"}


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[fusee.Engine]:
    async with fusee.Engine.open(tmp_path / "e", workflows=ops_app.WORKFLOWS) as e:
        yield e


def client(asgi: Any, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://127.0.0.1:8233", **kw)


def audit(engine: fusee.Engine, wid: str) -> list[tuple[str, str | None]]:
    return [(a.action, a.by) for a in engine.describe(wid).audit]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_each_person_signs_in_with_their_token_and_the_audit_names_them(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    await engine.start(ops_app.order, "o-2", "zed")
    async with client(app(engine, tokens=PEOPLE)) as c:
        assert (await c.get("/api/runs")).status_code == 401
        assert (await c.get("/api/runs", headers=bearer("tok-nobody"))).status_code == 401
        assert (await c.get("/api/runs", headers=bearer(PEOPLE["ada"]))).status_code == 200

        r = await c.post("/api/runs/o-1/signal", json={"name": "approve", "value": True},
                         headers=bearer(PEOPLE["ada"]))
        assert r.status_code == 200, r.text
        # A person cannot record someone else's name: the audit is who signed in.
        r = await c.post("/api/runs/o-2/cancel", json={"reason": "dup", "by": "ada"},
                         headers=bearer(PEOPLE["grace"]))
        assert r.status_code == 403 and r.json()["error"]["field"] == "by"
        assert "grace" in r.json()["error"]["message"]
        assert audit(engine, "o-2") == []
        r = await c.post("/api/runs/o-2/cancel", json={"reason": "dup", "by": "grace"},
                         headers=bearer(PEOPLE["grace"]))
        assert r.status_code == 200, r.text
    assert await engine.get("o-1").result() == "shipped"
    assert audit(engine, "o-1") == [("signal", "ada")]
    assert audit(engine, "o-2") == [("cancel", "grace")]


async def test_a_shared_token_beside_personal_ones_keeps_naming_itself_by(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    async with client(app(engine, token="shared-1", tokens=PEOPLE)) as c:
        r = await c.post("/api/runs/o-1/signal", json={"name": "approve", "value": True, "by": "deploy-bot"},
                         headers=bearer("shared-1"))
        assert r.status_code == 200, r.text
    await engine.get("o-1").result()
    assert audit(engine, "o-1") == [("signal", "deploy-bot")]


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_the_hosts_own_check_decides_and_names_the_person(engine: fusee.Engine, asynchronous: bool) -> None:
    # As behind a proxy that signs people in: it passes their name in a header only it can set.
    def check(conn: HTTPConnection) -> str | None:
        if conn.headers.get("x-proxy-secret") != "p":
            return None
        return conn.headers.get("x-user") or None

    async def check_async(conn: HTTPConnection) -> str | None:
        return check(conn)

    await engine.start(ops_app.order, "o-1", "acme")
    async with client(app(engine, authenticate=check_async if asynchronous else check)) as c:
        r = await c.get("/api/runs", headers={"x-user": "ada"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "Unauthorized"
        assert (await c.get("/healthz")).status_code == 200  # probes carry no credentials
        r = await c.post("/api/runs/o-1/signal", json={"name": "approve", "value": True},
                         headers={"x-proxy-secret": "p", "x-user": "linus"})
        assert r.status_code == 200, r.text
    await engine.get("o-1").result()
    assert audit(engine, "o-1") == [("signal", "linus")]


async def test_the_web_ui_names_the_person_whose_cookie_it_carries(engine: fusee.Engine) -> None:
    await engine.start(ops_app.order, "o-1", "acme")
    await until(lambda: engine.describe("o-1").status == "running")
    async with client(app(engine, tokens=PEOPLE), follow_redirects=False) as c:
        # Opening a page once with ?token= sets the cookie; later requests carry it.
        r = await c.get(f"/ui/runs/o-1?token={PEOPLE['grace']}")
        assert r.status_code == 200
        assert r.headers["set-cookie"].startswith(f"fusee_token={PEOPLE['grace']};")
        found = re.search(r'name="csrf" value="([^"]+)"', r.text)
        assert found is not None
        r = await c.post("/ui/action/signal/o-1", data={"csrf": found.group(1), "name": "approve", "value": "true"},
                         headers={"Origin": "http://127.0.0.1:8233"})
        assert r.status_code == 303, r.text
    await engine.get("o-1").result()
    assert audit(engine, "o-1") == [("signal", "grace")]


async def test_bad_token_tables_are_refused_with_what_is_wrong(engine: fusee.Engine) -> None:
    with pytest.raises(ValueError, match="a token of their own"):
        app(engine, tokens={"ada": "same", "grace": "same"})
    with pytest.raises(ValueError, match="a token of their own"):
        app(engine, token="same", tokens={"ada": "same"})
    with pytest.raises(ValueError, match="non-empty"):
        app(engine, tokens={"": "x"})
    with pytest.raises(ValueError, match="ada"):
        app(engine, tokens={"ada": ""})
    with pytest.raises(TypeError, match="map each person"):
        app(engine, tokens=["tok"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        app(engine, authenticate="yes")  # type: ignore[arg-type]


def test_a_tokens_file_is_toml_and_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text('[tokens]\nada = "tok-ada-1"\ngrace = "tok-grace-2"\n')
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_tokens(str(path))
    os.chmod(path, 0o600)
    assert read_tokens(str(path)) == PEOPLE
    path.write_text('[tokens]\nada = 1\n')
    with pytest.raises(ValueError, match="must be a string"):
        read_tokens(str(path))
    path.write_text('tokens = [\n')
    with pytest.raises(ValueError, match="not valid TOML"):
        read_tokens(str(path))
    path.write_text('[people]\nada = "x"\n')
    with pytest.raises(ValueError, match=r"\[tokens\] table"):
        read_tokens(str(path))
    with pytest.raises(ValueError, match="does not exist"):
        read_tokens(str(tmp_path / "missing.toml"))


async def _ui_form_token(c: httpx.AsyncClient, wid: str, headers: dict[str, str] | None = None) -> str:
    r = await c.get(f"/ui/runs/{wid}", headers=headers)
    assert r.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', r.text)
    assert found is not None
    return found.group(1)


async def test_ui_form_tokens_signed_with_a_shared_secret_act_through_another_worker(
        engine: fusee.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two apps stand for two workers of one server (or one before and after a restart).
    secret = "a-secret-every-worker-shares"
    await engine.start(ops_app.order, "o-1", "acme")
    await until(lambda: engine.describe("o-1").status == "running")
    origin = {"Origin": "http://127.0.0.1:8233"}
    form = {"name": "approve", "value": "true"}
    async with client(app(engine, secret=secret)) as first:
        minted = await _ui_form_token(first, "o-1")
    async with client(app(engine)) as stranger:
        r = await stranger.post("/ui/action/signal/o-1", data={**form, "csrf": minted}, headers=origin)
        assert r.status_code == 403 and "or it restarted" in r.text
    async with client(app(engine, tokens=PEOPLE, secret=secret)) as other:
        # A token handed to nobody in particular does not let ada act.
        r = await other.post("/ui/action/signal/o-1", data={**form, "csrf": minted},
                             headers={**origin, **bearer(PEOPLE["ada"])})
        assert r.status_code == 403 and "someone else" in r.text
        adas = await _ui_form_token(other, "o-1", bearer(PEOPLE["ada"]))
        r = await other.post("/ui/action/signal/o-1", data={**form, "csrf": adas},
                             headers={**origin, **bearer(PEOPLE["grace"])})
        assert r.status_code == 403 and "someone else" in r.text
        monkeypatch.setattr("fusee.ui.csrf.MAX_AGE", -1)
        r = await other.post("/ui/action/signal/o-1", data={**form, "csrf": adas},
                             headers={**origin, **bearer(PEOPLE["ada"])})
        assert r.status_code == 403 and "expired" in r.text
        monkeypatch.undo()
        assert audit(engine, "o-1") == []
    async with client(app(engine, tokens=PEOPLE, secret=secret), follow_redirects=False) as restarted:
        r = await restarted.post("/ui/action/signal/o-1", data={**form, "csrf": adas},
                                 headers={**origin, **bearer(PEOPLE["ada"])})
        assert r.status_code == 303, r.text
    await engine.get("o-1").result()
    assert audit(engine, "o-1") == [("signal", "ada")]


def test_a_secret_too_short_to_sign_with_is_refused(tmp_path: Path) -> None:
    from fusee.http.serve import read_secret

    path = tmp_path / "secret"
    path.write_text("short\n")
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match="at least 16"):
        read_secret(str(path))
    path.write_text("x" * 32 + "\n")
    assert read_secret(str(path)) == b"x" * 32
    os.chmod(path, 0o640)
    with pytest.raises(ValueError, match="chmod 600"):
        read_secret(str(path))
