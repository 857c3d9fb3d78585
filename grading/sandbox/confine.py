"""Inside the sandbox: a freshly forked child enters it, and what a zygote imports before it
forks.

:func:`enter_sandbox`: a new session, only the file descriptors it was given, with the
user switch its lab's own ``/tmp`` (:func:`private_temp`) and the sandbox uid with no way
back up (``PR_SET_NO_NEW_PRIVS``), resource limits (no core files, a cap on file size and,
with a uid of its own, on processes), first in line for the OOM killer.

:func:`preimport` (forks share what it imported): the installed packages and ``common``
modules the labs' files name (:func:`grading.sandbox.zygote_client.lab_imports`), some
standard library, and all of it when the sandbox uid cannot read the interpreter's files.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import resource
import shutil
import signal
import sys
import tempfile
from typing import Any

from grading.sandbox.host import FILE_SIZE_LIMIT
from grading.sandbox.zygote_client import PREIMPORTABLE

# ---- confine -----------------------------------------------------------------------------


NPROC_LIMIT = 512


def readable_by(uid: int | None, gid: int | None) -> bool:
    """Can ``uid`` read the interpreter's standard library? (Forks a probe that drops to it.)"""
    if uid is None:
        return True
    pid = os.fork()
    if pid == 0:  # pragma: no cover - in the child
        code = 1
        try:
            confine_files(os.environ.get("TMPDIR"))  # as a sandboxed process does
            drop_privileges(uid, gid)
            os.listdir(os.path.dirname(os.__file__))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def drop_privileges(uid: int | None, gid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setgid(uid if gid is None else gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("could not switch to the sandbox user")


def no_new_privileges() -> None:
    """setuid binaries (su, sudo, mount) cannot raise this process's privileges (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        except (OSError, AttributeError):
            pass


PRIVATE_TEMP_DIRS = ("/tmp", "/var/tmp")  # /dev/shm stays: shared memory needs a tmpfs
_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE, _MNT_DETACH = 0x20000, 0x1000, 0x4000, 0x40000, 2



def _private_mount_namespace() -> Any:
    """Enter a mount namespace of this process's own, its mounts private (not propagated):
    libc on success (the caller mounts through it), else None."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNS) == 0 and libc.mount(
                b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) == 0:
            return libc
    except (OSError, AttributeError):
        pass
    return None

def confine_files(tmp: str | None) -> None:
    """Linux, as root, before the user switch: the lab's own ``/tmp`` (:func:`private_temp`,
    ``tmp`` its folder), then the Python folders and the course's models behind a closed
    folder bound back read-only (:func:`expose_python`). What a sandboxed process sees."""
    umask = os.umask(0o022)  # the folders made on the way are passable by the sandbox uid
    try:
        private_temp(tmp)
        expose_python()
    finally:
        os.umask(umask)


class Rehearsal:
    """The user switch's pre-flight ``prepare`` (:func:`grading.sandbox.host.can_switch_user`):
    in the forked probe, :func:`confine_files` with a throwaway lab ``/tmp``, so that the probe
    sees what a sandboxed process will (a ``.venv`` symlink in a 0700 checkout under /tmp is
    only reachable in the private /tmp). A context manager: the folder is removed at exit."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="course-preflight-")
        self.tmp = os.path.join(self.folder, "tmp")
        os.mkdir(self.tmp)
        os.chmod(self.tmp, 0o1777)  # the probe's uid and group are not known here

    def __call__(self) -> None:
        confine_files(self.tmp)

    def __enter__(self) -> Rehearsal:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def private_temp(tmp: str | None) -> bool:
    """Linux, as root: a mount namespace of this process's own in which ``/tmp`` and
    ``/var/tmp`` are its lab's ``tmp`` folder (``<scratch>/tmp``, removed with the scratch
    copy), so that nothing one lab writes there reaches another lab. The scratch copy, which
    usually lives in ``/tmp``, is mounted back at its own path. False, with nothing changed,
    where the kernel or the container does not allow it (the grader then removes what the
    lab's uids left in the shared temp folders when the lab ends)."""
    if not tmp or not sys.platform.startswith("linux") or os.path.basename(tmp) != "tmp":
        return False
    scratch = os.path.dirname(tmp)
    libc = _private_mount_namespace()
    if libc is None:
        return False
    fds: list[int] = []
    bound: list[bytes] = []
    keep_paths = _kept_under_temp(scratch)
    links = _links_under_temp()
    try:  # descriptors opened in the new namespace: mount sources that the binds cannot hide
        fds = [os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)]
        fds += [os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path in keep_paths]
        lab_tmp = f"/proc/self/fd/{fds[0]}".encode()
        for target in PRIVATE_TEMP_DIRS:
            if os.path.isdir(target) and not os.path.islink(target):
                if libc.mount(lab_tmp, target.encode(), None, _MS_BIND, None) != 0:
                    raise OSError(f"cannot mount over {target}")
                bound.append(target.encode())
        # what lived inside one (the scratch copy; a clone's .venv in /tmp): mounted back
        for path, fd in zip(keep_paths, fds[1:]):
            if os.path.isdir(path) and os.path.samestat(os.stat(path), os.fstat(fd)):
                continue  # visible already (an empty folder left by an earlier process is not)
            os.makedirs(path, exist_ok=True)
            source = f"/proc/self/fd/{fd}".encode()
            if libc.mount(source, path.encode(), None, _MS_BIND, None) != 0:
                raise OSError(f"cannot mount {path} back")
            bound.insert(0, path.encode())
        _make_links(links)  # a .venv symlink in a /tmp checkout: made again
        return os.path.isdir(tmp) or _undo(libc, bound)
    except OSError:
        return _undo(libc, bound)
    finally:
        for fd in fds:
            os.close(fd)


def _kept_under_temp(scratch: str) -> list[str]:
    """Folders inside a private temp dir that the sandbox still needs, outermost only: the
    scratch copy, and the Python it runs (a clone in /tmp keeps its .venv there: without it
    the graded code could not import what the zygote did not import first)."""
    packages = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    # never the course tree, except the weights it ships (models_paths)
    needed = [scratch, sys.prefix, sys.exec_prefix, *packages, *models_paths()]
    under = sorted({os.path.realpath(p) for p in needed if os.path.isdir(p) and any(
        os.path.realpath(p).startswith(d + os.sep) for d in PRIVATE_TEMP_DIRS)})
    outer: list[str] = []
    for path in under:
        if not any(path.startswith(o + os.sep) for o in outer):
            outer.append(path)
    return outer


_MS_NOSUID, _MS_NODEV, _MS_RDONLY, _MS_REMOUNT = 0x2, 0x4, 0x1, 0x20


def python_paths() -> list[str]:
    """The folders the sandbox's Python needs (the interpreter, its standard library, the
    venv and its packages), each as written and resolved."""
    packages = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    dirs = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, *packages,
            os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    return sorted({q for p in dirs if os.path.isdir(p) for q in (p, os.path.realpath(p))})


def models_paths() -> list[str]:
    """The weights the course ships (``models/``, public: lab 11 serves them), as written
    and resolved; never the rest of the course tree. The trusted side names the folder
    (``COURSE_MODELS_DIR``), since this code runs from the scratch copy."""
    models = os.environ.get("COURSE_MODELS_DIR", "")
    if not models or not os.path.isdir(models):
        return []
    return sorted({models, os.path.realpath(models)})


def _closed_ancestor(path: str) -> str | None:
    """The outermost folder on ``path`` that other users may not pass through (no o+x,
    e.g. ``/root``, a ``mktemp -d``), or None."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        try:
            if not os.stat(current).st_mode & 0o001:
                return current
        except OSError:
            return None
    return None


def expose_python() -> bool:
    """Linux, as root, before the user switch: in a mount namespace of this process's own,
    every folder on the way to the interpreter, its standard library and the venv that the
    sandbox uid could not pass (``/root`` of a pyenv Python, a 0700 checkout) is covered by
    an empty tmpfs, and only those Python folders are mounted back, read-only, at their own
    paths (and the symlinks on the way, such as a checkout's ``.venv``, made again): the
    sandbox can run Python (a fresh interpreter too) and sees nothing else of the folder.
    False, with nothing changed, where the platform does not allow it."""
    if not sys.platform.startswith("linux"):
        return False
    closed: dict[str, list[str]] = {}
    for path in python_paths() + models_paths():
        real = os.path.realpath(path)
        for name in (real, path):
            if any(name.startswith(d + os.sep) for d in PRIVATE_TEMP_DIRS):
                continue  # the lab's own /tmp (its group's): private_temp mounted it back
            top = _closed_ancestor(name)
            if top is not None and top != name:
                closed.setdefault(top, [])
                if name == real:
                    closed[top].append(real)
    if not closed:
        return True
    libc = _private_mount_namespace()
    if libc is None:
        return False
    links = _links_under(tuple(closed))
    for top, paths in sorted(closed.items()):
        _cover(libc, top, paths)
    try:
        _make_links(links)
    except OSError:
        pass
    return True


def _cover(libc: Any, top: str, paths: list[str]) -> None:
    """An empty tmpfs over ``top``, and ``paths`` (folders inside it) bound back read-only."""
    keep = [p for p in sorted(set(paths))
            if not any(p.startswith(o + os.sep) for o in paths if o != p)]
    fds = []
    try:
        fds = [os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in keep]
        if libc.mount(b"tmpfs", top.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      b"mode=0755,size=1m") != 0:
            return
        for path, fd in zip(keep, fds):
            os.makedirs(path, exist_ok=True)
            target = path.encode()
            if libc.mount(f"/proc/self/fd/{fd}".encode(), target, None,
                          _MS_BIND | _MS_REC, None) == 0:
                libc.mount(None, target, None,
                           _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID, None)
    except OSError:
        return
    finally:
        for fd in fds:
            os.close(fd)


def _links_under_temp() -> list[tuple[str, str]]:
    return _links_under(PRIVATE_TEMP_DIRS)


def _links_under(roots: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(path, target)`` of each symlink inside ``roots`` on the way to the Python folders
    as written (``/tmp/clone/.venv -> /tmp/venvs/course``): the folders behind them are
    mounted back, and the links must be there too, or the paths Python was started with
    lead nowhere."""
    packages = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    found: dict[str, str] = {}
    for path in (sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable), *packages):
        current = "/"
        for part in path.strip("/").split("/"):
            current = os.path.join(current, part)
            hops = 0
            while os.path.islink(current) and hops < 40:  # every link of a chain, one hop
                target = os.readlink(current)  # at a time (.venv -> /tmp/link -> the venv)
                if any(current.startswith(d + os.sep) for d in roots):
                    found[current] = target
                current = os.path.normpath(os.path.join(os.path.dirname(current), target))
                hops += 1
            current = os.path.realpath(current)
    return sorted(found.items())


def _make_links(links: list[tuple[str, str]]) -> None:
    for link, target in links:
        if not os.path.lexists(link):
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(target, link)


def _undo(libc: object, bound: list[bytes]) -> bool:
    for target in reversed(bound):
        libc.umount2(target, _MNT_DETACH)  # type: ignore[attr-defined]
    return False


_CLONE_NEWNET, _CLONE_NEWIPC = 0x40000000, 0x08000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def share_nothing() -> dict[str, bool]:
    """Linux, as root, before the user switch: this process (and what it starts) gets a
    network namespace of its own (no network at all; a loopback of its own, up, so that a
    lab's own ranks can still talk over it; abstract Unix sockets of other namespaces are
    out of reach), an IPC namespace of its own (System V shared memory, semaphores, message
    queues), an empty ``/dev/shm`` of its own (a tmpfs in its mount namespace), and a
    ``/proc`` that shows a sandbox uid only its own processes (``hidepid=invisible``; each
    sandboxed process has a uid of its own). What the platform refuses is left as it was;
    the result says what was done."""
    done = {"network": False, "ipc": False, "shm": False, "proc": False}
    if not sys.platform.startswith("linux"):
        return done
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return done
    done["network"] = libc.unshare(_CLONE_NEWNET) == 0
    if done["network"]:
        _loopback_up()
    done["ipc"] = libc.unshare(_CLONE_NEWIPC) == 0
    if libc.unshare(_CLONE_NEWNS) == 0 and libc.mount(
            b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) == 0:
        if os.path.isdir("/dev/shm"):
            done["shm"] = libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                                     b"mode=1777,size=1g") == 0
        for options in (b"hidepid=invisible", b"hidepid=2"):
            if libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | 0x8,
                          options) == 0:  # 0x8: MS_NOEXEC
                done["proc"] = True
                break
    return done


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS,
                                                      struct.pack("16sH", b"lo", 0)))[1]
            fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))
    except OSError:
        pass


def limit_resources(switched: bool) -> None:
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT)]
    if switched:  # counts the uid's processes: only meaningful for a uid of its own
        limits.append((resource.RLIMIT_NPROC, NPROC_LIMIT))
    for which, value in limits:
        try:
            _, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError):
            pass
    try:  # the first process the kernel kills when memory runs out: never the trusted one
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def enter_sandbox(fds: dict[int, int], uid: int | None, gid: int | None, cwd: str) -> None:
    """In a freshly forked child: a new session, only ``fds`` open (``{target: source}``),
    the sandbox uid, resource limits, ``cwd``."""
    import fcntl

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    os.setsid()
    high = {target: fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for target, fd in fds.items()}
    for target, fd in high.items():
        os.dup2(fd, target, inheritable=target <= 2)
    os.closerange(max(fds) + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    if uid is not None:
        confine_files(os.environ.get("TMPDIR"))
        share_nothing()
    no_new_privileges()
    drop_privileges(uid, gid)
    limit_resources(uid is not None)
    os.umask(0o007)
    os.chdir(cwd)


# ---- preimport ---------------------------------------------------------------------------


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
    :func:`grading.sandbox.zygote_client.lab_imports`) and some standard library (all of it when
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
