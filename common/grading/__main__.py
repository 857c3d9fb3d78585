"""``python -m common.grading``: grade every lab (see :mod:`common.grading.cli`)."""

import sys

from common.grading.cli import main

sys.exit(main())
