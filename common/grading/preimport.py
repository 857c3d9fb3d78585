"""Inside the sandbox: what a zygote imports once, before it forks (forks share it).

The installed packages and ``common`` modules the labs' files name
(:func:`common.grading.scratch.lab_imports`), some standard library, and all of it when the
sandbox uid cannot read the interpreter's files.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from common.grading.scratch import PREIMPORTABLE

SKIP_STDLIB = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__main__",
               "lib2to3", "ensurepip", "pydoc_data", "test", "msvcrt", "winreg", "winsound",
               "_winapi", "nt", "msilib", "_msi", "_overlapped", "_wmi", "ntpath", "_scproxy",
               "_dbm", "_gdbm", "dbm", "curses", "_curses", "_curses_panel", "readline",
               "distutils", "venv"}
COMMON_STDLIB = ("heapq", "bisect", "dataclasses", "itertools", "functools", "collections",
                 "math", "cmath", "typing", "enum", "hashlib", "struct", "random", "copy",
                 "operator", "statistics", "fractions", "decimal", "array", "string", "re",
                 "json", "textwrap", "inspect", "ast", "tokenize", "linecache", "contextlib",
                 "warnings", "weakref", "abc", "numbers", "queue", "threading", "time",
                 "pathlib", "argparse", "datetime", "socket", "tempfile", "shutil", "uuid",
                 "multiprocessing", "multiprocessing.connection", "concurrent.futures",
                 "pprint", "traceback", "dis", "codeop", "zlib", "base64", "binascii")


def preimport(modules: list[str], full_stdlib: bool) -> None:
    """What the workers will import, imported once here (forks share it): ``modules`` (the
    installed packages and ``common`` modules the labs' files name, see
    :func:`common.grading.scratch.lab_imports`) and some standard library (all of it when
    the sandbox uid cannot read the interpreter's files)."""
    stdlib = set(getattr(sys, "stdlib_module_names", ())) - SKIP_STDLIB
    names = list(COMMON_STDLIB) + (sorted(stdlib) if full_stdlib else [])
    from common.device import configure_triton

    configure_triton()  # TRITON_INTERPRET before anything imports triton
    names += [n for n in modules if n.split(".")[0] in PREIMPORTABLE | stdlib]
    names += ["common.loader", "common.testing"]
    for name in names:
        _try_import(name)
    if full_stdlib:  # and the submodules imported lazily (multiprocessing.popen_fork, ...)
        for name in sorted(stdlib):
            module = sys.modules.get(name)
            for info in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
                parts = info.name.split(".")[1:]
                if not any(p in SKIP_STDLIB or p.startswith("test") or p == "__main__"
                           for p in parts):
                    _try_import(info.name)


def _try_import(name: str) -> None:
    try:
        importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - a module this platform lacks
        pass
