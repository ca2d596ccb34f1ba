"""Protection of the UI's actions against cross-site requests.

Every action is a POST form carrying a token that only pages of this UI
hold (a page of another site cannot read it, as long as the server answers
only to its own ``Host``: ``fusee.http.app`` checks it, an app mounting the
UI should too), and the browser must not say the request comes from another
site (``Sec-Fetch-Site``, ``Origin``, else ``Referer``: the checks of
:func:`fusee.http.guard.cross_site`).

Tokens are signed (itsdangerous), name the person they were handed to and
expire: with a ``secret`` shared by the server's workers, a page served by
one worker (or before a restart) acts through any other. Without one, a
random key per process: a restart asks open pages to reload.
"""

from __future__ import annotations

import secrets
import time

import itsdangerous
from starlette.requests import Request

from fusee.http.auth import user_of
from fusee.http.guard import cross_site

FIELD = "csrf"
#: A form's token is taken this long after its page was served (seconds).
MAX_AGE = 12 * 3600
#: A new token is handed out this often (pages rendered meanwhile share one, so a live
#: region's content, and its version, stays the same).
REISSUE = 3600


class CsrfGuard:
    """Hands out the token for a request's person and checks the forms they send back."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._signer = itsdangerous.URLSafeTimedSerializer(secret or secrets.token_bytes(32), salt="fusee-ui-csrf")
        self._issued: dict[str, tuple[float, str]] = {}

    def token(self, request: Request) -> str:
        """The token the page served for ``request`` carries in its forms."""
        who = user_of(request.scope) or ""
        now = time.monotonic()
        issued = self._issued.get(who)
        if issued is None or now - issued[0] > REISSUE:
            issued = (now, self._signer.dumps(who))
            self._issued[who] = issued
        return issued[1]

    def refusal(self, request: Request, form_token: object) -> str | None:
        """Why the request is refused, or None when it may act."""
        if not isinstance(form_token, str) or not form_token:
            return "the form's CSRF token is missing: reload the page and try again"
        try:
            who = self._signer.loads(form_token, max_age=MAX_AGE)
        except itsdangerous.SignatureExpired:
            return "the form's CSRF token has expired: reload the page and try again"
        except itsdangerous.BadData:
            return "the form's CSRF token is not this server's (or it restarted): reload the page and try again"
        if who != (user_of(request.scope) or ""):
            return "the form's CSRF token was handed to someone else: reload the page and try again"
        return cross_site(request.scope)
