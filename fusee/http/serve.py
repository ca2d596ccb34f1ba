"""``fusee serve module:factory``: open the application's engine and serve its HTTP API with uvicorn."""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import os
import sys
from collections.abc import Sequence
from typing import Any

import fusee
from fusee.errors import InsecureBind
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


def check_bind(host: str, token: str | None) -> None:
    """Raises :class:`fusee.errors.InsecureBind` for a non-loopback ``host`` without a token."""
    if not token and not is_loopback(host):
        raise InsecureBind(
            f"refusing to listen on {host} without a token: anyone who reaches it could start, "
            "signal or terminate runs. Pass --token (or set FUSEE_TOKEN), or listen on 127.0.0.1")


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
                token: str | None = None, log_level: str = "info", allowed_hosts: Sequence[str] = (),
                max_body: int = DEFAULT_MAX_BODY) -> None:
    """Opens the engine from ``factory`` on this loop, serves ``fusee.http.app`` until
    interrupted (SIGINT/SIGTERM), then closes the engine.

    The app answers requests whose ``Host`` is a loopback name, ``host`` or one
    of ``allowed_hosts`` (others get 400), and takes bodies up to ``max_body``
    bytes. Raises :class:`fusee.errors.InsecureBind` before opening anything
    when ``host`` is not loopback and no ``token`` is given, and ValueError for
    a bad host name or limit.
    """
    import uvicorn

    from fusee import logs
    from fusee.http.app import app

    check_bind(host, token)
    names = served_hosts(host, allowed_hosts)
    check_max_body(max_body)
    logs.configure(log_level)  # the engine's own lines (recovery, retries, failures) with their run fields
    engine = await open_engine(factory)
    try:
        config = uvicorn.Config(app(engine, token=token, allowed_hosts=names, max_body=max_body), host=host,
                                port=port, log_level=log_level, lifespan="off")
        server = uvicorn.Server(config)
        await server.serve()
        if not server.started:
            raise OSError(f"could not listen on {host}:{port} (is the port in use?)")
    finally:
        await engine.close()
