"""The web UI's Objects pages: every key of every keyed object, and one key's state with a
versioned edit (``engine.object_state``, ``set_object_state``, ``clear_object_state``).

An edit carries the version the page showed (``if_version``): if the state changed
meanwhile, the edit is refused, nothing changes, and the page shows the new state
beside what was typed. Forms are checked like the run actions (the CSRF token and a
same-origin ``Origin``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from fusee import objects
from fusee.errors import FuseeError, ObjectVersionConflict
from fusee.ui.pages import Pages, on_engine

#: Keys listed on the Objects page at most (the newest runs first).
MAX_KEYS = 500
FLASH = {
    "save": "State saved: the new version is durable.",
    "clear": "State put back to the object's initial state.",
}


def state_json(obj: objects.ObjectDef[Any], value: Any) -> str:
    """``value`` as the indented JSON the edit form shows and takes back."""
    return json.dumps(objects.to_plain(value, obj.state_type, "the state"), indent=2, ensure_ascii=False,
                      sort_keys=True, default=str)


class ObjectPages:
    """The two pages and their two actions, on the UI's engine, renderer and CSRF guard."""

    def __init__(self, ui: Pages) -> None:
        self.ui = ui

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:

        return await on_engine(self.ui.engine, fn, *args, **kwargs)

    def declared(self) -> dict[str, objects.ObjectDef[Any]]:
        return objects.declared(self.ui.engine._rt.versions)

    async def index(self, request: Request) -> Response:
        declared = self.declared()

        def keys() -> list[dict[str, Any]]:
            rows = []
            for s in self.ui.engine.runs():
                name, sep, key = s.workflow_id[1:].partition("/")
                if s.workflow_id.startswith("@") and sep and name in declared and s.ended_at is None:
                    rows.append({"object": name, "key": key, "summary": s})
            rows.sort(key=lambda r: (r["object"], r["key"]))
            return rows[:MAX_KEYS]

        rows = await self.call(keys)
        return self.ui.render(request, "objects.html", objects=sorted(declared), rows=rows, max_keys=MAX_KEYS)

    async def state(self, request: Request, error: str | None = None, typed: str | None = None,
                    status_code: int = 200) -> Response:
        name, key = request.path_params["name"], request.path_params["key"]
        obj = self.declared().get(name)
        if obj is None:
            return self.ui.render(request, "error.html", status_code=404, title="No such object",
                                  message=f"this engine has no keyed object named {name!r}")
        got = await self.call(self.ui.engine.object_state, obj, key)
        return self.ui.render(
            request, "object.html", status_code=status_code, obj=obj, key=key, version=got.version,
            state=state_json(obj, got.value), typed=typed, error=error, run_id=obj.workflow_id(key),
            handlers=sorted(obj.handlers), flash=FLASH.get(request.query_params.get("done", "")))

    async def action(self, request: Request) -> Response:
        what, name, key = (request.path_params[k] for k in ("action", "name", "key"))
        refused = await self.ui.refused(request)
        if refused is not None:
            return refused
        form = await self.ui.form(request)  # read already: the fields are kept
        obj = self.declared().get(name)
        if obj is None or what not in FLASH:
            return self.ui.render(request, "error.html", status_code=404, title="Not found",
                                  message=f"no keyed object {name!r} or no action {what!r} (save, clear)")
        typed = str(form.get("state", ""))
        try:
            version = int(str(form.get("if_version", "")))
        except ValueError:
            return await self.state(request, error="the form lost the version it edits: reload the page",
                                    status_code=400)
        try:
            if what == "save":
                try:
                    plain = json.loads(typed)
                except ValueError as e:
                    raise ValueError(f"the state is not JSON ({e})") from None
                try:
                    value = msgspec.convert(plain, obj.state_type, strict=False)
                except (msgspec.ValidationError, TypeError) as e:
                    raise ValueError(f"that is not a state of object {obj.name!r}: {e}") from None
                await self.call(self.ui.engine.set_object_state, obj, key, value, if_version=version)
            else:
                await self.call(self.ui.engine.clear_object_state, obj, key, if_version=version)
        except ObjectVersionConflict as e:
            return await self.state(request, error=f"{what} refused, nothing changed: {e}. The state below is "
                                    "the current one; your text is kept under it.", typed=typed, status_code=409)
        except (FuseeError, ValueError, TypeError) as e:
            return await self.state(request, error=f"{what} refused, nothing changed: {e}", typed=typed,
                                    status_code=400)
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/objects/{quote(name, safe='')}/{quote(key, safe='')}?done={what}",
                                status_code=303)


def routes(ui: Pages) -> list[BaseRoute]:
    pages = ObjectPages(ui)
    guard = ui.guard
    return [
        Route("/objects", guard(pages.index), name="ui-objects"),
        Route("/objects/action/{action}/{name}/{key:path}", guard(pages.action), methods=["POST"]),
        Route("/objects/{name}/{key:path}", guard(pages.state), name="ui-object"),
    ]
