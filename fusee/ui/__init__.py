"""The web UI: server-rendered pages over the engine's public API (extra ``fusee[http]``).

``fusee.ui.routes(engine)`` returns Starlette routes to mount under ``/ui``::

    from starlette.applications import Starlette
    from starlette.routing import Mount

    app = Starlette(routes=[Mount("/ui", routes=fusee.ui.routes(engine))])

No build step: Jinja2 templates and a little hand-written CSS and JavaScript
ship in the package.
"""

from fusee.ui.app import routes

__all__ = ["routes"]
