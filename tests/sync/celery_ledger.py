"""The Celery app of docs/hosts.md (``tasks.py``, which the test writes beside this file) with
each step function's runs counted in ``$FUSEE_TEST_LEDGER``: ``celery -A celery_ledger worker``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import tasks
from tasks import app  # noqa: F401 (what `celery -A celery_ledger` serves)


def _counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(order_id: str, *rest: Any) -> Any:
        # One short O_APPEND write per run: lines from the pool processes never interleave.
        with open(os.environ["FUSEE_TEST_LEDGER"], "a") as ledger:
            ledger.write(f"{name}:{order_id}\n")
        return fn(order_id, *rest)

    return run


# The workflow looks its step functions up in tasks' globals at each call: it runs these.
tasks.reserve = _counted("reserve", tasks.reserve)
tasks.charge = _counted("charge", tasks.charge)
