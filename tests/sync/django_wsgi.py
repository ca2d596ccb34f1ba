"""The Django WSGI application of the host tests, for ``gunicorn tests.sync.django_wsgi:application``.

Each worker opens the engine once (``$FUSEE_TEST_DIR/engine``) before it serves
a request, as a real project does in its wsgi module or an ``AppConfig.ready()``.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.sync.django_settings")

from django.core.wsgi import get_wsgi_application

import fusee
from tests.sync import django_urls
from tests.sync.hosts_app import order

application = get_wsgi_application()
django_urls.engine = fusee.SyncEngine.open(os.path.join(os.environ["FUSEE_TEST_DIR"], "engine"),
                                           workflows=[order])
