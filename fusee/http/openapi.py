"""The OpenAPI 3.1 document of the HTTP API, as served at ``/openapi.json``.

Nothing here is written by hand: Litestar generates the document from the
route handlers of :mod:`fusee.http.api` (paths, methods, operationIds,
parameters, the msgspec request and answer structs, the documented errors).
"""

from __future__ import annotations

import functools
from typing import Any

from fusee.http import api


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document (the same for every engine)."""
    return api.document(api.build(None))
