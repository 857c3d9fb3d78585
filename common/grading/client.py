"""Inside each lab's test process: the client of one lab's sandboxed worker.

:class:`Client` starts a worker on demand (forked from the lab's zygote), sends each call
with the test's deadline, and turns the reply into a value, a remote object or an
exception. A worker that runs past the deadline is killed (:class:`WorkerTimeout`, naming
where it was running); one that dies fails that call (:class:`WorkerCrashed`); the next
call starts a fresh one.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import time
import weakref
from pathlib import Path
from typing import Any

from common.grading import frames, wire
from common.grading.call_args import apply_changes, dumps_args
from common.grading.call_limits import current_deadline
from common.grading.lab_sandboxes import replace_sandbox
from common.grading.remote import _SELF, RemoteClass, RemoteObject, _Method
from common.grading.remote_errors import (
    GradingError,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
    build_exception,
    describe_exit,
)
from common.grading.sandbox import LabSandbox


def _peak_from_outside(instrument: str | None, pid: int) -> Any:
    """``peak_memory`` is measured by the trusted side (the worker's resident high-water
    mark, :class:`common.testing.ResidentPeak`), where ``/proc`` allows it."""
    if instrument != "peak_memory":
        return None
    from common.testing import ResidentPeak

    return ResidentPeak.start(pid)


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
        except (OSError, EOFError, TimeoutError, frames.FrameError, KeyError):
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
        measured = _peak_from_outside(instrument, self.proc.pid)
        if measured is not None:
            instrument = None  # measured here, from outside the worker
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
            frames.send_frame(self.proc.sock, payload)
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
        return reply[1] if measured is None else (reply[1], measured.peak())

    def _receive(self, deadline: float, what: str, importing: bool = False) -> tuple:
        __tracebackhide__ = True
        proc = self.proc
        try:
            data, _ = frames.recv_frame(proc.sock, deadline, alone=True)
        except TimeoutError:
            self._timed_out(what, importing)
        except (EOFError, OSError, frames.FrameError):
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
        except (OSError, EOFError, frames.FrameError):
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
