"""Where backups go: the ``Target`` protocol, a local directory, and ``open_target``.

A target stores immutable objects by key (``fusee.backup.manifest`` says which).
``put`` returns only once the object is stored *and verified*: a local target
reads it back and compares its sha256, S3 checks the MD5 the upload carries and
refuses a body that does not match. Targets raise ``OSError`` (or
``BackupUnavailable``) when they fail: the uploader retries, with backoff.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol, runtime_checkable

from fusee.backup.manifest import sha256
from fusee.errors import BackupUnavailable


@runtime_checkable
class Target(Protocol):
    """A store of objects by key (``a/b/c``)."""

    #: What the target is, for messages (a path, an ``s3://`` URL).
    name: str

    def put(self, key: str, data: bytes) -> None:
        """Stores ``data`` under ``key`` (replacing it) and checks that the store holds exactly it."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; raises ``FileNotFoundError`` when there is none."""
        ...

    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted."""
        ...


class LocalTarget:
    """A directory (a mounted disk, a network file system): one file per object, written to a
    temporary name, fsynced, renamed, its directory fsynced, read back and compared."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.name = self.path
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise BackupUnavailable(f"the backup target {self.path} is a file, not a directory: "
                                    "give a directory (a new one is created)")

    def _file(self, key: str) -> str:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"not an object key: {key!r}")
        return os.path.join(self.path, *parts)

    def put(self, key: str, data: bytes) -> None:
        dst = self._file(key)
        folder = os.path.dirname(dst)
        os.makedirs(folder, exist_ok=True)
        tmp = f"{dst}.tmp-{os.getpid()}-{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dst)
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        with open(dst, "rb") as f:
            if sha256(f.read()) != sha256(data):
                raise OSError(f"{dst} does not read back as written (the target's disk fails?)")

    def get(self, key: str) -> bytes:
        with open(self._file(key), "rb") as f:
            return f.read()

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._file(key))

    def list(self, prefix: str) -> list[str]:
        base, _, _ = prefix.rpartition("/")
        top = os.path.join(self.path, *base.split("/")) if base else self.path
        out: list[str] = []
        for folder, _dirs, files in os.walk(top):
            rel = os.path.relpath(folder, self.path).replace(os.sep, "/")
            for f in files:
                if ".tmp-" in f:
                    continue  # an upload a crash interrupted
                key = f if rel == "." else f"{rel}/{f}"
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def __repr__(self) -> str:
        return f"LocalTarget({self.path!r})"


class PrefixedTarget:
    """The objects of ``inner`` under ``prefix`` (``"part-003/"``), as a target of their own: one
    part's backup inside a parted directory's."""

    def __init__(self, inner: Target, prefix: str) -> None:
        assert prefix.endswith("/") and not prefix.startswith("/"), prefix
        self.inner, self.prefix = inner, prefix
        self.name = f"{inner.name.rstrip('/')}/{prefix.rstrip('/')}"

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(self.prefix + key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(self.prefix + key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(self.prefix + key)

    def list(self, prefix: str) -> list[str]:
        n = len(self.prefix)
        return [k[n:] for k in self.inner.list(self.prefix + prefix)]

    def __repr__(self) -> str:
        return f"PrefixedTarget({self.inner!r}, {self.prefix!r})"


def open_target(target: str | os.PathLike[str] | Target, **options: Any) -> Target:
    """The target ``target`` names: an ``s3://bucket/prefix`` URL (``options``: see
    :class:`fusee.backup.s3.S3Target`), a local directory path, or a ``Target`` as it is."""
    if isinstance(target, Target) and not isinstance(target, str | os.PathLike):
        if options:
            raise TypeError(f"options {sorted(options)} apply to a target given by URL or path")
        return target
    text = os.fspath(target)
    if text.startswith("s3://"):
        from fusee.backup.s3 import S3Target

        return S3Target(text, **options)
    if "://" in text:
        raise BackupUnavailable(f"backup target {text!r}: only local directories and s3:// URLs "
                                "are supported")
    if options:
        raise TypeError(f"options {sorted(options)} apply to s3:// targets, not to a directory")
    return LocalTarget(text)
