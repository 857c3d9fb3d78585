"""``python -m grading``: grade every lab (see :mod:`grading.run.cli`).

The load calibration (:mod:`grading.run.calibration`) starts first, in a forked child, so
that it runs while the grader imports itself.
"""

import sys

from grading.run import calibration

pending = calibration.start()

from grading.run.cli import main  # noqa: E402 - after the calibration started

sys.exit(main(calibration=pending))
