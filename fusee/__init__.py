"""Fusee: durable execution for asyncio programs, at the speed of the disk."""

from fusee.errors import (
    AlreadyExists,
    Busy,
    Cancelled,
    CorruptRecord,
    DeterminismError,
    EngineClosed,
    FuseeError,
    NotFound,
    StepFailed,
    UnknownWorkflow,
    WorkflowFailed,
)

__all__ = [
    "AlreadyExists",
    "Busy",
    "Cancelled",
    "CorruptRecord",
    "DeterminismError",
    "EngineClosed",
    "FuseeError",
    "NotFound",
    "StepFailed",
    "UnknownWorkflow",
    "WorkflowFailed",
]
