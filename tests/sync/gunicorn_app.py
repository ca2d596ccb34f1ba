"""A Flask app on SyncEngine for gunicorn's sync workers: ``gunicorn tests.sync.gunicorn_app:app``.

The engine directory is ``$FUSEE_TEST_DIR/engine``. Every worker opens it at
import (without ``--preload``: one worker owns it, the others follow and route
their calls to it); with ``--preload`` the master opens it before the fork and a
worker's first call raises ``fusee.EngineForked``. The ``/lazy`` routes use an engine
opened at first use in each process (docs/hosts.md): after the fork, in the worker.
"""

from __future__ import annotations

import os
import threading
import time

from flask import Flask, jsonify

import fusee
from tests.sync.hosts_app import approve, order

DIR = os.environ["FUSEE_TEST_DIR"]
engine = fusee.SyncEngine.open(os.path.join(DIR, "engine"), workflows=[order])
app = Flask(__name__)
_lazy: dict[int, fusee.SyncEngine] = {}
_opening = threading.Lock()


def lazy_engine() -> fusee.SyncEngine:
    """This process's own engine, opened at its first use."""
    with _opening:
        if os.getpid() not in _lazy:
            _lazy[os.getpid()] = fusee.SyncEngine.open(os.path.join(DIR, "engine"), workflows=[order])
        return _lazy[os.getpid()]


@app.post("/lazy/orders/<oid>/approve/<who>")
def lazy_start_and_approve(oid: str, who: str) -> object:
    e = lazy_engine()
    h = e.start(order, oid, oid, if_running="attach", if_finished="attach")
    h.signal(approve, who, dedup_key=f"approve-{oid}")
    return jsonify(result=h.result(timeout=30), worker_is_owner=e.is_owner)


@app.post("/orders/<oid>")
def start(oid: str) -> object:
    h = engine.start(order, oid, oid, if_running="attach", if_finished="attach")
    return jsonify(workflow_id=h.workflow_id)


@app.post("/orders/<oid>/approve/<who>")
def approve_order(oid: str, who: str) -> object:
    engine.signal(oid, approve, who, dedup_key=f"approve-{oid}")
    return jsonify(ok=True)


@app.get("/orders/<oid>")
def show(oid: str) -> object:
    try:
        summary = engine.describe(oid)
    except fusee.NotFound:
        return jsonify(error="not found"), 404
    result = engine.get(oid).result(timeout=30) if summary.status == "ok" else None
    return jsonify(status=summary.status, result=result)


@app.post("/hold")
def hold() -> object:
    """Keeps this worker busy (so alive) until ``$FUSEE_TEST_DIR/release`` exists."""
    with open(os.path.join(DIR, "held.pid"), "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(os.path.join(DIR, "release")):
        time.sleep(0.01)  # the app's own wait, ended by the test
    return jsonify(ok=True)
