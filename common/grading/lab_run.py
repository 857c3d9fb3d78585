"""What one lab's pytest process did: its events, and why it stopped early, in words.

A :class:`Run` holds the events the points plugin wrote (``collected``, ``start``,
``result``, ``timeout``, ``finish``), the process's exit status and the tail of its output;
:meth:`Run.exit_reason` says why it stopped: the lab's time limit, a test's hard stop, a
signal (with a hint), an interrupted session, or an exit code.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

FILE_SIZE_LIMIT = 256 * 2**20  # the largest file a lab's pytest process may write

SIGNAL_HINTS = {
    "SIGSEGV": "segmentation fault: the code touched memory it does not own",
    "SIGBUS": "bus error: the code touched memory it does not own",
    "SIGABRT": "aborted",
    "SIGFPE": "arithmetic fault",
    "SIGILL": "illegal instruction",
    "SIGKILL": "killed, perhaps for using too much memory",
    "SIGXFSZ": f"wrote more than {FILE_SIZE_LIMIT >> 20} MB of output: printing in a loop?",
}


@dataclass
class Run:
    events: list[dict]
    returncode: int | None
    timed_out: bool
    limit: float  # the lab's time limit, as the report states it
    output_tail: str
    elapsed: float
    allowance: float = 0.0  # seconds added to the limit for tests stopped at the per-test limit

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    @property
    def finished(self) -> bool:
        return bool(self.of("finish"))

    @property
    def collected(self) -> list[dict] | None:
        found = self.of("collected")
        return found[0]["tests"] if found else None

    @property
    def results(self) -> dict[str, dict]:
        return {e["nodeid"]: e for e in self.of("result")}

    @property
    def unfinished(self) -> str | None:
        """The test that was running when the process stopped, if any."""
        done = self.results
        running = [e["nodeid"] for e in self.of("start") if e["nodeid"] not in done]
        return running[-1] if running else None

    def exit_reason(self) -> str:
        """Why the process stopped before the end, in words."""
        if self.timed_out:
            return f"timed out after {self.limit:g} s (the lab's time limit)"
        hard_stops = self.of("timeout")
        if hard_stops:
            return f"timed out after {hard_stops[-1]['seconds']:g} s (the per-test limit)"
        rc = self.returncode if self.returncode is not None else -1
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            hint = SIGNAL_HINTS.get(name)
            return f"crashed with signal {name}" + (f" ({hint})" if hint else "")
        if self.finished:
            status = self.of("finish")[0]["exitstatus"]
            if "KeyboardInterrupt" in self.output_tail:
                return "the test session was interrupted (KeyboardInterrupt raised by the code)"
            return f"the test session stopped early (pytest exit status {status})"
        return f"the interpreter exited with code {rc}"
