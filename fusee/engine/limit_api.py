"""The engine's calls for step limits (see :mod:`fusee.limits`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusee.limits import KEEP, Limit, LimitStatus

if TYPE_CHECKING:
    from fusee.engine.engine import Engine


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
        eng: Engine = self  # type: ignore[assignment]
        eng._check_open()
        return eng._rt.limiter.set_limit(name, concurrency, per_second, weights)

    def limits(self) -> dict[str, LimitStatus]:
        """Each limit's bounds, permits out (``in_use``) and step executions waiting (``waiting``)."""
        eng: Engine = self  # type: ignore[assignment]
        return eng._rt.limiter.status()
