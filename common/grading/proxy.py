"""The trusted side of grading: ``load_impl`` returns a proxy of the graded module.

Under the grader (``COURSE_SANDBOX=1``, set by :mod:`common.grading.grader`), the tests run
in a trusted pytest process and never import the student's code. ``load_impl(__file__)``
returns a :class:`ProxyModule` instead: every public function of ``starter.py`` becomes a
:class:`RemoteFunction` whose call is sent to a worker process in the lab's sandbox
(:mod:`common.grading.sandbox`), which imported the student's module and answers.

What crosses (rules in :mod:`common.grading.wire`):

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
``LabScript`` honours ``COURSE_SCRIPT_PREFIX``, set here, so lab scripts run sandboxed too.

The module is also a pytest plugin (``-p common.grading.proxy``, loaded by the grader): it
starts each lab's sandbox when the session starts, gives each test's calls the test's
deadline, and tears every sandbox down at the end.
"""

from __future__ import annotations

import atexit
import inspect
import io
import json
import os
import pickle
import re
import signal
import sys
import time
import types
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.grading import procs, wire
from common.grading.sandbox import (
    ENV_UIDS,
    ENV_ZYGOTE,
    LabSandbox,
    Mode,
    Registry,
    SandboxError,
    choose_mode,
    enabled,
)

DEFAULT_CALL_LIMIT = 60.0
DEFAULT_IMPORT_LIMIT = 60.0
SIGNAL_HINTS = {
    "SIGSEGV": "segmentation fault: the code touched memory it does not own",
    "SIGBUS": "bus error: the code touched memory it does not own",
    "SIGABRT": "aborted", "SIGFPE": "arithmetic fault", "SIGILL": "illegal instruction",
    "SIGKILL": "killed, perhaps for using too much memory",
    "SIGXFSZ": "wrote more than 256 MB of output: printing in a loop?",
}
PYTEST_OUTCOMES = {"Skipped": "skip", "XFailed": "xfail", "Failed": "fail", "Exit": "exit"}

__all__ = ["GradingError", "ProxyModule", "RemoteClass", "RemoteFunction", "RemoteObject",
           "WorkerCrashed", "WorkerError", "WorkerTimeout", "remote_impl"]


class GradingError(BaseException):
    """The sandboxed call failed (not an exception raised by the graded code)."""

    plain_message = True  # the grader's report shows the message alone


class WorkerTimeout(GradingError):
    """The call ran past its test's time limit; the worker was killed."""


class WorkerCrashed(GradingError):
    """The worker died during the call."""


class WorkerError(GradingError):
    """The call could not be made or its result not received."""


for _cls in (GradingError, WorkerTimeout, WorkerCrashed, WorkerError):
    _cls.__module__ = "builtins"  # reports read "WorkerTimeout: ...", not a module path


# ---- limits --------------------------------------------------------------------------------

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


# ---- sandboxes of this process -------------------------------------------------------------

_sandboxes: dict[Path, LabSandbox] = {}
_clients: dict[tuple[Path, str], Client] = {}
_modules: dict[tuple[Path, str], ProxyModule] = {}
_state: dict[str, Any] = {"mode": None, "registry": None, "subreaper": False, "active": False,
                          "given": None}


def active() -> bool:
    """Is this the trusted test process of a sandboxed run (the plugin configured here)?"""
    return bool(_state["active"])


def _mode() -> Mode:
    if _state["mode"] is None:
        _state["mode"], _ = choose_mode()
    return _state["mode"]


def lab_root(lab_dir: Path) -> Path:
    """The project root of ``labs/<lab>``."""
    if lab_dir.parent.name != "labs":
        raise SandboxError(f"{lab_dir} is not a folder of labs/: cannot sandbox it")
    return lab_dir.parent.parent


def sandbox_for(lab_dir: Path, impl: str) -> LabSandbox:
    lab_dir = lab_dir.resolve()
    box = _sandboxes.get(lab_dir)
    if box is None:
        if not _state["subreaper"]:
            _state["subreaper"] = procs.set_subreaper()
            atexit.register(shutdown)
        given = _given_sandboxes().get(lab_dir.name)
        if given is not None and Path(given["lab"]) == lab_dir and given["impl"] == impl:
            box = LabSandbox.attach(given)
        else:
            box = LabSandbox(lab_root(lab_dir), lab_dir, impl, _mode())
        _sandboxes[lab_dir] = box
        if _state["registry"] is None:
            _state["registry"] = Registry()
            os.environ["COURSE_SCRIPT_PREFIX"] = _state["registry"].prefix()
        _state["registry"].add(lab_dir.name, box.registry_entry())
    return box


def _given_sandboxes() -> dict[str, Any]:
    """Sandboxes the grader started for this process (``COURSE_SANDBOX_ZYGOTE``)."""
    if _state["given"] is None:
        try:
            _state["given"] = json.loads(os.environ.get(ENV_ZYGOTE, "") or "{}")
        except ValueError:
            _state["given"] = {}
    return _state["given"]


def replace_sandbox(old: LabSandbox) -> LabSandbox:
    """A fresh sandbox for ``old``'s lab (its zygote died), owned by this process."""
    try:
        old.close()
    except (OSError, EOFError):
        pass
    box = LabSandbox(old.root, old.lab, old.impl, old.mode)
    _sandboxes[old.lab.resolve()] = box
    if _state["registry"] is not None:
        _state["registry"].add(old.lab.name, box.registry_entry())
    box.connect()
    return box


def shutdown() -> None:
    """End every sandbox of this process and everything its graded code started."""
    for key in list(_clients):
        _clients.pop(key).close()
    for lab in list(_sandboxes):
        _sandboxes.pop(lab).close()
    if _state["registry"] is not None:
        _state["registry"].close()
        _state["registry"] = None
        os.environ.pop("COURSE_SCRIPT_PREFIX", None)
    if _state["subreaper"] and procs.have_proc():
        procs.reap(procs.kill_tree({os.getpid()}, include_roots=False))


def describe_mode() -> str:
    return _mode().describe()


# ---- the client of one worker --------------------------------------------------------------

_SELF = object()


@dataclass(frozen=True)
class _Method:
    """A ``getattr`` that found a bound method (``of_class``: of every object of its class)."""

    name: str
    of_class: bool


class Client:
    """The current worker of one lab: starts it on demand, restarts it after a death."""

    def __init__(self, box: LabSandbox, impl: str) -> None:
        self.box, self.impl = box, impl
        self.pid = os.getpid()
        self.generation = 0
        self.proc = None
        self.manifest: dict[str, Any] | None = None
        self.released: list[int] = []
        self.objects: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.last_death = ""
        self.methods: set[tuple[str, str]] = set()  # (class, name): a method of every object

    # -- life cycle --

    def start(self, deadline: float, what: str) -> dict[str, Any]:
        """A fresh worker that imported the graded module; returns its manifest."""
        __tracebackhide__ = True
        self.generation += 1
        self.released.clear()
        try:
            self.proc = self.box.spawn_worker(self.generation, max(deadline, time.monotonic() + 5))
        except (OSError, EOFError, TimeoutError, wire.FrameError, KeyError):
            self.box = replace_sandbox(self.box)  # the zygote is gone: a new one, once
            self.proc = self.box.spawn_worker(self.generation, time.monotonic() + 60)
        reply = self._receive(deadline, what, importing=True)
        if reply[0] == "error":
            self._discard()
            raise build_exception(reply[1], what, self) from None
        self.manifest = reply[1]
        return reply[1]

    def _discard(self, wait: bool = True, alive: bool = True) -> None:
        """Kill the worker now (``alive``: it may still run); the zygote ends whatever it
        started (``wait=False``: in the background, so that a failed test ends at once)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if alive:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.box.kill(proc.pid, wait=wait)
        except (OSError, EOFError, TimeoutError):
            pass
        proc.sock.close()

    def close(self) -> None:
        self._discard()

    # -- requests --

    def request(self, op: str, target: tuple, name: str | None, args: tuple, kwargs: dict,
                instrument: str | None, what: str) -> Any:
        __tracebackhide__ = True
        if os.getpid() != self.pid:
            raise WorkerError(f"{what}: the sandboxed module cannot be called from a process "
                              "forked by the test (use common.testing.LabScript)") from None
        deadline, limit = current_deadline()
        if time.monotonic() >= deadline:
            raise WorkerTimeout(f"timed out after {limit:g} s (the per-test limit) in {what}: "
                                "this test has used all its time") from None
        if target[0] == "h" and target[1] != self.generation:
            raise WorkerError(f"{what}: this object lived in a worker that has since been "
                              f"restarted ({self.last_death})") from None
        if self.proc is None:
            self.start(deadline, what)
        try:
            payload = dumps_args((op, target, name, args, kwargs, instrument,
                                  list(self.released)))
        except GradingError:
            raise
        except Exception as exc:  # noqa: BLE001 - a test passed something that cannot travel
            raise WorkerError(f"the arguments of {what} cannot be sent to the sandboxed "
                              f"worker: {exc!r} (pass arrays, tensors and plain values)"
                              ) from None
        self.released.clear()
        try:
            wire.send_frame(self.proc.sock, payload)
        except OSError:
            self._crashed(what)
        reply = self._receive(deadline, what)
        kind = reply[0]
        if kind == "error":
            raise build_exception(reply[1], what, self) from None
        if kind == "method":
            return _Method(str(reply[1]), len(reply) > 2 and reply[2] is True)
        if kind == "self":
            return _SELF
        apply_changes(args, kwargs, reply[2])
        return reply[1]

    def _receive(self, deadline: float, what: str, importing: bool = False) -> tuple:
        __tracebackhide__ = True
        proc = self.proc
        try:
            data, _ = wire.recv_frame(proc.sock, deadline, alone=True)
        except TimeoutError:
            self._timed_out(what, importing)
        except (EOFError, OSError, wire.FrameError):
            self._crashed(what, importing)
        except BaseException:  # the test's own limit, an interrupt: the worker is out of step
            self._discard(wait=False)
            raise
        try:
            reply = wire.loads_untrusted(data, self._handle)
            if not isinstance(reply, tuple) or not reply or not isinstance(reply[0], str):
                raise ValueError("not a reply")
            return reply
        except Exception as exc:  # noqa: BLE001 - the worker is not trusted
            self._discard()
            raise WorkerError(f"{what} returned something the grader cannot accept: {exc}"
                              ) from None

    def _timed_out(self, what: str, importing: bool) -> None:
        __tracebackhide__ = True
        _, limit = current_deadline()
        at = self._stack_where()
        self._discard(wait=False)
        self.last_death = f"it timed out in {what}"
        doing = f"while importing {self.impl}.py" if importing else f"in {what}"
        message = (f"timed out after {limit:g} s (the per-test limit) {doing}: an endless loop, "
                   "or far slower than it should be" + (f"\n(it was running {at})" if at else ""))
        raise (ImportError(message) if importing else WorkerTimeout(message)) from None

    def _crashed(self, what: str, importing: bool = False) -> None:
        __tracebackhide__ = True
        proc = self.proc
        try:
            code = self.box.exit_code(proc.pid) if proc is not None else None
        except (OSError, EOFError, wire.FrameError):
            code = None
        self._discard(wait=False, alive=code is None)
        doing = f"while importing {self.impl}.py" if importing else f"in {what}"
        message = f"{describe_exit(code)} {doing}"
        self.last_death = message
        if importing:
            raise ImportError(message) from None
        raise WorkerCrashed(message) from None

    def _stack_where(self) -> str | None:
        """Where the worker is running now (faulthandler dump on SIGUSR1)."""
        proc = self.proc
        try:
            os.kill(proc.pid, signal.SIGUSR1)
        except OSError:
            return None
        end = time.monotonic() + 0.3
        text = ""
        while time.monotonic() < end:
            time.sleep(0.02)
            text = proc.stack.read_text(encoding="utf-8", errors="replace")
            if "File " in text:
                break
        lab = str(self.box.scratch_lab)
        for match in re.finditer(r'File "([^"]+)", line (\d+) in (\S+)', text):
            if match.group(1).startswith(lab + os.sep):
                return f"{Path(match.group(1)).name}:{match.group(2)}, in {match.group(3)}"
        return None

    # -- handles --

    def _handle(self, pid: Any) -> Any:
        if (not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "h"
                or not all(isinstance(x, int) for x in pid[1:3])
                or not all(isinstance(x, str) for x in pid[3:])):
            raise pickle.UnpicklingError("bad handle")
        _, gen, hid, kind, type_name = pid
        key = (gen, hid)
        obj = self.objects.get(key)
        if obj is None:
            cls = RemoteClass if kind == "class" else RemoteObject
            obj = cls(self, ("h", gen, hid), type_name[:200])
            self.objects[key] = obj
            if gen == self.generation and hid in self.released:
                self.released.remove(hid)
        return obj

    def release(self, ref: tuple) -> None:
        if ref[0] == "h" and ref[1] == self.generation:
            self.released.append(ref[2])


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the worker stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = SIGNAL_HINTS.get(name)
        return f"the worker crashed with signal {name}" + (f" ({hint})" if hint else "")
    return f"the worker exited with code {code}"


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: the grader's report reads __notes__ all the same
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def _instance(cls: type, text: str) -> BaseException:
    try:
        return cls(text)
    except Exception:  # noqa: BLE001 - an __init__ with other arguments
        exc = cls.__new__(cls)
        BaseException.__init__(exc, text)
        return exc


def _not_an_exception(info: dict[str, Any], mro: list, what: str) -> BaseException | None:
    """What the graded code raised that is not an ordinary ``Exception`` (or not sendable)."""
    qualname = mro[0][1]
    message = str(info.get("message", ""))
    if info.get("transfer"):
        return WorkerError(f"{what} returned a value that cannot be sent back: {message}")
    if mro[0] == ("builtins", "SystemExit"):
        return SystemExit(info.get("code"))
    if qualname in PYTEST_OUTCOMES and any(q == "OutcomeException" for _, q in mro):
        return WorkerError(
            f"the graded code called pytest.{PYTEST_OUTCOMES[qualname]}() ({message}): a test "
            "skipped or failed by the code under test counts as failed")
    if ("builtins", "Exception") not in mro:
        return WorkerError(f"the graded code raised {qualname}: {message}")
    return None


def _same_or_nearest(info: dict[str, Any], mro: list, client: Client) -> BaseException:
    """The exception itself (a builtin or given type), else its nearest such base class
    with the student's class name in front of the message."""
    if info.get("exception") is not None:
        try:
            exc = wire.loads_untrusted(info["exception"], client._handle)
            if isinstance(exc, Exception):
                return exc
        except Exception:  # noqa: BLE001 - rebuild it from its message below
            pass
    message = str(info.get("message", ""))
    for m, q in mro:
        try:
            found = wire.resolve_global(m, q)
        except (pickle.UnpicklingError, AttributeError, ImportError):
            continue
        if isinstance(found, type) and issubclass(found, Exception):
            exact = (m, q) == tuple(mro[0])
            return _instance(found, message if exact else f"{mro[0][1]}: {message}")
    return _instance(Exception, f"{mro[0][1]}: {message}")


def build_exception(info: dict[str, Any], what: str, client: Client) -> BaseException:
    """The trusted process's version of an exception the graded code raised."""
    mro = [tuple(x) for x in info.get("mro") or [("builtins", "Exception")]]
    exc = _not_an_exception(info, mro, what)
    if isinstance(exc, GradingError):
        return exc
    if exc is None:
        exc = _same_or_nearest(info, mro, client)
    for note in info.get("notes") or []:  # the graded code's own notes, as in-process
        _add_note(exc, str(note)[:300])
    if info.get("where"):  # not a note: pytest.raises(match=...) also matches notes
        try:
            exc.__graded_where__ = str(info["where"])[:200]
        except AttributeError:
            pass
    return exc


# ---- pickling arguments ---------------------------------------------------------------------


class _ArgsPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        return wire.reduce_special(obj, strict=False)

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _ATOMIC:
            return None
        if isinstance(obj, RemoteMethod):
            return ("meth", obj._owner._ref, obj._name)
        if isinstance(obj, RemoteObject | RemoteFunction):
            return obj._ref
        return None


_ATOMIC = frozenset((type(None), bool, int, float, str, bytes, tuple, list, dict))


def dumps_args(message: tuple) -> bytes:
    buf = io.BytesIO()
    _ArgsPickler(buf, protocol=wire.PROTOCOL).dump(message)
    return buf.getvalue()


def apply_changes(args: tuple, kwargs: dict, changes: list) -> None:
    """Copy what the worker wrote into its copies of the arguments into the caller's."""
    for path, value, grad in changes or []:
        try:
            dst = wire.find_leaf(args, kwargs, tuple(path))
        except (LookupError, TypeError):
            continue
        if value is not None:
            _copy_into(dst, value)
        if grad is not None and wire.is_plain_tensor(dst):
            dst.grad = grad


def _copy_into(dst: Any, src: Any) -> None:
    if wire.is_plain_tensor(dst):
        import torch

        if wire.is_plain_tensor(src) and src.shape == dst.shape:
            with torch.no_grad():
                dst.copy_(src)
        return
    import numpy as np

    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray) and src.shape == dst.shape:
        if dst.flags.writeable:
            np.copyto(dst, src, casting="unsafe")


# ---- what the tests see ----------------------------------------------------------------------


def _signature(info: Any) -> inspect.Signature | None:
    if not info:
        return None

    class _Default:
        def __init__(self, text: str) -> None:
            self.text = text

        def __repr__(self) -> str:
            return self.text

    try:
        params = []
        for name, kind, default, annotation in info[0]:
            if default[0] == "empty":
                value = inspect.Parameter.empty
            elif default[0] == "value":
                value = default[1]
            else:
                value = _Default(str(default[1]))
            params.append(inspect.Parameter(
                str(name), inspect._ParameterKind(int(kind)), default=value,
                annotation=annotation or inspect.Parameter.empty))
        return inspect.Signature(params, return_annotation=info[1] or inspect.Signature.empty)
    except (TypeError, ValueError, IndexError):
        return None


class RemoteFunction:
    """A public function of the graded module, called in the worker."""

    def __init__(self, client: Client, module: str, name: str, doc: str, sig: Any) -> None:
        self._client, self._ref = client, ("mod", name)
        self.__name__ = self.__qualname__ = name
        self.__module__ = module
        self.__doc__ = doc or None
        signature = _signature(sig)
        if signature is not None:
            self.__signature__ = signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return self._client.request("call", self._ref, None, args, kwargs, None, self.__name__)

    def __instrumented_call__(self, instrument: str, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        return self._client.request("call", self._ref, None, args, kwargs, instrument,
                                    self.__name__)

    def __repr__(self) -> str:
        return f"<function {self.__name__} (runs in the sandboxed worker)>"


class RemoteMethod:
    """``obj.method`` of a remote object (bound, not yet called)."""

    def __init__(self, owner: RemoteObject, name: str) -> None:
        self._owner, self._name = owner, name
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        owner = self._owner
        result = owner._client.request("callmethod", owner._ref, self._name, args, kwargs, None,
                                       f"{owner._short}.{self._name}")
        return owner if result is _SELF else result

    def __instrumented_call__(self, instrument: str, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        owner = self._owner
        return owner._client.request("callmethod", owner._ref, self._name, args, kwargs,
                                     instrument, f"{owner._short}.{self._name}")

    def __repr__(self) -> str:
        return f"<bound method {self._owner._short}.{self._name} (in the sandboxed worker)>"


def _special(name: str, *, wrap: Any = None) -> Any:
    def method(self: RemoteObject, *args: Any) -> Any:
        __tracebackhide__ = True
        result = self._client.request("special", self._ref, name, args, {}, None,
                                      f"{self._short} ({name})")
        result = self if result is _SELF else result
        return wrap(result) if wrap is not None else result

    method.__name__ = f"__{name}__"
    return method


class RemoteObject:
    """An object that lives in the worker (an instance of a class the student defined)."""

    __slots__ = ("_client", "_ref", "_type", "__weakref__")

    def __init__(self, client: Client, ref: tuple, type_name: str) -> None:
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)

    @property
    def _short(self) -> str:
        return self._type.rsplit(".", 1)[-1]

    def __getattr__(self, name: str) -> Any:
        __tracebackhide__ = True
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if (self._type, name) in self._client.methods:  # one round trip per method call
            return RemoteMethod(self, name)
        result = self._client.request("getattr", self._ref, name, (), {}, None,
                                      f"{self._short}.{name}")
        if isinstance(result, _Method):
            if result.of_class:
                self._client.methods.add((self._type, name))
            return RemoteMethod(self, result.name)
        return result

    def __setattr__(self, name: str, value: Any) -> None:
        __tracebackhide__ = True
        self._client.request("special", self._ref, "setattr", (name, value), {}, None,
                             f"{self._short}.{name} = ...")

    def __delattr__(self, name: str) -> None:
        __tracebackhide__ = True
        self._client.request("special", self._ref, "delattr", (name,), {}, None,
                             f"del {self._short}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        return self._client.request("call", self._ref, None, args, kwargs, None, self._short)

    def __instrumented_call__(self, instrument: str, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        return self._client.request("call", self._ref, None, args, kwargs, instrument,
                                    self._short)

    def __repr__(self) -> str:
        if self._ref[0] == "h" and self._ref[1] != self._client.generation:
            return f"<{self._type} object, lost when its worker was restarted>"
        deadline, _ = current_deadline()
        if time.monotonic() >= deadline:
            return f"<{self._type} object in the sandboxed worker>"
        try:
            return self._client.request("special", self._ref, "repr", (), {}, None,
                                        f"repr({self._short})")[:2000]
        except (GradingError, Exception):  # noqa: BLE001 - a repr must not fail the report
            return f"<{self._type} object in the sandboxed worker>"

    def __del__(self) -> None:
        try:
            self._client.release(self._ref)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __reduce__(self) -> Any:
        raise TypeError(f"{self._type} lives in the sandboxed worker and cannot be pickled")

    __str__ = _special("str")
    __len__ = _special("len")
    __iter__ = _special("iter")
    __next__ = _special("next")
    __bool__ = _special("bool")
    __hash__ = _special("hash")
    __int__ = _special("int")
    __float__ = _special("float")
    __index__ = _special("index")
    __contains__ = _special("contains")
    __getitem__ = _special("getitem")
    __setitem__ = _special("setitem")
    __delitem__ = _special("delitem")
    __eq__ = _special("eq")
    __ne__ = _special("ne")
    __lt__ = _special("lt")
    __le__ = _special("le")
    __gt__ = _special("gt")
    __ge__ = _special("ge")
    __enter__ = _special("enter")
    __exit__ = _special("exit")
    __array__ = _special("array")
    __dir__ = _special("dir")


class RemoteClass(RemoteObject):
    """A class the student defined: calling it builds a :class:`RemoteObject`."""

    __slots__ = ()

    def __instancecheck__(self, obj: Any) -> bool:
        __tracebackhide__ = True
        if not isinstance(obj, RemoteObject):
            return False
        return bool(self._client.request("special", self._ref, "instancecheck", (obj,), {},
                                         None, f"isinstance(..., {self._short})"))

    def __subclasscheck__(self, cls: Any) -> bool:
        __tracebackhide__ = True
        if not isinstance(cls, RemoteObject):
            return False
        return bool(self._client.request("special", self._ref, "subclasscheck", (cls,), {},
                                         None, f"issubclass(..., {self._short})"))

    def __repr__(self) -> str:
        return f"<class {self._type} (in the sandboxed worker)>"


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
            module.__doc__ = wire.loads_untrusted(doc_entry[1], client._handle)
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
            else:
                value = wire.loads_untrusted(entry[1], client._handle)
        except Exception:  # noqa: BLE001 - a name the grader cannot stand in for is left out
            continue
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
    deadline = time.monotonic() + import_limit()
    client.box.connect()  # the zygote's own start-up does not count against the student
    manifest = client.start(deadline, f"{impl}.py")
    module = build_module(client, dict(manifest), trusted_file)
    _modules[key] = module
    return module


# ---- the pytest plugin -----------------------------------------------------------------------


def _item_timeout(item: Any) -> float | None:
    """The test's limit: the grader's ``--points-test-timeout``, else pytest-timeout's."""
    if _limits["per_test"]:
        return float(_limits["per_test"])
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
    _state["active"] = True
    _mode()
    _given_sandboxes()
    for name in (ENV_ZYGOTE, ENV_UIDS):
        os.environ.pop(name, None)
    _limits["import"] = _option(config, "points_collect_timeout")
    _limits["per_test"] = _option(config, "points_test_timeout")
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
    for box in list(_sandboxes.values()):
        try:
            box.connect()
        except SandboxError:
            pass  # reported when a test first needs it


def pytest_report_header(config: Any) -> list[str]:
    return [f"sandbox: {describe_mode()}"] if active() else []


def _set_deadline(item: Any) -> None:
    limit = _item_timeout(item) or _env_float("COURSE_SANDBOX_CALL_TIMEOUT", DEFAULT_CALL_LIMIT)
    _limits["test_limit"] = limit
    # a little before the per-test alarm, so that the report names the function that hung
    _limits["deadline"] = time.monotonic() + limit - min(1.0, 0.1 * limit)


def pytest_runtest_protocol(item: Any, nextitem: Any) -> None:
    if active():
        _set_deadline(item)


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _limits["deadline"] = None


def pytest_unconfigure(config: Any) -> None:
    if active():
        shutdown()
        _state["active"] = False
