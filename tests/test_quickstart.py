"""The README's quick start, tested with the testing kit: its workflow, approved and not."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import fusee
from fusee.testing import TestEngine

ROOT = Path(__file__).resolve().parents[1]


def quick_start() -> dict[str, Any]:
    """The quick start's definitions (everything before its main), as the README has them."""
    code = re.search(r"## Quick start\s+```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert code is not None
    definitions = code.group(1).split("async def main")[0]
    namespace: dict[str, Any] = {}
    exec(compile(definitions, "README.md", "exec"), namespace)
    return namespace


async def test_an_approved_order_is_paid_and_a_silent_one_refunded() -> None:
    qs = quick_start()
    order, approve = qs["order"], qs["approve"]
    async with TestEngine(workflows=[order]) as env:
        run = await env.start(order, "order-1", "teapot")
        await env.signal("order-1", approve, True)
        assert str(await run.result()).startswith("teapot for 42: payment for order-1/")
        # Nobody approves: a day passes in milliseconds and the payment is refunded.
        assert await env.execute(order, "order-2", "kettle") == "refunded"
        kinds = [type(r).__name__ for r in await env.journal("order-2")]
        assert kinds.count("Step") == 3  # quote, charge, refund: each ran once
    assert isinstance(approve, fusee.SignalDef)
