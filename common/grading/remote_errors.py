"""Inside each lab's test process: the errors of a sandboxed call.

:class:`GradingError` and its kinds (the call itself failed: timed out, crashed, could not
be made), how a worker's death reads (:func:`describe_exit`), and the trusted process's
version of an exception the graded code raised (:func:`build_exception`: the same builtin or
given type, else its nearest such base class with the student's class name in front).
"""

from __future__ import annotations

import pickle
import signal
from typing import TYPE_CHECKING, Any

from common.grading import wire

if TYPE_CHECKING:
    from common.grading.client import Client


SIGNAL_HINTS = {
    "SIGSEGV": "segmentation fault: the code touched memory it does not own",
    "SIGBUS": "bus error: the code touched memory it does not own",
    "SIGABRT": "aborted", "SIGFPE": "arithmetic fault", "SIGILL": "illegal instruction",
    "SIGKILL": "killed, perhaps for using too much memory",
    "SIGXFSZ": "wrote more than 256 MB of output: printing in a loop?",
}
PYTEST_OUTCOMES = {"Skipped": "skip", "XFailed": "xfail", "Failed": "fail", "Exit": "exit"}


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
