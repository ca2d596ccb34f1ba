"""Turning a recorded ending (status and payload) into what the caller sees."""

from __future__ import annotations

from fusee import codec
from fusee.core.records import Status
from fusee.errors import (
    FuseeError,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowTerminated,
    WorkflowTimedOut,
)


def _text(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return repr(payload)


def workflow_error(workflow_id: str, status: Status, payload: bytes) -> FuseeError:
    """The exception a caller of ``result()`` gets for a run that ended with ``status``."""
    if status == Status.FAILED:
        try:
            return codec.decode_error(payload).workflow_failed(workflow_id)
        except FuseeError:
            what = _text(payload)
            return WorkflowFailed(f"workflow '{workflow_id}' failed: {what}", status="failed", cause=what)
    if status == Status.CANCELLED:
        reason = _text(payload)
        return WorkflowCancelled(
            f"workflow '{workflow_id}' was cancelled" + (f": {reason}" if reason else ""),
            status="cancelled",
            cause=reason,
        )
    if status == Status.TERMINATED:
        reason = _text(payload)
        return WorkflowTerminated(
            f"workflow '{workflow_id}' was terminated" + (f": {reason}" if reason else ""),
            status="terminated",
            cause=reason,
        )
    if status == Status.TIMED_OUT:
        return WorkflowTimedOut(f"workflow '{workflow_id}' timed out", status="timed_out")
    raise AssertionError(f"no error for status {status!r}")
