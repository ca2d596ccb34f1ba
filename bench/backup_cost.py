"""What continuous backup costs: chain step latency and fan-out throughput with backup off and
on (to a local directory, interval 1 s), and the backup's lag under the fan-out.

    .venv/bin/python bench/backup_cost.py [--quick] [--json] [--count N] [--rounds N]

- chain: one workflow of ``N`` sequential steps (default 2,000; ``--quick`` 200), µs per step;
- fan-out: ``N`` workflows of 10 steps at once (default 2,000; ``--quick`` 200), steps/s;
- lag: ``metrics().backup.lag_p50_s`` / ``lag_p99_s`` once the target caught up with the
  fan-out (per point, how long its oldest batch waited for it), and how long after the
  fan-out's end the target held all of it (``catchup_s``, at most one interval plus an upload).

Each setup runs in a fresh process; off and on alternate over ``--rounds`` rounds (default 3)
and each keeps its best figure. The issue's target: backup on costs ≤ 5 %. With ``--json``
the result is one marked line for ``run_all.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

REPO = Path(__file__).resolve().parents[1]

PROBE = r'''
import asyncio, functools, json, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
mode, count, scratch = sys.argv[2], int(sys.argv[3]), sys.argv[4]
import fusee

async def bump(v: int) -> int:
    return v + 1

@fusee.workflow("chain")
async def chain(ctx, steps: int) -> int:
    t = 0
    for _ in range(steps):
        t = await ctx.step("bump", functools.partial(bump, t))
    return t

async def main() -> None:
    options = {}
    if mode == "on":
        options["backup"] = fusee.Backup(tempfile.mkdtemp(dir=scratch), interval="1s")
    out = {}
    async with fusee.Engine.open(tempfile.mkdtemp(dir=scratch), workflows=[chain], **options) as e:
        t0 = time.perf_counter()
        await (await e.start(chain, "c", count)).result()
        out["chain_us_per_step"] = (time.perf_counter() - t0) / count * 1e6
        t0 = time.perf_counter()
        hs = await asyncio.gather(*(e.start(chain, f"f{i}", 10) for i in range(count)))
        for h in hs:
            await h.result()
        out["fanout_steps_per_s"] = count * 10 / (time.perf_counter() - t0)
        done = time.perf_counter()
        status = e.metrics().backup
        while status is not None and status.lag_s > 0 and time.perf_counter() - done < 30:
            await asyncio.sleep(0.01)  # until the target holds the whole fan-out
            status = e.metrics().backup
        if status is not None:
            out["catchup_s"] = time.perf_counter() - done
            out["lag_p50_s"], out["lag_p99_s"] = status.lag_p50_s, status.lag_p99_s
            out["failures"] = status.failures
    print(json.dumps(out))

asyncio.run(main())
'''


def probe(mode: str, count: int, scratch: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(REPO), mode, str(count), str(scratch)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 steps and workflows, 1 round")
    parser.add_argument("--count", type=int, default=None, help="chain steps and fan-out workflows")
    parser.add_argument("--json", action="store_true", help="print a marked result line for run_all.py")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    count = args.count or (200 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)
    chain: dict[str, float] = {}
    fanout: dict[str, float] = {}
    lag: dict[str, float] = {}
    with common.scratch("backup-cost") as scratch:
        for _ in range(rounds):
            for mode in ("off", "on"):
                got = probe(mode, count, scratch)
                chain[mode] = min(chain.get(mode, got["chain_us_per_step"]), got["chain_us_per_step"])
                fanout[mode] = max(fanout.get(mode, 0.0), got["fanout_steps_per_s"])
                if mode == "on":
                    lag["p50"] = max(lag.get("p50", 0.0), got["lag_p50_s"])
                    lag["p99"] = max(lag.get("p99", 0.0), got["lag_p99_s"])
                    lag["catchup"] = max(lag.get("catchup", 0.0), got["catchup_s"])
    result: dict[str, object] = {
        "system": "fusee", "workload": "backup", "count": count, "rounds": rounds,
        "off_chain_us_per_step": chain["off"], "on_chain_us_per_step": chain["on"],
        "off_fanout_steps_per_s": fanout["off"], "on_fanout_steps_per_s": fanout["on"],
        "chain_cost": chain["on"] / chain["off"] - 1, "fanout_cost": 1 - fanout["on"] / fanout["off"],
        "lag_p50_s": lag["p50"], "lag_p99_s": lag["p99"], "catchup_s": lag["catchup"],
    }
    if args.json:
        common.emit_result(result)
    else:
        print(f"chain  µs/step   off {chain['off']:8.1f}   on {chain['on']:8.1f}   "
              f"cost {result['chain_cost']:+.1%} (target ≤ 5 %)")
        print(f"fan-out steps/s  off {fanout['off']:8.0f}   on {fanout['on']:8.0f}   "
              f"cost {result['fanout_cost']:+.1%} (target ≤ 5 %)")
        print(f"backup lag under the fan-out: p50 {lag['p50']:.3f} s, p99 {lag['p99']:.3f} s; "
              f"the target held all of it {lag['catchup']:.3f} s after its end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
