"""A Django view on SyncEngine, through Django's test client (settings configured here)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import django
import pytest
from django.conf import settings

import fusee
from tests.sync import django_urls
from tests.sync.hosts_app import order

if not settings.configured:
    settings.configure(
        ROOT_URLCONF="tests.sync.django_urls", ALLOWED_HOSTS=["testserver"], SECRET_KEY="test",
        MIDDLEWARE=[], INSTALLED_APPS=[], DATABASES={},
    )
    django.setup()

from django.test import Client  # imported once the settings above exist


def test_django_views_start_signal_and_wait_from_several_threads(tmp_path: Path) -> None:
    with fusee.SyncEngine.open(tmp_path, workflows=[order]) as engine:
        django_urls.engine = engine
        try:
            def one(i: int) -> object:
                c = Client()
                assert c.post(f"/orders/d{i}").json() == {"workflow_id": f"d{i}"}
                assert c.post(f"/orders/d{i}/approve", {"who": "bob"}).json() == {"ok": True}
                return c.get(f"/orders/d{i}/result").json()

            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(one, range(8)))
            assert got == [{"result": f"charge-d{i} by bob"} for i in range(8)]
            missing = Client().post("/orders/nobody/approve", {"who": "bob"})
            assert missing.status_code == 404 and "nobody" in missing.json()["error"]
        finally:
            django_urls.engine = None
    with pytest.raises(fusee.EngineClosed):  # closed: a view's call gets the typed error
        engine.describe("d0")
