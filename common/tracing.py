"""What the labs' ``traces.py`` share (the web book's traces; ``book/traces.py`` runs them)."""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

BYTES = 2  # an fp16/bf16 element, as on a GPU
TOL = 1e-9


def rounded(x: Any, nd: int = 6) -> Any:
    """JSON-friendly rounding, recursively; -inf/inf/nan become strings the pages print."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, list | tuple):
        return [rounded(v, nd) for v in x]
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return round(x, nd)


def attempt(errors: list[str], fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args)``, or None with the error's last line kept (a starter's TODO)."""
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the learner's code may raise anything
        line = traceback.format_exception_only(type(e), e)[-1].strip()
        errors.append(f"{getattr(fn, '__name__', 'call')}: {line}")
        return None


def close(a: Any, b: Any) -> bool:
    """Equal up to TOL, recursively; None (not computed) equals only None."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(float(a) - float(b)) <= TOL * (1 + abs(float(b)))
