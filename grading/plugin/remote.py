"""Inside each lab's test process: what the tests see of the graded code, and the errors of
a call to it.

A public function is a :class:`RemoteFunction`; an object of a class the student defined
stays in the worker and is a :class:`RemoteObject` (method calls, attribute reads and
``len``/``iter``/``==``/``[]``... forwarded); a class the student defined is a
:class:`RemoteClass` (calling it builds a remote object, ``isinstance`` works). Every call
goes through a :class:`Channel`: the lab's :class:`grading.plugin.client.Client`.

:class:`GradingError` and its kinds (the call itself failed: timed out, crashed, could not
be made), how a worker's death reads (:func:`describe_exit`), and the trusted process's
version of an exception the graded code raised (:func:`build_exception`: the same builtin or
given type, else its nearest such base class with the student's class name in front).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from grading.plugin.sandboxes import current_deadline
from grading.sandbox import wire
from grading.sandbox.host import signal_text


class Channel(Protocol):
    """What a remote object needs of its lab's client (:class:`grading.plugin.client.Client`)."""

    generation: int
    methods: set[tuple[str, str]]

    def request(self, op: str, target: tuple, name: str | None, args: tuple, kwargs: dict,
                instrument: str | None, what: str) -> Any: ...

    def release(self, ref: tuple) -> None: ...


# ---- remote errors -----------------------------------------------------------------------


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


class NoKernel(GradingError):
    """A Triton test's launcher returned tensors that no kernel of the graded file wrote."""


for _cls in (GradingError, WorkerTimeout, WorkerCrashed, WorkerError, NoKernel):
    _cls.__module__ = "builtins"  # reports read "WorkerTimeout: ...", not a module path


def _text(value: Any) -> str:
    """A string the worker sent, or nothing (``str()`` of anything else could run its code)."""
    return value if type(value) is str else ""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the worker stopped answering"
    if code < 0:
        return f"the worker crashed with signal {signal_text(-code)}"
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
    message = _text(info.get("message"))
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


def _same_or_nearest(info: dict[str, Any], mro: list, handle: Callable[[Any], Any]
                     ) -> BaseException:
    """The exception itself (a builtin or given type), else its nearest such base class
    with the student's class name in front of the message."""
    if info.get("exception") is not None:
        try:
            exc = wire.loads_untrusted(info["exception"], handle)
            if isinstance(exc, Exception):
                _plain(exc.args, "the graded code", "", 0)  # no remote object in its args
                return exc
        except (Exception, NotPlainData):  # noqa: BLE001 - rebuilt from its message below
            pass
    message = _text(info.get("message"))
    for m, q in mro:
        try:
            found = wire.resolve_global(m, q)
        except (pickle.UnpicklingError, AttributeError, ImportError):
            continue
        if isinstance(found, type) and issubclass(found, Exception):
            exact = (m, q) == tuple(mro[0])
            return _instance(found, message if exact else f"{mro[0][1]}: {message}")
    return _instance(Exception, f"{mro[0][1]}: {message}")


def _mro(info: dict[str, Any]) -> list[tuple[str, str]]:
    """The exception's classes as ``(module, qualname)`` strings, most derived first."""
    found = []
    entries = info.get("mro")
    for entry in entries if type(entries) is list else []:
        if type(entry) in (tuple, list) and len(entry) == 2 and all(
                type(x) is str for x in entry):
            found.append((entry[0], entry[1]))
    return found or [("builtins", "Exception")]


def build_exception(info: dict[str, Any], what: str, handle: Callable[[Any], Any]) -> BaseException:
    """The trusted process's version of an exception the graded code raised."""
    if type(info) is not dict:
        return WorkerError(f"{what}: the worker sent an error the grader cannot read")
    mro = _mro(info)
    exc = _not_an_exception(info, mro, what)
    if isinstance(exc, GradingError):
        return exc
    if exc is None:
        exc = _same_or_nearest(info, mro, handle)
    for note in info.get("notes") or []:  # the graded code's own notes, as in-process
        _add_note(exc, _text(note)[:300])
    if info.get("where"):  # not a note: pytest.raises(match=...) also matches notes
        try:
            exc.__graded_where__ = _text(info["where"])[:200]
        except AttributeError:
            pass
    return exc


# ---- plain data --------------------------------------------------------------------------


PLAIN_TYPES = ("numeric numpy arrays, torch CPU tensors, Python numbers, str, bytes, None, "
               "and tuples, lists, dicts and sets of those (or the lab's given types)")
_SCALARS = frozenset((type(None), bool, int, float, complex, str, bytes))
NUMERIC_KINDS = "biufc"  # numpy dtype kinds: bool, int, uint, float, complex
MAX_DEPTH = 32
# Items (counted each time they are reached) a result may hold: the walk that checks it, and
# so the trusted side's time and memory per reply, are bounded by this (a numpy array or a
# tensor is one item).
MAX_ITEMS = 1 << 17
_BUDGET = [MAX_ITEMS]


class NotPlainData(WorkerError):
    """A result of the graded code that is not plain data of a declared type."""


def plain_result(value: Any, what: str, *, live: bool = True) -> Any:
    """``value`` as plain data of a declared type (:data:`PLAIN_TYPES`), checked on the trusted
    side, the lab's given types rebuilt field by field; raises :class:`NotPlainData` saying
    what was expected. ``live``: a remote object may be the whole result (a class of the
    lab's API, lab-07's ``BlockPool``), never a part of one."""
    if live and isinstance(value, RemoteObject):
        return value
    _BUDGET[0] = MAX_ITEMS
    return _plain(value, what, "", 0)


def _not_plain(what: str, path: str, found: str) -> NotPlainData:
    where = f" (at result{path})" if path else ""
    return NotPlainData(f"{what} returned {found}{where}: the grader accepts {PLAIN_TYPES}")


def _describe(value: Any) -> str:
    if isinstance(value, RemoteObject):
        return f"an object of the class {value._short} it defined"
    cls = type(value)
    return f"a {cls.__module__}.{cls.__qualname__}"


def _plain_library(value: Any, what: str, path: str) -> tuple[bool, Any]:
    """numpy and torch values: ``(True, value)`` if plain."""
    cls = type(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls is numpy.ndarray:
        if value.dtype.kind not in NUMERIC_KINDS or value.dtype.fields is not None:
            raise _not_plain(what, path, f"a numpy array of dtype {value.dtype}")
        return True, value
    if numpy is not None and isinstance(value, numpy.generic):
        ok = cls.__module__ == "numpy" and value.dtype.kind in NUMERIC_KINDS
        return ok, value
    if numpy is not None and cls is numpy.dtype or wire.is_plain_tensor(value):
        return True, value
    torch = sys.modules.get("torch")
    if torch is not None and (isinstance(value, torch.dtype | torch.device)
                              or cls is torch.Size):
        return True, value
    return False, None


def _plain(value: Any, what: str, path: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _not_plain(what, path, f"data nested more than {MAX_DEPTH} levels deep")
    _BUDGET[0] -= 1
    if _BUDGET[0] < 0:  # a small pickle can name one list twice at every level: 2^32 items
        raise _not_plain(what, path, f"more than {MAX_ITEMS} items (shared references "
                         "counted each time they are reached)")
    cls = type(value)
    if cls in _SCALARS:
        return value
    ok, found = _plain_library(value, what, path)
    if ok:
        return found
    if cls in (list, tuple):
        if _BUDGET[0] >= len(value) and all(type(v) in _SCALARS for v in value):
            _BUDGET[0] -= len(value)  # the common flat list of scalars: no walk
            return cls(value)
        return cls(_plain(v, what, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
    if cls in (set, frozenset):
        return cls(_plain(v, what, f"{path} item", depth + 1) for v in value)
    if cls is dict:
        return {_plain(k, what, f"{path} key", depth + 1): _plain(v, what, f"{path}[{k!r}]",
                                                                  depth + 1)
                for k, v in value.items()}
    if not isinstance(value, RemoteObject) and wire.is_data_class(cls) and (
            wire.allowed_by_name(cls)):
        return _rebuild(value, what, path, depth)
    raise _not_plain(what, path, _describe(value))


def _rebuild(value: Any, what: str, path: str, depth: int) -> Any:
    """A given type (the trusted process's own class) rebuilt from its checked fields."""
    cls = type(value)
    if isinstance(value, enum.Enum):
        return value
    try:
        if isinstance(value, BaseException):
            return cls(*_plain(value.args, what, path, depth + 1))
        if isinstance(value, tuple):  # a NamedTuple
            return cls(*(_plain(v, what, f"{path}.{f}", depth + 1)
                         for f, v in zip(cls._fields, value)))
        fields = {f.name: _plain(getattr(value, f.name), what, f"{path}.{f.name}", depth + 1)
                  for f in dataclasses.fields(cls)}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        built = cls(**{k: v for k, v in fields.items() if k in init})
        for k, v in fields.items():
            if k not in init:
                object.__setattr__(built, k, v)
        return built
    except NotPlainData:
        raise
    except Exception as exc:  # noqa: BLE001 - the given type rejects the fields
        raise _not_plain(what, path, f"a {cls.__qualname__} the grader cannot rebuild ({exc})"
                         ) from None


# ---- remote ------------------------------------------------------------------------------


SELF = object()


@dataclass(frozen=True)
class MethodReply:
    """A ``getattr`` that found a bound method (``of_class``: of every object of its class)."""

    name: str
    of_class: bool


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

    def __init__(self, client: Channel, module: str, name: str, doc: str, sig: Any) -> None:
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

    def __batch_entry__(self) -> tuple[Channel, str, tuple, str | None, str]:
        """``(client, op, target, name, what)``: this function as one step of a batch."""
        return self._client, "call", self._ref, None, self.__name__

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
        return owner if result is SELF else result

    def __instrumented_call__(self, instrument: str, args: tuple, kwargs: dict) -> Any:
        __tracebackhide__ = True
        owner = self._owner
        return owner._client.request("callmethod", owner._ref, self._name, args, kwargs,
                                     instrument, f"{owner._short}.{self._name}")

    def __batch_entry__(self) -> tuple[Channel, str, tuple, str | None, str]:
        """``(client, op, target, name, what)``: this method call as one step of a batch."""
        owner = self._owner
        return owner._client, "callmethod", owner._ref, self._name, f"{owner._short}.{self._name}"

    def __repr__(self) -> str:
        return f"<bound method {self._owner._short}.{self._name} (in the sandboxed worker)>"


def _special(name: str, *, wrap: Any = None) -> Any:
    def method(self: RemoteObject, *args: Any) -> Any:
        __tracebackhide__ = True
        result = self._client.request("special", self._ref, name, args, {}, None,
                                      f"{self._short} ({name})")
        result = self if result is SELF else result
        return wrap(result) if wrap is not None else result

    method.__name__ = f"__{name}__"
    return method


def _refused(doing: str) -> Any:
    def method(self: RemoteObject, *args: Any) -> Any:
        __tracebackhide__ = True
        raise TypeError(
            f"{self._short} is an object of a class the submitted code defined (it stays in "
            f"the sandboxed worker); the grader does not let it {doing}: a test compares "
            "plain data, such as what its methods return")

    method.__name__ = f"refused ({doing})"
    return method


class RemoteObject:
    """An object that lives in the worker (an instance of a class the student defined)."""

    __slots__ = ("_client", "_ref", "_type", "__weakref__")

    def __init__(self, client: Channel, ref: tuple, type_name: str) -> None:
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
        if isinstance(result, MethodReply):
            if result.of_class:
                self._client.methods.add((self._type, name))
            return RemoteMethod(self, result.name)
        return result

    def __batch_attribute__(self, name: str) -> tuple[Channel, str, tuple, str | None, str]:
        """``(client, op, target, name, what)``: reading the data attribute ``name`` as one
        step of a batch (``call_all``'s ``(getattr, (obj, name))``)."""
        return self._client, "getattr", self._ref, name, f"{self._short}.{name}"

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
    # Comparisons and truth tests never run the graded code: an object that says it equals
    # anything would pass ``assert result == expected``. Tests compare what its methods return.
    __bool__ = _refused("be tested for truth")
    __eq__ = _refused("be compared (==)")
    __ne__ = _refused("be compared (!=)")
    __lt__ = _refused("be compared (<)")
    __le__ = _refused("be compared (<=)")
    __gt__ = _refused("be compared (>)")
    __ge__ = _refused("be compared (>=)")
    __hash__ = object.__hash__  # by identity, in this process
    __int__ = _special("int")
    __float__ = _special("float")
    __index__ = _special("index")
    __contains__ = _special("contains")
    __getitem__ = _special("getitem")
    __setitem__ = _special("setitem")
    __delitem__ = _special("delitem")
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

    def __batch_entry__(self) -> tuple[Channel, str, tuple, str | None, str]:
        """``(client, op, target, name, what)``: building an object as one step of a batch."""
        return self._client, "call", self._ref, None, self._short

    def __repr__(self) -> str:
        return f"<class {self._type} (in the sandboxed worker)>"
