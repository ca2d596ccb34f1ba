"""The values that name a workflow and what it answers: workflow, signal, query and update definitions.

Plain frozen data, below the runtime and the declaring API alike: the runtime
(``fusee.runtime``) reads them and ``fusee.definitions`` makes them (and
re-exports them, their public home).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
#: A workflow's result type: a workflow returning int is one that returns a number.
R_co = TypeVar("R_co", covariant=True)


@dataclasses.dataclass(frozen=True)
class SignalDef(Generic[T]):
    """A named signal carrying values of ``type``; declare with :func:`fusee.signal`."""

    name: str
    type: Any = Any


@dataclasses.dataclass(frozen=True)
class QueryDef(Generic[R_co]):
    """A named query whose answers are of ``result_type``; declare with :func:`fusee.query`."""

    name: str
    result_type: Any = Any


@dataclasses.dataclass(frozen=True)
class UpdateDef(Generic[T]):
    """A named update taking an argument of ``arg_type`` and answering ``result_type``; declare with :func:`fusee.update`."""

    name: str
    arg_type: Any = Any
    result_type: Any = Any


@dataclasses.dataclass(frozen=True)
class WorkflowDef(Generic[T, R_co]):
    """A registered workflow: its name, version, code and the types of its input and result.

    Calling it directly is an error; start it through an engine.
    """

    name: str
    fn: Callable[..., Awaitable[Any]]
    version: int
    input_type: Any
    result_type: Any
    takes_input: bool
    #: A ``fusee.Debounce`` or ``fusee.Batch`` rule: the workflow runs on windows of
    #: events given to ``engine.enqueue`` (None: an ordinary workflow).
    window: Any = None

    def __call__(self, *args: object, **kwargs: object) -> typing.NoReturn:
        raise TypeError(
            f"workflow '{self.name}' is not called directly: use "
            f"await engine.start({self.fn.__name__}, workflow_id, input) or engine.execute(...)"
        )
