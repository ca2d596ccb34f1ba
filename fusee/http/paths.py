"""IDs in paths: any workflow ID, schedule ID, object key or name is one path segment.

Servers hand an ASGI app the path decoded, where an ID's ``%2F`` is a ``/`` like
any other: ``/api/runs/x%2Fjournal`` and ``/api/runs/x/journal`` become the same
path. The JSON API is routed on the path as sent instead (``fusee.http.api.Gateway``),
so each ``{param}`` is exactly one segment (routes cannot collide) and its handler
decodes it once (``fusee.http.api.segment``).
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from starlette.types import Scope


def encoded_path(scope: Scope) -> str:
    """``scope["path"]`` with its percent-escapes as the client sent them (from ``raw_path``);
    where the server gave none, or it does not match the path, the path re-encoded (IDs with
    a ``/`` are then out of reach, every other ID is not)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        text = raw.partition(b"?")[0].decode("latin-1")
        if unquote(text) == path:
            if not root:
                return text
            # The mount's prefix as it was sent: it ends at a "/" of the raw path.
            for i in range(len(text) + 1):
                if (i == len(text) or text[i] == "/") and unquote(text[:i]) == root:
                    return root + text[i:]
    rest = path[len(root):] if path.startswith(root) else path
    return root + quote(rest, safe="/")
