"""A Flask app on SyncEngine served by waitress with several threads (a real WSGI server).

Usage: python flask_app.py DIR — prints ``{"port": N}`` once it listens.
"""

from __future__ import annotations

import atexit
import json
import os
import sys

from flask import Flask, jsonify

DIR = sys.argv[1]
os.environ.setdefault("FUSEE_TEST_LEDGER", os.path.join(DIR, "ledger.txt"))
sys.path.insert(0, os.path.dirname(__file__))

import waitress  # noqa: E402
from hosts_app import approve, order  # noqa: E402

import fusee  # noqa: E402

engine = fusee.SyncEngine.open(os.path.join(DIR, "engine"), workflows=[order])
atexit.register(engine.close)
app = Flask(__name__)


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


if __name__ == "__main__":
    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=8)
    print(json.dumps({"port": server.effective_port}), flush=True)
    server.run()
