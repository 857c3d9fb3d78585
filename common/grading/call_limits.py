"""Inside each lab's test process: how long a call to the sandboxed worker may take.

The running test's deadline (set by the plugin in :mod:`common.grading.proxy`), else a
per-call limit (``COURSE_SANDBOX_CALL_TIMEOUT``); and the limit on a worker importing the
graded module.
"""

from __future__ import annotations

import os
import time
from typing import Any

DEFAULT_CALL_LIMIT = 60.0
DEFAULT_IMPORT_LIMIT = 60.0


_limits: dict[str, Any] = {"deadline": None, "test_limit": None, "import": None,
                           "per_test": None}


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def current_deadline() -> tuple[float, float]:
    """``(deadline, limit)`` for a call now: the running test's, else a call limit."""
    if _limits["deadline"] is not None:
        return _limits["deadline"], _limits["test_limit"]
    limit = _env_float("COURSE_SANDBOX_CALL_TIMEOUT", DEFAULT_CALL_LIMIT)
    return time.monotonic() + limit, limit


def import_limit() -> float:
    """Seconds for a worker to import the graded module. Under the grader the collection
    limit of ``pytest_points`` (``--points-collect-timeout``) acts first, with its message."""
    value = _limits["import"]
    if value:
        return value + 1.0
    return _env_float("COURSE_SANDBOX_IMPORT_TIMEOUT", DEFAULT_IMPORT_LIMIT)
