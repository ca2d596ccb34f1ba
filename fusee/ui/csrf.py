"""Protection of the UI's actions against cross-site requests.

Every action is a POST form carrying a token that only pages of this UI
hold (a page of another site cannot read it, as long as the server answers
only to its own ``Host``: ``fusee.http.app`` checks it, an app mounting the
UI should too), and the browser must not say the request comes from another
site (``Sec-Fetch-Site``, ``Origin``, else ``Referer``: the checks of
:func:`fusee.http.guard.cross_site`).
"""

from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request

from fusee.http.guard import cross_site

FIELD = "csrf"


class CsrfGuard:
    """Hands out the token and checks requests; one per mounted UI (a new token per process)."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)

    def refusal(self, request: Request, form_token: object) -> str | None:
        """Why the request is refused, or None when it may act."""
        if not isinstance(form_token, str) or not hmac.compare_digest(form_token, self.token):
            return "the form's CSRF token is missing or stale: reload the page and try again"
        return cross_site(request.scope)
