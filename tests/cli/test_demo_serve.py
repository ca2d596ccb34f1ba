"""``fusee serve`` on the demo's workflows shows them in the web UI (a real subprocess)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
FUSEE = str(Path(sys.executable).with_name("fusee"))


def test_fusee_serve_on_the_demo_shows_its_runs_in_the_ui(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FUSEE_DEMO_DIR": str(tmp_path / "demo-data")}
    env.pop("FUSEE_TOKEN", None)
    proc = subprocess.Popen([FUSEE, "serve", "demo:make_engine", "--port", str(port), "--log-level", "warning"],
                            cwd=ROOT / "examples", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{url}/api/metrics", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "fusee serve did not answer"
            time.sleep(0.05)
        r = httpx.post(f"{url}/api/runs", json={"workflow": "order", "workflow_id": "order-7", "input": "kettle"},
                       timeout=30)
        assert r.status_code in (200, 201), r.text
        page = httpx.get(f"{url}/ui/", timeout=30, follow_redirects=True)
        assert page.status_code == 200
        assert "order-7" in page.text and "order" in page.text
        run = httpx.get(f"{url}/ui/runs/order-7", timeout=30, follow_redirects=True)
        assert run.status_code == 200 and "quote" in run.text
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
