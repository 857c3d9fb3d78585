"""Shared pytest machinery: LAB_IMPL, markers, device selection, hypothesis profile.

Runs before any test module is imported, so ``TRITON_INTERPRET=1`` is set (on a machine
without CUDA) before anything imports triton.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from common.device import configure_triton, describe, has_cuda
from common.loader import lab_impl
from common.testing import COMPILE_CHECKS, COURSE_EXAMPLES, register_compile_checks

configure_triton()


def _kernels_of(lab: str) -> list[str]:
    from grading.plugin.compile_check import kernels_of

    return kernels_of(lab)


def _check_kernels(lab: str, impl: str, labs_root: str) -> dict[str, list[str]]:
    from grading.plugin.compile_check import check_kernels

    return check_kernels(lab, impl, labs_root)


# The labs' sm_90 compile tests use the grader's compile check (grading/plugin/compile_check.py,
# the GPU report's compiler from bench/; under the grader, in the lab's sandbox), where the
# copy has both.
if all(importlib.util.find_spec(name) is not None for name in ("bench", "grading")):
    register_compile_checks(_kernels_of, _check_kernels)

# Deterministic examples: a student re-running the suite sees the same cases each time.
settings.register_profile(
    "course",
    max_examples=COURSE_EXAMPLES,
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
# Grading your own starter: a failing property stops at its first failing example (shown in
# full), as under the grader, instead of spending tens of seconds shrinking it.
settings.register_profile(
    "course-starter",
    parent=settings.get_profile("course"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)


def _default_profile() -> str:
    try:
        return "course-starter" if lab_impl() == "starter" else "course"
    except ValueError:  # pytest_configure reports the bad LAB_IMPL
        return "course"


settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _default_profile()))


def pytest_configure(config: pytest.Config) -> None:
    try:
        lab_impl()
    except ValueError as e:
        raise pytest.UsageError(
            f"{e} (e.g. LAB_IMPL=starter python -m pytest labs/lab-00-online-softmax)"
        ) from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    impl = lab_impl()
    return [f"LAB_IMPL={impl} (grading {impl}.py in each lab)", describe()]


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """A lab's kernels are compiled once, before its first test (not on a test's clock);
    a run that stops at its first failure (``-x``: make mutants) compiles only if it gets to
    a compile test."""
    if COMPILE_CHECKS and not session.config.option.collectonly and session.items and (
            not session.config.option.maxfail or os.environ.get("COURSE_SANDBOX")):
        from grading.plugin.compile_check import precompile

        precompile(session.items, lab_impl())
    return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_cuda = pytest.mark.skip(reason="needs a CUDA GPU: none on this machine (gpu marker)")
    from common.triton_env import HAVE_TRITON, TRITON_MISSING

    no_triton = None if HAVE_TRITON else pytest.mark.skip(reason=f"not run: {TRITON_MISSING}")
    for item in items:
        if "gpu" in item.keywords and not has_cuda():
            item.add_marker(no_cuda)
        if "triton" in item.keywords and no_triton is not None:
            item.add_marker(no_triton)
