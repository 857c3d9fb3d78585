"""Assertions and hypothesis strategies that turn "arrays differ" into a diagnosis.

``assert_close`` checks shape, then NaN, then values; on a mismatch it compares the
answer with *wrong answers* the test computed from the float64 reference (what a
classic mistake would produce) and names the misconception that matches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from common.reference import to_float64

# One place for tolerances. float64 exercises must match the float64 reference to 1e-12.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (2e-5, 2e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (2e-2, 2e-2),
}

NAN_HINT = (
    "NaN reached the output. The tests poison every slot you must not read with NaN "
    "(slots past seq_len, unreferenced blocks, padding entries of the block table, future "
    "tokens), so this usually means a loop bound or mask is wrong; or exp(-inf - (-inf)) "
    "when a running max starts at -inf and nothing has been seen yet."
)


def tolerance(dtype: Any) -> tuple[float, float]:
    """``(atol, rtol)`` for a numpy or torch dtype, or a dtype name."""
    name = str(dtype).replace("torch.", "")
    if name not in TOLERANCES:
        name = np.dtype(dtype).name
    return TOLERANCES[name]


def _describe_diff(actual: np.ndarray, expected: np.ndarray) -> str:
    diff = np.abs(actual - expected)
    diff = np.where(np.isnan(diff), np.inf, diff)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    bad = int(np.count_nonzero(diff > 0))
    return (
        f"max |actual - expected| = {float(diff.max()) if diff.size else 0.0:.3g} at index "
        f"{tuple(int(i) for i in worst)} (actual {actual[worst]!r}, expected "
        f"{expected[worst]!r}); {bad} of {diff.size} entries differ"
    )


def assert_close(
    actual: Any,
    expected: Any,
    *,
    what: str = "output",
    atol: float = 1e-12,
    rtol: float = 1e-12,
    hint: str = "",
    wrong_answers: dict[str, Any] | None = None,
    nan_hint: str = NAN_HINT,
) -> None:
    """Assert ``actual ≈ expected``, explaining the failure in terms of a misconception.

    Args:
        actual: the implementation's answer (numpy array or torch tensor).
        expected: the float64 reference answer.
        what: the name of the quantity ("out", "lse", "running max after tile 2").
        hint: a sentence added to a plain mismatch (what usually causes it).
        wrong_answers: ``{misconception: answer that misconception would produce}``.
            The first one that ``actual`` matches is reported instead of the numbers.
    """
    __tracebackhide__ = True  # pytest shows the message, not this helper's frames
    if actual is None:
        raise AssertionError(f"{what} is None: the function returned nothing")
    if isinstance(actual, tuple | list) and not isinstance(expected, tuple | list):
        raise AssertionError(
            f"{what} is a {type(actual).__name__} of {len(actual)} items, expected one array"
        )
    a = to_float64(actual)
    e = to_float64(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{what} has shape {a.shape}, expected {e.shape}")
    if np.isnan(a).any() and not np.isnan(e).any():
        raise AssertionError(f"{what}: {nan_hint}")
    if np.allclose(a, e, atol=atol, rtol=rtol, equal_nan=True):
        return
    for misconception, wrong in (wrong_answers or {}).items():
        w = to_float64(wrong)
        if w.shape == a.shape and np.allclose(a, w, atol=max(atol, 1e-9), rtol=max(rtol, 1e-9)):
            raise AssertionError(f"{what} is wrong: {misconception}")
    message = f"{what} differs from the float64 reference: {_describe_diff(a, e)}"
    if hint:
        message += f". {hint}"
    raise AssertionError(message)


# ---- hypothesis strategies shared by the labs ------------------------------------------


@st.composite
def head_counts(draw: st.DrawFn, max_heads: int = 8) -> tuple[int, int]:
    """``(num_heads, num_kv_heads)`` covering MHA, GQA and MQA."""
    num_kv_heads = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 4]))
    num_heads = min(num_kv_heads * group, max_heads)
    num_heads -= num_heads % num_kv_heads
    return num_heads, num_kv_heads


def chunkings(total: int) -> st.SearchStrategy[list[int]]:
    """Lists of positive chunk sizes that add up to ``total`` (any split of a prompt)."""
    if total == 0:
        return st.just([])
    cuts = st.sets(st.integers(1, total - 1), max_size=min(total - 1, 6)) if total > 1 else st.just(
        set()
    )
    return cuts.map(lambda c: np.diff([0, *sorted(c), total]).astype(int).tolist())
