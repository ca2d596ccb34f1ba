"""Completion tokens: what ``ctx.await_completion`` hands to the outside world.

A token names one attempt of one async completion of one run: the workflow
ID, the run, the operation's position and the attempt. It is plain text
(URL-safe), so it fits in a link or a webhook registration. It is an
address, not a secret: anyone holding it can complete the operation, as with
a signal; keep tokens where you would keep the workflow ID.
"""

from __future__ import annotations

import base64
import binascii

import msgspec

from fusee.errors import NotFound

_PREFIX = "fc1."


def make_token(workflow_id: str, run_id: int, seq: int, attempt: int) -> str:
    """The token of attempt ``attempt`` of operation ``seq`` of run ``run_id``."""
    raw = msgspec.msgpack.encode([workflow_id, run_id, seq, attempt])
    return _PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_token(token: object) -> tuple[str, int, int, int]:
    """(workflow ID, run ID, position, attempt) of a token; ``NotFound`` for text that is none."""
    if not isinstance(token, str):
        raise TypeError(f"a completion token is a str, got {type(token).__name__}")
    if not token.startswith(_PREFIX) or len(token) > 4096:
        raise NotFound(f"{token[:40]!r} is not a completion token issued by Fusee")
    body = token[len(_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        wid, run_id, seq, attempt = msgspec.msgpack.decode(raw, type=tuple[str, int, int, int])
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise NotFound(f"{token[:40]!r} is not a completion token issued by Fusee") from None
    return wid, run_id, seq, attempt
