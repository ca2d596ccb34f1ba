"""The engine's calls for step limits (see :mod:`fusee.limits`)."""

from __future__ import annotations

from typing import Any, Protocol, cast

from fusee.limits import KEEP, Limit, LimitStatus
from fusee.runtime.runtime import Runtime


class _Host(Protocol):
    """What these calls use of the engine they are mixed into."""

    @property
    def _rt(self) -> Runtime: ...

    def _check_open(self) -> None: ...


class LimitCalls:
    """Mixed into :class:`fusee.Engine`."""

    def set_limit(
        self, name: str, *, concurrency: Any = KEEP, per_second: Any = KEEP, weights: Any = KEEP
    ) -> Limit:
        """Changes a limit's bounds now (what is not given stays) and returns the new :class:`fusee.Limit`.

        Not durable: the next ``Engine.open`` takes the limits it is given. A
        smaller ``concurrency`` takes no permit back: executions running keep
        theirs and no new one is given until fewer than the new bound run.
        Raises :class:`fusee.UnknownLimit` for a name the engine was not opened with.
        """
        eng = cast(_Host, self)
        eng._check_open()
        return eng._rt.limiter.set_limit(name, concurrency, per_second, weights)

    def limits(self) -> dict[str, LimitStatus]:
        """Each limit's bounds, permits out (``in_use``) and step executions waiting (``waiting``)."""
        eng = cast(_Host, self)
        return eng._rt.limiter.status()
