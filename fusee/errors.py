"""Every error Fusee raises, in one place.

Each message says what happened and what to do about it. This module imports
nothing else of Fusee, so every layer (the core included) may use it.
"""

from __future__ import annotations


class FuseeError(Exception):
    """Base of every error Fusee raises."""


# --- core ---------------------------------------------------------------


class CorruptRecord(FuseeError):
    """Bytes that should hold a journal record do not decode as one.

    ``path`` and ``offset`` name the log file and the batch holding the
    record when it was read from disk (None otherwise).
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        self.path = path
        self.offset = offset
        self.detail = message
        where = f" (in {path}, batch at byte {offset})" if path is not None else ""
        super().__init__(f"{message}{where}")


class DeterminismError(FuseeError):
    """Workflow code did something its journal says it did not do the first time.

    ``seq`` is the journal position where code and journal disagree (None when
    the disagreement has no position). Fix the code (or guard the change with
    ``ctx.patched``) and reopen: the run replays again.
    """

    def __init__(self, message: str, seq: int | None = None) -> None:
        self.seq = seq
        self.detail = message
        where = f" at journal position {seq}" if seq is not None else ""
        super().__init__(f"determinism error{where}: {message}")


class StreamError(FuseeError, ValueError):
    """A stream was used against its rules: written by someone other than its
    owner, appended to after it closed, or written from a step that no longer
    runs. The message names the stream and the rule; fix the calling code."""


# --- storage -------------------------------------------------------------


class StorageError(FuseeError):
    """The engine's directory cannot be used as asked."""


#: What ``LogCorrupted`` advises unless the case calls for other advice.
TRUNCATE_ADVICE = (
    "Copy the directory first; then reopen with truncate_corrupt=True to cut the log at the "
    "damage (every record after it, acknowledged or not, is lost)."
)


class LogCorrupted(StorageError):
    """Damage the log cannot explain by a crash: acknowledged data may be affected.

    The engine refuses to open instead of dropping data silently. The message
    names the file and byte offset, and says what is safe to do for this case
    (``advice``): sometimes reopening with ``truncate_corrupt=True``, sometimes
    restoring a file from a backup, where truncating would not help.
    """

    def __init__(self, path: str, offset: int, reason: str, advice: str = TRUNCATE_ADVICE) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        self.advice = advice
        super().__init__(
            f"log file {path} is damaged at byte {offset} ({reason}): refusing to open so that "
            f"no acknowledged record is dropped silently. {advice}"
        )


class LogFailed(StorageError):
    """The log hit an I/O failure (a failed fdatasync, a write error): it takes nothing more.

    Nothing that was not acknowledged before the failure is durable. Close the
    engine and reopen the directory; recovery reads what the disk really holds.
    """


class DiskFull(LogFailed):
    """The disk is full (ENOSPC). Nothing acknowledged is lost; free space and reopen."""


class NotARegularFile(StorageError):
    """Something other than a regular file (a FIFO, a socket, a device, a directory) is where
    the engine keeps one of its files. ``path`` names it and ``kind`` says what it is.

    It was neither read nor written. Move it away (restoring the file from a backup if
    one was there) and open again.
    """

    def __init__(self, path: str, kind: str) -> None:
        self.path = path
        self.kind = kind
        super().__init__(
            f"{path} is {kind}, not a regular file: Fusee keeps a file of its own there, so "
            "something else replaced it. Nothing was read from it or written to it, and the "
            "directory is released. Move it away (restore the file from a backup if one was "
            "there) and open the directory again."
        )


class DirectoryLocked(StorageError):
    """Another process holds the engine directory."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        holder = f"process {pid}" if pid else "another process"
        super().__init__(
            f"{path} is in use by {holder}: one engine directory belongs to one process. "
            "Stop that process or open another directory."
        )


class StaleEpoch(StorageError):
    """An engine directory's epoch went back: two owners, or a file restored under a live one."""


class BackupError(FuseeError):
    """A backup or a restore could not be done as asked (the message says why and what to do)."""


class BackupUnavailable(BackupError):
    """The backup target cannot be reached or used (no client library, no bucket, refused
    credentials, a failing server). Nothing of the engine's directory is affected."""


class BackupCorrupted(BackupError):
    """An object in the backup target is missing or does not match the checksum its manifest
    recorded: the point named cannot be restored as it was taken (try an earlier one)."""


class NoBackupPoint(BackupError):
    """The backup target holds no point that matches the restore asked for (none yet, or none at
    or before the time or position given)."""


class OwnerUnreachable(FuseeError):
    """A follower found no owner of its engine directory to route a call to within the call's deadline.

    Nothing was sent, so nothing was done: the call may be made again.
    """


class RoutingRefused(FuseeError):
    """A routing connection's other side did not prove the PostgreSQL namespace's routing secret.

    Engines of one namespace prove to each other, on every TCP connection, that
    they can read the namespace's tables; a process that cannot (another
    database, another namespace, someone else on the network) is refused.
    """


class InvalidRouteTLS(FuseeError, ValueError):
    """``route_tls=`` is not a usable :class:`fusee.RouteTLS`: a wrong type, or a certificate,
    key or authority file that cannot be read or does not parse (the message names it).
    Nothing was opened."""


class OutcomeUnknown(FuseeError):
    """The owner of the engine directory went away while it handled a routed call.

    The call may or may not have been done (and made durable) before it died, and
    repeating it is not safe (it is not idempotent). Look at the run (``describe``,
    ``journal``) once a new owner serves, then decide whether to call again.
    """

    def __init__(self, message: str, *, method: str = "") -> None:
        self.method = method
        super().__init__(message)


class FencedSender(FuseeError):
    """A message between parts came from a holder whose part has a newer holder now.

    The sender's lease was taken over (its epoch is fenced), so nothing it sends is
    applied: the new holder sends again what its runs still owe.
    """


class ShardCountMismatch(StorageError):
    """The directory was created with another shard count."""


class NotAnEngineDirectory(StorageError):
    """The path is not an engine directory: a file, a directory holding other things, or a missing one.

    Nothing in it was created, changed or removed. Point the engine at an
    empty or new directory, or at one that an engine created.
    """


class InvalidMeta(StorageError):
    """The directory's meta file is damaged or holds values out of range; the message names it.

    The meta file is ``{"format": 3, "shards": N}``. Restore it from a backup,
    or rewrite it by hand with the shard count the directory was created with.
    """



class DatabaseUnavailable(StorageError):
    """``Engine.open("postgresql://...")`` could not connect, or the DSN is not one PostgreSQL accepts.

    The message names the server and database (never the password) and the
    driver's reason. Nothing was created or changed.
    """


class SchemaVersionMismatch(StorageError):
    """The namespace's tables were made by a newer Fusee (a higher schema version) than this one.

    This version cannot read them and changes nothing: upgrade Fusee, or open
    another namespace.
    """

    def __init__(self, namespace: str, found: int, supported: int) -> None:
        self.namespace = namespace
        self.found = found
        self.supported = supported
        super().__init__(
            f"the PostgreSQL namespace {namespace!r} holds schema version {found}, but this version "
            f"of Fusee reads versions up to {supported}: it was written by a newer Fusee. Nothing "
            "was changed. Upgrade Fusee on this machine, or open another namespace."
        )


class LeaseHeld(StorageError):
    """Another engine holds the namespace's lease (it is live: renewed and not expired).

    One namespace is served by one engine at a time. The message names the
    holder, its epoch and when its lease expires if it stops renewing.
    """

    def __init__(self, namespace: str, owner: str, epoch: int, expires_in: float,
                 address: str | None = None) -> None:
        self.namespace = namespace
        self.owner = owner
        self.epoch = epoch
        self.expires_in = expires_in
        self.address = address
        at = f" (serving at {address})" if address else ""
        super().__init__(
            f"the PostgreSQL namespace {namespace!r} is held by {owner}{at} with epoch {epoch}; its "
            f"lease expires in {max(expires_in, 0.0):.1f} s unless renewed. One namespace is served by "
            "one engine at a time: stop that engine, wait for its lease to expire (a crashed "
            "holder's lease does), or open another namespace."
        )


class LeaseLost(LogFailed):
    """The engine's lease was taken over (or expired) before a flush: the flush made nothing durable.

    Another engine may now serve the namespace with a higher epoch, so this
    engine's log takes no more records and acknowledges nothing more: close it.
    Opening it again waits for nothing: it is refused while the new holder
    renews its lease.
    """

class DirectoryMoved(LeaseLost):
    """The engine directory's path no longer names the directory this engine locked.

    It was renamed, deleted or replaced (a restored copy, say) while the engine had it
    open. The engine keeps writing only into the directory it locked, so it never
    touches whatever the path names now; but a restart on the path would not find what
    it writes, so its log takes no more records and acknowledges nothing more (calls
    raise ``EngineClosed``). Everything acknowledged before is in the directory it
    locked, wherever that is now. Close the engine, decide which directory to keep,
    and open that one.
    """

# --- engine and client API --------------------------------------------


class NotFound(FuseeError):
    """No workflow with that ID exists (never started, or forgotten after its retention)."""


class WorkflowEnded(FuseeError):
    """The workflow's run has ended: it takes no more signals, updates, cancels, terminates or resumes.

    ``workflow_id`` names it and ``status`` says how it ended ("ok",
    "failed", "cancelled", "terminated", ...). Its result stays available
    (``result()``) and its queries are answered until its retention ends
    (then the ID is :class:`NotFound`). To run the ID again, start it with
    ``if_finished="start"``.
    """

    def __init__(self, workflow_id: str, status: str, action: str = "") -> None:
        self.workflow_id = workflow_id
        self.status = status
        refused = f"{action} refused: " if action else ""
        super().__init__(
            f"{refused}workflow '{workflow_id}' has ended ({status}) and takes no more signals, "
            "updates, cancels, terminates or resumes. Its result() and queries stay available; "
            "to run the ID again, start it with if_finished='start'"
        )


class InvalidWorkflowId(FuseeError, ValueError):
    """A workflow ID that cannot be journaled (not valid Unicode text)."""


class InvalidQuery(FuseeError, ValueError):
    """A ``where=`` filter of :meth:`Engine.list` that does not parse or does not make sense.

    ``position`` is the 0-based character offset in the query text where the
    problem is; the message quotes the text from there. Fix the query (see the
    query language in docs/api.md) and call again.
    """

    def __init__(self, message: str, query: str, position: int) -> None:
        self.query = query
        self.position = position
        near = query[position:position + 20] if position < len(query) else "the end"
        super().__init__(f"invalid query at position {position} (near {near!r}): {message}")


class UnknownStatus(InvalidQuery):
    """A ``status`` in a query (``where status = ...``, ``--status``) that no run can have.

    ``known`` lists the statuses there are (``fusee.engine.visibility.STATUSES``);
    the message names them: pick one of those.
    """

    def __init__(self, status: str, known: tuple[str, ...], query: str, position: int) -> None:
        self.status = status
        self.known = known
        super().__init__(f"unknown status {status!r}: use one of {', '.join(known)}", query, position)


class HistoryUnavailable(FuseeError):
    """The engine was opened with ``keep_history=False`` and the run has ended: only its
    start and ending are kept, so what needs its whole journal (a query answered from
    a replay, a reset or a fork) cannot be done. Open with ``keep_history=True`` to keep
    the journals of runs that end from then on."""


class RunNotCurrent(FuseeError):
    """A stream read pinned to run ``run_id`` of workflow ``workflow_id``, which is no longer
    its current run (``current_run_id``): it ended and handed over (continue-as-new, a reset,
    a new start), and the engine keeps only the current run's chunks. Read the current run
    from offset 0 (``run_id=current_run_id``), or read without ``run_id``."""

    def __init__(self, workflow_id: str, run_id: int, current_run_id: int) -> None:
        self.workflow_id = workflow_id
        self.run_id = run_id
        self.current_run_id = current_run_id
        super().__init__(
            f"the stream read is pinned to run {run_id} of workflow '{workflow_id}', whose current "
            f"run is {current_run_id}: run {run_id} ended and its chunks are no longer kept. Read "
            f"run {current_run_id} from offset 0 (run_id={current_run_id}), or read without run_id"
        )


class AlreadyExists(FuseeError):
    """A workflow run with that ID exists already."""


class UnknownWorkflow(FuseeError):
    """No workflow of that name is registered with the engine."""


class UnknownSignal(FuseeError, ValueError):
    """A signal sent by name (HTTP, CLI, UI, another process) that its run neither waits for nor
    any ``fusee.signal(...)`` of the engine's process declares; nothing was recorded.

    ``name`` is the name sent, ``workflow_id`` the run's ID and ``known`` the signal names
    that would have been accepted (the run's waits and the process's declarations).
    """

    def __init__(self, workflow_id: str, name: str, known: list[str], message: str) -> None:
        self.workflow_id = workflow_id
        self.name = name
        self.known = known
        super().__init__(message)


class WorkflowFailed(FuseeError):
    """A workflow run ended without a result (failed, timed out, terminated...).

    ``status`` says how it ended and ``cause`` carries the recorded error.
    """

    def __init__(self, message: str, *, status: str = "failed", cause: object = None) -> None:
        self.status = status
        self.cause = cause
        super().__init__(message)


class StepFailed(FuseeError):
    """A step's function raised and its retries ran out (or the error is not retryable)."""

    def __init__(self, message: str, *, step: str = "", error_type: str = "") -> None:
        self.step = step
        self.error_type = error_type
        super().__init__(message)


class StepTimeout(FuseeError, TimeoutError):
    """A step's function ran longer than its ``timeout``; the attempt counts as failed.

    An async function is cancelled at the timeout. A synchronous one cannot be
    interrupted: it runs to its end, its result is discarded, and the next
    attempt starts only after it returned.
    """


class NotInAStep(FuseeError, RuntimeError):
    """``fusee.step_info()`` was called outside a step function."""


class CompletionFailed(FuseeError):
    """The outside world reported that an async completion failed
    (``engine.fail_completion(token, message)``); raised where the workflow awaits it."""


class Cancelled(FuseeError):
    """The run was cancelled: raised at the operations the workflow awaits.

    Workflow code may catch it and run compensation steps.
    """


class Busy(FuseeError):
    """The engine is overloaded and refused the request; retry later."""


class WrongEventLoop(FuseeError, RuntimeError):
    """The engine was called from another thread or event loop than its own.

    Nothing was recorded. From another thread use ``engine.run_threadsafe(...)``
    (or ``asyncio.run_coroutine_threadsafe(coro, engine.loop)``).
    """


class EngineClosed(FuseeError):
    """The engine is closed (or its log failed): open it again to continue."""


class UpdateRejected(FuseeError):
    """An update's validator refused it; nothing was recorded."""


class UpdateFailed(FuseeError):
    """An update could not run (no handler, the run ended first) or its handler raised."""


class QueryFailed(FuseeError):
    """A query could not be answered (no handler registered, or the handler raised)."""


class WorkflowCancelled(WorkflowFailed, Cancelled):
    """The run ended cancelled. Caught by both ``except WorkflowFailed`` and ``except Cancelled``."""


class WorkflowTerminated(WorkflowFailed):
    """The run was terminated from outside; its code did not finish."""


class WorkflowTimedOut(WorkflowFailed):
    """The run (or child) exceeded its deadline."""


class NondeterministicCall(FuseeError):
    """Workflow code called something that is not durable or not deterministic.

    Workflow code runs on a per-run loop that has no clock, no timers and no
    I/O: on replay it must take the same path, so it may only await ``ctx``
    operations and asyncio primitives (tasks, gather, wait, Event, Queue...).
    """

    def __init__(self, call: str, hint: str = "") -> None:
        self.call = call
        advice = hint or (
            "use await ctx.sleep(...) for delays, the timeout= of ctx operations for "
            "timeouts, and ctx.step(...) for I/O and anything with effects"
        )
        super().__init__(
            f"{call} is not allowed inside workflow code: it is not durable and would not "
            f"replay the same way; {advice}"
        )


class SerializationError(FuseeError, TypeError):
    """A value cannot be converted to bytes, or bytes do not convert to the annotated type.

    Inputs, results and payloads may be JSON types, dataclasses, TypedDicts,
    msgspec Structs, enums, datetimes, UUIDs and pydantic models.
    """


class InvalidDuration(FuseeError, ValueError):
    """A duration is not one of the accepted forms.

    Accepted: seconds as an int or float (not a bool), a ``timedelta``, or a
    string of one or more ``<number><unit>`` parts with units ms, s, m, h, d
    from largest to smallest ("250ms", "5s", "1.5m", "1h30m"); never negative.
    """


class InvalidSize(FuseeError, ValueError):
    """A size in bytes is not one of the accepted forms.

    Accepted: a positive ``int`` of bytes (not a bool), or a string of a
    number and a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB,
    TiB (powers of 1024), such as "256MiB", "1.5GB" or "4096B".
    """


class RecordedError(FuseeError):
    """An error as the journal recorded it: its type, module, message and traceback text.

    Recorded errors are data, not pickles: the original exception object is
    gone (it may have been raised in an earlier process), so this stands in as
    the ``__cause__`` of the ``StepFailed`` or ``WorkflowFailed`` that reports it.
    """

    def __init__(self, type_name: str, module: str, message: str, traceback: str | None) -> None:
        self.type_name = type_name
        self.module = module
        self.message = message
        self.traceback = traceback
        qual = type_name if module in ("builtins", "") else f"{module}.{type_name}"
        text = f"{qual}: {message}" if message else qual
        if traceback:
            text += "\n\nRecorded traceback:\n" + traceback.rstrip()
        super().__init__(text)


# --- payload encryption (fusee.encryption) -----------------------------------


class CodecError(FuseeError):
    """A payload could not be encoded or decoded by the engine's payload codec.

    Raised instead of ever handing out garbage: the journal is left as it is.
    """


class MissingKey(CodecError):
    """A payload is encrypted with a key the codec was not given (``key_id`` names it).

    Reopen the engine with a codec that holds that key (keep old keys in
    ``keys=`` after a rotation until every record written with them is gone).
    """

    def __init__(self, key_id: str, message: str | None = None) -> None:
        self.key_id = key_id
        super().__init__(message or (
            f"a payload is encrypted with key {key_id!r}, which the codec does not have: open the "
            f"engine with a codec whose keys include {key_id!r} (keep retired keys in keys= until "
            "no record written with them remains)"
        ))


class DecryptionFailed(CodecError):
    """A payload's ciphertext does not decrypt: it was changed, cut, moved from another record, or the
    key is not the one it names.

    ``key_id`` names the key the payload says it was encrypted with (None when
    even that could not be read). When the engine read it from a record,
    ``run`` is that record's numeric run ID and ``record`` names the record
    and field (``"Start.input"``); both are None otherwise.
    """

    def __init__(self, message: str, key_id: str | None = None, *, run: int | None = None,
                 record: str | None = None) -> None:
        self.key_id = key_id
        self.run = run
        self.record = record
        super().__init__(message)


# --- keyed objects and step limits ----------------------------------------------


class UnknownLimit(FuseeError, ValueError):
    """A step (or ``set_limit``) names a limit the engine was not opened with.

    ``name`` is the limit named. Declare it with
    ``Engine.open(..., limits=[fusee.Limit(name, ...)])``.
    """

    def __init__(self, message: str, *, name: str) -> None:
        self.name = name
        super().__init__(message)


class ObjectVersionConflict(FuseeError):
    """An operator's edit of an object's state named a version the state no longer has.

    ``expected`` is the ``if_version`` given, ``actual`` the state's version:
    read the state again (``engine.object_state``) and retry. Nothing changed.
    """

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class ObjectStateReadOnly(FuseeError, RuntimeError):
    """A shared handler called ``ctx.set_state``: shared handlers read the state, only
    exclusive handlers write it (declare the handler with ``@obj.exclusive``)."""


class ObjectCallFailed(FuseeError):
    """An object handler raised: ``type_name`` and ``message`` are its error as recorded
    (the same answer for every repeat of the call's ``call_id``)."""

    def __init__(self, message: str, *, type_name: str, error_message: str) -> None:
        self.type_name = type_name
        self.error_message = error_message
        super().__init__(message)


# --- telemetry ------------------------------------------------------------


class TelemetryUnavailable(FuseeError, ImportError):
    """Telemetry was asked for (``Engine.open(..., telemetry=...)``) but OpenTelemetry is not installed.

    Install the extra (``pip install 'fusee[otel]'``, which brings ``opentelemetry-api``) and
    configure a tracer or meter provider, or open the engine with ``telemetry=False``.
    """


# --- the operator's tools (HTTP API and CLI) -----------------------------------


class InsecureBind(FuseeError, ValueError):
    """``fusee serve`` (or ``fusee.http.serve``) was asked to listen on an address other
    machines reach, without a token: anyone there could start, signal or terminate runs.
    Pass ``--token`` (or ``FUSEE_TOKEN``), or listen on a loopback address (127.0.0.1)."""


class ApiError(FuseeError):
    """A Fusee HTTP API answered with an error.

    ``status`` is the HTTP status, ``type`` the error's type name as the server
    named it (``NotFound``, ``InvalidQuery``, ...), ``field`` the request field at
    fault (None when no one field is).
    """

    def __init__(self, status: int, type: str, message: str, field: str | None = None) -> None:
        self.status = status
        self.type = type
        self.field = field
        self.message = message
        super().__init__(message)


class ReadOnlyTarget(FuseeError):
    """A command that changes runs was pointed at a directory: a directory is read offline and
    read-only. Point the command at the running application instead (``--url http://...``)."""
class InvalidSchedule(FuseeError, ValueError):
    """A schedule's spec is wrong (no or two of every/cron, a bad cron expression or timezone,
    an unknown overlap policy): nothing was recorded."""


class ScheduleExists(AlreadyExists):
    """A schedule with this ID exists with another spec: delete it first to replace it
    (scheduling the same ID with the same spec again is a no-op)."""


class ScheduleNotFound(NotFound):
    """No schedule with this ID exists (it was never made, or it was deleted)."""


class NotWindowed(FuseeError, TypeError):
    """``engine.enqueue`` was given a workflow declared without ``debounce=`` or ``batch=``."""


class EngineForked(FuseeError, RuntimeError):
    """An engine (:class:`fusee.Engine` or :class:`fusee.SyncEngine`) was opened in one process
    and called in a child forked from it.

    The engine's loop, threads, lock on the directory and database connections
    do not follow a ``fork`` (the child let go of its copies of them); nothing
    was recorded. Open the engine in each process that uses it, after the fork
    (gunicorn: without ``--preload``, or lazily at first use; Celery: in
    ``worker_process_init``; ``multiprocessing``: the ``spawn`` or
    ``forkserver`` start method), and not in the parent.
    """
