"""The growth of a sandboxed worker's resident memory, measured by the trusted side."""

from __future__ import annotations


class ResidentPeak:
    """The growth of another process's resident memory high-water mark, measured from
    outside it (Linux): ``start(pid)`` resets the mark (``/proc/<pid>/clear_refs`` <- "5")
    and notes the resident size; ``peak()`` is ``VmHWM`` minus that, in bytes. The grader
    measures a sandboxed worker's call with it, where the graded code cannot replace the
    instrument; ``None`` where ``/proc`` does not allow it (then the worker measures)."""

    def __init__(self, pid: int, base: int) -> None:
        self.pid, self.base = pid, base

    @staticmethod
    def _status(pid: int, key: str) -> int:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise OSError(f"no {key} in /proc/{pid}/status")

    @classmethod
    def start(cls, pid: int) -> ResidentPeak | None:
        try:
            with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
            return cls(pid, cls._status(pid, "VmRSS"))
        except (OSError, ValueError):
            return None

    def peak(self) -> int:
        return max(self._status(self.pid, "VmHWM") - self.base, 0)
