"""Protection of the UI's actions against cross-site requests.

Every action is a POST form carrying a token that only pages of this UI
hold (a page of another site cannot read it), and a browser's ``Origin``
(or ``Referer``) must name the host the request was sent to.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

FIELD = "csrf"


class CsrfGuard:
    """Hands out the token and checks requests; one per mounted UI (a new token per process)."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)

    def refusal(self, request: Request, form_token: object) -> str | None:
        """Why the request is refused, or None when it may act."""
        if not isinstance(form_token, str) or not hmac.compare_digest(form_token, self.token):
            return "the form's CSRF token is missing or stale: reload the page and try again"
        host = request.headers.get("host", "")
        origin = request.headers.get("origin") or request.headers.get("referer")
        if origin and origin != "null" and urlsplit(origin).netloc != host:
            return f"cross-origin request refused (origin {origin!r}, host {host!r})"
        return None
