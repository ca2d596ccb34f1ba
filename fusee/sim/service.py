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

    def _violation(self, message: str) -> None:
        if len(self.violations) < 16:
            self.violations.append(message)

    def call(self, key: str, input: int, fail_first: int = 0) -> int:
        """A call with effects. Its first ``fail_first`` calls per key fail transiently.

        Records a violation if ``key`` was called before with another input.
        """
        self.total += 1
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
