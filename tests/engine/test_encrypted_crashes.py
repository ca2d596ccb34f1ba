"""An encrypted engine SIGKILLed mid-run, reopened with rotated keys: results intact, nothing in clear."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import finish, ledger, wait_for

APP = Path(__file__).with_name("encrypted_app.py")
ROOT = Path(__file__).resolve().parents[2]


def start(d: Path, current: str, keys: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), str(d), current, keys],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def plaintext_files(d: Path) -> list[str]:
    return sorted(
        str(Path(root, n).relative_to(d))
        for root, _, names in os.walk(d) for n in names
        if n != "ledger.txt" and b"CONFIDENTIAL" in Path(root, n).read_bytes()
    )


def expected(n: int) -> dict[str, Any]:
    return {
        "result": {"n": n, "parts": [f"CONFIDENTIAL-part-{n}-{i}" for i in range(8)],
                   "note": f"CONFIDENTIAL-result-{n}"},
        "chunks": [f"CONFIDENTIAL-chunk-{n}-{i}" for i in range(8)],
    }


def test_sigkill_then_rotated_keys(tmp_path: Path) -> None:
    p = start(tmp_path, "k1", "k1")
    wait_for(lambda: len(ledger(tmp_path)) >= 60, p)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    killed_at = len(ledger(tmp_path))
    assert killed_at < 240, "every run finished before the kill: make them longer"
    assert not plaintext_files(tmp_path)

    # A codec without k1 cannot read what k1 wrote: a typed error naming it, nothing changed.
    p = start(tmp_path, "k2", "k2")
    _out, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "MissingKey" in err and "'k1'" in err

    # Rotated: new payloads use k2, what k1 wrote stays readable.
    out = finish(start(tmp_path, "k2", "k1,k2"))
    assert out == [expected(n) for n in range(30)]
    assert not plaintext_files(tmp_path)
    done = [line for line in ledger(tmp_path) if line.startswith("done")]
    assert len(set(done)) == 240
    assert finish(start(tmp_path, "k2", "k1,k2")) == [expected(n) for n in range(30)]
