"""Async completions: a token handed to the outside world, a value reported back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fusee
from fusee.core import records as rec
from tests.helpers import until

TOKENS: list[str] = []


def send_link(info: fusee.StepInfo) -> None:
    assert info.token is not None
    TOKENS.append(info.token)


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx, amount: int) -> str:
    try:
        who = await ctx.await_completion("manager", send_link, result_type=str)
    except fusee.CompletionFailed as e:
        return f"rejected: {e}"
    return f"{amount} approved by {who}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    TOKENS.clear()


async def test_complete_delivers_the_value_once() -> None:
    async with fusee.Engine.open(workflows=[approval]) as engine:
        h = await engine.start(approval, "a-1", 100)
        await until(lambda: any(isinstance(r, rec.Awaiting) for r in engine._rt.wf["a-1"].journal))
        assert await engine.complete(TOKENS[0], "alice") is True
        assert await h.result() == "100 approved by alice"
        assert await engine.complete(TOKENS[0], "bob") is False  # completed already
        kinds = [type(r).__name__ for r in await engine.journal("a-1")]
        assert kinds.count("Awaiting") == 1 and kinds.count("Completed") == 1


async def test_fail_completion_raises_in_the_workflow() -> None:
    async with fusee.Engine.open(workflows=[approval]) as engine:
        h = await engine.start(approval, "a-1", 100)
        await until(lambda: len(TOKENS) == 1)  # completing before the function returned is fine too
        assert await engine.fail_completion(TOKENS[0], "over budget") is True
        assert await h.result() == "rejected: over budget"


async def test_a_retried_token_function_refuses_the_stale_token() -> None:
    calls: list[int] = []

    def flaky_link(info: fusee.StepInfo) -> None:
        assert info.token is not None
        TOKENS.append(info.token)
        calls.append(info.attempt)
        if info.attempt == 1:
            raise ConnectionError("mail server down")

    @fusee.workflow("retried")
    async def retried(ctx: fusee.Ctx) -> int:
        return int(await ctx.await_completion(
            "link", flaky_link, retry=fusee.Retry(attempts=3, initial="1ms"), result_type=int))

    async with fusee.Engine.open(workflows=[retried]) as engine:
        h = await engine.start(retried, "r-1")
        await until(lambda: len(TOKENS) == 2)
        old, new = TOKENS
        assert old != new
        await until(lambda: any(isinstance(r, rec.Awaiting) for r in engine._rt.wf["r-1"].journal))
        assert await engine.complete(old, 1) is False
        assert await engine.complete(new, 2) is True
        assert await h.result() == 2
        assert calls == [1, 2]


async def test_unknown_and_malformed_tokens() -> None:
    async with fusee.Engine.open(workflows=[approval]) as engine:
        with pytest.raises(fusee.NotFound):
            await engine.complete("not a token", 1)
        with pytest.raises(fusee.NotFound):
            await engine.complete("fc1.AAAA", 1)
        from fusee.runtime.tokens import make_token

        with pytest.raises(fusee.NotFound):
            await engine.complete(make_token("nobody", 1, 1, 1), 1)
        with pytest.raises(TypeError):
            await engine.complete(42, 1)  # type: ignore[arg-type]


async def test_a_value_of_the_wrong_type_is_refused_and_nothing_recorded() -> None:
    async with fusee.Engine.open(workflows=[approval]) as engine:
        h = await engine.start(approval, "a-1", 5)
        await until(lambda: len(TOKENS) == 1)
        before = len(await engine.journal("a-1"))
        with pytest.raises(fusee.SerializationError):
            await engine.complete(TOKENS[0], 12)  # the await declared str
        assert len(await engine.journal("a-1")) == before
        assert await engine.complete(TOKENS[0], "carol") is True
        assert await h.result() == "5 approved by carol"


async def test_the_token_survives_a_restart_and_is_not_issued_again(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[approval], park_after=0) as engine:
        await engine.start(approval, "a-1", 7)
        await until(lambda: len(TOKENS) == 1)
        await until(lambda: engine.stats["parked"] >= 1)  # it waits out of memory
    async with fusee.Engine.open(tmp_path, workflows=[approval]) as engine:
        await asyncio.sleep(0.05)
        assert len(TOKENS) == 1, "the replay handed out the token again"
        assert await engine.complete(TOKENS[0], "dave") is True
        assert await engine.get("a-1").result() == "7 approved by dave"


add = fusee.update("add", int, result_type=int)


@fusee.workflow("cart")
async def cart(ctx: fusee.Ctx, owner: str) -> int:
    total = {"n": 0}

    def add_item(n: int) -> int:
        total["n"] += n
        return total["n"]

    ctx.on_update(add, add_item)
    await ctx.sleep("open", "1h")
    return total["n"]


async def test_update_with_start_starts_then_attaches(tmp_path: Path) -> None:
    async with fusee.Engine.open(tmp_path, workflows=[cart]) as engine:
        assert await engine.update_with_start(cart, "cart-1", "ann", add, 3, update_id="u1") == 3
        start = (await engine.journal("cart-1"))[0]
        assert isinstance(start, rec.Start) and start.update is not None and start.update.id == "u1"
        # Running now: the next one is delivered to it.
        assert await engine.update_with_start(cart, "cart-1", "ann", add, 4, update_id="u2") == 7
        # The same update ID again: the same answer, nothing applied twice.
        assert await engine.update_with_start(cart, "cart-1", "ann", add, 3, update_id="u1") == 3
    async with fusee.Engine.open(tmp_path, workflows=[cart]) as engine:
        assert await engine.update(("cart-1"), add, 1) == 8  # the replay applied each once


async def test_who_completed_and_who_reset_are_audited() -> None:
    async with fusee.Engine.open(workflows=[approval]) as engine:
        h = await engine.start(approval, "a-1", 9)
        await until(lambda: any(isinstance(r, rec.Awaiting) for r in engine._rt.wf["a-1"].journal))
        assert await engine.complete(TOKENS[0], "carol", by="webhook:acme") is True
        assert await h.result() == "9 approved by carol"
        assert fusee.AuditEntry("complete", "webhook:acme") in engine.describe("a-1").audit
        h2 = await engine.reset("a-1", before_step="manager", by="ops:dana")
        assert engine.describe("a-1").audit[0] == fusee.AuditEntry("reset", "ops:dana")
        await until(lambda: len(TOKENS) == 2)
        await engine.fail_completion(TOKENS[1], "over budget", by="manager:erin")
        assert await h2.result() == "rejected: over budget"
        assert fusee.AuditEntry("complete", "manager:erin", "failed") in engine.describe("a-1").audit
