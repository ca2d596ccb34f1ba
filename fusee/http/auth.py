"""Who is asking: the HTTP API's and web UI's authentication, and the name the audit records.

Three ways, which combine: one shared bearer token (``token=``: anyone holding
it may act, and names themselves with ``by``), a token per person
(``tokens={"ada": "...", ...}``: the audit records the holder's name, which a
request cannot change), or the host's own check (``authenticate=``: a callable
given the request that returns the person's name, or None to refuse). A
browser sends its token as the ``fusee_token`` cookie: opening any page once
with ``?token=<token>`` sets it (HttpOnly, SameSite=Strict).
"""

from __future__ import annotations

import hmac
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from fusee.http.guard import error_response, is_probe

#: The host's own check: given the request (headers, cookies, client address), the name of
#: the person asking, or None to refuse (401). May be a plain function or a coroutine function.
Authenticator = Callable[[HTTPConnection], "str | Awaitable[str | None] | None"]

#: Where the authenticated name travels with the request (Starlette's ``request.state``).
_STATE_KEY = "fusee_user"


def user_of(scope: Scope) -> str | None:
    """The name the request was authenticated as: a per-person token's name or what the host's
    ``authenticate`` answered; None with no authentication or the shared token."""
    state = scope.get("state")
    user = state.get(_STATE_KEY) if isinstance(state, dict) else None
    return user if isinstance(user, str) else None


def check_tokens(token: object, tokens: object, authenticate: object) -> dict[str, str]:
    """``tokens`` as a name → token dict, each checked; ValueError/TypeError naming what is wrong."""
    if token is not None and (not isinstance(token, str) or not token):
        raise ValueError("token must be a non-empty string (or None for no token)")
    if authenticate is not None and not callable(authenticate):
        raise TypeError(f"authenticate must be a callable taking the request, got {authenticate!r}")
    if tokens is None:
        return {}
    if not isinstance(tokens, Mapping):
        raise TypeError(f"tokens must map each person's name to their token, got {type(tokens).__name__}")
    out: dict[str, str] = {}
    seen = {token} if token is not None else set()
    for name, secret in tokens.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"tokens: a name must be a non-empty string, got {name!r}")
        if not isinstance(secret, str) or not secret:
            raise ValueError(f"tokens: {name!r}'s token must be a non-empty string")
        if secret in seen:
            raise ValueError(f"tokens: {name!r}'s token is also another person's (or the shared token): "
                             "each person needs a token of their own")
        seen.add(secret)
        out[name] = secret
    return out


class Authentication:
    """Refuses every HTTP request (and websocket) that no token or hook lets in (401, JSON),
    before any handler runs; one that is let in carries the person's name (``user_of``)."""

    def __init__(self, app: ASGIApp, token: str | None, tokens: Mapping[str, str],
                 authenticate: Authenticator | None) -> None:
        self.app = app
        # Secrets as bytes, each with the name it stands for (None: the shared token).
        self.secrets: list[tuple[bytes, str | None]] = [(s.encode(), n) for n, s in tokens.items()]
        if token is not None:
            self.secrets.append((token.encode(), None))
        self.authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or is_probe(scope):
            await self.app(scope, receive, send)
            return
        found = self._presented(scope)
        if found is None and scope["type"] == "http":
            from_query = self._match(self._query_token(scope))
            if from_query is not None:
                secret, name = from_query
                self._enter(scope, name)
                cookie = b"fusee_token=" + secret + b"; Path=/; HttpOnly; SameSite=Strict"

                async def send_with_cookie(message: Any) -> None:
                    if message["type"] == "http.response.start":
                        message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
                    await send(message)

                await self.app(scope, receive, send_with_cookie)
                return
        if found is not None:
            self._enter(scope, found[1])
            await self.app(scope, receive, send)
            return
        if self.authenticate is not None:
            answer = self.authenticate(HTTPConnection(scope))
            name = await answer if inspect.isawaitable(answer) else answer
            if name is not None:
                if not isinstance(name, str) or not name:
                    raise TypeError(f"authenticate must return the person's name (a non-empty string) or None, "
                                    f"got {name!r}")
                self._enter(scope, name)
                await self.app(scope, receive, send)
                return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        what = "its token" if self.secrets else "you to sign in"
        response = error_response(
            401, "Unauthorized",
            f"this API needs {what}: send the header 'Authorization: Bearer <token>'",
            "Authorization", headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    @staticmethod
    def _enter(scope: Scope, name: str | None) -> None:
        if name is not None:
            scope.setdefault("state", {})[_STATE_KEY] = name

    def _match(self, presented: bytes | None) -> tuple[bytes, str | None] | None:
        if not presented:
            return None
        hit = None
        # Every secret is compared (no early exit), each in constant time.
        for secret, name in self.secrets:
            if hmac.compare_digest(presented, secret) and hit is None:
                hit = (secret, name)
        return hit

    def _presented(self, scope: Scope) -> tuple[bytes, str | None] | None:
        headers = dict(scope.get("headers") or ())
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            hit = self._match(auth[7:].strip())
            if hit is not None:
                return hit
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == b"fusee_token":
                hit = self._match(value)
                if hit is not None:
                    return hit
        return None

    @staticmethod
    def _query_token(scope: Scope) -> bytes | None:
        query = scope.get("query_string", b"").decode("latin-1")
        return next((v.encode() for k, v in parse_qsl(query) if k == "token"), None)


def check_secret(secret: object) -> bytes | None:
    """``secret`` as bytes (None: a key per process); ValueError when it is too short to sign with."""
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("secret must be at least 16 bytes (or characters), the same on every worker: "
                         "generate one with 'python -c \"import secrets; print(secrets.token_urlsafe(32))\"'")
    return secret
