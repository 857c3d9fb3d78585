"""Inside each lab's pytest process: what the points plugin does to the collected tests.

Beyond recording them (:mod:`common.grading.pytest_points`): the reason a test will be
skipped on this machine, read from its markers; ``@given`` tests stopped at their first
failing example with no example database (``--points-fast-hypothesis``); and the tests of
``--points-deselect`` dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def drop_deselected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the node ids listed in ``--points-deselect``'s file (reported as deselected)."""
    deselect_file = config.getoption("points_deselect")
    if deselect_file:
        unwanted = set(Path(deselect_file).read_text(encoding="utf-8").splitlines())
        keep = [i for i in items if i.nodeid not in unwanted]
        dropped = [i for i in items if i.nodeid in unwanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep


def fast_hypothesis(item: pytest.Item) -> None:
    """Stop ``item``'s ``@given`` test at its first failing example, with no database.

    Hypothesis reads the settings of a ``@given`` test from this attribute when the test
    runs, so this overrides the profile and the test's own ``@settings`` alike.
    """
    test = getattr(item, "obj", None)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if current is None:
        return
    from hypothesis import Phase, settings

    phases = [p for p in current.phases if p in (Phase.explicit, Phase.generate, Phase.target)]
    test._hypothesis_internal_use_settings = settings(current, phases=phases, database=None)


def static_skip_reason(item: pytest.Item) -> str | None:
    """Why ``item`` will be skipped on this machine (skip/skipif markers), else None."""
    try:
        from _pytest.skipping import evaluate_skip_marks

        skipped = evaluate_skip_marks(item)
    except Exception:  # noqa: BLE001 - a private API; without it we simply do not know
        return None
    return skipped.reason if skipped is not None else None
