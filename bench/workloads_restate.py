"""The comparison workloads on Restate, run inside ``bench/.venv-restate``.

``run_all.py`` installs the server (``npm install --prefix bench/.restate
@restatedev/restate-server``) and creates that environment (``pip install
restate-sdk[client] hypercorn``), then runs this script there; each workload
prints one marked JSON line (see ``common.emit_result``). By hand:

    bench/.venv-restate/bin/python bench/workloads_restate.py --quick

What one run does:

1. starts ``restate-server`` on loopback with a throwaway base directory under
   the bench scratch directory (the disk the floor measures) and its default
   durability (see ``durability``: the log lives in the node's log-server,
   RocksDB with its WAL synced on every write batch);
2. serves the Python service (the SDK's ASGI app under hypercorn, as the SDK
   documents) on loopback in this process, and registers it through the admin
   API (``POST /deployments``);
3. runs the workloads through the ingress HTTP API: workflows whose steps are
   ``ctx.run`` durable steps that stamp the clock in this process, exactly as
   the Fusee and DBOS step functions do;
4. stops the service and the server and removes the base directory.

The workloads are chain, fan-out, start latency, signals (a workflow's durable
promise resolved by a shared handler) and timers (``ctx.sleep``). Fusee's
scale, recovery, list and stream workloads have no natural counterpart here
(the parked runs live in another process; Restate has no log stream to tail).

CPU: ``cpu_s`` is this process (the service and the HTTP client), as for DBOS
on PostgreSQL; ``server_cpu_s`` is the restate-server process over the same
interval, reported beside it because that is where Restate's engine runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import glob
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import httpx
import restate
from hypercorn.asyncio import serve
from hypercorn.config import Config
from restate import RunOptions, WorkflowContext, WorkflowSharedContext

#: Where ``run_all.py`` installs the npm package (never committed).
RESTATE_PREFIX = common.BENCH_DIR / ".restate"

#: perf_counter() each time a stamped step function ran.
STAMPS: list[float] = []
#: Per workflow id: when its "ready"/"before" step ran, and when its last step ran.
MARKS: dict[str, list[float]] = {}


async def bump(value: int) -> int:
    """The benchmark's step: note the time, return a small value."""
    STAMPS.append(time.perf_counter())
    return value + 1


async def mark(key: str) -> int:
    """A step that notes when it ran for workflow ``key``."""
    MARKS.setdefault(key, []).append(time.perf_counter())
    return len(MARKS[key])


steps_wf = restate.Workflow("Steps")


@steps_wf.main(name="run")
async def steps_run(ctx: WorkflowContext, steps: int) -> int:
    """Workloads 2 and 3: ``steps`` sequential durable steps."""
    total = 0
    for _ in range(steps):
        total = await ctx.run_typed("bump", bump, RunOptions(), total)
    return total


one_step_wf = restate.Workflow("OneStep")


@one_step_wf.main(name="run")
async def one_step_run(ctx: WorkflowContext, value: int) -> int:
    """Workload 4: a workflow of one step, executed start to result."""
    return await ctx.run_typed("bump", bump, RunOptions(), value)


waiter_wf = restate.Workflow("Waiter")


@waiter_wf.main(name="run")
async def waiter_run(ctx: WorkflowContext, key: str) -> int:
    """Workload 5a: notes it is ready, waits on a durable promise, notes it resumed."""
    await ctx.run_typed("mark", mark, RunOptions(), key)
    value: int = await ctx.promise("go", type_hint=int).value()
    await ctx.run_typed("mark", mark, RunOptions(), key)
    return value


@waiter_wf.handler()
async def go(ctx: WorkflowSharedContext, value: int) -> None:
    """The signal: resolves the waiting workflow's promise."""
    await ctx.promise("go", type_hint=int).resolve(value)


sleeper_wf = restate.Workflow("Sleeper")


@sleeper_wf.main(name="run")
async def sleeper_run(ctx: WorkflowContext, seconds: float) -> int:
    """Workload 5b: notes the time, sleeps durably, notes the time again."""
    key = ctx.key()
    await ctx.run_typed("mark", mark, RunOptions(), key)
    await ctx.sleep(timedelta(seconds=seconds))
    return await ctx.run_typed("mark", mark, RunOptions(), key)


APP = restate.app(services=[steps_wf, one_step_wf, waiter_wf, sleeper_wf])


# --- the server ----------------------------------------------------------------


def server_binary() -> Path | None:
    """The restate-server executable the npm package installed, if any.

    The platform package's binary is run directly rather than through the
    package's node launcher, so signals reach the server itself.
    """
    found = sorted(glob.glob(str(RESTATE_PREFIX / "node_modules" / "@restatedev"
                                 / "restate-server-*" / "bin" / "restate-server")))
    return Path(found[0]) if found else None


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(base: Path) -> tuple[Path, dict[str, int]]:
    """The server's configuration file in ``base``: loopback ports, defaults otherwise.

    Only addresses, names, telemetry and the shutdown timeout are set; every
    storage and durability setting is the server's default.
    """
    ports = {"node": free_port(), "admin": free_port(), "ingress": free_port()}
    text = f"""\
node-name = "bench"
cluster-name = "fusee-bench"
base-dir = "{base / 'data'}"
disable-telemetry = true
shutdown-timeout = "10s"
bind-address = "127.0.0.1:{ports['node']}"
advertised-address = "http://127.0.0.1:{ports['node']}/"

[admin]
bind-address = "127.0.0.1:{ports['admin']}"

[ingress]
bind-address = "127.0.0.1:{ports['ingress']}"
"""
    path = base / "restate.toml"
    path.write_text(text)
    return path, ports


def durability(binary: Path, config: Path) -> str:
    """The durability settings the server ran with, read back from ``--dump-config``."""
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    dumped = subprocess.run([str(binary), "-c", str(config), "--dump-config"],
                            capture_output=True, text=True, check=True).stdout
    conf = tomllib.loads(dumped)
    bifrost = conf.get("bifrost", {})
    provider = bifrost.get("default-provider", "?")
    log_server = conf.get("log-server", {})
    local = bifrost.get("local", {})
    if provider == "replicated":
        fsync_off = log_server.get("rocksdb-disable-wal-fsync", "?")
        synced = ("i.e. the RocksDB WAL is synced (fdatasync) on every write batch"
                  if fsync_off is False else "i.e. the RocksDB WAL is NOT synced per batch")
        log = (f"log provider `replicated` with replication {conf.get('default-replication')} "
               f"(the node's own log-server): each log append is acknowledged once written "
               f"to the log-server's RocksDB with `log-server.rocksdb-disable-wal-fsync="
               f"{str(fsync_off).lower()}`, {synced}")
    else:
        log = (f"log provider `{provider}`: RocksDB with `bifrost.local.rocksdb-disable-wal="
               f"{str(local.get('rocksdb-disable-wal', '?')).lower()}`, "
               f"`rocksdb-disable-wal-fsync="
               f"{str(local.get('rocksdb-disable-wal-fsync', '?')).lower()}`")
    return (f"{version}, read back with `--dump-config` (storage settings left at the "
            f"server defaults): {log}; a `ctx.run` step's result is appended "
            "to that log and the SDK goes on only once the server acknowledges it; the "
            "partition store (`worker.storage`) is rebuilt from the log after a crash")


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (every thread)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5) (utime, stime); the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:
    """In the server's child process: be killed when the benchmark process dies.

    ``run_all.py`` kills a workload script that overruns its timeout with
    SIGKILL; without this the server would outlive it, holding its ports.
    """
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@contextlib.contextmanager
def running_server(binary: Path, base: Path) -> Iterator[tuple[subprocess.Popen[bytes],
                                                                dict[str, int], Path]]:
    """restate-server running on loopback with its data in ``base``; stopped afterwards."""
    config, ports = write_config(base)
    log_file = (base / "server.log").open("wb")
    proc = subprocess.Popen([str(binary), "-c", str(config), "--listen-mode", "tcp",
                             "--no-logo"], stdout=log_file, stderr=subprocess.STDOUT,
                            preexec_fn=_die_with_parent,
                            env={**os.environ, "NO_COLOR": "1",
                                 "RESTATE_LOG_DISABLE_ANSI_CODES": "true"})
    try:
        deadline = time.monotonic() + 120
        admin = f"http://127.0.0.1:{ports['admin']}"
        ingress = f"http://127.0.0.1:{ports['ingress']}"
        while True:
            if proc.poll() is not None:
                tail = (base / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"restate-server exited with {proc.returncode}: {tail}")
            try:
                if (httpx.get(f"{admin}/health", timeout=1).status_code == 200
                        and httpx.get(f"{ingress}/restate/health", timeout=1).status_code
                        == 200):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("restate-server did not become healthy within 120 s")
            time.sleep(0.1)  # polling a child process's readiness, not test sync
        yield proc, ports, config
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log_file.close()


@contextlib.asynccontextmanager
async def serving_app(port: int) -> AsyncIterator[None]:
    """The SDK's ASGI app under hypercorn on loopback, in this event loop."""
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    # As the SDK's own test harness configures it: the server keeps one long
    # HTTP/2 connection with a stream per invocation.
    config.h2_max_concurrent_streams = 2**31 - 1
    config.keep_alive_max_requests = 2**31 - 1
    config.keep_alive_timeout = 2**31 - 1
    config.accesslog = None
    config.errorlog = None
    stop = asyncio.Event()
    task = asyncio.create_task(serve(APP, config, mode="asgi",
                                     shutdown_trigger=stop.wait))
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(task, 10)


async def register(admin: str, service_port: int) -> None:
    """Registers the service with the server through the admin API."""
    async with httpx.AsyncClient(timeout=60) as client:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = await client.post(f"{admin}/deployments",
                                             json={"uri": f"http://127.0.0.1:{service_port}"})
            except httpx.TransportError:
                response = None  # the service is still binding
            if response is not None and response.status_code < 300:
                return
            if time.monotonic() > deadline:
                detail = response.text if response is not None else "no answer"
                raise RuntimeError(f"registering the deployment failed: {detail}")
            await asyncio.sleep(0.1)


# --- workloads ---------------------------------------------------------------


class Ingress:
    """Calls through the ingress HTTP API, spread over many small connection pools.

    httpx's connection pool scans every connection it holds on each request
    event, so one pool with 2,000 calls in flight spends quadratic CPU in the
    client (measured: most of this process's CPU, and a fan-out 10 times slower
    than with small pools). Round-robin over ``POOLS`` clients keeps each pool
    small, so the figures measure Restate rather than the benchmark's client.
    """

    POOLS = 64

    def __init__(self, base_url: str, stack: contextlib.AsyncExitStack) -> None:
        self.base_url = base_url
        self.stack = stack
        self.clients: list[httpx.AsyncClient] = []
        self.turn = 0

    async def open(self) -> None:
        """Opens the clients (HTTP/1.1, one connection per call in flight)."""
        for _ in range(self.POOLS):
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
            self.clients.append(await self.stack.enter_async_context(
                httpx.AsyncClient(base_url=self.base_url, timeout=600, limits=limits)))

    def _client(self) -> httpx.AsyncClient:
        self.turn = (self.turn + 1) % len(self.clients)
        return self.clients[self.turn]

    async def call(self, workflow: str, key: str, handler: str, body: Any) -> Any:
        """Calls ``handler`` of workflow ``key`` and returns its result."""
        response = await self._client().post(f"/{workflow}/{key}/{handler}", json=body)
        response.raise_for_status()
        return response.json() if response.content else None

    async def send(self, workflow: str, key: str, body: Any) -> None:
        """Starts workflow ``key`` without waiting for its result."""
        response = await self._client().post(f"/{workflow}/{key}/run/send", json=body)
        response.raise_for_status()

    async def attach(self, workflow: str, key: str) -> Any:
        """Waits for workflow ``key``'s result."""
        response = await self._client().get(f"/restate/workflow/{workflow}/{key}/attach")
        response.raise_for_status()
        return response.json()


async def warm_up(ingress: Ingress) -> None:
    """Waits until the ingress routes to the new deployment, with one workflow per kind.

    The registration reaches the ingress through the cluster's metadata a
    moment after the admin API answered, so the first call may see a 404.
    """
    deadline = time.monotonic() + 60
    tag = time.monotonic_ns()
    while True:
        try:
            assert await ingress.call("OneStep", f"warm-{tag}", "run", 0) == 1
            break
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 404 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    assert await ingress.call("Steps", f"warm-{tag}", "run", 2) == 2


async def run_chain(ingress: Ingress, steps: int) -> dict[str, Any]:
    """One workflow of ``steps`` sequential steps: µs per step and its distribution."""
    STAMPS.clear()
    with common.measured() as m:
        result = await ingress.call("Steps", f"chain-{time.monotonic_ns()}", "run", steps)
    assert result == steps, result
    gaps = [b - a for a, b in itertools.pairwise(STAMPS)]
    return {
        "workload": "chain", "steps": steps, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "us_per_step": m["wall_s"] / steps * 1e6, **common.latency_summary(gaps),
        "samples_us": [g * 1e6 for g in gaps],
    }


async def run_fanout(ingress: Ingress, workflows: int, steps: int) -> dict[str, Any]:
    """``workflows`` workflows of ``steps`` steps started at once: throughput and latency."""
    STAMPS.clear()
    latencies: list[float] = []
    tag = time.monotonic_ns()

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        key = f"fan-{tag}-{i}"
        for attempt in range(5):
            try:
                got = await ingress.call("Steps", key, "run", steps)
                break
            except httpx.TransportError:
                # The ingress dropped the connection under the burst (httpx.ReadError): the
                # workflow may be running already; its key makes attaching to it safe.
                if attempt == 4:
                    raise
                try:
                    got = await ingress.attach("Steps", key)
                    break
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code != 404:
                        raise
                    await asyncio.sleep(0.05 * (attempt + 1))  # never submitted: call again
                except httpx.TransportError:
                    await asyncio.sleep(0.05 * (attempt + 1))
        assert got == steps
        latencies.append(time.perf_counter() - t0)

    with common.measured() as m:
        await asyncio.gather(*(one(i) for i in range(workflows)))
    total_steps = workflows * steps
    assert len(STAMPS) == total_steps, len(STAMPS)
    return {
        "workload": "fanout", "workflows": workflows, "steps_per_workflow": steps,
        "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "steps_per_s": total_steps / m["wall_s"], "workflows_per_s": workflows / m["wall_s"],
        "cpu_s_per_1000_steps": m["cpu_s"] / total_steps * 1000,
        **common.latency_summary(latencies),
    }


async def run_start(ingress: Ingress, count: int) -> dict[str, Any]:
    """``count`` one-step workflows executed one after another (start + result)."""
    latencies: list[float] = []
    tag = time.monotonic_ns()
    with common.measured() as m:
        for i in range(count):
            t0 = time.perf_counter()
            assert await ingress.call("OneStep", f"start-{tag}-{i}", "run", i) == i + 1
            latencies.append(time.perf_counter() - t0)
    return {
        "workload": "start", "count": count, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "per_s": count / m["wall_s"], **common.latency_summary(latencies),
    }


async def wait_marked(keys: list[str], marks: int, timeout: float) -> None:
    """Waits until every key's workflow has run ``marks`` marking steps."""
    deadline = time.monotonic() + timeout
    while any(len(MARKS.get(k, ())) < marks for k in keys):
        if time.monotonic() > deadline:
            raise RuntimeError(f"workflows did not reach mark {marks} within {timeout:.0f} s")
        await asyncio.sleep(0.01)


async def run_signals(ingress: Ingress, count: int) -> dict[str, Any]:
    """``count`` workflows wait on a promise, then each is resolved, one after another.

    Latency: from just before the ``go`` call to the waiter's next step running.
    """
    MARKS.clear()
    tag = time.monotonic_ns()
    keys = [f"sig-{tag}-{i}" for i in range(count)]
    for key in keys:
        await ingress.send("Waiter", key, key)
    await wait_marked(keys, 1, 600)
    # The "ready" step has run; let each waiter reach its promise before signalling
    # (the same pause as on the Fusee and DBOS sides).
    await asyncio.sleep(0.5)
    sent: dict[str, float] = {}
    with common.measured() as m:
        for key in keys:
            sent[key] = time.perf_counter()
            await ingress.call("Waiter", key, "go", 1)
        results = await asyncio.gather(*(ingress.attach("Waiter", k) for k in keys))
    assert results == [1] * count, results[:5]
    latencies = [MARKS[k][1] - sent[k] for k in keys]
    return {
        "workload": "signals", "count": count, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
        "per_s": count / m["wall_s"], **common.latency_summary(latencies),
    }


async def run_timers(ingress: Ingress, count: int, seconds: float) -> dict[str, Any]:
    """``count`` workflows sleep ``seconds``: from due (before step + sleep) to resumed."""
    MARKS.clear()
    tag = time.monotonic_ns()
    keys = [f"timer-{tag}-{i}" for i in range(count)]
    with common.measured() as m:
        for key in keys:
            await ingress.send("Sleeper", key, seconds)
        await asyncio.gather(*(ingress.attach("Sleeper", k) for k in keys))
    lateness = [MARKS[k][1] - MARKS[k][0] - seconds for k in keys]
    return {
        "workload": "timers", "count": count, "sleep_s": seconds, "wall_s": m["wall_s"],
        "cpu_s": m["cpu_s"], **common.latency_summary(lateness),
    }


# --- main ------------------------------------------------------------------


async def main_async(args: argparse.Namespace, binary: Path, base: Path) -> None:
    """Starts the server and the service, runs the chosen workloads, emits each result."""
    with running_server(binary, base) as (proc, ports, config):
        base_info = {"system": "restate", "durability": durability(binary, config)}
        service_port = free_port()
        async with serving_app(service_port):
            await register(f"http://127.0.0.1:{ports['admin']}", service_port)
            async with contextlib.AsyncExitStack() as stack:
                ingress = Ingress(f"http://127.0.0.1:{ports['ingress']}", stack)
                await ingress.open()
                await warm_up(ingress)
                wanted = args.workloads.split(",")
                runs: list[tuple[str, Any]] = [
                    ("chain", lambda: run_chain(ingress, args.chain)),
                    ("fanout", lambda: run_fanout(ingress, args.fanout, args.fanout_steps)),
                    ("start", lambda: run_start(ingress, args.starts)),
                    ("signals", lambda: run_signals(ingress, args.signals)),
                    ("timers", lambda: run_timers(ingress, args.timers, 1.0)),
                ]
                for name, run in runs:
                    if name not in wanted:
                        continue
                    server0 = server_cpu_seconds(proc.pid)
                    result = await run()
                    server_cpu = server_cpu_seconds(proc.pid) - server0
                    extra: dict[str, Any] = {"server_cpu_s": server_cpu}
                    if "steps_per_workflow" in result:
                        total = result["workflows"] * result["steps_per_workflow"]
                        extra["server_cpu_s_per_1000_steps"] = server_cpu / total * 1000
                    common.emit_result({**base_info, **result, **extra})


def main(argv: list[str] | None = None) -> int:
    """Parses the sizes, finds the server, runs the workloads."""
    parser = argparse.ArgumentParser(description="Restate side of the Fusee benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--workloads", default="chain,fanout,start,signals,timers")
    parser.add_argument("--server", type=Path, default=None,
                        help="restate-server executable (default: the one under bench/.restate)")
    parser.add_argument("--chain", type=int, default=None, help="steps in the chain (2000)")
    parser.add_argument("--fanout", type=int, default=None, help="fan-out workflows (2000)")
    parser.add_argument("--fanout-steps", type=int, default=10)
    parser.add_argument("--starts", type=int, default=None, help="one-step workflows (500)")
    parser.add_argument("--signals", type=int, default=None, help="signalled workflows (1000)")
    parser.add_argument("--timers", type=int, default=None, help="sleeping workflows (1000)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.chain = args.chain or (200 if quick else 2000)
    args.fanout = args.fanout or (100 if quick else 2000)
    args.starts = args.starts or (50 if quick else 500)
    args.signals = args.signals or (50 if quick else 1000)
    args.timers = args.timers or (50 if quick else 1000)
    binary = args.server or server_binary()
    if binary is None or not binary.exists():
        parser.error("restate-server not found: npm install --prefix bench/.restate "
                     "@restatedev/restate-server (or pass --server)")
    with common.scratch("restate") as base:
        asyncio.run(main_async(args, binary, base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
