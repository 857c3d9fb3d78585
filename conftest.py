"""Shared pytest machinery: LAB_IMPL, markers, device selection, hypothesis profile.

Runs before any test module is imported, so ``TRITON_INTERPRET=1`` is set (on a machine
without CUDA) before anything imports triton.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from common.device import configure_triton, describe, has_cuda
from common.loader import ALLOWED_IMPLS

configure_triton()

# Deterministic examples: a student re-running the suite sees the same cases each time.
settings.register_profile(
    "course",
    max_examples=25,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("thorough", parent=settings.get_profile("course"), max_examples=300)
# For instructors hunting edge cases: fresh random examples on every run.
settings.register_profile(
    "explore", parent=settings.get_profile("course"), max_examples=200, derandomize=False
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "course"))


def pytest_configure(config: pytest.Config) -> None:
    impl = os.environ.get("LAB_IMPL", "solution").strip() or "solution"
    if impl not in ALLOWED_IMPLS:
        raise pytest.UsageError(
            f"LAB_IMPL={impl!r} is not allowed; use one of: {', '.join(ALLOWED_IMPLS)} "
            "(e.g. LAB_IMPL=starter pytest labs/lab-00-online-softmax)"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    impl = os.environ.get("LAB_IMPL", "solution") or "solution"
    return [f"LAB_IMPL={impl} (grading {impl}.py in each lab)", describe()]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_cuda = pytest.mark.skip(reason="needs a CUDA GPU: none on this machine (gpu marker)")
    try:
        import triton  # noqa: F401

        no_triton = None
    except ImportError:
        no_triton = pytest.mark.skip(reason="needs the triton package (pip install triton)")
    for item in items:
        if "gpu" in item.keywords and not has_cuda():
            item.add_marker(no_cuda)
        if "triton" in item.keywords and no_triton is not None:
            item.add_marker(no_triton)


def points_of(item: pytest.Item) -> float:
    """The points a test is worth: its ``points(n)`` marker, default 1."""
    marker = item.get_closest_marker("points")
    return float(marker.args[0]) if marker and marker.args else 1.0
