"""A mock external service that notices when a step ran on state a crash took back.

Every call carries an idempotency key (the step's key, stable across retries
and crashes) and an input. Answers differ per call, so a step that runs again
after a crash returns something new; if a later step had already run on the
first answer, the service sees one key called with two different inputs:
a violation. Read-only calls are logged apart and never a violation (they
may run ahead of the disk); re-reads with a new input are counted instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


class TransientError(Exception):
    """The service failed this call; calling again with the same key may work."""


def _mix(seed: int, salt: int, key: str, input: int, n: int) -> int:
    # FNV-1a over the key, then the input and the call number: stable across
    # processes (Python's hash() of a str is not).
    h = (seed ^ salt) & _MASK
    for b in key.encode():
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    h ^= ((input << 17) | (input >> 47)) & _MASK
    h ^= (n * 0x9E3779B97F4A7C15) & _MASK
    return h % 1_000_000


def stable_hash(seed: int, name: str, n: int) -> int:
    """A hash of ``name`` and ``n`` that is the same in every process (seeded)."""
    return _mix(seed, 0x3, name, n, 0)


@dataclasses.dataclass
class Effect:
    """One call with effects, with the virtual times it began and finished.

    ``key`` is the step's idempotency key (``workflow ID/run/seq``); ``life``
    the process life it ran in; ``ok`` whether it returned a value (a
    transient failure has no outcome of its own to journal).
    """

    key: str
    name: str
    input: int
    begin: float
    end: float
    life: int
    ok: bool = True

    @property
    def owner(self) -> tuple[str, str, int]:
        """(workflow ID, run, seq) of the step the key names."""
        wid, run, seq = self.key.rsplit("/", 2)
        return wid, run, int(seq)


@dataclasses.dataclass
class Service:
    """The service's log; every field is plain data a checker can read."""

    seed: int = 0
    #: Inputs of calls with effects, per key, in call order.
    calls: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: Inputs of read-only calls, per key, in call order.
    reads: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: What went wrong, first come first listed (bounded).
    violations: list[str] = dataclasses.field(default_factory=list)
    total: int = 0
    #: Read-only calls that ran again on an input never read before (they ran
    #: ahead of the disk and a crash took back what they had read from).
    reads_rerun: int = 0
    #: Calls that failed on purpose (transient failures).
    failures: int = 0
    #: Every call with effects, in call order, with its virtual times.
    effects: list[Effect] = dataclasses.field(default_factory=list)
    #: When workflow code saw ``Cancelled``: workflow ID -> [(life, virtual time)].
    cancels_seen: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    #: The world's virtual clock and current process life (set by the world).
    clock: Callable[[], float] = lambda: 0.0
    life: Callable[[], int] = lambda: 0
    #: Seconds the synchronous step function that just ran holds its pool slot
    #: (set by the function, taken by the simulated step pool right after it returns).
    next_hold: float = 0.0
    #: Completion tokens handed out per workflow ID, in order (``ctx.await_completion``).
    tokens: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: Tokens some invocation of their token function returned after handing out
    #: (the others were handed out by an attempt that then failed: stale).
    tokens_returned: set[str] = dataclasses.field(default_factory=set)

    #: Progress each export step reported with ``info.heartbeat``: step key -> [(virtual time, progress)].
    progress: dict[str, list[tuple[float, int]]] = dataclasses.field(default_factory=dict)
    #: Export attempts as they began: (step key, attempt, virtual time, ``info.progress``).
    resumes: list[tuple[str, int, float, Any]] = dataclasses.field(default_factory=list)

    def began_from(self, key: str, attempt: int, progress: Any) -> None:
        """An attempt of export step ``key`` began from ``progress`` (its ``info.progress``)."""
        self.resumes.append((key, attempt, self.clock(), progress))

    def reported(self, key: str, progress: int) -> None:
        """Export step ``key`` reported ``progress`` (about to call ``info.heartbeat``)."""
        self.progress.setdefault(key, []).append((self.clock(), progress))

    def hand_out(self, wid: str, token: str) -> None:
        """A token function of ``wid`` handed out ``token``."""
        seen = self.tokens.setdefault(wid, [])
        if token not in seen:
            seen.append(token)

    def token_returned(self, token: str) -> None:
        """The token function that handed out ``token`` returned: the token is the await's current one."""
        self.tokens_returned.add(token)

    def take_hold(self) -> float:
        """The hold the last synchronous step function asked for (0 if none)."""
        hold, self.next_hold = self.next_hold, 0.0
        return hold

    def saw_cancel(self, wid: str) -> None:
        """Workflow code of ``wid`` caught ``Cancelled`` now."""
        self.cancels_seen.setdefault(wid, []).append((self.life(), self.clock()))

    def life_ended(self, life: int, t: float) -> None:
        """Process life ``life`` died at ``t``: nothing of it runs on after that."""
        for e in reversed(self.effects):
            if e.life != life:
                break
            e.end = min(e.end, t)

    def _violation(self, message: str) -> None:
        if len(self.violations) < 16:
            self.violations.append(message)

    def call(self, key: str, input: int, fail_first: int = 0, *, name: str = "",
             hold: float = 0.0) -> int:
        """A call with effects. Its first ``fail_first`` calls per key fail transiently.

        ``hold``: virtual seconds the calling step function goes on for after
        the call (its effect happens now, it finishes that much later).
        Records a violation if ``key`` was called before with another input.
        """
        self.total += 1
        now = self.clock()
        effect = Effect(key, name, input, now, now + hold, self.life())
        self.effects.append(effect)
        log = self.calls.setdefault(key, [])
        if log and log[0] != input:
            self._violation(
                f"service key {key} was called with input {log[0]} and later with {input}: "
                "a step ran on state a crash took back"
            )
        log.append(input)
        n = len(log)
        if n <= fail_first:
            self.failures += 1
            effect.ok = False
            raise TransientError(f"transient failure {n} of {key}")
        return _mix(self.seed, 0x1, key, input, n)

    def read(self, key: str, input: int, fail_first: int = 0) -> int:
        """A read-only call: never a violation, answers differ per call like :meth:`call`."""
        self.total += 1
        log = self.reads.setdefault(key, [])
        if log and log[0] != input and input not in log:
            self.reads_rerun += 1
        log.append(input)
        n = len(log)
        if n <= fail_first:
            self.failures += 1
            raise TransientError(f"transient read failure {n} of {key}")
        return _mix(self.seed, 0x2, key, input, n)

    def called(self, key: str) -> bool:
        """Whether a call with effects used ``key``."""
        return key in self.calls
