"""Inside each lab's test process: what the tests see of the graded code.

A public function is a :class:`RemoteFunction`; an object of a class the student defined
stays in the worker and is a :class:`RemoteObject` (method calls, attribute reads and
``len``/``iter``/``==``/``[]``... forwarded); a class the student defined is a
:class:`RemoteClass` (calling it builds a remote object, ``isinstance`` works). Every call
goes through the lab's :class:`common.grading.client.Client`.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.grading.call_limits import current_deadline
from common.grading.remote_errors import GradingError

if TYPE_CHECKING:
    from common.grading.client import Client


_SELF = object()


@dataclass(frozen=True)
class _Method:
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
