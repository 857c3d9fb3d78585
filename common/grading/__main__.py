"""``python -m common.grading``: grade every lab (see :mod:`common.grading.grader`)."""

import sys

from common.grading.grader import main

sys.exit(main())
