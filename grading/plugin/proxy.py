"""The trusted side of grading: ``load_impl`` returns a proxy of the graded module.

Under the grader (``COURSE_SANDBOX=1``, set by :mod:`grading.run.runner`), the tests run
in a trusted pytest process and never import the student's code. ``load_impl(__file__)``
returns a :class:`ProxyModule` instead: every public function of ``starter.py`` becomes a
:class:`RemoteFunction` whose call is sent to a worker process in the lab's sandbox
(:mod:`grading.sandbox.lab_sandbox`), which imported the student's module and answers.

What crosses (rules in :mod:`grading.sandbox.wire`):

- arguments: numpy arrays, torch CPU tensors (strides kept), plain values, types of the
  lab's ``provided.py``; arrays and tensors the call wrote into are copied back into the
  caller's objects (lab-01's ``write_kv`` fills the caches in place), ``.grad`` included;
- results: the same by value; an object of a class the student defined (lab-07's
  ``BlockPool``) stays in the worker and comes back as a :class:`RemoteObject` whose method
  calls, attribute reads and ``len``/``iter``/``==``/``[]``... are forwarded; classes the
  student defined are :class:`RemoteClass` (calling one builds a remote object,
  ``isinstance`` works); classes of ``provided.py`` are the trusted process's own;
- exceptions: of a builtin or ``provided.py`` type, the same type (``pytest.raises(
  ValueError, match=...)`` works) with a note "(raised at starter.py:42, in merge)"; of a
  type the student defined, its nearest builtin or given base class, message prefixed with
  the student's class name.

Failures of the call itself are :class:`GradingError` (a ``BaseException``, so neither
``pytest.raises(Exception)`` nor hypothesis can swallow or retry it): a call that runs past
the test's time limit kills the worker (:class:`WorkerTimeout`: "timed out after 15 s in
online_softmax"); a worker that dies (``os._exit``, a segfault) fails that call
(:class:`WorkerCrashed`: "the worker exited with code 3 in online_softmax"). The next call
starts a fresh worker (forked from the lab's zygote in milliseconds): no restart limit, and
nothing else of the lab is lost.

``peak_memory`` and ``host_syncs`` of :mod:`common.testing` call
``fn.__instrumented_call__``: the measurement is taken in the worker, around the call.
``LabScript`` honours ``COURSE_SCRIPT_PREFIX``, set in this process (by
:mod:`grading.plugin.sandboxes`), so lab scripts run sandboxed too.

The module is also a pytest plugin (``-p grading.plugin.proxy``, loaded by the grader): it
starts each lab's sandbox when the session starts, gives each test's calls the test's
deadline, and tears every sandbox down at the end.

This module builds the proxy module and is the plugin; the rest lives in modules of its own:
:mod:`grading.plugin.remote` (what the tests see, the errors of a call),
:mod:`grading.plugin.client` (one lab's worker: calls and their arguments, deadlines,
restarts) and :mod:`grading.plugin.sandboxes` (the sandboxes of this process, deadlines).
"""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path
from typing import Any

from common.loader import register_impl_loader
from grading.plugin.client import Client
from grading.plugin.remote import (
    GradingError,
    RemoteClass,
    RemoteFunction,
    RemoteObject,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
    plain_result,
)
from grading.plugin.sandboxes import (
    DEFAULT_CALL_LIMIT,
    LIMITS,
    SANDBOXES,
    STATE,
    active,
    describe_mode,
    env_float,
    given_sandboxes,
    import_limit,
    mode,
    on_shutdown,
    sandbox_for,
    shutdown,
)
from grading.sandbox import wire
from grading.sandbox.host import ENV_UIDS, SandboxError
from grading.sandbox.lab_sandbox import ENV_ZYGOTE, enabled

__all__ = ["GradingError", "ProxyModule", "RemoteClass", "RemoteFunction", "RemoteObject",
           "WorkerCrashed", "WorkerError", "WorkerTimeout", "active", "remote_impl"]

_modules: dict[tuple[Path, str], ProxyModule] = {}
_clients: dict[tuple[Path, str], Client] = {}


def _close_clients() -> None:
    for key in list(_clients):
        _clients.pop(key).close()


class ProxyModule(types.ModuleType):
    """Stands in for the graded module: its public names, served by the worker."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


def _trusted_module(name: str) -> types.ModuleType | None:
    module = sys.modules.get(name)
    if module is None:
        return None
    if wire.PROVIDED_MODULE.match(name) or not name.startswith("lab_"):
        return module
    return None


def build_module(client: Client, manifest: dict[str, Any], trusted_file: Path) -> ProxyModule:
    doc_entry = manifest.pop("__doc__", None)
    module = ProxyModule(f"{trusted_file.parent.name.replace('-', '_')}.{trusted_file.stem}")
    module.__file__ = str(trusted_file)
    if doc_entry is not None and doc_entry[0] == "value":
        try:
            doc = wire.loads_untrusted(doc_entry[1], client.handle)
            module.__doc__ = doc if type(doc) is str else None
        except Exception:  # noqa: BLE001
            pass
    for name, entry in manifest.items():
        kind = entry[0]
        try:
            if kind == "function":
                value: Any = RemoteFunction(client, module.__name__, name, entry[1], entry[2])
            elif kind == "class":
                value = RemoteClass(client, ("mod", name), f"{module.__name__}.{name}")
            elif kind == "global":
                value = wire.resolve_global(entry[1], entry[2])
            elif kind == "module":
                value = _trusted_module(entry[1])
                if value is None:
                    continue
            else:  # a constant of the graded module: plain data only
                value = plain_result(wire.loads_untrusted(entry[1], client.handle),
                                     f"{trusted_file.name}'s {name}", live=False)
        except (Exception, GradingError):  # noqa: BLE001 - a name the grader cannot stand in
            continue  # for is left out
        setattr(module, name, value)
    return module


def remote_impl(lab_dir: Path, impl: str) -> ProxyModule:
    """The proxy of ``<lab>/<impl>.py`` (one worker per lab and impl in this process)."""
    __tracebackhide__ = True
    lab_dir = Path(lab_dir).resolve()
    key = (lab_dir, impl)
    if key in _modules:
        return _modules[key]
    trusted_file = lab_dir / f"{impl}.py"
    if not trusted_file.is_file():
        raise FileNotFoundError(f"{trusted_file} does not exist (LAB_IMPL={impl})")
    if (lab_dir / "provided.py").is_file():  # the given types, from the pristine tree
        from common.loader import load_lab_module

        load_lab_module(lab_dir, "provided")
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = Client(sandbox_for(lab_dir, impl), impl)
        on_shutdown(_close_clients)
    deadline = time.monotonic() + import_limit()
    client.box.connect()  # the zygote's own start-up does not count against the student
    manifest = client.start(deadline, f"{impl}.py")
    module = build_module(client, dict(manifest), trusted_file)
    _modules[key] = module
    return module


def _load_remote(lab_dir: Path, impl: str) -> ProxyModule | None:
    """``common.loader``'s hook: the proxy while this is the trusted test process."""
    return remote_impl(lab_dir, impl) if active() else None


# ---- the pytest plugin -----------------------------------------------------------------------


def _item_timeout(item: Any) -> float | None:
    """The test's limit: the grader's ``--points-test-timeout``, else pytest-timeout's."""
    if LIMITS["per_test"]:
        return float(LIMITS["per_test"])
    try:
        from pytest_timeout import _get_item_settings

        timeout = _get_item_settings(item).timeout
    except Exception:  # noqa: BLE001 - no pytest-timeout
        timeout = None
    return float(timeout) if timeout else None


def _option(config: Any, name: str) -> Any:
    try:
        return config.getoption(name)
    except ValueError:  # the pytest_points plugin is not loaded
        return None


def pytest_configure(config: Any) -> None:
    if not enabled():
        return
    # This process is the trusted one. The processes it starts are not: they must not
    # attach to its sandboxes, and a test that runs the graded code in one of them without
    # common.testing.LabScript gets an error from load_impl instead of an unsandboxed run.
    STATE["active"] = True
    mode()
    given_sandboxes()
    for name in (ENV_ZYGOTE, ENV_UIDS):
        os.environ.pop(name, None)
    LIMITS["import"] = _option(config, "points_collect_timeout")
    LIMITS["per_test"] = _option(config, "points_test_timeout")
    if not _option(config, "points_stub_impl"):
        register_impl_loader(_load_remote)
    if _option(config, "points_stub_impl") or config.option.collectonly:
        return  # counting tests: nothing of the graded code will run
    from common.loader import lab_impl

    impl = lab_impl()
    for arg in config.args:  # start each lab's sandbox now: it boots while pytest starts
        path = Path(str(arg).split("::")[0]).resolve()
        lab = path if path.is_dir() else path.parent
        if lab.parent.name == "labs" and (lab / f"{impl}.py").is_file():
            try:
                sandbox_for(lab, impl)
            except (SandboxError, OSError):
                pass  # reported when a test first needs it


def pytest_sessionstart(session: Any) -> None:
    """Wait for the sandboxes to be ready before collection: importing torch in the zygote
    is the grader's time, not the time limit of importing the student's code."""
    for box in list(SANDBOXES.values()):
        try:
            box.connect()
        except SandboxError:
            pass  # reported when a test first needs it


def pytest_report_header(config: Any) -> list[str]:
    return [f"sandbox: {describe_mode()}"] if active() else []


def _set_deadline(item: Any) -> None:
    limit = _item_timeout(item) or env_float("COURSE_SANDBOX_CALL_TIMEOUT", DEFAULT_CALL_LIMIT)
    LIMITS["test_limit"] = limit
    # a little before the per-test alarm, so that the report names the function that hung
    LIMITS["deadline"] = time.monotonic() + limit - min(1.0, 0.1 * limit)


def pytest_runtest_protocol(item: Any, nextitem: Any) -> None:
    if active():
        _set_deadline(item)
        # a Triton test's launchers must launch the lab's kernel (grading.plugin.client)
        LIMITS["needs_kernel"] = item.get_closest_marker("triton") is not None


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    LIMITS["deadline"] = None
    LIMITS["needs_kernel"] = False


def pytest_unconfigure(config: Any) -> None:
    if active():
        shutdown()
        STATE["active"] = False
