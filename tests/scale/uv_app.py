"""The demo's order workflow behind a tiny Starlette app, for ``uvicorn --workers N``.

Every worker process opens the same directory, or PostgreSQL DSN (``FUSEE_SCALE_DIR``):
one owns it, the others follow and route their calls to it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import fusee

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import approve, order, stage

STATE: dict[str, Any] = {}


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    target = os.environ["FUSEE_SCALE_DIR"]
    # On PostgreSQL (a DSN), a short lease keeps the test's failover short.
    extra: dict[str, Any] = {"lease_ttl": 1.0} if target.startswith("postgresql://") else {}
    async with fusee.Engine.open(target, workflows=[order], **extra) as engine:
        STATE["engine"] = engine
        yield


def engine() -> fusee.Engine:
    e: fusee.Engine = STATE["engine"]
    return e


def me(**kw: Any) -> JSONResponse:
    return JSONResponse({"pid": os.getpid(), "owner": engine().is_owner, **kw})


async def who(request: Request) -> JSONResponse:
    return me()


async def start(request: Request) -> JSONResponse:
    oid = request.path_params["oid"]
    await engine().start(order, oid, f"item {oid}", if_running="attach")
    return me(started=oid)


async def get_stage(request: Request) -> JSONResponse:
    return me(stage=await engine().query(request.path_params["oid"], stage))


async def do_approve(request: Request) -> JSONResponse:
    await engine().signal(request.path_params["oid"], approve, True)
    return me()


async def result(request: Request) -> JSONResponse:
    return me(result=await engine().get(request.path_params["oid"]).result())


app = Starlette(lifespan=lifespan, routes=[
    Route("/who", who),
    Route("/orders/{oid}", start, methods=["POST"]),
    Route("/orders/{oid}", result, methods=["GET"]),
    Route("/orders/{oid}/stage", get_stage),
    Route("/orders/{oid}/approve", do_approve, methods=["POST"]),
])
