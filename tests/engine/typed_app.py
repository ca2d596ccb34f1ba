"""A process for the typed-values crash test: ``typed_app.py DIR live|replay``.

``live`` starts a run whose steps return values of many types and prints the
types its code saw, then waits to be killed. ``replay`` reopens the directory
(the run replays its journal), prints the types the replayed code saw, lets
the run finish and prints its result and how many steps ran in this process. Output is one JSON object per line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import json
import sys
import uuid

import pydantic

import fusee


class Money(pydantic.BaseModel):
    currency: str
    cents: int


@dataclasses.dataclass
class Parcel:
    weight: decimal.Decimal
    sent: datetime.datetime


release = fusee.signal("release")

STEPS = [
    ("bytes", lambda: b"\x00\xff", bytes),
    ("tuple", lambda: (1, "a"), tuple[int, str]),
    ("datetime", lambda: datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC), datetime.datetime),
    ("uuid", lambda: uuid.UUID(int=7), uuid.UUID),
    ("decimal", lambda: decimal.Decimal("1.10"), decimal.Decimal),
    ("frozenset", lambda: frozenset({3, 1}), frozenset[int]),
    ("pydantic", lambda: Money(currency="EUR", cents=5), Money),
    ("dataclass", lambda: Parcel(decimal.Decimal("2.5"), datetime.datetime(2026, 1, 1)), Parcel),
]


def emit(**kv: object) -> None:
    print(json.dumps(kv), flush=True)


@fusee.workflow("typed-crash")
async def typed_crash(ctx: fusee.Ctx) -> str:
    values = [await ctx.step(name, fn, result_type=tp) for name, fn, tp in STEPS]
    emit(seen={name: type(v).__qualname__ for (name, _, _), v in zip(STEPS, values, strict=True)})
    await ctx.wait_for(release)
    return repr(values)


async def main(path: str, mode: str) -> None:
    async with fusee.Engine.open(path, workflows=[typed_crash]) as engine:
        if mode == "live":
            await engine.start(typed_crash, "tc-1")
            # Once the wait is durable, so is every step result before it.
            while not any(type(r).__name__ == "Wait" for r in await engine.journal("tc-1")):
                await asyncio.sleep(0.001)
            emit(durable=True)
            await asyncio.Event().wait()  # killed here
        else:
            await engine.signal("tc-1", release)
            emit(result=await engine.get("tc-1").result(), steps_run=engine.stats["steps"])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
