"""A throwaway PostgreSQL cluster for the PostgreSQL backend's tests, and a database per test.

The cluster (Debian's ``initdb``/``pg_ctl``, server defaults: fsync and
synchronous_commit on) listens on a Unix socket in a temp directory only, and
is stopped at the end of the session. As root, the server runs as the
``postgres`` user (PostgreSQL refuses root). Without a server: the tests skip
with the reason, or fail when ``FUSEE_REQUIRE_POSTGRES=1`` (CI).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REQUIRE = os.environ.get("FUSEE_REQUIRE_POSTGRES") == "1"
_numbers = itertools.count()


def _pg_bin() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"FUSEE_REQUIRE_POSTGRES=1 but no PostgreSQL server could be started: {reason}")
    pytest.skip(f"no PostgreSQL server: {reason} (apt-get install postgresql)")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[str]:
    """The DSN prefix of a running throwaway cluster: append a database name."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install 'fusee[postgres]')")
    bindir = _pg_bin()
    if bindir is None:
        _unavailable("initdb is neither on PATH nor under /usr/lib/postgresql/*/bin")
    assert bindir is not None
    base = Path(tempfile.mkdtemp(prefix="fusee-pg-"))  # short: a socket path has ~100 bytes
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        if runuser is None:
            shutil.rmtree(base, ignore_errors=True)
            _unavailable("running as root and runuser is missing (the server cannot run as root)")
        for p in (base, sock):
            shutil.chown(p, "postgres")
        prefix = [str(runuser), "-u", "postgres", "--"]
    started = False
    try:
        try:
            subprocess.run([*prefix, str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                            "-U", "postgres", "--no-sync"], check=True, capture_output=True,
                           timeout=120)
            subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-t", "60",
                            "-l", str(base / "server.log"), "-o",
                            f"-k {sock} -c listen_addresses=''", "start"],
                           check=True, capture_output=True, timeout=120)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            err = getattr(e, "stderr", b"") or b""
            log = base / "server.log"
            tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
            _unavailable(f"{e}: {err.decode(errors='replace')[-500:]} {tail}")
        started = True
        yield f"postgresql://postgres@/{{db}}?host={sock}"
    finally:
        if started:
            subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                            "stop"], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_dsn(pg_cluster: str) -> Iterator[str]:
    """A DSN of a new, empty database on the throwaway cluster (dropped after the test)."""
    import psycopg

    name = f"t{os.getpid()}_{next(_numbers)}"
    admin = pg_cluster.format(db="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_cluster.format(db=name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
