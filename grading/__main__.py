"""``python -m grading``: grade every lab (see :mod:`grading.run.cli`).

The load calibration (:mod:`grading.run.calibration`) starts first, in a forked child, so
that it runs while the grader imports itself; then numpy, torch and Triton are imported
once and the seed of the run's warm zygote is forked
(:func:`grading.sandbox.zygote.start_seed`): the sandbox's zygotes and each lab's
test process are forks of this warm process, not fresh interpreters importing torch again.
"""

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0" and hasattr(os, "fork"):
    # the sandbox's processes are forks of this one: they hash strings as a fresh interpreter
    # with PYTHONHASHSEED=0 (the sandbox's environment) does, the same order on every run
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              dict(os.environ, PYTHONHASHSEED="0"))

import numpy  # noqa: F401 - shared with the calibration's child, not imported twice

from grading.run import calibration

pending = calibration.start()

from grading.sandbox import zygote  # noqa: E402

# numpy, torch and Triton once, before the grader reads any file of the course: the run's
# warm zygote and each lab's test process are forked from here (no second torch import)
zygote.start_seed()

from grading.run.cli import main  # noqa: E402 - after the calibration started

sys.exit(main(calibration=pending))
