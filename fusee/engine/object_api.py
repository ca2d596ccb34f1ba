"""The engine's calls for keyed objects (``engine.call`` and the operators' state edits).

Each is an update of the key's run (see :mod:`fusee.objects`), started with
the update when the key has no run yet, so a call or an edit is durable in
the key's journal before its answer comes back.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, TypeVar, cast, overload

from fusee import sabotage
from fusee.definitions import QueryDef, UpdateDef, WorkflowDef
from fusee.errors import (
    NotFound,
    ObjectCallFailed,
    ObjectVersionConflict,
    UnknownWorkflow,
    UpdateFailed,
    WorkflowEnded,
)
from fusee.objects import CALL, EDIT, STATE, Handler, ObjectDef, ObjectState, to_plain
from fusee.runtime.env import Env
from fusee.runtime.runtime import Runtime

R = TypeVar("R")
S = TypeVar("S")
A = TypeVar("A")

#: How often a call is offered again when the key's run handed over (continue-as-new) meanwhile.
_HANDOVER_RETRIES = 1000


class _Host(Protocol):
    """What these calls use of the engine they are mixed into."""

    @property
    def _rt(self) -> Runtime: ...

    @property
    def _env(self) -> Env: ...

    def _check_open(self) -> None: ...

    async def query(self, workflow_id: str, query: QueryDef[Any], arg: Any = None) -> Any: ...

    async def update_with_start(
        self, workflow: WorkflowDef[Any, Any] | str, workflow_id: str, input: Any, update: UpdateDef[Any],
        arg: Any = None, *, update_id: str | None = None,
    ) -> Any: ...


class ObjectCalls:
    """Mixed into :class:`fusee.Engine`."""

    @overload
    async def call(self, handler: Handler[R, None], key: str, arg: None = None, *, call_id: str | None = None) -> R: ...

    @overload
    async def call(self, handler: Handler[R, A], key: str, arg: A, *, call_id: str | None = None) -> R: ...

    async def call(self, handler: Handler[R, Any], key: str, arg: Any = None, *, call_id: str | None = None) -> R:
        """Runs ``handler`` of its object for ``key`` and returns its result once durable.

        Exclusive handlers of one key run one at a time in arrival order; shared
        ones run together, never beside an exclusive one. A ``call_id`` that was
        answered before gets the same answer (also after a crash) without the
        handler running again. A handler that raised raises
        :class:`fusee.ObjectCallFailed` here (the same for every repeat).
        """
        eng = cast(_Host, self)
        if not isinstance(handler, Handler):
            raise TypeError(f"engine.call takes a handler made with @obj.exclusive or @obj.shared, got {handler!r}")
        obj = handler.obj
        self._check_object(obj)
        wid = obj.workflow_id(key)
        if call_id is None:
            call_id = eng._env.rng.getrandbits(128).to_bytes(16, "big").hex()
        elif not isinstance(call_id, str) or not call_id:
            raise TypeError(f"call_id must be a non-empty string, got {call_id!r}")
        if handler.takes_arg:
            plain = to_plain(arg, handler.arg_type, f"the argument of handler {obj.name}.{handler.name}")
        elif arg is not None:
            raise TypeError(f"handler {obj.name}.{handler.name} takes no argument, got {type(arg).__name__}")
        else:
            plain = None
        update_id = call_id
        if sabotage.active.object_forget_call_ids:
            update_id = eng._env.rng.getrandbits(128).to_bytes(16, "big").hex()
        env = await self._object_update(obj, wid, CALL, {"h": handler.name, "id": call_id, "a": plain}, update_id)
        if "err" in env:
            kind, message = env["err"]
            raise ObjectCallFailed(
                f"handler {obj.name}.{handler.name} for key {key!r} raised {kind}: {message}",
                type_name=kind, error_message=message,
            )
        return obj.decode_result(env["ok"], handler.result_type)  # type: ignore[no-any-return]

    async def object_state(self, obj: ObjectDef[S], key: str) -> ObjectState[S]:
        """``key``'s state and version, once that state is durable (the initial state, version 0,
        for a key never written)."""
        eng = cast(_Host, self)
        self._check_object(obj)
        wid = obj.workflow_id(key)
        for _ in range(_HANDOVER_RETRIES):
            try:
                got = await eng.query(wid, STATE)
            except NotFound:
                return ObjectState(obj.decode_state(obj.initial_json), 0)
            except WorkflowEnded:
                await asyncio.sleep(0)  # handing over to its next run
                continue
            return ObjectState(obj.decode_state(got["state"]), int(got["version"]))
        raise WorkflowEnded(wid, "ended", "object_state")

    async def set_object_state(self, obj: ObjectDef[S], key: str, value: S, *, if_version: int | None = None) -> int:
        """Replaces ``key``'s state, after the exclusive handlers that arrived before; returns the new
        version once durable. With ``if_version`` it applies only if the state still has that
        version (else :class:`fusee.ObjectVersionConflict`, nothing changed)."""
        self._check_object(obj)
        plain = to_plain(value, obj.state_type, f"the state of object {obj.name!r}")
        return await self._edit(obj, key, {"op": "set", "value": plain, "if_version": _version(if_version)})

    async def clear_object_state(self, obj: ObjectDef[Any], key: str, *, if_version: int | None = None) -> int:
        """Puts ``key``'s state back to the object's initial state (as :meth:`set_object_state` does)."""
        self._check_object(obj)
        return await self._edit(obj, key, {"op": "clear", "value": None, "if_version": _version(if_version)})

    async def patch_object_state(
        self, obj: ObjectDef[Any], key: str, patch: list[dict[str, Any]], *, if_version: int | None = None
    ) -> int:
        """Applies a JSON Patch (RFC 6902, with the ``jsonpatch`` library: ``pip install fusee[objects]``)
        to ``key``'s state as JSON; the result must still convert to the state type. A patch that does
        not apply raises :class:`fusee.ObjectCallFailed` and changes nothing."""
        self._check_object(obj)
        try:
            import jsonpatch
        except ImportError:
            raise ImportError("patch_object_state needs the jsonpatch library: pip install 'fusee[objects]'") from None
        try:
            jsonpatch.JsonPatch(patch)  # a malformed patch is refused before anything is recorded
        except Exception as e:
            raise ValueError(f"not a JSON Patch (RFC 6902): {e}") from None
        to_plain(patch, Any, "a JSON Patch")
        return await self._edit(obj, key, {"op": "patch", "value": patch, "if_version": _version(if_version)})

    # --- helpers ---------------------------------------------------------------------------

    def _check_object(self, obj: ObjectDef[Any]) -> None:
        eng = cast(_Host, self)
        eng._check_open()
        if not isinstance(obj, ObjectDef):
            raise TypeError(f"expected an object made with fusee.object(...), got {obj!r}")
        if eng._rt.versions.get((obj.workflow.name, 1)) is not obj.workflow:
            raise UnknownWorkflow(
                f"object {obj.name!r} is not registered with this engine: pass it to "
                "Engine.open(..., workflows=[..., obj])"
            )

    async def _edit(self, obj: ObjectDef[Any], key: str, arg: dict[str, Any]) -> int:
        eng = cast(_Host, self)
        wid = obj.workflow_id(key)
        uid = eng._env.rng.getrandbits(128).to_bytes(16, "big").hex()
        env = await self._object_update(obj, wid, EDIT, arg, uid)
        if "conflict" in env:
            raise ObjectVersionConflict(
                f"object {obj.name!r} key {key!r} has version {env['conflict']}, not {arg['if_version']}: "
                "read it again (engine.object_state) and retry; nothing changed",
                expected=arg["if_version"], actual=env["conflict"],
            )
        if "err" in env:
            kind, message = env["err"]
            raise ObjectCallFailed(f"editing object {obj.name!r} key {key!r} failed: {kind}: {message}; "
                                   "nothing changed", type_name=kind, error_message=message)
        return int(env["ok"])

    async def _object_update(self, obj: ObjectDef[Any], wid: str, update: Any, arg: Any, uid: str) -> Any:
        """Delivers an update to the key's run (starting it if needed), again if the run handed over
        to its next one before accepting it (the same update ID: it is answered once)."""
        eng = cast(_Host, self)
        for _ in range(_HANDOVER_RETRIES):
            try:
                return await eng.update_with_start(obj.workflow, wid, obj.start_input(), update, arg, update_id=uid)
            except (UpdateFailed, WorkflowEnded):
                # Offered while the run continued as new: the next run takes it.
                await asyncio.sleep(0)
        raise UpdateFailed(f"the run of {wid!r} kept ending before it took the update {uid!r}")


def _version(v: object) -> int | None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise TypeError(f"if_version must be a non-negative int or None, got {v!r}")
    return v
