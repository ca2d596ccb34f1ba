"""The HTTP API's overhead over the engine: requests per second and latency, in-process.

Usage: .venv/bin/python bench/http_api.py [--runs N] [--requests N] [--quick]

Opens an engine on a scratch directory with N waiting runs, then drives
``fusee.http.app`` through httpx's ASGI transport (no sockets: the figures are
the app's and the engine's, not the network's) with sequential requests:
a page of 100 runs, a describe, a journal, and a durable signal. Each prints
one result line (see ``common.emit_result``): requests/s and p50/p99 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import common
import httpx

import fusee
from fusee.http import app

go = fusee.signal("go", int)


@fusee.workflow("waiter")
async def waiter(ctx: fusee.Ctx, i: int) -> int:
    ctx.set_attributes({"group": i % 10})
    total = 0
    while total < 1_000_000:
        total += await ctx.wait_for(go) or 0
    return total


async def bench(runs: int, requests: int) -> list[dict[str, Any]]:
    out = []
    with common.scratch("http") as path:
        async with fusee.Engine.open(path, workflows=[waiter]) as engine:
            await asyncio.gather(*(engine.start(waiter, f"w-{i}", i) for i in range(runs)))
            transport = httpx.ASGITransport(app=app(engine))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                cases: list[tuple[str, str, str, dict[str, Any] | None]] = [
                    ("http_list_page", "GET", "/api/runs?limit=100&where=attrs.group%20%3D%203", None),
                    ("http_describe", "GET", "/api/runs/w-1", None),
                    ("http_journal", "GET", "/api/runs/w-2/journal", None),
                    ("http_signal", "POST", "/api/runs/w-3/signal", {"name": "go", "value": 1}),
                ]
                for name, method, url, body in cases:
                    latencies = []
                    with common.measured() as m:
                        for _ in range(requests):
                            t0 = time.perf_counter()
                            r = await c.request(method, url, json=body)
                            latencies.append(time.perf_counter() - t0)
                            assert r.status_code == 200, r.text
                    out.append({"workload": name, "runs": runs, "requests": requests,
                                "requests_per_s": requests / m["wall_s"],
                                "cpu_us_per_request": m["cpu_s"] / requests * 1e6,
                                **common.latency_summary(latencies)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--requests", type=int, default=2_000)
    p.add_argument("--quick", action="store_true", help="a small size, to check the script runs")
    args = p.parse_args()
    runs, requests = (200, 50) if args.quick else (args.runs, args.requests)
    for result in asyncio.run(bench(runs, requests)):
        common.emit_result(result)
        print(f"{result['workload']}: {result['requests_per_s']:,.0f} req/s, p50 "
              f"{result['p50_us']:,.0f} µs, p99 {result['p99_us']:,.0f} µs")


if __name__ == "__main__":
    main()
