"""The URLconf of the Django test: views that start, signal and read orders through SyncEngine."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path

import fusee
from tests.sync.hosts_app import approve, order

#: Set by the test: the engine the views use (a real app opens it at startup, e.g. in AppConfig.ready).
engine: fusee.SyncEngine | None = None


def _engine() -> fusee.SyncEngine:
    assert engine is not None
    return engine


def start(request: HttpRequest, oid: str) -> JsonResponse:
    h = _engine().start(order, oid, oid, if_running="attach", if_finished="attach")
    return JsonResponse({"workflow_id": h.workflow_id})


def approve_order(request: HttpRequest, oid: str) -> JsonResponse:
    try:
        _engine().signal(oid, approve, str(request.POST["who"]))
    except fusee.NotFound as e:
        return JsonResponse({"error": str(e)}, status=404)
    return JsonResponse({"ok": True})


def result(request: HttpRequest, oid: str) -> JsonResponse:
    out: dict[str, Any] = {"result": _engine().get(oid).result(timeout=60)}
    return JsonResponse(out)


urlpatterns = [
    path("orders/<str:oid>", start),
    path("orders/<str:oid>/approve", approve_order),
    path("orders/<str:oid>/result", result),
]
