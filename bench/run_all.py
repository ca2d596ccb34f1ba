"""Runs every benchmark, Fusee, DBOS and Restate side by side, and writes the report.

    .venv/bin/python bench/run_all.py [--quick] [--no-dbos] [--no-postgres] [--no-pg-backend] [--no-restate]
                                      [sizes...]

1. the floor of the disk (``floor.py``);
2. each Fusee workload in a fresh process (``workloads_fusee.py``);
3. DBOS Transact on SQLite and, when a PostgreSQL installation is found, on a
   throwaway local cluster (``workloads_dbos.py`` inside ``bench/.venv-dbos``,
   which this script creates with ``pip install dbos matplotlib``), and Fusee's
   own PostgreSQL backend on the same cluster (``workloads_pg.py``;
   ``--no-pg-backend`` skips it);
4. Restate: the ``@restatedev/restate-server`` npm package installed into
   ``bench/.restate`` (``npm install --prefix``, never globally) and the
   ``restate-sdk`` Python SDK in ``bench/.venv-restate``; ``workloads_restate.py``
   starts the server and the service, runs the workloads and stops them;
5. a markdown table with the fusee/DBOS/Restate ratios and the issue's targets,
   written to ``bench/results/latest.md`` (``latest.json`` too), and a plot of
   the step latency distributions in ``bench/results/step_latency.png``.

A workload that fails is reported as failed in the table; the others still run.
Every data directory lives under ``bench/results/tmp/`` (the disk measured by
the floor) and is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

try:
    from fusee.storage.flush_modes import DEFAULT as FLUSH_DEFAULT
except ImportError:  # ``--plot`` runs in the DBOS or Restate environment, which has no fusee
    FLUSH_DEFAULT = "inline"

DBOS_VENV = common.BENCH_DIR / ".venv-dbos"
DBOS_PY = DBOS_VENV / "bin" / "python"
PLOT_NAME = "step_latency.png"
FUSEE_WORKLOADS = ["chain", "fanout", "users", "start", "signals", "timers", "wakes", "soak", "scale", "recovery",
                   "list", "stream", "codec"]
#: Engine options per workload (disclosed in the report): the defaults, except
#: that the scale workload parks runs after 1 s so that RSS is read with them
#: parked, and the soak forgets finished workflows after 30 s (with the default,
#: forever, every one of its 1.2 M workflows is kept by design and memory must
#: grow; the soak looks for leaks). (The step functions are ``async def``:
#: ``inline_sync_steps`` would change nothing for them.)
FUSEE_OPTIONS: dict[str, list[str]] = {
    "*": [],
    "scale": ["--engine-opt=park_after=1"],
    "soak": ["--engine-opt=retention=30"],
    "list": ["--engine-opt=park_after=1"],
}
DBOS_WORKLOADS = ["chain", "fanout", "start", "signals", "timers"]
RESTATE_DIR = common.BENCH_DIR / ".restate"
RESTATE_VENV = common.BENCH_DIR / ".venv-restate"
RESTATE_PY = RESTATE_VENV / "bin" / "python"
RESTATE_WORKLOADS = ["chain", "fanout", "start", "signals", "timers"]
#: The npm package of the server and the Python packages of the service side.
RESTATE_NPM_PACKAGE = "@restatedev/restate-server"
#: (matplotlib too, so that the plot can be drawn without the DBOS environment.)
RESTATE_PIP_PACKAGES = ["restate-sdk[client]", "hypercorn", "matplotlib"]
#: The flush modes measured beside the default (``Engine.open(flush=...)``), on these workloads.
FLUSH_MODES = ["inline", "pipeline", "background"]
FLUSH_WORKLOADS = ["chain", "fanout", "users"]
#: Workloads of ``workloads_keyed.py`` (keyed objects and step limits, issue 12).
KEYED_WORKLOADS = ["objects", "limits"]
#: Flow control workloads (issue 12), run by ``workloads_flow.py``.
FLOW_WORKLOADS = ["schedules", "enqueue"]


def log(message: str) -> None:
    """Progress on stderr, so stdout stays the report."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_script(cmd: list[str], label: str, timeout: float) -> list[dict[str, Any]]:
    """Runs a workload script; its marked results, or one failure entry naming why."""
    log(f"{label}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=common.REPO_DIR)
    except subprocess.TimeoutExpired:
        log(f"{label}: timed out after {timeout:.0f} s")
        return [{"error": f"timed out after {timeout:.0f} s"}]
    results = common.parse_results(proc.stdout)
    if proc.returncode != 0 or not results:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        log(f"{label}: failed (exit {proc.returncode}): {tail}")
        sys.stderr.write(proc.stderr[-3000:])
        return [*results, {"error": f"exit {proc.returncode}: {tail}"}]
    log(f"{label}: done in {time.perf_counter() - t0:.1f} s")
    return results


# --- DBOS's environment and PostgreSQL ------------------------------------------


def ensure_dbos_venv() -> bool:
    """Creates ``bench/.venv-dbos`` with dbos and matplotlib unless it already works."""
    probe = [str(DBOS_PY), "-c", "import dbos, matplotlib"]
    if DBOS_PY.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return True
    log("creating bench/.venv-dbos (python3 -m venv; pip install dbos matplotlib)")
    base = shutil.which("python3") or sys.executable
    steps = [[base, "-m", "venv", str(DBOS_VENV)],
             [str(DBOS_PY), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "dbos", "matplotlib"]]
    for step in steps:
        if subprocess.run(step).returncode != 0:
            log(f"could not set up the DBOS environment ({' '.join(step)})")
            return False
    # Keep the environment out of git and linters, as Python >= 3.13 venvs do.
    (DBOS_VENV / ".gitignore").write_text("*\n")
    return subprocess.run(probe, capture_output=True).returncode == 0


def ensure_restate() -> bool:
    """Installs restate-server into ``bench/.restate`` and the SDK into ``bench/.venv-restate``.

    Reuses both when they already work. False (with the reason logged) when npm
    is missing or an install fails: Restate's columns then stay empty.
    """
    binaries = sorted(RESTATE_DIR.glob("node_modules/@restatedev/restate-server-*/bin/"
                                       "restate-server"))
    if not binaries:
        npm = shutil.which("npm")
        if npm is None:
            log("Restate: npm not found; skipping Restate (install Node.js and npm to add it)")
            return False
        log(f"installing {RESTATE_NPM_PACKAGE} into bench/.restate (npm install --prefix)")
        RESTATE_DIR.mkdir(parents=True, exist_ok=True)
        # Keep the install out of git and linters, as the venvs do.
        (RESTATE_DIR / ".gitignore").write_text("*\n")
        # --ignore-scripts: the server binary comes in a platform package and needs
        # no install script (the only one in the tree is an analytics ping).
        cmd = [npm, "install", "--prefix", str(RESTATE_DIR), "--no-audit", "--no-fund",
               "--ignore-scripts", "--loglevel=error", RESTATE_NPM_PACKAGE]
        if subprocess.run(cmd).returncode != 0:
            log(f"Restate: could not install the server ({' '.join(cmd[1:])}); skipping Restate")
            return False
        binaries = sorted(RESTATE_DIR.glob("node_modules/@restatedev/restate-server-*/bin/"
                                           "restate-server"))
        if not binaries:
            log("Restate: the npm package brought no server binary for this platform; "
                "skipping Restate")
            return False
    probe = [str(RESTATE_PY), "-c", "import restate, httpx, hypercorn, matplotlib"]
    if RESTATE_PY.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return True
    log("creating bench/.venv-restate (python3 -m venv; pip install "
        + " ".join(RESTATE_PIP_PACKAGES) + ")")
    base = shutil.which("python3") or sys.executable
    steps = [[base, "-m", "venv", str(RESTATE_VENV)],
             [str(RESTATE_PY), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              *RESTATE_PIP_PACKAGES]]
    for step in steps:
        if subprocess.run(step).returncode != 0:
            log(f"Restate: could not set up its environment ({' '.join(step)}); skipping Restate")
            return False
    (RESTATE_VENV / ".gitignore").write_text("*\n")
    return subprocess.run(probe, capture_output=True).returncode == 0


def _pg_bin() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


@contextlib.contextmanager
def local_postgres(parent: Path) -> Iterator[str | None]:
    """A throwaway PostgreSQL cluster on loopback in a directory under ``parent``, or None.

    Server defaults throughout (fsync and synchronous_commit on); only the
    port, socket directory and listen address are set. Runs as the
    ``postgres`` user when this process is root (PostgreSQL refuses root).
    """
    bindir = _pg_bin()
    if bindir is None:
        print("PostgreSQL: not available", file=sys.stderr)
        yield None
        return
    base = Path(tempfile.mkdtemp(prefix="pg-", dir=parent))
    data, sockets = base / "data", base / "sock"
    sockets.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        if runuser is None:
            print("PostgreSQL: not available (root, and no runuser)", file=sys.stderr)
            yield None
            return
        shutil.chown(base, "postgres")
        shutil.chown(sockets, "postgres")
        prefix = [runuser, "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = False
    try:
        subprocess.run([*prefix, str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", "postgres", "--no-sync"], check=True, capture_output=True)
        subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-w",
                        "-l", str(base / "server.log"), "-o",
                        f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1", "start"],
                       check=True, capture_output=True)
        started = True
        log(f"PostgreSQL started on 127.0.0.1:{port} ({bindir})")
        yield f"postgresql://postgres@127.0.0.1:{port}/fusee_bench"
    except subprocess.CalledProcessError as exc:
        print(f"PostgreSQL: not available ({exc.stderr.decode(errors='replace')[-300:]})",
              file=sys.stderr)
        yield None
    finally:
        if started:
            subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast",
                            "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


# --- the report ----------------------------------------------------------------


def _get(results: dict[str, dict[str, Any]], system: str, workload: str,
         key: str) -> float | None:
    value = results.get(system, {}).get(workload, {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "us":
        return common.format_us(value)
    if unit == "s":
        return f"{value:.2f} s" if value < 100 else f"{value:,.0f} s"
    if unit == "bytes":
        return f"{value:,.0f} B"
    if unit == "cpu":
        return f"{value:.3f} s"
    return f"{value:,.0f}"


def _ratio(fusee: float | None, other: float | None, higher_is_better: bool) -> str:
    if fusee is None or other is None or other == 0 or fusee == 0:
        return "–"
    ratio = fusee / other
    better = ratio if higher_is_better else 1 / ratio
    if better >= 1:
        return f"{_short(ratio)} ({_short(better)}× better)"
    return f"{_short(ratio)} ({_short(1 / better)}× worse)"


def _short(x: float) -> str:
    """A ratio with as many digits as it deserves."""
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if x >= 0.01 else f"{x:.2g}"


#: (workload, key, label, unit, higher is better)
ROWS: list[tuple[str, str, str, str, bool]] = [
    ("chain", "us_per_step", "chain: time per step", "us", False),
    ("chain", "p50_us", "chain: step latency p50", "us", False),
    ("chain", "p99_us", "chain: step latency p99", "us", False),
    ("fanout", "steps_per_s", "fan-out: durable steps/s", "n", True),
    ("fanout", "workflows_per_s", "fan-out: workflows/s", "n", True),
    ("fanout", "p50_us", "fan-out: workflow latency p50", "us", False),
    ("fanout", "p99_us", "fan-out: workflow latency p99", "us", False),
    ("fanout", "cpu_s_per_1000_steps", "fan-out: CPU s per 1,000 steps", "cpu", False),
    ("fanout", "server_cpu_s_per_1000_steps",
     "fan-out: server process CPU s per 1,000 steps", "cpu", False),
    ("users", "us_per_step", "as users write it: chain of sync lambdas, per step", "us", False),
    ("users", "p99_us", "as users write it: chain step latency p99", "us", False),
    ("users", "fanout_steps_per_s", "as users write it: fan-out of sync closures, steps/s", "n", True),
    ("users", "fanout_cpu_us_per_step", "as users write it: fan-out CPU per step", "us", False),
    ("start", "p50_us", "start latency p50", "us", False),
    ("start", "p99_us", "start latency p99", "us", False),
    ("signals", "p50_us", "signal → resumed p50", "us", False),
    ("signals", "p99_us", "signal → resumed p99", "us", False),
    ("signals", "per_s", "signals/s (one at a time)", "n", True),
    ("timers", "p50_us", "timer due → resumed p50", "us", False),
    ("timers", "p99_us", "timer due → resumed p99", "us", False),
    ("wakes", "wakes_per_s", "parked runs woken by a signal each, per s", "n", True),
    ("soak", "rss_growth_pct", "soak: RSS growth over continuous fan-out (retention=30 s), %", "n", False),
    ("scale", "starts_per_s", "scale: starts/s", "n", True),
    ("scale", "rss_bytes_per_run", "scale: RSS per parked run", "bytes", False),
    ("scale", "reopen_s", "scale: reopen after clean close", "s", False),
    ("recovery", "no_checkpoint_reopen_s", "recovery after SIGKILL, no checkpoint", "s", False),
    ("recovery", "with_checkpoint_reopen_s", "recovery after SIGKILL, recent checkpoint",
     "s", False),
    ("list", "list_p50_us", "list: selective attribute filter p50", "us", False),
    ("list", "list_p99_us", "list: selective attribute filter p99", "us", False),
    ("stream", "chunks_per_s", "stream: chunks/s written and read live", "n", True),
    ("stream", "p50_us", "stream: write → read p50", "us", False),
    ("stream", "p99_us", "stream: write → read p99", "us", False),
    ("codec", "us_per_step_plain", "codec: chain time per step, no codec", "us", False),
    ("codec", "us_per_step_aesgcm", "codec: chain time per step, AesGcmCodec", "us", False),
    ("codec", "cpu_us_per_step_plain", "codec: chain CPU per step, no codec", "us", False),
    ("codec", "cpu_us_per_step_aesgcm", "codec: chain CPU per step, AesGcmCodec", "us", False),
    ("codec", "payload_roundtrip_us", "codec: AES-GCM encode + decode of one payload", "us", False),
    ("objects", "exclusive_calls_per_s", "objects: exclusive calls/s (one key)", "n", True),
    ("objects", "shared_calls_per_s", "objects: shared calls/s (one key)", "n", True),
    ("limits", "permits_per_s", "limits: permits/s (limit 10, 10,000 waiting)", "n", True),
    ("limits", "cpu_us_per_permit", "limits: CPU per permit", "us", False),
    ("limits", "bytes_per_waiting_step", "limits: memory per waiting step", "bytes", False),
    ("telemetry", "baseline_cpu_us_per_step", "fan-out CPU per step, code before the telemetry hooks",
     "us", False),
    ("telemetry", "off_cpu_us_per_step", "fan-out CPU per step, telemetry off", "us", False),
    ("telemetry", "on_cpu_us_per_step", "fan-out CPU per step, OpenTelemetry SDK on", "us", False),
    ("backup", "off_chain_us_per_step", "backup: chain time per step, backup off", "us", False),
    ("backup", "on_chain_us_per_step", "backup: chain time per step, backup on (local, 1 s)", "us", False),
    ("backup", "off_fanout_steps_per_s", "backup: fan-out steps/s, backup off", "n", True),
    ("backup", "on_fanout_steps_per_s", "backup: fan-out steps/s, backup on (local, 1 s)", "n", True),
    ("backup", "lag_p50_s", "backup: lag under the fan-out p50", "s", False),
    ("backup", "lag_p99_s", "backup: lag under the fan-out p99", "s", False),
    ("schedules", "lateness_p50_us", "1,000 schedules of 1 s: fire lateness p50", "us", False),
    ("schedules", "lateness_p99_us", "1,000 schedules of 1 s: fire lateness p99", "us", False),
    ("enqueue", "events_per_s", "enqueue into 1,000 keys (100 ms debounce): events/s", "n", True),
]


def targets(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, bool | None]]:
    """Each target of issue 6: (what, measured figure, met? or None if not measured)."""
    floor = _get(results, "floor", "floor", "p50_us")
    per_step = _get(results, "fusee", "chain", "us_per_step")
    p50 = _get(results, "fusee", "chain", "p50_us")
    p99 = _get(results, "fusee", "chain", "p99_us")
    steps = _get(results, "fusee", "fanout", "steps_per_s")
    dbos_steps = _get(results, "dbos-sqlite", "fanout", "steps_per_s")
    start = _get(results, "fusee", "start", "p50_us")
    rss = _get(results, "fusee", "scale", "rss_bytes_per_run")
    reopen = _get(results, "fusee", "scale", "reopen_s")
    runs = _get(results, "fusee", "scale", "count")
    list_p99 = _get(results, "fusee", "list", "list_p99_us")
    list_runs = _get(results, "fusee", "list", "count")
    telemetry_off = _get(results, "fusee", "telemetry", "off_vs_baseline")

    out: list[tuple[str, str, bool | None]] = []

    def add(what: str, figure: str, ok: bool | None) -> None:
        out.append((what, figure, ok))

    if per_step is not None and floor:
        add("chain: µs/step ≤ 1.3 × floor p50", f"{per_step / floor:.2f} × floor",
            per_step <= 1.3 * floor)
    else:
        add("chain: µs/step ≤ 1.3 × floor p50", "not measured", None)
    if p50 and p99 is not None:
        add("chain: p99 ≤ 2 × p50", f"p99 = {p99 / p50:.2f} × p50", p99 <= 2 * p50)
    else:
        add("chain: p99 ≤ 2 × p50", "not measured", None)
    add("fan-out: ≥ 20,000 durable steps/s",
        _fmt(steps, "n") + " steps/s" if steps else "not measured",
        None if steps is None else steps >= 20_000)
    if steps and dbos_steps:
        add("fan-out: ≥ 10 × DBOS on SQLite", f"{steps / dbos_steps:.1f} ×",
            steps >= 10 * dbos_steps)
    else:
        add("fan-out: ≥ 10 × DBOS on SQLite", "not measured", None)
    if start is not None and floor:
        add("start latency p50 ≤ 3 × floor p50", f"{start / floor:.2f} × floor",
            start <= 3 * floor)
    else:
        add("start latency p50 ≤ 3 × floor p50", "not measured", None)
    add("parked run ≤ 1 KiB RSS", _fmt(rss, "bytes") if rss is not None else "not measured",
        None if rss is None else rss <= 1024)
    if reopen is not None and runs is not None:
        label = f"{reopen:.2f} s for {runs:,.0f} runs"
        add("reopen after clean close of 1,000,000 runs ≤ 5 s", label,
            reopen <= 5 if runs >= 1_000_000 else None)
    else:
        add("reopen after clean close of 1,000,000 runs ≤ 5 s", "not measured", None)
    if list_p99 is not None and list_runs is not None:
        add("list: selective attribute filter at 1,000,000 runs ≤ 50 ms",
            f"p99 {list_p99 / 1000:.2f} ms for {list_runs:,.0f} runs",
            list_p99 <= 50_000 if list_runs >= 1_000_000 else None)
    else:
        add("list: selective attribute filter at 1,000,000 runs ≤ 50 ms", "not measured", None)
    add("telemetry off: CPU per step ≤ 1.02 × the code before its hooks",
        f"{telemetry_off:.3f} ×" if telemetry_off is not None else "not measured",
        None if telemetry_off is None else telemetry_off <= 1.02)
    costs = [_get(results, "fusee", "backup", k) for k in ("chain_cost", "fanout_cost")]
    add("backup on: chain and fan-out cost ≤ 5 %",
        "chain {:+.1%}, fan-out {:+.1%}".format(*costs) if None not in costs else "not measured",
        None if None in costs else max(c for c in costs if c is not None) <= 0.05)
    return out


def _sizes_of(workloads: dict[str, dict[str, Any]]) -> str:
    """The size each workload of one system actually ran at."""
    parts = []
    for name, r in workloads.items():
        if "steps_per_workflow" in r:
            parts.append(f"{name} {r['workflows']:,}×{r['steps_per_workflow']}")
        elif "records" in r and r["records"] > 0:
            parts.append(f"{name} {r['runs']:,} runs / {r['records']:,} records")
        elif "steps" in r or "count" in r or "runs" in r:
            size = r.get("steps", r.get("count", r.get("runs")))
            limit = " (stopped at the RSS limit)" if r.get("stopped_at_rss_limit") else ""
            parts.append(f"{name} {size:,}{limit}")
    return ", ".join(parts) or "nothing ran"


def _size(results: dict[str, dict[str, Any]], system: str, workload: str) -> Any:
    """The size a system ran a workload at (steps, workflows or runs)."""
    r = results.get(system, {}).get(workload, {})
    return r.get("steps", r.get("workflows", r.get("count", r.get("runs"))))


def render(results: dict[str, dict[str, Any]], env: dict[str, str], sizes: str,
           durability: dict[str, str], plot: str | None) -> str:
    """The whole markdown report."""
    systems = [s for s in ("fusee-postgres", "dbos-sqlite", "dbos-postgres", "restate")
               if s in results]
    names = {"fusee-postgres": "Fusee (PostgreSQL)", "dbos-sqlite": "DBOS (SQLite)",
             "dbos-postgres": "DBOS (PostgreSQL)", "restate": "Restate"}
    lines = ["# Fusee benchmarks", "",
             f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}. Sizes: {sizes}.", ""]
    lines += [f"- **{k}**: {v}" for k, v in env.items()]
    lines += ["- **Fusee durability**: every acknowledged start, signal and step result is "
              "in the shared log and `fdatasync`ed before it is acknowledged or acted on "
              "(group commit; engine defaults, with `async def` step functions, `park_after=1` "
              "for the scale workload and `retention=30` for the soak)."]
    for system, text in durability.items():  # DBOS's, then Restate's
        lines.append(f"- **{names.get(system, system)} durability**: {text}")
    floor = results.get("floor", {}).get("floor", {})
    if "p50_us" in floor:
        lines += ["", f"**Floor** (pwrite {floor.get('record_size', 100)} B + fdatasync, "
                  f"preallocated file, same disk): p50 {common.format_us(floor['p50_us'])}, "
                  f"p99 {common.format_us(floor['p99_us'])}, "
                  f"{floor['ops_per_s']:,.0f} ops/s."]
    elif "error" in floor:
        lines += ["", f"**Floor**: failed ({floor['error']})."]
    after = results.get("floor", {}).get("floor_after", {})
    if "p50_us" in after:
        lines += ["", f"Floor measured again at the end: p50 {common.format_us(after['p50_us'])}, "
                  f"p99 {common.format_us(after['p99_us'])} (a large change means the disk "
                  "was busy with something else during the run)."]
    lines += ["", "Sizes as run: " + "; ".join(
        f"{names.get(s, s)}: {_sizes_of(ws)}" for s, ws in results.items()
        if s != "floor") + "."]
    header = ["measure", "fusee", *(names[s] for s in systems),
              *(f"fusee / {names[s]}" for s in systems)]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    different_sizes = False
    for workload, key, label, unit, higher in ROWS:
        if key.startswith("server_") and not any(
                _get(results, s, workload, key) is not None for s in systems):
            continue  # only a system with a server process of its own has this row
        fusee_value = _get(results, "fusee", workload, key)
        cells = [label, _fmt(fusee_value, unit)]
        if fusee_value is None and "error" in results.get("fusee", {}).get(workload, {}):
            cells[1] = "failed"
        others = [_get(results, s, workload, key) for s in systems]
        cells += [_fmt(v, unit) for v in others]
        for s, v in zip(systems, others, strict=True):
            ratio = _ratio(fusee_value, v, higher)
            if ratio != "–" and _size(results, "fusee", workload) != _size(results, s, workload):
                ratio += " †"
                different_sizes = True
            cells.append(ratio)
        lines.append("| " + " | ".join(cells) + " |")
        floor_rows = {("chain", "us_per_step"): "chain: time per step ÷ floor p50",
                      ("start", "p50_us"): "start latency p50 ÷ floor p50"}
        if (workload, key) in floor_rows and floor.get("p50_us"):
            # Each system's own ratio to the floor measured in the same run.
            ratio_cells = [floor_rows[workload, key],
                           f"{fusee_value / floor['p50_us']:.2f}" if fusee_value else "–"]
            for s in systems:
                v = _get(results, s, workload, key)
                ratio = v / floor["p50_us"] if v else None
                ratio_cells.append("–" if ratio is None
                                   else f"{ratio:.2f}" if ratio < 10 else f"{ratio:.1f}")
            ratio_cells += ["" for _ in systems]
            lines.append("| " + " | ".join(ratio_cells) + " |")
    lines += ["", "Ratios are fusee ÷ the other system; \"better\" reads the ratio the right "
              "way round (lower latency, higher throughput). Timer figures count from the step "
              "before the sleep plus its duration, so they include one durable write."]
    if "restate" in systems:
        lines += ["CPU per step counts the benchmark's own process (Fusee's engine; the DBOS "
                  "library; Restate's Python service and HTTP client); Restate's engine runs "
                  "in the restate-server process, whose CPU is the row of its own."]
    if different_sizes:
        lines += ["† the two systems ran this workload at different sizes (see above)."]
    lines += [""]
    lines += ["## Targets (issue 6)", ""]
    if sizes.startswith("quick"):
        lines += ["Quick sizes: the verdicts below are indicative only.", ""]
    lines += ["| target | measured | |", "|---|---|---|"]
    for what, figure, ok in targets(results):
        verdict = "met" if ok else ("missed" if ok is False else "not judged")
        lines.append(f"| {what} | {figure} | {verdict} |")
    lines += render_hot_path(results, floor)
    lines += render_cpython_share(results)
    lines += render_concurrent_chains(results)
    lines += render_sync_hosts(results)
    lines += render_scale(results)
    lines += render_parts(results)
    failures = [(s, w, r["error"]) for s, ws in results.items() for w, r in ws.items()
                if "error" in r]
    if failures:
        lines += ["", "## Failed workloads", ""]
        lines += [f"- {s} / {w}: {e}" for s, w, e in failures]
    if plot:
        lines += ["", f"![step latency distributions]({plot})"]
    return "\n".join(lines) + "\n"


def render_cpython_share(results: dict[str, dict[str, Any]]) -> list[str]:
    """Where a step's time goes: the disk, CPython itself, Fusee (``cpython_share.py``)."""
    share = results.get("fusee", {}).get("cpython_share", {})
    if "chain_fusee_us" not in share:
        return []
    import cpython_share

    return ["", "## Where a step's time goes", "",
            "The same chain and fan-out as a bare asyncio program that does the least a durable step "
            "needs (call, encode, append, fdatasync, resolve a future), beside Fusee, in one process "
            "on one disk (`bench/cpython_share.py`): what is left above the bare program is Fusee's; "
            "the bare program's own cost over the floor is CPython's.", "",
            cpython_share.report(share)]


def render_concurrent_chains(results: dict[str, dict[str, Any]]) -> list[str]:
    """N concurrent chains in one engine (``concurrent_chains.py``): does group commit group?"""
    cc = results.get("fusee", {}).get("concurrent_chains", {})
    if "rows" not in cc:
        return []
    lines = ["", "## N concurrent chains in one engine", "",
             f"N workflows of sequential steps (synchronous lambdas, default options) started together "
             f"on one directory (`bench/concurrent_chains.py`); floor p50 {cc['floor_p50_us']:.0f} µs. "
             "Targets (issue 23): 1 chain <= 1.3 x floor, 8 chains <= 2.0 x floor, p99 <= 2 x p50 at "
             "every N, 64 chains >= 80 % of the CPU-bound rate (1 / CPU per step).", "",
             "| chains | µs per step (÷ floor p50) | p99 / p50 | durable steps/s | CPU µs per step "
             "| records per fdatasync | of the CPU-bound rate |",
             "|---|---|---|---|---|---|---|"]
    for r in cc["rows"]:
        bound = 1e6 / r["cpu_us_per_step"] if r["cpu_us_per_step"] else 0.0
        lines.append(f"| {r['chains']} | {r['step_p50_us']:,.0f} ({r['step_p50_us'] / cc['floor_p50_us']:.2f}) "
                     f"| {r['step_p99_us'] / r['step_p50_us']:.2f} | {r['steps_per_s']:,.0f} "
                     f"| {r['cpu_us_per_step']:.1f} | {r['records_per_flush']:.2f} "
                     f"| {r['steps_per_s'] / bound * 100 if bound else 0:.0f} % |")
    return lines


def render_sync_hosts(results: dict[str, dict[str, Any]]) -> list[str]:
    """Start + result from a synchronous thread (issue 27, ``sync_hosts.py``): SyncEngine vs the async call."""
    sh = results.get("fusee", {}).get("sync_hosts", {})
    if "rows" not in sh:
        return []
    lines = ["", "## Start + result from a synchronous thread", "",
             "N callers each doing sequential `start` + `result` of a one-step workflow on one directory "
             "(`bench/sync_hosts.py`, default options): N asyncio tasks awaiting `fusee.Engine`, against N "
             "plain threads calling `fusee.SyncEngine` (each call handed to the engine's loop thread, as "
             "from a Flask or Django view).", "",
             "| callers | async p50 / p99 (µs) | sync thread p50 / p99 (µs) | sync ÷ async p50 / p99 |",
             "|---|---|---|---|"]
    for r in sh["rows"]:
        lines.append(f"| {r['callers']} | {r['async_p50_us']:,.0f} / {r['async_p99_us']:,.0f} "
                     f"| {r['sync_p50_us']:,.0f} / {r['sync_p99_us']:,.0f} "
                     f"| {r['p50_ratio']:.2f} / {r['p99_ratio']:.2f} |")
    return lines


def render_scale(results: dict[str, dict[str, Any]]) -> list[str]:
    """Several processes on one directory and on one PostgreSQL namespace (issue 16, ``workloads_scale.py``)."""
    lines = _render_scale_of(results.get("fusee", {}), "one directory",
                             "One owner process runs the workflows; followers route their calls to it over a "
                             "Unix socket and one takes over when it dies (docs/scale-out.md).")
    pg = results.get("fusee-postgres", {})
    ttl = next((r["lease_ttl_s"] for r in pg.values() if isinstance(r, dict) and "lease_ttl_s" in r), None)
    lines += _render_scale_of(pg, "one PostgreSQL namespace",
                              "The engine holding the namespace's lease runs the workflows; the others route "
                              "over TCP and one takes over once the dead owner's lease expired "
                              f"(lease_ttl={ttl} s here; docs/scale-out.md).")
    return lines


def render_parts(results: dict[str, dict[str, Any]]) -> list[str]:
    """Parts (issue 24, ``parts_scale.py``): throughput through more processes on one parted
    directory, and on one parted PostgreSQL namespace when it ran."""
    lines = _render_parts_of(results.get("fusee", {}).get("parts_fanout", {}), "one directory")
    return lines + _render_parts_of(results.get("fusee-postgres", {}).get("parts_fanout_pg", {}),
                                    "one PostgreSQL namespace, the server on the same machine")


def _render_parts_of(r: dict[str, Any], where: str) -> list[str]:
    if not r:
        return []
    lines = ["", f"## Parts ({where}, {r.get('parts')} parts)", "",
             f"A fan-out of {r.get('runs'):,} workflows x {r.get('steps')} steps started through N processes "
             "at once, each holding its share of the parts; IDs hash anywhere, so most of a process's "
             f"starts and results are routed to another (median of {r.get('trials')} trials; "
             "docs/scale-out.md#parts). Target: 2 processes >= 1.7x one, 4 no less than 2.", "",
             "| processes | durable steps/s (min-max) | x one process |", "|---|---|---|"]
    for n in (1, 2, 4):
        if f"steps_per_s_{n}" in r:
            lines.append(f"| {n} | {r[f'steps_per_s_{n}']:,.0f} ({r[f'min_{n}']:,.0f}-{r[f'max_{n}']:,.0f}) "
                         f"| {r[f'ratio_{n}']:.2f} |")
    if "error" in r:
        lines.append(f"| (failed: {r['error']}) | | |")
    return lines


def _render_scale_of(fusee: dict[str, Any], where: str, intro: str) -> list[str]:
    fail, route, fan = fusee.get("failover", {}), fusee.get("routing", {}), fusee.get("scale_fanout", {})
    if not (fail or route or fan):
        return []
    us = common.format_us
    lines = ["", f"## Scale-out ({where})", "", intro, "", "| measure | value |", "|---|---|"]
    if "p50_us" in fail:
        lines.append(f"| failover: SIGKILL of the owner → a start + result served again "
                     f"({fail.get('trials')} trials) | p50 {us(fail['p50_us'])}, p99 {us(fail['p99_us'])} |")
    if "owner_p50_us" in route:
        lines.append(f"| durable signal, to the owner / through a follower | p50 {us(route['owner_p50_us'])} / "
                     f"{us(route['follower_p50_us'])}, p99 {us(route['owner_p99_us'])} / "
                     f"{us(route['follower_p99_us'])} |")
        lines.append(f"| query, to the owner / through a follower (the routing cost alone) | p50 "
                     f"{us(route['query_owner_p50_us'])} / {us(route['query_follower_p50_us'])}, p99 "
                     f"{us(route['query_owner_p99_us'])} / {us(route['query_follower_p99_us'])} |")
    for procs in (1, 2, 4):
        value = fan.get(f"steps_per_s_{procs}")
        if value is not None:
            lines.append(f"| fan-out started through {procs} process{'es' if procs > 1 else ''}: durable "
                         f"steps/s | {value:,.0f} |")
    for procs in (1, 2, 4):
        value = fan.get(f"chain_us_{procs}")
        if value is not None:
            lines.append(f"| a chain through each of {procs} process{'es' if procs > 1 else ''} at once: "
                         f"time per step (median chain) | {us(value)} |")
    if "error" in fail or "error" in route or "error" in fan:
        lines.append("| (a scale workload failed: see below) | |")
    return lines


def render_hot_path(results: dict[str, dict[str, Any]], floor: dict[str, Any]) -> list[str]:
    """The flush modes side by side and the hot path's targets (issue 17)."""
    lines = ["", "## Flush modes", "",
             "The same workloads with `Engine.open(flush=...)` set (the default is marked).", "",
             "| measure | " + " | ".join(
                 f"{m}{' (default)' if m == FLUSH_DEFAULT else ''}" for m in FLUSH_MODES) + " |",
             "|---|" + "---|" * len(FLUSH_MODES)]
    rows = [("chain", "us_per_step", "chain: time per step", "us"),
            ("chain", "p99_us", "chain: step latency p99", "us"),
            ("users", "us_per_step", "as users write it: chain per step", "us"),
            ("fanout", "steps_per_s", "fan-out: durable steps/s", "n"),
            ("fanout", "cpu_s_per_1000_steps", "fan-out: CPU s per 1,000 steps", "cpu")]
    for workload, key, label, unit in rows:
        cells = [_fmt(_get(results, _flush_system(m), workload, key), unit) for m in FLUSH_MODES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    p50 = floor.get("p50_us")
    users = results.get("fusee", {}).get("users", {})
    fan = results.get("fusee", {}).get("fanout", {})
    start = results.get("fusee", {}).get("start", {})
    timers = results.get("fusee", {}).get("timers", {})
    wakes = results.get("fusee", {}).get("wakes", {})
    soak = results.get("fusee", {}).get("soak", {})

    def check(what: str, value: float | None, limit: float, fmt: str, higher: bool = False) -> None:
        if value is None:
            lines.append(f"| {what} | – | not judged |")
            return
        ok = value >= limit if higher else value <= limit
        lines.append(f"| {what} | {fmt.format(value)} | {'met' if ok else 'missed'} |")

    lines += ["", "## Targets (issue 17, the hot path)", "", "| target | measured | |", "|---|---|---|"]
    check("chain as users write it (sync lambdas, default options) ≤ 1.15 × floor p50",
          users.get("us_per_step") / p50 if users.get("us_per_step") and p50 else None, 1.15, "{:.2f} ×")
    check("its p99 ≤ 1.5 × its p50",
          users["p99_us"] / users["p50_us"] if users.get("p50_us") else None, 1.5, "{:.2f} ×")
    check("fan-out 2,000 × 10: ≥ 60,000 durable steps/s", fan.get("steps_per_s"), 60_000, "{:,.0f}/s",
          higher=True)
    check("fan-out: CPU ≤ 15 µs per step",
          fan["cpu_s_per_1000_steps"] * 1000 if fan.get("cpu_s_per_1000_steps") else None, 15, "{:.1f} µs")
    check("start + result p50 ≤ 2.5 × floor p50",
          start["p50_us"] / p50 if start.get("p50_us") and p50 else None, 2.5, "{:.2f} ×")
    check("10,000 sleepers: due → resumed p50 ≤ 20 ms",
          timers["p50_us"] / 1000 if timers.get("p50_us") else None, 20, "{:.1f} ms")
    check("10,000 sleepers: due → resumed p99 ≤ 100 ms",
          timers["p99_us"] / 1000 if timers.get("p99_us") else None, 100, "{:.1f} ms")
    check("parked runs woken by a signal each: ≥ 20,000 wakes/s", wakes.get("wakes_per_s"), 20_000,
          "{:,.0f}/s", higher=True)
    check("soak of continuous fan-out (retention=30 s): RSS growth ≤ 5 %", soak.get("rss_growth_pct"), 5.0,
          "{:.1f} %")
    return lines


def _flush_system(mode: str) -> str:
    return "fusee" if mode == FLUSH_DEFAULT else f"fusee-flush-{mode}"


def plot_main(results_path: Path, png_path: Path) -> int:
    """``run_all.py --plot RESULTS PNG``: the CDF of step latencies (needs matplotlib)."""
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    samples: dict[str, list[float]] = json.loads(results_path.read_text())
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    # One colour per system whatever is missing, so plots of different runs compare.
    colours = ["tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:purple"]
    for colour, (label, values) in zip(colours, samples.items(), strict=False):
        if not values:
            continue
        ordered = sorted(values)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label,
                color=colour)
    ax.set_xscale("log")
    ax.set_xlabel("latency per sequential step (µs, log scale)")
    ax.set_ylabel("fraction of steps ≤ x")
    ax.set_title("Sequential step latency: Fusee vs DBOS vs Restate vs the disk floor")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs everything and writes the report (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--no-dbos", action="store_true", help="skip DBOS entirely")
    parser.add_argument("--no-postgres", action="store_true", help="skip DBOS on PostgreSQL")
    parser.add_argument("--no-pg-backend", action="store_true",
                        help="skip Fusee on PostgreSQL (Engine.open('postgresql://...'))")
    parser.add_argument("--no-restate", action="store_true", help="skip Restate entirely")
    parser.add_argument("--no-scale", action="store_true",
                        help="skip the scale-out section (several processes on one directory)")
    parser.add_argument("--no-flush-modes", action="store_true",
                        help="skip the runs of the other flush modes")
    parser.add_argument("--fusee", default=",".join(FUSEE_WORKLOADS),
                        help="Fusee workloads to run (comma-separated)")
    parser.add_argument("--dbos", default=",".join(DBOS_WORKLOADS),
                        help="DBOS workloads to run (comma-separated)")
    parser.add_argument("--restate", default=",".join(RESTATE_WORKLOADS),
                        help="Restate workloads to run (comma-separated)")
    parser.add_argument("--flow", default=",".join(FLOW_WORKLOADS),
                        help="flow control workloads to run (comma-separated)")
    parser.add_argument("--schedule-seconds", type=float, default=None,
                        help="how long the 1,000 schedules fire (default 60 s, 5 s with --quick)")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds before one workload script is abandoned")
    parser.add_argument("--plot", nargs=2, type=Path, metavar=("SAMPLES", "PNG"),
                        help=argparse.SUPPRESS)
    sizes = ["chain", "fanout", "starts", "signals", "timers", "scale", "recovery-runs", "list-runs"]
    for name in sizes:
        parser.add_argument(f"--{name}", type=int, help=f"size for the {name} workload")
    args = parser.parse_args(argv)
    if args.plot:
        return plot_main(*args.plot)

    size_flags: list[str] = []
    for name in sizes:
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            size_flags += [f"--{name}", str(value)]
    # Sizes the DBOS side takes (it has no scale/recovery workloads).
    dbos_flags = [f for pair in zip(size_flags[::2], size_flags[1::2], strict=True)
                  if pair[0] in ("--chain", "--fanout", "--starts", "--signals", "--timers")
                  for f in pair]

    # Every child works in this run's own scratch directory, removed at the end.
    session = common.TMP_DIR / f"run-{os.getpid()}"
    session.mkdir(parents=True, exist_ok=True)
    os.environ["FUSEE_BENCH_TMP"] = str(session)
    try:
        return _run_everything(args, session, size_flags, dbos_flags)
    finally:
        shutil.rmtree(session, ignore_errors=True)


def _run_everything(args: argparse.Namespace, session: Path, size_flags: list[str],
                    dbos_flags: list[str]) -> int:
    """Runs the workloads with children working in ``session``; writes the report."""
    env = common.environment(session)
    env["bench_dir"] = str(common.TMP_DIR)
    quick = ["--quick"] if args.quick else []
    results: dict[str, dict[str, Any]] = {}

    def collect(system: str, entries: list[dict[str, Any]], workload: str) -> None:
        for entry in entries:
            results.setdefault(entry.get("system", system), {})[
                entry.get("workload", workload)] = entry

    here = common.BENCH_DIR
    collect("floor", run_script([sys.executable, str(here / "floor.py"), "--json", *quick],
                                "floor", args.timeout), "floor")
    for workload in [w for w in args.fusee.split(",") if w]:
        collect("fusee", run_script(
            [sys.executable, str(here / "workloads_fusee.py"), workload, *quick, *size_flags,
             *FUSEE_OPTIONS.get(workload, FUSEE_OPTIONS["*"])],
            f"fusee {workload}", args.timeout), workload)
    if not args.no_scale:
        collect("fusee", run_script([sys.executable, str(here / "workloads_scale.py"), "all", *quick],
                                    "fusee scale-out", args.timeout), "scale")
        # Parts (issue 24): a fan-out through 1, 2 and 4 processes on a directory of 4 parts.
        trials = ["--runs", "500", "--trials", "1"] if args.quick else ["--trials", "3"]
        collect("fusee", run_script([sys.executable, str(here / "parts_scale.py"), "--json", *trials],
                                    "fusee parts", args.timeout), "parts_fanout")
    for workload in KEYED_WORKLOADS:
        collect("fusee", run_script(
            [sys.executable, str(here / "workloads_keyed.py"), workload, *quick],
            f"fusee {workload}", args.timeout), workload)

    # The flush modes other than the default, on a few workloads (the default's are above).
    for mode in [m for m in FLUSH_MODES if m != FLUSH_DEFAULT and not args.no_flush_modes]:
        for workload in [w for w in FLUSH_WORKLOADS if w in args.fusee.split(",")]:
            collect(_flush_system(mode), [{**r, "system": _flush_system(mode)} for r in run_script(
                [sys.executable, str(here / "workloads_fusee.py"), workload, *quick, *size_flags,
                 f"--engine-opt=flush={mode}"], f"fusee {workload} flush={mode}", args.timeout)],
                workload)

    # Where a step's time goes (the disk, CPython, Fusee), for issue 17's "which part is CPython".
    collect("fusee", run_script([sys.executable, str(here / "cpython_share.py"), "--json", *quick],
                                "fusee cpython share", args.timeout), "cpython_share")

    # Group commit across runs (issue 23): N concurrent chains in one engine.
    collect("fusee", run_script([sys.executable, str(here / "concurrent_chains.py"),
                                 *(["--steps", "60", "--rounds", "1"] if args.quick else [])],
                                "fusee concurrent chains", args.timeout), "concurrent_chains")

    # Synchronous hosts (issue 27): start + result from plain threads through SyncEngine.
    collect("fusee", run_script([sys.executable, str(here / "sync_hosts.py"), *quick],
                                "fusee sync hosts", args.timeout), "sync_hosts")

    # Telemetry's cost: CPU per step off (vs the code before its hooks) and on.
    collect("fusee", run_script([sys.executable, str(here / "telemetry_cost.py"), "--json", *quick],
                                "fusee telemetry", args.timeout), "telemetry")

    # Continuous backup's cost: chain latency and fan-out throughput off and on, and its lag.
    collect("fusee", run_script([sys.executable, str(here / "backup_cost.py"), "--json", *quick],
                                "fusee backup", args.timeout), "backup")

    seconds = [] if args.schedule_seconds is None else ["--schedule-seconds", str(args.schedule_seconds)]
    for workload in [w for w in args.flow.split(",") if w]:
        collect("fusee", run_script(
            [sys.executable, str(here / "workloads_flow.py"), workload, *quick, *seconds],
            f"fusee {workload}", args.timeout), workload)

    have_dbos = not args.no_dbos and ensure_dbos_venv()
    dbos_cmd = [str(DBOS_PY), str(here / "workloads_dbos.py"), "--workloads", args.dbos,
                *quick, *dbos_flags]
    if have_dbos:
        collect("dbos-sqlite", run_script([*dbos_cmd, "--db", "sqlite"], "dbos sqlite",
                                          args.timeout * 3), "dbos")
    elif not args.no_dbos:
        log("DBOS: environment unavailable; its columns stay empty")
    # One throwaway cluster for DBOS on PostgreSQL and Fusee's PostgreSQL backend, side by side.
    dbos_on_pg = have_dbos and not args.no_postgres
    if dbos_on_pg or not args.no_pg_backend:
        with local_postgres(session) as url:
            if url and dbos_on_pg:
                collect("dbos-postgres", run_script(
                    [*dbos_cmd, "--db", "postgres", "--url", url], "dbos postgres",
                    args.timeout * 3), "dbos")
            if url and not args.no_pg_backend:
                pg_flags = [f for pair in zip(size_flags[::2], size_flags[1::2], strict=True)
                            if pair[0] in ("--chain", "--fanout") for f in pair]
                collect("fusee-postgres", run_script(
                    [sys.executable, str(here / "workloads_pg.py"), "--url", url, *quick, *pg_flags],
                    "fusee postgres", args.timeout), "fanout")
                if not args.no_scale:  # several workers on one namespace (issue 16)
                    collect("fusee-postgres", run_script(
                        [sys.executable, str(here / "workloads_scale.py"), "all", "--url", url, *quick],
                        "fusee postgres scale-out", args.timeout), "scale")
                    # Parts on the namespace (issue 24): the same fan-out as the directory's.
                    trials = ["--runs", "500", "--trials", "1"] if args.quick else ["--trials", "3"]
                    collect("fusee-postgres", run_script(
                        [sys.executable, str(here / "parts_scale.py"), "--json", "--dsn", url, *trials],
                        "fusee postgres parts", args.timeout), "parts_fanout_pg")
    # Restate takes the same sizes as DBOS (the same five workloads).
    have_restate = not args.no_restate and ensure_restate()
    if have_restate:
        collect("restate", run_script(
            [str(RESTATE_PY), str(here / "workloads_restate.py"), "--workloads", args.restate,
             *quick, *dbos_flags], "restate", args.timeout * 3), "restate")
    elif not args.no_restate:
        log("Restate: unavailable; its columns stay empty")
    # The disk again: a floor that moved during the run says the figures are noisy.
    for entry in run_script([sys.executable, str(here / "floor.py"), "--json", *quick],
                            "floor (again)", args.timeout):
        results.setdefault("floor", {})["floor_after"] = {**entry, "workload": "floor_after"}

    durability = {s: next((r["durability"] for r in ws.values() if "durability" in r), "")
                  for s, ws in results.items()
                  if s.startswith("dbos") or s in ("restate", "fusee-postgres")}
    args.out.mkdir(parents=True, exist_ok=True)
    samples = {label: results.get(s, {}).get(w, {}).get("samples_us", [])
               for label, s, w in (("floor (pwrite + fdatasync)", "floor", "floor"),
                                   ("fusee", "fusee", "chain"),
                                   ("DBOS (SQLite)", "dbos-sqlite", "chain"),
                                   ("DBOS (PostgreSQL)", "dbos-postgres", "chain"),
                                   ("Restate", "restate", "chain"))}
    plot_name: str | None = None
    # The plot needs matplotlib, which the DBOS and Restate environments install.
    plot_py = DBOS_PY if have_dbos else RESTATE_PY if have_restate else None
    if plot_py is not None and any(samples.values()):
        samples_path = session / "samples.json"
        samples_path.write_text(json.dumps(samples))
        cmd = [str(plot_py), str(Path(__file__).resolve()), "--plot", str(samples_path),
               str(args.out / PLOT_NAME)]
        if subprocess.run(cmd).returncode == 0:
            plot_name = PLOT_NAME
        samples_path.unlink()

    size_text = ("quick (--quick)" if args.quick else "full") + (
        f", overrides {' '.join(size_flags)}" if size_flags else "")
    report = render(results, env, size_text, durability, plot_name)
    (args.out / "latest.md").write_text(report)
    stripped = {s: {w: {k: v for k, v in r.items() if k != "samples_us"}
                    for w, r in ws.items()} for s, ws in results.items()}
    (args.out / "latest.json").write_text(json.dumps(
        {"environment": env, "sizes": size_text, "results": stripped}, indent=1))
    print(report)
    log(f"wrote {args.out / 'latest.md'}" + (f" and {args.out / PLOT_NAME}" if plot_name else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
