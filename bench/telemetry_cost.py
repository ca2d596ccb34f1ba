"""CPU per durable step with telemetry off, on, and in the code before its hooks existed.

    .venv/bin/python bench/telemetry_cost.py [--quick] [--json] [--baseline REV] [--rounds N]

Runs the fan-out of ``cpu_per_step.py`` (2,000 workflows of 10 async steps on
a real directory; ``--quick``: 200) in fresh processes, in three setups:

- ``baseline``: the code before the telemetry hooks (git revision ``REV``,
  by default the parent of the commit that added ``fusee/runtime/telemetry.py``,
  extracted with ``git archive`` into a scratch directory);
- ``off``: this checkout, ``telemetry=False`` (the hooks are one ``is not None``
  test each; the issue's budget is 2 % over the baseline);
- ``on``: this checkout with OpenTelemetry's SDK: a tracer provider whose
  spans go to an exporter that drops them, and a meter provider with an
  in-memory reader (the cost of making every span and measurement).

The setups alternate over ``--rounds`` rounds (default 5) and each keeps its
best figure, so a load change on the machine touches all three alike. With
``--json`` the result is one marked line for ``run_all.py``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

REPO = Path(__file__).resolve().parents[1]

PROBE = r'''
import asyncio, functools, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
mode, workflows = sys.argv[2], int(sys.argv[3])
import fusee

options = {}
if mode == "off":
    options["telemetry"] = False
elif mode == "on":
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(Drop()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    options["telemetry"] = fusee.Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)

async def bump(v: int) -> int:
    return v + 1

@fusee.workflow("fan")
async def fan(ctx, steps: int) -> int:
    t = 0
    for _ in range(steps):
        t = await ctx.step("bump", functools.partial(bump, t))
    return t

async def main() -> None:
    async with fusee.Engine.open(tempfile.mkdtemp(dir=sys.argv[4]), workflows=[fan], **options) as e:
        t0 = time.process_time()
        hs = await asyncio.gather(*(e.start(fan, f"f{i}", 10) for i in range(workflows)))
        for h in hs:
            await h.result()
        print((time.process_time() - t0) / (workflows * 10) * 1e6)

asyncio.run(main())
'''


def baseline_revision() -> str | None:
    """The commit before the telemetry hooks: the parent of the commit that added them."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "log", "--diff-filter=A", "--format=%H", "--", "fusee/runtime/telemetry.py"],
        capture_output=True, text=True,
    )
    added = out.stdout.split()
    return f"{added[-1]}^" if out.returncode == 0 and added else None


def extract(revision: str, into: Path) -> bool:
    """The ``fusee`` package of ``revision`` under ``into`` (False: git could not give it)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "fusee"], capture_output=True)
    if archive.returncode != 0:
        return False
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return True


def probe(repo: Path, mode: str, workflows: int, scratch: Path) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, str(repo), mode, str(workflows), str(scratch)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 workflows, 2 rounds (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print a marked result line for run_all.py")
    parser.add_argument("--baseline", help="git revision of the code before the hooks")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    workflows = 200 if args.quick else 2000
    rounds = args.rounds or (2 if args.quick else 5)
    best: dict[str, float] = {}
    with common.scratch("telemetry-cost") as scratch, tempfile.TemporaryDirectory() as old:
        setups = {"off": REPO, "on": REPO}
        revision = args.baseline or baseline_revision()
        if revision is not None and extract(revision, Path(old)):
            setups = {"baseline": Path(old), **setups}
        for _ in range(rounds):
            for mode, repo in setups.items():
                cpu = probe(repo, "baseline" if mode == "baseline" else mode, workflows, scratch)
                best[mode] = min(best.get(mode, cpu), cpu)
    result: dict[str, object] = {
        "system": "fusee", "workload": "telemetry", "steps": workflows * 10, "rounds": rounds,
        "baseline_revision": revision,
        **{f"{mode}_cpu_us_per_step": cpu for mode, cpu in best.items()},
    }
    if "baseline" in best:
        result["off_vs_baseline"] = best["off"] / best["baseline"]
    result["on_vs_off"] = best["on"] / best["off"]
    if args.json:
        common.emit_result(result)
    else:
        for mode, cpu in best.items():
            print(f"{mode:>8}: {cpu:6.1f} µs CPU per step (best of {rounds})")
        if "baseline" in best:
            print(f"off ÷ baseline: {best['off'] / best['baseline']:.3f} (budget: 1.02)")
        print(f"on ÷ off: {best['on'] / best['off']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
