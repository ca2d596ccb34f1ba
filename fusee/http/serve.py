"""``fusee serve module:factory``: open the application's engine and serve its HTTP API with uvicorn."""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import os
import stat
import sys
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import fusee
from fusee.errors import InsecureBind
from fusee.http.auth import check_secret
from fusee.http.guard import DEFAULT_MAX_BODY, LOOPBACK_HOSTS, check_max_body, host_names

#: Where ``fusee serve`` listens unless told otherwise.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8233


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything


def check_bind(host: str, token: str | None, tokens: Mapping[str, str] | None = None) -> None:
    """Raises :class:`fusee.errors.InsecureBind` for a non-loopback ``host`` without a token."""
    if not token and not tokens and not is_loopback(host):
        raise InsecureBind(
            f"refusing to listen on {host} without a token: anyone who reaches it could start, "
            "signal or terminate runs. Pass --token (or set FUSEE_TOKEN) or --tokens-file, or listen on "
            "127.0.0.1")


def _read_private(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read()
    except FileNotFoundError:
        raise ValueError(f"{what} file {path!r} does not exist") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{what} file {path!r} may be read by other users: it holds secrets, so "
                         f"chmod 600 {path}")
    return data


def read_secret(path: str) -> bytes:
    """The key in ``path`` (its first line, without the line end) that signs the web UI's form
    tokens; ValueError when the file is missing, readable by others or the key too short."""
    lines = _read_private(path, "secret").splitlines()
    key = check_secret(lines[0].strip() if lines else b"")
    assert key is not None
    return key


def read_tokens(path: str) -> dict[str, str]:
    """Each person's token from a TOML file with a ``[tokens]`` table (``ada = "..."``).

    The file holds secrets: it is refused (ValueError) when other users may read it
    (chmod 600). A missing file, bad TOML or a value that is not a string is a
    ValueError naming the file.
    """
    raw = _read_private(path, "tokens")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"tokens file {path!r} is not valid TOML: {e}") from None
    table = data.get("tokens")
    if not isinstance(table, dict) or not table:
        raise ValueError(f"tokens file {path!r} needs a [tokens] table of name = \"token\" lines")
    for name, secret in table.items():
        if not isinstance(secret, str):
            raise ValueError(f"tokens file {path!r}: {name}'s token must be a string, got {secret!r}")
    return dict(table)


def served_hosts(host: str, allowed_hosts: Sequence[str] = ()) -> list[str]:
    """The Host names ``fusee serve --host host`` answers to: the loopback names, ``host`` and
    ``allowed_hosts`` (a wildcard address such as 0.0.0.0 is no name a client sends: the names
    it is reached by must be given)."""
    names = host_names([*LOOPBACK_HOSTS, host, *allowed_hosts])
    return list(dict.fromkeys(names))


def load_factory(spec: str) -> Any:
    """The object named by ``module:attribute`` (the current directory is importable)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"give the engine factory as module:function (e.g. myapp:make_engine), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no {attr!r}") from None
    return obj


async def open_engine(factory: Any) -> fusee.Engine:
    """Calls ``factory`` (an Engine, a function returning one or an awaitable of one)."""
    engine = factory() if callable(factory) else factory
    if inspect.isawaitable(engine):
        engine = await engine
    if not isinstance(engine, fusee.Engine):
        raise TypeError(f"the engine factory must return a fusee.Engine (or an awaitable of one), "
                        f"got {type(engine).__name__}")
    return engine


async def serve(factory: Any, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                token: str | None = None, tokens: Mapping[str, str] | None = None,
                secret: bytes | None = None, log_level: str = "info",
                allowed_hosts: Sequence[str] = (), max_body: int = DEFAULT_MAX_BODY) -> None:
    """Opens the engine from ``factory`` on this loop, serves ``fusee.http.app`` until
    interrupted (SIGINT/SIGTERM), then closes the engine.

    The app answers requests whose ``Host`` is a loopback name, ``host`` or one
    of ``allowed_hosts`` (others get 400), and takes bodies up to ``max_body``
    bytes. Raises :class:`fusee.errors.InsecureBind` before opening anything
    when ``host`` is not loopback and no ``token`` or ``tokens`` is given, and
    ValueError for a bad host name or limit. ``tokens`` maps each person's name
    to their token: the audit records who acted. ``secret`` signs the web UI's
    form tokens (the same on every worker).
    """
    import uvicorn

    from fusee import logs
    from fusee.http.app import app

    check_bind(host, token, tokens)
    names = served_hosts(host, allowed_hosts)
    check_max_body(max_body)
    logs.configure(log_level)  # the engine's own lines (recovery, retries, failures) with their run fields
    engine = await open_engine(factory)
    try:
        config = uvicorn.Config(app(engine, token=token, tokens=tokens, secret=secret, allowed_hosts=names,
                                    max_body=max_body), host=host,
                                port=port, log_level=log_level, lifespan="off")
        server = uvicorn.Server(config)
        await server.serve()
        if not server.started:
            raise OSError(f"could not listen on {host}:{port} (is the port in use?)")
    finally:
        await engine.close()
