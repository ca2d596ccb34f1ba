"""Fusee: durable execution for asyncio programs, at the speed of the disk.

Declare workflows with :func:`workflow`, open an :class:`Engine` on a directory,
and start them; every operation a workflow starts through its :class:`Ctx` is
journaled, so after a crash the run replays and continues where it was.
"""

import logging

from fusee.backup import Backup, BackupStatus
from fusee.definitions import (
    QueryDef,
    SignalDef,
    UpdateDef,
    WorkflowDef,
    query,
    signal,
    update,
    workflow,
)
from fusee.encryption import AesGcmCodec, Codec
from fusee.engine.bulk import BulkResult
from fusee.engine.engine import AuditEntry, Engine, RunHandle, RunSummary
from fusee.engine.visibility import Metrics, RunPage, ShardMetrics
from fusee.errors import (
    AlreadyExists,
    Busy,
    Cancelled,
    CodecError,
    CompletionFailed,
    CorruptRecord,
    DecryptionFailed,
    DeterminismError,
    EngineClosed,
    EngineForked,
    FencedSender,
    FuseeError,
    HistoryUnavailable,
    InvalidQuery,
    InvalidRouteTLS,
    InvalidSchedule,
    MissingKey,
    NotFound,
    NotInAStep,
    NotWindowed,
    ObjectCallFailed,
    ObjectStateReadOnly,
    ObjectVersionConflict,
    OutcomeUnknown,
    OwnerUnreachable,
    QueryFailed,
    RoutingRefused,
    RunNotCurrent,
    ScheduleExists,
    ScheduleNotFound,
    SerializationError,
    StepFailed,
    TelemetryUnavailable,
    UnknownLimit,
    UnknownSignal,
    UnknownStatus,
    UnknownWorkflow,
    UpdateFailed,
    WorkflowCancelled,
    WorkflowEnded,
    WorkflowFailed,
    WorkflowTerminated,
    WorkflowTimedOut,
    WrongEventLoop,
)
from fusee.flow.api import ScheduleInfo
from fusee.flow.rules import Batch, Debounce, Receipt
from fusee.limits import Limit, LimitStatus
from fusee.objects import Handler, ObjectCtx, ObjectDef, ObjectState, object
from fusee.retry import Retry
from fusee.runtime.context import ChildHandle, Ctx, StepInfo
from fusee.runtime.streams import StreamBatch
from fusee.scale import placement as _placement  # noqa: F401  (installs Engine.open's owner-or-follower choice)
from fusee.step import step, step_info
from fusee.steptimes import StepAttempt
from fusee.sync import SyncEngine, SyncRunHandle
from fusee.telemetry import Telemetry
from fusee.tls import RouteTLS
from fusee.version import __version__ as __version__

# A library logs, the application decides where it goes: nothing prints unless configured.
logging.getLogger("fusee").addHandler(logging.NullHandler())

__all__ = [
    "AesGcmCodec",
    "AlreadyExists",
    "AuditEntry",
    "Backup",
    "BackupStatus",
    "Batch",
    "BulkResult",
    "Busy",
    "Cancelled",
    "ChildHandle",
    "Codec",
    "CodecError",
    "CompletionFailed",
    "CorruptRecord",
    "Ctx",
    "Debounce",
    "DecryptionFailed",
    "DeterminismError",
    "Engine",
    "EngineClosed",
    "EngineForked",
    "FencedSender",
    "FuseeError",
    "Handler",
    "HistoryUnavailable",
    "InvalidQuery",
    "InvalidRouteTLS",
    "InvalidSchedule",
    "Limit",
    "LimitStatus",
    "Metrics",
    "MissingKey",
    "NotFound",
    "NotInAStep",
    "NotWindowed",
    "ObjectCallFailed",
    "ObjectCtx",
    "ObjectDef",
    "ObjectState",
    "ObjectStateReadOnly",
    "ObjectVersionConflict",
    "OutcomeUnknown",
    "OwnerUnreachable",
    "QueryDef",
    "QueryFailed",
    "Receipt",
    "Retry",
    "RouteTLS",
    "RoutingRefused",
    "RunHandle",
    "RunNotCurrent",
    "RunPage",
    "RunSummary",
    "ScheduleExists",
    "ScheduleInfo",
    "ScheduleNotFound",
    "SerializationError",
    "ShardMetrics",
    "SignalDef",
    "StepAttempt",
    "StepFailed",
    "StepInfo",
    "StreamBatch",
    "SyncEngine",
    "SyncRunHandle",
    "Telemetry",
    "TelemetryUnavailable",
    "UnknownLimit",
    "UnknownSignal",
    "UnknownStatus",
    "UnknownWorkflow",
    "UpdateDef",
    "UpdateFailed",
    "WorkflowCancelled",
    "WorkflowDef",
    "WorkflowEnded",
    "WorkflowFailed",
    "WorkflowTerminated",
    "WorkflowTimedOut",
    "WrongEventLoop",
    "object",
    "query",
    "signal",
    "step",
    "step_info",
    "update",
    "workflow",
]
