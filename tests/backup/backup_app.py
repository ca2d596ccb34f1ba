"""An application under load with continuous backup, for the crash tests (run as a subprocess).

``python backup_app.py DATA TARGET CONTROL``: starts workflows from 4 concurrent tasks until
``CONTROL/stop`` exists, then closes the engine and exits 0. Its ledger ``CONTROL/ledger``
gets ``A <id> <time>`` before each start is asked for and ``K <id> <time>`` only after it
was acknowledged; ``CONTROL/status`` holds the latest ``metrics().backup`` as JSON.
Every third workflow's input is larger than the blob threshold (a blob).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import time

import fusee


@fusee.workflow("job")
async def job(ctx: fusee.Ctx, data: str) -> int:
    return await ctx.step("measure", len, data)  # type: ignore[no-any-return]


async def main(data: str, target: str, control: str) -> None:
    options: dict[str, str] = {}
    if target.startswith("s3://"):
        options["endpoint_url"] = os.environ["BACKUP_ENDPOINT"]
    backup = fusee.Backup(target, interval=0.05, retry_max=0.2, close_timeout=20, **options)
    ledger = open(os.path.join(control, "ledger"), "a", buffering=1)  # noqa: SIM115 (open for the app's life)
    life = str(os.getpid())
    async with fusee.Engine.open(data, workflows=[job], segment_bytes=256 << 10, blob_threshold=2048,
                                 checkpoint_every=400, backup=backup, exclusive=True) as engine:
        stop = os.path.join(control, "stop")
        counter = 0

        async def starter(k: int) -> None:
            nonlocal counter
            while not os.path.exists(stop):
                counter += 1
                wid = f"{life}-{k}-{counter}"
                payload = "x" * (4000 if counter % 3 == 0 else 40)
                ledger.write(f"A {wid} {time.time()!r}\n")
                await engine.start(job, wid, payload)
                ledger.write(f"K {wid} {time.time()!r}\n")  # only after the acknowledgement

        async def report() -> None:
            while not os.path.exists(stop):
                status = engine.metrics().backup
                tmp = os.path.join(control, "status.tmp")
                with open(tmp, "w") as f:
                    json.dump(dataclasses.asdict(status) if status else None, f)
                os.replace(tmp, os.path.join(control, "status"))
                await asyncio.sleep(0.02)

        await asyncio.gather(report(), *(starter(k) for k in range(4)))
    print(json.dumps({"closed": True}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
