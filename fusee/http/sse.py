"""Server-Sent Events for the HTTP API's and the web UI's streams, with sse-starlette.

The library encodes events, notices a client that went away and ends open
streams when the server shuts down (a hand-written stream held uvicorn's
shutdown until its poll returned). Lines end with ``\\n`` alone, which every
client parses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

Event = ServerSentEvent
#: Seconds between the library's keep-alive comments on an idle stream.
PING_S = 15


def event(data: Any = None, **fields: Any) -> ServerSentEvent:
    """One event (``event=``, ``id=``, ``retry=`` or ``comment=`` as named)."""
    return ServerSentEvent(data, sep="\n", **fields)


def response(events: AsyncIterator[ServerSentEvent], headers: Mapping[str, str] | None = None) -> EventSourceResponse:
    """The streaming answer for ``events`` (not cached, not buffered by proxies)."""
    return EventSourceResponse(events, headers=dict(headers or {}), ping=PING_S, sep="\n")
