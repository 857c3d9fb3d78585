"""Inside each lab's test process: the client of one lab's sandboxed worker.

:class:`Client` starts a worker on demand (forked from the lab's zygote), sends each call
with the test's deadline, and turns the reply into a value, a remote object or an
exception. A worker that runs past the deadline is killed (:class:`WorkerTimeout`, naming
where it was running); one that dies fails that call (:class:`WorkerCrashed`); the next
call starts a fresh one.

A call's arguments, there and back: pickled for the worker (the rules of
:mod:`grading.sandbox.wire`; remote objects and functions as their handles,
:func:`dumps_args`), and what the call wrote into arrays and tensors (``.grad`` included)
copied back into the caller's own objects (:func:`apply_changes`).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import signal
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from grading.plugin.remote import (
    NUMERIC_KINDS,
    SELF,
    GradingError,
    MethodReply,
    NoKernel,
    RemoteClass,
    RemoteFunction,
    RemoteMethod,
    RemoteObject,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
    build_exception,
    describe_exit,
    plain_result,
)
from grading.plugin.sandboxes import LIMITS, current_deadline, replace_sandbox
from grading.sandbox import frames, wire
from grading.sandbox.host import MemoryCgroup
from grading.sandbox.lab_sandbox import LabSandbox

# ---- call args ---------------------------------------------------------------------------


class _ArgsPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        return wire.reduce_special(obj, strict=False)

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _ATOMIC:
            return None
        if type(obj).__name__ == "Earlier" and _is_earlier(obj):  # a batch's earlier result
            return ("earlier", obj.index)  # (the worker puts it in)
        if isinstance(obj, RemoteMethod):
            return ("meth", obj._owner._ref, obj._name)
        if isinstance(obj, RemoteObject | RemoteFunction):
            return obj._ref
        return None


_ATOMIC = frozenset((type(None), bool, int, float, str, bytes, tuple, list, dict))


def _is_earlier(obj: Any) -> bool:
    """``obj`` is a ``common.testing.Earlier`` (imported by the tests that use it)."""
    testing = sys.modules.get("common.testing")
    return testing is not None and type(obj) is getattr(testing, "Earlier", None)


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

    if (isinstance(dst, np.ndarray) and type(src) is np.ndarray and src.shape == dst.shape
            and src.dtype.kind in NUMERIC_KINDS):  # never an object array: no graded code
        if dst.flags.writeable:
            np.copyto(dst, src, casting="unsafe")


# ---- a Triton test needs the graded file's kernel ------------------------------------------

WRITTEN = 0.99  # the share of each output tensor the file's own kernels must have made
COPIED = 0.01  # at most this share of it may be values they only copied from a buffer the
# call made (torch's answer): legitimate kernels copy only inputs (a gather) or their own


def require_kernel(info: Any, what: str, impl: str) -> None:
    """In a Triton test, a call that returned (or wrote into) tensors must have launched a
    kernel of the graded file, and each of those tensors must hold what that kernel stored
    there (``info``: the worker's record, :func:`grading.sandbox.launches.report`), or what
    the lab's given merge kernel made from that kernel's partials (lab-06's
    ``provided.merge_splits``); else :class:`NoKernel`, which no test can catch. A kernel
    that stores into a scratch buffer while torch makes the answer, or whose output torch
    overwrites, earns nothing. None (no interpreter: a GPU) checks nothing."""
    __tracebackhide__ = True
    if info is None:
        return
    try:
        kernels = [(str(k[0])[:100], k[1] is True) for k in info["kernels"][:64]]
        written = [(str(w[0]), float(w[1]), int(w[2]), float(w[4]) if len(w) > 4 else 0.0)
                   for w in info["written"][:32]]
        empty = info.get("empty") is True
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        raise NoKernel(f"{what}: the worker's record of its kernel launches is malformed"
                       ) from None
    if not written or empty:
        return  # no tensor came back (numpy code, a bad input refused), or an empty input
    own = sorted({k for k, mine in kernels if mine})
    if not own:
        others = sorted({k for k, _ in kernels})
        raise NoKernel(
            f"{what} returned tensors without launching a Triton kernel of {impl}.py"
            + (f" (it launched only {', '.join(others)})" if others else "")
            + ": a Triton test grades the kernel, and a result computed another way (torch, "
            "numpy) earns nothing here") from None
    def part(where: str, share: float) -> str:
        return f"{share:.0%} of " + ("a tensor it returned" if where == "ret"
                                     else "what it wrote into an argument")

    short = [w for w in written if not w[1] >= WRITTEN]
    if short:
        where, share, _, _ = short[0]
        raise NoKernel(
            f"{what}: only {part(where, share)}"
            + f" holds what {', '.join(own)} stored there: the result must come from the "
            "kernel's own tl.store (a kernel that stores elsewhere, or an output that torch "
            "computes or overwrites after the kernel, earns nothing)") from None
    copied = [w for w in written if w[3] >= COPIED]
    if copied:
        where, _, _, share = copied[0]
        raise NoKernel(
            f"{what}: {part(where, share)}"
            + f" is what {', '.join(own)} loaded from a buffer the call made (neither an "
            "input, nor an input converted, nor what the kernel itself wrote) and stored "
            "unchanged: the kernel copied an answer computed elsewhere (torch), and a copy "
            "earns nothing here") from None


def _record_launches() -> bool:
    """Whether the worker records the call's kernel launches: only a Triton test's report is
    read (:func:`require_kernel`), and recording costs a call tens of microseconds."""
    return bool(LIMITS.get("needs_kernel"))


# ---- client ------------------------------------------------------------------------------


# A function (or method) whose calls timed out this many times fails its later calls at
# once: a lab whose every function loops forever costs MAX_TIMEOUTS test limits per function.
MAX_TIMEOUTS = 2


class ResidentPeak:
    """The peak memory of a fresh worker's import and call, measured from outside it
    (Linux): ``start(pid)`` is called before the worker imports the graded module (it waits
    for the grader there): it resets the mark (``/proc/<pid>/clear_refs`` <- "5") and notes
    the resident size, and where a memory cgroup can be made (as root: v2 ``memory.peak``,
    v1 ``memory.max_usage_in_bytes``, :class:`~grading.sandbox.host.MemoryCgroup`) puts the
    worker in one of its own, so that every fork is born in it; ``peak()`` is ``VmHWM``
    minus that, in bytes, plus the most private memory the worker's other processes (its
    forks, however detached) held at once meanwhile, sampled from their ``smaps_rollup``
    every :data:`SAMPLE_SECONDS` by a thread of this process (with the user switch every
    process of the worker's uid, a uid of its own, else the worker's descendants); or, when
    larger, the cgroup's peak (the whole process tree's, however short a fork lives, and
    memory no process maps, such as a ``/dev/shm`` file) less :data:`CGROUP_ALLOWANCE`.
    Without a cgroup a fork shorter than a sample can hide. A fork that does the work cannot hide
    it, nor can an arena touched at import (the import is measured) or in an earlier call
    (a fresh worker holds none). The library code a fresh process faults in from files
    already in memory (resident, but no memory the call allocated: ``RssFile``'s growth, a
    few MiB) is left out, up to
    :data:`FILE_ALLOWANCE`. ``None`` where ``/proc`` does not allow it: the memory tests
    then say they cannot measure here and carry no points."""

    SAMPLE_SECONDS = 0.01
    FILE_ALLOWANCE = 16 << 20  # bytes: well under the 32 MiB arrays the memory tests look for
    # bytes a fresh worker's cgroup is charged beyond what it allocates (pages of the zygote
    # it copies on write, page tables, library files read): under the same 32 MiB
    CGROUP_ALLOWANCE = 16 << 20

    def __init__(self, pid: int, base: int, uid: int | None,
                 group: MemoryCgroup | None = None) -> None:
        self.pid, self.base, self.group = pid, base, group
        self.base_file = self._status(pid, "RssFile")
        self.uid = uid if uid is not None and uid not in (0, os.getuid()) else None
        self.others = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = threading.Thread(target=self._sample,
                                                                daemon=True)
        self.thread.start()

    @staticmethod
    def _status(pid: int, key: str) -> int:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * (1 if key == "Uid" else 1024)
        raise OSError(f"no {key} in /proc/{pid}/status")

    @staticmethod
    def _private(pid: int) -> int:
        total = 0
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:", "Swap:")):
                    total += int(line.split()[1]) * 1024
        return total

    def _descendants(self) -> list[int]:
        """The worker's descendants (without the user switch: no uid of its own)."""
        found, todo = [], [self.pid]
        while todo and len(found) < 4096:
            pid = todo.pop()
            try:
                for task in os.scandir(f"/proc/{pid}/task"):
                    with open(f"{task.path}/children", encoding="ascii") as f:
                        kids = [int(x) for x in f.read().split()]
                    found += kids
                    todo += kids
            except (OSError, ValueError):
                continue
        return found

    def _others(self) -> list[int]:
        if self.uid is None:
            return self._descendants()
        pids = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != self.pid:
                try:
                    if entry.stat(follow_symlinks=False).st_uid == self.uid:
                        pids.append(int(entry.name))
                except OSError:
                    continue
        return pids

    def _sample(self) -> None:
        while not self.stop.wait(self.SAMPLE_SECONDS):
            held = 0
            for pid in self._others():
                try:
                    held += self._private(pid)
                except (OSError, ValueError):
                    continue  # it exited while we looked
            self.others = max(self.others, held)

    @classmethod
    def start(cls, pid: int) -> ResidentPeak | None:
        group = None
        try:
            with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
            uid = os.stat(f"/proc/{pid}").st_uid
            base = cls._status(pid, "VmRSS")
            group = MemoryCgroup.create(pid)
            return cls(pid, base, uid, group)
        except (OSError, ValueError):
            if group is not None:
                group.remove()
            return None

    def remove(self) -> None:
        """After the worker is gone: remove its memory cgroup (killing what is left in it)."""
        if self.group is not None:
            self.group.remove()

    def close(self) -> None:
        """Stop sampling (idempotent)."""
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self.thread = None

    def peak(self) -> int:
        self.close()
        code = min(max(self._status(self.pid, "RssFile") - self.base_file, 0),
                   self.FILE_ALLOWANCE)
        sampled = max(self._status(self.pid, "VmHWM") - self.base - code, 0) + self.others
        if self.group is not None:  # the whole tree's peak, every fork in it however short
            return max(sampled, self.group.peak() - self.CGROUP_ALLOWANCE)
        return sampled


NOT_MEASURED = ("not run: peak memory cannot be measured from outside the worker on this "
                "machine (/proc/<pid>/clear_refs)")


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
        self.timeouts: dict[str, int] = {}  # what -> how many calls of it timed out

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
            raise build_exception(reply[1], what, self.handle) from None
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

    def _check(self, target: tuple, what: str) -> float:
        """The deadline of a call of ``what`` on ``target``, if it may be sent at all."""
        __tracebackhide__ = True
        if os.getpid() != self.pid:
            raise WorkerError(f"{what}: the sandboxed module cannot be called from a process "
                              "forked by the test (use common.testing.LabScript)") from None
        timed_out = self.timeouts.get(what, 0)
        if timed_out >= MAX_TIMEOUTS:
            raise WorkerTimeout(
                f"{what} was not called: it timed out {timed_out} times already in this lab, "
                f"and after {MAX_TIMEOUTS} time-outs the grader fails a function's later calls "
                "at once (an endless loop?)") from None
        deadline, limit = current_deadline()
        if time.monotonic() >= deadline:
            raise WorkerTimeout(f"timed out after {limit:g} s (the per-test limit) in {what}: "
                                "this test has used all its time") from None
        self._check_target(target, what)
        return deadline

    def _check_target(self, target: tuple, what: str) -> None:
        __tracebackhide__ = True
        if target[0] == "h" and target[1] != self.generation:
            raise WorkerError(f"{what}: this object lived in a worker that has since been "
                              f"restarted ({self.last_death})") from None

    def request_batch(self, steps: list[tuple[str, tuple, str | None, tuple, dict, str]],
                      stop_if_none: int | None = None) -> list[Any]:
        """The results of ``steps`` (``(op, target, name, args, kwargs, what)``: calls,
        method calls and reads of data attributes), run in order by the worker in one round
        trip; the first step that raises ends the batch and raises here, as the same steps
        one by one would, and so does a None from step ``stop_if_none`` (the list ends
        with it). Each step's reply is checked as a call's is (plain data, arguments
        written back)."""
        __tracebackhide__ = True
        names = list(dict.fromkeys(step[5] for step in steps))
        what = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        if not steps:
            return []
        deadline = self._check(steps[0][1], what)
        for op, target, *_ in steps:
            if op not in ("call", "callmethod", "getattr"):
                raise WorkerError(f"{what}: only calls and attribute reads can be batched, "
                                  f"not {op!r}") from None
            self._check_target(target, what)
        if self.proc is None:
            self.start(deadline, what)
        self._send(("batch", ("mod", ""), stop_if_none, tuple(step[:5] for step in steps), {},
                    None), what)
        reply = self._receive(deadline, what)
        if reply[0] == "error":
            raise build_exception(reply[1], what, self.handle) from None
        replies = reply[1] if reply[0] == "batch" and len(reply) == 2 else None
        if type(replies) is not list or not 0 < len(replies) <= len(steps) or not all(
                type(r) is tuple and r[:1] in (("ok",), ("error",), ("method",))
                and len(r) >= (2 if r[0] == "error" else 3) for r in replies):
            self._discard()
            raise WorkerError(f"{what} returned something the grader cannot accept: not the "
                              "replies of a batch") from None
        results = []
        for (op, _, _, args, kwargs, step_what), step in zip(steps, replies):
            result = self._answer(step, op, args, kwargs, step_what, None)
            if isinstance(result, MethodReply):  # a method, not data: call it in the batch
                raise WorkerError(f"{step_what} is a method: a batch reads data attributes "
                                  "(call the method in the batch instead)") from None
            results.append(result)
        stopped = (stop_if_none is not None and len(results) == stop_if_none + 1
                   and results[-1] is None)
        if len(results) < len(steps) and not stopped:
            self._discard()
            raise WorkerError(f"{what}: the worker answered {len(results)} of the "
                              f"{len(steps)} calls of a batch") from None
        return results

    def _send(self, request: tuple, what: str) -> None:
        """Send one request (with the handles released since the last one) to the worker;
        its launches are recorded only where they are checked (a Triton test's calls)."""
        try:
            payload = dumps_args((*request, list(self.released), _record_launches()))
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

    def request(self, op: str, target: tuple, name: str | None, args: tuple, kwargs: dict,
                instrument: str | None, what: str) -> Any:
        __tracebackhide__ = True
        deadline = self._check(target, what)
        if instrument == "peak_memory":
            return self._measure(op, target, name, args, kwargs, what, deadline)
        if self.proc is None:
            self.start(deadline, what)
        measured = None
        self._send((op, target, name, args, kwargs, instrument), what)
        try:
            return self._answer(self._receive(deadline, what), op, args, kwargs, what,
                                measured)
        finally:
            if measured is not None:
                measured.close()

    def _answer(self, reply: tuple, op: str, args: tuple, kwargs: dict, what: str,
                measured: Any) -> Any:
        __tracebackhide__ = True
        kind = reply[0]
        if kind == "error":
            raise build_exception(reply[1], what, self.handle) from None
        if kind == "method":
            return MethodReply(str(reply[1]), len(reply) > 2 and reply[2] is True)
        if kind == "self":
            return SELF
        apply_changes(args, kwargs, reply[2])
        result = plain_result(reply[1], what)
        if op == "call" and LIMITS.get("needs_kernel") and len(reply) > 3:
            require_kernel(reply[3], what, self.impl)
        return result if measured is None else (result, measured.peak())

    def _receive(self, deadline: float, what: str, importing: bool = False) -> tuple:
        __tracebackhide__ = True
        proc = self.proc
        try:
            data, _ = frames.recv_frame(proc.sock, deadline, max_size=frames.MAX_REPLY,
                                        alone=True)
        except TimeoutError:
            self._timed_out(what, importing)
        except frames.FrameError as exc:  # too large: never read, the worker is out of step
            self._discard(wait=False)
            raise WorkerError(f"{what} returned too much: {exc} (the grader's limit for a "
                              "reply)") from None
        except (EOFError, OSError):
            self._crashed(what, importing)
        except BaseException:  # the test's own limit, an interrupt: the worker is out of step
            self._discard(wait=False)
            raise
        try:
            reply = wire.loads_untrusted(data, self.handle)
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
        self.timeouts[what] = self.timeouts.get(what, 0) + 1
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

    def _measure(self, op: str, target: tuple, name: str | None, args: tuple, kwargs: dict,
                 what: str, deadline: float) -> Any:
        """``(result, peak bytes)`` of one call in a fresh worker of its own (forked from the
        zygote, measured from before it imports the graded module, killed after): an arena
        the submission touched earlier, at import or in another call, cannot hide the
        call's memory (:class:`ResidentPeak`). The lab's own worker is left as it was."""
        __tracebackhide__ = True
        if op != "call" or target[0] != "mod":
            raise WorkerError(f"{what}: peak_memory measures a function of the graded module "
                              "(in a fresh worker), not a method of an object") from None
        try:
            payload = dumps_args((op, target, name, args, kwargs, None, [],
                                  _record_launches()))
        except GradingError:
            raise
        except Exception as exc:  # noqa: BLE001 - a test passed something that cannot travel
            raise WorkerError(f"the arguments of {what} cannot be sent to the sandboxed "
                              f"worker: {exc!r} (pass arrays, tensors and plain values)"
                              ) from None
        main, self.proc = self.proc, None
        measured = None
        try:
            self.proc = self.box.spawn_worker(0, max(deadline, time.monotonic() + 5),
                                              measure=True)
            if self._receive(deadline, what, importing=True)[0] != "forked":
                raise WorkerError(f"{what}: the measuring worker did not start") from None
            measured = ResidentPeak.start(self.proc.pid)
            if measured is None:
                import pytest

                pytest.skip(NOT_MEASURED)
            frames.send_frame(self.proc.sock, b"go")
            reply = self._receive(deadline, what, importing=True)
            if reply[0] == "error":
                raise build_exception(reply[1], what, self.handle) from None
            frames.send_frame(self.proc.sock, payload)
            return self._answer(self._receive(deadline, what), op, args, kwargs, what,
                                measured)
        except OSError:
            self._crashed(what)
        finally:
            if measured is not None:
                measured.close()
            self._discard(wait=False)
            if measured is not None:
                measured.remove()
            self.proc = main

    # -- handles --

    def handle(self, pid: Any) -> Any:
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
