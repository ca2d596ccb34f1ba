"""Turning telemetry on: ``Engine.open(..., telemetry=...)``.

Telemetry is OpenTelemetry spans and metrics (``fusee.otel``; the optional
extra ``fusee[otel]``). This module imports nothing of OpenTelemetry: the
decision whether to use it is made here, from what the application did.

- ``telemetry=None`` (the default): on if the application has already imported
  OpenTelemetry *and* set a global tracer or meter provider
  (``trace.set_tracer_provider(...)``); off otherwise, importing nothing.
- ``telemetry=True``: on, with the global providers (OpenTelemetry's no-op
  ones if none is set); :class:`fusee.TelemetryUnavailable` if not installed.
- ``telemetry=fusee.Telemetry(tracer_provider=..., meter_provider=...)``: on,
  with those providers (tests use the SDK's in-memory exporters this way).
- ``telemetry=False``: off.

Off, the engine's hooks are a single ``is not None`` test each.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from fusee.errors import TelemetryUnavailable


@dataclasses.dataclass(frozen=True)
class Telemetry:
    """Where an engine sends its spans and metrics.

    ``tracer_provider`` and ``meter_provider`` are OpenTelemetry providers
    (None: the global ones, read when the engine opens). ``traces=False`` or
    ``metrics=False`` turn either off.
    """

    tracer_provider: Any = None
    meter_provider: Any = None
    traces: bool = True
    metrics: bool = True


def _global_provider_set() -> bool:
    """Whether the application set a global OpenTelemetry provider (without importing OpenTelemetry)."""
    trace = sys.modules.get("opentelemetry.trace")
    metrics = sys.modules.get("opentelemetry.metrics")
    if trace is not None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return True
    if metrics is not None:
        provider = metrics.get_meter_provider()
        # The proxy handed out before any set_meter_provider is private to the API: found by name.
        if type(provider).__name__ not in ("_ProxyMeterProvider", "NoOpMeterProvider"):
            return True
    return False


def resolve(option: bool | Telemetry | None) -> Telemetry | None:
    """The telemetry an ``Engine.open(telemetry=option)`` asks for (None: off).

    Raises :class:`TelemetryUnavailable` when it is asked for explicitly and
    OpenTelemetry is not installed, ``TypeError`` for anything else than the
    documented values.
    """
    if option is None:
        return Telemetry() if _global_provider_set() else None
    if option is False:
        return None
    if option is True:
        config = Telemetry()
    elif isinstance(option, Telemetry):
        config = option
    else:
        raise TypeError(f"telemetry takes True, False, None or a fusee.Telemetry, got {option!r}")
    if not config.traces and not config.metrics:
        return None
    try:
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401
    except ImportError as e:
        raise TelemetryUnavailable(
            f"telemetry was asked for but OpenTelemetry is not installed ({e}): "
            "pip install 'fusee[otel]', or open the engine with telemetry=False"
        ) from e
    return config
